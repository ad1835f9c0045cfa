"""Per-process shared-memory ring: the transport between hooks and readers.

Each instrumented process owns one ring: a file in a private directory (``/dev/shm`` by
default, see :func:`default_ring_dir`) that the writer creates and mmaps. Hooks write
fixed 64-byte records (:mod:`probe.records`) into it; a reader in another process
(``probe attach``/``record``/``top``) mmaps the same file and drains it. The ring has a
single producer and a single consumer. When it is full the writer drops the record and
counts it: a write never blocks, never takes a lock that waits, never makes a syscall.

Usage::

    import os, tempfile
    from probe.records import RECORD, RecordKind
    from probe.ring import RingReader, RingWriter

    path = os.path.join(tempfile.mkdtemp(), "ring")
    writer = RingWriter.create(path, capacity=1024)        # in the instrumented process
    writer.write(RecordKind.SPAN, 4, 0, 0, 7, 100, 250, 0, 0, 0, 0, 0)
    reader = RingReader.open(path)                         # in the reader process
    [rec] = reader.read()
    assert RECORD.unpack(rec)[4:7] == (7, 100, 250)
    reader.close()
    writer.close()                                         # unlinks the file

File layout (little endian; the header is two 64-byte cache lines, so the line the
writer stores to on every write is not the line the reader stores to)::

    offset  size  field                owner   meaning
    0       8     magic                writer  b"VGPRING1"
    8       4     version              writer  1
    12      4     record_size          writer  64
    16      4     header_size          writer  128
    20      4     writer_pid           writer
    24      8     capacity             writer  records, a power of two
    32      8     write_index          writer  records committed so far (monotonic)
    40      8     dropped              writer  records dropped so far (see below)
    48      4     closed               writer  1 once the writer has closed the ring
    52      4     reserved
    56      8     created_ns           writer  CLOCK_BOOTTIME ns at creation
    64      8     read_index           reader  records consumed so far (monotonic)
    72      8     reader_heartbeat_ns  reader  CLOCK_BOOTTIME ns of the reader's last read
    80      48    reserved
    128     ...   capacity slots of 64 bytes; record i lives in slot i % capacity

Ordering. The writer stores the record's bytes into its slot first and the new write index
second; the reader loads the write index first, then the slots below it, then stores the
read index. On x86-64 (TSO: stores are not reordered with stores, loads not with loads,
stores not ahead of earlier loads) program order is enough. Each index is one aligned
8-byte store or load: the header words are accessed through a ``memoryview`` cast to
``"Q"`` (a fixed-size ``memcpy``), never with ``struct.pack_into``, which zero-fills its
destination before writing the value and so lets a concurrent reader see an index of 0.
On weakly ordered CPUs (aarch64, e.g. Grace) this pure-Python code has no barrier between
the slot store and the index store. Between threads of one process the GIL's
release/acquire is a full barrier, and in practice the interpreter executes atomic
operations often enough that the window is tiny, but across processes nothing here
guarantees the order: the ring is verified on x86-64 only.

Drops. ``dropped`` counts records the writer refused: the ring was full (the reader fell
behind or is gone), or another thread of the same process was inside ``write`` at that
moment (the lock is only ever tried, never waited on). Drops from contention are folded
into the header by the next write or by :meth:`RingWriter.close`, so the header value may
lag by those until then; ``RingWriter.dropped`` is always exact. After the writer closes,
records read + ``dropped`` == write calls, exactly.

Contention is not only two calls at the same instant. Under the GIL a thread can be switched
out inside ``write`` (right after the lock's ``acquire`` or the ``pack_into`` call returns)
and then holds the lock until it runs again, up to ``sys.getswitchinterval()`` (5 ms by
default): meanwhile every write from the other threads is dropped. Keep frequent writers on
one thread; a second thread that writes often should get its own ring.

Processes. A writer is not inherited: in a child created by ``fork`` every inherited
writer is closed (``closed`` is True, every write drops) without touching the parent's
file, so the ring keeps a single producer; the child creates its own ring.
``writer_alive()`` asks the kernel whether the writer pid exists; a pid can be reused, and
a zombie counts as alive until its parent reaps it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from probe import accel
from probe.records import RECORD, RECORD_SIZE
from probe.ring_dir import OPEN_FLAGS, UnsafeRingDirError, check_ring_dir, default_ring_dir

__all__ = [
    "DEFAULT_CAPACITY",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_CAPACITY",
    "OPEN_FLAGS",
    "VERSION",
    "RingFormatError",
    "RingReader",
    "RingWriter",
    "UnsafeRingDirError",
    "WriteFn",
    "WriteRawFn",
    "check_ring_dir",
    "default_ring_dir",
]

MAGIC = b"VGPRING1"
VERSION = 1
HEADER_SIZE = 128
DEFAULT_CAPACITY = 1 << 16
MAX_CAPACITY = 1 << 24  # 1 GiB of slots

_HEAD = struct.Struct("<8sIIIIQQQIIQ")  # the writer's cache line, offsets 0..63
_U32 = struct.Struct("<I")
_OFF_CLOSED = 48
# 8-byte header words, stored and loaded through a memoryview cast to "Q" (see "Ordering")
_W_WRITE = 4
_W_DROPPED = 5
_W_READ = 8
_W_HEARTBEAT = 9

if _HEAD.size != 64 or RECORD_SIZE != 64:
    raise ImportError("probe.ring: header or record layout is not 64 bytes")
if sys.byteorder != "little" or struct.calcsize("Q") != 8:
    raise ImportError("probe.ring: needs a little-endian host with 8-byte unsigned long long")


def _words(mm: mmap.mmap) -> memoryview:
    """The header as 16 native u64 words: item access is one aligned 8-byte memcpy.

    Not ``struct.pack_into``: it zero-fills the destination before writing the value, so
    a concurrent reader of an index could see 0.
    """
    return memoryview(mm)[:HEADER_SIZE].cast("Q")


def _boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class RingFormatError(ValueError):
    """A file is not a ring this code can read: names the file and what is wrong."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{os.fspath(path)}: {problem}")
        self.path = os.fspath(path)
        self.problem = problem


