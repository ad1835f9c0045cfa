"""The requests a step carried over from earlier steps, on both hot paths: the step
bracket writes, on its EXECUTE span, how many of the scheduled requests are not new
(``len(num_scheduled_tokens) - len(scheduled_new_reqs)``, the two fields both runners
read from vLLM's ``SchedulerOutput``), and -1 where the scheduler output has no list of
new requests. The reader's engine-idle rule stands on it (:mod:`probe.analysis.rules`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ring_drain import drain

from probe.engine import accel
from probe.engine.hooks import step
from probe.engine.hooks._base import Installer, Target
from probe.engine.ring_writer import RingWriter
from probe.engine.runtime import RT
from probe.records import Phase, Span

PATHS = ["python"] + (["compiled"] if accel.COMPILED else [])


class SchedulerOutput:
    """vLLM's fields the step bracket reads: ``new`` of ``n`` requests are new."""

    def __init__(self, n: int, new: int | None) -> None:
        self.total_num_scheduled_tokens = 3 * n
        self.num_scheduled_tokens = dict.fromkeys(range(n), 3)
        if new is not None:
            self.scheduled_new_reqs = [object()] * new


class GPUModelRunner:
    def execute_model(self, scheduler_output: Any) -> Any:
        return scheduler_output.total_num_scheduled_tokens

    def sample_tokens(self, grammar: Any = None) -> Any:
        return "tokens"


TARGETS = (
    Target("step.v1.execute_model", __name__, "", "execute_model", step.execute("v1")),
    Target("step.v1.sample_tokens", __name__, "", "sample_tokens", step.sample_tokens("v1")),
)


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    RT.reset()
    yield
    RT.reset()


def _execute_spans(path: str, tmp: Path, batches: list[tuple[int, int | None]]) -> list[Span]:
    inst = Installer()
    with accel.use(path):
        for t in TARGETS:
            assert inst.install_on(t, GPUModelRunner)
        writer = RingWriter.create(tmp / f"ring-{path}", 256)
    try:
        RT.attach(writer)
        RT.on_first_step = []
        RT.enabled = True
        runner = GPUModelRunner()
        for n, new in batches:
            assert runner.execute_model(SchedulerOutput(n, new)) == 3 * n
            runner.sample_tokens()
        kind = type(vars(GPUModelRunner)["execute_model"]).__name__
        RT.detach()
        recs = drain(writer)[0]
    finally:
        writer.close()
        inst.uninstall()
    assert (kind != "function") == (path == "compiled")  # the compiled hook stayed compiled
    return sorted(
        (r for r in recs if isinstance(r, Span) and r.phase == Phase.EXECUTE),
        key=lambda r: r.step,
    )


@pytest.mark.parametrize("path", PATHS)
def test_the_step_bracket_records_the_requests_carried_over(path: str, tmp_path: Path) -> None:
    # a first batch (all new), requests running on with one joining, one leaving, all new
    # again after the engine emptied, and a scheduler output without the list (unknown)
    batches = [(4, 4), (5, 1), (4, 0), (2, 2), (3, None)]
    got = _execute_spans(path, tmp_path, batches)
    assert [(s.v0, s.v1, s.v2) for s in got] == [
        (12, 4, 0),
        (15, 5, 4),
        (12, 4, 4),
        (6, 2, 0),
        (9, 3, -1),
    ]


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled path not built: {accel.WHY_NOT}")
def test_both_paths_write_the_same_execute_spans(tmp_path: Path) -> None:
    batches = [(8, 8), (8, 0), (9, 1), (1, 1), (6, None)]
    py = _execute_spans("python", tmp_path, batches)
    c = _execute_spans("compiled", tmp_path, batches)
    assert len(py) == len(batches)
    assert [(s.v0, s.v1, s.v2) for s in py] == [(s.v0, s.v1, s.v2) for s in c]
