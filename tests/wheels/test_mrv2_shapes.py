"""MRV2 batch shapes in DISPATCH records, from the real MRV2 code of each wheel tree.

The real ``GPUModelRunner.execute_model`` (MRV2) and the real MTP speculator's
``propose`` run up to and through their graph dispatch (``dispatch_cg_and_sync_dp`` and
``CudaGraphManager.dispatch``, with the probe's hooks installed), then stop where the
next call would need a GPU. What vLLM computed for the batch is taken from the objects
it handed on (``prepare_inputs``' batch state and descriptor; the speculator's own
input batch), and each DISPATCH record must carry the same ``num_tokens``, ``num_reqs``,
``max_query_len``, uniformity and padding.

The batch kinds: uniform decodes, all-prefill, chunked-prefill mixes (a long chunk
beside decodes, as with ``max_num_batched_tokens`` 192), short drafts, and the
speculator's draft prefill over each of them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from probe.engine import hooks
from probe.engine.ring_writer import RingWriter
from probe.engine.runtime import RT
from probe.reasons import mrv2_reason
from probe.records import Dispatch, Flag

from .vllm_env import (
    ENGINES,
    Resolved,
    Vllm,
    decode_query_kwargs,
    make_manager,
    mrv2_runner,
    resolve,
    uniform_token_count,
)

pytestmark = [pytest.mark.wheels, pytest.mark.usefixtures("clean_probe")]


@dataclass(frozen=True)
class Batch:
    id: str
    q: tuple[int, ...]  # scheduled tokens per request, in the scheduler's order
    prefilling: tuple[bool, ...]  # request still inside its prompt
    computed: tuple[int, ...] | None = None  # prompt tokens already computed


# max_num_seqs 6, capture sizes up to 32 (vllm_env); k = 1 (uq 2) unless said.
BATCHES = [
    Batch("decode", (2, 2, 2), (False,) * 3),
    Batch("prefill", (7, 5), (True, True)),
    Batch("chunked_mix_small", (2, 2, 9), (False, False, True), (0, 0, 40)),
    # 192 tokens over 3 requests: above every capture size (eager), max_query_len 188.
    Batch("chunked_mix_192", (2, 2, 188), (False, False, True), (0, 0, 400)),
    Batch("chunked_mix_6_reqs", (2, 2, 2, 2, 2, 14), (False,) * 5 + (True,), (0,) * 5 + (64,)),
    Batch("short_draft", (2, 1), (False, False)),
    Batch("uniform_prefill", (2, 2), (True, True)),
]


class _Stop(Exception):
    """Raised where the real code would next need a GPU; carries what it was handed."""

    def __init__(self, **seen: Any) -> None:
        super().__init__("stop")
        self.seen = seen


@pytest.fixture
def wring(tmp_path: Path, vllm_version: str) -> Iterator[RingWriter]:
    writer = RingWriter.create(tmp_path / "ring", capacity=4096)
    yield writer
    writer.close()


def _scheduler_output(batch: Batch, k: int) -> Any:
    """The fields of a SchedulerOutput the runner reads before it dispatches."""
    req_ids = [f"r{i}" for i in range(len(batch.q))]
    drafts = {
        r: [0] * (q - 1)
        for r, q, p in zip(req_ids, batch.q, batch.prefilling, strict=True)
        if not p
    }
    return SimpleNamespace(
        num_scheduled_tokens=dict(zip(req_ids, batch.q, strict=True)),
        total_num_scheduled_tokens=sum(batch.q),
        scheduled_spec_decode_tokens={r: d for r, d in drafts.items() if d and k},
        scheduled_encoder_inputs={},
        skip_drafts=False,
    )


def _runner(vl: Vllm, res: Resolved, manager: Any, batch: Batch) -> Any:
    """The real MRV2 GPUModelRunner with the state its dispatch path reads.

    ``__init__`` needs a model and a device; the bookkeeping before dispatch
    (``add_requests`` and friends) mutates per-request GPU state that is not there, so
    those calls are no-ops here. ``gather_batch_req_state`` (0.33: sorting, prefill
    detection, the uniform decode count) and the dispatch itself run unchanged.
    ``prepare_inputs`` is the first GPU work: it stops the step and keeps its arguments.
    """
    import numpy as np
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    runner = object.__new__(GPUModelRunner)
    n = len(batch.q)
    computed = batch.computed or (0,) * n
    # A prefilling request has computed fewer prompt tokens than its prompt holds; a
    # decoding one has finished its (here 1-token) prompt.
    prefill_len = [
        c + q if p else 1 for c, q, p in zip(computed, batch.q, batch.prefilling, strict=True)
    ]
    done = [c if p else 1 for c, p in zip(computed, batch.prefilling, strict=True)]
    req_states = SimpleNamespace(
        req_id_to_index={f"r{i}": i for i in range(n)},
        prefill_len=SimpleNamespace(np=np.array(prefill_len, dtype=np.int32)),
        num_computed_prefill_tokens=np.array(done, dtype=np.int32),
    )

    def prepare_inputs(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        raise _Stop(args=args, kwargs=kwargs, scheduler_output=scheduler_output)

    vc = res.vllm_config
    noop = lambda *a, **k: None  # noqa: E731
    runner.__dict__.update(
        vllm_config=vc,
        parallel_config=vc.parallel_config,
        observability_config=vc.observability_config,
        cudagraph_manager=manager,
        decode_query_len=res.engine.uq,
        dp_size=1,
        dp_rank=0,
        lora_config=None,
        is_encoder_decoder=False,
        encoder_cache=None,
        aux_output_connector=None,
        pcp_manager=None,
        ubatch_runner=None,
        adaptive_verification=None,
        use_pp=False,
        req_states=req_states,
        block_tables=SimpleNamespace(apply_staged_writes=noop),
        draft_tokens_handler=SimpleNamespace(begin_step=noop),  # 0.34
        update_pp_decode_requests=noop,
        finish_requests=noop,
        free_states=noop,
        add_requests=noop,
        update_requests=noop,
        prepare_inputs=prepare_inputs,
    )
    return runner


def _vllm_values(seen: dict[str, Any], manager: Any) -> dict[str, Any]:
    """What vLLM computed for the step, from what it handed to ``prepare_inputs``."""
    args = seen["args"]
    so = seen["scheduler_output"]
    if len(args) >= 2:  # 0.28 on: (batch_req_state, batch_desc, num_active_loras)
        state, desc = args[0], args[1]
        nst = [int(x) for x in state.num_scheduled_tokens]
        num_tokens = int(state.num_tokens)
        eligible = getattr(state, "decode_graph_eligible", None)  # 0.33
        prefill = not eligible if eligible is not None else bool(state.has_prefill)
        utc = uniform_token_count(len(nst), num_tokens, max(nst), prefill)
    else:  # 0.26: (batch_desc,)
        (desc,) = args
        nst = list(so.num_scheduled_tokens.values())
        num_tokens = so.total_num_scheduled_tokens
        utc = uniform_token_count(len(nst), num_tokens, max(nst), False)
    return {
        "desc": desc,
        "num_tokens": num_tokens,
        "num_reqs": len(nst),
        "max_query_len": max(nst),
        "uniform": utc == manager.decode_query_len,
        # prepare_inputs: num_reqs_padded = batch_desc.num_reqs or num_reqs
        "padded_reqs": desc.num_reqs or len(nst),
        "padded_tokens": max(num_tokens, desc.num_tokens),
    }


def _dispatches(kit: Any, wring: RingWriter) -> list[Dispatch]:
    return [r for r in kit.drain(wring)[0] if isinstance(r, Dispatch)]


def _assert_record(rec: Dispatch, want: dict[str, Any]) -> None:
    assert rec.mode.value == want["desc"].cg_mode.value
    assert (rec.num_tokens, rec.num_reqs, rec.max_query_len) == (
        want["num_tokens"],
        want["num_reqs"],
        want["max_query_len"],
    )
    assert bool(rec.flags & Flag.UNIFORM) == want["uniform"]
    assert max(rec.num_tokens, rec.padded_tokens) == want["padded_tokens"]
    # The record keeps 0 for "no request padding" (PIECEWISE and eager descriptors).
    assert (rec.padded_reqs or rec.num_reqs) == want["padded_reqs"]
    assert rec.max_query_len > 0


@pytest.mark.parametrize("engine", ["fap_ub_k1", "fdo_ub_k1"])
@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.id)
def test_runner_dispatch_record_has_vllm_shape(
    batch: Batch,
    engine: str,
    vl: Vllm,
    single_rank_dist: None,
    wring: RingWriter,
    kit: Any,
) -> None:
    res = resolve(vl, ENGINES[engine], v2=True)
    manager = make_manager(vl, res)
    runner = _runner(vl, res, manager, batch)
    hooks.install(["dispatch"], lazy=False)
    hooks.enable(wring, gpu_timing=False)
    RT.graph_ctx = res.ctx
    RT.in_step = 1  # as inside the step bracket
    with pytest.raises(_Stop) as stop:
        runner.execute_model(_scheduler_output(batch, res.engine.k))
    RT.in_step = 0
    hooks.disable()
    want = _vllm_values(stop.value.seen, manager)
    (rec,) = [r for r in _dispatches(kit, wring) if not r.flags & Flag.DRAFTER]
    _assert_record(rec, want)
    assert rec.reason == mrv2_reason(
        manager,
        want["desc"],
        num_reqs=want["num_reqs"],
        num_tokens=want["num_tokens"],
        uniform_token_count=want["max_query_len"] if want["uniform"] else None,
        max_query_len=want["max_query_len"] if want["uniform"] else None,
        ctx=res.ctx,
    )


def _speculator_module() -> tuple[Any, Any, Any]:
    """(base module, MTPSpeculator, SpeculatorCudaGraphManager) of this tree's MTP drafter.

    ``propose`` is the base class's (0.33 and 0.34 ``target_dependent_ar``, 0.26
    ``autoregressive``); its module binds the kernels it calls, and the manager class
    (0.34: from ``autoregressive``), by name.
    """
    from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator

    base = next(c for c in MTPSpeculator.__mro__ if "propose" in vars(c))
    mod = importlib.import_module(base.__module__)
    manager = getattr(mod, "SpeculatorCudaGraphManager", None)  # as the module binds it
    if manager is None:
        pkg = base.__module__.rsplit(".", 1)[0]
        manager = importlib.import_module(f"{pkg}.cudagraph_utils").SpeculatorCudaGraphManager
    return mod, MTPSpeculator, manager


@pytest.mark.parametrize("batch", BATCHES, ids=lambda b: b.id)
def test_drafter_prefill_dispatch_record_has_vllm_shape(
    batch: Batch,
    vl: Vllm,
    single_rank_dist: None,
    wring: RingWriter,
    kit: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The speculator's draft prefill runs the target's batch shape (padded as the
    target ran it) through its own graph manager."""
    import numpy as np
    import torch
    from vllm.platforms import current_platform

    res = resolve(vl, ENGINES["fap_ub_k1"], v2=True)
    target = make_manager(vl, res)
    mod, spec_cls, spec_cg = _speculator_module()
    platform_cls = type(current_platform)
    if platform_cls._global_graph_pool is None:
        platform_cls._global_graph_pool = SimpleNamespace(cpu_placeholder_pool=True)
    # the speculator passes the decode query length(s) as the tree's manager takes them
    decode = decode_query_kwargs(res.vllm_config, spec_cg, res.engine.uq)
    prefill_manager = spec_cg(res.vllm_config, torch.device("cpu"), res.mode, **decode)
    prefill_manager._graphs_captured = True

    q = np.array(batch.q, dtype=np.int32)
    target_desc = target.dispatch(len(q), int(q.sum()), None, 0)  # its padding, as a step ran it
    padded = max(int(q.sum()), target_desc.num_tokens)
    input_batch = SimpleNamespace(
        num_reqs=len(q),
        num_tokens=int(q.sum()),
        num_tokens_after_padding=padded,
        num_scheduled_tokens=q,
        seq_lens_cpu_upper_bound=torch.tensor(q + 16),
        idx_mapping=torch.arange(len(q)),
        decode_graph_eligible=not any(batch.prefilling),  # 0.33
        has_prefill=any(batch.prefilling),  # 0.28, 0.30
    )

    def stop(*args: Any, **kwargs: Any) -> None:
        raise _Stop()

    spec = object.__new__(spec_cls)
    spec.__dict__.update(
        num_speculative_steps=res.engine.k,
        max_model_len=4096,
        max_num_reqs=8,
        method="mtp",
        hidden_states=torch.zeros(256, 4),
        # 0.33 reads max_model_len through the model config, which has no model here.
        vllm_config=SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=4096),
            parallel_config=res.vllm_config.parallel_config,  # 0.34
        ),
        last_token_indices=torch.zeros(8, dtype=torch.int64),
        current_draft_step=0,
        input_buffers=None,
        pcp_manager=None,
        dp_size=1,
        dp_rank=0,
        prefill_cudagraph_manager=prefill_manager,
        # GPU work before and after the dispatch: request-state copies and the Triton
        # kernel that gathers the draft inputs; the next GPU step ends the test.
        _copy_request_inputs=lambda *a, **k: None,
        _prepare_eplb_forward=stop,
    )
    monkeypatch.setattr(mod, "prepare_prefill_inputs", lambda *a, **k: None)
    hooks.install(["dispatch"], lazy=False)
    # the speculator's dispatch phase, as the first enabled step installs it (DP 1)
    from probe.engine.hooks import dispatch

    late = dispatch.late_targets(mrv2_runner(spec))
    # one hook per module of the speculator's classes that calls dispatch_cg_and_sync_dp
    # (0.34: the draft decode's in ``autoregressive`` too), the draft prefill's among them
    binding = {
        c.__module__
        for c in spec_cls.__mro__
        if callable(vars(sys.modules[c.__module__]).get("dispatch_cg_and_sync_dp"))
    }
    assert {t.hook_id for t, _ in late} == {"dispatch.mrv2.draft_sync_dp"}
    assert sorted(o.__name__ for _, o in late) == sorted(binding) and mod.__name__ in binding
    assert all(hooks.INSTALLER.install_on(t, o) for t, o in late)
    hooks.enable(wring, gpu_timing=False)
    RT.graph_ctx = res.ctx
    RT.in_step = 1
    with pytest.raises(_Stop):
        spec.propose(
            input_batch,
            {},
            {},
            torch.zeros(padded, 4),
            None,
            *([torch.zeros(8, dtype=torch.int64)] * 6),
        )
    RT.in_step = 0
    hooks.disable()
    (rec,) = _dispatches(kit, wring)
    assert rec.flags & Flag.DRAFTER
    # vLLM's own uniform count for the draft prefill, with the speculator's arguments.
    utc = uniform_token_count(len(q), int(q.sum()), int(q.max()), any(batch.prefilling))
    desc = prefill_manager.dispatch(len(q), padded, utc, 0)
    assert rec.mode.value == desc.cg_mode.value
    assert (rec.num_tokens, rec.num_reqs, rec.max_query_len) == (padded, len(q), int(q.max()))
    assert bool(rec.flags & Flag.UNIFORM) == (utc == res.engine.uq)
    assert rec.padded_tokens == desc.num_tokens
