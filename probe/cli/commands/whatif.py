"""``probe whatif``: a recording's batch shapes through the installed vLLM's real dispatcher.

    probe whatif run.probe                          # replay check + capture-size suggestion
    probe whatif run.probe --support FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE
    probe whatif run.probe --capture-sizes 1,2,4,8,16,32,64,128 --mode FULL_DECODE_ONLY
    probe whatif run.probe --max-capture-size 64 --json
    probe whatif a.probe --support FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE \
        --costs-from b.probe                        # host time from the run that ran it

    probe whatif run.probe --decode-cudagraph-capture-request-sizes 1,2,4,8,16,32,64

Columns: what was recorded; the recording's own settings replayed (every step's mode and
reason must come out as recorded); the what-if; the suggested capture sizes. Each with its
steady host time per step, CPU launch overhead and throughput (recorded: measured; the others
predicted by :mod:`probe.analysis.costmodel` from the per-(mode, shape) costs of the
recording, then of ``--costs-from``), or the shapes it has no cost for. Needs vLLM (0.26
to 0.34) importable; it runs on CPU, a GPU build included (docs/whatif.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

from probe.cli import progress
from probe.cli.commands import console, open_recording, positive_int, width
from probe.errors import RuntimeFailure, UsageError
from probe.reasons import MODE_NAMES, SUPPORT_NAMES


def _sizes(text: str) -> tuple[int, ...]:
    from probe.analysis.whatif import WhatIfError, parse_sizes

    try:
        return parse_sizes(text)
    except WhatIfError as exc:
        raise argparse.ArgumentTypeError(str(exc).partition(": ")[2]) from None


def _sizes_or_none(text: str) -> tuple[int, ...]:
    """Sizes, or nothing at all ("" or "none": vLLM's [], captures none)."""
    if text.strip().lower() in ("", "none", "[]"):
        return ()
    return _sizes(text)


def _mode(text: str) -> str:
    if text.upper() not in MODE_NAMES:
        raise argparse.ArgumentTypeError(f"{text!r}: give one of {', '.join(MODE_NAMES)}")
    return text.upper()


def _costs_from(path: str | None) -> Any:
    """The host-time costs measured in the ``--costs-from`` recording (None: not given)."""
    from probe.analysis.costmodel import Costs
    from probe.reader.recording import RecordingError
    from probe.reader.recording_batches import steps_of_batches

    if path is None:
        return None
    other = open_recording(path)
    try:
        costs = Costs.of(list(steps_of_batches(other, records=False)), str(other.path))
    except RecordingError as exc:
        raise UsageError(f"whatif: --costs-from {other.path}: {exc}") from None
    finally:
        other.close()
    if not costs.shapes:
        raise UsageError(f"whatif: --costs-from {other.path}: no steady forward step to cost")
    return costs


def cmd_whatif(args: argparse.Namespace) -> int:
    from probe.analysis.whatif_vllm import quiet_vllm

    rec = open_recording(args.recording)
    with (
        progress.display_for(args.progress, plain=args.json, bar=False) as bars,
        contextlib.nullcontext() if args.verbose else quiet_vllm(),
    ):
        result = _whatif(args, rec, bars)
    result = {"recording": str(rec.path), **result}
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        render(result, console(args.width))
    return 0


def _whatif(args: argparse.Namespace, rec: Any, bars: progress.Display) -> dict[str, Any]:
    from probe.analysis.capture_sizes import SPLIT_SIZE_FIELDS
    from probe.analysis.whatif import Setting, VllmError, WhatIfError, parse_support, whatif
    from probe.reader.recording import RecordingError
    from probe.reader.recording_batches import steps_of_batches

    try:
        setting = Setting(
            mode=args.mode,
            capture_sizes=args.capture_sizes,
            max_capture_size=args.max_capture_size,
            support=parse_support(args.support or ()),
            split=tuple(
                (k, getattr(args, k)) for k in SPLIT_SIZE_FIELDS if getattr(args, k) is not None
            ),
        )
        # the steps' columns only: the what-if reads no detail record (a tenth of the memory)
        steps = list(steps_of_batches(rec, records=False))
        snaps = {p["pid"]: p["snapshot"] for p in rec.processes() if p.get("snapshot")}
        costs = _costs_from(args.costs_from)
        return whatif(
            steps,
            snaps,
            setting,
            suggest_count=args.suggest_count,
            costs_from=costs,
            progress=bars,
        )
    except (WhatIfError, RecordingError) as exc:
        raise UsageError(f"whatif: {rec.path}: {exc}") from None
    except VllmError as exc:
        raise RuntimeFailure(f"whatif: {exc}") from None


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.1%}"


