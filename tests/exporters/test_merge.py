"""``probe merge`` on real data: the H200 window recording with its real Kineto trace,
the real rocprofv3 CSV set, and broken inputs.

The H200 files (tests/data/): ``groundtruth-window.probe`` is
run3's ``stock_v1_k1`` recording cut to the 25 steps of the torch-profiler window, and
``run3-groundtruth.kineto.trimmed.json.gz`` that profiler's trace of the same steps.
``run3-groundtruth.json`` says 23 cudaGraphLaunch calls fell inside ``_model_forward``
and the probe saw 23 FULL target replays.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from perfetto_read import read_trace
from profiles_data import profile_path
from recordings import copy_recording, sqlite_of

from exporters.timelines.align import AlignmentError, align
from exporters.timelines.crosscheck import step_table
from exporters.timelines.load import load_profile
from probe.cli.main import main
from probe.reader.recording import Recording

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "tests/data"
WINDOW = H200 / "groundtruth-window.probe"
KINETO = H200 / "run3-groundtruth.kineto.trimmed.json.gz"
GROUNDTRUTH = json.loads((H200 / "run3-groundtruth.json").read_text())


@pytest.fixture(scope="module")
def kineto() -> Any:
    return load_profile(KINETO)


def test_kineto_alignment_uses_the_clock_pair(kineto: Any) -> None:
    rec = Recording.open(WINDOW)
    al = align(rec, kineto)
    proc = rec.processes()[0]
    assert al.method == "clock pair"
    assert al.offset_ns == proc["boottime_ns"] - proc["epoch_ns"]
    # the 24 forwards agree with the clock pair to a few microseconds
    assert al.forward_pairs == GROUNDTRUTH["kineto_forwards"] == 24
    assert al.forward_residual_ns is not None and al.forward_residual_ns[1] < 10_000


def test_forward_matching_when_the_clock_pair_is_off(kineto: Any, tmp_path: Path) -> None:
    """A wall clock stepped by 2 s after the pair was taken: the forwards find the offset."""
    db = copy_recording(sqlite_of(WINDOW), tmp_path / "stepped.probe.db")
    con = sqlite3.connect(db)
    con.execute("UPDATE processes SET epoch_ns = epoch_ns + 2000000000")
    con.commit()
    con.close()
    rec = Recording.open(db)
    al = align(rec, kineto)
    assert al.method == "forward matching"
    good = align(Recording.open(WINDOW), kineto).offset_ns
    assert abs(al.offset_ns - good) < 10_000
    assert "disagrees" in al.detail


def test_full_replays_equal_graph_launches_in_the_forward(kineto: Any) -> None:
    rec = Recording.open(WINDOW)
    table = step_table(rec, kineto, align(rec, kineto))
    t = table.totals
    assert t["steps"] == GROUNDTRUTH["probe_steps_in_window"] == 25
    assert t["probe_full_replays"] == GROUNDTRUTH["probe_full_replays"] == 23
    assert t["graph_launches_in_forward"] == GROUNDTRUTH["kineto_graph_launches_in_forwards"]
    assert t["graph_launches_in_forward"] == 23
    assert t["steps_agreeing"] == 25
    full = [r for r in table.rows if r.mode == "full"]
    assert len(full) == 23 and all(r.graph_launches == 1 and r.kernels > 0 for r in full)
    # every kernel of the window is attributed to a step through its launch
    assert t["kernels"] == len(kineto.kernels)
    # GPU forward time from Kineto's kernels is below the probe's event-to-event time
    for r in full:
        assert r.forward_gpu_ns is not None and r.probe_gpu_busy_ns is not None
        assert 0 < r.forward_gpu_ns <= r.probe_gpu_busy_ns


def test_cli_merge_kineto(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.pftrace"
    assert main(["merge", str(WINDOW), str(KINETO), "--out", str(out), "--report"]) == 0
    text = capsys.readouterr().out
    assert "(clock pair)" in text and "steps agreeing 25/25" in text
    assert "probe target replays 23 FULL" in text
    tr = read_trace(out)
    assert len(tr.by_category("kernel")) == 3941
    graph = [s for s in tr.slices if s.name == "cudaGraphLaunch"]
    assert len(graph) == 23
    # flows: every kernel of a graph launch ends one of the launch's arrows
    ends = {f for s in tr.by_category("kernel") for f in s.flows_in}
    assert all(g.flows_out and set(g.flows_out) <= ends for g in graph)
    # the kernels sit inside the recording's window on BOOTTIME
    steps = tr.by_category("step")
    lo, hi = min(s.start_ns for s in steps), max(s.end_ns for s in steps)
    assert all(lo <= s.start_ns <= hi for s in tr.by_category("kernel"))


def test_kineto_cpu_events_on_their_thread_tracks(kineto: Any, tmp_path: Path) -> None:
    """Kineto's runtime calls and Python events sit on Perfetto thread tracks of their own
    pid/tid (not custom "kineto runtime (tid N)" tracks); the trace stays well formed:
    balanced slices (read_trace checks), one BOOTTIME clock, every flow terminated."""
    out = tmp_path / "m.pftrace"
    assert main(["merge", str(WINDOW), str(KINETO), "--out", str(out)]) == 0
    tr = read_trace(out)
    cats = {c.domain for c in kineto.host_calls} | {m.category for m in kineto.markers}
    cpu = [s for s in tr.slices if s.category in cats]
    assert len(cpu) == len(kineto.host_calls) + len(kineto.markers) > 0
    want = {(c.pid, c.tid) for c in kineto.host_calls} | {(m.pid, m.tid) for m in kineto.markers}
    got = set()
    for s in cpu:
        d = tr.tracks[s.track]
        assert d.HasField("thread"), f"{s.name} is on {tr.track_name(s.track)!r}"
        got.add((d.thread.pid, d.thread.tid))
    assert got == want
    assert not any("(tid " in tr.track_name(u) for u in tr.tracks)
    # the worker's Kineto events share the recording's process with the probe's steps
    step_pids = {tr.tracks[s.track].thread.pid for s in tr.by_category("step")}
    assert step_pids & {pid for pid, _ in want}
    assert tr.clock_ids == {6}
    starts = [f for s in tr.slices for f in s.flows_out]
    ends = [f for s in tr.slices for f in s.flows_in]
    assert len(starts) == len(set(starts)) and sorted(starts) == sorted(ends)


def test_cli_merge_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["merge", str(WINDOW), str(KINETO), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["totals"]["graph_launches_in_forward"] == 23
    assert data[0]["alignment"]["method"] == "clock pair"


def test_committed_merged_trace_is_current() -> None:
    merged = "benchmarks/results/ab-graph-support-h200/merged-groundtruth-window.pftrace"
    tr = read_trace(ROOT / merged)
    assert len(tr.by_category("step")) == 25
    assert len([s for s in tr.slices if s.name == "cudaGraphLaunch"]) == 23


# -- rocprofv3 CSV: real files, another machine's clock


def test_rocprofv3_csv_does_not_overlap(capsys: pytest.CaptureFixture[str]) -> None:
    csv_dir = profile_path("rocprofv3-csv", "rocprofiler-sdk-2024-10")
    assert main(["merge", str(WINDOW), str(csv_dir), "--report"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert str(csv_dir) in err and "does not overlap" in err


@pytest.mark.parametrize("how", ["--allow-unaligned", "--offset-ns"])
def test_rocprofv3_csv_merges_anyway(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_dir = profile_path("rocprofv3-csv", "rocprofiler-sdk-2024-10")
    prof = load_profile(csv_dir)
    extra = [how]
    if how == "--offset-ns":
        first = min(x[0].start_ns for x in (prof.kernels, prof.host_calls, prof.markers) if x)
        extra.append(str(469873184476 - first))
    out = tmp_path / "r.pftrace"
    assert main(["merge", str(WINDOW), str(csv_dir), "--out", str(out), *extra]) == 0
    text = capsys.readouterr().out
    assert ("unaligned" if how == "--allow-unaligned" else "explicit") in text
    tr = read_trace(out)
    assert len(tr.by_category("kernel")) == len(prof.kernels) > 0
    assert len(tr.by_category("step")) == 25


# -- bad inputs: exit 2, one line naming the file


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], path: Path) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("probe: error: ") and str(path) in err
    return err


def test_truncated_recording(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "trunc.probe.db"
    bad.write_bytes(sqlite_of(WINDOW).read_bytes()[:5000])
    _one_line_error(capsys, ["merge", str(bad), str(KINETO), "--report"], bad)


def test_truncated_rocpd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from exporters.timelines.rocpd_writer import create_rocpd_db

    db = tmp_path / "r_results.db"
    with create_rocpd_db(db, hostname="h") as w:
        w.add_regions([])
    bad = tmp_path / "trunc_results.db"
    bad.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    err = _one_line_error(capsys, ["merge", str(WINDOW), str(bad), "--report"], bad)
    assert "truncated" in err


def test_wrong_rocpd_schema_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from exporters.timelines.rocpd_writer import create_rocpd_db

    db = tmp_path / "v9_results.db"
    with create_rocpd_db(db, hostname="h") as w:
        uuid = w.uuid
    con = sqlite3.connect(db)
    con.execute(f"UPDATE rocpd_metadata_{uuid} SET value='9.0.0' WHERE tag='schema_version'")
    con.commit()
    con.close()
    err = _one_line_error(capsys, ["merge", str(WINDOW), str(db), "--report"], db)
    assert "9.0.0" in err


def test_wrong_recording_schema_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = copy_recording(sqlite_of(WINDOW), tmp_path / "v99.probe.db")
    con = sqlite3.connect(bad)
    con.execute("PRAGMA user_version=99")
    con.commit()
    con.close()
    err = _one_line_error(capsys, ["merge", str(bad), str(KINETO), "--report"], bad)
    assert "schema version 99" in err


def test_csv_missing_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = profile_path("rocprofv3-csv", "rocm-systems-2025-08", "kernel_trace.csv")
    lines = real.read_text().splitlines()
    cut = [",".join(line.split(",")[:5]) for line in lines]  # drops Start/End_Timestamp...
    bad = tmp_path / "kernel_trace.csv"
    bad.write_text("\n".join(cut) + "\n")
    err = _one_line_error(capsys, ["merge", str(WINDOW), str(bad), "--report"], bad)
    assert "missing required column" in err


def test_kineto_from_another_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with gzip.open(KINETO, "rt") as fh:
        doc = json.load(fh)
    for e in doc["traceEvents"]:
        if e.get("pid") == 1424:
            e["pid"] = 777
        if e.get("tid") == 1424:
            e["tid"] = 777
    bad = tmp_path / "otherhost.json.gz"
    with gzip.open(bad, "wt") as fh:
        json.dump(doc, fh)
    err = _one_line_error(capsys, ["merge", str(WINDOW), str(bad), "--report"], bad)
    assert "another host" in err and "777" in err


def test_kineto_not_overlapping(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with gzip.open(KINETO, "rt") as fh:
        doc = json.load(fh)
    doc["baseTimeNanoseconds"] += 3600 * 10**9  # an hour later
    bad = tmp_path / "later.json.gz"
    with gzip.open(bad, "wt") as fh:
        json.dump(doc, fh)
    # the forwards still match by duration, and far from the clock pair: the pair loses
    rec = Recording.open(WINDOW)
    al = align(rec, load_profile(bad))
    assert al.method == "forward matching"
    # without forwards to match, an hour off is an error naming the file
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "python_function"]
    with gzip.open(bad, "wt") as fh:
        json.dump(doc, fh)
    with pytest.raises(AlignmentError, match="does not overlap"):
        align(rec, load_profile(bad))
    _one_line_error(capsys, ["merge", str(WINDOW), str(bad), "--report"], bad)


def test_json_that_is_no_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    _one_line_error(capsys, ["merge", str(WINDOW), str(bad), "--report"], bad)


def test_offset_before_zero(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv_dir = profile_path("rocprofv3-csv", "rocprofiler-sdk-2024-10")
    argv = ["merge", str(WINDOW), str(csv_dir), "--out", str(tmp_path / "x.pftrace")]
    assert main([*argv, "--offset-ns", str(-(10**18))]) == 2
    assert "before 0" in capsys.readouterr().err
