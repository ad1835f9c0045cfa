"""The forward-launch and graph-replay hooks write the same records on both hot paths, for
every shape of call: MRV2 FULL (the target's forward counting its replay, the drafter's
replay, a replay outside a forward), V1 FULL around the model, PIECEWISE (MRV2's
``run_pw_graph`` and the pieces), captures, pass-throughs, the drafter, outside a step,
nested forwards, vLLM's exceptions, and inputs the hooks cannot read (which fault the
same on both). Also with the compiled hooks writing through a Python ring (every record
handed to the Python ``record``) and with a compiled forward around Python replay hooks
(one scope, in the Core's hot fields)."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ring_drain import drain

from probe.engine import accel
from probe.engine.hooks import replay, step
from probe.engine.hooks._base import Installer, Target
from probe.engine.ring_writer import RingWriter
from probe.engine.runtime import RT
from probe.records import Flag, Forward, Mode, ReplayKind

fcm = pytest.importorskip("vllm.forward_context")

FULL = types.SimpleNamespace(value=2, name="FULL")
PIECEWISE = types.SimpleNamespace(value=1, name="PIECEWISE")
NONE = types.SimpleNamespace(value=0, name="NONE")


class VllmError(Exception):
    pass


def _world() -> types.SimpleNamespace:
    """Stand-ins named like vLLM's classes (the hooks read ``type(self).__name__``)."""

    class CudaGraphManager:
        use_breakable_cg: Any = False

        def run_fullgraph(self, desc: Any) -> Any:
            if getattr(desc, "boom", False):
                raise VllmError("replay failed")
            return ("replayed", desc)

        def run_pw_graph(self, model: Any, model_inputs: Any) -> Any:
            return model(model_inputs)

    class ModelCudaGraphManager(CudaGraphManager):
        def run_fullgraph(self, desc: Any) -> Any:
            return super().run_fullgraph(desc)

    class SpeculatorCudaGraphManager(CudaGraphManager):
        pass

    class CUDAGraphWrapper:
        def __init__(self, mode: Any, entries: Any = None, runnable: Any = None) -> None:
            self.runtime_mode = mode
            self.concrete_cudagraph_entries = {} if entries is None else entries
            self.runnable = runnable

        def __call__(self, x: Any) -> Any:
            return ("ran", x) if self.runnable is None else self.runnable(x)

    class GPUModelRunner:
        def __init__(self, model: Callable[..., Any]) -> None:
            self.model = model

        def _model_forward(self, x: Any) -> Any:
            return self.model(x)

    return types.SimpleNamespace(
        CudaGraphManager=CudaGraphManager,
        ModelCudaGraphManager=ModelCudaGraphManager,
        SpeculatorCudaGraphManager=SpeculatorCudaGraphManager,
        CUDAGraphWrapper=CUDAGraphWrapper,
        GPUModelRunner=GPUModelRunner,
    )


def _graph() -> Any:
    return types.SimpleNamespace(cudagraph=object())


def _ctx(mode: Any, desc: Any) -> Any:
    return types.SimpleNamespace(cudagraph_runtime_mode=mode, batch_descriptor=desc)


D64 = types.SimpleNamespace(num_tokens=64)


def _pieces(w: Any, mode: Any, n: int, entries: Any) -> Callable[[Any], Any]:
    pieces = [w.CUDAGraphWrapper(mode, entries) for _ in range(n)]

    def model(x: Any) -> Any:
        return [p(x) for p in pieces]

    return model


# -- the shapes: each makes its calls and returns what vLLM got back ----------------------


def mrv2_full(w: Any) -> Any:
    return w.ModelCudaGraphManager().run_fullgraph(D64)


def mrv2_full_keyword(w: Any) -> Any:
    return w.ModelCudaGraphManager().run_fullgraph(desc=D64)


def mrv2_drafter(w: Any) -> Any:
    out = [w.ModelCudaGraphManager().run_fullgraph(D64)]
    RT.drafter += 1
    try:
        out.append(
            w.SpeculatorCudaGraphManager().run_fullgraph(types.SimpleNamespace(num_tokens=2))
        )
        out.append(w.ModelCudaGraphManager().run_fullgraph(D64))  # the drafter's own forward
    finally:
        RT.drafter -= 1
    return out