def _us(ns: float | None) -> str:
    return "no cost" if ns is None else f"{ns / 1e3:,.0f} µs"


def _ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def _rate(v: float | None) -> str:
    return "no cost" if v is None else f"{v:,.0f}"


def _bound(b: dict[str, int] | None) -> str:
    return "–" if not b else f"{b['host']:,}/{b['gpu']:,}"


def render_worth(r: dict[str, Any], con: Any) -> None:
    """Where the host-time figures come from, and the shapes that have no cost."""
    sources = " then ".join(f"{c['source']} ({c['shapes']} shapes)" for c in r["costs"])
    con.print(
        "[bold]host time[/] (steady steps; recorded: measured; the others predicted from "
        f"the per-(mode, shape) costs measured in {sources}):"
    )
    for c in r["columns"]:
        w = c["worth"]
        if w["measured"]:
            continue
        priced = ", ".join(f"{n:,} {how}" for how, n in w["priced"].items()) or "none"
        con.print(f"  {c['column']}: {w['steady_steps']:,} steady steps priced: {priced}")
        if w["no_cost"]:
            shown = w["no_cost"][:6]
            con.print(
                f"  [yellow]{c['column']}: no cost for[/] "
                + "; ".join(f"{m['shape']} ({m['steps']:,} steps)" for m in shown)
                + (f"; and {len(w['no_cost']) - 6} more shapes" if len(w["no_cost"]) > 6 else "")
            )
    if any(c["worth"]["no_cost"] for c in r["columns"]):
        con.print(
            "  (no guess is made for a mode or shape the recording never ran: give "
            "--costs-from a recording that ran it)"
        )
    between = r["costs"][0].get("between_steps_ns")
    own = (
        f"{between / 1e3:,.0f} µs, measured before the steps the GPU waited for"
        if between is not None
        else "not measured here (no step had the GPU wait for the host): taken as none"
    )
    con.print(
        "[bold]throughput[/] (steady scheduled tokens/s): a changed step's period moves "
        "with the slower of its host side (host time + the host's own time between steps, "
        f"{own}) and its GPU side (the device period of its shape where the GPU bounded it)"
    )
    for c in r["columns"]:
        gaps = c["worth"].get("no_gpu_timing") or []
        if gaps:
            con.print(
                f"  [yellow]{c['column']}: no device timing for[/] "
                + "; ".join(f"{m['shape']} ({m['steps']:,} steps)" for m in gaps[:6])
                + (f"; and {len(gaps) - 6} more shapes" if len(gaps) > 6 else "")
                + ": their period moves with the host time alone"
            )


def _sizes_text(sizes: list[int]) -> str:
    if len(sizes) <= 8:
        return ", ".join(map(str, sizes))
    return f"{sizes[0]}..{sizes[-1]} ({len(sizes)} sizes)"


