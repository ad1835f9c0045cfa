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
    from probe.reader.ring_reader import RingReader
    from probe.engine.ring_writer import RingWriter

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

import mmap
import os
import struct
import sys
import time

from probe.config import MAX_RING_CAPACITY
from probe.records import RECORD_SIZE

__all__ = [
    "DEFAULT_CAPACITY",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_CAPACITY",
    "VERSION",
    "RingFormatError",
]

MAGIC = b"VGPRING1"
VERSION = 1
HEADER_SIZE = 128
DEFAULT_CAPACITY = 1 << 16
MAX_CAPACITY = MAX_RING_CAPACITY  # 1 GiB of slots; PROBE_RING_CAPACITY is checked against it

HEAD = struct.Struct("<8sIIIIQQQIIQ")  # the writer's cache line, offsets 0..63
U32 = struct.Struct("<I")
OFF_CLOSED = 48
# 8-byte header words, stored and loaded through a memoryview cast to "Q" (see "Ordering")
W_WRITE = 4
W_DROPPED = 5
W_READ = 8
W_HEARTBEAT = 9

if HEAD.size != 64 or RECORD_SIZE != 64:
    raise ImportError("probe.ring: header or record layout is not 64 bytes")
if sys.byteorder != "little" or struct.calcsize("Q") != 8:
    raise ImportError("probe.ring: needs a little-endian host with 8-byte unsigned long long")


def header_words(mm: mmap.mmap) -> memoryview:
    """The header as 16 native u64 words: item access is one aligned 8-byte memcpy.

    Not ``struct.pack_into``: it zero-fills the destination before writing the value, so
    a concurrent reader of an index could see 0.
    """
    return memoryview(mm)[:HEADER_SIZE].cast("Q")


def boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class RingFormatError(ValueError):
    """A file is not a ring this code can read: names the file and what is wrong."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{os.fspath(path)}: {problem}")
        self.path = os.fspath(path)
        self.problem = problem
