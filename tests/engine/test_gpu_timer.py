"""The GPU timer's steps on both hot paths: the same device events at the same points of
the step and the same GPU records, the compiled hooks staying compiled on the timer's
steps (they tick the timer from C), a timer fault turning only the timer off, and the
stream cache of the event record. Events are stand-ins with a counting clock (no device
here); on the H200 the harness's runs carry the real ones."""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from ring_drain import drain

from probe.engine import accel
from probe.engine.hooks import replay, step
from probe.engine.hooks._base import Installer, Target
from probe.engine.ring_writer import RingWriter
from probe.engine.runtime import RT
from probe.records import GpuTiming, Span

PATHS = ["python"] + (["compiled"] if accel.COMPILED else [])


class FakeEvent:
    """A timing event: ``record()`` stamps the next tick of a shared clock (1 ms apart)
    and logs where in the step it was recorded."""

    clock: ClassVar[Iterator[int]] = itertools.count(1)
    log: ClassVar[list[tuple[int, int, int]]] = []
    fail_at: ClassVar[int | None] = None  # raise on this record (1-based), to fault the timer

    def __init__(self) -> None:
        self.t = 0

    def record(self) -> None:
        n = len(FakeEvent.log) + 1
        if FakeEvent.fail_at == n:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        FakeEvent.log.append((RT.step, RT.in_step, RT.fwd_open))
        self.t = next(FakeEvent.clock)

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        return float(end.t - self.t)


class SchedulerOutput:
    def __init__(self, n: int) -> None:
        self.total_num_scheduled_tokens = 2 * n
        self.num_scheduled_tokens = dict.fromkeys(range(n), 2)


def _runner() -> type:
    class GPUModelRunner:
        def execute_model(self, scheduler_output: Any) -> Any:
            return self._model_forward(scheduler_output.total_num_scheduled_tokens)

        def _model_forward(self, x: int) -> Any:
            return ("hidden", x)

        def sample_tokens(self, grammar: Any = None) -> Any:
            return "tokens"

    return GPUModelRunner


TARGETS = (
    Target("step.v1.execute_model", __name__, "", "execute_model", step.execute("v1")),
    Target("phase.v1.forward_launch", __name__, "", "_model_forward", step.forward, gate="on"),
    Target("step.v1.sample_tokens", __name__, "", "sample_tokens", step.sample_tokens("v1")),
)
WRAPPER = Target("replay.wrapper", __name__, "", "__call__", replay.wrapper_call(False), gate="on")


def _launch_runner() -> tuple[type, type]:
    """V1 with the model in a FULL wrapper of vLLM's FULL mode: the wrapper's hooked
    ``__call__`` is the forward launch, ``_model_forward`` stays unhooked."""
    from vllm.config import CUDAGraphMode

    class CUDAGraphWrapper:
        runtime_mode = CUDAGraphMode.FULL

        def __init__(self) -> None:
            self.concrete_cudagraph_entries = {8: types.SimpleNamespace(cudagraph=object())}

        def __call__(self, x: int) -> Any:
            return ("hidden", x)

    class GPUModelRunner:
        def execute_model(self, scheduler_output: Any) -> Any:
            return self._model_forward(scheduler_output.total_num_scheduled_tokens)

        def _model_forward(self, x: int) -> Any:
            return CUDAGraphWrapper()(x)

        def sample_tokens(self, grammar: Any = None) -> Any:
            return "tokens"

    return GPUModelRunner, CUDAGraphWrapper


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    RT.reset()
    FakeEvent.log, FakeEvent.fail_at = [], None
    FakeEvent.clock = itertools.count(1)
    yield
    step.TIMER.clear()
    RT.reset()


def _run(
    path: str, tmp: Path, steps: int, every: int, monkeypatch: Any, launch: bool = False
) -> dict[str, Any]:
    FakeEvent.log = []
    FakeEvent.clock = itertools.count(1)
    python_calls = [0]
    real_timer, real_sampled = step._timer, step._sampled_timer

    def counted(fn: Any) -> Any:
        def wrapper() -> Any:
            python_calls[0] += 1
            return fn()

        return wrapper

    # the Python hooks look the timer up through these on every call they handle
    monkeypatch.setattr(step, "_timer", counted(real_timer))
    monkeypatch.setattr(step, "_sampled_timer", counted(real_sampled))
    runner_cls = _runner()
    targets = [(t, runner_cls) for t in TARGETS]
    if launch:
        runner_cls, wrapper_cls = _launch_runner()
        targets = [(TARGETS[0], runner_cls), (TARGETS[2], runner_cls), (WRAPPER, wrapper_cls)]
        fcm = pytest.importorskip("vllm.forward_context")
        from vllm.config import CUDAGraphMode

        ctx = types.SimpleNamespace(cudagraph_runtime_mode=CUDAGraphMode.FULL, batch_descriptor=8)
        monkeypatch.setattr(fcm, "_forward_context", ctx)
    inst = Installer()
    with accel.use(path):
        for t, owner in targets:
            assert inst.install_on(t, owner)
        writer = RingWriter.create(tmp / f"ring-{path}", 512)
    try:
        RT.reset()
        RT.attach(writer)
        RT.on_first_step = []
        timer = step.GpuTimer(every, event=FakeEvent)
        step.TIMER[:] = [timer]
        RT.gpu_timing, RT.timer_every, RT.timer_tick = True, timer.every, timer.tick
        RT.enabled = True
        runner = runner_cls()
        outs = []
        for i in range(steps):
            outs.append(runner.execute_model(SchedulerOutput(4 + i)))
            outs.append(runner.sample_tokens())
        state = {"gpu_timing": RT.gpu_timing, "faults": dict(RT.faults)}
        RT.detach()
        kinds = {type(vars(o)[t.name]).__name__ for t, o in targets}
        left = sorted(inst.installed_ids())
        recs = drain(writer)[0]
    finally:
        writer.close()
        if inst.hooks:
            inst.uninstall()
    return {
        "outs": outs,
        "log": list(FakeEvent.log),
        "gpu": sorted((r for r in recs if isinstance(r, GpuTiming)), key=lambda r: r.step),
        "spans": sorted((r.step, r.phase) for r in recs if isinstance(r, Span)),
        "python_calls": python_calls[0],
        "kinds": kinds,
        "left": left,
        **state,
    }