class WriteFn(Protocol):
    def __call__(
        self,
        kind: int,
        a: int,
        b: int,
        c: int,
        step: int,
        t0: int,
        t1: int,
        v0: int,
        v1: int,
        v2: int,
        v3: int,
        v4: int,
    ) -> bool: ...


class WriteRawFn(Protocol):
    def __call__(self, rec: bytes | bytearray | memoryview) -> bool: ...


def _refuse(*_args: object, **_kwargs: object) -> bool:
    return False


def _refuse_many(_recs: object) -> int:
    return 0


class _HotPath:
    """The writer's state and its write functions, built once per ring.

    The functions are closures over locals (cell loads are cheaper than attribute loads
    on the hot path); ``write``/``write_raw`` are the only code that runs inside vLLM.
    """

    def __init__(
        self, mm: mmap.mmap, words: memoryview, capacity: int, lock: threading.Lock
    ) -> None:
        acquire = lock.acquire
        release = lock.release
        pack_record = RECORD.pack_into
        get_ident = threading.get_ident
        mask = capacity - 1
        base = HEADER_SIZE
        size = RECORD_SIZE
        w_write = _W_WRITE
        w_read = _W_READ
        w_dropped = _W_DROPPED
        w = 0  # write index; changed only by the lock holder
        r = 0  # last read index seen; re-read from the header only when the ring looks full
        full_drops = 0  # changed only by the lock holder
        contended: dict[int, list[int]] = {}  # thread id -> [drops]; each cell has one writer
        contended_folded = 0  # the cells' sum when the lock holder last added them up
        dirty = False  # a contended drop happened since then

        def fold() -> int:  # the lock holder: refresh the contended sum, return the total
            nonlocal dirty, contended_folded
            dirty = False  # before summing: a drop counted after this sets it again
            contended_folded = sum(cell[0] for cell in list(contended.values()))
            return full_drops + contended_folded

        def total_dropped() -> int:
            return full_drops + sum(cell[0] for cell in list(contended.values()))

        def drop_contended(n: int = 1) -> bool:  # without the lock: only this thread's cell
            nonlocal dirty
            ident = get_ident()
            cell = contended.get(ident)
            if cell is None:
                cell = contended[ident] = [0]
            cell[0] += n
            dirty = True
            return False

        def write(
            kind: int,
            a: int,
            b: int,
            c: int,
            step: int,
            t0: int,
            t1: int,
            v0: int,
            v1: int,
            v2: int,
            v3: int,
            v4: int,
        ) -> bool:
            nonlocal w, r, full_drops
            if not acquire(False):
                return drop_contended()
            try:
                if w - r >= capacity:
                    r = words[w_read]
                    if w - r >= capacity:
                        full_drops += 1
                        words[w_dropped] = fold() if dirty else full_drops + contended_folded
                        return False
                pack_record(
                    mm, base + (w & mask) * size, kind, a, b, c, step, t0, t1, v0, v1, v2, v3, v4
                )
                w += 1
                words[w_write] = w  # publish after the slot (see "Ordering")
                if dirty:
                    words[w_dropped] = fold()
                return True
            finally:
                release()

        def write_raw(rec: bytes | bytearray | memoryview) -> bool:
            nonlocal w, r, full_drops
            if not acquire(False):
                return drop_contended()
            try:
                if w - r >= capacity:
                    r = words[w_read]
                    if w - r >= capacity:
                        full_drops += 1
                        words[w_dropped] = fold() if dirty else full_drops + contended_folded
                        return False
                off = base + (w & mask) * size
                try:
                    mm[off : off + size] = rec
                except IndexError:
                    raise ValueError(f"a raw record must be {size} bytes, got {len(rec)}") from None
                w += 1
                words[w_write] = w
                if dirty:
                    words[w_dropped] = fold()
                return True
            finally:
                release()

        def write_many(recs: Sequence[tuple[int, ...]]) -> int:
            """``write(*rec)`` for each, under one lock and one publish; returns how many
            were committed (the rest are counted as drops)."""
            nonlocal w, r, full_drops
            if not acquire(False):
                drop_contended(len(recs))
                return 0
            try:
                n = 0
                for rec in recs:
                    if w - r >= capacity:
                        r = words[w_read]
                        if w - r >= capacity:
                            full_drops += len(recs) - n
                            words[w_dropped] = fold() if dirty else full_drops + contended_folded
                            break
                    pack_record(mm, base + (w & mask) * size, *rec)
                    w += 1
                    n += 1
                words[w_write] = w  # publish after the slots (see "Ordering")
                if dirty:
                    words[w_dropped] = fold()
                return n
            finally:
                release()

        def publish_dropped() -> None:  # the lock holder
            words[w_dropped] = fold()

        def written() -> int:
            return w

        self.write: WriteFn = write
        self.write_raw: WriteRawFn = write_raw
        self.write_many: Callable[[Sequence[tuple[int, ...]]], int] = write_many
        self.total_dropped: Callable[[], int] = total_dropped
        self.publish_dropped: Callable[[], None] = publish_dropped
        self.written: Callable[[], int] = written