def mrv2_drafter_by_name(w: Any) -> Any:  # a speculator's manager, no drafter scope open
    return w.SpeculatorCudaGraphManager().run_fullgraph(D64)


def mrv2_outside_step(w: Any) -> Any:
    RT.in_step = 0
    return w.ModelCudaGraphManager().run_fullgraph(D64)


def mrv2_replay_alone(w: Any) -> Any:  # a replay with no forward hook around it
    return w.CudaGraphManager().run_fullgraph(D64)


def mrv2_nested(w: Any) -> Any:
    inner = w.ModelCudaGraphManager()
    runner = w.GPUModelRunner(lambda x: [inner.run_fullgraph(x), inner.run_fullgraph(x)])
    return runner._model_forward(D64)


def mrv2_exception(w: Any) -> Any:
    out = []
    for cls in (w.ModelCudaGraphManager, w.SpeculatorCudaGraphManager):
        with pytest.raises(VllmError, match="replay failed"):
            cls().run_fullgraph(types.SimpleNamespace(num_tokens=8, boom=True))
        out.append(RT.fwd_open)
    return out


def mrv2_piecewise(w: Any) -> Any:
    fcm._forward_context = _ctx(PIECEWISE, 32)
    model = _pieces(w, PIECEWISE, 3, {32: _graph()})
    runner = w.GPUModelRunner(lambda x: w.ModelCudaGraphManager().run_pw_graph(model, x))
    return runner._model_forward(7)


def mrv2_piecewise_alone(w: Any) -> Any:
    fcm._forward_context = _ctx(PIECEWISE, 32)
    model = _pieces(w, PIECEWISE, 2, {32: _graph()})
    out = [w.ModelCudaGraphManager().run_pw_graph(model, 1)]
    m = w.SpeculatorCudaGraphManager()
    m.use_breakable_cg = True
    out.append(m.run_pw_graph(model, 2))
    return out


def v1_full(w: Any) -> Any:
    desc = fcm.BatchDescriptor(num_tokens=16)
    fcm._forward_context = _ctx(FULL, desc)
    model = w.CUDAGraphWrapper(FULL, {desc: _graph()})
    return w.GPUModelRunner(model)._model_forward(5)


def v1_full_alone(w: Any) -> Any:
    desc = fcm.BatchDescriptor(num_tokens=16)
    fcm._forward_context = _ctx(FULL, desc)
    return w.CUDAGraphWrapper(FULL, {desc: _graph()})(5)


def v1_capture(w: Any) -> Any:
    fcm._forward_context = _ctx(FULL, 8)  # a descriptor without num_tokens: 0
    entries = {8: types.SimpleNamespace(cudagraph=None)}
    out = [w.GPUModelRunner(w.CUDAGraphWrapper(FULL, entries))._model_forward(1)]
    RT.in_step = 0  # a capture window
    out.append(w.CUDAGraphWrapper(FULL, {})(2))
    return out


def v1_pass_through(w: Any) -> Any:
    wrapper = w.CUDAGraphWrapper(FULL, {4: _graph()})
    out = []
    for ctx in (None, _ctx(PIECEWISE, 4), _ctx(NONE, 4)):
        fcm._forward_context = ctx
        out.append(wrapper(3))
    fcm._forward_context = _ctx(PIECEWISE, 4)
    out.append(w.CUDAGraphWrapper(None, {4: _graph()})(4))  # no mode of its own: any
    return out


def v1_drafter(w: Any) -> Any:
    fcm._forward_context = _ctx(PIECEWISE, 4)
    model = _pieces(w, PIECEWISE, 2, {4: _graph()})
    RT.drafter = 1
    return w.GPUModelRunner(model)._model_forward(9)


def v1_exception(w: Any) -> Any:
    def model(x: Any) -> Any:
        w.CUDAGraphWrapper(FULL, {4: _graph()})(x)
        raise VllmError("forward failed")

    fcm._forward_context = _ctx(FULL, 4)
    with pytest.raises(VllmError, match="forward failed"):
        w.GPUModelRunner(model)._model_forward(1)
    return RT.fwd_open


