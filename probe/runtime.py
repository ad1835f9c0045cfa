"""Process-local probe state shared by every hook in one vLLM process.

One :class:`Runtime` object per process (``RT``). Hooks read ``RT.enabled`` first and
return straight into vLLM when it is False: that is the entire idle cost. When enabled,
hooks call ``RT.write(...)`` (bound to the ring writer's ``write``) with one record.

Hooks bind ``RT`` once at import, so it is never replaced: tests call ``RT.reset()`` and
attach their own writer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from probe.records import BlobType, RecordKind, payload_records

log = logging.getLogger("probe")

BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def boottime_ns() -> int:
    """CLOCK_BOOTTIME in ns: the clock rocprofv3 and Perfetto use."""
    return time.clock_gettime_ns(BOOTTIME)


class _NullWriter:
    """Stands in when no ring is attached: every write is a drop."""

    dropped = 0

    def write(self, *fields: int) -> bool:
        self.dropped += 1
        return False

    def write_raw(self, rec: bytes) -> bool:
        self.dropped += 1
        return False


class Runtime:
    """Mutable state of the probe inside one vLLM process.

    Attributes read on the hot path are plain instance attributes (one lookup each).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Back to the state of a fresh process: disabled, no ring, nothing counted."""
        self.enabled = False
        self.writer: Any = _NullWriter()
        self.write: Callable[..., bool] = self.writer.write
        self.flush: Callable[[], None] = _nothing  # the step buffer to the ring (attach)
        self.step = 0  # step sequence number of the current/last execute_model
        self.in_step = 0  # >0 inside execute_model / sample_tokens
        self.drafter = 0  # >0 inside the MTP drafter / speculator
        self.in_build = 0
        self.pending: dict[str, Any] = {}  # runner-level context handed to inner hooks
        self.strings: dict[str, int] = {}
        self.faults: dict[str, int] = {}
        self.gpu_timing = False
        self.sample_every = 1  # record 1 engine step in N (execute_model decides)
        self.sample_n = 0
        self.sampling = False  # attached with sample_every > 1
        self.graph_ctx: Any = None  # probe.reasons.GraphContext once known
        self.static: dict[str, Any] = {}  # facts collected at startup (resolve, override)
        self.on_first_step: list[Callable[[Any], None]] = []

    # -- attachment --------------------------------------------------------------------

    def attach(self, writer: Any) -> None:
        """Route records to ``writer`` (a RingWriter) and say hello with the clock pair.

        Records written inside an engine step are held in a list and go to the ring when
        the step's outermost hook returns (``in_step`` back to 0), in one ``write_many``:
        one lock and one publish per step instead of per record, and the packing in one
        loop (inside the engine on the H200 host a record's average cost went from 3.6 to
        3.0 µs). Records outside steps go at once; a crash loses at most the step in
        flight. A writer without ``write_many`` gets every record directly.
        """
        self.flush()
        self.writer = writer
        self.write, self.flush = _step_buffer(self, writer)
        self.strings = {}
        self.write(
            RecordKind.HELLO,
            0,
            0,
            0,
            0,
            0,
            0,
            os.getpid(),
            boottime_ns(),
            time.time_ns(),
            time.perf_counter_ns(),
            0,
        )

    def detach(self) -> Any:
        self.enabled = False
        self.sampling = False
        self.flush()
        writer, self.writer = self.writer, _NullWriter()
        self.write, self.flush = self.writer.write, _nothing
        return writer

    # -- slow-path helpers (never per hooked call in steady state) ----------------------

    def intern(self, text: str) -> int:
        """Id of ``text``; the first use writes the STRING records."""
        ident = self.strings.get(text)
        if ident is None:
            ident = len(self.strings) + 1
            self.strings[text] = ident
            for rec in payload_records(RecordKind.STRING, ident, text.encode("utf-8")):
                self.writer.write_raw(rec)
        return ident

    def write_blob(self, blob_type: BlobType, data: bytes) -> None:
        for rec in payload_records(RecordKind.BLOB, 0, data, sub=int(blob_type)):
            self.writer.write_raw(rec)

    def fault(self, hook_id: str, exc: BaseException, disabled: bool) -> None:
        """Count a fault inside probe code; never raises."""
        try:
            n = self.faults.get(hook_id, 0) + 1
            self.faults[hook_id] = n
            if n == 1:
                log.warning("probe hook %s faulted (%r); disabled=%s", hook_id, exc, disabled)
            self.write(
                RecordKind.FAULT, int(disabled), 0, 0, self.intern(hook_id), 0, 0, n, 0, 0, 0, 0
            )
        except Exception:  # the probe must never raise into vLLM
            pass


def _nothing() -> None:
    pass


def _step_buffer(rt: Runtime, writer: Any) -> tuple[Callable[..., bool], Callable[[], None]]:
    """``(write, flush)`` for ``writer``: see :meth:`Runtime.attach`."""
    many = getattr(writer, "write_many", None)
    if many is None:
        return writer.write, _nothing
    buf: list[tuple[int, ...]] = []
    append = buf.append

    def flush() -> None:
        n = len(buf)
        if n:
            recs = buf[:n]
            del buf[:n]  # appends from another thread meanwhile stay for the next flush
            try:
                many(recs)
            except Exception as exc:  # a field out of range: a probe bug, never vLLM's
                rt.fault("ring.flush", exc, disabled=False)

    def write(*fields: int) -> bool:
        append(fields)
        if not rt.in_step:
            flush()
        return True

    return write, flush


RT = Runtime()
