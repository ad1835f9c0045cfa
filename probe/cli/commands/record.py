"""``probe record``: run a command with the probe on and write its recording.

probe record --out run.probe -- vllm serve MODEL
probe record --out run.probe --duration 60 --sample 4 -- python bench.py
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
from probe.cli.commands import (
    address,
    boottime_ns,
    endpoint,
    positive_float,
    probe_version,
    storage_guard,
)
from probe.cli.live_options import add_sample_arg, exporter_sink, sample_every
from probe.cli.workload import check_command
from probe.errors import RuntimeFailure, UsageError


def check_probe_env(env: dict[str, str], who: str) -> None:
    """Every ``PROBE_*`` value the probed command will read, checked here and now."""
    from probe.engine import hooks
    from probe.engine.hooks.snapshot import OverrideError, parse_override

    try:
        config.validate(env)
    except config.ConfigError as exc:
        raise UsageError(f"{who}: {exc}") from None
    fams = config.get(config.HOOKS, env)
    if fams:
        unknown = sorted({f.strip() for f in fams.split(",")} - set(hooks.FAMILIES))
        if unknown:
            raise UsageError(
                f"{who}: unknown hook families {unknown}; known: {', '.join(hooks.FAMILIES)}"
            )
    override = config.get(config.CG_SUPPORT_OVERRIDE, env)
    if override:
        try:
            parse_override(override)
        except OverrideError as exc:
            raise UsageError(f"{who}: --override {exc}") from None


def session_parent(run_dir: str | None, who: str) -> Path | None:
    """``--run-dir``, checked: an existing directory of ours (or one we can create)."""
    if run_dir is None:
        return None
    from probe.ring_dir import UnsafeRingDirError, check_ring_dir

    p = Path(run_dir)
    if not p.exists():
        if not p.parent.is_dir():
            raise UsageError(f"{who}: --run-dir {p}: directory {p.parent} does not exist")
        return p
    try:
        return check_ring_dir(p)
    except UnsafeRingDirError as exc:
        raise UsageError(f"{who}: --run-dir {exc}") from None


def cmd_record(args: argparse.Namespace) -> int:
    from probe.reader.recording_target import check_recording_target

    sample = sample_every(args.sample)
    cmd = check_command(list(args.command), "record")
    out = check_recording_target(args.out, force=args.force, flag="--out")
    parent = session_parent(args.run_dir, "record")
    env = dict(os.environ)
    env[config.ENABLE.name] = "1"
    env.setdefault(config.CONTROL.name, "0")
    if args.override:
        env[config.CG_SUPPORT_OVERRIDE.name] = args.override
    if args.hooks:
        env[config.HOOKS.name] = args.hooks
    if args.no_gpu_timing:
        env[config.GPU_TIMING.name] = "0"
    if sample > 1:
        env[config.SAMPLE_EVERY.name] = str(sample)
    check_probe_env(env, "record")
    sinks: list[Any] = []
    if args.prometheus:
        sinks.append(exporter_sink("prometheus", "--prometheus", args.prometheus, sample))
    if args.otlp:
        sinks.append(exporter_sink("otlp", "--otlp", args.otlp, sample))
    run_dir = _session_dir(parent)
    try:
        return _record(args, cmd, env, out, sample, sinks, run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _session_dir(parent: Path | None) -> Path:
    """The session's private folder for its rings, in ``--run-dir`` or the run directory
    (``$PROBE_RUN_DIR``: refused when it is not an absolute path, or not safe)."""
    from probe.reader.collector import ring_dir_for_session
    from probe.ring_dir import UnsafeRingDirError

    try:
        return ring_dir_for_session(parent)
    except UnsafeRingDirError as exc:
        raise UsageError(f"record: {exc}") from None
    except OSError as exc:
        raise RuntimeFailure(f"record: cannot make the session's run directory: {exc}") from None


def _record(
    args: argparse.Namespace,
    cmd: list[str],
    env: dict[str, str],
    out: Path,
    sample: int,
    sinks: list[Any],
    run_dir: Path,
) -> int:
    from probe.reader.collector import Collector, RecordingSink
    from probe.reader.recording_target import writer_at

    # everything is checked: from here on a failure is the command's or the disk's
    writer = writer_at(out, "record")
    writer.set_meta(
        command=cmd,
        probe_command=["probe", *sys.argv[1:]],
        host=socket.gethostname(),
        probe_version=probe_version(),
        override=args.override or "",
        sample_every=sample,
        started_epoch_ns=time.time_ns(),
    )
    sinks.insert(0, RecordingSink(writer))
    env[config.RUN_DIR.name] = str(run_dir)
    return _run(args, cmd, env, out, writer, Collector(run_dir, sinks, now_ns=boottime_ns))


def _run(
    args: argparse.Namespace,
    cmd: list[str],
    env: dict[str, str],
    out: Path,
    writer: Any,
    col: Any,
) -> int:
    err = sys.stderr
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        storage_guard(col.close, out)
        for suffix in ("", "-wal", "-shm", "-journal"):  # a command that never ran: no recording
            Path(f"{out}{suffix}").unlink(missing_ok=True)
        raise RuntimeFailure(f"record: cannot start {cmd[0]}: {exc.strerror or exc}") from None
    # said once the command runs: a command that cannot start is the one error line
    print(f"probe: recording {' '.join(cmd)} -> {out}", file=err)
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
    steps = sum(p.steps_seen for p in col.procs.values())
    forward = sum(p.forward_seen for p in col.procs.values())
    dropped = sum(p.dropped for p in col.procs.values())
    print(
        f"probe: {forward:,} forward steps ({steps - forward:,} more ran no forward) from "
        f"{sum(1 for p in col.procs.values() if p.steps_seen)} process(es) recorded to "
        f"{out} ({dropped:,} records dropped)",
        file=err,
    )
    for e in col.errors[:5]:
        print(f"probe: warning: {e}", file=err)
    if failed is not None:
        print(f"probe: error: {failed}; what was committed before is readable", file=err)
        return int(child.returncode or 1)
    return int(child.returncode or 0)


def add_parser(sub: Any) -> None:
    r = sub.add_parser(
        "record",
        help="run a command with the probe on; write a recording",
        description="Run a command (after --, e.g. vllm serve MODEL or a benchmark script) "
        "with the probe on from its first step, read every vLLM process it starts, and "
        "write one recording (--out) when the command ends, --duration passes or Ctrl-C.",
    )
    r.add_argument(
        "--out",
        "-o",
        required=True,
        help="recording to write: a folder NAME.probe (columnar); a name ending in .db: SQLite",
    )
    r.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    r.add_argument(
        "--override",
        help="what-if graph support, e.g. "
        "FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE",
    )
    r.add_argument("--hooks", help="comma-separated hook families (default: all)")
    r.add_argument(
        "--duration", type=positive_float, help="stop the command after S seconds (SIGINT)"
    )
    r.add_argument("--interval", type=positive_float, default=0.05, help="ring poll interval, s")
    r.add_argument("--run-dir", help="directory for the session's rings")
    r.add_argument("--no-gpu-timing", action="store_true", help="no device events")
    add_sample_arg(r)
    r.add_argument(
        "--prometheus",
        metavar="ADDR",
        type=address,
        help="also serve /metrics on ADDR (host:port)",
    )
    r.add_argument(
        "--otlp",
        metavar="ENDPOINT",
        type=endpoint,
        help="also export spans and metrics over OTLP",
    )
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    r.set_defaults(func=cmd_record)