_LIVE_WRITERS: weakref.WeakSet[RingWriter] = weakref.WeakSet()


def _disown_inherited_writers() -> None:
    for writer in list(_LIVE_WRITERS):
        writer._disown()


os.register_at_fork(after_in_child=_disown_inherited_writers)


class RingWriter:
    """The producer side: one per instrumented process, created with :meth:`create`.

    ``write(kind, a, b, c, step, t0, t1, v0, v1, v2, v3, v4) -> bool`` packs one record
    (the fields of :data:`probe.records.RECORD`) into the next slot; ``write_raw(rec)``
    copies a pre-packed 64-byte record (STRING/BLOB chunks). Both return False and count
    a drop when the ring is full or another thread is writing, and raise only for bad
    arguments (``struct.error`` for a field out of range, ``ValueError`` for a raw record
    that is not 64 bytes), writing nothing. After :meth:`close` they return False.
    ``write_many(recs)`` writes a sequence of field tuples under one lock and one publish
    (the probe's per-step buffer) and returns how many it committed.
    """

    __slots__ = (
        "__weakref__",
        "_capacity",
        "_closed",
        "_hot",
        "_lock",
        "_mm",
        "_path",
        "_words",
        "write",
        "write_many",
        "write_raw",
    )

    write: WriteFn
    write_raw: WriteRawFn
    write_many: Callable[[Sequence[tuple[int, ...]]], int]

    def __init__(self, path: Path, mm: mmap.mmap, capacity: int) -> None:
        """Use :meth:`create`."""
        self._path = path
        self._mm = mm
        self._words = _words(mm)
        self._capacity = capacity
        self._lock = threading.Lock()
        compiled = accel.make_ring(mm, capacity)
        self._hot: Any = (
            compiled if compiled is not None else _HotPath(mm, self._words, capacity, self._lock)
        )
        self._closed = False
        self.write = self._hot.write
        self.write_raw = self._hot.write_raw
        self.write_many = self._hot.write_many
        _LIVE_WRITERS.add(self)

    @classmethod
    def create(cls, path: str | os.PathLike[str], capacity: int = DEFAULT_CAPACITY) -> RingWriter:
        """Create the ring file at ``path`` (mode 0o600; it must not exist) and map it.

        The parent directory must pass :func:`check_ring_dir`. The file appears at
        ``path`` fully initialised (it is built under a temporary name and hard-linked),
        so a reader never sees a half-written header.
        """
        if (
            isinstance(capacity, bool)
            or not isinstance(capacity, int)
            or capacity <= 0
            or capacity & (capacity - 1)
        ):
            raise ValueError(f"capacity must be a positive power of two, got {capacity!r}")
        if capacity > MAX_CAPACITY:
            raise ValueError(f"capacity must be at most {MAX_CAPACITY}, got {capacity}")
        final = Path(path)
        check_ring_dir(final.parent)
        size = HEADER_SIZE + capacity * RECORD_SIZE
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(tmp, flags, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the umask can only have narrowed it; make it exact
            os.ftruncate(fd, size)
            # MAP_POPULATE faults every page in now, so the first lap of writes does not
            # take a page fault per 64 records.
            populate = getattr(mmap, "MAP_POPULATE", 0)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED | populate, mmap.PROT_READ | mmap.PROT_WRITE)
            _HEAD.pack_into(
                mm,
                0,
                MAGIC,
                VERSION,
                RECORD_SIZE,
                HEADER_SIZE,
                os.getpid(),
                capacity,
                0,
                0,
                0,
                0,
                _boottime_ns(),
            )
            try:
                os.link(tmp, final)  # fails if ``path`` exists, like O_EXCL
            except BaseException:
                mm.close()
                raise
        finally:
            os.close(fd)
            os.unlink(tmp)
        return cls(final, mm, capacity)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def hot(self) -> Any:
        """The object whose functions write: a compiled ``probe._accel.Ring`` (which the
        runtime stages into directly) or the pure-Python hot path."""
        return self._hot

    @property
    def compiled(self) -> bool:
        """Whether this writer runs the compiled hot path (:mod:`probe.accel`)."""
        return accel.is_compiled_ring(self._hot)

    @property
    def written(self) -> int:
        """Records committed so far (the write index)."""
        return int(self._hot.written())

    @property
    def dropped(self) -> int:
        """Records dropped so far, exact (full ring and contended writes)."""
        return int(self._hot.total_dropped())

    @property
    def reader_heartbeat_ns(self) -> int:
        """CLOCK_BOOTTIME ns of the reader's last read; 0 if no reader has read yet."""
        self._check_open()
        value: int = self._words[_W_HEARTBEAT]
        return value

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, unlink: bool = True) -> None:
        """Stop writing, mark the ring closed for the reader, unmap, and unlink the file.

        With ``unlink=False`` the file stays for a reader to drain. Idempotent. Takes the
        write lock (waiting: this is not the hot path) and keeps it, so a thread still
        holding the old ``write`` drops instead of touching the unmapped file.
        """
        if self._closed:
            return
        self._closed = True
        self.write = _refuse
        self.write_raw = _refuse
        self.write_many = _refuse_many
        self._lock.acquire()
        self._hot.publish_dropped()
        release = getattr(self._hot, "release", None)
        if release is not None:  # the compiled ring lets go of the mapping first
            release()
        _U32.pack_into(self._mm, _OFF_CLOSED, 1)
        self._unmap()
        _LIVE_WRITERS.discard(self)
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)

    def _unmap(self) -> None:
        self._words.release()
        self._mm.close()

    def _disown(self) -> None:
        """In a forked child: closed from the start; drops everything, never touches the
        parent's ring (the child's own mapping goes with this object)."""
        self._closed = True
        self.write = _refuse
        self.write_raw = _refuse
        self.write_many = _refuse_many
        disown = getattr(self._hot, "disown", None)
        if disown is not None:
            disown()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"ring {self._path} is closed")

    def __enter__(self) -> RingWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"written={self.written} dropped={self.dropped}"
        return f"<RingWriter {self._path} capacity={self._capacity} {state}>"


