"""``probe record``: run a command with the probe on and write its recording.

probe record --out run.probe.db -- vllm serve MODEL
probe record --out run.probe.db --duration 60 --sample 4 -- python bench.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from probe import config
from probe.commands import boottime_ns, probe_version, storage_guard
from probe.errors import UsageError


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
        probe_version=probe_version(),
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
    col = Collector(run_dir, sinks, now_ns=boottime_ns)
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
                failed = storage_guard(col.poll, out)
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
            failed = storage_guard(col.poll, out)
    finally:
        signal.signal(signal.SIGINT, old)
        signal.signal(signal.SIGTERM, old_term)

        def finish() -> None:
            writer.set_meta(exit_code=child.returncode, ended_epoch_ns=time.time_ns())
            col.close()

        end_failed = storage_guard(finish, out)
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


def add_parser(sub: Any) -> None:
    from probe.commands.attach import add_sample_arg

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
    r.set_defaults(func=cmd_record)