@pytest.mark.parametrize("launch", [False, True], ids=["model_forward", "full_wrapper"])
@pytest.mark.parametrize("path", PATHS)
def test_the_timer_records_its_events_at_the_points_of_its_steps(
    path: str, launch: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = _run(path, tmp_path, steps=9, every=4, monkeypatch=monkeypatch, launch=launch)
    # steps 4 and 8 are timed: the end of the step before (outside it), the step's start
    # (before the step is entered), the forward's start and end (outside the open forward
    # scope, inside the step) and the step's end (after sample_tokens returned)
    want = []
    for s in (4, 8):
        want += [(s - 1, 0, 0), (s, 0, 0), (s, 1, 0), (s, 1, 0), (s, 0, 0)]
    assert r["log"] == want
    # 5 events per timed step 1 ms apart: busy = forward start -> end, idle = previous
    # end -> this start, span = start -> end
    assert [(g.step, g.busy_ns, g.idle_before_ns, g.span_ns) for g in r["gpu"]] == [
        (4, 1_000_000, 1_000_000, 3_000_000),
        (8, 1_000_000, 1_000_000, 3_000_000),
    ]
    assert r["outs"] == [x for i in range(9) for x in (("hidden", 2 * (4 + i)), "tokens")]
    assert r["faults"] == {} and r["gpu_timing"]


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled path not built: {accel.WHY_NOT}")
@pytest.mark.parametrize("launch", [False, True], ids=["model_forward", "full_wrapper"])
def test_the_compiled_hooks_tick_the_timer_and_stay_compiled(
    launch: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    py = _run("python", tmp_path, steps=17, every=4, monkeypatch=monkeypatch, launch=launch)
    c = _run("compiled", tmp_path, steps=17, every=4, monkeypatch=monkeypatch, launch=launch)
    assert c["kinds"] == {"Step", "Replay" if launch else "Forward"}
    assert py["kinds"] == {"function"}
    for k in ("log", "gpu", "spans", "outs", "faults"):
        assert c[k] == py[k], k
    assert len(c["gpu"]) == 4
    # no call of the 17 steps, timed or not, went through the Python hooks
    assert c["python_calls"] == 0 and py["python_calls"] > 0


@pytest.mark.parametrize("path", PATHS)
def test_a_timer_fault_turns_the_timer_off_and_nothing_else(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeEvent.fail_at = 7  # the second event of the second timed step (step 8's start)
    r = _run(path, tmp_path, steps=12, every=4, monkeypatch=monkeypatch)
    assert r["faults"] == {"gpu_timer": 1} and not r["gpu_timing"]
    assert [g.step for g in r["gpu"]] == [4]
    assert len(r["log"]) == 6  # nothing recorded after the fault
    # every step recorded whole, every hook still installed, vLLM's results untouched
    assert {s for s, _ in r["spans"]} == set(range(1, 13))
    assert r["left"] == sorted(t.hook_id for t in TARGETS)
    assert r["outs"] == [x for i in range(12) for x in (("hidden", 2 * (4 + i)), "tokens")]


def test_the_event_record_builds_a_stream_once_per_current_stream() -> None:
    calls: list[tuple[str, Any]] = []
    current = [(3, 0, 1)]

    class Stream:
        def __init__(self, stream_id: int, device_index: int, device_type: int) -> None:
            calls.append(("Stream", (stream_id, device_index, device_type)))

    class Base:
        def record(self, stream: Any) -> None:
            calls.append(("record", stream))

    class Event(Base):
        def record(self, stream: Any = None) -> None:  # what torch does: a Stream per call
            raise AssertionError("the per-call Stream path was taken")

    def get_stream(device: int) -> tuple[int, int, int]:
        assert device == 0
        return current[0]

    torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(Event=Event, Stream=Stream),
        _C=types.SimpleNamespace(_cuda_getDevice=lambda: 0, _cuda_getCurrentStream=get_stream),
    )
    record = step._current_stream_record(torch)
    ev = Event()
    record(ev)
    record(ev)
    current[0] = (5, 0, 1)  # vLLM switched streams: the event follows
    record(ev)
    made = [c for c in calls if c[0] == "Stream"]
    assert [m[1] for m in made] == [(3, 0, 1), (5, 0, 1)]
    streams = [c[1] for c in calls if c[0] == "record"]
    assert len(streams) == 3 and streams[0] is streams[1] and streams[2] is not streams[0]
    # a torch without those internals: the plain record()
    assert step._current_stream_record(types.SimpleNamespace()) is step._plain_record
