"""``probe agent``'s loop: one host's armed vLLM processes, followed for as long as it runs.

The agent watches the run directories for control sockets, enables every armed process as
it appears (a new server, a restarted engine, a new rank) at the chosen sample rate, reads
their rings with one :class:`probe.reader.collector.Collector`, and hands the steps to its sinks
(a Prometheus endpoint, OTLP, rolling recordings). It runs in the reader, like ``probe
attach``; nothing of it runs inside vLLM.

- **A process that ends** is finished at once (what is left in its ring is read and
  handed on) and forgotten: nothing per process outlives it but its exported series,
  and those are dropped ``forget_s`` after it ended. A new process is a new series (its
  ``pid`` label), so a restart never resets a counter; a process that takes the place of
  one that ended (same run dir, role and rank) counts as a restart.
- **Every hook goes off when the agent does**: on SIGTERM/SIGINT it disables every
  process, drains the rings and closes its sinks (the Prometheus endpoint until the last
  values were scraped); killed (SIGKILL, OOM), each process's own watchdog turns its hooks
  off within half a second (the attaching pid is gone).
- **One line per attach and detach** goes to ``log`` (stderr).

    >>> agent = Agent([run_dir], sinks=[make_sink(":9464")], sample_every=8)  # doctest: +SKIP
    >>> agent.run()                                                           # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from probe.reader.collector import Collector, ProcessState, RecordingSink
from probe.reader.control import ControlError, pid_alive, request_all
from probe.reader.discover import Armed, remove_stale_ring, sockets
from probe.ring_dir import OPEN_FLAGS

ENABLE_TIMEOUT_S = 60.0
ASSEMBLE_SLICE_S = 0.05  # per poll, as probe attach: the rest waits for the next poll
STATUS_EVERY_S = 5.0  # how often an attached process is asked whether it still is
LAG_EVERY_S = 1.0  # how often the lag of each ring is measured and exported
LAG_WARN_S = 10.0
"""The lag (seconds behind a ring) past which the agent warns in its log, once until it
has caught up again (to half of it)."""


def _boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


@dataclass
class Attached:
    """One process the agent enabled."""

    armed: Armed
    run_dir: Path
    ring: Path
    key: tuple[str, str, str]  # run dir, role, rank: what a restart takes the place of
    since: float
    checked: float = 0.0


def _part(value: str) -> str:
    """A partition value as a folder name: ``/`` and ``=`` (and anything not printable) as
    ``_``."""
    return "".join(c if c.isprintable() and c not in "/=\\" else "_" for c in value) or "_"


class RollingRecordings:
    """A :class:`probe.reader.collector.Sink` writing recordings into ``directory``, a new file
    every ``every_s`` seconds, keeping the newest ``keep`` (older ones are removed).

    Each file is made by :mod:`probe.reader.output`'s helpers for a file written in place
    (checked, never through a link, never over a file it did not make) and is a whole
    recording of its period: the processes seen (their snapshots) and their steps."""

    required = True

    def __init__(
        self,
        directory: Path,
        every_s: float,
        keep: int | None,
        *,
        meta: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        prefix: str = "agent",
    ) -> None:
        self.directory = directory
        self.every_s = every_s
        self.keep = keep
        self.meta = dict(meta or {})
        self.clock = clock
        self.prefix = prefix
        self.procs: dict[int, ProcessState] = {}
        self.sink: RecordingSink | None = None
        self.path: Path | None = None
        self.files: list[Path] = []  # written by this agent, oldest first
        self.unfinished: list[Path] = []  # closed while a reader had them open
        self.compacting: list[Any] = []  # columnar files compacting in a thread
        self.next_at = 0.0
        self._stamp, self._seq = "", 0  # the last name's stamp and number in its second
        self._open()

    def _name(self) -> Path:
        """The next file: ``host=<host>/day=<UTC day>/<prefix>-<stamp>.probe`` under the
        directory (partitioned as DuckDB, Spark and Trino read a dataset); a second file in
        the same second ``<stamp>_0001``, and so on: the names sort as the files were made
        (``_`` sorts after ``.``, where ``-1`` would sort before)."""
        now = time.gmtime()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", now)
        part = (
            self.directory
            / f"host={_part(socket.gethostname())}"
            / time.strftime("day=%Y-%m-%d", now)
        )
        # never a name used before in this second, even one whose file was pruned since
        n = self._seq + 1 if stamp == self._stamp else 0
        while True:
            p = part / (f"{self.prefix}-{stamp}" + (f"_{n:04d}" if n else "") + ".probe")
            if not p.exists() and p not in self.files:
                break
            n += 1
        self._stamp, self._seq = stamp, n
        return p

    def _open(self) -> None:
        from probe.reader.recording_target import new_writer

        path = self._name()
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = new_writer(path, force=False, flag="--record-dir")
        out = writer.path
        writer.set_meta(
            **self.meta,
            host=socket.gethostname(),
            started_epoch_ns=time.time_ns(),
        )
        self.sink = RecordingSink(writer)
        self.path = out
        self.files.append(out)
        self.next_at = self.clock() + self.every_s
        for proc in self.procs.values():  # the processes carried over: their facts first
            self.sink.on_process(proc)
        self._prune()

    def _prune(self) -> None:
        if self.keep is None:
            return
        while len(self.files) > self.keep:
            old = self.files.pop(0)
            if old in self.unfinished:
                self.unfinished.remove(old)
            for w in self.compacting:  # a file still compacting: done first, then removed
                if w.path == old:
                    w.join()
            shutil.rmtree(old, ignore_errors=True)
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    Path(f"{old}{suffix}").unlink()

    def rotate(self) -> None:
        """Close this file, start the next."""
        self._close_file()
        self._open()

    def _close_file(self, *, final: bool = False) -> None:
        """Close this file: a columnar one compacts in a thread at a rotation (the loop
        goes on draining the rings), and is waited for at the agent's end."""
        from probe.reader.columnar import ColumnarWriter

        if self.sink is not None:
            w = self.sink.writer
            w.set_meta(ended_epoch_ns=time.time_ns())
            if isinstance(w, ColumnarWriter):
                w.close(wait=final)
                self.compacting = [c for c in self.compacting if c._compacting is not None]
                self.compacting.append(w)
            elif not w.close() and self.path is not None:
                self.unfinished.append(self.path)
            self.sink = None
        if final:
            for c in self.compacting:
                c.join()
            self.compacting = []
        self._finish_unfinished()

    def _finish_unfinished(self) -> None:
        """A file a reader held open at its close is complete but kept its ``-wal``; it is
        made one self-contained file at a later rotation, once no reader holds it."""
        from probe.reader.recording import finish_wal

        still = []
        for p in self.unfinished:
            try:
                done = finish_wal(p)
            except sqlite3.Error:
                done = False
            if not done:
                still.append(p)
        self.unfinished = still

    def on_process(self, proc: ProcessState) -> None:
        self.procs[proc.pid] = proc
        if self.sink is not None:
            self.sink.on_process(proc)

    def on_steps(self, proc: ProcessState, steps: Sequence[Any], gpu: Sequence[Any]) -> None:
        self.procs[proc.pid] = proc
        if self.sink is not None:
            self.sink.on_steps(proc, steps, gpu)

    def tick(self) -> None:
        if self.sink is not None:
            self.sink.tick()
        if self.clock() >= self.next_at:
            self.rotate()

    def finished(self, pid: int) -> None:
        """``pid`` ended and was read to its end: nothing of it is carried any more."""
        self.procs.pop(pid, None)

    def close(self) -> None:
        self._close_file(final=True)


