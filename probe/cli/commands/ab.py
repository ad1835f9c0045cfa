"""``probe ab``: the same workload under two graph-support settings, side by side.

    # run the workload N times per arm, interleaved A B B A A B ...; arm B applies the
    # what-if override (before vLLM resolves its graph mode), arm A runs stock
    probe ab --b-override FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE \\
        --reps 5 --out ab/ -- python bench.py

    # or compare recordings made elsewhere (e.g. by benchmarks/gpu/harness.py)
    probe ab --a 'stock*.probe' --b 'ustd*.probe'

Each run is a ``probe record`` session. Per arm the comparison shows, over steady state
(the rules of :mod:`probe.analysis.rules`): throughput (scheduled tokens per second of
steady serving time), host time per step, CPU launch overhead, the decode FULL share,
the forward launch and the draft; each B/A with a 95% interval. The steps of the two arms
pair by batch shape when the workloads match, and the interval is over the repetitions
(two or more recordings per arm), or over the variation within the recordings; when the
workloads do not match it says so. The verdict names the faster arm only where the
throughput interval excludes 1. The method, and its error measured on committed
recordings: :mod:`probe.analysis.ab` and ``docs/rules.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from probe.cli import progress
from probe.cli.terminal import SafeConsole
from probe.progress import SILENT, Progress


def summarize(path: Path, bars: Progress = SILENT) -> Any:
    """One recording -> its part in the comparison (:func:`probe.analysis.ab.read_run`;
    ``bars``: one advance when it is read)."""
    from probe.analysis.ab import read_run
    from probe.errors import UsageError
    from probe.reader.recording import Recording, RecordingError

    try:
        rec = Recording.open(path)
        rec.meta()  # checked as `report` checks it: a damaged row is one line, not ignored
        run = read_run(rec, str(path))
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    rec.close()
    bars.advance()
    if not run.forward_steps:
        raise UsageError(f"{path}: no forward steps recorded")
    return run


def render(cmp: dict[str, Any], console: Console, labels: tuple[str, str]) -> None:
    na, nb = cmp["reps"]["A"], cmp["reps"]["B"]
    t = Table(
        title=f"probe ab: A = {labels[0]}   B = {labels[1]}   ({na} recording"
        f"{'s' if na != 1 else ''} of A, {nb} of B; steady state; B/A with a 95% interval "
        f"over {cmp['interval_over']})",
        title_justify="left",
    )
    for c in ("metric", "A", "B", "B/A", "95% interval"):
        t.add_column(c, justify="left" if c == "metric" else "right")

    def fmt(k: str, v: float) -> str:
        if k.endswith("_ns"):
            return f"{v / 1e3:,.0f} µs"
        if k.endswith("share"):
            return f"{v:.1%}"
        return f"{v:,.1f}"

    for k, m in cmp["metrics"].items():
        r = m["ratio_B_over_A"]
        iv = "-" if m["low"] is None else f"[{m['low']:.3f}, {m['high']:.3f}]"
        t.add_row(m["label"], fmt(k, m["A"]), fmt(k, m["B"]), "-" if r is None else f"{r:.3f}", iv)
    console.print(t)
    for note in cmp["notes"]:
        console.print(note)
    console.print(f"verdict: {cmp['verdict']}")
    for arm in ("A", "B"):
        reasons = ", ".join(f"{k} x{v}" for k, v in cmp["reasons"][arm].items())
        console.print(f"{arm}: top mode/reason (steady, every recording): {reasons}")


def run_arms(
    args: argparse.Namespace, bars: progress.Display | None = None
) -> tuple[list[Path], list[Path]]:
    from probe.errors import UsageError

    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("ab: give the workload command after --, or --a/--b recordings")
    from probe.cli.workload import check_command

    cmd = check_command(cmd, "ab")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"ab: --out {out} is not a directory")
    if not out.parent.is_dir():
        raise UsageError(f"ab: --out {out}: directory {out.parent} does not exist")
    planned = [out / f"{arm}-{i}.probe" for i in range(args.reps) for arm in ("A", "B")]
    there = [p for p in planned if os.path.lexists(p)]
    if there and not args.force:
        raise UsageError(f"ab: {there[0]} exists (use --force to overwrite)")
    out.mkdir(exist_ok=True)
    bars = bars or progress.Display(None)
    arms: dict[str, list[Path]] = {"A": [], "B": []}
    bars.stage("ab", 2 * args.reps, "runs")
    for i in range(args.reps):
        order = ("A", "B") if i % 2 == 0 else ("B", "A")
        for arm in order:
            override = args.a_override if arm == "A" else args.b_override
            rec = out / f"{arm}-{i}.probe"
            argv = [sys.executable, "-m", "probe", "record", "--force", "--out", str(rec)]
            if override:
                argv += ["--override", override]
            t = time.monotonic()
            bars.describe(f"ab: run {i + 1}/{args.reps} arm {arm}")
            rc = _run_workload([*argv, "--", *cmd], bars)
            bars.advance()
            bars.echo(
                f"probe ab: run {i} arm {arm}: exit {rc} in {time.monotonic() - t:.1f}s -> {rec}"
            )
            if rc != 0:
                raise UsageError(f"ab: the workload failed in arm {arm} run {i} (exit {rc})")
            arms[arm].append(rec)
    return arms["A"], arms["B"]


def _run_workload(argv: list[str], bars: progress.Display) -> int:
    """Run one arm; its own output goes to stderr (stdout is the comparison). Under a
    progress display its lines are passed on above the display, which they would
    otherwise overwrite (a carriage-return redraw keeps only its last state)."""
    if not bars.on:
        return subprocess.run(argv, stdout=sys.stderr).returncode
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        for raw in proc.stdout or ():
            line = raw.decode(errors="replace").rstrip("\r\n").rsplit("\r", 1)[-1]
            bars.echo(line)
    return proc.returncode


def cmd_ab(args: argparse.Namespace) -> int:
    from probe.errors import UsageError

    run_mode = not (args.a or args.b)
    a_paths: list[Path] = []
    b_paths: list[Path] = []
    if not run_mode:
        if not (args.a and args.b):
            raise UsageError("ab: give both --a and --b recordings")
        from probe.reader.recording import RecordingError
        from probe.reader.recording_set import expand_paths

        try:
            a_paths, b_paths = expand_paths(args.a), expand_paths(args.b)
        except RecordingError as exc:
            raise UsageError(f"ab: {exc}") from None
        labels = (args.a_label or "A", args.b_label or "B")
    else:
        if not args.b_override:
            raise UsageError(
                "ab: --b-override is required to run arms (e.g. "
                "--b-override FlashMLASparseMetadataBuilder="
                "UNIFORM_SINGLE_TOKEN_DECODE)"
            )
        from probe.engine.hooks.snapshot import OverrideError, parse_override

        for o in (args.a_override, args.b_override):
            if o:
                try:
                    parse_override(o)
                except OverrideError as exc:
                    raise UsageError(f"ab: {exc}") from None
        labels = (args.a_override or "stock", args.b_override)
    with progress.display_for(args.progress, plain=args.json) as bars:
        if run_mode:
            a_paths, b_paths = run_arms(args, bars)
        bars.stage("ab: reading recordings", len(a_paths) + len(b_paths), "recordings")
        sa = [summarize(p, bars) for p in a_paths]
        sb = [summarize(p, bars) for p in b_paths]
    from probe.analysis.ab import compare

    cmp = compare(sa, sb)
    if args.json:
        print(json.dumps(cmp, indent=1))
    else:
        render(cmp, SafeConsole(width=args.width), labels)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "ab",
        help="A/B the graph-support mode on the same workload",
        description="Compare two arms, A and B: run a workload alternately with each arm's "
        "graph-support override (-- WORKLOAD) or compare recordings (--a/--b), and print "
        "throughput, graph mode and CPU launch overhead side by side.",
    )
    from probe.cli.commands import positive_int, width

    p.add_argument("--a", nargs="+", help="recordings of arm A, or a quoted glob (compare mode)")
    p.add_argument("--b", nargs="+", help="recordings of arm B, or a quoted glob (compare mode)")
    p.add_argument("--a-label", help="name of arm A in the table (default: A)")
    p.add_argument("--b-label", help="name of arm B in the table (default: B)")
    p.add_argument("--a-override", help="what-if for arm A (default: stock)")
    p.add_argument("--b-override", help="what-if for arm B, e.g. Builder=SUPPORT")
    p.add_argument(
        "--reps", type=positive_int, default=5, help="runs per arm, interleaved (default: 5)"
    )
    p.add_argument(
        "--out", default="probe-ab", help="directory for the runs' recordings (default: probe-ab)"
    )
    p.add_argument("--force", action="store_true", help="overwrite recordings already in --out")
    p.add_argument("--json", action="store_true", help="the comparison as JSON")
    p.add_argument("--width", type=width, help="terminal width in columns")
    progress.add_flag(p, "runs done, the arm running, elapsed")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- WORKLOAD [ARGS...] (run mode)")
    p.set_defaults(func=cmd_ab)
