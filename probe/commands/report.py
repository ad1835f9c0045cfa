"""``probe report``: summarize a recording (no file: the bundled H200 recording).

probe report run.probe.db
probe report run.probe.db --json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from probe.commands import console, open_recording, width
from probe.errors import SQLITE_DAMAGED, UsageError


def cmd_report(args: argparse.Namespace) -> int:
    from probe.recording import RecordingError, damaged_error
    from probe.report import build_report, render_report

    rec = open_recording(args.recording)
    try:
        rep = build_report(rec)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    except SQLITE_DAMAGED as exc:
        raise UsageError(str(damaged_error(rec.path, exc))) from None
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
