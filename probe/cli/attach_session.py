"""The attachment ``probe attach`` and ``probe top`` make: turn the probe on in the armed
processes of a running server over their control sockets, read their rings with the same
collector as ``probe record``, keep their heartbeats fresh, and on the way out (Ctrl-C,
``--duration``, the server going away) disable everything that was enabled. If this
process dies instead, each vLLM process's watchdog disables itself at its next wake (and
if it is stopped, once the heartbeat is older than 5 s; if it runs but gets no CPU, after
60 s: probe.engine.control_server).

On a busy host the reader must not fall behind, nor keep the hooks on past the
duration. So each process is told the duration at enable and turns its hooks off at
the deadline itself, whatever this process is doing; while attached, each poll copies
every ring into memory (cheap, so the rings do not fill) and then decodes, assembles and
writes for at most 50 ms; while records are left over, the next poll comes at once
instead of after ``--interval`` (on a saturated host the reader waits for a CPU far
longer than it works, so a sleep while behind only moves the work past the detach);
what is left at the detach is finished after it. That bound, not a
lower priority, is what keeps the reader's share of a busy host small: ``attach`` and
``top`` run at the user's priority (``PROBE_READER_NICE`` is for ``record`` and
``collect``). Tried and dropped: the attached loop on a thread at nice 10. On the
saturated CPU server of docs/reliability.md it once went 5 s without a poll (the
watchdog turned the hooks off), and a thread that waits for a CPU while it holds the
interpreter's lock holds up the rest of the process too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.cli.commands import address, endpoint, positive_float
from probe.cli.live_options import add_sample_arg, exporter_sink, hook_families, sample_every
from probe.cli.targets import Target, add_target_args, discover, run_dir
from probe.errors import UsageError
from probe.reader import session as sharing

ENABLE_TIMEOUT_S = 60.0  # the first enable may import torch for device timing
ASSEMBLE_SLICE_S = 0.05  # per poll: decoding and assembly beyond this wait for the next


def _boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class Session:
    """Enable a set of armed processes, collect their rings, disable them again."""

    def __init__(
        self,
        procs: Sequence[Any],
        run_dir: Path,
        sinks: Sequence[Any],
        *,
        gpu_timing: bool | int | None = None,
        hooks: list[str] | None = None,
        sample_every: int = 1,
        now_ns: Callable[[], int] = _boottime_ns,
    ) -> None:
        self.procs = list(procs)
        self.run_dir = run_dir
        self.sinks = list(sinks)
        self.gpu_timing = gpu_timing
        self.hooks = hooks
        self.sample_every = sample_every
        self.now_ns = now_ns
        self.enabled: list[Any] = []
        self.rings: list[Path] = []
        self.ring_fds: dict[Path, int] = {}  # opened at enable, mapped by the collector
        self.collector: Any = None
        self.failed: str | None = None  # the recording's storage failed (disk full, ...)
        self.left_at_detach = 0  # records read while attached, decoded after detach
        self.finish_s = 0.0  # the work after detach: the rest of the rings, the sinks' close

    def enable(self, duration_s: float | None = None) -> None:
        """Enable every process; with ``duration_s`` each turns its hooks off that long
        after its own enable (an older server without deadlines is enabled without).

        Each process's ring is opened right after; :meth:`collect` reads them. Nothing of
        the reader (its modules, the collector) is needed before: the duration counts
        from here, so on a saturated host the reader's start overlaps the attachment."""
        from probe.reader.control import ControlError, request, request_all
        from probe.ring_dir import OPEN_FLAGS

        args: dict[str, Any] = {}
        if duration_s is not None:
            args["duration_s"] = duration_s
        if self.gpu_timing is not None:
            args["gpu_timing"] = self.gpu_timing
        if self.hooks is not None:
            args["hooks"] = self.hooks
        if self.sample_every > 1:
            args["sample_every"] = self.sample_every
        # asked together: each process answers when its control thread gets a CPU and
        # the interpreter's lock, so one after the other the start waited for the sum
        replies = request_all(
            [a.socket for a in self.procs], "enable", timeout=ENABLE_TIMEOUT_S, **args
        )
        rings, failed = [], None
        for a, reply in zip(self.procs, replies, strict=True):
            if (
                isinstance(reply, ControlError)
                and "duration_s" in args
                and "'duration_s'" in str(reply)
            ):  # a server older than deadlines: enable it without
                old = {k: v for k, v in args.items() if k != "duration_s"}
                try:
                    reply = request(a.socket, "enable", timeout=ENABLE_TIMEOUT_S, **old)
                except (ControlError, OSError) as exc:
                    reply = exc
            if isinstance(reply, Exception):
                failed = failed or (a, reply)
                continue
            self.enabled.append(a)
            # the ring sits beside the process's socket (its run dir, maybe a fallback)
            rings.append(Path(a.socket).parent / Path(str(reply["ring"])).name)
        if failed is not None:
            self.disable()
            who, why = failed
            raise UsageError(f"pid {who.pid} ({who.role}): {why}") from None
        # open the rings now: at its deadline a process unlinks its ring, which a reader
        # that has it open still maps and drains, however late it runs (one that cannot
        # be opened here is tried again, and reported, by the collector)
        self.rings = rings
        for path in rings:
            with contextlib.suppress(OSError):
                self.ring_fds[path] = os.open(path, OPEN_FLAGS)

    def collect(self, sinks: Sequence[Any] = ()) -> None:
        """Start reading the rings opened at :meth:`enable` into ``sinks`` (after the
        constructor's): each process's records since its enable are there."""
        from probe.reader.collector import Collector

        self.sinks += sinks
        fds, self.ring_fds = self.ring_fds, {}
        # drain every poll, assemble in slices: a busy host never makes the rings overflow
        self.collector = Collector(
            None,
            self.sinks,
            rings=self.rings,
            ring_fds=fds,
            now_ns=self.now_ns,
            assemble_s=ASSEMBLE_SLICE_S,
        )
        self.collector.discover()

    def alive(self) -> list[Any]:
        from probe.reader.control import pid_alive

        return [a for a in self.enabled if pid_alive(a.pid)]

    def disable(self) -> list[str]:
        """Disable every process this session enabled; returns the problems met."""
        from probe.reader.control import pid_alive, request_all

        problems = []
        replies = request_all([a.socket for a in self.enabled], "disable", timeout=10.0)
        for a, reply in zip(self.enabled, replies, strict=True):
            if isinstance(reply, Exception) and pid_alive(a.pid):
                problems.append(f"pid {a.pid}: disable failed: {reply}")
        self.enabled = []
        return problems

    def close(self) -> list[str]:
        """Disable every process, then finish reading and close the sinks."""
        problems = self.disable()
        while self.ring_fds:  # enabled, never collected
            os.close(self.ring_fds.popitem()[1])
        if self.collector is not None:
            t0 = time.monotonic()
            col = self.collector
            self.left_at_detach = col.spooled + sum(p.reader.pending for p in col.procs.values())
            try:
                self.collector.close()
            except (sqlite3.Error, OSError) as exc:
                self.failed = f"recording failed: {' '.join(str(exc).split())}"
            self.finish_s = time.monotonic() - t0
        return problems


