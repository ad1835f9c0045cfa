"""The miss-reason memo against real dispatchers that are freed and rebuilt.

The dispatch hooks keep each dispatcher's miss reasons by the call's inputs. A
dispatcher built after another was freed often lands at the freed one's address; a memo
keyed by ``id()`` then served the old dispatcher's reasons (a FULL_DECODE_ONLY
dispatcher recorded ``forced_eager`` where its own state gives
``mixed_batch_in_full_decode_only``). Here real V1 dispatchers and real MRV2 managers of
different modes are built, driven through the hooks, freed and rebuilt in turn, under
one unchanged graph context, and every recorded reason is checked against the reason
computed afresh from that dispatcher's own state.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probe.engine import hooks
from probe.engine.ring_writer import RingWriter
from probe.engine.runtime import RT
from probe.reasons import mrv2_reason, v1_reason
from probe.records import Dispatch

from .test_reasons import _mrv2_dispatch, _uniform_decode
from .vllm_env import ENGINES, Vllm, make_manager, resolve

pytestmark = [pytest.mark.wheels, pytest.mark.usefixtures("clean_probe")]

# Modes in an order where consecutive engines disagree on some shape's reason.
ENGINE_CYCLE = ["fap_ub_k1", "pw_k1", "fdo_ub_k1", "fap_ustd_k1", "none_k1"]
# Address reuse is up to the allocator: rounds go on until it happened (at most this many).
MAX_ROUNDS = 12
SHAPES = [(2, 2), (2, 5), (2, 2, 7), (3, 3), (2,) * 8 + (30,)]
# valid_modes={NONE} is the forced-eager call whose reason leaked into later dispatchers.
V1_CALLS: list[tuple[tuple[int, ...], dict[str, Any]]] = [(q, {}) for q in SHAPES] + [
    ((2, 5), {"valid_modes": "NONE"})
]


@pytest.fixture
def wring(tmp_path: Path, vllm_version: str) -> Iterator[RingWriter]:
    writer = RingWriter.create(tmp_path / "ring", capacity=8192)
    yield writer
    writer.close()


def _stale_cases(addresses: list[int], expected: list[tuple[int, int]], per: int) -> int:
    """Dispatchers that took the address of a freed one that gave other answers to the
    same calls: the case an address-keyed memo gets wrong."""
    rows = [tuple(expected[i : i + per]) for i in range(0, len(expected), per)]
    last_at: dict[int, int] = {}
    stale = 0
    for i, address in enumerate(addresses):
        j = last_at.get(address)
        if j is not None and rows[j] != rows[i]:
            stale += 1
        last_at[address] = i
    return stale


@pytest.mark.usefixtures("needs_v1")
def test_v1_rebuilt_dispatchers_get_their_own_reasons(
    vl: Vllm, wring: RingWriter, kit: Any
) -> None:
    hooks.install(["dispatch"], lazy=False)
    hooks.enable(wring, gpu_timing=False)
    RT.graph_ctx = None  # one context throughout: only the dispatcher changes
    expected: list[tuple[int, int]] = []
    addresses: list[int] = []
    # Configs first, so that nothing is allocated between freeing a dispatcher and
    # building the next: that is when CPython hands the freed address out again.
    resolved = [resolve(vl, ENGINES[name], v2=False) for name in ENGINE_CYCLE]
    rounds = (r for _ in range(MAX_ROUNDS) for r in resolved)
    for n, res in enumerate(rounds, 1):
        if n % len(resolved) == 1 and _stale_cases(addresses, expected, len(V1_CALLS)):
            break
        d = vl.CudagraphDispatcher(res.vllm_config)
        d.uniform_decode_query_len = res.engine.uq
        d.initialize_cudagraph_keys(res.mode, uniform_decode_query_len=res.engine.uq)
        addresses.append(id(d))
        for q, extra in V1_CALLS:
            kw = {k: {vl.CUDAGraphMode[v]} for k, v in extra.items()}
            uniform = _uniform_decode(q, res.engine.uq)
            mode, desc = d.dispatch(num_tokens=sum(q), uniform_decode=uniform, **kw)
            fresh = v1_reason(d, mode, desc, num_tokens=sum(q), uniform_decode=uniform, **kw)
            expected.append((mode.value, int(fresh)))
        del d
        gc.collect()
    hooks.disable()
    recs = [r for r in kit.drain(wring)[0] if isinstance(r, Dispatch)]
    assert [(r.mode.value, int(r.reason)) for r in recs] == expected
    # The case under test happened (else the check proves nothing).
    assert _stale_cases(addresses, expected, len(V1_CALLS)) > 0, addresses


def test_mrv2_rebuilt_managers_get_their_own_reasons(
    vl: Vllm, single_rank_dist: None, wring: RingWriter, kit: Any
) -> None:
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    from probe.engine.hooks import dispatch

    hooks.install(["dispatch"], lazy=False)
    assert hooks.INSTALLER.install_on(dispatch.MANAGER, CudaGraphManager)  # as under DP > 1
    hooks.enable(wring, gpu_timing=False)
    RT.graph_ctx = None
    expected: list[tuple[int, int]] = []
    addresses: list[int] = []
    resolved = [resolve(vl, ENGINES[name], v2=True) for name in ENGINE_CYCLE]
    rounds = (r for _ in range(MAX_ROUNDS) for r in resolved)
    for n, res in enumerate(rounds, 1):
        if n % len(resolved) == 1 and _stale_cases(addresses, expected, 2 * len(SHAPES)):
            break
        m = make_manager(vl, res)
        addresses.append(id(m))
        for q in SHAPES:
            for prefill in (False, True):
                desc, kwargs = _mrv2_dispatch(m, q, prefill, 0)
                expected.append((desc.cg_mode.value, int(mrv2_reason(m, desc, **kwargs))))
        del m
        gc.collect()
    hooks.disable()
    recs = [r for r in kit.drain(wring)[0] if isinstance(r, Dispatch)]
    assert [(r.mode.value, int(r.reason)) for r in recs] == expected
    assert _stale_cases(addresses, expected, 2 * len(SHAPES)) > 0, addresses
