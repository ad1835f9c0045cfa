"""``probe attach``'s reader under load: the rings copied into a spool while attached,
decoded, assembled and written in slices or after detach.

The same ring content must give the same recording whichever path it takes: as it is
read (``probe record``/``collect``), in slices while attached, or all after detach.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from probe.engine.ring_writer import RingWriter
from probe.reader.collector import Collector, RecordingSink, Spool
from probe.reader.recording import Recording, RecordingWriter
from probe.reader.recording_schema import TABLES
from probe.records import (
    BlobType,
    Build,
    BuildTag,
    Dispatch,
    Fault,
    Flag,
    Forward,
    GpuTiming,
    Hello,
    Mode,
    Phase,
    Reason,
    RecordKind,
    Reorder,
    Span,
    pack,
    payload_records,
)


def _stream(steps: int, seed: int = 7) -> list[bytes]:
    """A ring's worth of records as the hooks write them: hello, a builder name, the
    snapshot blob, steps of every record kind (target and drafter dispatches, folded
    forwards, builds, reorders), device timings a few steps late, records outside steps
    and a hook fault."""
    rng = random.Random(seed)
    out = [pack(Hello(4242, 10**12, 1_700_000_000 * 10**9, 5 * 10**9, 1))]
    out += payload_records(RecordKind.STRING, 1, b"FlashMLASparseMetadataBuilder")
    snap = {"role": "worker", "runner": "v1", "vllm_version": "0.32.0", "pad": "x" * 200}
    out += payload_records(RecordKind.BLOB, 0, json.dumps(snap).encode(), sub=BlobType.SNAPSHOT)
    t = 10**12
    for n in range(1, steps + 1):
        t += rng.randrange(900_000, 1_500_000)
        toks = rng.randrange(1, 64)
        mode = rng.choice([Mode.FULL, Mode.FULL, Mode.PIECEWISE, Mode.NONE])
        reason = {Mode.FULL: Reason.HIT, Mode.PIECEWISE: Reason.PIECEWISE_ONLY}.get(
            mode, Reason.NOT_UNIFORM
        )
        uni = Flag.UNIFORM if mode == Mode.FULL else Flag.NONE
        full, pieces = int(mode == Mode.FULL), 3 * int(mode == Mode.PIECEWISE)
        recs: list[object] = [
            Span(n, Phase.EXECUTE, t, t + 800_000, 0, toks, rng.randrange(1, 8)),
            Reorder(n, n % 3 == 0, 0, t + 1000, t + 2000, 1, 4, 3, 3, n % 3, True),
            Build(n, BuildTag.STEP, 1, 0, t + 3000, t + 9000, 8, toks, 4, 4, 1, 1, 4, 0, 4, 0),
            Dispatch(n, mode, reason, uni | Flag.SPAN, t + 10**4, t + 15_000, toks, 64, 4, 8, 1, 1),
            Forward(n, mode, 0, t + 2 * 10**4, t + 6 * 10**5, full, pieces, 0, 0, toks, t, t + 9),
            Span(n, Phase.SAMPLE_TOKENS, t + 810_000, t + 880_000, 0, 0, 0),
        ]
        if n % 5 == 0:
            drafter = Dispatch(n, Mode.FULL, Reason.HIT, Flag.DRAFTER, t, t + 9, 2, 8, 1, 4, 2, 2)
            recs.insert(4, drafter)
        if n % 7 == 0:
            outside = Flag.OUTSIDE_STEP
            recs.append(Span(n, Phase.FORWARD_LAUNCH, t + 900_000, t + 950_000, outside, 0, 0))
        if n % 8 == 0 and n > 3:
            recs.append(GpuTiming(n - 3, 400_000, rng.randrange(0, 200_000), 1_000_000))
        if n == steps // 2:
            recs.append(Fault(1, 1, False))
        out += [pack(r) for r in recs]  # type: ignore[arg-type]
    return out


def _tables(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every table but ``meta`` (times of the session), row by row in rowid order."""
    db = sqlite3.connect(path)
    try:
        return {
            t: db.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall()
            for t in TABLES
            if t != "meta"
        }
    finally:
        db.close()


