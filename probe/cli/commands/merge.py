"""``probe merge``: a recording and GPU profiles on one Perfetto timeline, and a per-step check.

    probe merge run.probe trace.json.gz --out merged.pftrace          # Kineto
    probe merge run.probe rocprof_out/ --out merged.pftrace           # rocprofv3 CSV dir
    probe merge run.probe 1234_results.db --out merged.pftrace        # rocpd
    probe merge run.probe trace.json.gz --report                      # per-step table
    probe merge 'ranks/*.probe' trace.json.gz --out merged.pftrace    # several as one

Several recordings (a glob, or recordings given before the profiles) are read as one: their
processes side by side, their steps in (pid, step) order.

Open the ``.pftrace`` at https://ui.perfetto.dev ("Open trace file"). A profile that
cannot be placed on the recording's clock (another host, another run, no overlap) is an
error naming the file; ``--offset-ns`` or ``--allow-unaligned`` merge it anyway.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from probe.cli import progress
from probe.cli.commands import open_recording
from probe.errors import UsageError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "merge",
        help="merge a recording with GPU profiles (rocprofv3, rocpd, Kineto) into Perfetto",
        description=__doc__.split("\n")[0] if __doc__ else None,
    )
    p.add_argument(
        "recording",
        help="probe recording (NAME.probe or NAME.probe.db) or a glob; recordings among the "
        "profiles join it",
    )
    p.add_argument(
        "profiles",
        nargs="+",
        metavar="PROFILE",
        help="rocprofv3 CSV directory or files, rocprofv3 JSON, rocpd .db, Kineto .json[.gz]",
    )
    p.add_argument("--out", "-o", help="Perfetto trace to write (.pftrace; -: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite --out and --rocpd")
    p.add_argument(
        "--rocpd",
        metavar="PATH",
        help="also write the recording as a rocpd side-car (.db), in the schema and node of "
        "the first rocpd profile given, for 'rocpd merge' / 'rocpd convert'",
    )
    p.add_argument("--report", action="store_true", help="print the per-step launch table")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.add_argument(
        "--offset-ns",
        type=int,
        help="add this to every profile timestamp instead of aligning (BOOTTIME = t + offset)",
    )
    p.add_argument(
        "--allow-unaligned",
        action="store_true",
        help="merge a profile that cannot be aligned, placed at the recording's first step",
    )
    p.add_argument(
        "--forward-marker",
        default="_model_forward",
        help="Kineto Python event matched with the probe's forward spans (default: %(default)s)",
    )
    progress.add_flag(p, "inputs loaded, profiles aligned, the trace written")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from probe.reader.recording import RecordingError

    try:
        return _run(args)
    except RecordingError as exc:  # a damaged row met while merging: nothing is left
        raise UsageError(str(exc)) from None


def _run(args: argparse.Namespace) -> int:
    from exporters.timelines.crosscheck import format_step_table
    from exporters.timelines.load import profile_path

    if not args.out and not args.report and not args.json and not args.rocpd:
        raise UsageError("merge: give --out FILE.pftrace and/or --report")
    from probe.reader.output import check_target

    out = check_target(args.out, force=args.force, flag="--out") if args.out else None
    if args.rocpd == "-":
        raise UsageError("merge: --rocpd writes a database file; - (stdout) is not one")
    args.rocpd_out = (
        check_target(args.rocpd, force=args.force, flag="--rocpd") if args.rocpd else None
    )
    to_stdout = args.out == "-"
    if to_stdout and (args.report or args.json):
        raise UsageError("merge: --out - writes the trace to stdout: no --report/--json with it")
    rec = _open(args)
    with progress.display_for(args.progress, plain=to_stdout or args.json) as bars:
        reports = _merge(args, rec, out, bars)
    if args.json:
        print(
            json.dumps(
                [{"profile": profile_path(p), **t.as_dict()} for p, t in reports],
                indent=1,
                default=str,
            )
        )
    elif args.report:
        for prof, table in reports:
            print(f"\n{profile_path(prof)}")
            print(format_step_table(table))
    return 0


def _is_recording(name: str) -> bool:
    """A probe recording (a columnar recording's folder, an SQLite file with the
    recording's application id), or a glob whose every match is one; anything else is a
    profile."""
    import glob
    import os
    import stat

    from probe.reader.columnar_schema import is_columnar
    from probe.reader.recording_schema import APPLICATION_ID

    paths = glob.glob(name, recursive=True) if any(c in name for c in "*?[") else [name]
    if not paths:
        return False
    for p in paths:
        if is_columnar(p):
            continue
        try:
            # only a regular file is read: a FIFO would block here (the profile loader
            # refuses it with one line)
            if not stat.S_ISREG(os.stat(p).st_mode):
                return False
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                head = os.pread(fd, 72, 0)
            finally:
                os.close(fd)
        except OSError:
            return False
        if head[:16] != b"SQLite format 3\x00" or int.from_bytes(head[68:72]) != APPLICATION_ID:
            return False
    return True


def _open(args: argparse.Namespace) -> Any:
    """The recording argument and the recordings among the profiles, read as one; the
    rest stay profiles (``args.profiles``)."""
    from probe.reader.recording import RecordingError
    from probe.reader.recording_set import open_many

    names = [args.recording]
    profiles: list[str] = []
    for p in args.profiles:
        (names if _is_recording(p) else profiles).append(p)
    if not profiles:
        raise UsageError("merge: give a GPU profile after the recording(s)")
    args.profiles = profiles
    if len(names) == 1 and not any(c in names[0] for c in "*?["):
        return open_recording(names[0])
    try:
        return open_many(names)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None


def _merge(args: argparse.Namespace, rec: Any, out: Any, bars: progress.Display) -> list[Any]:
    """Load, align, write; returns the per-step tables asked for (``--report``)."""
    from exporters.timelines.align import AlignmentError, align
    from exporters.timelines.crosscheck import step_table
    from exporters.timelines.load import load_profiles, profile_path
    from exporters.timelines.merge import merge_to_perfetto
    from exporters.timelines.model import ProfileError
    from probe.reader.output import path_for, together

    to_stdout = args.out == "-"
    try:
        profiles = load_profiles(args.profiles, progress=bars)
    except ProfileError as exc:
        raise UsageError(str(exc)) from None
    placed = []
    bars.stage("aligning", len(profiles), "profiles")
    try:
        for prof in profiles:
            al = align(
                rec,
                prof,
                offset_ns=args.offset_ns,
                allow_unaligned=args.allow_unaligned,
                forward_marker=args.forward_marker,
            )
            placed.append((prof, al))
            bars.advance()
    except AlignmentError as exc:
        raise UsageError(str(exc)) from None
    reports = []
    for prof, al in placed:
        if not args.json and not to_stdout:
            bars.echo(f"{profile_path(prof)}: {al.describe()}", stdout=True)
        if args.report or args.json:
            reports.append((prof, step_table(rec, prof, al)))
    # --out and --rocpd both or neither: renamed onto their targets once both are written
    wrote: list[str] = []
    with together():
        if args.out:
            from exporters.perfetto import PerfettoUnavailableError

            try:
                with path_for(out) as tmp:
                    counts = merge_to_perfetto(rec, placed, tmp, progress=bars)
            except PerfettoUnavailableError as exc:
                raise UsageError(str(exc)) from None
            except ValueError as exc:  # a timestamp the offset put before 0
                raise UsageError(f"merge: {exc}; check --offset-ns") from None
            if not args.json and not to_stdout:
                wrote.append(
                    f"wrote {out}: {counts['step']} steps, {counts['phase']} phase spans, "
                    f"{counts['kernels']} kernels, {counts['host_calls']} host calls, "
                    f"{counts['flows']} launch->kernel flows (open it at https://ui.perfetto.dev)"
                )
        if args.rocpd:
            from exporters.rocprof_sidecar import write_sidecar

            rocpd_out = args.rocpd_out
            rocprof_db = next((p.meta["path"] for p, _ in placed if p.source == "rocpd"), None)
            try:
                with path_for(rocpd_out, create=False) as tmp:
                    n = write_sidecar(rec, tmp, rocprof_db=rocprof_db, progress=bars)
            except (ProfileError, ValueError, FileExistsError) as exc:
                raise UsageError(f"merge: --rocpd {args.rocpd}: {exc}") from None
            if not args.json:
                wrote.append(f"wrote {args.rocpd}: {n} probe spans as rocpd regions")
    for line in wrote:
        bars.echo(line, stdout=True)
    return reports
