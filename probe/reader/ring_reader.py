"""The ring's consumer side: :class:`RingReader` maps a ring another process created.

The file layout, the ordering rules and what a drop means are in :mod:`probe.ring`.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from probe.records import RECORD_SIZE
from probe.ring import (
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
    RingFormatError,
    boottime_ns,
    header_words,
)
from probe.ring_dir import OPEN_FLAGS


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
        self._words = header_words(mm)
        self._read: int = self._words[W_READ]

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], int] = boottime_ns,
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
        magic, version, record_size, header_size, _pid, capacity, w, *_ = HEAD.unpack_from(mm)
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
        r = int.from_bytes(mm[8 * W_READ : 8 * W_READ + 8], "little")
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
        value: int = self._words[W_WRITE]
        return value

    @property
    def pending(self) -> int:
        """Committed records not read yet."""
        return self.written - self._read

    @property
    def dropped(self) -> int:
        """Records the writer dropped, as published in the header (see "Drops")."""
        self._check_open()
        value: int = self._words[W_DROPPED]
        return value

    @property
    def writer_pid(self) -> int:
        self._check_open()
        value: int = HEAD.unpack_from(self._mm)[4]
        return value

    @property
    def writer_closed(self) -> bool:
        """True once the writer called ``close()``: nothing more will be committed."""
        self._check_open()
        return bool(U32.unpack_from(self._mm, OFF_CLOSED)[0])

    @property
    def created_ns(self) -> int:
        self._check_open()
        value: int = HEAD.unpack_from(self._mm)[10]
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
        self._words[W_HEARTBEAT] = self._clock() if now_ns is None else now_ns

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
        w: int = self._words[W_WRITE]  # load the index before the slots
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
            self._words[W_READ] = self._read  # after the copies: frees the slots
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