@dataclass(frozen=True)
class SessionOptions:
    """What :func:`run_session` is asked to do, from the command line of ``attach`` or
    ``top`` (:func:`add_session_args`, ``--record``, ``--force``)."""

    target: Target
    duration: float | None = None
    interval: float = 0.1
    hooks: str | None = None
    no_gpu_timing: bool = False
    sample: int | None = 1
    prometheus: str | None = None
    otlp: str | None = None
    record: str | None = None
    force: bool = False
    no_live: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, no_live: bool) -> SessionOptions:
        return cls(
            target=Target.from_args(args),
            duration=args.duration,
            interval=args.interval,
            hooks=args.hooks,
            no_gpu_timing=args.no_gpu_timing,
            sample=args.sample,
            prometheus=args.prometheus,
            otlp=args.otlp,
            record=args.record,
            force=args.force,
            no_live=no_live,
        )


def run_session(
    opts: SessionOptions, *, title: str, live_default: bool, console: Any = None
) -> int:
    """``attach`` and ``top``: check, discover, enable, read until the end, disable.

    Before the enable only what can refuse the command line runs (a mistake is one line,
    and no process was touched); the reader's modules, its statistics and the recording
    come after, while the hooks record into the rings: on a saturated host the reader
    waits for a CPU far longer than it works, and the duration counts from the enable.
    """
    target = opts.target
    # a live view says what it does from the first moment: discovery and the enable take
    # seconds on a busy host, before the view itself can be drawn
    waiting = live_default and not opts.no_live and console is None and sys.stdout.isatty()
    if waiting:
        print(f"{title}: looking for armed vLLM processes{target.where()} ...", flush=True)
    procs = [a for a in discover(target) if not a.error]
    if not procs:
        raise UsageError(
            "no armed vLLM process found"
            + target.where()
            + " (is vllm-graph-probe installed in vLLM's environment, PROBE_CONTROL not 0?)"
        )
    from probe.reader.control import pid_alive

    # a reader that died is cleaned up by the process's watchdog; do not wait for it
    busy = [a for a in procs if a.status.get("attached_by") and pid_alive(a.status["attached_by"])]
    if busy:
        a = busy[0]
        raise UsageError(f"pid {a.pid} ({a.role}) is attached by pid {a.status['attached_by']}")
    hooks = hook_families(opts.hooks)
    sample = sample_every(opts.sample)
    rdir = run_dir(target)
    record = opts.record
    out = None
    if record:
        from probe.reader.recording_target import check_recording_target

        out = check_recording_target(record, force=opts.force, flag="--record")
    exporters: list[Any] = []
    try:
        if opts.prometheus:
            exporters.append(exporter_sink("prometheus", "--prometheus", opts.prometheus, sample))
        if opts.otlp:
            exporters.append(exporter_sink("otlp", "--otlp", opts.otlp, sample))
    except BaseException:
        _discard(out)
        raise

    gpu: bool | int | None = False if opts.no_gpu_timing else None
    session = Session(procs, rdir, [], gpu_timing=gpu, hooks=hooks, sample_every=sample)
    err = sys.stderr
    stop = {"why": ""}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["why"] = "interrupted"

    old_int = signal.signal(signal.SIGINT, on_signal)
    old_term = signal.signal(signal.SIGTERM, on_signal)
    started_epoch_ns = time.time_ns()
    t_end: float | None = None
    writer = None
    try:
        if waiting:
            print(
                f"{title}: enabling {len(procs)} process(es) "
                f"({', '.join(f'{a.pid} {a.role}' for a in procs)}) ...",
                flush=True,
            )
        try:
            session.enable(duration_s=opts.duration)
        except BaseException:
            _discard(out)
            raise
        attached_at = time.monotonic()
        t_end = attached_at + opts.duration if opts.duration else None
        print(
            f"probe: attached to {len(procs)} process(es): "
            + ", ".join(f"{a.pid} {a.role}" for a in procs),
            file=err,
        )
        try:  # what fails from here on is reported after every process was disabled
            from probe.cli.render_live import LiveStats, plain_lines, render
            from probe.reader.collector import RecordingSink

            stats = LiveStats(roles={a.pid: a.role for a in procs}, sample_every=sample)
            sinks: list[Any] = [stats]
            if out is not None:
                writer = _open_recording(out)
                writer.set_meta(
                    command=["probe", *sys.argv[1:]],
                    host=socket.gethostname(),
                    attached=[{"pid": a.pid, "role": a.role} for a in procs],
                    sample_every=sample,
                    started_epoch_ns=started_epoch_ns,
                    reader_share=sharing.SHARE,
                )
                sinks.append(RecordingSink(writer))
            session.collect([*sinks, *exporters])
        except BaseException:
            _discard(out, writer)
            writer = None
            raise
        if console is None and live_default and not opts.no_live:  # rich only for a live view
            from probe.cli.terminal import SafeConsole

            console = SafeConsole()
        live_on = live_default and not opts.no_live and console is not None and console.is_terminal
        live = None
        if live_on:
            from rich.live import Live

            live = Live(render(stats, title), console=console, auto_refresh=False, transient=False)

        with live if live is not None else contextlib.nullcontext():
            next_print = time.monotonic() + 5.0
            stats.attached = len(session.enabled)
            while not stop["why"]:
                try:
                    session.collector.poll()
                    stats.behind = session.collector.spooled
                except (sqlite3.Error, OSError) as exc:  # the recording's disk, not vLLM
                    session.failed = f"recording failed: {' '.join(str(exc).split())}"
                    stop["why"] = session.failed
                    break
                if not session.alive():
                    stop["why"] = "the server is gone"
                    break
                if t_end is not None and time.monotonic() >= t_end:
                    stop["why"] = "duration reached"
                    break
                if live is not None:
                    live.update(render(stats, title), refresh=True)
                elif live_default and time.monotonic() >= next_print:
                    print("\n".join(plain_lines(stats, title)), flush=True)
                    next_print = time.monotonic() + 5.0
                if not session.collector.spooled:  # behind: the next slice at once
                    time.sleep(opts.interval)
            # the summary's rate: the steps over the attachment, not over their own span
            stats.attached_s = time.monotonic() - attached_at
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        if writer is not None:
            waited = sharing.cpu_wait_s()
            writer.set_meta(
                ended_epoch_ns=time.time_ns(),
                stop_reason=stop["why"],
                reader_cpu_wait_s=None if waited is None else round(waited, 3),
            )
        problems = session.close()
    col = session.collector
    procs_seen = list(col.procs.values()) if col is not None else []
    steps = sum(p.steps_seen for p in procs_seen)
    forward = sum(p.forward_seen for p in procs_seen)
    print(
        f"probe: detached ({stop['why']}); {forward:,} forward steps seen ({steps - forward:,} "
        f"more ran no forward); finished in "
        f"{session.finish_s:.2f} s ({session.left_at_detach:,} records left at detach)",
        file=err,
    )
    note = sharing.wait_note(sharing.cpu_wait_s(), time.monotonic() - sharing.STARTED)
    if note:
        print(f"probe: warning: {note}", file=err)
    if not live_on:
        print("\n".join(plain_lines(stats, title)))
    if record:
        print(f"probe: recording written to {record}", file=err)
    for p in problems:
        print(f"probe: warning: {p}", file=err)
    for e in (col.errors if col is not None else [])[:5]:
        print(f"probe: warning: {e}", file=err)
    if session.failed:
        print(
            f"probe: error: {record}: {session.failed}; the server was detached, what was "
            "committed before is readable",
            file=err,
        )
        return 1
    return 0


