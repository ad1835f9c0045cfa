"""Process-local probe state shared by every hook in one vLLM process.

One :class:`Runtime` object per process (``RT``). Hooks read ``RT.enabled`` first and
return straight into vLLM when it is False: that is the entire idle cost (on the compiled
path, :mod:`probe.engine.accel`, that check runs in C before any Python frame). When enabled,
hooks write one record with the packer of its kind, ``RT.put.span(...)``,
``RT.put.dispatch(...)`` (declared in :mod:`probe.records`).

The hot fields (``enabled``, ``step``, ``in_step``, ``drafter``, ...) live in the base
class, :data:`probe.engine.accel.Core`: C fields on the compiled path, so compiled wrappers read
them without a lookup.

Hooks bind ``RT`` once at import, so it is never replaced: tests call ``RT.reset()`` and
attach their own writer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from probe import config
from probe.engine import accel
from probe.records import BlobType, Packers, RecordKind, packers, payload_records

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


class Runtime(accel.Core):  # type: ignore[misc]
    """Mutable state of the probe inside one vLLM process.

    The fields read on every hooked call are the base class's (see the module doc); the
    rest are plain instance attributes.
    """

    put: Packers

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Back to the state of a fresh process: disabled, no ring, nothing counted."""
        for name, value in accel.HOT_FIELDS.items():
            setattr(self, name, value)
        self.writer: Any = _NullWriter()
        self.write: Callable[..., bool] = self.writer.write  # 12 wire values (slow paths)
        self.put = packers(self.write)
        self.flush: Callable[[], None] = _nothing  # the step buffer to the ring (attach)
        self.hot_path = "python"  # which path the attached writer runs
        self.clock = "boottime"  # what its timestamps read (probe.engine.accel.set_clock)
        self.clock_why = ""  # why not the TSC, where not
        self.strings: dict[str, int] = {}
        self.faults: dict[str, int] = {}
        self.graph_ctx: Any = None  # probe.reasons.GraphContext once known
        self.static: dict[str, Any] = {}  # facts collected at startup (resolve, override)
        self.on_first_step: list[Callable[[Any], None]] = []
        # the GPU timer's tick (probe.engine.hooks.step.GpuTimer) while it runs: the compiled
        # hooks call it on the timer's steps
        self.timer_tick: Callable[[int], None] | None = None

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
        hot = getattr(writer, "hot", None)
        if accel.can_bind(self, hot):
            self.put, self.write, self.flush = accel.bind_packers(self, hot)
            self.hot_path = "compiled"
            try:
                setting = config.clock_setting()
            except config.ConfigError as exc:  # checked by probe record; a stray value here
                log.warning("probe: %s; reading clock_gettime", exc)
                setting = "boottime"
            self.clock, self.clock_why = accel.set_clock(setting)
            self.clock_tsc = int(self.clock == "tsc")
        else:
            self.write, self.flush = _step_buffer(self, writer)
            self.put = packers(self.write)
            self.hot_path = "python"
            self.clock, self.clock_why = "boottime", "the pure-Python path"
            self.clock_tsc = 0
        self.strings = {}
        self.put.hello(
            os.getpid(),
            boottime_ns(),
            time.time_ns(),
            time.perf_counter_ns(),
            int(self.hot_path == "compiled"),
        )

    def detach(self) -> Any:
        self.enabled = False
        self.sampling = False
        self.timer_every = 0
        self.timer_tick = None
        self.flush()
        writer, self.writer = self.writer, _NullWriter()
        hot = getattr(writer, "hot", None)
        if hot is not None and accel.can_bind(self, hot):
            hot.unbind()
        self.write, self.flush = self.writer.write, _nothing
        self.put = packers(self.write)
        self.hot_path = "python"
        return writer

    def _forked(self) -> None:
        """In a child created by ``fork``: the parent's ring is not ours. Drop what was
        staged, stop writing, and keep nothing of the parent's writer."""
        self.enabled = False
        self.sampling = False
        hot = getattr(self.writer, "hot", None)
        if hot is not None and accel.can_bind(self, hot):
            hot.disown()
        self.writer = _NullWriter()
        self.write, self.flush = self.writer.write, _nothing
        self.put = packers(self.write)

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
            self.put.fault(self.intern(hook_id), n, disabled)
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
os.register_at_fork(after_in_child=RT._forked)
