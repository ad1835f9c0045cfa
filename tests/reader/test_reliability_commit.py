"""The recording is committed on time even when the engine goes idle (crash safety).

``docs/reliability.md``: a crash of the reader loses at most the last moments. Steps that
arrive in one burst and are followed by silence must be committed within the commit
interval, without waiting for the next step.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from probe.engine.ring_writer import RingWriter
from probe.reader.collector import Collector, RecordingSink
from probe.reader.recording import RecordingWriter
from probe.records import Phase, RecordKind


def _burst(ring: RingWriter, steps: int) -> None:
    ring.write(RecordKind.HELLO, 0, 0, 0, 0, 0, 0, 1234, 1, 2, 3, 0)
    for s in range(1, steps + 1):
        t = s * 1000
        ring.write(RecordKind.SPAN, Phase.EXECUTE, 0, 0, s, t, t + 500, 4, 1, 0, 0, 0)
        ring.write(RecordKind.SPAN, Phase.SAMPLE_TOKENS, 0, 0, s, t + 600, t + 700, 0, 0, 0, 0, 0)


def _committed_steps(path: Path) -> int:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        n: int = db.execute("SELECT count(*) FROM steps").fetchone()[0]
        return n
    finally:
        db.close()


def test_burst_then_idle_is_committed_within_the_interval(tmp_path: Path) -> None:
    ring = RingWriter.create(tmp_path / "ring-1234.shm", capacity=1024)
    out = tmp_path / "run.probe.db"
    writer = RecordingWriter(out, commit_every_s=0.2)
    col = Collector(rings=[ring.path], sinks=[RecordingSink(writer)])
    try:
        _burst(ring, 10)
        col.poll()  # the burst: 9 steps closed (the 10th is still open)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # silence: the reader keeps polling
            col.poll()
            time.sleep(0.02)
        assert _committed_steps(out) == 9
    finally:
        col.close()
        ring.close()


def test_steps_are_committed_once_more_steps_follow(tmp_path: Path) -> None:
    """What does work today: a steady stream is committed every interval."""
    ring = RingWriter.create(tmp_path / "ring-1234.shm", capacity=1024)
    out = tmp_path / "run.probe.db"
    writer = RecordingWriter(out, commit_every_s=0.2)
    col = Collector(rings=[ring.path], sinks=[RecordingSink(writer)])
    try:
        _burst(ring, 10)
        col.poll()
        time.sleep(0.3)
        t = 20_000
        ring.write(RecordKind.SPAN, Phase.EXECUTE, 0, 0, 11, t, t + 500, 4, 1, 0, 0, 0)
        col.poll()
        assert _committed_steps(out) >= 9
    finally:
        col.close()
        ring.close()


class _RaisingSink:
    """An exporter with a bug: every call raises."""

    def on_process(self, proc: object) -> None:
        raise RuntimeError("exporter bug")

    def on_steps(self, proc: object, steps: object, gpu: object) -> None:
        raise RuntimeError("exporter bug")

    def close(self) -> None:
        raise RuntimeError("exporter bug")


def test_a_raising_sink_does_not_stop_the_reader_or_the_recording(tmp_path: Path) -> None:
    ring = RingWriter.create(tmp_path / "ring-1234.shm", capacity=1024)
    out = tmp_path / "run.probe.db"
    col = Collector(rings=[ring.path], sinks=[_RaisingSink(), RecordingSink(RecordingWriter(out))])
    try:
        _burst(ring, 10)
        col.poll()
        col.close()
        assert _committed_steps(out) == 10
        assert any("exporter bug" in e for e in col.errors)
    finally:
        ring.close()


def test_a_reader_holding_the_file_never_fails_the_writer_close(tmp_path: Path) -> None:
    """``probe report`` of a live recording at the moment its writer closes (the agent's
    rotation, the end of ``probe record``): the close succeeds, every commit is in the file,
    and the file is made self-contained once the reader is gone."""
    from probe.reader.recording import Recording, finish_wal

    ring = RingWriter.create(tmp_path / "ring-1234.shm", capacity=1024)
    out = tmp_path / "run.probe.db"
    writer = RecordingWriter(out, commit_every_s=0.0)
    col = Collector(rings=[ring.path], sinks=[RecordingSink(writer)])
    _burst(ring, 10)
    col.poll()
    reader = Recording.open(out)  # a live file: opened in place, read-only
    assert sum(1 for _ in reader.iter_steps()) == 9
    col.close()  # the writer's close, with the reader still there
    ring.close()
    assert Path(f"{out}-wal").exists()  # left in WAL mode: the reader holds it
    assert not finish_wal(out)  # and still does
    # the close wrote the 10th step (ended by the close) with the reader there
    again = Recording.open(out)
    assert sum(1 for _ in again.iter_steps()) == 10
    again.close()
    reader.close()
    assert finish_wal(out)
    assert not Path(f"{out}-wal").exists() and not Path(f"{out}-shm").exists()
    assert sum(1 for _ in Recording.open(out).iter_steps()) == 10
    assert finish_wal(out)  # once self-contained, nothing more to do
