"""The metric exports read column batches: the Prometheus textfile is the exposition a
sink fed the recording's Steps makes (:func:`exporters.base.replay`, each step's updates
applied in turn), and OpenMetrics the samples of the Steps' events
(:func:`exporters.series.step_events`), byte for byte, on every committed recording, a
set of two files, and a recording edited where the batches must take care (steps removed
whose detail rows stay, a step whose device timing is missing); OTLP's spans are those
of the Steps. An SQLite recording with calibrated processes (its hooked calls counted
from each step's records) is read as Steps for its metrics."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recordings import committed, copy_recording, rows_of_no_step, sqlite_of

import exporters.series
from exporters.base import replay
from exporters.metrics_columns import NeedsSteps, replay_columns
from exporters.openmetrics import write as write_openmetrics
from exporters.prometheus import PrometheusSink, replayed
from probe.reader.columnar_convert import convert
from probe.reader.recording import Recording
from probe.reader.recording_batches import step_batches
from probe.reader.recording_columns import iter_step_columns
from probe.reader.recording_set import open_many

ROOT = Path(__file__).resolve().parents[2]
TP2 = ROOT / "tests/data/serve-tp2.probe"
STOCK = ROOT / "tests/data/stock_mrv2_k1.probe"
CALIBRATED = ROOT / "tests/data/chunked_mrv2_k1.probe"


def _from_steps(rec: Any) -> bytes:
    sink = PrometheusSink()
    replay(rec, sink)
    return sink.exposition()


def _same(rec: Any, tmp_path: Path | None = None) -> bytes:
    sink = PrometheusSink()
    n = replay_columns(rec, sink)
    assert n == sum(rec.step_counts().values())  # read as columns, every step
    got = sink.exposition()
    assert got == _from_steps(rec)
    if tmp_path is not None:
        _same_openmetrics(rec, tmp_path)
    return got


def _same_openmetrics(rec: Any, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(exporters.series, "step_events", _refused)
        n = write_openmetrics(rec, tmp_path / "columns.om")
        mp.undo()
        mp.setattr(exporters.series, "columns_read", lambda rec, infos: "")
        assert write_openmetrics(rec, tmp_path / "steps.om") == n
    got = (tmp_path / "columns.om").read_bytes()
    assert got == (tmp_path / "steps.om").read_bytes()
    assert n > 0 and b"# EOF" in got


def _refused(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the Steps were walked")


@pytest.mark.parametrize("path", committed())
def test_the_column_exports_are_the_steps_exports(path: str, tmp_path: Path) -> None:
    got = _same(Recording.open(path), tmp_path)
    assert b"vllm_graph_probe_steps_total{" in got


def test_a_set_of_two_files_and_the_ranks(tmp_path: Path) -> None:
    got = _same(open_many([TP2, STOCK]), tmp_path)
    assert b"vllm_graph_probe_rank_last_steps_total{" in got


def test_steps_removed_and_a_device_timing_missing(tmp_path: Path) -> None:
    """Steps removed whose builds and reorders stay (they belong to no step); a step's
    device timing made NULL; converted back to columns."""
    db = copy_recording(sqlite_of(TP2), tmp_path / "edited.probe.db")
    con = sqlite3.connect(db)
    first, second = sorted(p for (p,) in con.execute("SELECT DISTINCT pid FROM steps"))
    con.execute("DELETE FROM steps WHERE pid = ? AND step % 5 = 2", (second,))
    con.execute(
        "UPDATE steps SET gpu_busy_ns = NULL, gpu_step_ns = NULL, gpu_idle_before_ns = NULL "
        "WHERE pid = ? AND step % 9 = 4",
        (first,),
    )
    con.commit()
    orphans = rows_of_no_step(con, "builds")
    con.close()
    assert orphans > 0
    col = tmp_path / "edited.probe"
    convert(db, col)
    _same(Recording.open(col), tmp_path)


def test_an_sqlite_recording_with_calibrated_processes_is_fed_its_steps() -> None:
    """Its hooked calls are counted from each step's records: the Steps."""
    rec = Recording.open(sqlite_of(CALIBRATED))
    with pytest.raises(NeedsSteps):
        replay_columns(rec, PrometheusSink())
    sink, n = replayed(rec)
    assert n == sum(rec.step_counts().values())
    got = sink.exposition()
    assert got == _same(Recording.open(CALIBRATED))
    assert b"vllm_graph_probe_hooked_calls_total{" in got