def render(r: dict[str, Any], con: Any) -> None:
    """The what-if as a settings block and one table, readable at 80 columns."""
    from rich.table import Table

    cols = r["columns"]
    by = {c["column"]: c for c in cols}
    ranks = f"{r['ranks']} rank" + ("s" if r["ranks"] != 1 else "")
    con.print(
        f"[bold]what-if[/] {r['recording']}: {cols[0]['steps']:,} forward steps, {ranks}, "
        f"{'/'.join(r['runner'])}, recorded on vLLM {', '.join(r['vllm_recorded'])}; "
        f"replayed through the installed vLLM {r['vllm_installed']}'s own dispatcher"
    )
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", min_width=9)
    grid.add_column()
    for c in cols:
        own = c["column"] in ("recorded", "replay")
        asked = r["requested_mode"] if own else r["what_if_requested_mode"]
        support = r["min_support"]["recorded" if own else "what_if"]
        lines = [] if c["column"] == "recorded" else [c["setting"]]
        lines.append(f"mode {asked} → {c['resolved_mode']}")
        lines.append(f"capture sizes {_sizes_text(c['capture_sizes'])}")
        lines.append(f"min support {support}")
        if c["column"] != "suggested":
            lines += [f"vLLM: {m}" for m in c["vllm_messages"]]
        grid.add_row(c["column"], "\n".join(lines))
    con.print(grid)
    if r.get("vllm_platform"):
        con.print(f"[dim]vLLM platform: {r['vllm_platform']}[/dim]")
    for g in r.get("not_in_installed_vllm") or ():
        con.print(f"[yellow]recorded setting[/] {g['setting']}: {g['note']}")
    t = Table(title="per setting (forward steps of the target model)", title_justify="left")
    t.add_column("")
    for c in cols:
        t.add_column(c["column"], justify="right")
    for label, key in (
        ("FULL share", "full_share"),
        ("graph share (FULL+PIECEWISE)", "graph_share"),
        ("decode FULL share", "decode_full_share"),
        ("padding waste", "padding_waste"),
    ):
        t.add_row(label, *(_pct(c[key]) for c in cols))
    t.add_row("padded − real tokens", *(f"{c['padded_tokens'] - c['real_tokens']:,}" for c in cols))
    for label, key in (
        ("steady host time per step", "host_ns_per_step"),
        ("steady CPU launch overhead", "cpu_launch_overhead_ns"),
    ):
        t.add_row(label, *(_us(c["worth"][key]) for c in cols))
        t.add_row(
            "  B/A against recorded", *(_ratio(c["worth"][f"{key}_vs_recorded"]) for c in cols)
        )
    t.add_row("steady period per step", *(_us(c["worth"].get("period_ns_per_step")) for c in cols))
    t.add_row("steady throughput (tok/s)", *(_rate(c["worth"].get("tokens_per_s")) for c in cols))
    t.add_row(
        "  B/A against recorded",
        *(_ratio(c["worth"].get("tokens_per_s_vs_recorded")) for c in cols),
    )
    t.add_row("host-/GPU-bound steps", *(_bound(c["worth"].get("bound")) for c in cols))
    if any((c["worth"].get("bound") or {}).get("none") for c in cols):
        t.add_row(
            "  no device timing",
            *(f"{(c['worth'].get('bound') or {}).get('none', 0):,}" for c in cols),
        )
    reasons: list[str] = []
    for c in cols:
        reasons += [k for k in c["reasons"] if k not in reasons]
    for k in reasons:
        t.add_row(k, *(f"{c['reasons'].get(k, 0):,}" for c in cols))
    con.print(t)
    rep = r["reproduction"]
    con.print(
        f"replay check: the recording's settings give the recorded mode and reason on "
        f"{rep['mode_and_reason_match']:,} of {rep['steps']:,} steps (padding too: "
        f"{rep['padding_match']:,}); {r['kept_as_recorded']:,} kept as recorded (not decided "
        "by the batch shape)"
    )
    for m in rep["mismatches"]:
        con.print(
            f"  [red]differs[/] pid {m['pid']} step {m['step']}: recorded {m['recorded']}, "
            f"replayed {m['replayed']} ({m['num_tokens']:,} tokens, {m['num_reqs']:,} reqs)"
        )
    if "what-if" in by:
        w, rc = by["what-if"], by["recorded"]
        con.print("[bold]expected change[/] (what-if against the recording):")
        for ch in r["changes"] or [{"from": "", "to": "", "steps": 0}]:
            if ch["steps"]:
                con.print(f"  {ch['steps']:,} steps: {ch['from']} → {ch['to']}")
            else:
                con.print("  no step changes its mode or reason")
        for label, key in (("FULL share", "full_share"), ("padding waste", "padding_waste")):
            a, b = rc[key], w[key]
            delta = ""
            if a is not None and b is not None:
                delta = " (unchanged)" if a == b else f" ({(b - a) * 100:+.1f} points)"
            con.print(f"  {label} {_pct(a)} → {_pct(b)}{delta}")
    render_worth(r, con)
    s = r["suggestion"]
    if s.get("split") and s.get("verified"):
        lists = "; ".join(f"{k} {', '.join(map(str, v))}" for k, v in s["split"].items())
        con.print(
            f"[bold]suggested graph sizes[/] (at most {s['limit']} each, keeping each "
            f"largest, for the {s['settings']} settings): {lists} — padding "
            f"{s['padding_tokens']:,} tokens (now {s['padding_tokens_now']:,})"
        )
    elif s.get("sizes") and s.get("verified"):
        con.print(
            f"[bold]suggested capture sizes[/] (at most {s['limit']}, keeping the largest "
            f"{s['largest']}, for the {s['settings']} settings): {', '.join(map(str, s['sizes']))}"
            f" — padding {s['padding_tokens']:,} tokens (now {s['padding_tokens_now']:,})"
        )
    elif s.get("sizes"):
        con.print("suggested capture sizes: none verified better than the current ones")
    else:
        con.print(f"suggested capture sizes: none ({s.get('why', '')})")


