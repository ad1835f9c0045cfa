"""Live roctx output (PROBE_ROCTX=1) with a recorded stand-in for ROCm's roctx module.

ROCm is absent here; the stand-in has the real roctx Python API names (``rangePush``,
``rangePop``, ``mark``, ``rangeStart``, ``rangeStop``, as rocprofiler-sdk's bindings) and
records each call. The probe's own step/phase wrappers (probe.engine.hooks.step factories) are
installed on a small runner class with the probe's Installer, as the core does.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Iterator
from typing import Any

import pytest
from fake_roctx import FakeRoctx

from probe.engine import markers as roctx_live
from probe.engine.hooks import step as step_hooks
from probe.engine.hooks._base import Installer, Target
from probe.engine.runtime import RT
from probe.records import Mode, Phase, Reason, RecordKind, ReplayKind

ON = {"PROBE_ROCTX": "1"}


class Writer:
    dropped = 0

    def __init__(self) -> None:
        self.records: list[tuple[int, ...]] = []

    def write(self, *fields: int) -> bool:
        self.records.append(fields)
        return True

    def write_raw(self, rec: bytes) -> bool:
        return True


class SchedulerOutput:
    total_num_scheduled_tokens = 128
    num_scheduled_tokens = dict.fromkeys(range(64), 2)


def make_runner() -> type:
    class Runner:
        def execute_model(self, scheduler_output: Any) -> str:
            self._prepare_inputs()
            # what the dispatch hook writes for a FULL decision
            RT.put.dispatch(
                RT.step, int(Mode.FULL), int(Reason.HIT), 0, 10, 20, 128, 128, 64, 64, 0, 0
            )
            RT.put.replay(RT.step, int(Mode.FULL), int(ReplayKind.REPLAY), 0, 30, 40, 128)
            return "output"

        def _prepare_inputs(self) -> None:
            pass

        def sample_tokens(self) -> str:
            return "tokens"

        def boom(self) -> None:
            raise KeyError("vllm's own error")

    return Runner


TARGETS = (
    Target("step.v1.execute_model", "", "", "execute_model", step_hooks.execute("v1")),
    Target(
        "phase.v1.prepare_inputs",
        "",
        "",
        "_prepare_inputs",
        step_hooks.span(Phase.PREPARE_INPUTS),
    ),
    Target("step.v1.sample_tokens", "", "", "sample_tokens", step_hooks.sample_tokens("v1")),
)


@pytest.fixture
def probe(
    hot_path: str,
) -> Iterator[tuple[type, Installer, Writer]]:
    RT.reset()
    runner = make_runner()
    inst = Installer()
    for t in TARGETS:
        assert inst.install_on(t, runner)
    writer = Writer()
    RT.attach(writer)
    RT.on_first_step = []
    RT.enabled = True
    yield runner, inst, writer
    RT.reset()
    if inst.hooks:
        inst.uninstall()
    roctx_live._CURRENT[0] = None


def test_off_unless_asked(probe: tuple[type, Installer, Writer]) -> None:
    runner, inst, writer = probe
    before = dict(vars(runner))
    assert roctx_live.start(RT, inst, {}) is None
    assert roctx_live.start(RT, inst, {"PROBE_ROCTX": "0"}) is None
    assert dict(vars(runner)) == before and RT.write == writer.write


def test_missing_roctx_is_logged_not_raised(
    probe: tuple[type, Installer, Writer], caplog: pytest.LogCaptureFixture
) -> None:
    _, inst, writer = probe

    def no_roctx(name: str) -> types.ModuleType:
        raise ImportError(f"No module named {name!r}")

    with caplog.at_level(logging.ERROR, logger="probe"):
        assert roctx_live.start(RT, inst, ON, importer=no_roctx) is None
    assert "PROBE_ROCTX=1" in caplog.text and "rocprofiler-sdk" in caplog.text
    assert RT.write == writer.write


def test_ranges_and_marks(probe: tuple[type, Installer, Writer]) -> None:
    runner, inst, writer = probe
    fake = FakeRoctx()
    live = roctx_live.start(RT, inst, ON, importer=lambda name: fake)
    assert live is not None
    assert sorted(live.wrapped) == sorted(t.hook_id for t in TARGETS)
    r = runner()
    assert r.execute_model(SchedulerOutput()) == "output"
    assert r.sample_tokens() == "tokens"
    assert fake.calls == [
        ("rangePush", "step 1"),
        ("rangePush", "prepare_inputs"),
        ("rangePop",),
        ("mark", "dispatch FULL hit step 1 tokens 128/128"),
        ("mark", "replay FULL step 1"),
        ("rangePop",),
        ("rangePush", "sample_tokens"),
        ("rangePop",),
    ]
    # the probe's records still reach its writer, unchanged
    kinds = [f[0] for f in writer.records]
    assert kinds.count(int(RecordKind.SPAN)) == 3 and kinds.count(int(RecordKind.DISPATCH)) == 1
    # disable: dormant (RT.write is no longer the tee)
    RT.detach()
    fake.calls.clear()
    r.execute_model(SchedulerOutput())
    assert fake.calls == []
    # removing the probe's hooks removes the roctx layer and restores the originals
    originals = {t.name: h.original for h in inst.hooks.values() for t in [h.target]}
    inst.uninstall()
    for name, orig in originals.items():
        assert vars(runner)[name] is orig


def test_late_hooks_are_wrapped_on_the_first_step(probe: tuple[type, Installer, Writer]) -> None:
    runner, inst, _ = probe
    fake = FakeRoctx()
    live = roctx_live.start(RT, inst, ON, importer=lambda name: fake)
    assert live is not None
    late = Target("phase.logits", "", "", "boom", step_hooks.span(Phase.LOGITS))
    inst.install_on(late, runner)  # as the core's first step does for logits/drafter
    assert "phase.logits" not in live.wrapped
    for cb in RT.on_first_step:
        cb(runner())
    assert "phase.logits" in live.wrapped
    with pytest.raises(KeyError, match="vllm's own error"):
        runner().boom()
    assert fake.calls == [("rangePush", "logits"), ("rangePop",)]


def test_a_failing_roctx_switches_itself_off(probe: tuple[type, Installer, Writer]) -> None:
    runner, inst, writer = probe
    fake = FakeRoctx(fail_on="rangePush")
    live = roctx_live.start(RT, inst, ON, importer=lambda name: fake)
    assert live is not None
    assert runner().execute_model(SchedulerOutput()) == "output"
    assert RT.faults == {"roctx": 1}
    assert RT.write == writer.write and not live.active
    fake.fail_on = None
    runner().execute_model(SchedulerOutput())
    assert fake.calls == []


def test_nvtx_live_with_the_real_nvtx_package(probe: tuple[type, Installer, Writer]) -> None:
    """PROBE_NVTX=1 drives the same ranges and marks through the real ``nvtx`` package
    (without Nsight attached its calls are no-ops, so the calls are not observable; the
    wrapping, the marks counted and the probe's records are)."""
    pytest.importorskip("nvtx")
    from probe.engine.markers import NvtxEmitter

    runner, inst, writer = probe
    live = roctx_live.start(RT, inst, {"PROBE_NVTX": "1"})
    assert live is not None and isinstance(live.emitter, NvtxEmitter)
    assert sorted(live.wrapped) == sorted(t.hook_id for t in TARGETS)
    r = runner()
    assert r.execute_model(SchedulerOutput()) == "output"
    assert r.sample_tokens() == "tokens"
    assert live.marks == 2  # the dispatch and the replay decision
    kinds = [f[0] for f in writer.records]
    assert kinds.count(int(RecordKind.SPAN)) == 3 and kinds.count(int(RecordKind.DISPATCH)) == 1
    inst.uninstall()


def test_neither_variable_means_nothing_is_wrapped(probe: tuple[type, Installer, Writer]) -> None:
    _, inst, _ = probe
    before = {h.hook_id: h.wrapper for h in inst.hooks.values()}
    assert roctx_live.start(RT, inst, {}) is None
    assert {h.hook_id: h.wrapper for h in inst.hooks.values()} == before


def test_mrv2_full_launch_has_its_forward_launch_range(
    probe: tuple[type, Installer, Writer],
) -> None:
    """MRV2's target FULL launch is the base ``run_fullgraph`` hook's call (the subclass's
    replay through ``super()``): a ``forward_launch`` range there, and none around the
    drafter's replays or a replay outside a step."""
    from probe.engine.hooks import replay as replay_hooks

    _runner, inst, _ = probe

    class CudaGraphManager:
        def run_fullgraph(self, desc: Any) -> Any:
            return ("replayed", desc)

    class ModelCudaGraphManager(CudaGraphManager):
        def run_fullgraph(self, desc: Any) -> Any:
            return super().run_fullgraph(desc)

    class SpeculatorCudaGraphManager(CudaGraphManager):
        pass

    t = Target("replay.mrv2.run_fullgraph", "", "", "run_fullgraph", replay_hooks.run_fullgraph)
    assert inst.install_on(t, CudaGraphManager)
    fake = FakeRoctx()
    live = roctx_live.start(RT, inst, ON, importer=lambda name: fake)
    assert live is not None and "replay.mrv2.run_fullgraph" in live.wrapped
    desc = types.SimpleNamespace(num_tokens=64)
    RT.in_step = 1
    assert ModelCudaGraphManager().run_fullgraph(desc) == ("replayed", desc)
    RT.drafter = 1
    SpeculatorCudaGraphManager().run_fullgraph(desc)
    ModelCudaGraphManager().run_fullgraph(desc)  # the drafter's own target-manager replay
    RT.drafter, RT.in_step = 0, 0
    ModelCudaGraphManager().run_fullgraph(desc)  # outside a step (a capture window, say)
    pushes = [c for c in fake.calls if c[0] == "rangePush"]
    assert pushes == [("rangePush", "forward_launch")]
    assert fake.calls.count(("rangePop",)) == 1
