"""Hook lifecycle and DISPATCH records against the real vLLM wheel trees (0.26 to 0.34).

Every target that resolves in the tree is installed, uninstalled (originals back by
identity), reinstalled. Then the real V1 dispatcher and the real MRV2 graph manager are
driven through the installed hooks: each DISPATCH record carries the real call's mode and
the reason ``probe.reasons`` derives for it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from probe.engine import hooks
from probe.engine.hooks._base import Target, not_in_vllm
from probe.engine.ring_writer import RingWriter
from probe.engine.runtime import RT
from probe.reasons import mrv2_reason, v1_reason
from probe.records import Dispatch, Flag

from .test_reasons import _mrv2_dispatch, _uniform_decode, _uniform_token_count
from .vllm_env import Resolved, Vllm, mrv2_runner

pytestmark = [pytest.mark.wheels, pytest.mark.usefixtures("clean_probe")]

ALL_TARGETS = hooks.targets()

V1_SHAPES = [
    ("fap_ub_k1", (2, 2, 2)),
    ("fap_ub_k1", (2, 2, 7)),
    ("fap_ub_k1", (2,) * 8 + (30,)),
    ("fap_ustd_k1", (2, 2, 2)),
    ("fdo_ub_k1", (2, 5)),
    ("none_k1", (2, 2)),
]
MRV2_SHAPES = [
    ("fap_ub_k1", (2, 2, 2), False),
    ("fap_ub_k1", (2, 7), True),
    ("fap_ustd_k1", (2, 2, 2), False),
    ("fdo_ub_k1", (2, 5), True),
]


@pytest.fixture
def wring(tmp_path: Path, vllm_version: str) -> Iterator[RingWriter]:
    writer = RingWriter.create(tmp_path / "ring", capacity=4096)
    yield writer
    writer.close()


@pytest.mark.parametrize("target", ALL_TARGETS, ids=lambda t: t.hook_id)
def test_lifecycle_restores_by_identity(target: Target, kit: Any, vllm_version: str) -> None:
    if not_in_vllm(target.module):
        pytest.skip(f"{target.hook_id}: not in vLLM {vllm_version} ({target.module} is gone)")
    before = kit.originals([target])
    if target.hook_id not in before:
        pytest.skip(f"{target.hook_id} does not resolve in vLLM {vllm_version}")
    owner, original = before[target.hook_id]
    assert target.hook_id in hooks.install(lazy=False).installed
    kit.assert_wrapped(target, owner)
    hooks.uninstall()
    kit.assert_restored(target, owner, original)
    hooks.install(lazy=False)
    kit.assert_wrapped(target, owner)
    hooks.uninstall()
    kit.assert_restored(target, owner, original)


def test_dispatch_targets_resolve(vl: Vllm) -> None:
    """The dispatch family, MRV2 included, resolves fully in every tree; the MRV2
    manager's ``dispatch`` (hooked only under DP > 1, a late target) too. On a tree
    without the classic runner its targets are "not in this vLLM", never missing."""
    report = hooks.install(["dispatch"], lazy=False)
    v1 = {"dispatch.v1.dispatcher", "dispatch.v1.runner"}
    assert "dispatch.mrv2.sync_dp" in report.installed, report.missing
    assert not report.missing
    if vl.has_v1:
        assert v1 <= set(report.installed) and not report.not_in_vllm
    else:
        assert {h for h, _ in report.not_in_vllm} == v1
    assert "dispatch.mrv2.manager" not in report.installed
    _hook_manager()
    hooks.uninstall()


def test_targets_not_in_this_vllm_are_reported_once(vl: Vllm, vllm_version: str) -> None:
    """A lazy install (the plugin's: always-on first, the rest at attach) defers
    nothing the tree does not ship and names each such target once, apart from the
    missing ones; the V1 targets are exactly those on a tree without V1."""
    hooks.install(list(hooks.ALWAYS_ON))
    hooks._install_missing(None)
    got = [h for h, _ in hooks.LAST_REPORT.not_in_vllm]
    assert len(got) == len(set(got))
    assert not any(".v1." in h or h.endswith(".v1") for h, _ in hooks.LAST_REPORT.missing)
    v1 = {t.hook_id for t in hooks.targets() if t.module.startswith("vllm.v1.worker.gpu_model")}
    v1 |= {t.hook_id for t in hooks.targets() if t.module == "vllm.v1.cudagraph_dispatcher"}
    if vl.has_v1:
        assert got == []
    else:
        assert set(got) == v1 and len(v1) == 9, (vllm_version, got)
        assert not any(h in v1 for ts in hooks._deferred.values() for h in (t.hook_id for t in ts))
    hooks.uninstall()


def _hook_manager() -> Any:
    """The real ``CudaGraphManager.dispatch`` hooked, as the dispatch family's late targets
    do under DP > 1 (:func:`probe.engine.hooks.dispatch.late_targets`); returns vLLM's own."""
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    from probe.engine.hooks import dispatch

    own = vars(CudaGraphManager)["dispatch"]
    assert hooks.INSTALLER.install_on(dispatch.MANAGER, CudaGraphManager)
    assert vars(CudaGraphManager)["dispatch"] is not own
    return own


def _speculator_classes() -> list[type]:
    """The tree's MRV2 speculator classes whose module calls ``dispatch_cg_and_sync_dp``."""
    import importlib
    import inspect as _inspect

    out = []
    for kind in ("autoregressive", "target_dependent_ar", "multi_module_mtp", "dflash"):
        try:
            mod = importlib.import_module(f"vllm.v1.worker.gpu.spec_decode.{kind}.speculator")
        except ImportError:
            continue
        if "dispatch_cg_and_sync_dp" not in vars(mod):
            continue
        out += [
            c for _, c in _inspect.getmembers(mod, _inspect.isclass)
            if c.__module__ == mod.__name__ and hasattr(c, "propose")
        ]  # fmt: skip
    return out


def test_dispatch_late_targets_on_the_real_runner(vllm_version: str) -> None:
    """On the tree's own MRV2 runner class: every speculator's module gets its phase
    hook (the drafter's decision), the manager's ``dispatch`` only under DP > 1; each
    installs and is restored by identity."""
    import sys

    from probe.engine.hooks import dispatch

    specs = _speculator_classes()
    assert specs, "no MRV2 speculator class found"
    # the engine's speculator is a subclass defined elsewhere (e.g. the model's MTP one):
    # the hook goes on the module of its base that calls dispatch_cg_and_sync_dp
    sub = type("ModelsOwnSpeculator", (specs[0],), {})
    sub.__abstractmethods__ = frozenset()
    runner = mrv2_runner(object.__new__(sub), dp_size=1)
    late = dispatch.late_targets(runner)
    mod = sys.modules[specs[0].__module__]
    assert [(t.hook_id, o) for t, o in late] == [("dispatch.mrv2.draft_sync_dp", mod)]
    late = dispatch.late_targets(mrv2_runner(runner.speculator, dp_size=2))
    assert [t.hook_id for t, _ in late] == [
        "dispatch.mrv2.manager", "dispatch.mrv2.draft_sync_dp",
    ]  # fmt: skip
    own = {id(o): vars(o)[t.name] for t, o in late}
    hooks.install(["dispatch"], lazy=False)
    try:
        for t, o in late:
            assert hooks.INSTALLER.install_on(t, o)
            assert vars(o)[t.name] is not own[id(o)]
    finally:
        hooks.uninstall()
    assert all(vars(o)[t.name] is own[id(o)] for t, o in late)
    assert dispatch.late_targets(object()) == []  # not an MRV2 runner: nothing


def test_mrv2_prepare_inputs_ends_where_the_real_state_builds(vllm_version: str) -> None:
    """MRV2's prepare_inputs phase runs from the dispatch phase's end to the model
    state's ``prepare_attn`` (one FROM_DISPATCH span on the metadata build): in every
    tree the runner's ``execute_model`` calls the dispatch phase, then its own
    ``prepare_attn``, then the state's; the state's classes all have it; on the real
    runner the step family's late targets hook the state's, and the runner's only under
    micro-batching (0.30+'s ubatch runner, whose steps skip the state's)."""
    import inspect

    from vllm.v1.worker.gpu import model_states
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from probe.engine.hooks import step

    src = inspect.getsource(GPUModelRunner.execute_model)
    at = [src.index(s) for s in ("dispatch_cg_and_sync_dp(", "self.prepare_attn(",
                                 "self.model_state.prepare_attn(")]  # fmt: skip
    assert at == sorted(at)
    state_classes = [
        c
        for m in pkgutil.iter_modules(model_states.__path__)
        for c in vars(importlib.import_module(f"{model_states.__name__}.{m.name}")).values()
        if isinstance(c, type) and c.__module__.startswith(model_states.__name__)
        and c.__name__.endswith("ModelState")
    ]  # fmt: skip
    assert DefaultModelState in state_classes
    assert all(callable(getattr(c, "prepare_attn", None)) for c in state_classes)

    runner = mrv2_runner()
    runner.model_state = object.__new__(DefaultModelState)
    late = {t.hook_id: (t, o) for t, o in step.late_targets(runner)}
    assert "phase.mrv2.prepare_attn" not in late
    target, owner = late["phase.mrv2.metadata_build"]
    assert owner is DefaultModelState
    hooks.install(["step"], lazy=False)
    try:
        assert hooks.INSTALLER.install_on(target, owner)
        assert getattr(DefaultModelState.prepare_attn, "__probe_hook__", "") == target.hook_id
    finally:
        hooks.uninstall()
    assert "prepare_attn" not in vars(DefaultModelState) or not hasattr(
        vars(DefaultModelState)["prepare_attn"], "__probe_hook__"
    )
    has_ubatch = "ubatch_runner" in inspect.getsource(GPUModelRunner)
    runner.ubatch_runner = object()
    assert "phase.mrv2.prepare_attn" in {t.hook_id for t, _ in step.late_targets(runner)}
    assert has_ubatch == (vllm_version >= "0.30"), vllm_version


@pytest.mark.parametrize(("engine", "q", "prefill"), MRV2_SHAPES, ids=lambda v: str(v))
def test_mrv2_phase_reads_the_real_managers_decision(
    engine: str,
    q: tuple[int, ...],
    prefill: bool,
    mrv2_managers: Callable[[str], tuple[Any, Resolved]],
    wring: RingWriter,
    kit: Any,
) -> None:
    """DP 1, the manager not hooked: the real ``dispatch_cg_and_sync_dp`` through the
    runner module's hooked name writes one DISPATCH with the phase's span, whose mode,
    reason and counts are the real manager's decision for those inputs."""
    import inspect as _inspect

    from vllm.v1.worker.gpu import model_runner
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    m, res = mrv2_managers(engine)
    own = vars(CudaGraphManager)["dispatch"]
    hooks.install(["dispatch"], lazy=False)
    assert vars(CudaGraphManager)["dispatch"] is own  # vLLM's own: not a hooked call
    hooks.enable(wring, gpu_timing=False)
    RT.graph_ctx = res.ctx
    RT.step, RT.in_step = 4, 1
    utc = _uniform_token_count(q, prefill)
    extra = {}
    if "max_query_len" in _inspect.signature(model_runner.dispatch_cg_and_sync_dp).parameters:
        extra["max_query_len"] = None if prefill else max(q)
    for _ in range(2):  # a repeated miss: from the reason memo
        desc, _sync = model_runner.dispatch_cg_and_sync_dp(m, len(q), sum(q), utc, 1, 0, **extra)
    RT.in_step = 0
    hooks.disable()
    kwargs = {"num_reqs": len(q), "num_tokens": sum(q), "uniform_token_count": utc, **extra}
    expected = mrv2_reason(m, desc, ctx=res.ctx, **kwargs)
    recs = [r for r in kit.drain(wring)[0] if isinstance(r, Dispatch)]
    assert len(recs) == 2 and recs[0].reason == recs[1].reason
    rec = recs[0]
    assert rec.flags & (Flag.SPAN | Flag.MRV2) == Flag.SPAN | Flag.MRV2
    assert (rec.mode.value, rec.reason) == (desc.cg_mode.value, expected)
    assert (rec.num_tokens, rec.padded_tokens, rec.num_reqs) == (sum(q), desc.num_tokens, len(q))
    assert bool(rec.flags & Flag.UNIFORM) == (utc == m.decode_query_len)


@pytest.mark.parametrize(("engine", "q"), V1_SHAPES, ids=lambda v: str(v))
@pytest.mark.usefixtures("needs_v1")
def test_v1_dispatch_record_matches_real_call(
    engine: str,
    q: tuple[int, ...],
    v1_dispatchers: Callable[[str], tuple[Any, Resolved]],
    wring: RingWriter,
    kit: Any,
) -> None:
    d, res = v1_dispatchers(engine)
    num_tokens, uniform = sum(q), _uniform_decode(q, d.uniform_decode_query_len)
    hooks.install(["dispatch"], lazy=False)
    hooks.enable(wring, gpu_timing=False)
    RT.graph_ctx = res.ctx
    for _ in range(3):  # a repeated miss is served from the reason memo, unchanged
        mode, desc = d.dispatch(num_tokens=num_tokens, uniform_decode=uniform)
    d.dispatch(num_tokens, uniform)  # the same call, positionally
    hooks.disable()
    expected = v1_reason(d, mode, desc, num_tokens=num_tokens, uniform_decode=uniform, ctx=res.ctx)
    recs = [r for r in kit.drain(wring)[0] if isinstance(r, Dispatch)]
    assert len(recs) == 4 and len({(r.mode, r.reason, r.flags) for r in recs}) == 1
    rec = recs[0]
    assert (rec.mode.value, rec.reason) == (mode.value, expected)
    assert (rec.num_tokens, rec.padded_tokens) == (num_tokens, desc.num_tokens)
    assert bool(rec.flags & Flag.UNIFORM) == bool(uniform)


@pytest.mark.usefixtures("needs_v1")
def test_v1_dispatch_with_a_mode_set_is_memoized(
    v1_dispatchers: Callable[[str], tuple[Any, Resolved]],
    wring: RingWriter,
    kit: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Calls that miss carry mode sets (here ``invalid_modes={CUDAGraphMode.FULL}``, as for
    cascade attention or the kv-sharing logits dispatch): unhashable as they come. The
    miss reason is still computed once."""
    from vllm.config import CUDAGraphMode

    from probe.engine.hooks import dispatch as hook_module

    computed = []
    real = hook_module._reasons
    monkeypatch.setattr(hook_module, "_reasons", lambda: computed.append(1) or real())
    d, res = v1_dispatchers("fap_ub_k1")
    hooks.install(["dispatch"], lazy=False)
    hooks.enable(wring, gpu_timing=False)
    RT.graph_ctx = res.ctx
    for _ in range(3):
        mode, desc = d.dispatch(6, invalid_modes={CUDAGraphMode.FULL})
    hooks.disable()
    assert mode != CUDAGraphMode.FULL and len(computed) == 1
    expected = v1_reason(
        d,
        mode,
        desc,
        num_tokens=6,
        uniform_decode=False,
        invalid_modes={CUDAGraphMode.FULL},
        ctx=res.ctx,
    )
    recs = [r for r in kit.drain(wring)[0] if isinstance(r, Dispatch)]
    assert [r.reason for r in recs] == [expected] * 3


@pytest.mark.parametrize(("engine", "q", "prefill"), MRV2_SHAPES, ids=lambda v: str(v))
def test_mrv2_dispatch_record_matches_real_call(
    engine: str,
    q: tuple[int, ...],
    prefill: bool,
    mrv2_managers: Callable[[str], tuple[Any, Resolved]],
    wring: RingWriter,
    kit: Any,
) -> None:
    m, res = mrv2_managers(engine)
    hooks.install(["dispatch"], lazy=False)
    _hook_manager()  # as under DP > 1
    hooks.enable(wring, gpu_timing=False)
    RT.graph_ctx = res.ctx
    desc, kwargs = _mrv2_dispatch(m, q, prefill, 0)
    _mrv2_dispatch(m, q, prefill, 0)  # a repeat: from the reason memo
    m.dispatch(*kwargs.values())  # the same call, positionally (positions fixed at install)
    RT.graph_ctx = None  # as after a new snapshot: not served from the memo
    _mrv2_dispatch(m, q, prefill, 0)
    hooks.disable()
    expected = mrv2_reason(m, desc, ctx=res.ctx, **kwargs)
    recs = [r for r in kit.drain(wring)[0] if isinstance(r, Dispatch)]
    key = lambda r: (r.mode, r.num_tokens, r.padded_tokens, r.num_reqs, r.flags)  # noqa: E731
    assert len(recs) == 4 and len({key(r) for r in recs}) == 1
    assert recs[0].reason == recs[1].reason == recs[2].reason
    assert recs[3].reason == mrv2_reason(m, desc, ctx=None, **kwargs)
    rec = recs[0]
    assert (rec.mode.value, rec.reason) == (desc.cg_mode.value, expected)
    assert (rec.num_tokens, rec.padded_tokens, rec.num_reqs) == (sum(q), desc.num_tokens, len(q))
    assert rec.flags & Flag.MRV2


def test_mrv2_target_forward_is_one_hooked_call(
    mrv2_managers: Callable[[str], tuple[Any, Resolved]],
    wring: RingWriter,
    kit: Any,
    hot_path: str,
) -> None:
    """The real ModelCudaGraphManager.run_fullgraph stays vLLM's own: its replay through
    ``super()`` is the hooked call, and in a step it is the FULL forward launch (one
    FORWARD record counting the replay); the same manager in the drafter's scope, or
    outside a step, is a plain replay."""
    import torch
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager, ModelCudaGraphManager

    from probe.records import Forward, Replay

    m, _ = mrv2_managers("fap_ub_k1")
    desc, _ = _mrv2_dispatch(m, (2, 2, 2), False, 0)
    assert desc.cg_mode == CUDAGraphMode.FULL
    replays: list[Any] = []
    m.graphs[desc] = type("Graph", (), {"replay": lambda self: replays.append(desc)})()
    m.hidden_states = torch.zeros(desc.num_tokens + 2, 4)  # capture() would allocate it
    own = vars(ModelCudaGraphManager)["run_fullgraph"]
    try:
        hooks.install(["replay"], lazy=False)
        assert vars(ModelCudaGraphManager)["run_fullgraph"] is own
        assert vars(CudaGraphManager)["run_fullgraph"] is not own
        hooks.enable(wring, gpu_timing=False)
        RT.in_step, RT.step = 1, 5
        out = m.run_fullgraph(desc)
        RT.drafter = 1
        m.run_fullgraph(desc)
        RT.drafter, RT.in_step = 0, 0
        m.run_fullgraph(desc)
        hooks.disable()
    finally:
        RT.in_step = RT.drafter = 0
        del m.graphs[desc]
        m.hidden_states = None
    assert tuple(out.shape) == (desc.num_tokens, 4) and len(replays) == 3
    recs = [r for r in kit.drain(wring)[0] if isinstance(r, Forward | Replay)]
    assert [type(r).__name__ for r in recs] == ["Forward", "Replay", "Replay"]
    fwd = recs[0]
    assert (fwd.step, fwd.mode, fwd.full_replays, fwd.num_tokens) == (5, 2, 1, desc.num_tokens)
    assert fwd.t0 <= fwd.replay_t0 <= fwd.replay_t1 <= fwd.t1
    assert recs[1].flags & Flag.DRAFTER and recs[2].flags & Flag.OUTSIDE_STEP


@pytest.mark.usefixtures("needs_v1")
def test_v1_forward_launch_in_the_real_classes(kit: Any, vllm_version: str) -> None:
    """V1's launch against the tree's own classes: with the replay family installed, a
    runner whose model is a real FULL ``CUDAGraphWrapper`` needs no ``_model_forward``
    hook; any other model gets it (the late target resolves on the real runner and is
    restored by identity)."""
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from probe.engine.hooks import step

    original = vars(GPUModelRunner)["_model_forward"]
    runner = object.__new__(GPUModelRunner)
    wrapper = object.__new__(CUDAGraphWrapper)
    wrapper.runtime_mode = CUDAGraphMode.FULL
    runner.model = wrapper
    hooks.install(["replay"], lazy=False)
    try:
        assert "phase.v1.forward_launch" not in [t.hook_id for t, _ in step.late_targets(runner)]
        runner.model = object()
        late = {t.hook_id: (t, o) for t, o in step.late_targets(runner)}
        target, owner = late["phase.v1.forward_launch"]
        assert owner is GPUModelRunner
        assert hooks.INSTALLER.install_on(target, owner)
        assert vars(GPUModelRunner)["_model_forward"] is not original
    finally:
        hooks.uninstall()
    assert vars(GPUModelRunner)["_model_forward"] is original


@pytest.mark.parametrize("manager_hooked", [False, True], ids=["dp1", "dp2 hooks"])
def test_mrv2_fast_prefill_dispatch_is_not_the_step_decision(
    manager_hooked: bool,
    mrv2_managers: Callable[[str], tuple[Any, Resolved]],
    wring: RingWriter,
    kit: Any,
    vllm_version: str,
) -> None:
    """MRV2 with ``kv_sharing_fast_prefill`` (0.30, 0.33): on a step with a prefill the runner's
    dispatch phase decides the batch, then ``FastPrefillHelper.prepare`` asks the same
    target manager about the logits count, after the phase. At DP 1 the manager is not
    hooked and only the phase's decision is recorded; with the manager hooked (DP > 1)
    both are (the real functions through the installed hooks). Either way the assembled
    step's decision is the phase's."""
    try:
        from vllm.v1.worker.gpu.attn_utils import FastPrefillHelper
    except ImportError:
        pytest.skip(f"vLLM {vllm_version} has no fast-prefill dispatch")
    import numpy as np
    import torch
    from vllm.v1.worker.gpu import model_runner

    from probe.reader.assemble import StepAssembler

    m, res = mrv2_managers("fap_ub_k1")
    helper = FastPrefillHelper(m, 8192)
    hooks.install(["dispatch"], lazy=False)
    if manager_hooked:
        _hook_manager()
    hooks.enable(wring, gpu_timing=False)
    RT.graph_ctx = res.ctx
    RT.step, RT.in_step = 7, 1
    q = (2, 7, 40)  # a prefill: no uniform count, no FULL graph
    desc, _sync = model_runner.dispatch_cg_and_sync_dp(m, len(q), sum(q), None, 1, 0)
    logits = torch.tensor([1, 8, 48], dtype=torch.int32)
    fast = helper.prepare(logits, len(q), np.array([0, 1, 2, 3]), True, desc)
    RT.in_step = 0
    hooks.disable()
    assert fast is not None  # the helper did dispatch (the path under test ran)
    recs = [r for r in kit.drain(wring)[0] if isinstance(r, Dispatch)]
    spans = [bool(r.flags & Flag.SPAN) for r in recs]
    assert spans == ([True, False] if manager_hooked else [True])
    phase = recs[0]
    assert (phase.num_tokens, phase.padded_tokens) == (sum(q), desc.num_tokens)
    if manager_hooked:
        assert recs[1].num_tokens == len(logits)
    asm = StepAssembler(pid=1)
    steps = [s for r in recs for s in asm.feed(r)] + asm.flush()
    [step] = [s for s in steps if s.step == 7]
    assert (step.mode.value, step.padded_tokens) == (desc.cg_mode.value, desc.num_tokens)
    assert step.reason == phase.reason


def test_mrv2_decode_calls_stay_in_c(
    mrv2_managers: Callable[[str], tuple[Any, Resolved]],
    wring: RingWriter,
    kit: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the compiled hot path, a uniform decode step's hooked calls with the tree's real
    objects (the dispatch phase's FULL decision from the real manager, the target's and
    the drafter's ``run_fullgraph``, the batch sort on a real-shaped request dict) write
    their records from C: no call is handed to a hook's Python ``record``/``impl``
    (``benchmarks/gpu/pycalls.py`` counts them), as the records show they were made."""
    import inspect as _inspect

    import torch
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu import model_runner

    from probe.engine import accel
    from probe.records import Forward, Reorder, Replay

    if accel.active() != "compiled":
        pytest.skip("the compiled hot path is not built here")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks/gpu"))
    import pycalls

    m, res = mrv2_managers("fap_ub_k1")
    q = (2, 2, 2)
    desc, _ = _mrv2_dispatch(m, q, False, 0)
    assert desc.cg_mode == CUDAGraphMode.FULL
    m.graphs[desc] = type("Graph", (), {"replay": lambda self: None})()
    m.hidden_states = torch.zeros(desc.num_tokens + 2, 4)
    counter = pycalls.PythonCalls()
    counter.patch()
    try:
        hooks.install(["dispatch", "replay", "reorder"], lazy=False)
        hooks.enable(wring, gpu_timing=False)
        RT.graph_ctx = res.ctx
        RT.in_step, RT.step = 1, 7
        extra = {}
        params = _inspect.signature(model_runner.dispatch_cg_and_sync_dp).parameters
        if "max_query_len" in params:
            extra["max_query_len"] = max(q)
        got, _sync = model_runner.dispatch_cg_and_sync_dp(
            m, len(q), sum(q), 2, 1, 0, **extra
        )  # fmt: skip
        assert got.cg_mode == CUDAGraphMode.FULL
        m.run_fullgraph(desc)
        RT.drafter = 1
        m.run_fullgraph(desc)
        RT.drafter = 0
        per_req = {"req-a": 2, "req-b": 2, "req-c": 2}
        sort = model_runner.sort_batch_req_ids
        if len(_inspect.signature(vars(model_runner)["sort_batch_req_ids"]).parameters) == 3:
            order = sort(per_req, {r: [9] for r in per_req}, 2)  # 0.33: draft tokens
        else:
            order = sort(per_req, 2)
        assert sorted(order) == sorted(per_req)
        hooks.disable()
    finally:
        RT.in_step = RT.drafter = 0
        counter.unpatch()
        del m.graphs[desc]
        m.hidden_states = None
    assert counter.counts == {}, counter.counts
    recs = kit.drain(wring)[0]
    kinds = [type(r).__name__ for r in recs if isinstance(r, Dispatch | Forward | Replay | Reorder)]
    assert kinds == ["Dispatch", "Forward", "Replay", "Reorder"], kinds
