"""Recordings of any size: the writers stream (a bound on what they hold gives the same
bytes as none), and several recordings or a glob are read as one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from extras import needs
from recordings import copy_recording, sqlite_of

from probe.cli.main import main
from probe.reader.recording import Recording, RecordingError, default_recording
from probe.reader.recording_set import RecordingSet, iter_step_chunks, open_many
from tests.profiles_data import profiles_dir

ROOT = Path(__file__).resolve().parents[2]
TP2 = ROOT / "tests" / "data" / "serve-tp2.probe"
KINETO = profiles_dir() / "kineto" / "tracelens_vllm_decode_full_graph_execution_hipgraph.json.gz"


def _ranks(tmp_path: Path) -> Path:
    d = tmp_path / "ranks"
    d.mkdir()
    for name, src in (("a", default_recording()), ("b", TP2)):
        copy_recording(src, d / f"{name}.probe")
    return d


def test_chunks_are_the_steps_in_bounded_lists() -> None:
    rec = Recording.open(TP2)
    chunks = list(iter_step_chunks(rec, 100))
    assert all(len(c) <= 100 for c in chunks) and len(chunks) > 10
    assert [s for c in chunks for s in c] == list(rec.iter_steps())
    with pytest.raises(ValueError):
        next(iter_step_chunks(rec, 0))


@needs("perfetto")
def test_perfetto_in_bounded_memory_is_the_same_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TP=2 recording (two ranks, every kind of slice) with slices spilled to sorted
    runs every 500 and lanes spooled every 50: byte for byte the trace held at once."""
    import exporters.perfetto as pf
    import exporters.perfetto_stream as ps

    whole = tmp_path / "whole.pftrace"
    assert main(["export", str(TP2), "--perfetto", str(whole), "--no-progress"]) == 0
    monkeypatch.setattr(pf, "SPILL_AT", 500)
    monkeypatch.setattr(ps, "SPILL_AT", 500)
    monkeypatch.setattr(ps, "_CHUNK", 7)
    monkeypatch.setattr(ps.Runs.__init__, "__defaults__", (500,))
    monkeypatch.setattr(ps.Spool.__init__, "__defaults__", (50,))
    runs = tmp_path / "runs.pftrace"
    assert main(["export", str(TP2), "--perfetto", str(runs), "--no-progress"]) == 0
    assert runs.read_bytes() == whole.read_bytes()


@needs("perfetto")
def test_spooled_lanes_keep_their_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import exporters.perfetto as pf

    def trace() -> bytes:
        b = pf.TraceBuilder()
        t = b.child_track(None, "t")
        for i in range(300):  # each overlaps the next without nesting: three lanes
            b.add(t, pf.Slice(f"s{i % 7}", 10 * i, 10 * i + 25, "x", {"i": i}))
        return b.write(tmp_path / "t.pftrace").read_bytes()

    whole = trace()
    monkeypatch.setattr(pf.Spool.__init__, "__defaults__", (8,))
    monkeypatch.setattr(pf.Runs.__init__, "__defaults__", (16,))
    assert trace() == whole
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    tr = pb.Trace()
    tr.ParseFromString(whole)
    names = [p.track_descriptor.name for p in tr.packet if p.HasField("track_descriptor")]
    assert names == ["t", "t (2)", "t (3)"]


def test_export_of_a_glob_is_one_trace(tmp_path: Path) -> None:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    d = _ranks(tmp_path)
    out = tmp_path / "all.pftrace"
    assert main(["export", str(d / "*.probe"), "--perfetto", str(out), "--no-progress"]) == 0
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    pids = {
        p.track_descriptor.process.pid
        for p in tr.packet
        if p.HasField("track_descriptor") and p.track_descriptor.HasField("process")
    }
    want = {p["pid"] for r in (default_recording(), TP2) for p in Recording.open(r).processes()}
    assert pids == want
    steps = sum(1 for p in tr.packet if "step" in p.track_event.categories)
    assert steps == sum(
        sum(Recording.open(r).step_counts().values()) for r in (default_recording(), TP2)
    )


@needs("prometheus")
def test_textfile_of_two_recordings_counts_both(tmp_path: Path) -> None:
    d = _ranks(tmp_path)
    out = tmp_path / "m.prom"
    args = ["export", str(d / "a.probe"), str(d / "b.probe"), "--prometheus-textfile"]
    assert main([*args, str(out), "--no-progress"]) == 0
    text = out.read_text()
    for r in (default_recording(), TP2):
        for pid in Recording.open(r).step_counts():
            assert f'pid="{pid}"' in text


