"""Zero-cost detach: while no reader is attached only the always-on hooks are in place."""

from __future__ import annotations

from typing import Any

import pytest
from extras import needs

from probe.engine import hooks
from probe.engine.ring_writer import RingWriter
from probe.records import Dispatch

pytestmark = pytest.mark.usefixtures("clean_probe")


def _installed_families() -> set[str]:
    return {h.hook_id.split(".", 1)[0] for h in hooks.INSTALLER.hooks.values()}


def test_detached_process_has_only_always_on_hooks(ring: RingWriter, kit: Any) -> None:
    import vllm.v1.worker.gpu_model_runner  # noqa: F401  (a worker has it imported)
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    original = vars(CudagraphDispatcher)["dispatch"]
    hooks.install(list(hooks.ALWAYS_ON), lazy=False)
    assert _installed_families() == {"static"}
    assert vars(CudagraphDispatcher)["dispatch"] is original

    hooks.attach(ring, gpu_timing=False)
    assert {"step", "dispatch", "replay", "reorder", "static"} <= _installed_families()
    assert vars(CudagraphDispatcher)["dispatch"] is not original

    hooks.detach()
    assert _installed_families() == {"static"}
    assert vars(CudagraphDispatcher)["dispatch"] is original

    hooks.attach(ring, gpu_timing=False)
    assert vars(CudagraphDispatcher)["dispatch"] is not original
    hooks.detach()


def test_attached_dispatch_is_recorded_and_detached_is_not(
    ring: RingWriter, kit: Any, v1_dispatcher: Any
) -> None:
    hooks.attach(ring, families=["dispatch"], gpu_timing=False)
    v1_dispatcher.dispatch(6, uniform_decode=True)
    hooks.detach()
    v1_dispatcher.dispatch(6, uniform_decode=True)
    records, _ = kit.drain(ring)
    assert [type(r) for r in records] == [Dispatch]


def test_a_re_attach_reuses_the_first_calibration(
    ring: RingWriter, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calibration holds the engine's GIL for milliseconds: the first attach of a process
    takes it, every later one on the same hot path reuses it (marked so)."""
    from probe.engine import calibrate
    from probe.engine.runtime import RT

    monkeypatch.setattr(calibrate, "_TAKEN", {})
    runs: list[int] = []
    real = calibrate.calibrate

    def counted(*a: Any, **kw: Any) -> dict[str, Any]:
        runs.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(calibrate, "calibrate", counted)
    hooks.attach(ring, families=["dispatch"], gpu_timing=False)
    first = dict(RT.static["calibration"])
    hooks.detach()
    hooks.attach(ring, families=["dispatch"], gpu_timing=False)
    second = dict(RT.static["calibration"])
    hooks.detach()
    assert len(runs) == 1
    assert "reused" not in first and first["span_ns"] > 0
    assert second == {**first, "reused": True}


@needs("vllm")
def test_a_calibration_taken_before_vllm_is_not_reused_after(
    ring: RingWriter, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without vLLM imported the dispatch hook has no FULL member to compare and the
    calibration times its Python record: that figure must not stand for the compiled one
    once vLLM is there."""
    from probe.engine import calibrate
    from probe.engine.hooks import dispatch
    from probe.engine.runtime import RT

    monkeypatch.setattr(calibrate, "_TAKEN", {})
    members = dispatch._mode_members
    monkeypatch.setattr(dispatch, "_mode_members", lambda: (None, None))
    hooks.attach(ring, families=["dispatch"], gpu_timing=False)
    before = dict(RT.static["calibration"])
    hooks.detach()
    monkeypatch.setattr(dispatch, "_mode_members", members)
    hooks.attach(ring, families=["dispatch"], gpu_timing=False)
    after = dict(RT.static["calibration"])
    hooks.detach()
    assert "reused" not in before and "reused" not in after
    if after["hot_path"] == "compiled":  # the Python record is the slower one
        assert before["hook_ns"] > after["hook_ns"]


def test_the_calibration_leaves_the_engines_own_steps_alone(
    hot_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attach enables on the control thread while the engine's main thread runs steps
    through the hooks just installed. The calibration in between must not switch those
    hooks on: an engine step that entered the bracket while it ran, and returned after it
    had put the runtime back, left ``in_step`` at -1, so every later record of that process
    read as outside a step (a whole attach of steps without a forward, seen once in CI)."""
    import threading
    import time

    from probe.engine import calibrate
    from probe.engine.hooks import step
    from probe.engine.hooks._base import Installer, Target
    from probe.engine.runtime import RT

    seen_inside: list[int] = []
    stop = threading.Event()

    class SchedulerOutput:
        total_num_scheduled_tokens = 4
        num_scheduled_tokens = (4,)

    class Runner:
        def execute_model(self, scheduler_output: Any) -> None:
            if RT.in_step:
                seen_inside.append(RT.in_step)
            time.sleep(0.0003)  # the engine's work, without the GIL

    inst = Installer()
    target = Target("step.v1.execute_model", "", "", "execute_model", step.execute("v1"))
    assert inst.install_on(target, Runner)
    runner, so = Runner(), SchedulerOutput()
    steps = 0

    def engine() -> None:
        nonlocal steps
        while not stop.is_set():
            runner.execute_model(so)
            steps += 1

    monkeypatch.setattr(calibrate, "_TAKEN", {})
    saved = (RT.step, RT.in_step, RT.enabled)
    t = threading.Thread(target=engine)
    t.start()
    try:
        while steps < 5:
            time.sleep(0.001)
        for _ in range(3):
            calibrate.calibrate(calls=50, rounds=3, cold_calls=24, cold_budget_s=0.1)
    finally:
        stop.set()
        t.join()
        inst.uninstall()
    assert steps > 50
    assert seen_inside == []  # no engine step was recorded by the calibration's switch
    assert (RT.step, RT.in_step, RT.enabled) == saved
