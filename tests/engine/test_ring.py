"""The shared-memory ring: round trips, a real concurrent writer process, drops, bad files,
the reader heartbeat, and the owner-only files and directories."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.engine.ring_writer import RingWriter
from probe.reader.ring_reader import RingReader
from probe.records import RECORD, RecordKind, payload_records
from probe.ring import HEADER_SIZE, MAGIC, RingFormatError
from probe.ring_dir import OPEN_FLAGS, UnsafeRingDirError, check_ring_dir, default_ring_dir

pytestmark = pytest.mark.usefixtures("hot_path")

M61 = 2**61


def checksum(seq: int) -> int:
    return seq * 2654435761 % M61


def fields_for(seq: int) -> tuple[int, ...]:
    """Every field derived from ``seq``, so a torn record cannot pass the checks."""
    return (
        RecordKind.SPAN,
        seq & 0xFF,
        (seq >> 8) & 0xFF,
        (seq >> 16) & 0xFF,
        seq & 0xFFFFFFFF,
        seq * 3,
        -seq * 5,
        seq,
        checksum(seq),
        seq ^ 0x5555_5555_5555,
        -(seq * 7),
        ~seq,
    )


def deadline(seconds: float) -> float:
    return time.monotonic() + seconds


# Child processes (module level: the "spawn" context imports them by name).


def writer_process(path: str, n: int, capacity: int, ready: Any, go: Any, conn: Connection) -> None:
    writer = RingWriter.create(path, capacity)
    ready.set()
    if not go.wait(30):
        return
    write = writer.write
    committed = 0
    for seq in range(n):
        committed += write(*fields_for(seq))
    conn.send((committed, writer.dropped))
    writer.close(unlink=False)


def heartbeat_process(path: str, ready: Any, touched: Any, conn: Connection) -> None:
    writer = RingWriter.create(path, 64)
    writer.write(*fields_for(1))
    ready.set()
    if touched.wait(30):
        conn.send(writer.reader_heartbeat_ns)
    # exits without close(), like a crash: the file stays and stays readable


def forked_child_write(writer: RingWriter, conn: Connection) -> None:
    closed = writer.closed
    ok = writer.write(*fields_for(99))
    raw_ok = writer.write_raw(RECORD.pack(*fields_for(98)))
    writer.close()  # an inherited writer: must neither mark the ring closed nor unlink it
    conn.send((closed, ok, raw_ok))


# 1. Round trip in one process


def test_round_trip_in_one_process(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    writer = RingWriter.create(path, capacity=256)
    reader = RingReader.open(path)
    got: list[tuple[int, ...]] = []
    expected: list[tuple[int, ...]] = []
    for lap in range(5):  # 5 x 200 records through 256 slots: wraps around the end
        for seq in range(lap * 200, lap * 200 + 200):
            assert writer.write(*fields_for(seq))
            expected.append(fields_for(seq))
        assert reader.pending == 200
        got.extend(RECORD.unpack(rec) for rec in reader.read())
    assert got == expected
    assert reader.pending == 0 and reader.read() == []
    assert writer.written == 1000 and writer.dropped == 0 and reader.dropped == 0
    assert reader.writer_pid == os.getpid() and reader.capacity == 256
    reader.close()
    writer.close()
    assert not path.exists()


def test_write_raw_and_max_records(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    with RingWriter.create(path, capacity=16) as writer, RingReader.open(path) as reader:
        recs = payload_records(RecordKind.STRING, 7, b"cudagraph_support" * 5)
        assert len(recs) > 1
        for rec in recs:
            assert writer.write_raw(rec)
        assert writer.write_raw(bytearray(recs[0]))
        assert writer.write_raw(memoryview(recs[0]))
        with pytest.raises(ValueError, match="64 bytes, got 63"):
            writer.write_raw(recs[0][:63])
        assert writer.written == len(recs) + 2  # the bad record was not committed
        assert reader.read(max_records=2) == recs[:2]
        assert reader.read(max_records=0) == []
        assert reader.read() == [*recs[2:], recs[0], recs[0]]
        with pytest.raises(ValueError, match="-1"):
            reader.read(max_records=-1)


def test_bad_field_raises_and_commits_nothing(tmp_path: Path) -> None:
    with RingWriter.create(tmp_path / "ring", capacity=16) as writer:
        bad = list(fields_for(1))
        bad[1] = 256  # "a" is one byte
        with pytest.raises(Exception, match=r"format requires|not in 0\.\.255"):
            writer.write(*bad)
        assert writer.written == 0 and writer.dropped == 0
        assert writer.write(*fields_for(2))  # the lock was released


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["write", "read"]), st.integers(min_value=0, max_value=20)),
        max_size=30,
    )
)
def test_matches_a_model(ops: list[tuple[str, int]]) -> None:
    """Any interleaving of writes and reads behaves like a bounded drop-newest queue."""
    capacity = 8
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ring"
        with RingWriter.create(path, capacity) as writer, RingReader.open(path) as reader:
            queue: list[int] = []
            seq = dropped = read = 0
            for op, k in ops:
                if op == "write":
                    for _ in range(k):
                        ok = writer.write(*fields_for(seq))
                        assert ok == (len(queue) < capacity)
                        if ok:
                            queue.append(seq)
                        else:
                            dropped += 1
                        seq += 1
                else:
                    got = [RECORD.unpack(r)[7] for r in reader.read(k)]
                    assert got == queue[:k]
                    del queue[:k]
                    read += len(got)
                assert reader.pending == len(queue)
                assert writer.dropped == reader.dropped == dropped
            assert read + len(queue) + dropped == seq


# 2. A real concurrent writer process


def test_concurrent_writer_process_no_tearing_no_loss(tmp_path: Path) -> None:
    n = 200_000
    path = tmp_path / "ring"
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=writer_process, args=(str(path), n, 1024, ready, go, child_conn))
    proc.start()
    try:
        assert ready.wait(30), "writer process did not start"
        reader = RingReader.open(path)
        assert reader.writer_pid == proc.pid
        go.set()
        records: list[bytes] = []
        stop = deadline(30)
        while True:  # keep up with the writer: check the records afterwards
            closed = reader.writer_closed  # before read(): then nothing can follow it
            records += reader.read()
            if closed and reader.pending == 0:
                break
            assert time.monotonic() < stop, "writer did not finish"
        last = -1
        for rec in records:
            fields = RECORD.unpack(rec)
            seq = fields[7]
            assert fields[8] == checksum(seq), f"torn or corrupt record {fields}"
            assert fields == fields_for(seq), f"torn or corrupt record {fields}"
            assert seq > last
            last = seq
        count = len(records)
        committed, writer_dropped = parent_conn.recv()
        proc.join(30)
        assert proc.exitcode == 0
        assert count + reader.dropped == n
        assert count == committed and reader.dropped == writer_dropped
        reader.close()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_write_index_never_goes_back_as_seen_from_another_process(tmp_path: Path) -> None:
    """The index store is one 8-byte store: a reader polling it never sees 0 or a tear.

    (``struct.pack_into`` zero-fills before it writes, which this catches.)
    """
    n = 200_000
    path = tmp_path / "ring"
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=writer_process, args=(str(path), n, 1 << 18, ready, go, child_conn))
    proc.start()
    try:
        assert ready.wait(30), "writer process did not start"
        reader = RingReader.open(path)
        go.set()
        last = polls = 0
        stop = deadline(30)
        while not reader.writer_closed:
            for _ in range(1000):
                w = reader.written
                assert last <= w <= n, f"write index went from {last} to {w}"
                last = w
            polls += 1000
            assert time.monotonic() < stop, "writer did not finish"
        assert reader.written == n and polls >= 1000
        parent_conn.recv()
        proc.join(30)
        reader.close()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


# 3. The reader stalls: the writer drops, never blocks


def test_reader_stalls_writer_drops_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    capacity = 1024
    n = 100_000
    writer = RingWriter.create(path, capacity)
    reader = RingReader.open(path)
    write = writer.write
    results = [write(*fields_for(seq)) for seq in range(n)]  # returns: nothing waits
    assert results.count(True) == capacity and results[:capacity] == [True] * capacity
    assert writer.dropped == reader.dropped == n - capacity
    assert reader.pending == capacity
    got = [RECORD.unpack(rec)[7] for rec in reader.read()]
    assert got == list(range(capacity))  # drop-newest: the oldest records survive
    assert reader.read() == []
    assert write(*fields_for(n))  # reading freed the slots
    assert [RECORD.unpack(rec)[7] for rec in reader.read()] == [n]
    reader.close()
    writer.close()


def test_write_many_commits_in_order_and_counts_what_did_not_fit(tmp_path: Path) -> None:
    """The per-step batch: one lock, one publish; a full ring keeps the oldest and counts
    the rest as drops, exactly as single writes would."""
    path = tmp_path / "ring"
    with RingWriter.create(path, 16) as writer, RingReader.open(path) as reader:
        assert writer.write_many([fields_for(i) for i in range(10)]) == 10
        assert writer.write_many([]) == 0
        assert writer.write_many([fields_for(i) for i in range(10, 20)]) == 6  # 16 slots
        assert writer.dropped == reader.dropped == 4
        assert [RECORD.unpack(r)[7] for r in reader.read()] == list(range(16))
        assert writer.write_many([fields_for(99)]) == 1  # reading freed the slots
        assert [RECORD.unpack(r)[7] for r in reader.read()] == [99]
    assert writer.write_many([fields_for(1)]) == 0  # closed: refused, nothing touched


# 4. Several threads: the lock is only tried; contention is a counted drop


def test_contended_write_is_a_counted_drop(tmp_path: Path, hot_path: str) -> None:
    path = tmp_path / "ring"
    with RingWriter.create(path, 16) as writer, RingReader.open(path) as reader:
        holder = threading.Thread(target=writer._lock.acquire)
        holder.start()
        holder.join()  # another thread now holds the write lock and never releases it
        if hot_path == "compiled":
            # a compiled write runs whole under the GIL: no other thread can be inside
            # it, so it takes no lock and the held one changes nothing
            assert writer.write(*fields_for(1)) and writer.dropped == 0
            assert [RECORD.unpack(r)[7] for r in reader.read()] == [1]
            writer._lock.release()
            return
        done: list[bool] = []
        t = threading.Thread(target=lambda: done.append(writer.write(*fields_for(1))))
        t.start()
        t.join(5)
        assert done == [False]  # returned at once instead of waiting
        assert writer.write_raw(RECORD.pack(*fields_for(2))) is False
        assert writer.write_many([fields_for(4), fields_for(5)]) == 0
        assert writer.dropped == 4 and reader.pending == 0
        writer._lock.release()
        assert reader.dropped == 0  # contended drops reach the header with the next write
        assert writer.write(*fields_for(3))
        assert reader.dropped == 4
        assert [RECORD.unpack(r)[7] for r in reader.read()] == [3]


def test_two_writer_threads_account_for_every_record(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    per_thread = 100_000
    writer = RingWriter.create(path, 1024)
    reader = RingReader.open(path)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so writes collide
    committed = [0, 0]
    start = threading.Barrier(3)

    def produce(tid: int) -> None:
        write = writer.write
        start.wait()
        for i in range(per_thread):
            committed[tid] += write(RecordKind.SPAN, tid, 0, 0, 0, 0, 0, i, checksum(i), 0, 0, 0)

    threads = [threading.Thread(target=produce, args=(tid,)) for tid in (0, 1)]
    try:
        for t in threads:
            t.start()
        start.wait()
        last = [-1, -1]
        count = 0

        def consume() -> None:
            nonlocal count
            for rec in reader.read():
                _, tid, *_, i, check, _v2, _v3, _v4 = RECORD.unpack(rec)
                assert check == checksum(i) and i > last[tid]
                last[tid] = i
                count += 1

        while any(t.is_alive() for t in threads):
            consume()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old_interval)
    writer.close(unlink=False)  # folds the last contended drops into the header
    consume()
    assert reader.writer_closed
    assert count == sum(committed)
    assert count + reader.dropped == 2 * per_thread
    assert reader.dropped == writer.dropped
    reader.close()
    path.unlink()


# 5. Bad files


def _valid_ring(path: Path, capacity: int = 16) -> None:
    RingWriter.create(path, capacity).close(unlink=False)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_bytes(b""), "truncated: 0 bytes"),
        (lambda p: p.write_bytes(MAGIC + b"\0" * 20), "truncated: 28 bytes"),
        (lambda p: os.truncate(p, HEADER_SIZE + 64 * 3), "truncated: 320 bytes"),
        (lambda p: os.truncate(p, HEADER_SIZE + 64 * 17), "oversized"),
        (lambda p: _patch(p, 0, b"NOTARING"), "bad magic b'NOTARING'"),
        (lambda p: _patch(p, 8, (2).to_bytes(4, "little")), "unsupported version 2"),
        (lambda p: _patch(p, 12, (32).to_bytes(4, "little")), "record size 32"),
        (lambda p: _patch(p, 24, (12).to_bytes(8, "little")), "capacity 12"),
        (lambda p: _patch(p, 32, (17).to_bytes(8, "little")), "inconsistent indices"),
    ],
    ids=[
        "empty",
        "short-header",
        "truncated-slots",
        "oversized",
        "magic",
        "version",
        "record-size",
        "capacity",
        "indices",
    ],
)
def test_bad_file_is_a_format_error_naming_the_file(
    tmp_path: Path, damage: Any, message: str
) -> None:
    path = tmp_path / "ring"
    _valid_ring(path)
    damage(path)
    with pytest.raises(RingFormatError, match=message) as info:
        RingReader.open(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError) and info.value.path == str(path)


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_missing_file_and_existing_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        RingReader.open(tmp_path / "nope")
    path = tmp_path / "ring"
    with RingWriter.create(path, 16), pytest.raises(FileExistsError):
        RingWriter.create(path, 16)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary files left


def test_a_ring_opened_before_it_was_unlinked_is_mapped_from_its_descriptor(
    tmp_path: Path,
) -> None:
    """``probe attach`` opens each ring right after its enable and maps it later; the
    process may have unlinked it by then (its deadline): the descriptor still reads it
    whole, and is closed by ``open`` whether the ring is good or not."""
    path = tmp_path / "ring-1.shm"
    writer = RingWriter.create(path, 16)
    fd = os.open(path, OPEN_FLAGS)
    for seq in range(5):
        assert writer.write(*fields_for(seq))
    writer.close()  # unlinks the file
    assert not path.exists()
    with RingReader.open(path, fd=fd) as reader:
        assert [RECORD.unpack(r) for r in reader.read()] == [fields_for(s) for s in range(5)]
        assert reader.writer_closed and reader.path == path
    with pytest.raises(OSError):
        os.fstat(fd)
    bad = tmp_path / "not-a-ring"
    bad.write_bytes(b"x" * 64)
    fd = os.open(bad, OPEN_FLAGS)
    with pytest.raises(RingFormatError, match="truncated"):
        RingReader.open(bad, fd=fd)
    with pytest.raises(OSError):
        os.fstat(fd)


@pytest.mark.parametrize("capacity", [0, -4, 1000, 3, True, 1 << 30])
def test_capacity_must_be_a_power_of_two(tmp_path: Path, capacity: int) -> None:
    with pytest.raises(ValueError, match=str(capacity)):
        RingWriter.create(tmp_path / "ring", capacity)
    assert not (tmp_path / "ring").exists()


# 6. Heartbeat and a vanished writer


def test_heartbeat_and_writer_alive_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    ctx = mp.get_context("spawn")
    ready, touched = ctx.Event(), ctx.Event()
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=heartbeat_process, args=(str(path), ready, touched, child_conn))
    proc.start()
    try:
        assert ready.wait(30), "writer process did not start"
        reader = RingReader.open(path, clock=lambda: 111)
        assert reader.writer_pid == proc.pid
        assert reader.writer_alive()
        reader.touch_heartbeat(123_456_789)
        touched.set()
        assert parent_conn.recv() == 123_456_789
        proc.join(30)
        assert proc.exitcode == 0
        assert not reader.writer_alive()
        assert not reader.writer_closed  # it never closed: a crash, as far as we know
        [rec] = reader.read()  # what it wrote is still there
        assert RECORD.unpack(rec) == fields_for(1)
        assert int.from_bytes(path.read_bytes()[72:80], "little") == 111  # read() stamped it
        reader.close()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_heartbeat_visible_to_writer_and_pid_we_may_not_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ring"
    with RingWriter.create(path, 16) as writer, RingReader.open(path) as reader:
        assert writer.reader_heartbeat_ns == 0
        reader.touch_heartbeat(42)
        assert writer.reader_heartbeat_ns == 42
        before = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        reader.read()
        assert writer.reader_heartbeat_ns >= before

        def refuse(pid: int, sig: int) -> None:
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(os, "kill", refuse)
        assert reader.writer_alive()


def test_forked_child_does_not_write_to_the_parents_ring(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    with RingWriter.create(path, 16) as writer, RingReader.open(path) as reader:
        assert writer.write(*fields_for(1))
        ctx = mp.get_context("fork")
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=forked_child_write, args=(writer, child_conn))
        proc.start()
        assert parent_conn.recv() == (True, False, False)
        proc.join(30)
        assert proc.exitcode == 0
        assert path.exists() and not reader.writer_closed
        assert writer.write(*fields_for(2))
        assert [RECORD.unpack(r)[7] for r in reader.read()] == [1, 2]


def test_close_is_idempotent_and_later_writes_drop(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    writer = RingWriter.create(path, 16)
    reader = RingReader.open(path)
    writer.write(*fields_for(1))
    writer.close(unlink=False)
    writer.close()
    assert path.exists()  # the second close did nothing
    assert writer.write(*fields_for(2)) is False
    assert writer.write_raw(RECORD.pack(*fields_for(3))) is False
    assert reader.writer_closed and len(reader.read()) == 1
    with pytest.raises(ValueError, match="closed"):
        _ = writer.reader_heartbeat_ns
    reader.close()
    reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.read()


# 7. Permissions


def test_ring_file_and_directory_are_owner_only(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    old = os.umask(0)  # the modes must not depend on the caller's umask
    try:
        d = default_ring_dir(environ={"PROBE_RUN_DIR": str(run_dir)})
        assert d == run_dir
        with RingWriter.create(d / "ring", 16) as writer:
            assert stat.S_IMODE(os.stat(writer.path).st_mode) == 0o600
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert default_ring_dir(environ={"PROBE_RUN_DIR": str(run_dir)}) == d  # reuse is fine


def test_default_dir_prefers_shm_then_tmp(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    name = f"vllm-graph-probe-{os.getuid()}"
    assert default_ring_dir(environ={}, shm_root=shm) == shm / name
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    got = default_ring_dir(environ={}, shm_root=tmp_path / "no-shm", tmp_root=tmp)
    assert got == tmp / name and stat.S_IMODE(os.stat(got).st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_group_or_world_writable_directory_is_refused(tmp_path: Path, mode: int) -> None:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(UnsafeRingDirError, match=f"{mode:#o}") as info:
        default_ring_dir(environ={"PROBE_RUN_DIR": str(d)})
    assert isinstance(info.value, PermissionError) and str(d) in str(info.value)
    with pytest.raises(UnsafeRingDirError):
        RingWriter.create(d / "ring", 16)
    assert not (d / "ring").exists()


def test_symlinked_or_non_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(UnsafeRingDirError, match="symbolic link"):
        check_ring_dir(link)
    f = tmp_path / "file"
    f.write_bytes(b"")
    with pytest.raises(UnsafeRingDirError, match="not a directory"):
        check_ring_dir(f)