@needs("perfetto")
def test_merge_reads_a_glob_as_the_recordings_listed(tmp_path: Path) -> None:
    d = _ranks(tmp_path)
    a, b = tmp_path / "glob.pftrace", tmp_path / "list.pftrace"
    common = [str(KINETO), "--allow-unaligned", "--no-progress", "--out"]
    assert main(["merge", str(d / "*.probe"), *common, str(a)]) == 0
    assert main(["merge", str(d / "a.probe"), str(d / "b.probe"), *common, str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_one_pid_on_two_hosts_is_refused(tmp_path: Path) -> None:
    d = _ranks(tmp_path)
    other = copy_recording(sqlite_of(default_recording()), tmp_path / "other.probe.db")
    with sqlite3.connect(other) as db:
        db.execute("UPDATE meta SET value = 'elsewhere' WHERE key = 'host'")
    with pytest.raises(RecordingError, match=r"also in .* another host"):
        open_many([d / "a.probe", other])


def test_rolling_files_of_one_process_read_as_one(tmp_path: Path) -> None:
    """One process's steps split over two files (an agent's rolling files): the set
    gives every step once, in order, with the builders of both files."""
    whole = Recording.open(default_recording())
    steps = list(whole.iter_steps())
    half = steps[len(steps) // 2].step
    parts = []
    for i, keep in enumerate(("step < ?", "step >= ?")):
        p = copy_recording(sqlite_of(default_recording()), tmp_path / f"part{i}.probe.db")
        with sqlite3.connect(p) as db:
            for t in ("steps", "spans", "dispatches", "replays", "builds", "reorders", "gpu"):
                db.execute(f"DELETE FROM {t} WHERE NOT ({keep})", (half,))
        with sqlite3.connect(p) as db:
            db.execute("VACUUM")
        parts.append(p)
    both = open_many([tmp_path / "part*.probe.db"])
    assert isinstance(both, RecordingSet)
    got = list(both.iter_steps())
    assert [(s.pid, s.step) for s in got] == [(s.pid, s.step) for s in steps]
    names = both.builder_names()
    for a, b in zip(got, steps, strict=True):
        assert [names[a.pid][x.builder_id] for x in a.builds] == [
            whole.builder_names()[b.pid][x.builder_id] for x in b.builds
        ]
    assert both.step_counts() == whole.step_counts()


def test_openmetrics_in_bounded_memory_is_the_timelines_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The streamed exposition is the text of the whole timelines (``lines``), with events
    spilled in sorted runs of 50 and text spooled every 10,000 characters."""
    import io

    import exporters.openmetrics as om
    import exporters.series as series
    from exporters.series import timelines

    rec = Recording.open(TP2)
    whole = "".join(om.lines(timelines(rec)))
    monkeypatch.setattr(series, "HOLD", 50)
    monkeypatch.setattr(om, "_HOLD_TEXT", 10_000)
    out = io.StringIO()
    n = om.write_to(rec, out)
    assert out.getvalue() == whole
    assert n == sum(1 for line in whole.splitlines() if not line.startswith("#"))


def test_rocpd_in_bounded_memory_is_the_same_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables read 40 rows at a time and string ids moved to the scratch database every
    30: the side-car's rows are those written with everything held."""
    import exporters.rocprof_sidecar as sidecar
    import exporters.timelines.rocpd_writer as rw
    from exporters.rocprof_sidecar import write_sidecar

    def rows(p: Path) -> list[tuple[object, ...]]:
        with sqlite3.connect(p) as db:
            tables = [
                r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            return [(t, *r) for t in sorted(tables) for r in db.execute(f'SELECT * FROM "{t}"')]

    whole = tmp_path / "whole.db"
    write_sidecar(Recording.open(TP2), whole)
    monkeypatch.setattr(sidecar, "BATCH_ROWS", 40)
    monkeypatch.setattr(rw, "_STRINGS_HELD", 30)
    small = tmp_path / "small.db"
    write_sidecar(Recording.open(TP2), small)

    def masked(p: Path) -> list[tuple[object, ...]]:
        import re

        guid = re.compile(
            r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
        )
        return [tuple(guid.sub("G", str(v)) for v in r) for r in rows(p)]

    got, want = masked(small), masked(whole)
    assert len(want) > 10_000
    assert got == want