def v1_pass_through_exception(w: Any) -> Any:  # vLLM's error, raised once, no fault
    calls: list[Any] = []

    def model(x: Any) -> Any:
        calls.append(x)
        raise VllmError("forward failed")

    fcm._forward_context = _ctx(PIECEWISE, 4)
    with pytest.raises(VllmError, match="forward failed"):
        w.CUDAGraphWrapper(FULL, {}, model)(1)
    return len(calls)


# V1 with the model in a FULL wrapper of vLLM's own FULL mode: _model_forward is left
# unhooked (step.late_targets) and the wrapper's call is the forward launch


def _cgm() -> Any:
    from vllm.config import CUDAGraphMode

    return CUDAGraphMode


def v1_launch_full(w: Any) -> Any:
    cgm, desc = _cgm(), fcm.BatchDescriptor(num_tokens=16)
    fcm._forward_context = _ctx(cgm.FULL, desc)
    return w.CUDAGraphWrapper(cgm.FULL, {desc: _graph()})(5)


def v1_launch_piecewise(w: Any) -> Any:  # the FULL wrapper passes through to the pieces
    cgm, desc = _cgm(), fcm.BatchDescriptor(num_tokens=24)
    fcm._forward_context = _ctx(cgm.PIECEWISE, desc)
    pieces = _pieces(w, cgm.PIECEWISE, 3, {desc: _graph()})
    return w.CUDAGraphWrapper(cgm.FULL, {}, pieces)(6)


def v1_launch_eager(w: Any) -> Any:
    cgm = _cgm()
    fcm._forward_context = _ctx(cgm.NONE, fcm.BatchDescriptor(num_tokens=300))
    return w.CUDAGraphWrapper(cgm.FULL, {}, _pieces(w, cgm.PIECEWISE, 2, {}))(7)


def v1_launch_capture(w: Any) -> Any:
    cgm, desc = _cgm(), fcm.BatchDescriptor(num_tokens=8)
    fcm._forward_context = _ctx(cgm.FULL, desc)
    return w.CUDAGraphWrapper(cgm.FULL, {desc: types.SimpleNamespace(cudagraph=None)})(1)


def v1_launch_not_in_the_drafter(w: Any) -> Any:
    cgm, desc = _cgm(), fcm.BatchDescriptor(num_tokens=4)
    fcm._forward_context = _ctx(cgm.FULL, desc)
    out = [w.CUDAGraphWrapper(cgm.FULL, {desc: _graph()})(1)]  # the target's launch
    RT.drafter = 1
    out.append(w.CUDAGraphWrapper(cgm.FULL, {desc: _graph()})(2))  # the drafter's replay
    RT.drafter, RT.in_step = 0, 0
    out.append(w.CUDAGraphWrapper(cgm.FULL, {desc: _graph()})(3))  # outside a step
    return out


def v1_launch_inside_model_forward(w: Any) -> Any:  # _model_forward hooked: it opens the scope
    cgm, desc = _cgm(), fcm.BatchDescriptor(num_tokens=16)
    fcm._forward_context = _ctx(cgm.FULL, desc)
    return w.GPUModelRunner(w.CUDAGraphWrapper(cgm.FULL, {desc: _graph()}))._model_forward(5)


def v1_launch_exception(w: Any) -> Any:
    cgm = _cgm()

    def model(x: Any) -> Any:
        raise VllmError("forward failed")

    fcm._forward_context = _ctx(cgm.PIECEWISE, fcm.BatchDescriptor(num_tokens=4))
    with pytest.raises(VllmError, match="forward failed"):
        w.CUDAGraphWrapper(cgm.FULL, {}, model)(1)
    return RT.fwd_open


def fault_no_num_tokens(w: Any) -> Any:
    return [
        w.ModelCudaGraphManager().run_fullgraph(types.SimpleNamespace()),
        w.ModelCudaGraphManager().run_fullgraph(D64),  # the replay hook is gone now
    ]


def fault_num_tokens_none(w: Any) -> Any:
    return w.ModelCudaGraphManager().run_fullgraph(types.SimpleNamespace(num_tokens=None))


def fault_unhashable_descriptor(w: Any) -> Any:
    fcm._forward_context = _ctx(FULL, [1])
    return [w.CUDAGraphWrapper(FULL, {4: _graph()})(1), w.CUDAGraphWrapper(FULL, {})(2)]


