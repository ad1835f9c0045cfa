"""``probe ab``: the same workload under two graph-support settings, side by side.

    # run the workload N times per arm, interleaved A B B A A B ...; arm B applies the
    # what-if override (before vLLM resolves its graph mode), arm A runs stock
    probe ab --b-override FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE \\
        --reps 5 --out ab/ -- python bench.py

    # or compare recordings made elsewhere (e.g. by benchmarks/gpu/harness.py)
    probe ab --a stock*.probe.db --b ustd*.probe.db

Each run is a ``probe record`` session. Per arm the comparison shows, over steady state
(the rules of :mod:`probe.analysis.rules`, from :mod:`probe.analysis.summary`): throughput
(scheduled tokens
per second of steady serving time), host time per step, CPU launch overhead, the decode
FULL share, and the workload's wall time when ``ab`` ran it; each B/A with a 95% interval
over the repetitions (one repetition per arm: over ten runs of consecutive steps within
it, and it says so). The verdict names the faster arm only where the throughput interval
excludes 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from probe import progress
from probe.terminal import SafeConsole

#: the figures compared, with how each is printed and which way is faster
FIGURES: tuple[tuple[str, str, int], ...] = (
    ("steady_tokens_per_s", "steady throughput (tokens/s)", 1),
    ("steady_host_ns", "steady host time per step", -1),
    ("cpu_launch_overhead_ns", "CPU launch overhead (mean)", -1),
    ("decode_full_share", "decode FULL share", 1),
    ("forward_launch_ns", "forward launch (mean)", -1),
    ("draft_ns", "draft (mean)", -1),
    ("wall_s", "workload wall time (s)", -1),
)
BLOCKS = 10

# two-sided 95% Student t quantiles by degrees of freedom (1..30; above: 1.96)
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
    2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
    2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def _t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else 1.96


def summarize(path: Path, bars: progress.Progress = progress.SILENT) -> dict[str, Any]:
    """One recording -> the figures ``probe ab`` compares (``bars``: one advance when it
    is read): the whole run's, and those of :data:`BLOCKS` runs of consecutive steps."""
    from probe.analysis.summary_read import ab_values, block_figures
    from probe.errors import UsageError
    from probe.reader.recording import Recording, RecordingError

    try:
        rec = Recording.open(path)
        whole, blocks = block_figures(rec, BLOCKS)
        meta = rec.meta()
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    rec.close()
    bars.advance()
    fig = whole.figures()
    if not fig["forward_steps"]:
        raise UsageError(f"{path}: no forward steps recorded")
    from probe.cli.render_report import command_line

    wall = None  # the workload's own wall time: a `probe record` of a command (ab's runs)
    ran = command_line(meta)[0] == "command"
    if ran and meta.get("started_epoch_ns") and meta.get("ended_epoch_ns"):
        wall = (int(meta["ended_epoch_ns"]) - int(meta["started_epoch_ns"])) / 1e9
    # the three commonest in steady state (a reason seen only in warm-up is not one of them)
    steady = sorted(
        ((f"{r['mode']}/{r['reason']}", int(r["steady"])) for r in fig["miss_reasons"]),
        key=lambda kv: -kv[1],
    )
    reasons = {k: n for k, n in steady if n}
    reasons = dict(list(reasons.items())[:3])
    return {
        "recording": str(path),
        "steps": fig["forward_steps"],
        "steady_steps": fig["steady_steps"],
        "values": {**ab_values(whole), "wall_s": wall},
        "blocks": blocks,
        "reasons": reasons,
        "headline": fig["headline"],
    }


