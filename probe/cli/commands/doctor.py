"""``probe doctor``: the static graph-support picture and known traps.

probe doctor run.probe                  # from a recording's snapshot
probe doctor --url http://127.0.0.1:8000   # from a running server, live
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from probe.cli.commands import console, open_recording, width
from probe.cli.targets import Target, add_target_args, discover
from probe.errors import UsageError


def _live_snapshots(target: Target) -> list[dict[str, Any]]:
    """Snapshots of a running server's processes, over their control sockets."""
    from probe.reader.control import request_all

    procs = [p for p in discover(target) if not p.error]
    snaps = []
    for proc, reply in zip(
        procs, request_all([p.socket for p in procs], "snapshot"), strict=True
    ):  # asked together, as the attach does
        if isinstance(reply, Exception):
            print(f"probe: warning: pid {proc.pid}: {reply}", file=sys.stderr)
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
    from probe.cli.render_report import doctor, render_doctor

    if args.pid or args.url:
        if args.recording:
            raise UsageError("doctor: give a recording or --pid/--url, not both")
        out = [doctor(s) for s in _live_snapshots(Target.from_args(args))]
    else:
        rec = open_recording(args.recording)
        procs = [p for p in rec.processes() if p.get("snapshot")]
        if not procs:
            raise UsageError(f"doctor: {rec.path} holds no static snapshot (no step was recorded)")
        # the recording's steps too: a trap the snapshot alone cannot decide is counted
        # from them by the one summary, as `probe report` does (probe.analysis.traps.traps)
        from probe.analysis.summary_read import summarize_recordings
        from probe.cli.render_report import counts_of

        ranks = summarize_recordings([rec]).rank_figures()
        out = [doctor(p["snapshot"], counts_of(ranks.get(p["pid"]))) for p in procs]
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        con = console(args.width)
        for s in out:
            render_doctor(s, con)
    return 0


def add_parser(sub: Any) -> None:
    q = sub.add_parser(
        "doctor",
        help="static graph-support picture and known traps",
        description="The static picture of a recording (or of a running server with --url): "
        "vLLM version, runner, each builder's graph support per attention group, the "
        "group that limits the engine, the resolved graph mode, and the known traps.",
    )
    q.add_argument("recording", nargs="?", help="recording (default: the bundled one)")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.add_argument("--width", type=width, help="terminal width in columns (20..1000)")
    add_target_args(q)
    q.set_defaults(func=cmd_doctor)