def _open_recording(out: Path) -> Any:
    """The recording's writer on ``out`` (checked by ``check_recording_target``), or the
    one-line RuntimeFailure of a storage that refuses it."""
    from probe.reader.recording_target import writer_at

    return writer_at(out, "attach")


def _discard(out: Path | None, writer: Any = None) -> None:
    """Remove the recording ``out`` of a start that failed (and its ``-wal``/``-shm``):
    nothing partial is left."""
    if writer is not None:
        with contextlib.suppress(sqlite3.Error, OSError):
            writer.close()
    if out is not None:
        if out.is_dir() and not out.is_symlink():
            shutil.rmtree(out, ignore_errors=True)
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(IsADirectoryError):
                Path(f"{out}{suffix}").unlink(missing_ok=True)


def take_share(nice: int | str | None, command: str) -> None:
    """An explicit ``--session-nice N`` where ``probe.cli.main.main`` was called from a program
    (a no-op where :mod:`probe.cli.entry` took the share already); never a fork under it."""
    if isinstance(nice, int):
        sharing.raise_share(nice, fork=False, command=command)


def add_session_args(p: argparse.ArgumentParser) -> None:
    """The flags ``attach`` and ``top`` share: the target, the duration, what to record
    and where to export it live."""
    add_target_args(p)
    p.add_argument("--duration", type=positive_float, help="detach after S seconds")
    p.add_argument("--interval", type=positive_float, default=0.1, help="ring poll interval, s")
    p.add_argument("--hooks", help="comma-separated hook families (default: all)")
    p.add_argument("--no-gpu-timing", action="store_true", help="no device events")
    add_sample_arg(p)
    p.add_argument(
        "--prometheus", metavar="ADDR", type=address, help="serve /metrics on ADDR (host:port)"
    )
    p.add_argument("--otlp", metavar="ENDPOINT", type=endpoint, help="export OTLP to ENDPOINT")


def add_share_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--session-nice",
        type=sharing.setting_value,
        metavar="N|auto|off",
        help="this reader's CPU share: a session of its own whose autogroup's nice (and its "
        "own) is N, so that on a host a saturated server keeps busy it keeps up and keeps its "
        f"duration; auto (the default): {sharing.AUTO_NICE} where permitted (CAP_SYS_NICE or "
        "root), else as started; off: as started (docs/reliability.md)",
    )
