"""``probe report``: summarize a recording (no file: the bundled H200 recording).

probe report run.probe.db
probe report run.probe.db --json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from probe.cli.commands import console, open_recording, width


def cmd_report(args: argparse.Namespace) -> int:
    from probe.cli.render_report import build_report, render_report

    # a damaged recording read past its checks raises RecordingError (Recording turns
    # SQLite's damage into one too): one line from probe.cli.main.main, as for every command
    rep = build_report(open_recording(args.recording))
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
    else:
        render_report(rep, console(args))
    return 0


def add_recording_args(q: argparse.ArgumentParser) -> None:
    """The recording, ``--json`` and ``--width`` of ``report`` and ``doctor``."""
    q.add_argument("recording", nargs="?", help="recording (default: the bundled one)")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.add_argument("--width", type=width, help="terminal width in columns (20..1000)")


def add_parser(sub: Any) -> None:
    q = sub.add_parser("report", help="summarize a recording")
    add_recording_args(q)
    q.set_defaults(func=cmd_report)
