"""The Perfetto export of a recording, on the real H200 ground-truth window recording.

The trace is parsed back with the perfetto package's protos (tests/perfetto_read.py):
one slice per step and per phase span, timestamps exactly the recording's BOOTTIME
values, clock id BOOTTIME on every event.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from perfetto_read import read_trace
from recordings import raw_rows

from exporters.perfetto import BOOTTIME_CLOCK_ID, Slice, TraceBuilder, split_lanes, write_recording
from probe.cli.main import main
from probe.reader.recording import Recording

ROOT = Path(__file__).resolve().parents[2]
WINDOW = ROOT / "tests/data/groundtruth-window.probe"
BUNDLED = ROOT / "probe/data/default.probe"


@pytest.fixture(scope="module")
def window(tmp_path_factory: pytest.TempPathFactory) -> tuple[Recording, object]:
    rec = Recording.open(WINDOW)
    out = tmp_path_factory.mktemp("pf") / "window.pftrace"
    write_recording(rec, out)
    return rec, read_trace(out)


def test_counts_equal_the_recording(window: tuple[Recording, object]) -> None:
    _, tr = window
    db = raw_rows(WINDOW)  # the same recording's rows, read with SQL
    n = {
        t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        for t in ("steps", "spans", "dispatches", "replays", "builds", "reorders")
    }
    assert n["steps"] == 25 and n["spans"] == 266  # the fixture itself
    assert len(tr.by_category("step")) == n["steps"]
    assert len(tr.by_category("phase")) == n["spans"]
    assert len(tr.by_category("dispatch")) == n["dispatches"]
    assert len(tr.by_category("replay")) == n["replays"]
    assert len(tr.by_category("build")) == n["builds"]
    changed = db.execute("SELECT count(*) FROM reorders WHERE changed").fetchone()[0]
    assert len(tr.by_category("reorder")) == n["reorders"] + changed
    # one process track per pid, with one thread track and three child tracks
    pids = [r[0] for r in db.execute("SELECT pid FROM processes")]
    procs = [d for d in tr.tracks.values() if d.HasField("process")]
    threads = [d for d in tr.tracks.values() if d.HasField("thread")]
    assert sorted(d.process.pid for d in procs) == sorted(pids)
    assert [d.thread.thread_name for d in threads] == ["worker tp0 pp0"]
    children = {d.name for d in tr.tracks.values() if d.HasField("parent_uuid")}
    assert children == {"graph decisions", "metadata builds", "reorder"}


def test_timestamps_are_the_recordings_boottime(window: tuple[Recording, object]) -> None:
    rec, tr = window
    assert tr.clock_ids == {BOOTTIME_CLOCK_ID}
    db = raw_rows(WINDOW)  # the same recording's rows, read with SQL
    steps = {tuple(r) for r in db.execute("SELECT t0_ns, t1_ns, step FROM steps")}
    got = {(s.start_ns, s.end_ns, s.args["step"]) for s in tr.by_category("step")}
    assert got == steps
    spans = sorted(tuple(r) for r in db.execute("SELECT t0_ns, t1_ns FROM spans"))
    assert sorted((s.start_ns, s.end_ns) for s in tr.by_category("phase")) == spans
    # the ground-truth window (run3-results.json), on BOOTTIME
    assert all(469862122252 <= s.start_ns <= 472903818611 for s in tr.by_category("step"))
    snap = tr.packets[0].clock_snapshot
    proc = rec.processes()[0]
    assert {c.clock_id: c.timestamp for c in snap.clocks} == {
        6: proc["boottime_ns"],
        1: proc["epoch_ns"],
    }


def test_decisions_are_args(window: tuple[Recording, object]) -> None:
    _, tr = window
    full = [s for s in tr.by_category("step") if s.args.get("mode") == "full"]
    assert len(full) == 23
    assert full[0].name.startswith("step ") and full[0].name.endswith(" FULL hit")
    d = [s for s in tr.by_category("dispatch") if not s.args["drafter"]]
    assert {(s.args["mode"], s.args["reason"]) for s in d} >= {("full", "hit")}
    drafter = [s for s in tr.by_category("dispatch") if s.args["drafter"]]
    assert drafter and all(s.name.startswith("drafter dispatch NONE") for s in drafter)
    # phases nest inside their step on the thread track
    thread = next(u for u, d in tr.tracks.items() if d.HasField("thread"))
    assert {s.track for s in tr.by_category("phase")} == {thread}


def test_bundled_recording_exports(tmp_path: Path) -> None:
    rec = Recording.open(BUNDLED)
    out = write_recording(rec, tmp_path / "b.pftrace")
    tr = read_trace(out)
    n = raw_rows(BUNDLED).execute("SELECT count(*) FROM steps").fetchone()[0]
    assert len(tr.by_category("step")) == n == sum(rec.step_counts().values())


def test_overlapping_slices_go_to_sibling_lanes(tmp_path: Path) -> None:
    a, b, c = Slice("a", 0, 10), Slice("b", 5, 15), Slice("c", 2, 4)
    lanes = split_lanes([a, b, c])
    assert lanes == [[a, c], [b]]
    tb = TraceBuilder()
    t = tb.child_track(None, "x")
    tb.extend(t, [a, b, c, Slice("i", 10, 10)])
    tr = read_trace(tb.write(tmp_path / "x.pftrace"))
    names = {tr.track_name(s.track) for s in tr.slices}
    assert names == {"x", "x (2)"}
    with pytest.raises(ValueError, match="ends before it starts"):
        tb.add(t, Slice("bad", 5, 4))


def test_merge_needs_out_or_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["merge", str(WINDOW), str(tmp_path / "missing.json")]) == 2
    assert "give --out" in capsys.readouterr().err
