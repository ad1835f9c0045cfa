"""The ``probe`` command line.

    probe record --out run.probe.db -- python my_llm_script.py
    probe report run.probe.db            # no file: the bundled H200 recording
    probe doctor run.probe.db
    probe env                            # every PROBE_* variable and its value here

User mistakes (a missing file, a bad value) end in one line on stderr naming the problem
and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

from probe import config
from probe.commands import open_recording
from probe.errors import UsageError
from probe.recording import default_recording

__all__ = ["default_recording", "main"]

EXIT_USAGE = 2


def _console(args: argparse.Namespace) -> Console:
    return Console(width=getattr(args, "width", None) or None, soft_wrap=False)


# kept for commands written against the old private name
_open_recording = open_recording


# -- record ---------------------------------------------------------------------------------


def cmd_record(args: argparse.Namespace) -> int:
    from probe.collector import Collector, RecordingSink, ring_dir_for_session
    from probe.commands.attach import sample_every_arg
    from probe.hooks.snapshot import OverrideError, parse_override
    from probe.recording import RecordingWriter

    sample = sample_every_arg(args)
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError(
            "record: give the command to run after --, e.g. "
            "probe record --out run.probe.db -- vllm serve MODEL"
        )
    if shutil.which(cmd[0]) is None and not Path(cmd[0]).exists():
        raise UsageError(f"record: command not found: {cmd[0]}")
    out = Path(args.out)
    if out.exists() and not args.force:
        raise UsageError(f"record: {out} exists (use --force to overwrite)")
    if not out.parent.exists():
        raise UsageError(f"record: directory {out.parent} does not exist")
    if args.override:
        try:
            parse_override(args.override)
        except OverrideError as exc:
            raise UsageError(f"record: --override {exc}") from None
    if out.exists():
        out.unlink()
    for suffix in ("-wal", "-shm"):
        Path(str(out) + suffix).unlink(missing_ok=True)
    run_dir = ring_dir_for_session(args.run_dir)
    env = dict(os.environ)
    env[config.ENABLE.name] = "1"
    env[config.RUN_DIR.name] = str(run_dir)
    env.setdefault(config.CONTROL.name, "0")
    if args.override:
        env[config.CG_SUPPORT_OVERRIDE.name] = args.override
    if args.hooks:
        env[config.HOOKS.name] = args.hooks
    if args.no_gpu_timing:
        env[config.GPU_TIMING.name] = "0"
    if sample > 1:
        env[config.SAMPLE_EVERY.name] = str(sample)
    try:
        writer = RecordingWriter(out)
    except Exception as exc:
        raise UsageError(f"record: cannot write {out}: {exc}") from None
    writer.set_meta(
        command=cmd,
        host=socket.gethostname(),
        probe_version=_version(),
        override=args.override or "",
        sample_every=sample,
        started_epoch_ns=time.time_ns(),
    )
    sinks: list[Any] = [RecordingSink(writer)]
    if args.prometheus or args.otlp:
        from probe.commands.attach import exporter_sink

        try:
            if args.prometheus:
                sinks.append(exporter_sink("prometheus", "--prometheus", args.prometheus))
            if args.otlp:
                sinks.append(exporter_sink("otlp", "--otlp", args.otlp))
        except UsageError:
            writer.close()
            out.unlink(missing_ok=True)
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
    col = Collector(run_dir, sinks, now_ns=_boottime)
    err = sys.stderr
    print(f"probe: recording {' '.join(cmd)} -> {out}", file=err)
    child = subprocess.Popen(cmd, env=env)
    config.lower_reader_priority()  # after the fork: the command keeps the user's priority
    stop = {"n": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["n"] += 1
        sig = signal.SIGINT if stop["n"] == 1 else signal.SIGKILL
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(sig)

    old = signal.signal(signal.SIGINT, on_signal)
    old_term = signal.signal(signal.SIGTERM, on_signal)
    t_end = time.monotonic() + args.duration if args.duration else None
    failed: str | None = None
    try:
        while child.poll() is None:
            if failed is None:
                failed = _storage_guard(col.poll, out)
                if failed is not None:  # the command keeps running; recording stops
                    print(
                        f"probe: error: {failed}; recording stopped, the command goes on",
                        file=sys.stderr,
                    )
            if t_end is not None and time.monotonic() > t_end:
                child.send_signal(signal.SIGINT)
                t_end = None
            time.sleep(args.interval)
        if failed is None:
            failed = _storage_guard(col.poll, out)
    finally:
        signal.signal(signal.SIGINT, old)
        signal.signal(signal.SIGTERM, old_term)

        def finish() -> None:
            writer.set_meta(exit_code=child.returncode, ended_epoch_ns=time.time_ns())
            col.close()

        end_failed = _storage_guard(finish, out)
        failed = failed or end_failed
        shutil.rmtree(run_dir, ignore_errors=True)
    steps = sum(p.steps_seen for p in col.procs.values())
    dropped = sum(p.dropped for p in col.procs.values())
    print(
        f"probe: {steps:,} steps from {sum(1 for p in col.procs.values() if p.steps_seen)} "
        f"process(es) recorded to {out} ({dropped:,} records dropped)",
        file=err,
    )
    for e in col.errors[:5]:
        print(f"probe: warning: {e}", file=err)
    if failed is not None:
        print(f"probe: error: {failed}; what was committed before is readable", file=err)
        return int(child.returncode or 1)
    return int(child.returncode or 0)


def _storage_guard(fn: Callable[[], Any], out: Path) -> str | None:
    """Run a step of the reader; a storage failure (disk full, read-only) becomes a line."""
    import sqlite3

    try:
        fn()
    except (sqlite3.Error, OSError) as exc:
        return f"{out}: {' '.join(str(exc).split())}"
    return None


def _boottime() -> int:
    from probe.runtime import boottime_ns

    return boottime_ns()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm-graph-probe")
    except Exception:
        return "0+unknown"


def cmd_collect(args: argparse.Namespace) -> int:
    """Reader only: record the rings in --run-dir until their writers have exited."""
    from probe.collector import Collector, RecordingSink
    from probe.recording import RecordingWriter

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"collect: {run_dir} is not a directory")
    writer = RecordingWriter(args.out)
    writer.set_meta(
        command=["collect", str(run_dir)],
        host=socket.gethostname(),
        probe_version=_version(),
        started_epoch_ns=time.time_ns(),
    )
    col = Collector(run_dir, [RecordingSink(writer)], now_ns=_boottime)
    config.lower_reader_priority()
    stop = {"now": False}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    seen_writer = False
    out = Path(args.out)
    failed: str | None = None
    try:
        while not stop["now"] and failed is None:
            failed = _storage_guard(col.poll, out)
            alive = [p for p in col.procs.values() if p.reader.writer_alive()]
            seen_writer = seen_writer or bool(col.procs)
            if seen_writer and not alive:
                failed = failed or _storage_guard(col.poll, out)
                break
            time.sleep(args.interval)
    finally:

        def finish() -> None:
            writer.set_meta(ended_epoch_ns=time.time_ns())
            col.close()

        failed = failed or _storage_guard(finish, out)
    if failed is not None:
        print(f"probe: error: {failed}; what was committed before is readable", file=sys.stderr)
        return 1
    return 0


# -- report / doctor ------------------------------------------------------------------------


def cmd_report(args: argparse.Namespace) -> int:
    import sqlite3

    from probe.recording import RecordingError
    from probe.report import build_report, render_report

    rec = open_recording(args.recording)
    try:
        rep = build_report(rec)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    except sqlite3.DatabaseError as exc:
        raise UsageError(f"{rec.path}: damaged recording ({' '.join(str(exc).split())})") from None
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
    else:
        render_report(rep, _console(args))
    return 0


def _live_snapshots(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Snapshots of a running server's processes, over their control sockets."""
    from probe.commands.ps import discover
    from probe.control import ControlError, request

    snaps = []
    for proc in discover(args):
        if proc.error:
            continue
        try:
            reply = request(proc.socket, "snapshot")
        except (OSError, ControlError) as exc:
            print(f"probe: warning: pid {proc.pid}: {exc}", file=sys.stderr)
            continue
        snap = reply.get("snapshot")
        if reply.get("complete") and snap:
            snaps.append(snap)
    if not snaps:
        raise UsageError(
            "doctor: no process of that server has a snapshot yet (it is taken on the first "
            "step while attached: run `probe attach --duration 5` under load, then again)"
        )
    return snaps


