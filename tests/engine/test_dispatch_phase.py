"""The runner's dispatch phase and the dispatchers inside it write the same DISPATCH and
SPAN records on both hot paths, hits and misses: the compiled phase wrappers
(probe.engine.accel._accel.
Phase) with the C FULL hit, and every case they hand to Python (a miss and its reason,
numpy or None counts, need_eager, vLLM raising, a probe fault). The hand-off goes through
the runtime's hot fields; the semantics are dispatch.py's: under DP > 1 the last
re-dispatch wins, MRV2 need_eager records FORCED_EAGER, no decision gives a plain span."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ring_drain import drain

from probe.engine import accel
from probe.engine.hooks import dispatch
from probe.engine.hooks._base import Installer, Target
from probe.engine.ring_writer import RingWriter
from probe.engine.runtime import RT
from probe.records import Dispatch, Flag, Mode, Phase, Reason, Span

needs_c = pytest.mark.skipif(not accel.COMPILED, reason=f"not built: {accel.WHY_NOT}")

# -- V1: the real CudagraphDispatcher inside a stand-in runner phase ---------------------


class _V1Runner:
    """``_determine_batch_execution_and_padding`` as vLLM's: dispatch (``plan``: the
    ``(num_tokens, uniform)`` of each call, two under DP > 1), then return."""

    def __init__(self, d: Any, plan: list[tuple[int, bool]], boom: Exception | None) -> None:
        self.d, self.plan, self.boom = d, plan, boom

    def _determine_batch_execution_and_padding(
        self,
        num_tokens: int,
        num_reqs: int,
        num_scheduled_tokens_np: Any,
        max_num_scheduled_tokens: int,
        use_cascade_attn: bool = False,
        force_eager: bool = False,
    ) -> Any:
        out = None
        for n, uniform in self.plan:
            out = self.d.dispatch(n, uniform_decode=uniform)
        if self.boom is not None:
            raise self.boom
        return out


HIT = [(6, True)]
V1: dict[str, dict[str, Any]] = {
    "hit": {"plan": HIT},
    "too big": {"plan": [(40, True)], "args": (40, 20, None, 2)},
    "not uniform": {"plan": [(7, False)], "args": (7, 3, None, 3)},
    "no dispatch": {"plan": []},
    "re-dispatch, hit last": {"plan": [(40, True), (6, True)]},
    "re-dispatch, miss last": {"plan": [(6, True), (40, True)]},
    "re-dispatch, both hits": {"plan": [(6, True), (8, True)]},
    "keywords": {"plan": HIT, "kw": True},
    "numpy max": {"plan": HIT, "args": (6, 3, None, np.int64(2))},
    "None counts": {"plan": HIT, "args": (6, None, None, None)},
    "outside a step": {"plan": HIT, "in_step": 0},
    "drafter": {"plan": HIT, "drafter": 1},
    "vllm raises": {"plan": HIT, "boom": KeyError("vllm's own")},
    "bare dispatcher": {"plan": HIT, "bare": True},
    "fault (str num_reqs)": {"plan": HIT, "args": (6, "3", None, 2)},
}

V1_IN_C = {
    "hit", "no dispatch", "re-dispatch, hit last", "re-dispatch, both hits", "keywords",
    "None counts", "outside a step", "drafter", "vllm raises", "bare dispatcher",
}  # fmt: skip
"""Recorded with no Python write on the compiled path (misses write through Python)."""


def _run(owner_targets: list[tuple[Target, Any]], path: str, tmp: Path, case: dict[str, Any],
         call: Any) -> tuple[list[Any], dict[str, int]]:  # fmt: skip
    RT.reset()
    writer = RingWriter.create(tmp / f"ring-{path}", capacity=256)
    inst = Installer()
    with accel.use(path):
        for target, owner in owner_targets:
            inst.install_on(target, owner)
        RT.attach(writer)
        calls = _count_python_writes()
        fake = None
        if "marks" in case:  # PROBE_ROCTX=1: the marker tee over RT.put
            from fake_roctx import FakeRoctx

            from probe.engine import markers

            fake = FakeRoctx()
            RT.on_first_step = []
            assert markers.start(RT, inst, {"PROBE_ROCTX": "1"}, importer=lambda name: fake)
        RT.enabled = True
        RT.in_step = case.get("in_step", 1)
        RT.drafter = case.get("drafter", 0)
        RT.step = 3
        for _ in range(2):
            try:
                call()
            except KeyError as exc:
                assert exc is case["boom"]
            # the phase leaves nothing behind for the next dispatcher
            assert (RT.phase_open, RT.decided, RT.phase_num_reqs, RT.phase_max_q) == (0,) * 4
        RT.in_step = RT.drafter = 0
        RT.enabled = False
        RT.detach()
        if fake is not None:
            from probe.engine import markers

            markers._CURRENT[0] = None
            case["marks"].extend(c[1] for c in fake.calls if c[0] == "mark")
    wrappers = {type(h.wrapper).__name__ for h in inst.hooks.values()}
    if inst.hooks:
        inst.uninstall()
    faults = dict(RT.faults)
    recs = [r for r in drain(writer)[0] if isinstance(r, (Dispatch, Span))]
    writer.close()
    RT.reset()
    if path == "compiled" and not faults:
        assert wrappers == {type(t.factory(lambda: None, None)).__name__ for t, _ in owner_targets}
    _PYTHON_WRITES[0] = calls[0]
    return recs, faults


_PYTHON_WRITES = [0]


def _count_python_writes() -> list[int]:
    """Count the records written through ``RT.put`` (the Python records); the compiled
    FULL hit and phase close write none."""
    calls = [0]
    for name in ("dispatch", "span"):
        put = getattr(RT.put, name)

        def counted(*fields: Any, put: Any = put) -> Any:
            calls[0] += 1
            return put(*fields)

        setattr(RT.put, name, counted)
    return calls


def _record_v1(name: str, path: str, tmp: Path, d: Any) -> tuple[list[Any], dict[str, int]]:
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    case = V1[name]

    class Runner(_V1Runner):
        _determine_batch_execution_and_padding = _V1Runner._determine_batch_execution_and_padding

    runner = Runner(d, case["plan"], case.get("boom"))
    n, reqs, nst, maxq = case.get("args", (6, 3, None, 2))

    def call() -> Any:
        if case.get("bare"):
            return d.dispatch(n, uniform_decode=True)
        if case.get("kw"):
            return runner._determine_batch_execution_and_padding(
                num_tokens=n, num_reqs=reqs, num_scheduled_tokens_np=nst,
                max_num_scheduled_tokens=maxq, use_cascade_attn=False,
            )  # fmt: skip
        return runner._determine_batch_execution_and_padding(n, reqs, nst, maxq)

    targets = [
        (Target("dispatch.v1.dispatcher", "", "", "dispatch", dispatch.v1_dispatch),
         CudagraphDispatcher),
        (Target("dispatch.v1.runner", "", "", "_determine_batch_execution_and_padding",
                dispatch.v1_runner_dispatch), Runner),
    ]  # fmt: skip
    return _run(targets, path, tmp, case, call)


def _strip(recs: list[Any]) -> list[tuple[Any, ...]]:
    assert all(r.t0 <= r.t1 for r in recs)
    return [tuple(v for k, v in vars_of(r).items() if k not in ("t0", "t1")) for r in recs]


def vars_of(r: Any) -> dict[str, Any]:
    return {"kind": type(r).__name__, **{f.name: getattr(r, f.name) for f in r.SPEC.fields}}


@needs_c
@pytest.mark.parametrize("name", sorted(V1))
def test_compiled_v1_phase_writes_what_the_python_hooks_write(
    name: str, tmp_path: Path, v1_dispatcher: Any
) -> None:
    py, py_faults = _record_v1(name, "python", tmp_path, v1_dispatcher)
    c, c_faults = _record_v1(name, "compiled", tmp_path, v1_dispatcher)
    assert _strip(c) == _strip(py)
    assert c_faults == py_faults
    assert len(py) == 2
    if name in V1_IN_C:
        assert _PYTHON_WRITES[0] == 0


def test_v1_phase_values(hot_path: str, tmp_path: Path, v1_dispatcher: Any) -> None:
    (r, _), faults = _record_v1("hit", hot_path, tmp_path, v1_dispatcher)
    assert (r.mode, r.reason, r.num_tokens, r.padded_tokens) == (Mode.FULL, Reason.HIT, 6, 8)
    assert (r.num_reqs, r.max_query_len, r.uniform_decode_query_len) == (3, 2, 2)
    assert r.flags == Flag.SPAN | Flag.UNIFORM and r.step == 3
    (r, _), _ = _record_v1("re-dispatch, hit last", hot_path, tmp_path, v1_dispatcher)
    assert (r.mode, r.num_tokens, r.flags & Flag.SPAN) == (Mode.FULL, 6, Flag.SPAN)
    (r, _), _ = _record_v1("re-dispatch, miss last", hot_path, tmp_path, v1_dispatcher)
    assert (r.reason, r.num_tokens, r.num_reqs) == (Reason.BATCH_TOO_BIG, 40, 3)
    (r, _), _ = _record_v1("no dispatch", hot_path, tmp_path, v1_dispatcher)
    assert isinstance(r, Span) and (r.phase, r.flags) == (Phase.DISPATCH, 0)
    (r, _), _ = _record_v1("None counts", hot_path, tmp_path, v1_dispatcher)
    assert (r.num_reqs, r.max_query_len) == (0, 0)
    (r, _), _ = _record_v1("outside a step", hot_path, tmp_path, v1_dispatcher)
    assert r.flags == Flag.SPAN | Flag.UNIFORM | Flag.OUTSIDE_STEP
    (r, _), _ = _record_v1("vllm raises", hot_path, tmp_path, v1_dispatcher)
    assert r.flags & Flag.SPAN and r.mode == Mode.FULL
    (r, _), _ = _record_v1("bare dispatcher", hot_path, tmp_path, v1_dispatcher)
    assert not r.flags & Flag.SPAN and r.num_reqs == 0
    assert faults == {}
    recs, faults = _record_v1("fault (str num_reqs)", hot_path, tmp_path, v1_dispatcher)
    assert faults == {"dispatch.v1.runner": 1}
    assert [r.flags & Flag.SPAN for r in recs] == [0, 0]  # the dispatcher's own records


# -- MRV2: dispatch_cg_and_sync_dp around a graph manager ---------------------------------


def _modes() -> tuple[Any, Any]:
    from vllm.config import CUDAGraphMode

    return CUDAGraphMode.FULL, CUDAGraphMode.NONE


class ModelCudaGraphManager:
    """The MRV2 target's manager by the name the hook reads: FULL for a uniform decode
    batch within the capture sizes, eager otherwise (its reason from probe.reasons)."""

    decode_query_len = 2
    _graphs_captured = True
    compilation_config = types.SimpleNamespace(
        max_cudagraph_capture_size=32, cudagraph_capture_sizes=[2, 4, 8, 16, 32]
    )

    def __init__(self) -> None:
        self.cudagraph_mode = _modes()[1]

    def dispatch(
        self, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
        max_query_len: int | None = None, num_active_loras: int = 0,
    ) -> Any:  # fmt: skip
        full, none = _modes()
        if uniform_token_count == 2 and num_tokens <= 32:
            size = next(
                s for s in self.compilation_config.cudagraph_capture_sizes if s >= num_tokens
            )
            return types.SimpleNamespace(cg_mode=full, num_tokens=size, num_reqs=size // 2)
        return types.SimpleNamespace(cg_mode=none, num_tokens=num_tokens, num_reqs=None)


class SpeculatorCudaGraphManager(ModelCudaGraphManager):
    pass


def _sync_dp(
    cudagraph_manager: Any, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
    dp_size: int, dp_rank: int, max_query_len: int | None = None, need_eager: bool = False,
    boom: Exception | None = None,
) -> Any:  # fmt: skip
    """``dispatch_cg_and_sync_dp`` as vLLM's (dp_size 2: the re-dispatch with the synced
    size, here the local one + 2)."""
    if need_eager:
        desc = types.SimpleNamespace(cg_mode=_modes()[1], num_tokens=num_tokens, num_reqs=num_reqs)
    else:
        desc = cudagraph_manager.dispatch(num_reqs, num_tokens, uniform_token_count, max_query_len)
        if dp_size > 1:
            desc = cudagraph_manager.dispatch(
                num_reqs, num_tokens + 2, uniform_token_count, max_query_len
            )
    if boom is not None:
        raise boom
    return desc, None


MRV2: dict[str, dict[str, Any]] = {
    "hit": {"args": (3, 6, 2, 1, 0), "kw": {"max_query_len": 2}},
    "hit, 0.26 (no max_query_len)": {"args": (3, 6, 2, 1, 0)},
    "miss": {"args": (3, 7, None, 1, 0), "kw": {"max_query_len": 3}},
    "miss, caller's max_query_len": {"args": (3, 7, None, 1, 0)},
    "too big": {"args": (20, 40, 2, 1, 0), "kw": {"max_query_len": 2}},
    "re-dispatch (DP 2)": {"args": (3, 6, 2, 2, 0), "kw": {"max_query_len": 2}},
    "need_eager": {"args": (3, 6, 2, 1, 0), "kw": {"need_eager": True}},
    "need_eager, numpy": {"args": (np.int64(3), 6, 2, 1, 0), "kw": {"need_eager": True}},
    "fault (need_eager, None num_tokens)": {
        "args": (3,),
        "kw": {"need_eager": True, "num_tokens": None, "uniform_token_count": 2, "dp_size": 1,
               "dp_rank": 0},
    },
    "need_eager outside a step": {"args": (3, 6, 2, 1, 0), "kw": {"need_eager": True},
                                  "in_step": 0},
    "drafter manager": {"args": (3, 6, 2, 1, 0), "kw": {"max_query_len": 2}, "drafter_cls": True},
    "drafter scope": {"args": (3, 6, 2, 1, 0), "kw": {"max_query_len": 2}, "drafter": 1},
    "vllm raises": {"args": (3, 6, 2, 1, 0), "boom": KeyError("vllm's own")},
    "bare manager": {"args": (3, 6, 2, 1, 0), "bare": True},
}  # fmt: skip

MRV2_IN_C = {
    "hit", "re-dispatch (DP 2)", "need_eager", "need_eager outside a step", "drafter manager",
    "drafter scope", "vllm raises", "bare manager",
}  # fmt: skip


def _record_mrv2(
    name: str, path: str, tmp: Path, hooked: str = "manager+phase"
) -> tuple[list[Any], dict[str, int]]:
    """``hooked``: ``"manager+phase"`` (DP > 1, the manager's ``dispatch`` hooked inside
    the runner's phase), ``"phase"`` (DP 1: the runner's phase alone reads the decision
    from what the call returns), ``"draft phase"`` (a speculator module's phase alone),
    ``"manager"`` (the manager alone, as a speculator's was before its phase was hooked)."""
    case = MRV2[name]
    owner = types.ModuleType("fake_model_runner")
    owner.dispatch_cg_and_sync_dp = _sync_dp  # type: ignore[attr-defined]
    cls = SpeculatorCudaGraphManager if case.get("drafter_cls") else ModelCudaGraphManager

    class Manager(cls):  # type: ignore[misc, valid-type]
        dispatch = cls.dispatch

    Manager.__name__ = cls.__name__
    m = Manager()
    args, kw = case["args"], dict(case.get("kw", {}))
    if "boom" in case:
        kw["boom"] = case["boom"]

    def call() -> Any:
        if case.get("bare"):
            return m.dispatch(*args[:3], max_query_len=2)
        return owner.dispatch_cg_and_sync_dp(m, *args, **kw)  # type: ignore[attr-defined]

    manager = (Target("dispatch.mrv2.manager", "", "", "dispatch", dispatch.mrv2_dispatch),
               Manager)  # fmt: skip
    phase = (Target("dispatch.mrv2.sync_dp", "", "", "dispatch_cg_and_sync_dp",
                    dispatch.mrv2_sync_dp), owner)  # fmt: skip
    draft = (Target("dispatch.mrv2.draft_sync_dp", "", "", "dispatch_cg_and_sync_dp",
                    dispatch.mrv2_draft_sync_dp), owner)  # fmt: skip
    targets = {
        "manager+phase": [manager, phase], "phase": [phase], "draft phase": [draft],
        "manager": [manager],
    }[hooked]  # fmt: skip
    max_query_len = 5  # what _caller_max_query_len finds when the dispatch has neither count
    assert max_query_len
    return _run(targets, path, tmp, case, call)


@needs_c
@pytest.mark.parametrize("hooked", ["manager+phase", "phase", "draft phase"])
@pytest.mark.parametrize("name", sorted(MRV2))
def test_compiled_mrv2_phase_writes_what_the_python_hooks_write(
    name: str, hooked: str, tmp_path: Path
) -> None:
    py, py_faults = _record_mrv2(name, "python", tmp_path, hooked)
    c, c_faults = _record_mrv2(name, "compiled", tmp_path, hooked)
    assert _strip(c) == _strip(py)
    assert c_faults == py_faults
    hook_id = "dispatch.mrv2.draft_sync_dp" if hooked == "draft phase" else "dispatch.mrv2.sync_dp"
    assert c_faults == ({hook_id: 1} if name.startswith("fault") else {})
    written = 0 if name.startswith("fault") else 2
    if hooked == "draft phase" and (
        name in ("bare manager", "vllm raises") or "outside a step" in name
    ):
        written = 0  # no hook on the manager; nothing returned; no decision outside a step
    elif hooked == "phase" and name == "bare manager":
        written = 0
    assert len(py) == written
    if name in MRV2_IN_C:
        assert _PYTHON_WRITES[0] == 0


MRV2_DP1 = sorted(set(MRV2) - {"re-dispatch (DP 2)", "bare manager", "vllm raises"})
"""The cases a DP 1 engine has: no re-dispatch, no manager call outside the phase (and
vLLM returning: when it raises, nothing was returned to read, and the phase is a plain
span, ``test_mrv2_phase_values``)."""


@pytest.mark.parametrize("name", MRV2_DP1)
def test_mrv2_phase_alone_writes_what_the_hooked_manager_hands_it(
    name: str, hot_path: str, tmp_path: Path
) -> None:
    """At DP 1 the manager is not hooked: the runner's phase reads the decision from the
    descriptor ``dispatch_cg_and_sync_dp`` returns, with the call's own inputs, and writes
    the same records (mode, reason, counts, flags, max_query_len) as when the hooked
    manager handed its decision in; one hooked call instead of two."""
    both, faults = _record_mrv2(name, hot_path, tmp_path, "manager+phase")
    alone, alone_faults = _record_mrv2(name, hot_path, tmp_path, "phase")
    assert _strip(alone) == _strip(both)
    assert alone_faults == faults


DRAFT_SAME = sorted(
    n for n in MRV2_DP1 if "need_eager" not in n and not n.startswith("fault")
)  # fmt: skip


@pytest.mark.parametrize("name", DRAFT_SAME)
def test_mrv2_draft_phase_writes_what_the_speculators_hooked_manager_wrote(
    name: str, hot_path: str, tmp_path: Path
) -> None:
    """A speculator's ``dispatch_cg_and_sync_dp`` hooked (its manager not) writes the
    drafter's decision as the hooked manager wrote it with no phase around it: one
    DISPATCH per call, flagged DRAFTER, no SPAN, its reason on a miss."""
    before, _ = _record_mrv2(name, hot_path, tmp_path, "manager")
    after, faults = _record_mrv2(name, hot_path, tmp_path, "draft phase")
    assert faults == {}
    assert len(after) == 2 and all(isinstance(r, Dispatch) for r in after)
    assert all(r.flags & Flag.DRAFTER and not r.flags & Flag.SPAN for r in after)
    expect = [
        tuple(v | Flag.DRAFTER if k == "flags" else v for k, v in vars_of(r).items()
              if k not in ("t0", "t1"))
        for r in before
    ]  # fmt: skip
    assert _strip(after) == expect


def test_mrv2_draft_phase_need_eager(hot_path: str, tmp_path: Path) -> None:
    """The speculator's eager call (its profile run) skips the manager: inside a step it is
    the drafter's FORCED_EAGER decision; outside one nothing is written."""
    (r, _), _ = _record_mrv2("need_eager", hot_path, tmp_path, "draft phase")
    assert (r.mode, r.reason, r.flags) == (
        Mode.NONE, Reason.FORCED_EAGER, Flag.MRV2 | Flag.DRAFTER,
    )  # fmt: skip
    recs, _ = _record_mrv2("need_eager outside a step", hot_path, tmp_path, "draft phase")
    assert recs == []


def test_mrv2_phase_values(hot_path: str, tmp_path: Path) -> None:
    (r, _), _ = _record_mrv2("hit", hot_path, tmp_path)
    assert (r.mode, r.reason, r.num_tokens, r.padded_tokens, r.num_reqs) == (
        Mode.FULL, Reason.HIT, 6, 8, 3,
    )  # fmt: skip
    assert r.flags == Flag.SPAN | Flag.MRV2 | Flag.UNIFORM and r.max_query_len == 2
    (r, _), _ = _record_mrv2("re-dispatch (DP 2)", hot_path, tmp_path)
    assert (r.num_tokens, r.padded_tokens) == (8, 8)  # the last one
    (r, _), _ = _record_mrv2("need_eager", hot_path, tmp_path)
    assert (r.mode, r.reason, r.num_tokens, r.padded_reqs) == (
        Mode.NONE, Reason.FORCED_EAGER, 6, 3,
    )  # fmt: skip
    assert r.flags == Flag.SPAN | Flag.MRV2
    (r, _), _ = _record_mrv2("need_eager outside a step", hot_path, tmp_path)
    assert isinstance(r, Span) and r.flags == Flag.MRV2 | Flag.OUTSIDE_STEP
    (r, _), _ = _record_mrv2("miss, caller's max_query_len", hot_path, tmp_path)
    assert (r.mode, r.max_query_len, r.flags & Flag.SPAN) == (Mode.NONE, 5, Flag.SPAN)
    (r, _), _ = _record_mrv2("drafter manager", hot_path, tmp_path)
    assert r.flags & Flag.DRAFTER
    (r, _), _ = _record_mrv2("bare manager", hot_path, tmp_path)
    assert not r.flags & Flag.SPAN
    # the phase alone (DP 1): vLLM raised, nothing returned to read: a plain span
    (r, _), _ = _record_mrv2("vllm raises", hot_path, tmp_path, "phase")
    assert isinstance(r, Span) and (r.phase, r.flags) == (Phase.DISPATCH, Flag.MRV2)
    # ... and the DP 2 case without its manager hooked: the returned (synced) descriptor
    # with the call's own inputs
    (r, _), _ = _record_mrv2("re-dispatch (DP 2)", hot_path, tmp_path, "phase")
    assert (r.mode, r.num_tokens, r.padded_tokens, r.flags & Flag.SPAN) == (
        Mode.FULL, 6, 8, Flag.SPAN,
    )  # fmt: skip


@needs_c
def test_live_marks_see_the_dispatch_on_a_compiled_ring(tmp_path: Path) -> None:
    """With PROBE_ROCTX=1 the compiled Dispatch and Phase write through the marker tee
    (RT.put), not straight into the ring: the dispatch marks are there, as on the Python
    path, and the records are the same."""
    got = {}
    for path in ("python", "compiled"):
        MRV2["hit (marks)"] = {**MRV2["hit"], "marks": []}
        try:
            recs, faults = _record_mrv2("hit (marks)", path, tmp_path)
            got[path] = (_strip(recs), faults, list(MRV2["hit (marks)"]["marks"]))
        finally:
            del MRV2["hit (marks)"]
    assert got["compiled"] == got["python"]
    marks = got["compiled"][2]
    assert len(marks) == 2 and all(m.startswith("dispatch FULL hit step 3") for m in marks)
