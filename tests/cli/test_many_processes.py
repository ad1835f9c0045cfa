"""A recording of 10,000 processes of 2 steps each (an agent's rolling recordings of a
fleet: every restart brings new pids): ``probe report`` and the Prometheus textfile do the
work of each process once, not the whole recording's work once a process.

No time is asserted (the benchmark ``benchmarks/processes.py`` holds the times): the work
is counted, the SQLite reads as the virtual machine's instructions over the recording
(:meth:`sqlite3.Connection.set_progress_handler`), and the summary's resolution of every
group, once for the whole and once for every rank at most.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.processes import FIRST_PID, make
from probe.analysis.summary import Summary
from probe.reader.recording import Recording

MANY = 10_000
FEW = 1_000


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Path]]:
    d = tmp_path_factory.mktemp("processes")
    out = {}
    for n in (FEW, MANY):
        out[n] = d / f"p{n}.probe.db"
        make(out[n], n, 2)
    yield out


class Work:
    """SQLite instructions run on a recording's connection (in thousands), and the calls
    of :meth:`Summary.resolved` and of the figures read per rank or whole."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sqlite = 0
        self.resolved = 0
        self.figures = 0
        resolved, figures_of = Summary.resolved, Summary._figures_of

        def counted_resolved(s: Summary) -> Any:
            self.resolved += 1
            return resolved(s)

        def counted_figures(s: Summary, *a: Any) -> Any:
            self.figures += 1
            return figures_of(s, *a)

        monkeypatch.setattr(Summary, "resolved", counted_resolved)
        monkeypatch.setattr(Summary, "_figures_of", counted_figures)

    def open(self, path: Path) -> Recording:
        rec = Recording.open(path)
        rec.db.set_progress_handler(self._tick, 1000)
        return rec

    def _tick(self) -> int:
        self.sqlite += 1
        return 0


def _measure(
    monkeypatch: pytest.MonkeyPatch, path: Path, run: Callable[[Recording], Any]
) -> tuple[Work, Any]:
    with monkeypatch.context() as m:
        w = Work(m)
        rec = w.open(path)
        try:
            return w, run(rec)
        finally:
            rec.close()


def test_report_of_10000_processes_does_each_ones_work_once(
    monkeypatch: pytest.MonkeyPatch, recordings: dict[int, Path]
) -> None:
    from probe.cli.render_report import build_report

    few, _ = _measure(monkeypatch, recordings[FEW], build_report)
    many, rep = _measure(monkeypatch, recordings[MANY], build_report)
    # every process is a rank of its own, each with its figures and verdict
    assert len(rep["per_rank"]) == MANY
    assert rep["per_rank"][0]["pid"] == FIRST_PID
    assert rep["hit_rates_all"]["steps"] == few_steps(recordings[FEW]) * MANY // FEW
    # the groups resolved once for the whole and once for all ranks, whatever their number
    assert many.resolved == few.resolved <= 2
    assert many.figures == MANY + 1
    # SQLite's work per process does not grow with the processes (quadratic: 10 times)
    assert many.sqlite / MANY < 1.5 * few.sqlite / FEW


def test_textfile_of_10000_processes_does_each_ones_work_once(
    monkeypatch: pytest.MonkeyPatch, recordings: dict[int, Path]
) -> None:
    from exporters.base import replay
    from exporters.prometheus import PrometheusSink

    def textfile(rec: Recording) -> PrometheusSink:
        sink = PrometheusSink()
        assert replay(rec, sink) == 2 * len(rec.step_counts())
        return sink

    few, _ = _measure(monkeypatch, recordings[FEW], textfile)
    many, sink = _measure(monkeypatch, recordings[MANY], textfile)
    # every process's steps are in the metric set (the exposition text is the library's)
    from exporters.metrics import METRICS

    name = "vllm_graph_probe_steps_total"
    at = METRICS[name].all_labels.index("pid")
    pids = {key[at] for key in sink.values.series[name]}
    assert len(pids) == MANY
    assert many.resolved == few.resolved <= 1
    assert many.sqlite / MANY < 1.5 * few.sqlite / FEW


def few_steps(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT count(*) FROM steps WHERE mode IS NOT NULL").fetchone()[0])
