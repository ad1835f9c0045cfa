"""The ring's producer side: one :class:`RingWriter` per instrumented process.

The file layout, the ordering rules and what a drop means are in :mod:`probe.ring`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from probe.engine import accel
from probe.records import RECORD, RECORD_SIZE
from probe.ring import (
    DEFAULT_CAPACITY,
    HEAD,
    HEADER_SIZE,
    MAGIC,
    MAX_CAPACITY,
    OFF_CLOSED,
    U32,
    VERSION,
    W_DROPPED,
    W_HEARTBEAT,
    W_READ,
    W_WRITE,
    boottime_ns,
    header_words,
)
from probe.ring_dir import check_ring_dir


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
        w_write = W_WRITE
        w_read = W_READ
        w_dropped = W_DROPPED
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
        self._words = header_words(mm)
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
            HEAD.pack_into(
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
                boottime_ns(),
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
        """The object whose functions write: a compiled ``probe.engine.accel._accel.Ring``
        (which the
        runtime stages into directly) or the pure-Python hot path."""
        return self._hot

    @property
    def compiled(self) -> bool:
        """Whether this writer runs the compiled hot path (:mod:`probe.engine.accel`)."""
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
        value: int = self._words[W_HEARTBEAT]
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
        U32.pack_into(self._mm, OFF_CLOSED, 1)
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