def add_parser(sub: Any) -> None:
    q = sub.add_parser(
        "whatif",
        help="a recording's batch shapes through vLLM's real dispatcher under other settings",
        description="Replay a recording's batch shapes through the installed vLLM's own "
        "graph-mode resolver and dispatcher (CPU is enough) under other settings: a "
        "builder's graph support, capture sizes, the graph mode; and price each change in "
        "steady host time per step.",
    )
    q.add_argument("recording", nargs="?", help="recording (default: the bundled one)")
    q.add_argument("--verbose", action="store_true", help="also show vLLM's own log lines (stderr)")
    progress.add_flag(q, "loading vLLM, then each replay")
    q.add_argument("--mode", type=_mode, help=f"requested cudagraph_mode: {', '.join(MODE_NAMES)}")
    q.add_argument(
        "--capture-sizes", type=_sizes, metavar="N,N,...", help="cudagraph_capture_sizes"
    )
    q.add_argument(
        "--max-capture-size", type=positive_int, metavar="N", help="max_cudagraph_capture_size"
    )
    # Model Runner V2's split graph sizes (vLLM 0.34 on), in vLLM's own names
    for name, kind, what in (
        ("prefill_cudagraph_capture_token_sizes", "sizes", "token counts of prefill graphs"),
        ("max_prefill_cudagraph_capture_tokens", "int", "largest prefill graph, in tokens"),
        ("decode_cudagraph_capture_request_sizes", "sizes", "request counts of decode graphs"),
        ("max_decode_cudagraph_capture_requests", "int", "largest decode graph, in requests"),
        ("max_decode_cudagraph_capture_tokens", "int", "token budget of a decode graph"),
    ):
        q.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=_sizes_or_none if kind == "sizes" else positive_int,
            metavar="N,N,..." if kind == "sizes" else "N",
            help=f"{name} (vLLM 0.34 on): {what}",
        )
    q.add_argument(
        "--support",
        action="append",
        metavar="BUILDER=LEVEL",
        help=f"a builder's graph support ({', '.join(SUPPORT_NAMES)}); repeatable",
    )
    q.add_argument(
        "--suggest-count",
        type=positive_int,
        metavar="N",
        help="at most N suggested capture sizes (default: as many as there are now)",
    )
    q.add_argument(
        "--costs-from",
        metavar="B.probe",
        help="host-time costs for the modes and shapes this recording never ran, measured "
        "in another recording",
    )
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.add_argument("--width", type=width, help="terminal width in columns (20..1000)")
    q.set_defaults(func=cmd_whatif)
