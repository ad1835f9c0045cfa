"""The reader side: rings -> decoded records -> steps -> sinks (recording, live views).

A :class:`Collector` watches a run directory for rings (``ring-<pid>.shm``), reads each
ring, decodes and assembles its records per process, and hands finished steps to its
sinks. It runs entirely in the reader process (``probe record``, ``probe attach``): none of
this work happens inside vLLM.

    >>> col = Collector(run_dir, sinks=[RecordingSink(writer)])    # doctest: +SKIP
    >>> while child_running: col.poll(); time.sleep(0.05)          # doctest: +SKIP
    >>> col.close()                                                # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from probe.reader.assemble import StepAssembler
from probe.reader.recording import RecordingWriter
from probe.reader.ring_reader import RingReader
from probe.records import RECORD_SIZE, BlobType, Decoder, Hello
from probe.ring import RingFormatError
from probe.step import GpuSample, Step

log = logging.getLogger("probe")

RING_RE = re.compile(r"^ring-(\d+)\.shm$")
SPOOL_BYTES = 64 << 20  # per process: about a million records, minutes of a busy engine
ASSEMBLE_CHUNK = 1024
"""Records decoded and assembled at once under a time budget (``Collector(assemble_s=...)``):
about a hundred steps, a few ms. The sinks' work per batch has a fixed part (the steady
split's vectorised pass, a recording's inserts) that in batches of a few steps cost more
than the steps themselves."""


class Spool:
    """Records read from a ring and not decoded yet, in order: the blocks as the ring
    gave them (one copy each, no per-record work) until :meth:`take` splits them."""

    def __init__(self) -> None:
        self._blocks: deque[bytes] = deque()
        self._times: deque[float] = deque()  # when each block was read from the ring
        self._head = 0  # bytes of the first block already taken
        self.nbytes = 0

    def __len__(self) -> int:
        return self.nbytes // RECORD_SIZE

    def append(self, block: bytes, at: float = 0.0) -> None:
        if block:
            self._blocks.append(block)
            self._times.append(at)
            self.nbytes += len(block)

    @property
    def oldest_at(self) -> float | None:
        """When the oldest record still here was read from the ring (None: empty)."""
        return self._times[0] if self._times else None

    def take(self, n: int) -> list[bytes]:
        """Up to ``n`` records, oldest first."""
        out: list[bytes] = []
        size = RECORD_SIZE
        while len(out) < n and self._blocks:
            block, head = self._blocks[0], self._head
            end = min(len(block), head + (n - len(out)) * size)
            out.extend(block[i : i + size] for i in range(head, end, size))
            self.nbytes -= end - head
            if end >= len(block):
                self._blocks.popleft()
                self._times.popleft()
                self._head = 0
            else:
                self._head = end
        return out


class Sink(Protocol):
    """Anything that consumes steps; exporters implement this too.

    ``on_steps`` gets each finished step once, and each device timing once (``gpu``: the
    timings that arrived since the last call, for steps already delivered or in
    ``steps``; either may be empty). A sink may also define ``tick()``, called once per
    poll (for periodic work such as committing). A sink that raises is reported in
    ``Collector.errors``; the reader goes on.
    """

    def on_process(self, proc: ProcessState) -> None: ...

    def on_steps(
        self, proc: ProcessState, steps: Sequence[Step], gpu: Sequence[GpuSample]
    ) -> None: ...

    def close(self) -> None: ...


@dataclass
class ProcessState:
    """What the reader knows about one vLLM process."""

    pid: int
    path: Path
    reader: RingReader
    decoder: Decoder = field(default_factory=Decoder)
    assembler: StepAssembler | None = None
    snapshot: dict[str, Any] | None = None
    steps_seen: int = 0
    forward_seen: int = 0
    """Steps that ran a forward (``steps_total`` counts these; the others are the
    engine's steps with nothing scheduled, or captures outside a forward)."""
    dropped: int = 0
    announced: bool = False
    spool: Spool = field(default_factory=Spool)
    """Records read from the ring, not yet decoded (``Collector(assemble_s=...)``)."""

    @property
    def hello(self) -> Hello | None:
        return self.decoder.hello

    @property
    def builder_names(self) -> dict[int, str]:
        """The ring's string table: builder class names by id (``Build.builder_id``)."""
        return dict(self.decoder.strings)

    @property
    def hook_faults(self) -> int:
        """Faults counted inside this process's hooks so far."""
        a = self.assembler
        return sum(f.count for f in a.faults.values()) if a is not None else 0

    @property
    def rank_label(self) -> str:
        s = self.snapshot or {}
        return (
            f"tp{s.get('tp_rank') or 0}"
            + (f"/pp{s['pp_rank']}" if s.get("pp_rank") else "")
            + (f"/dp{s['dp_rank']}" if s.get("dp_rank") else "")
        )


class Collector:
    def __init__(
        self,
        run_dir: str | Path | None = None,
        sinks: Iterable[Sink] = (),
        *,
        rings: Iterable[str | Path] = (),
        ring_fds: Mapping[Path, int] | None = None,
        now_ns: Callable[[], int] | None = None,
        batch: int = 4096,
        assemble_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        spool_bytes: int = SPOOL_BYTES,
    ) -> None:
        """``assemble_s``: the reader's split for a busy host. ``None`` (the default):
        each poll decodes, assembles and hands on what it read. A number: each poll
        first drains every ring into an in-memory :class:`Spool` (one copy per ring:
        cheap, so the rings do not fill and the heartbeat stays fresh however little CPU
        the reader gets), then decodes, assembles and feeds the sinks for at most that
        many seconds (0: not at all); the rest waits for the next poll or
        :meth:`assemble`, and :meth:`close` finishes it after the engine has been
        detached. A process's spool holds at most ``spool_bytes``; beyond that the
        reader leaves the records in the ring, which drops and counts what does not
        fit, as it does for any reader that falls behind.

        ``ring_fds``: rings of ``rings`` already open, by path
        (:data:`probe.ring_dir.OPEN_FLAGS`), as ``probe attach`` opens them right after
        its enable, before it imports this module: each is mapped from its descriptor
        (a ring unlinked since is read whole all the same); the collector owns them and
        closes every one."""
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.sinks = list(sinks)
        self.procs: dict[int, ProcessState] = {}
        self.batch = batch
        self.assemble_s = assemble_s
        self.spool_bytes = spool_bytes
        self._clock = clock
        self._now = now_ns
        self._explicit = [Path(r) for r in rings]
        self._fds = {Path(p): fd for p, fd in (ring_fds or {}).items()}
        self.errors: list[str] = []
        #: the ring files that could not be opened (not a ring, damaged, unreadable), with
        #: why; one that opens later leaves this
        self.skipped: dict[Path, str] = {}
        #: at most this many records assembled a second (None: as many as the budget
        #: allows): a cap on the reader's CPU; beyond it the reader falls behind
        self.drain_rate: float | None = None
        self._allowance = 0.0
        self._allowance_at: float | None = None

    def discover(self) -> None:
        paths = list(self._explicit)
        if self.run_dir is not None and self.run_dir.is_dir():
            paths += [p for p in self.run_dir.iterdir() if RING_RE.match(p.name)]
        for p in paths:
            m = RING_RE.match(p.name)
            pid = int(m.group(1)) if m else hash(str(p)) & 0x7FFFFFFF
            if pid in self.procs:
                continue
            try:
                reader = RingReader.open(p, fd=self._fds.pop(p, None))
            except (RingFormatError, OSError) as exc:
                msg = f"{p}: {exc}"
                if msg not in self.errors:
                    self.errors.append(msg)
                self.skipped[p] = str(exc)
                continue
            self.skipped.pop(p, None)
            self.procs[pid] = ProcessState(pid, p, reader, assembler=StepAssembler(pid))

    def poll(self) -> int:
        """Read every ring once; returns the number of records read."""
        self.discover()
        total = 0
        if self.assemble_s is None:
            for proc in list(self.procs.values()):
                total += self._drain(proc)
            return total
        for proc in list(self.procs.values()):
            total += self._spool(proc)
        if self.assemble_s > 0:
            self.assemble(self.assemble_s)
        return total

    @property
    def spooled(self) -> int:
        """Records read from the rings and not assembled yet."""
        return sum(len(p.spool) for p in self.procs.values())

    def _spool(self, proc: ProcessState) -> int:
        """Copy what is committed in the ring into the spool (no decoding), up to the
        spool's bound."""
        room = max(0, self.spool_bytes - proc.spool.nbytes) // RECORD_SIZE
        block = proc.reader.read_block(room)
        proc.spool.append(block, self._clock())
        n = len(block) // RECORD_SIZE
        if self._now is not None:
            proc.reader.touch_heartbeat(self._now())
        proc.dropped = proc.reader.dropped
        return n

    def assemble(self, budget_s: float | None = None) -> int:
        """Decode and assemble spooled records (all, or for about ``budget_s``).

        Under a budget, a chunk at a time from the process whose oldest spooled record
        has waited longest, so no ring's backlog starves behind another's; with
        :attr:`drain_rate`, no more records than it allows since the last call."""
        if budget_s is None:
            done = 0
            for proc in list(self.procs.values()):
                while proc.spool:
                    recs = proc.spool.take(4096)
                    self._assemble(proc, recs)
                    done += len(recs)
                self._announce(proc)
            self._each_sink("tick")
            return done
        now = self._clock()
        t_end = now + budget_s
        allowed = self._allowed(now)
        done = 0
        while allowed is None or done < allowed:
            behind = [p for p in self.procs.values() if p.spool]
            if not behind:
                break
            proc = min(behind, key=lambda p: p.spool.oldest_at or 0.0)
            n = ASSEMBLE_CHUNK if allowed is None else min(ASSEMBLE_CHUNK, allowed - done)
            recs = proc.spool.take(n)
            self._assemble(proc, recs)
            done += len(recs)
            if self._clock() >= t_end:
                break
        if allowed is not None:
            self._allowance -= done
        for proc in list(self.procs.values()):
            self._announce(proc)
        self._each_sink("tick")
        return done

    def _allowed(self, now: float) -> int | None:
        """Records :attr:`drain_rate` allows now (None: no cap): its rate since the last
        call, at most one second's worth saved up."""
        rate = self.drain_rate
        if rate is None:
            return None
        last = self._allowance_at if self._allowance_at is not None else now
        self._allowance = min(rate, self._allowance + rate * (now - last))
        self._allowance_at = now
        return max(0, int(self._allowance))

    def lag(self, pid: int) -> tuple[int, float]:
        """How far behind ``pid``'s ring the reader is: the records written and not yet
        assembled (in the ring and in the spool), and the seconds its oldest spooled
        record has waited since it was read (0 with an empty spool)."""
        proc = self.procs.get(pid)
        if proc is None:
            return 0, 0.0
        try:
            pending = proc.reader.pending
        except ValueError:  # unmapped
            pending = 0
        at = proc.spool.oldest_at
        return pending + len(proc.spool), (self._clock() - at) if at is not None else 0.0

    def _assemble(self, proc: ProcessState, recs: Sequence[bytes]) -> None:
        assembler = proc.assembler
        assert assembler is not None
        out: list[Step] = []
        for rec in recs:
            try:
                decoded = proc.decoder.feed(rec)
            except (ValueError, KeyError) as exc:  # an unknown enum value: skip, count
                self._error(f"pid {proc.pid}: undecodable record ({exc})")
                continue
            if decoded is not None:
                out.extend(assembler.feed(decoded))
        if proc.decoder.blobs or (not proc.announced and proc.hello is not None):
            # the snapshot (written at the first step) before the steps that follow it:
            # a sink labels a process's series from its first step on, never without it
            self._announce(proc)
        self._deliver(proc, out)

    def _drain(self, proc: ProcessState) -> int:
        """Read at most one ring's worth of records, handing steps on batch by batch.

        Bounded per poll: a writer faster than the reader cannot keep the reader inside
        one call (the ring drops instead, and counts it), and memory holds one batch.
        """
        n = 0
        assembler = proc.assembler
        assert assembler is not None
        budget = max(self.batch, proc.reader.capacity // 4)
        while n < budget:
            recs = proc.reader.read(min(self.batch, budget - n))
            if not recs:
                break
            n += len(recs)
            self._assemble(proc, recs)
            if len(recs) < self.batch:
                break
        if self._now is not None:
            proc.reader.touch_heartbeat(self._now())
        proc.dropped = proc.reader.dropped
        self._announce(proc)
        self._each_sink("tick")
        return n

    def _deliver(self, proc: ProcessState, steps: list[Step]) -> None:
        assert proc.assembler is not None
        gpu = [GpuSample.of(g) for g in proc.assembler.take_gpu()]
        if steps or gpu:
            proc.steps_seen += len(steps)
            proc.forward_seen += sum(1 for s in steps if s.forward)
            self._each_sink("on_steps", proc, steps, gpu)

    def _error(self, msg: str) -> None:
        if len(self.errors) < 1000 and msg not in self.errors:
            self.errors.append(msg)

    def _each_sink(self, method: str, *args: Any) -> None:
        """Call every sink; an exporter that raises is reported, never stops the reader.

        A sink with ``required = True`` (the recording) is different: its failure (disk
        full, read-only) ends the session, so it is raised after the other sinks ran.
        """
        fatal: BaseException | None = None
        for sink in self.sinks:
            fn = getattr(sink, method, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception as exc:
                if getattr(sink, "required", False):
                    fatal = fatal or exc
                else:
                    self._error(f"sink {type(sink).__name__}.{method} failed: {exc!r}")
        if fatal is not None:
            raise fatal

    def _announce(self, proc: ProcessState) -> None:
        changed = False
        if not proc.announced and proc.hello is not None:
            proc.announced = True
            changed = True
        while proc.decoder.blobs:
            btype, data = proc.decoder.blobs.pop(0)
            if btype == BlobType.SNAPSHOT:
                try:
                    proc.snapshot = json.loads(data)
                except ValueError:
                    self.errors.append(f"pid {proc.pid}: unreadable snapshot")
                changed = True
        if changed:
            self._each_sink("on_process", proc)

    def flush(self) -> None:
        """Close the open step of every process (end of session)."""
        for proc in self.procs.values():
            self._flush_one(proc)

    def _flush_one(self, proc: ProcessState) -> None:
        if self.assemble_s is not None:  # what is left in the ring: at most one lap
            left = proc.reader.capacity
            while left > 0:
                n = self._spool(proc)
                while proc.spool:
                    self._assemble(proc, proc.spool.take(4096))
                left -= n
                if n == 0:
                    break
        self._drain(proc)
        assert proc.assembler is not None
        self._deliver(proc, proc.assembler.flush())
        self._each_sink("on_process", proc)

    def add_ring(self, path: str | Path, fd: int | None = None) -> None:
        """Read the ring at ``path`` from the next poll on (a process enabled after the
        collector started: ``probe agent``); ``fd``: the ring already open, as in
        ``ring_fds``."""
        p = Path(path)
        if p not in self._explicit:
            self._explicit.append(p)
        if fd is not None:
            old = self._fds.pop(p, None)
            if old is not None:
                os.close(old)
            self._fds[p] = fd

    def finish(self, pid: int) -> ProcessState | None:
        """Read what is left in ``pid``'s ring, hand its last steps to the sinks, and
        forget the process (its ring unmapped, nothing of it kept): a reader that outlives
        its processes (``probe agent``) holds no state per ended process. Returns the
        process's final state (its counts), None for a pid not read."""
        proc = self.procs.get(pid)
        if proc is None:  # never mapped (gone before it could be): nothing kept of it
            for p in [p for p in self._explicit if RING_RE.match(p.name) and _pid_of(p) == pid]:
                self._explicit.remove(p)
                fd = self._fds.pop(p, None)
                if fd is not None:
                    os.close(fd)
            return None
        try:
            self._flush_one(proc)
        finally:
            proc.reader.close()
            del self.procs[pid]
            self._explicit = [p for p in self._explicit if p != proc.path]
            fd = self._fds.pop(proc.path, None)
            if fd is not None:
                os.close(fd)
        return proc

    def close(self) -> None:
        fatal: BaseException | None = None
        try:
            self.flush()
        except Exception as exc:
            fatal = exc
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                if getattr(sink, "required", False):
                    fatal = fatal or exc
                else:
                    self._error(f"sink {type(sink).__name__}.close failed: {exc!r}")
                    log.warning("probe: sink %r failed to close: %r", sink, exc)
        for proc in self.procs.values():
            proc.reader.close()
        while self._fds:  # rings of ring_fds never mapped
            os.close(self._fds.popitem()[1])
        if fatal is not None:
            raise fatal


def _pid_of(ring: Path) -> int | None:
    m = RING_RE.match(ring.name)
    return int(m.group(1)) if m else None


class RecordingSink:
    """Writes steps and process facts into a recording.

    ``required``: a failure here (disk full, read-only) ends the session instead of being
    logged and skipped like an exporter's.
    """

    required = True

    def __init__(self, writer: RecordingWriter) -> None:
        self.writer = writer

    def on_process(self, proc: ProcessState) -> None:
        w = self.writer
        w.add_process(proc.pid, proc.hello)
        if proc.snapshot is not None:
            w.set_snapshot(proc.pid, proc.snapshot)
        w.set_dropped(proc.pid, proc.dropped)
        w.set_strings(proc.pid, proc.decoder.strings)
        a = proc.assembler
        if a is not None:
            w.set_faults(
                proc.pid,
                {proc.decoder.name(f.hook_id): (f.count, f.disabled) for f in a.faults.values()},
            )
            w.set_outside(proc.pid, dict(a.outside))
            if a.anomalies:
                w.add_anomalies(proc.pid, a.anomalies)
                a.anomalies.clear()
        w.commit()

    def on_steps(self, proc: ProcessState, steps: Sequence[Step], gpu: Sequence[GpuSample]) -> None:
        # the process row first: at every commit point each step's pid is a process
        self.writer.add_process(proc.pid, proc.hello)
        self.writer.set_strings(proc.pid, proc.decoder.strings)
        self.writer.add_steps(steps)
        if gpu:
            self.writer.add_gpu(proc.pid, gpu)

    def tick(self) -> None:
        """Once per poll: commit what arrived even when the engine has gone idle."""
        self.writer.maybe_commit()

    def close(self) -> None:
        self.writer.close()


def ring_dir_for_session(base: str | os.PathLike[str] | None = None) -> Path:
    """A fresh private directory for one ``probe record`` session's rings."""
    import tempfile

    from probe.control_protocol import run_dir

    parent = Path(base) if base is not None else run_dir()
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="session-", dir=parent))