def fault_mode_out_of_range(w: Any) -> Any:
    odd = types.SimpleNamespace(value=300)
    fcm._forward_context = _ctx(odd, 4)
    return w.CUDAGraphWrapper(odd, {4: _graph()})(1)


def fault_breakable_attr(w: Any) -> Any:
    class Bad(w.SpeculatorCudaGraphManager):  # type: ignore[name-defined,misc]
        @property
        def use_breakable_cg(self) -> bool:
            raise RuntimeError("not readable")

    return Bad().run_pw_graph(lambda x: x, 1)


SHAPES: dict[str, Callable[[Any], Any]] = {
    f.__name__: f
    for f in (
        mrv2_full,
        mrv2_full_keyword,
        mrv2_drafter,
        mrv2_drafter_by_name,
        mrv2_outside_step,
        mrv2_replay_alone,
        mrv2_nested,
        mrv2_exception,
        mrv2_piecewise,
        mrv2_piecewise_alone,
        v1_full,
        v1_full_alone,
        v1_capture,
        v1_pass_through,
        v1_drafter,
        v1_exception,
        v1_pass_through_exception,
        v1_launch_full,
        v1_launch_piecewise,
        v1_launch_eager,
        v1_launch_capture,
        v1_launch_not_in_the_drafter,
        v1_launch_inside_model_forward,
        v1_launch_exception,
        fault_no_num_tokens,
        fault_num_tokens_none,
        fault_unhashable_descriptor,
        fault_mode_out_of_range,
        fault_breakable_attr,
    )
}


def _install(w: Any, inst: Installer, forward_path: str, replay_path: str) -> None:
    def t(hid: str, name: str, fac: Any) -> Target:
        return Target(hid, __name__, "", name, fac, gate="on")

    with accel.use(replay_path):
        inst.install_on(t("replay.wrapper", "__call__", replay.wrapper_call(False)),
                        w.CUDAGraphWrapper)  # fmt: skip
        inst.install_on(t("replay.mrv2.run_fullgraph", "run_fullgraph", replay.run_fullgraph),
                        w.CudaGraphManager)  # fmt: skip
        inst.install_on(t("replay.mrv2.run_pw_graph", "run_pw_graph", replay.run_pw_graph),
                        w.CudaGraphManager)  # fmt: skip
    with accel.use(forward_path):
        inst.install_on(t("phase.v1.forward_launch", "_model_forward", step.forward),
                        w.GPUModelRunner)  # fmt: skip
    kind = type(vars(w.GPUModelRunner)["_model_forward"]).__name__
    assert kind == ("Forward" if forward_path == "compiled" else "function")
    # MRV2's target forward is the base run_fullgraph hook's: the subclass stays vLLM's
    assert "run_fullgraph" in vars(w.ModelCudaGraphManager)
    assert type(vars(w.ModelCudaGraphManager)["run_fullgraph"]).__name__ == "function"
    for cls, name in ((w.CudaGraphManager, "run_fullgraph"), (w.CudaGraphManager, "run_pw_graph"),
                      (w.CUDAGraphWrapper, "__call__")):  # fmt: skip
        want = "Replay" if replay_path == "compiled" else "function"
        assert type(vars(cls)[name]).__name__ == want


def _norm(rec: Any) -> tuple[Any, ...]:
    """A record without its timestamps (which differ between runs): each says whether it
    is set; a FORWARD's replay window must lie inside its launch."""
    d = dataclasses.asdict(rec)
    if isinstance(rec, Forward) and rec.replay_t0:
        assert rec.t0 <= rec.replay_t0 <= rec.replay_t1 <= rec.t1
    for k in ("t0", "t1", "replay_t0", "replay_t1"):
        if k in d:
            d[k] = bool(d[k])
    return (type(rec).__name__, tuple(sorted(d.items())))


