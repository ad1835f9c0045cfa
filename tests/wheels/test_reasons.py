"""probe.reasons against vLLM's real CUDA-graph dispatch, in each supported release (0.26-0.34).

Each row is a batch shape on an engine configuration (conftest.ENGINES). The expected
columns were written from reading the vLLM source; every row checks them against what
the real dispatcher returned, so a wrong row fails rather than describing a fiction:
(a) the mode (and padded size) of the real call, (b) the reason ``probe.reasons``
derives with and without the GraphContext. Where releases (0.26 to 0.34) differ, the
cell is not tabled per version: its expected value comes from the tree's own code
(``VLLM``, ``UNIFORM_OR_NOT``, ``BY_DECODE_TABLE`` below). The V1 rows skip on a tree
without the classic runner (0.34 on).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.reasons import GraphContext, min_support, mode_parts, mrv2_reason, v1_reason
from probe.records import Reason

from .vllm_env import (
    CAPTURE_SIZES,
    ENGINES,
    MAX_NUM_SEQS,
    Resolved,
    Vllm,
    make_manager,
    resolve,
    uniform_token_count,
)

pytestmark = pytest.mark.wheels

T = TypeVar("T")
PerVersion = T | dict[str, T]


def per_version(value: PerVersion[T], version: str) -> T:
    return value[version] if isinstance(value, dict) else value


@dataclass(frozen=True)
class Row:
    id: str
    engine: str
    q: tuple[int, ...]  # scheduled tokens per request, in batch order
    mode: PerVersion[str]  # the real dispatch's mode
    padded: PerVersion[int]  # the real dispatch's num_tokens
    reason: PerVersion[Reason]  # with the GraphContext
    no_ctx: PerVersion[Reason] | None = None  # without it (None: same as reason)
    prefill: bool = False  # MRV2: some request is still prefilling
    kwargs: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------
# V1: CudagraphDispatcher. Its code is the same in 0.26 and 0.33, so are these rows.
# max_num_seqs = 6; capture sizes [1, 2, 4, 8, 16, 32]; V1's resolver rounds them to
# multiples of uq when decode FULL survives with uq > 1 (uq 3: [3, 6, 9, 18], max 18).

# fmt: off
V1_ROWS = [
    Row("decode_k1", "fap_ub_k1", (2, 2, 2), "FULL", 8, Reason.HIT),
    Row("decode_k2", "fap_ub_k2", (3, 3, 3), "FULL", 9, Reason.HIT),
    Row("mixed_prefill_decode", "fap_ub_k1", (2, 2, 7), "PIECEWISE", 16, Reason.NOT_UNIFORM),
    Row("short_draft", "fap_ub_k1", (2, 1), "PIECEWISE", 4, Reason.NOT_UNIFORM),
    Row("above_capture_size", "fap_ub_k1", (2,) * 8 + (30,), "NONE", 46, Reason.BATCH_TOO_BIG),
    # uq * max_num_seqs = 12 is no capture size: 10 tokens pad to 16, past the decode keys.
    Row("no_full_key", "fap_ub_k1", (2,) * 5, "PIECEWISE", 16, Reason.NO_FULL_KEY_FOR_SIZE),
    Row("fdo_decode", "fdo_ub_k1", (2, 2), "FULL", 4, Reason.HIT),
    Row("fdo_mixed", "fdo_ub_k1", (2, 5), "NONE", 7, Reason.MIXED_BATCH_IN_FULL_DECODE_ONLY),
    Row("mode_none", "none_k1", (2, 2), "NONE", 4, Reason.GRAPHS_DISABLED),
    Row("plain_piecewise", "pw_k1", (2, 2), "PIECEWISE", 4, Reason.PIECEWISE_ONLY),
    Row("ustd_k0_decode", "fap_ustd_k0", (1, 1, 1), "FULL", 4, Reason.HIT),
    Row("ustd_k1_decode", "fap_ustd_k1", (2, 2, 2), "PIECEWISE", 8,
        Reason.BACKEND_SUPPORT_TOO_LOW, no_ctx=Reason.PIECEWISE_ONLY),
    Row("ustd_k2_decode", "fap_ustd_k2", (3, 3), "PIECEWISE", 8,
        Reason.BACKEND_SUPPORT_TOO_LOW, no_ctx=Reason.PIECEWISE_ONLY),
    Row("ustd_k1_mixed", "fap_ustd_k1", (2, 7), "PIECEWISE", 16,
        Reason.NOT_UNIFORM, no_ctx=Reason.PIECEWISE_ONLY),
    Row("ustd_fdo_k2_decode", "fdo_ustd_k2", (3, 3), "NONE", 6,
        Reason.BACKEND_SUPPORT_TOO_LOW, no_ctx=Reason.GRAPHS_DISABLED),
    Row("ustd_fdo_k2_mixed", "fdo_ustd_k2", (3, 5), "NONE", 8,
        Reason.MIXED_BATCH_IN_FULL_DECODE_ONLY, no_ctx=Reason.GRAPHS_DISABLED),
    Row("force_eager", "fap_ub_k1", (2, 2), "NONE", 4, Reason.FORCED_EAGER,
        kwargs={"valid_modes": {"NONE"}}),
    Row("dp_peer_piecewise", "fap_ub_k1", (2, 2), "PIECEWISE", 4, Reason.FORCED_EAGER,
        kwargs={"valid_modes": {"PIECEWISE"}}),
    Row("full_invalid", "fap_ub_k1", (2, 2), "PIECEWISE", 4, Reason.CASCADE_ATTENTION,
        kwargs={"invalid_modes": {"FULL"}}),
    # LoRA on, cudagraph_specialize_lora off: keys exist only for max_loras + 1 adapters,
    # so a batch without adapters finds no graph of any kind.
    Row("lora_none_active", "fap_ub_k1_lora", (2, 2), "NONE", 4, Reason.LORA_MISMATCH),
    Row("lora_one_active", "fap_ub_k1_lora", (2, 2), "FULL", 4, Reason.HIT,
        kwargs={"has_lora": True, "num_active_loras": 1}),
    Row("lora_none_mixed", "fap_ub_k1_lora", (2, 7), "NONE", 9, Reason.LORA_MISMATCH),
]
# fmt: on


def _v1_kwargs(vl: Vllm, row: Row) -> dict[str, Any]:
    kw = dict(row.kwargs)
    for key in ("valid_modes", "invalid_modes"):
        if key in kw:
            kw[key] = {vl.CUDAGraphMode[name] for name in kw[key]}
    return kw


def _uniform_decode(q: tuple[int, ...], uq: int) -> bool:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return bool(GPUModelRunner._is_uniform_decode(max(q), uq, sum(q), len(q)))


@pytest.mark.parametrize("row", V1_ROWS, ids=lambda r: r.id)
@pytest.mark.usefixtures("needs_v1")
def test_v1_table(
    row: Row, vl: Vllm, v1_dispatchers: Callable[[str], tuple[Any, Resolved]]
) -> None:
    d, res = v1_dispatchers(row.engine)
    num_tokens = sum(row.q)
    uniform = _uniform_decode(row.q, d.uniform_decode_query_len)
    kw = _v1_kwargs(vl, row)

    mode, desc = d.dispatch(num_tokens=num_tokens, uniform_decode=uniform, **kw)

    assert (mode.name, desc.num_tokens) == (
        per_version(row.mode, vl.version),
        per_version(row.padded, vl.version),
    )
    got = v1_reason(d, mode, desc, num_tokens=num_tokens, uniform_decode=uniform, ctx=res.ctx, **kw)
    assert got == per_version(row.reason, vl.version)
    bare = v1_reason(d, mode, desc, num_tokens=num_tokens, uniform_decode=uniform, **kw)
    assert bare == per_version(row.no_ctx if row.no_ctx is not None else row.reason, vl.version)


@pytest.mark.usefixtures("needs_v1")
def test_v1_resolved_modes(vl: Vllm, v1_dispatchers: Callable[[str], tuple[Any, Resolved]]) -> None:
    """The resolver's demotions that the table relies on (rules 3 and 6 of 2.2)."""
    resolved = {name: v1_dispatchers(name)[1] for name in ENGINES}
    assert {n: r.mode.name for n, r in resolved.items()} == {
        "fap_ub_k1": "FULL_AND_PIECEWISE",
        "fap_ub_k2": "FULL_AND_PIECEWISE",
        "fdo_ub_k1": "FULL_DECODE_ONLY",
        "none_k1": "NONE",
        "pw_k1": "PIECEWISE",
        "fap_ustd_k0": "FULL_AND_PIECEWISE",
        "fap_ustd_k1": "PIECEWISE",
        "fap_ustd_k2": "PIECEWISE",
        "fdo_ustd_k2": "NONE",
        "fap_ub_k1_lora": "FULL_AND_PIECEWISE",
    }
    cc = resolved["fap_ub_k2"].vllm_config.compilation_config
    assert (cc.cudagraph_capture_sizes, cc.max_cudagraph_capture_size) == ([3, 6, 9, 18], 18)
    assert resolved["fap_ustd_k1"].ctx.support_demoted_decode()
    assert not resolved["fap_ustd_k0"].ctx.support_demoted_decode()
    assert not resolved["pw_k1"].ctx.support_demoted_decode()