def cmd_doctor(args: argparse.Namespace) -> int:
    from probe.report import doctor, render_doctor

    if args.pid or args.url:
        if args.recording:
            raise UsageError("doctor: give a recording or --pid/--url, not both")
        snaps = _live_snapshots(args)
    else:
        rec = open_recording(args.recording)
        snaps = [p["snapshot"] for p in rec.processes() if p.get("snapshot")]
        if not snaps:
            raise UsageError(f"doctor: {rec.path} holds no static snapshot (no step was recorded)")
    out = [doctor(s) for s in snaps]
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        con = _console(args)
        for s in out:
            render_doctor(s, con)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    print(config.describe())
    return 0


# -- entry ----------------------------------------------------------------------------------

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "record": cmd_record,
    "report": cmd_report,
    "doctor": cmd_doctor,
    "env": cmd_env,
    "collect": cmd_collect,
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"probe: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    from probe.commands.attach import add_sample_arg

    p = _Parser(prog="probe", description=__doc__.split("\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    _add_command_modules(sub)

    r = sub.add_parser("record", help="run a command with the probe on; write a recording")
    r.add_argument("--out", "-o", required=True, help="recording file to write (.probe.db)")
    r.add_argument("--force", action="store_true", help="overwrite --out")
    r.add_argument(
        "--override",
        help="what-if graph support, e.g. "
        "FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE",
    )
    r.add_argument("--hooks", help="comma-separated hook families (default: all)")
    r.add_argument("--duration", type=float, help="stop the command after S seconds (SIGINT)")
    r.add_argument("--interval", type=float, default=0.05, help="ring poll interval, s")
    r.add_argument("--run-dir", help="directory for the session's rings")
    r.add_argument("--no-gpu-timing", action="store_true", help="no device events")
    add_sample_arg(r)
    r.add_argument("--prometheus", metavar="ADDR", help="also serve /metrics on ADDR (host:port)")
    r.add_argument("--otlp", metavar="ENDPOINT", help="also export spans and metrics over OTLP")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    for name, helptext in (
        ("report", "summarize a recording"),
        ("doctor", "static graph-support picture and known traps"),
    ):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("recording", nargs="?", help="recording (default: the bundled one)")
        q.add_argument("--json", action="store_true", help="machine-readable output")
        q.add_argument("--width", type=int, help="terminal width")
        if name == "doctor":
            from probe.commands.ps import add_target_args

            add_target_args(q)

    sub.add_parser("env", help="list PROBE_* environment variables")
    c = sub.add_parser("collect", help="read the rings of a run directory into a recording")
    c.add_argument("--run-dir", required=True)
    c.add_argument("--out", "-o", required=True)
    c.add_argument("--interval", type=float, default=0.05)
    return p


def _add_command_modules(sub: Any) -> None:
    """Subcommands living in ``probe/commands/<name>.py``.

    Each module defines ``add_parser(subparsers) -> None``; the parser it adds sets
    ``func=<callable(args) -> int>`` with ``set_defaults``. Commands raise
    :class:`UsageError` for user mistakes.
    """
    import importlib
    import pkgutil

    from probe import commands

    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        importlib.import_module(f"probe.commands.{mod.name}").add_parser(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        func = getattr(args, "func", None)
        if func is not None:
            return int(func(args))
        return COMMANDS[args.cmd](args)
    except UsageError as exc:
        print(f"probe: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
