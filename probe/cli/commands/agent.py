"""``probe agent``: follow every armed vLLM process of this host and export continuously.

    probe agent --prometheus 0.0.0.0:9464 --sample 8
    probe agent --run-dir /run/vllm-probe --otlp http://collector:4318 \\
        --record-dir /var/lib/probe --rotate 60 --keep 48

It attaches to every armed process under the run directories as it appears (a new server,
a restarted engine, a new rank), exports until SIGTERM or Ctrl-C, then turns every hook
off; killed, each process's watchdog does that (docs/agent.md). The loop is
:mod:`probe.reader.agent`.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path
from typing import Any

from probe.cli.attach_session import add_share_arg, take_share
from probe.cli.commands import address, endpoint, positive_float, positive_int
from probe.cli.live_options import add_sample_arg, exporter_sink, hook_families, sample_every
from probe.errors import UsageError


def _record_dir(text: str) -> Path:
    p = Path(text)
    if p.is_symlink() or not p.is_dir():
        raise UsageError(f"--record-dir {text}: not a directory (create it first)")
    import os

    if not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"--record-dir {text}: not writable")
    return p


def cmd_agent(args: argparse.Namespace) -> int:
    if not (args.prometheus or args.otlp or args.record_dir):
        raise UsageError("agent: give at least one of --prometheus, --otlp, --record-dir")
    take_share(args.session_nice, args.cmd)
    hooks = hook_families(args.hooks)
    sample = sample_every(args.sample)
    dirs = _run_dirs(args)
    record_dir = _record_dir(args.record_dir) if args.record_dir else None
    sinks: list[Any] = []
    try:
        if args.prometheus:
            sink = exporter_sink("prometheus", "--prometheus", args.prometheus)
            sink.linger_s = args.linger
            sinks.append(sink)
        if args.otlp:
            sinks.append(exporter_sink("otlp", "--otlp", args.otlp))
    except BaseException:
        for s in sinks:
            with contextlib.suppress(Exception):
                s.linger_s = 0.0
                s.close()
        raise
    from probe.reader.agent import Agent, RollingRecordings

    if record_dir is not None:
        sinks.append(
            RollingRecordings(
                record_dir,
                args.rotate * 60.0,
                args.keep,
                meta={"command": ["probe", *sys.argv[1:]], "sample_every": sample, "agent": True},
            )
        )
    agent = Agent(
        dirs,
        sinks,
        sample_every=sample,
        hooks=hooks,
        gpu_timing=False if args.no_gpu_timing else None,
        scan_s=args.scan,
        interval_s=args.interval,
        forget_s=args.forget * 60.0,
        drain_rate=args.drain_rate,
        **({"lag_warn_s": args.lag_warn} if args.lag_warn is not None else {}),
    )
    for s in sinks:
        if hasattr(s, "note"):
            s.note = agent.say

    def on_signal(signum: int, _frame: Any) -> None:
        agent.stop(signal.Signals(signum).name)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    where = ", ".join(str(d) for d in dirs)
    outs = [
        *([f"Prometheus {sinks[0].url}"] if args.prometheus else []),
        *([f"OTLP {args.otlp}"] if args.otlp else []),
        *([f"recordings in {record_dir} every {args.rotate:g} min"] if record_dir else []),
    ]
    from probe.reader import session as sharing

    agent.say(f"watching {where}; {', '.join(outs)}; CPU share: {sharing.SHARE}")
    try:
        agent.run()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        problems = agent.close()
    c = agent.counts
    agent.say(
        f"stopped ({agent.stopping or 'done'}): {c['attaches']} attached, {c['detaches']} "
        f"detached, {c['restarts']} restarts, {agent.steps_seen:,} forward steps, "
        f"{agent.dropped_done:,} records dropped"
    )
    for p in problems:
        print(f"probe: warning: {p}", file=sys.stderr)
    if agent.failed:
        print(f"probe: error: {agent.failed}", file=sys.stderr)
        return 1
    return 0


def _run_dirs(args: argparse.Namespace) -> list[Path]:
    from probe.ring_dir import UnsafeRingDirError, candidate_run_dirs, check_ring_dir

    out = []
    for d in args.run_dir or ():
        try:
            out.append(check_ring_dir(d))
        except (FileNotFoundError, NotADirectoryError):
            raise UsageError(f"--run-dir {d}: no such directory") from None
        except UnsafeRingDirError as exc:
            raise UsageError(str(exc)) from None
    if out:
        return out
    dirs = candidate_run_dirs()
    if not dirs:
        from probe.ring_dir import default_ring_dir

        dirs = [default_ring_dir()]
    return dirs


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "agent",
        help="follow every armed vLLM process of this host and export continuously",
        description="Stay on beside a host's vLLM servers: attach to every armed vLLM process "
        "under the run directories as it appears (a new server, a restarted engine, a new "
        "rank), export its steps to Prometheus and/or OTLP, optionally write rolling "
        "recordings (--record-dir, a new file every --rotate minutes), until SIGTERM or "
        "Ctrl-C; then every hook goes dormant again.",
    )
    p.add_argument(
        "--run-dir",
        action="append",
        metavar="DIR",
        help="a run directory to watch (repeatable; default: PROBE_RUN_DIR's)",
    )
    add_sample_arg(p)
    p.add_argument(
        "--prometheus", metavar="ADDR", type=address, help="serve /metrics on ADDR (host:port)"
    )
    p.add_argument("--otlp", metavar="ENDPOINT", type=endpoint, help="export OTLP to ENDPOINT")
    p.add_argument("--record-dir", metavar="DIR", help="write rolling recordings into DIR")
    p.add_argument(
        "--rotate",
        type=positive_float,
        default=60.0,
        metavar="MIN",
        help="a new recording file every MIN minutes (default 60)",
    )
    p.add_argument(
        "--keep", type=positive_int, default=24, metavar="N", help="keep the newest N files"
    )
    p.add_argument("--hooks", help="comma-separated hook families (default: all)")
    p.add_argument("--no-gpu-timing", action="store_true", help="no device events")
    p.add_argument("--interval", type=positive_float, default=0.1, help="ring poll interval, s")
    p.add_argument(
        "--scan", type=positive_float, default=1.0, metavar="S", help="look for new processes"
    )
    p.add_argument(
        "--forget",
        type=positive_float,
        default=15.0,
        metavar="MIN",
        help="drop an ended process's series MIN minutes after it ended",
    )
    p.add_argument(
        "--linger",
        type=positive_float,
        default=None,
        metavar="S",
        help="at stop, serve /metrics until the last values were scraped, at most S "
        "(default: two scrape intervals seen)",
    )
    p.add_argument(
        "--lag-warn",
        type=positive_float,
        metavar="S",
        help="warn in the log when a ring's records wait over S seconds to be read (default 10)",
    )
    p.add_argument(
        "--drain-rate",
        type=positive_float,
        metavar="N",
        help="assemble at most N records a second (a cap on the agent's CPU; beyond it the "
        "agent falls behind, says so and exports its lag; at the stop it reads everything)",
    )
    add_share_arg(p)
    p.set_defaults(func=cmd_agent)