@pytest.mark.usefixtures("needs_v1")
def test_v1_keys_not_initialized(
    vl: Vllm, v1_dispatchers: Callable[[str], tuple[Any, Resolved]]
) -> None:
    _, res = v1_dispatchers("fap_ub_k1")
    d = vl.CudagraphDispatcher(res.vllm_config)  # before initialize_cudagraph_keys
    mode, desc = d.dispatch(num_tokens=4, uniform_decode=True)
    assert mode.name == "NONE"
    assert v1_reason(d, mode, desc, num_tokens=4, uniform_decode=True) == Reason.WARMUP_OR_PROFILE


@pytest.mark.usefixtures("needs_v1")
def test_v1_runner_cascade_attention(
    vl: Vllm,
    v1_dispatchers: Callable[[str], tuple[Any, Resolved]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runner's own dispatch path: 0.26 turns FULL off for cascade attention, 0.33
    ignores the argument. The reason comes from the kwargs the dispatcher received,
    as a hook on ``CudagraphDispatcher.dispatch`` sees them.
    """
    import numpy as np
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    d, res = v1_dispatchers("fap_ub_k1")
    seen: list[dict[str, Any]] = []
    real_dispatch = d.dispatch

    def spy(**kwargs: Any) -> Any:
        seen.append(kwargs)
        return real_dispatch(**kwargs)

    monkeypatch.setattr(d, "dispatch", spy)
    # GPUModelRunner.__init__ needs a model and a CUDA device. The method under test
    # reads only these attributes; its code runs unchanged.
    runner = object.__new__(GPUModelRunner)
    runner.__dict__.update(
        vllm_config=res.vllm_config,
        compilation_config=res.vllm_config.compilation_config,
        parallel_config=res.vllm_config.parallel_config,
        model_config=SimpleNamespace(is_encoder_decoder=False),
        input_batch=SimpleNamespace(lora_id_to_lora_request={}),
        uniform_decode_query_len=2,
        cudagraph_dispatcher=d,
    )
    mode, desc, *_ = runner._determine_batch_execution_and_padding(
        num_tokens=4,
        num_reqs=2,
        num_scheduled_tokens_np=np.array([2, 2], dtype=np.int32),
        max_num_scheduled_tokens=2,
        use_cascade_attn=True,
    )
    (kwargs,) = seen
    reason = v1_reason(d, mode, desc, ctx=res.ctx, **kwargs)
    # Whether the runner turns FULL off for cascade attention is its own decision (0.26
    # does, later releases ignore the argument): read it off the call it made.
    full_off = vl.CUDAGraphMode.FULL in (kwargs.get("invalid_modes") or set())
    expected = ("PIECEWISE", Reason.CASCADE_ATTENTION) if full_off else ("FULL", Reason.HIT)
    assert (mode.name, reason) == expected


# ----------------------------------------------------------------------------------
# MRV2: CudaGraphManager. Capture sizes are not rounded here (MRV2 rounds its decode
# descriptors itself): uq 2 decode graphs at [2, 4, 8], uq 3 at [3, 6, 9, 18].

# A cell whose value differs between releases is not tabled: VLLM takes the real
# dispatch's value (the row still checks the reason), UNIFORM_OR_NOT the decode graph's
# values when the tree's own uniform count calls the batch a uniform decode, else
# the PIECEWISE not-uniform ones.
VLLM = "from vLLM"
UNIFORM_OR_NOT = "uniform or not, by vLLM"
BY_DECODE_TABLE = "by the manager's decode table, or its absence"

# fmt: off
MRV2_ROWS = [
    Row("decode_k1", "fap_ub_k1", (2, 2, 2), "FULL", 8, Reason.HIT),
    Row("decode_k2", "fap_ub_k2", (3, 3, 3), "FULL", 9, Reason.HIT),
    Row("mixed_prefill_decode", "fap_ub_k1", (2, 2, 7), "PIECEWISE", 16, Reason.NOT_UNIFORM,
        prefill=True),
    Row("short_draft", "fap_ub_k1", (2, 1), "PIECEWISE", 4, Reason.NOT_UNIFORM),
    # 0.26 keeps only the smallest captured size >= num_tokens as candidates: for 5
    # tokens that is the uq-3 decode graph at 6, which a short-draft batch cannot use,
    # and the PIECEWISE graph at 8 is never looked at. 0.33 lists both modes.
    Row("short_draft_k2", "fap_ub_k2", (3, 2), VLLM, VLLM, Reason.NOT_UNIFORM),
    Row("above_capture_size", "fap_ub_k1", (2,) * 8 + (30,), "NONE", 46, Reason.BATCH_TOO_BIG,
        prefill=True),
    # Five 2-token decodes: no FULL key for 10 tokens where decode graphs are capture sizes
    # rounded to uq (to 0.33: none past 8 tokens), a FULL hit where they are keyed by
    # request count with a graph at max_num_seqs (0.34 on): BY_DECODE_TABLE.
    Row("no_full_key", "fap_ub_k1", (2,) * 5, BY_DECODE_TABLE, BY_DECODE_TABLE,
        BY_DECODE_TABLE),
    Row("fdo_decode", "fdo_ub_k1", (2, 2), "FULL", 4, Reason.HIT),
    Row("fdo_mixed", "fdo_ub_k1", (2, 5), "NONE", 7, Reason.MIXED_BATCH_IN_FULL_DECODE_ONLY,
        prefill=True),
    Row("mode_none", "none_k1", (2, 2), "NONE", 4, Reason.GRAPHS_DISABLED),
    Row("plain_piecewise", "pw_k1", (2, 2), "PIECEWISE", 4, Reason.PIECEWISE_ONLY),
    Row("ustd_k0_decode", "fap_ustd_k0", (1, 1, 1), "FULL", 4, Reason.HIT),
    Row("ustd_k1_decode", "fap_ustd_k1", (2, 2, 2), "PIECEWISE", 8,
        Reason.BACKEND_SUPPORT_TOO_LOW, no_ctx=Reason.PIECEWISE_ONLY),
    Row("ustd_k2_decode", "fap_ustd_k2", (3, 3), "PIECEWISE", 8,
        Reason.BACKEND_SUPPORT_TOO_LOW, no_ctx=Reason.PIECEWISE_ONLY),
    Row("ustd_k1_mixed", "fap_ustd_k1", (2, 7), "PIECEWISE", 16,
        Reason.NOT_UNIFORM, no_ctx=Reason.PIECEWISE_ONLY, prefill=True),
    Row("ustd_fdo_k2_decode", "fdo_ustd_k2", (3, 3), "NONE", 6,
        Reason.BACKEND_SUPPORT_TOO_LOW, no_ctx=Reason.GRAPHS_DISABLED),
    Row("ustd_fdo_k2_mixed", "fdo_ustd_k2", (3, 5), "NONE", 8,
        Reason.MIXED_BATCH_IN_FULL_DECODE_ONLY, no_ctx=Reason.GRAPHS_DISABLED, prefill=True),
    # Two new 2-token prompts: 0.26 counts any uniform batch (get_uniform_token_count)
    # and replays the decode graph; later releases exclude batches with a prefill. Which
    # one the tree does is what its own uniform count says (UNIFORM_OR_NOT).
    Row("uniform_prefill", "fap_ub_k1", (2, 2), UNIFORM_OR_NOT, 4, UNIFORM_OR_NOT,
        prefill=True),
    Row("lora_one_active", "fap_ub_k1_lora", (2, 2), "FULL", 4, Reason.HIT,
        kwargs={"num_active_loras": 1}),
]
# fmt: on


def _uniform_token_count(q: tuple[int, ...], prefill: bool) -> int | None:
    """What the MRV2 runner passes as uniform_token_count, by the version's own code."""
    return uniform_token_count(len(q), sum(q), max(q), prefill)


def _mrv2_dispatch(
    m: Any, q: tuple[int, ...], prefill: bool, loras: int
) -> tuple[Any, dict[str, Any]]:
    """Call the real dispatch as the runner does; returns the desc and its arguments."""
    kwargs: dict[str, Any] = {
        "num_reqs": len(q),
        "num_tokens": sum(q),
        "uniform_token_count": _uniform_token_count(q, prefill),
        "num_active_loras": loras,
    }
    if "max_query_len" in inspect.signature(m.dispatch).parameters:
        # 0.33's runner passes None for a batch with a prefill.
        kwargs["max_query_len"] = None if prefill else max(q)
    return m.dispatch(**kwargs), kwargs


@pytest.mark.parametrize("row", MRV2_ROWS, ids=lambda r: r.id)
def test_mrv2_table(
    row: Row, vl: Vllm, mrv2_managers: Callable[[str], tuple[Any, Resolved]]
) -> None:
    m, res = mrv2_managers(row.engine)
    desc, kwargs = _mrv2_dispatch(m, row.q, row.prefill, row.kwargs.get("num_active_loras", 0))
    uniform = kwargs["uniform_token_count"] == m.decode_query_len
    mode, padded, reason = (
        per_version(getattr(row, cell), vl.version) for cell in ("mode", "padded", "reason")
    )
    if mode == UNIFORM_OR_NOT:
        mode, reason = ("FULL", Reason.HIT) if uniform else ("PIECEWISE", Reason.NOT_UNIFORM)
    if mode == BY_DECODE_TABLE:
        by_requests = hasattr(m, "_decode_descs")
        mode, padded, reason = (
            ("FULL", 2 * MAX_NUM_SEQS, Reason.HIT)
            if by_requests
            else ("PIECEWISE", 16, Reason.NO_FULL_KEY_FOR_SIZE)
        )
    if mode == VLLM:
        mode = desc.cg_mode.name
        assert mode != "FULL"
    if padded == VLLM:
        padded = desc.num_tokens

    assert (desc.cg_mode.name, desc.num_tokens) == (mode, padded)
    assert mrv2_reason(m, desc, ctx=res.ctx, **kwargs) == reason
    bare = mrv2_reason(m, desc, **kwargs)
    assert bare == (per_version(row.no_ctx, vl.version) if row.no_ctx is not None else reason)


@pytest.mark.parametrize("n", [4, 5, MAX_NUM_SEQS])
def test_mrv2_decode_graph_at_max_num_seqs(
    n: int, vl: Vllm, mrv2_managers: Callable[[str], tuple[Any, Resolved]]
) -> None:
    """vLLM 0.34's decode graphs by request count against 0.33's by token size, on the
    tree's own manager. Capture sizes [1, 2, 4, 8, 16, 32], max_num_seqs 6, MTP k = 1:
    to 0.33 the decode graphs are the sizes rounded to 2 within 6 x 2 tokens (1, 2, 4
    requests), so 5 or 6 decodes miss FULL (no_full_key_for_size, PIECEWISE at 16);
    0.34 derives request counts from the same sizes (``_split_cudagraph_capture_sizes``)
    and captures the first one past max_num_seqs at max_num_seqs, so they replay the
    decode graph of 6 requests, found in ``_decode_descs`` before ``_candidates``."""
    m, res = mrv2_managers("fap_ub_k1")
    desc, kwargs = _mrv2_dispatch(m, (2,) * n, False, 0)
    reason = mrv2_reason(m, desc, ctx=res.ctx, **kwargs)
    got = (desc.cg_mode.name, desc.num_tokens, reason)
    if n == 4:  # a captured size in both
        assert got == ("FULL", 8, Reason.HIT)
        return
    if hasattr(m, "_decode_descs"):
        table = m._decode_descs[(2, 0, 1)]
        assert len(table) == MAX_NUM_SEQS + 1 and table[n] == desc
        assert res.vllm_config.compilation_config.decode_cudagraph_capture_request_sizes[-1] == 6
        assert got == ("FULL", 2 * MAX_NUM_SEQS, Reason.HIT) and desc.num_reqs == MAX_NUM_SEQS
    else:
        assert got == ("PIECEWISE", 16, Reason.NO_FULL_KEY_FOR_SIZE)


def test_mrv2_not_captured(vl: Vllm, mrv2_managers: Callable[[str], tuple[Any, Resolved]]) -> None:
    _, res = mrv2_managers("fap_ub_k1")
    m = make_manager(vl, res, captured=False)
    desc, kwargs = _mrv2_dispatch(m, (2, 2), False, 0)
    assert desc.cg_mode.name == "NONE"
    assert mrv2_reason(m, desc, **kwargs) == Reason.WARMUP_OR_PROFILE


def test_mrv2_lora_mismatch(vl: Vllm, mrv2_managers: Callable[[str], tuple[Any, Resolved]]) -> None:
    """The runner always captures the no-adapter case; without it the key is missing."""
    _, res = mrv2_managers("fap_ub_k1")
    m = make_manager(vl, res, lora_capture_cases=[3])
    desc, kwargs = _mrv2_dispatch(m, (2, 2), False, 0)
    assert desc.cg_mode.name == "NONE"
    assert mrv2_reason(m, desc, ctx=res.ctx, **kwargs) == Reason.LORA_MISMATCH


# ----------------------------------------------------------------------------------
# Properties over random batches: the reason never contradicts the real mode.

q_lists = st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=MAX_NUM_SEQS)
uniform_lists = st.builds(lambda n, uq: (uq,) * n, st.integers(1, MAX_NUM_SEQS), st.integers(1, 3))
batches = st.one_of(q_lists.map(tuple), uniform_lists)


def _consistent(
    reason: Reason, mode_name: str, uniform: bool, num_tokens: int, max_size: int
) -> None:
    assert reason != Reason.UNKNOWN
    assert (reason == Reason.HIT) == (mode_name == "FULL")
    if reason == Reason.BATCH_TOO_BIG:
        assert num_tokens > max_size
    if reason == Reason.BACKEND_SUPPORT_TOO_LOW:
        assert uniform
    if reason in (Reason.NOT_UNIFORM, Reason.MIXED_BATCH_IN_FULL_DECODE_ONLY):
        assert not uniform


@settings(max_examples=300, deadline=None, database=None)
@given(engine=st.sampled_from(sorted(ENGINES)), q=batches)
@pytest.mark.usefixtures("needs_v1")
def test_v1_reason_agrees_with_dispatch(
    engine: str, q: tuple[int, ...], v1_dispatchers: Callable[[str], tuple[Any, Resolved]]
) -> None:
    d, res = v1_dispatchers(engine)
    uniform = _uniform_decode(q, d.uniform_decode_query_len)
    mode, desc = d.dispatch(num_tokens=sum(q), uniform_decode=uniform)
    for ctx in (res.ctx, None):
        reason = v1_reason(d, mode, desc, num_tokens=sum(q), uniform_decode=uniform, ctx=ctx)
        max_size = d.compilation_config.max_cudagraph_capture_size
        _consistent(reason, mode.name, uniform, sum(q), max_size)


@settings(max_examples=300, deadline=None, database=None)
@given(engine=st.sampled_from(sorted(ENGINES)), q=batches, prefill=st.booleans())
def test_mrv2_reason_agrees_with_dispatch(
    engine: str,
    q: tuple[int, ...],
    prefill: bool,
    mrv2_managers: Callable[[str], tuple[Any, Resolved]],
) -> None:
    m, res = mrv2_managers(engine)
    desc, kwargs = _mrv2_dispatch(m, q, prefill, 0)
    uniform = kwargs["uniform_token_count"] == m.decode_query_len
    for ctx in (res.ctx, None):
        reason = mrv2_reason(m, desc, ctx=ctx, **kwargs)
        _consistent(reason, desc.cg_mode.name, uniform, sum(q), CAPTURE_SIZES[-1])


# ----------------------------------------------------------------------------------
# Helpers


def test_mode_parts_matches_cudagraph_mode(vl: Vllm) -> None:
    for mode in vl.CUDAGraphMode:
        expected = (mode.decode_mode().value, mode.mixed_mode().value)
        assert mode_parts(mode) == expected
        assert mode_parts(mode.name) == expected
        assert mode_parts(repr(mode).strip("<>").split(":")[0]) == expected


def test_min_support_matches_real_backends(vl: Vllm) -> None:
    """Sparse MLA backends as the runners see them (class attributes, no config)."""
    from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import ROCMAiterMLASparseBackend

    ub = vl.AttentionCGSupport.UNIFORM_BATCH.value
    backends = [(FlashMLASparseBackend, None), (ROCMAiterMLASparseBackend, None)]
    assert min_support(backends) == (ub, "FlashMLASparseBackend")
    assert min_support([]) == (vl.AttentionCGSupport.ALWAYS.value, "")


def test_min_support_what_if(vl: Vllm, monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if of docs/whatif.md: the ROCm builder set back to UNIFORM_SINGLE_TOKEN_DECODE."""
    from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import (
        ROCMAiterMLASparseBackend,
        ROCMAiterMLASparseMetadataBuilder,
    )

    ustd = vl.AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    monkeypatch.setattr(ROCMAiterMLASparseMetadataBuilder, "_cudagraph_support", ustd)
    got = min_support([(FlashMLASparseBackend, None), (ROCMAiterMLASparseBackend, None)])
    assert got == (ustd.value, "ROCMAiterMLASparseBackend")
    vc = vl.VllmConfig()
    assert min_support([(ROCMAiterMLASparseBackend, None)], vc) == got


def test_graph_context_alone(vl: Vllm) -> None:
    ctx = GraphContext("FULL_AND_PIECEWISE", "PIECEWISE", 1, "ROCMAiterMLASparseBackend", 2)
    assert ctx.support_demoted_decode()
    assert not GraphContext("FULL_AND_PIECEWISE", "PIECEWISE", 1, "X", 1).support_demoted_decode()
    assert GraphContext("FULL_DECODE_ONLY", "NONE", 0, "X", 1).support_demoted_decode()
    assert not GraphContext("PIECEWISE", "PIECEWISE", 1, "X", 2).support_demoted_decode()
    res = resolve(vl, ENGINES["fap_ustd_k2"], v2=True)
    assert res.ctx == GraphContext(
        "FULL_AND_PIECEWISE", "PIECEWISE", 1, "ROCMAiterMLASparseBackend", 3
    )
