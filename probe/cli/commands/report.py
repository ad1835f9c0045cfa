"""``probe report``: summarize a recording (no file: the bundled H200 recording), or
several as one (rolling files of one agent, the ranks of several hosts; a quoted glob is
expanded), their summaries merged.

probe report run.probe
probe report run.probe --json
probe report 'agent-*.probe'
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from probe.cli.commands import console, open_recording, width


def cmd_report(args: argparse.Namespace) -> int:
    from probe.cli.render_report import build_report, render_report

    # a damaged recording read past its checks raises RecordingError (Recording turns
    # SQLite's damage into one too): one line from probe.cli.main, as for every command
    paths = _expand(args.recording) if args.recording else [None]
    recs = [open_recording(p) for p in paths]
    rep = build_report(recs[0] if len(recs) == 1 else recs)
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
    else:
        render_report(rep, console(args.width))
    return 0


def _expand(patterns: list[str]) -> list[str]:
    """Each argument as a path, the files a glob in it names, or a folder's recordings
    (:func:`probe.reader.recording_set.expand_paths`, as every command takes them)."""
    from probe.reader.recording_set import expand_paths

    return [str(p) for p in expand_paths(patterns)]


def add_parser(sub: Any) -> None:
    q = sub.add_parser(
        "report",
        help="summarize a recording (or several as one)",
        description="Summarize a recording offline: hit rates, miss reasons, CPU launch "
        "overhead by phase, engine idle, ranks side by side and the verdict, over steady "
        "state (warm-up apart). Several files or a quoted glob are summarised as one; with "
        "no file, the bundled recording.",
    )
    q.add_argument(
        "recording",
        nargs="*",
        help="recording(s), a quoted glob or a folder of recordings, summarised as one "
        "(default: the bundled one)",
    )
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.add_argument("--width", type=width, help="terminal width in columns (20..1000)")
    q.set_defaults(func=cmd_report)