class Agent:
    """Follows every armed process under ``run_dirs`` until :meth:`stop`."""

    def __init__(
        self,
        run_dirs: Sequence[Path],
        sinks: Sequence[Any],
        *,
        sample_every: int = 1,
        hooks: list[str] | None = None,
        gpu_timing: bool | int | None = None,
        scan_s: float = 1.0,
        interval_s: float = 0.1,
        forget_s: float = 900.0,
        log: TextIO | None = None,
        now_ns: Callable[[], int] = _boottime_ns,
        clock: Callable[[], float] = time.monotonic,
        drain_rate: float | None = None,
        lag_warn_s: float = LAG_WARN_S,
    ) -> None:
        self.run_dirs = list(run_dirs)
        self.sinks = list(sinks)
        self.sample_every = sample_every
        self.hooks = hooks
        self.gpu_timing = gpu_timing
        self.scan_s = scan_s
        self.interval_s = interval_s
        self.forget_s = forget_s
        self.log = log if log is not None else sys.stderr
        self.clock = clock
        # counters first: each batch of steps reaches the sinks in this order
        self.sinks.sort(key=_priority)
        self.collector = Collector(
            None, self.sinks, now_ns=now_ns, assemble_s=ASSEMBLE_SLICE_S, clock=clock
        )
        self.collector.drain_rate = drain_rate
        self.lag_warn_s = lag_warn_s
        self.lagging: set[int] = set()  # pids warned about and not caught up since
        self._next_lag = 0.0
        self.engine_dirs: set[str] = set()  # run dirs with an engine process of their own
        self.attached: dict[int, Attached] = {}
        self.skipped: dict[int, str] = {}  # pid -> why (attached by another reader, ...)
        # per key (run dir, role, rank): the processes finished and not yet succeeded; one
        # that is gone makes the next new process of its key a restart
        self.finished: dict[tuple[str, str, str], set[int]] = {}
        self.gone: dict[int, float] = {}  # pid -> when it was finished (series to forget)
        self.counts = {"attaches": 0, "detaches": 0, "restarts": 0}
        self.steps_done = 0  # forward steps of the processes already finished
        self.dropped_done = 0
        self.stopping = ""
        self.failed: str | None = None
        self._next_scan = 0.0
        for s in self.sinks:
            add = getattr(s, "add_agent_metrics", None)
            if add is not None:
                add()
            sampled = getattr(s, "sampled", None)
            if sampled is not None and sample_every > 1:
                sampled(sample_every)
        self._event("sample_every", float(sample_every))

    # -- log and events ---------------------------------------------------------------------

    def say(self, line: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with contextlib.suppress(OSError, ValueError):
            print(f"{stamp} probe agent: {line}", file=self.log, flush=True)

    def _event(self, name: str, value: float = 1.0) -> None:
        for s in self.sinks:
            fn = getattr(s, "agent_event", None)
            if fn is not None:
                fn(name, value)

    # -- attach -----------------------------------------------------------------------------

    def scan(self) -> None:
        """Enable every armed process not attached yet."""
        seen: set[int] = set()
        for d in self.run_dirs:
            try:
                found = sockets(d)
            except OSError:
                continue
            seen.update(found)
            new = [(pid, path) for pid, path in sorted(found.items()) if pid not in self.attached]
            if not new:
                continue
            statuses = request_all([p for _, p in new], "status", timeout=2.0)
            todo: list[Armed] = []
            for (pid, path), st in zip(new, statuses, strict=True):
                if isinstance(st, Exception):
                    continue  # starting, or gone: the next scan asks again
                a = Armed(pid, path, st)
                by = st.get("attached_by")
                if by and by != os.getpid() and pid_alive(int(by)):
                    why = f"attached by pid {by}"
                    if self.skipped.get(pid) != why:
                        self.say(f"pid {pid} ({a.role}) skipped: {why}; tried again later")
                    self.skipped[pid] = why
                    continue
                self.skipped.pop(pid, None)
                todo.append(a)
            if todo:
                self._enable(d, todo)
        for pid in [p for p in self.skipped if p not in seen]:  # gone: nothing kept of it
            del self.skipped[pid]

    def _enable(self, run_dir: Path, procs: list[Armed]) -> None:
        args: dict[str, Any] = {}
        if self.gpu_timing is not None:
            args["gpu_timing"] = self.gpu_timing
        if self.hooks is not None:
            args["hooks"] = self.hooks
        if self.sample_every > 1:
            args["sample_every"] = self.sample_every
        replies = request_all([a.socket for a in procs], "enable", timeout=ENABLE_TIMEOUT_S, **args)
        for a, reply in zip(procs, replies, strict=True):
            if isinstance(reply, Exception):
                why = str(reply) or type(reply).__name__
                if self.skipped.get(a.pid) != why and pid_alive(a.pid):
                    self.say(f"pid {a.pid} ({a.role}) not attached: {why}")
                self.skipped[a.pid] = why
                continue
            ring = Path(a.socket).parent / Path(str(reply["ring"])).name
            fd = None
            with contextlib.suppress(OSError):
                fd = os.open(ring, OPEN_FLAGS)
            self.collector.add_ring(ring, fd)
            key = (str(run_dir), a.role, a.rank_label)
            if a.role == "engine":
                self.engine_dirs.add(str(run_dir))
            succeeds = self._succeeds(key, a.pid)
            # one restart per engine restart: counted on the engine core's process where
            # the run dir has one, not once per api, engine and worker process that came
            # back with it
            restart = succeeds and (a.role == "engine" or str(run_dir) not in self.engine_dirs)
            if restart:
                self.counts["restarts"] += 1
                self._event("restarts")
            now = self.clock()
            self.attached[a.pid] = Attached(a, run_dir, ring, key, now, now)
            self.gone.pop(a.pid, None)
            self.counts["attaches"] += 1
            self._event("attaches")
            self._event("attached", len(self.attached))
            model = a.status.get("model") or "-"
            self.say(
                f"attached pid {a.pid} ({a.role} {a.rank_label}, {model}) in {run_dir}"
                + (f", 1 step in {self.sample_every}" if self.sample_every > 1 else "")
                + (" (a restart)" if restart else " (with a restart)" if succeeds else "")
            )

    # -- detach -----------------------------------------------------------------------------

    def _finish(self, pid: int, why: str) -> None:
        """Read the rest of ``pid``'s ring, hand it on, forget the process."""
        att = self.attached.pop(pid)
        state = self.collector.finish(pid)
        steps = state.forward_seen if state is not None else 0
        dropped = state.dropped if state is not None else 0
        self.steps_done += steps
        self.dropped_done += dropped
        self.lagging.discard(pid)
        if not pid_alive(pid):  # read to its end: its ring is ours to remove
            remove_stale_ring(att.ring)
        for s in self.sinks:
            fn = getattr(s, "finished", None)
            if fn is not None:
                fn(pid)
        self.gone[pid] = self.clock()
        self.counts["detaches"] += 1
        self._event("detaches")
        self._event("attached", len(self.attached))
        self.finished.setdefault(att.key, set()).add(pid)
        self.say(f"detached pid {pid} ({att.armed.role} {att.armed.rank_label}): {why}; "
                 f"{steps:,} forward steps, {dropped:,} records dropped")  # fmt: skip

    def _succeeds(self, key: tuple[str, str, str], new_pid: int) -> bool:
        """Whether ``new_pid`` takes the place of a process of ``key`` that is gone (one
        predecessor per successor), whichever order this turn met them in: the old one
        still attached, or finished earlier (exited, or its hooks went off as it closed)."""
        for pid, att in list(self.attached.items()):
            if att.key == key and pid != new_pid and not pid_alive(pid):
                self._finish(pid, "exited")
        before = self.finished.get(key)
        if before is None:
            return False
        before.discard(new_pid)  # the same process enabled again: no restart
        gone = min((p for p in before if not pid_alive(p)), default=None)
        if gone is not None:
            before.discard(gone)
        if not before:
            del self.finished[key]
        return gone is not None

    def check(self) -> None:
        """Finish the processes that ended, or whose hooks went off without us (their
        watchdog, another reader's takeover): they are enabled again at the next scan."""
        now = self.clock()
        for pid, att in list(self.attached.items()):
            if not pid_alive(pid):
                self._finish(pid, "exited")
                continue
            if now - att.checked < STATUS_EVERY_S:
                continue
            att.checked = now
            [st] = request_all([att.armed.socket], "status", timeout=2.0)
            if isinstance(st, ControlError | ConnectionRefusedError | FileNotFoundError):
                if not pid_alive(pid):
                    self._finish(pid, "exited")
                continue
            if isinstance(st, Exception):
                continue  # busy: asked again later
            if st.get("attached_by") != os.getpid():
                off = (st.get("last_off") or {}).get("reason") or "off"
                self._finish(pid, f"its hooks went off ({off})")
        # series of processes long gone: dropped (memory stays flat over days)
        for pid, t in list(self.gone.items()):
            if now - t >= self.forget_s:
                del self.gone[pid]
                for s in self.sinks:
                    fn = getattr(s, "forget", None)
                    if fn is not None:
                        fn(pid)

    # -- the loop ---------------------------------------------------------------------------

    def step(self) -> None:
        """One turn: scan (every ``scan_s``), read the rings, finish the processes gone,
        measure the lag (every :data:`LAG_EVERY_S`)."""
        now = self.clock()
        if now >= self._next_scan:
            self._next_scan = now + self.scan_s
            self.scan()
        self.collector.poll()
        self.check()
        if self.clock() >= self._next_lag:
            self._next_lag = self.clock() + LAG_EVERY_S
            self.measure_lag()

    def measure_lag(self) -> dict[int, tuple[int, float]]:
        """Each attached ring's lag (records, seconds: :meth:`Collector.lag`), exported
        to the sinks; a ring more than ``lag_warn_s`` behind is one warning in the log,
        and one line again once it has caught up (to half of that)."""
        out = {pid: self.collector.lag(pid) for pid in self.attached}
        for s in self.sinks:
            fn = getattr(s, "agent_lag", None)
            if fn is not None:
                fn(out)
        for pid, (records, seconds) in out.items():
            att = self.attached[pid]
            who = f"pid {pid} ({att.armed.role} {att.armed.rank_label})"
            if seconds > self.lag_warn_s and pid not in self.lagging:
                self.lagging.add(pid)
                self.say(
                    f"warning: {who} is {seconds:,.1f} s and {records:,} records behind "
                    "(counters and recordings trail the engine; this reader waits for a "
                    'CPU or is capped by --drain-rate: docs/agent.md, "Lag")'
                )
            elif seconds <= self.lag_warn_s / 2 and pid in self.lagging:
                self.lagging.discard(pid)
                self.say(f"{who} caught up ({records:,} records behind)")
        return out

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Turn until :meth:`stop` (a signal handler calls it) or ``until()``."""
        while not self.stopping and not until():
            try:
                self.step()
            except (sqlite3.Error, OSError) as exc:  # the recordings' disk, not vLLM
                self.failed = f"recording failed: {' '.join(str(exc).split())}"
                self.stopping = self.failed
                break
            if not self.collector.spooled:  # behind: the next slice at once
                time.sleep(self.interval_s)

    def stop(self, why: str) -> None:
        self.stopping = why

    def close(self) -> list[str]:
        """Disable every process, read what is left, close the sinks; the problems met."""
        problems: list[str] = []
        procs = list(self.attached.values())
        replies = request_all([a.armed.socket for a in procs], "disable", timeout=10.0)
        for a, reply in zip(procs, replies, strict=True):
            if isinstance(reply, Exception) and pid_alive(a.armed.pid):
                problems.append(f"pid {a.armed.pid}: disable failed: {reply}")
        for pid in list(self.attached):
            try:
                self._finish(pid, "agent stopped")
            except (sqlite3.Error, OSError) as exc:
                problems.append(f"pid {pid}: {exc}")
        try:
            self.collector.close()
        except (sqlite3.Error, OSError) as exc:
            self.failed = f"recording failed: {' '.join(str(exc).split())}"
        return problems + self.collector.errors[:5]

    @property
    def steps_seen(self) -> int:
        """Forward steps read so far: what the counters count (``steps_total``)."""
        return self.steps_done + sum(p.forward_seen for p in self.collector.procs.values())


def _priority(sink: Any) -> int:
    """The order sinks get each batch: live counters first (what dashboards read), then
    pushed metrics, then the recordings (which read the same steps, later is no loss)."""
    if hasattr(sink, "agent_event"):
        return 0
    if getattr(sink, "required", False):
        return 2
    return 1
