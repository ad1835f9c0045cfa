"""``probe convert``: a recording in the other format.

probe convert run.probe run.probe        # SQLite -> columnar (a folder)
probe convert run.probe run.probe        # columnar -> SQLite
probe convert 'agent-*.probe' all.probe  # several recordings as one
"""

from __future__ import annotations

import argparse
from typing import Any

from probe.errors import UsageError


def cmd_convert(args: argparse.Namespace) -> int:
    from probe.cli.terminal import SafeConsole
    from probe.reader.columnar_convert import convert
    from probe.reader.columnar_schema import is_sqlite_name
    from probe.reader.recording import RecordingError
    from probe.reader.recording_target import check_recording_target

    out = check_recording_target(args.out, force=args.force, flag="out")
    try:
        n = convert(args.recording, out, to_sqlite=is_sqlite_name(out))
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    kind = "SQLite" if is_sqlite_name(out) else "columnar"
    SafeConsole(stderr=True).print(f"probe convert: {n:,} steps written to {out} ({kind})")
    return 0


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "convert",
        help="write a recording in the other format (SQLite <-> columnar)",
        description="Write the recording(s) given (a file, a folder, a glob: read as one) "
        "as one new recording: a name ending in .db is written as SQLite, any other as a "
        "columnar recording folder (Parquet). Every value is checked as it is read; the "
        "outputs of every command are the same for both.",
    )
    c.add_argument("recording", nargs="+", help="the recording(s) to read")
    c.add_argument("out", help="the new recording (NAME.probe, or NAME.probe.db for SQLite)")
    c.add_argument("--force", action="store_true", help="overwrite out if it exists")
    c.set_defaults(func=cmd_convert)
