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
        """Route records to ``writer`` (a RingWriter) and say hello with the clock pair."""
        self.writer = writer
        self.write = writer.write
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
        writer, self.writer = self.writer, _NullWriter()
        self.write = self.writer.write
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


RT = Runtime()