def test_an_sqlite_recording_without_calibration_is_read_as_columns() -> None:
    assert _same(Recording.open(sqlite_of(TP2))) == _same(Recording.open(TP2))


def test_batches_are_exactly_the_size_asked_with_their_details() -> None:
    rec = Recording.open(TP2)
    pid = sorted(rec.step_counts())[0]
    batches = list(step_batches(rec, pid, 7, ("builds",), counts=True))
    assert {len(b) for b in batches[:-1]} == {7}
    assert 1 <= len(batches[-1]) <= 7
    whole = np.concatenate([c["step"] for c in iter_step_columns(rec, pid)])
    assert np.array_equal(np.concatenate([b.steps["step"] for b in batches]), whole)
    # every build of the pid's steps, each with the row of its step
    builds = sum(len(b.details["builds"]["row"]) for b in batches)
    (n,) = rec.sql(f"SELECT count(*) FROM builds WHERE pid = {pid}")[0]
    assert builds == n
    for b in batches:
        d = b.details["builds"]
        assert (np.diff(d["row"]) >= 0).all()
        assert (b.steps["n_builds"][np.unique(d["row"])] > 0).all()


def _spans(rec: Any, columns: bool) -> list[tuple[Any, ...]]:
    """The spans an OTLP replay of ``rec`` sends (spans only, as ``probe export --otlp``
    sends them before its metric samples): each with its process, its step's number and
    whether it is the step's root, its name, times and attributes."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from exporters.otlp import ATTR, OtlpSink

    mem = InMemorySpanExporter()
    sink = OtlpSink(lambda: mem, lambda: None, metrics=False)  # type: ignore[arg-type,return-value]
    if columns:
        replay_columns(rec, sink, tables=("spans", "reorders"))
    else:
        replay(rec, sink)
    sink.flush()
    got = mem.get_finished_spans()
    step_of = {s.context.span_id: s.attributes[f"{ATTR}.step"] for s in got if s.parent is None}
    out = []
    for s in got:
        step = step_of[s.parent.span_id] if s.parent is not None else step_of[s.context.span_id]
        pid = dict(s.resource.attributes).get("process.pid")
        attrs = sorted(dict(s.attributes).items())
        out.append((pid, step, s.parent is None, s.name, s.start_time, s.end_time, attrs))
    sink.close()
    return sorted(out, key=repr)


@pytest.mark.parametrize("path", [TP2, STOCK, CALIBRATED])
def test_the_column_spans_are_the_steps_spans(path: Path) -> None:
    rec = Recording.open(path)
    got = _spans(rec, columns=True)
    assert got == _spans(rec, columns=False)
    assert sum(1 for x in got if x[2]) == sum(rec.step_counts().values())  # a root per step
    assert any(not x[2] for x in got)


def test_a_process_without_builds_or_reorders(tmp_path: Path) -> None:
    """A process none of whose steps has a build or a reorder: its batches carry those
    tables' columns empty."""
    db = copy_recording(sqlite_of(TP2), tmp_path / "bare.probe.db")
    con = sqlite3.connect(db)
    pid = max(p for (p,) in con.execute("SELECT DISTINCT pid FROM steps"))
    con.execute("DELETE FROM builds WHERE pid = ?", (pid,))
    con.execute("DELETE FROM reorders WHERE pid = ?", (pid,))
    con.commit()
    con.close()
    rec = Recording.open(db)
    b = next(step_batches(rec, pid, 64, ("builds", "reorders")))
    assert len(b.details["builds"]["row"]) == 0
    assert set(b.details["builds"]) >= {"row", "tag", "drafter", "t0_ns", "t1_ns", "builder"}
    _same(rec, tmp_path)