class RingReader:
    """The consumer side: maps a ring another process created and drains it.

    One reader per ring (the read index is the reader's alone). ``clock`` stamps the
    reader heartbeat on every :meth:`read`; it defaults to CLOCK_BOOTTIME.
    """

    __slots__ = ("_capacity", "_clock", "_closed", "_mask", "_mm", "_path", "_read", "_words")

    def __init__(self, path: Path, mm: mmap.mmap, capacity: int, clock: Callable[[], int]) -> None:
        """Use :meth:`open`."""
        self._path = path
        self._mm = mm
        self._capacity = capacity
        self._mask = capacity - 1
        self._clock = clock
        self._closed = False
        self._words = _words(mm)
        self._read: int = self._words[_W_READ]

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], int] = _boottime_ns,
        fd: int | None = None,
    ) -> RingReader:
        """Map the ring at ``path``; raises :class:`RingFormatError` if it is not one.

        ``fd``: the ring at ``path`` already open read-write (:data:`OPEN_FLAGS`), as
        ``probe attach`` opens it right after its enable; it is mapped from that
        descriptor, even where the file has been unlinked since, and closed here.
        """
        p = Path(path)
        if fd is None:
            fd = os.open(p, OPEN_FLAGS)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise RingFormatError(
                    p, f"truncated: {size} bytes, shorter than the {HEADER_SIZE}-byte header"
                )
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        try:
            capacity = cls._validate(p, mm, size)
        except BaseException:
            mm.close()
            raise
        return cls(p, mm, capacity, clock)

    @staticmethod
    def _validate(p: Path, mm: mmap.mmap, size: int) -> int:
        magic, version, record_size, header_size, _pid, capacity, w, *_ = _HEAD.unpack_from(mm)
        if magic != MAGIC:
            raise RingFormatError(p, f"bad magic {magic!r}, expected {MAGIC!r}")
        if version != VERSION:
            raise RingFormatError(p, f"unsupported version {version}, expected {VERSION}")
        if record_size != RECORD_SIZE:
            raise RingFormatError(p, f"record size {record_size}, expected {RECORD_SIZE}")
        if header_size != HEADER_SIZE:
            raise RingFormatError(p, f"header size {header_size}, expected {HEADER_SIZE}")
        if capacity <= 0 or capacity & (capacity - 1) or capacity > MAX_CAPACITY:
            raise RingFormatError(p, f"capacity {capacity} is not a power of two in range")
        expected = HEADER_SIZE + capacity * RECORD_SIZE
        if size != expected:
            what = "truncated" if size < expected else "oversized"
            raise RingFormatError(
                p, f"{what}: {size} bytes, expected {expected} for capacity {capacity}"
            )
        r = int.from_bytes(mm[8 * _W_READ : 8 * _W_READ + 8], "little")
        if not 0 <= w - r <= capacity:
            raise RingFormatError(p, f"inconsistent indices: write {w}, read {r}")
        return int(capacity)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def written(self) -> int:
        """Records the writer has committed so far (the write index)."""
        self._check_open()
        value: int = self._words[_W_WRITE]
        return value

    @property
    def pending(self) -> int:
        """Committed records not read yet."""
        return self.written - self._read

    @property
    def dropped(self) -> int:
        """Records the writer dropped, as published in the header (see "Drops")."""
        self._check_open()
        value: int = self._words[_W_DROPPED]
        return value

    @property
    def writer_pid(self) -> int:
        self._check_open()
        value: int = _HEAD.unpack_from(self._mm)[4]
        return value

    @property
    def writer_closed(self) -> bool:
        """True once the writer called ``close()``: nothing more will be committed."""
        self._check_open()
        return bool(_U32.unpack_from(self._mm, _OFF_CLOSED)[0])

    @property
    def created_ns(self) -> int:
        self._check_open()
        value: int = _HEAD.unpack_from(self._mm)[10]
        return value

    def writer_alive(self) -> bool:
        """Whether the writer's pid exists (a pid we may not signal counts as alive)."""
        try:
            os.kill(self.writer_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def touch_heartbeat(self, now_ns: int | None = None) -> None:
        """Store ``now_ns`` (default: the reader's clock) as the reader heartbeat."""
        self._check_open()
        self._words[_W_HEARTBEAT] = self._clock() if now_ns is None else now_ns

    def read(self, max_records: int | None = None) -> list[bytes]:
        """Copy out up to ``max_records`` committed records (all, by default), in order.

        Advances the read index past them, which frees their slots for the writer, and
        stamps the heartbeat.
        """
        block = self.read_block(max_records)
        return [block[i : i + RECORD_SIZE] for i in range(0, len(block), RECORD_SIZE)]

    def read_block(self, max_records: int | None = None) -> bytes:
        """As :meth:`read`, the records in one ``bytes`` (64 bytes each, in order): one
        copy per call, however many records (the cheap drain of ``probe attach``)."""
        if max_records is not None and max_records < 0:
            raise ValueError(f"max_records must be >= 0 or None, got {max_records}")
        self._check_open()
        mm = self._mm
        w: int = self._words[_W_WRITE]  # load the index before the slots
        r = self._read
        n = w - r
        if n < 0 or n > self._capacity:
            raise RingFormatError(self._path, f"inconsistent indices: write {w}, read {r}")
        if max_records is not None and n > max_records:
            n = max_records
        block = b""
        if n:
            start = r & self._mask
            end = start + n
            size = RECORD_SIZE
            if end <= self._capacity:
                block = mm[HEADER_SIZE + start * size : HEADER_SIZE + end * size]
            else:
                block = (
                    mm[HEADER_SIZE + start * size : HEADER_SIZE + self._capacity * size]
                    + mm[HEADER_SIZE : HEADER_SIZE + (end - self._capacity) * size]
                )
            self._read = r + n
            self._words[_W_READ] = self._read  # after the copies: frees the slots
        self.touch_heartbeat()
        return block

    def close(self) -> None:
        """Unmap the ring (the file stays; the writer owns it). Idempotent."""
        if not self._closed:
            self._closed = True
            self._words.release()
            self._mm.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"ring reader for {self._path} is closed")

    def __enter__(self) -> RingReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RingReader {self._path} capacity={self._capacity} read={self._read}>"