def _record(shape: str, tmp: Path, forward_path: str, replay_path: str, ring_path: str) -> Any:
    w = _world()
    RT.reset()
    inst = Installer()
    _install(w, inst, forward_path, replay_path)
    with accel.use(ring_path):
        writer = RingWriter.create(tmp / f"ring-{forward_path}-{replay_path}-{ring_path}", 256)
    try:
        RT.attach(writer)
        RT.on_first_step = []
        RT.enabled, RT.in_step, RT.step = True, 1, 7
        try:
            out = SHAPES[shape](w)
        finally:
            fcm._forward_context = None
        RT.in_step, RT.drafter = 0, 0
        RT.enabled = False
        RT.detach()
        faults = dict(RT.faults)
        left = sorted(inst.installed_ids())
        if inst.hooks:
            inst.uninstall()
        recs = [_norm(r) for r in drain(writer)[0]]
    finally:
        writer.close()
        RT.reset()
    return recs, faults, left, repr(out)


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    RT.reset()
    yield
    fcm._forward_context = None
    RT.reset()


COMBOS = [
    ("compiled", "compiled", "compiled"),  # all in C
    ("compiled", "compiled", "python"),  # compiled hooks, a Python ring: every record handed off
    ("compiled", "python", "compiled"),  # a compiled forward around Python replay hooks
    ("python", "compiled", "compiled"),  # the reverse
]


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled path not built: {accel.WHY_NOT}")
@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "fwd-{}/replay-{}/ring-{}".format(*c))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_compiled_hooks_write_what_the_python_hooks_write(
    shape: str, combo: tuple[str, str, str], tmp_path: Path
) -> None:
    # the reference: the Python hooks on the same ring (a Python ring packs at the step's
    # end, so a field out of range faults there, as ring.flush, on both)
    py = _record(shape, tmp_path, "python", "python", combo[2])
    assert _record(shape, tmp_path, *combo) == py


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_python_hooks_record_each_shape(shape: str, tmp_path: Path) -> None:
    """What the Python hooks (the reference above) write, shape by shape."""
    recs, faults, left, out = _record(shape, tmp_path, "python", "python", "python")
    kinds = [r[0] for r in recs]
    fields = [dict(r[1]) for r in recs]
    mrv2, drafter, outside = int(Flag.MRV2), int(Flag.DRAFTER), int(Flag.OUTSIDE_STEP)
    if shape in ("mrv2_full", "mrv2_full_keyword"):
        assert kinds == ["Forward"] and "replayed" in out
        f = fields[0]
        assert (f["full_replays"], f["pieces"], f["captures"], f["num_tokens"]) == (1, 0, 0, 64)
        assert (f["mode"], f["step"], f["flags"], f["replay_t0"]) == (Mode.FULL, 7, 0, True)
    elif shape == "mrv2_drafter":
        # in the drafter's scope the target manager's replay is the drafter's: no launch
        assert kinds == ["Forward", "Replay", "Replay"]
        assert [f["flags"] for f in fields] == [0, mrv2 | drafter, mrv2 | drafter]
        assert fields[1]["num_tokens"] == 2 and fields[2]["num_tokens"] == 64
    elif shape == "mrv2_drafter_by_name":
        assert kinds == ["Replay"] and fields[0]["flags"] == mrv2 | drafter
    elif shape == "mrv2_outside_step":  # a replay outside a step is no launch
        assert kinds == ["Replay"] and fields[0]["flags"] == mrv2 | outside
    elif shape == "mrv2_replay_alone":
        assert kinds == ["Replay"] and fields[0]["flags"] == mrv2 | drafter  # not the target's
    elif shape == "mrv2_nested":
        assert kinds == ["Forward"] and fields[0]["full_replays"] == 2
    elif shape == "mrv2_exception":
        assert kinds == ["Forward"] and fields[0]["full_replays"] == 0 and out == "[0, 0]"
    elif shape == "mrv2_piecewise":
        assert kinds == ["Forward"]
        assert (fields[0]["passes"], fields[0]["pieces"], fields[0]["mode"]) == (1, 3, 1)
    elif shape == "mrv2_piecewise_alone":
        assert kinds == ["Replay"] * 6
        passes = [f for f in fields if f["kind"] == ReplayKind.PASSTHROUGH]
        assert [f["flags"] for f in passes] == [mrv2, mrv2 | drafter | int(Flag.BREAKABLE)]
    elif shape in ("v1_full", "v1_full_alone"):
        assert kinds == (["Forward"] if shape == "v1_full" else ["Replay"])
        assert fields[0]["num_tokens"] == 16 and fields[0]["mode"] == Mode.FULL
    elif shape == "v1_capture":
        assert kinds == ["Forward", "Replay"]
        assert fields[0]["captures"] == 1 and fields[0]["full_replays"] == 0
        assert fields[1]["kind"] == ReplayKind.CAPTURE and fields[1]["flags"] == outside
    elif shape == "v1_pass_through":
        assert kinds == ["Replay"] and "('ran', 4)" in out  # only the wrapper without a mode
    elif shape == "v1_drafter":
        assert kinds == ["Replay", "Replay", "Span"]
        assert {f["flags"] for f in fields} == {drafter}
    elif shape == "v1_exception":
        assert kinds == ["Forward"] and fields[0]["full_replays"] == 1 and out == "0"
    elif shape == "v1_pass_through_exception":
        assert kinds == [] and out == "1" and faults == {}
    elif shape in ("v1_launch_full", "v1_launch_inside_model_forward"):
        # one FORWARD either way: the launch and its replay (in one call, or two)
        assert kinds == ["Forward"] and fields[0]["flags"] == 0
        f = fields[0]
        assert (f["mode"], f["full_replays"], f["pieces"], f["num_tokens"]) == (Mode.FULL, 1, 0, 16)
        assert f["replay_t0"] and "('ran', 5)" in out
    elif shape == "v1_launch_piecewise":
        assert kinds == ["Forward"]
        f = fields[0]
        assert (f["mode"], f["full_replays"], f["pieces"], f["num_tokens"]) == (
            Mode.PIECEWISE,
            0,
            3,
            24,
        )
    elif shape == "v1_launch_eager":
        assert kinds == ["Forward"] and fields[0]["mode"] == Mode.NONE
        assert (fields[0]["pieces"], fields[0]["replay_t0"]) == (0, False)
    elif shape == "v1_launch_capture":
        assert kinds == ["Forward"] and (fields[0]["captures"], fields[0]["full_replays"]) == (1, 0)
    elif shape == "v1_launch_not_in_the_drafter":
        assert kinds == ["Forward", "Replay", "Replay"]
        assert [f["flags"] for f in fields] == [0, drafter, outside]
    elif shape == "v1_launch_exception":  # the launch is written, the scope closed
        assert kinds == ["Forward"] and out == "0" and fields[0]["pieces"] == 0
    else:  # the faults: counted once, the hook removed, vLLM's result unchanged
        assert kinds.count("Fault") == 1 and len(faults) == 1
        (hid,) = faults
        if hid == "ring.flush":  # a Python ring packs at the step's end
            assert shape == "fault_mode_out_of_range"
        else:
            assert hid not in left and hid.startswith("replay.")
    assert not [r for r in recs if r[0] not in ("Forward", "Replay", "Span", "Fault")]