def _mean_se(xs: Sequence[float]) -> tuple[float, float | None, int]:
    """Mean, its standard error (None for one value) and the degrees of freedom."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, None, 0
    return m, statistics.stdev(xs) / len(xs) ** 0.5, len(xs) - 1


def _interval(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """B/A of the means, with a 95% interval from the relative standard errors (delta
    method on the log ratio, Student t at the smaller arm's degrees of freedom)."""
    ma, sa, da = _mean_se(a)
    mb, sb, db = _mean_se(b)
    if not ma:
        return {"ratio": None, "low": None, "high": None}
    r = mb / ma
    if sa is None or sb is None or not mb or r <= 0:
        return {"ratio": r, "low": None, "high": None}
    rel = math.hypot(sa / ma, sb / mb)
    t = _t95(min(da, db))
    return {"ratio": r, "low": r * math.exp(-t * rel), "high": r * math.exp(t * rel)}


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """The arms side by side: per figure, each arm's value (the mean over repetitions, or
    the one run's), B/A and its interval, over repetitions, or over the runs of steps of
    the one repetition each arm has (``interval_over``)."""
    reps = min(len(a), len(b))
    over = (
        "repetitions"
        if reps >= 2
        else f"{BLOCKS} runs of consecutive steps within the one repetition"
    )
    out: dict[str, Any] = {
        "reps": {"A": len(a), "B": len(b)},
        "interval_over": over,
        "metrics": {},
    }
    for key, label, better in FIGURES:
        va = [x["values"][key] for x in a if x["values"][key] is not None]
        vb = [x["values"][key] for x in b if x["values"][key] is not None]
        if not va or not vb:
            continue
        if reps >= 2:
            iv = _interval(va, vb)
        else:
            ba = [x[key] for x in a[0]["blocks"] if x.get(key) is not None]
            bb = [x[key] for x in b[0]["blocks"] if x.get(key) is not None]
            point = vb[0] / va[0] if va[0] else None
            iv = {"ratio": point, "low": None, "high": None}
            if point and len(ba) > 1 and len(bb) > 1:
                # the runs' spread, around the whole run's B/A (the point the table shows)
                b_iv = _interval(ba, bb)
                if b_iv["low"] is not None and b_iv["ratio"]:
                    iv["low"] = point * b_iv["low"] / b_iv["ratio"]
                    iv["high"] = point * b_iv["high"] / b_iv["ratio"]
        out["metrics"][key] = {
            "label": label,
            "better": "higher" if better > 0 else "lower",
            "A": statistics.fmean(va),
            "B": statistics.fmean(vb),
            "ratio_B_over_A": iv["ratio"],
            "low": iv["low"],
            "high": iv["high"],
        }
    out["reasons"] = {"A": a[0]["reasons"], "B": b[0]["reasons"]}
    out["headline"] = {"A": a[0]["headline"], "B": b[0]["headline"]}
    out["verdict"] = _verdict(out)
    return out


def _verdict(cmp: dict[str, Any]) -> str:
    m = cmp["metrics"].get("steady_tokens_per_s")
    if not m or m["ratio_B_over_A"] is None:
        return "no steady throughput in one of the arms: no verdict"
    r, lo, hi = m["ratio_B_over_A"], m["low"], m["high"]
    if lo is None or hi is None:
        return f"steady throughput B/A {r:.3f}, no interval: no verdict"
    if hi < 1:
        return (
            f"A is faster: steady throughput B/A {r:.3f} [{lo:.3f}, {hi:.3f}] "
            f"(B {1 - r:.0%} slower; interval over {cmp['interval_over']})"
        )
    if lo > 1:
        return (
            f"B is faster: steady throughput B/A {r:.3f} [{lo:.3f}, {hi:.3f}] "
            f"(B {r - 1:.0%} faster; interval over {cmp['interval_over']})"
        )
    return (
        f"no difference shown: steady throughput B/A {r:.3f} [{lo:.3f}, {hi:.3f}] includes 1 "
        f"(interval over {cmp['interval_over']})"
    )


def render(cmp: dict[str, Any], console: Console, labels: tuple[str, str]) -> None:
    t = Table(
        title=f"probe ab: A = {labels[0]}   B = {labels[1]}   ({cmp['reps']['A']}/"
        f"{cmp['reps']['B']} runs; steady state; B/A with a 95% interval over "
        f"{cmp['interval_over']})",
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
    if min(cmp["reps"].values()) < 2:
        console.print(
            "one repetition per arm: the intervals are over runs of steps within it (the "
            "run-to-run spread is not in them; --reps 5 gives intervals over repetitions)"
        )
    console.print(f"verdict: {cmp['verdict']}")
    for arm in ("A", "B"):
        reasons = ", ".join(f"{k} x{v}" for k, v in cmp["reasons"][arm].items())
        console.print(f"{arm}: top mode/reason (steady): {reasons}")


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
    with progress.display_for(args.progress, plain=args.json) as bars:
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