class _Ticks:
    """A clock that moves 1 s per reading: each assemble slice does one chunk."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _record(tmp: Path, name: str, recs: list[bytes], assemble_s: float | None) -> Path:
    """Write ``recs`` through a real ring (a small one: many laps) into a recording, the
    reader polling as the writer goes, then closing as ``probe attach`` does."""
    (tmp / name).mkdir(mode=0o700)
    ring_path = tmp / name / "ring-4242.shm"  # the pid the recording gives each step
    ring = RingWriter.create(ring_path, capacity=1024)
    out = tmp / f"{name}.probe.db"
    col = Collector(
        rings=[ring_path],
        sinks=[RecordingSink(RecordingWriter(out))],
        assemble_s=assemble_s,
        clock=_Ticks(),
    )
    for i in range(0, len(recs), 300):
        for r in recs[i : i + 300]:
            assert ring.write_raw(r)
        col.poll()
    ring.close(unlink=False)
    col.close()
    assert sum(p.dropped for p in col.procs.values()) == 0 and col.errors == []
    return out


@pytest.fixture(scope="module")
def stream() -> list[bytes]:
    return _stream(900)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="spool-", dir="/tmp"))
    os.chmod(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_same_ring_content_gives_the_same_recording_on_every_path(
    short_tmp: Path, stream: list[bytes]
) -> None:
    as_read = _record(short_tmp, "read", stream, assemble_s=None)  # record, collect
    sliced = _record(short_tmp, "sliced", stream, assemble_s=0.5)  # attach, slices
    after = _record(short_tmp, "after", stream, assemble_s=0.0)  # attach, all after detach
    want = _tables(as_read)
    assert len(want["steps"]) == 900 and want["gpu"] and want["faults"] and want["outside"]
    assert want["processes"][0][1] == "worker"  # the snapshot blob was read
    assert _tables(sliced) == want
    assert _tables(after) == want
    steps = list(Recording.open(as_read).iter_steps())
    assert list(Recording.open(after).iter_steps()) == steps
    assert {s.mode for s in steps} == {Mode.FULL, Mode.PIECEWISE, Mode.NONE}


def test_while_attached_a_poll_only_copies_the_ring(short_tmp: Path, stream: list[bytes]) -> None:
    ring_path = short_tmp / "ring-1.shm"
    ring = RingWriter.create(ring_path, capacity=4096)
    seen: list[int] = []

    class Counting:
        def on_process(self, proc: object) -> None:
            pass

        def on_steps(self, proc: object, steps: list[object], gpu: list[object]) -> None:
            seen.append(len(steps))

        def close(self) -> None:
            pass

    col = Collector(rings=[ring_path], sinks=[Counting()], assemble_s=0.0, now_ns=lambda: 77)
    for r in stream[:3000]:
        ring.write_raw(r)
    assert col.poll() == 3000
    [proc] = col.procs.values()
    assert col.spooled == 3000 and proc.reader.pending == 0  # the ring is free again
    assert ring.reader_heartbeat_ns == 77 and seen == []  # nothing decoded yet
    col.assemble()
    assert col.spooled == 0 and sum(seen) > 0
    ring.close()
    col.close()


def test_a_full_spool_leaves_records_in_the_ring_which_counts_the_drops(short_tmp: Path) -> None:
    ring_path = short_tmp / "ring-2.shm"
    ring = RingWriter.create(ring_path, capacity=256)
    recs = _stream(200)
    col = Collector(rings=[ring_path], assemble_s=0.0, spool_bytes=100 * 64, now_ns=lambda: 5)
    written = 0
    for r in recs[:300]:
        written += ring.write_raw(r)
    col.poll()
    [proc] = col.procs.values()
    assert col.spooled == 100 and proc.reader.pending == 156  # bounded: the rest waits
    assert ring.reader_heartbeat_ns == 5  # the reader still says it is alive
    assert written == 256 and ring.dropped == 44  # the ring dropped and counted the rest
    col.assemble()
    col.poll()
    assert col.spooled == 100 and proc.reader.pending == 56
    ring.close(unlink=False)
    col.close()


def test_rings_opened_at_the_enable_are_read_whole_after_their_unlink(
    short_tmp: Path, stream: list[bytes]
) -> None:
    """``probe attach`` opens the rings right after its enable and builds the collector
    once its modules are imported; a process that reached its deadline meanwhile has
    unlinked its ring. Mapped from the descriptor, every record is read; a descriptor
    never mapped is closed with the collector."""
    from probe.ring_dir import OPEN_FLAGS

    ring_path = short_tmp / "ring-4242.shm"
    ring = RingWriter.create(ring_path, capacity=4096)
    fd = os.open(ring_path, OPEN_FLAGS)
    for r in stream[:2000]:
        assert ring.write_raw(r)
    ring.close()
    assert not ring_path.exists()
    spare = os.open(short_tmp, os.O_RDONLY)  # a path the collector is not asked to read
    col = Collector(
        rings=[ring_path], ring_fds={ring_path: fd, short_tmp / "x": spare}, assemble_s=0.0
    )
    assert col.poll() == 2000 and col.errors == []
    col.assemble()
    [proc] = col.procs.values()
    assert proc.pid == 4242 and proc.hello is not None and proc.steps_seen > 100
    col.close()
    for closed in (fd, spare):
        with pytest.raises(OSError):
            os.fstat(closed)


def test_spool_take_splits_blocks_in_order() -> None:
    sp = Spool()
    recs = [bytes([i]) * 64 for i in range(10)]
    sp.append(b"".join(recs[:3]))
    sp.append(b"")
    sp.append(b"".join(recs[3:10]))
    assert len(sp) == 10 and sp.nbytes == 640
    assert sp.take(2) == recs[:2]
    assert sp.take(4) == recs[2:6]  # across the first block's end
    assert sp.take(100) == recs[6:]
    assert len(sp) == 0 and sp.take(5) == []


def test_the_writer_gives_the_same_rows_however_the_steps_come(short_tmp: Path) -> None:
    """``add_steps`` writes one ``executemany`` per table: the rows, their order and the
    values read back do not depend on how many steps one call carries."""
    from probe.reader.recording import default_recording

    steps = list(Recording.open(default_recording()).iter_steps())
    paths = []
    for name, chunk in (("one", 1), ("all", len(steps)), ("some", 37)):
        path = short_tmp / f"{name}.probe.db"
        w = RecordingWriter(path)
        for pid in sorted({s.pid for s in steps}):
            w.add_process(pid, None)
        for i in range(0, len(steps), chunk):
            w.add_steps(steps[i : i + chunk])
        w.close()
        paths.append(path)
    one, *others = (_tables(p) for p in paths)
    assert len(one["steps"]) == len(steps) > 1000 and len(one["replays"]) > 1000
    assert all(t == one for t in others)
    back = list(Recording.open(paths[1]).iter_steps())
    # builder names need the ring's strings (not given here): the rest comes back as it was
    assert [replace(s, builds=()) for s in back] == [replace(s, builds=()) for s in steps]