@pytest.mark.parametrize("path", ["compiled", "python"] if accel.COMPILED else ["python"])
def test_live_marks_see_the_replays_on_a_compiled_ring(path: str, tmp_path: Path) -> None:
    """With PROBE_ROCTX=1 the records go through the marker tee (RT.put), not straight
    into the ring: the replay marks are there on both paths."""
    from fake_roctx import FakeRoctx

    from probe.engine import markers

    w = _world()
    inst = Installer()
    _install(w, inst, path, path)
    fake = FakeRoctx()
    with accel.use(path):
        writer = RingWriter.create(tmp_path / "ring", 256)
    try:
        RT.attach(writer)
        RT.on_first_step = []
        RT.enabled, RT.in_step, RT.step = True, 1, 7
        assert markers.start(RT, inst, {"PROBE_ROCTX": "1"}, importer=lambda name: fake)
        assert RT.tee == 1
        mrv2_drafter(w)
        RT.in_step, RT.enabled = 0, False
        RT.detach()
        inst.uninstall()
        kinds = [type(r).__name__ for r in drain(writer)[0]]
    finally:
        markers._CURRENT[0] = None
        writer.close()
    marks = [c[1] for c in fake.calls if c[0] == "mark"]
    assert marks == ["replay FULL step 7"] + ["drafter replay FULL step 7"] * 2
    assert kinds == ["Forward", "Replay", "Replay"]
