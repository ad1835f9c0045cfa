"""``probe ab``: the same workload under two graph-support settings, side by side.

    # run the workload N times per arm, interleaved A B B A A B ...; arm B applies the
    # what-if override (before vLLM resolves its graph mode), arm A runs stock
    probe ab --b-override FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE \\
        --reps 5 --out ab/ -- python bench.py

    # or compare recordings made elsewhere (e.g. by benchmarks/gpu/harness.py)
    probe ab --a stock*.probe.db --b ustd*.probe.db

Each run is a ``probe record`` session. Per arm the report shows throughput (scheduled
tokens per second of step time, from the recording, and the command's wall time), the
full and decode-FULL hit rates, the top miss reasons, CPU launch overhead and phase
medians of uniform decode steps, GPU idle, each as the median over repetitions with the
min-max spread, and the ratio B/A.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from probe import progress
from probe.analysis import summary as analysis
from probe.step import Step
from probe.terminal import SafeConsole

PHASES = ("prepare_inputs", "metadata_build", "forward_launch", "sample", "draft")


def _phase_median(phase: str, steps: Sequence[Step]) -> float | None:
    return statistics.median(s.phases.get(phase, 0) for s in steps) if steps else None


def _mode_reason(s: Step) -> str:
    mode = s.mode.name.lower() if s.mode is not None else None
    return f"{mode}/{s.reason.label if s.reason is not None else None}"


def summarize(path: Path, bars: progress.Progress = progress.SILENT) -> dict[str, Any]:
    """One recording -> the numbers ``probe ab`` compares (``bars``: one advance when
    it is read)."""
    from probe.errors import UsageError
    from probe.reader.recording import Recording, RecordingError

    try:
        rec = Recording.open(path)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    try:
        fw = analysis.forward_steps(rec.iter_steps())
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    meta = rec.meta()
    rec.close()
    bars.advance()
    if not fw:
        raise UsageError(f"{path}: no forward steps recorded")
    rates = analysis.hit_rates(fw)
    busy_ns = sum(s.t1 - s.t0 for s in fw)
    tokens = sum(s.num_tokens for s in fw)
    dec = [s for s in fw if s.decode]

    def med(value: Callable[[Step], int | None], steps: Sequence[Step]) -> float | None:
        vals = [v for s in steps if (v := value(s)) is not None]
        return statistics.median(vals) if vals else None

    wall = None
    if meta.get("started_epoch_ns") and meta.get("ended_epoch_ns"):
        wall = (int(meta["ended_epoch_ns"]) - int(meta["started_epoch_ns"])) / 1e9
    return {
        "recording": str(path),
        "steps": len(fw),
        # scheduled tokens per second of step time: insensitive to idle gaps between runs
        "tokens_per_step_second": tokens / (busy_ns / 1e9) if busy_ns else None,
        "wall_s": wall,
        "full_hit_rate": rates["full_hit_rate"],
        "decode_full_hit_rate": rates["decode_full_hit_rate"],
        "reasons": dict(Counter(_mode_reason(s) for s in fw).most_common(3)),
        "decode_host_ns": med(lambda s: s.host_ns, dec),
        "decode_cpu_launch_overhead_ns": med(lambda s: s.cpu_launch_overhead_ns, dec),
        "decode_gpu_idle_before_ns": med(lambda s: s.gpu_idle_before_ns, dec),
        **{f"decode_{p}_ns": _phase_median(p, dec) for p in PHASES},
    }


def _spread(vals: Sequence[float | None]) -> dict[str, float | None]:
    xs = [v for v in vals if v is not None]
    if not xs:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k in a[0] if isinstance(a[0][k], (int, float)) or a[0][k] is None]
    keys = [k for k in keys if k not in ("steps",)]
    out: dict[str, Any] = {"reps": {"A": len(a), "B": len(b)}, "metrics": {}}
    for k in keys:
        sa = _spread([x.get(k) for x in a])
        sb = _spread([x.get(k) for x in b])
        ratio = (sb["median"] / sa["median"]) if sa["median"] and sb["median"] is not None else None
        out["metrics"][k] = {"A": sa, "B": sb, "ratio_B_over_A": ratio}
    out["reasons"] = {"A": a[0]["reasons"], "B": b[0]["reasons"]}
    return out


def render(cmp: dict[str, Any], console: Console, labels: tuple[str, str]) -> None:
    t = Table(
        title=f"probe ab: A = {labels[0]}   B = {labels[1]}   "
        f"(median over {cmp['reps']['A']}/{cmp['reps']['B']} runs, min-max)",
        title_justify="left",
    )
    for c in ("metric", "A", "B", "B/A"):
        t.add_column(c, justify="left" if c == "metric" else "right")

    def fmt(k: str, s: dict[str, float | None]) -> str:
        if s["median"] is None:
            return "-"
        if k.endswith("_ns"):
            return (
                f"{s['median'] / 1e3:,.0f} µs ({(s['min'] or 0) / 1e3:,.0f}-"
                f"{(s['max'] or 0) / 1e3:,.0f})"
            )
        if "rate" in k:
            return f"{s['median']:.1%}"
        return f"{s['median']:,.1f} ({s['min']:,.1f}-{s['max']:,.1f})"

    for k, m in cmp["metrics"].items():
        r = m["ratio_B_over_A"]
        t.add_row(
            k.removesuffix("_ns").replace("_", " "),
            fmt(k, m["A"]),
            fmt(k, m["B"]),
            "-" if r is None else f"{r:.3f}",
        )
    console.print(t)
    for arm in ("A", "B"):
        reasons = ", ".join(f"{k} x{v}" for k, v in cmp["reasons"][arm].items())
        console.print(f"{arm}: top mode/reason: {reasons}")


def run_arms(
    args: argparse.Namespace, bars: progress.Display | None = None
) -> tuple[list[Path], list[Path]]:
    from probe.errors import UsageError

    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("ab: give the workload command after --, or --a/--b recordings")
    from probe.cli.commands.record import check_command

    cmd = check_command(cmd, "ab")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"ab: --out {out} is not a directory")
    if not out.parent.is_dir():
        raise UsageError(f"ab: --out {out}: directory {out.parent} does not exist")
    planned = [out / f"{arm}-{i}.probe.db" for i in range(args.reps) for arm in ("A", "B")]
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
            rec = out / f"{arm}-{i}.probe.db"
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
        a_paths, b_paths = [Path(p) for p in args.a], [Path(p) for p in args.b]
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
    with progress.display_for(args) as bars:
        if run_mode:
            a_paths, b_paths = run_arms(args, bars)
        bars.stage("ab: reading recordings", len(a_paths) + len(b_paths), "recordings")
        sa = [summarize(p, bars) for p in a_paths]
        sb = [summarize(p, bars) for p in b_paths]
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

    p.add_argument("--a", nargs="+", help="recordings of arm A (compare mode)")
    p.add_argument("--b", nargs="+", help="recordings of arm B (compare mode)")
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
