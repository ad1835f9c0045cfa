"""``probe report`` and ``probe doctor``: a recording rendered for people (rich) or
machines (``--json``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from probe.analysis import views as analysis
from probe.analysis.cost import has_timing
from probe.analysis.ranks_columns import ranks_of_recording
from probe.reader.recording import Recording
from probe.reader.recording_set import RecordingSet


def _us(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e3:,.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def build_report(rec: Recording | Sequence[Recording]) -> dict[str, Any]:
    """Everything ``probe report`` shows, as plain data (the ``--json`` output), rendered
    from one :class:`probe.analysis.summary.Summary` of the recording (several recordings: their
    summaries merged, as one).

    Every figure is over steady state by the rules of :mod:`probe.analysis.rules` (``rules``):
    ``hit_rates``, ``ratios`` (each ratio the metrics' PromQL computes, on the series of
    steady steps), ``phases``, ``gpu``, ``throughput``, ``probe_cost``, ``verdict`` and
    each rank's; ``hit_rates_all`` and ``miss_reasons`` count every forward step (with the
    steady ones), ``warmup`` holds the steps apart with their own figures, ``gpu``'s
    ``engine_idle_*`` the gaps with nothing in flight (``engine_idle_rule``: how they were
    judged, :func:`probe.analysis.rules.engine_idle`).
    """
    from probe.analysis.summary import verdict
    from probe.analysis.summary_read import summarize_recordings

    recs = list(rec) if isinstance(rec, Sequence) else [rec]
    # several files as one: each process once, with its totals once
    whole: Any = recs[0] if len(recs) == 1 else RecordingSet(recs)
    summ = summarize_recordings(recs)
    fig = summ.figures()
    ranks = summ.rank_figures()
    procs = whole.processes()
    per_rank = []
    rank_figs = []
    for p in procs:
        if p["pid"] not in ranks:
            continue
        snap = p.get("snapshot") or {}
        f = ranks[p["pid"]]
        rank_figs.append((p["pid"], f))
        per_rank.append(
            {
                "pid": p["pid"],
                "tp_rank": p.get("tp_rank"),
                "pp_rank": p.get("pp_rank"),
                "dp_rank": p.get("dp_rank"),
                "runner": p.get("runner"),
                "dropped_records": p.get("dropped"),
                "hit_rates": f["hit_rates"],
                "hit_rates_all": f["hit_rates_all"],
                "warmup_steps": f["warmup"]["steps"],
                "gpu": f["gpu"],
                "throughput": f["throughput"],
                "probe_cost": f["probe_cost"],
                "headline": f["headline"],
                "verdict": verdict(f, snap),
            }
        )
    main_snap: dict[str, Any] = next((p["snapshot"] for p in procs if p.get("snapshot")), {}) or {}
    return {
        "recording": ", ".join(str(r.path) for r in recs),
        "recordings": [str(r.path) for r in recs],
        "meta": whole.meta(),
        "rules": fig["rules"],
        "percentile_error": fig["percentile_error"],
        "processes": [
            {
                **{k: v for k, v in p.items() if k != "snapshot"},
                "forward_steps": _forward_steps(ranks, p["pid"]),
            }
            for p in procs
        ],
        "headline": fig["headline"],
        "hit_rates": fig["hit_rates"],
        "hit_rates_all": fig["hit_rates_all"],
        "miss_reasons": fig["miss_reasons"],
        "ratios": analysis.ratios_of(fig, summ),
        "steady_steps": fig["steady_steps"],
        "nonforward_steps": fig["nonforward_steps"],
        "phases": fig["phases"],
        "gpu": fig["gpu"],
        "throughput": fig["throughput"],
        "warmup": fig["warmup"],
        "probe_cost": fig["probe_cost"],
        "reorder": summ.reorder_figures(),
        "builds": summ.build_figures(),
        "faults": [f for r in recs for f in r.faults()],
        "outside_steps": [o for r in recs for o in r.outside()],
        "anomalies": [a for r in recs for a in r.anomalies()],
        "per_rank": per_rank,
        "verdict": verdict(fig, main_snap, rank_figs),
        **_traps(procs, ranks),
        "ranks": ranks_report(recs),
    }


def _forward_steps(ranks: Mapping[int, Mapping[str, Any]], pid: int) -> int:
    """One process's forward steps (every one, warm-up included), from the summary's
    figures of every rank (computed once for all)."""
    f = ranks.get(pid)
    return int(f["hit_rates_all"]["steps"]) if f is not None else 0


def _traps(
    procs: Sequence[Mapping[str, Any]], ranks: Mapping[int, Mapping[str, Any]]
) -> dict[str, Any]:
    """``traps`` and ``not_checked`` of every process with a snapshot, each once
    (:func:`probe.analysis.traps.over_processes`: what ``probe doctor`` prints per process),
    the steps counted by the one summary (``ranks``: its :meth:`rank_figures`)."""
    from probe.analysis.traps import over_processes

    return over_processes(
        (p["snapshot"], counts_of(ranks.get(p["pid"]))) for p in procs if p.get("snapshot")
    )


def counts_of(fig: Mapping[str, Any] | None) -> dict[tuple[str, str], int]:
    """A rank's steps by (mode, miss reason), from its figures (None: no steps)."""
    rows = (fig or {}).get("miss_reasons") or []
    return {(r["mode"], r["reason"]): int(r["count"]) for r in rows}


def ranks_report(rec: Recording | Sequence[Recording]) -> dict[str, Any]:
    """The ranks section as plain data (:class:`probe.analysis.ranks.RanksSummary`); of
    several recordings, each one's engines and data-parallel ranks side by side (the ranks
    of one engine are matched within a recording)."""
    recs = list(rec) if isinstance(rec, Sequence) else [rec]
    out: dict[str, Any] = {"engines": [], "dp": []}
    for r in recs:
        one = ranks_of_recording(r).as_dict()
        out["engines"] += one["engines"]
        out["dp"] += one["dp"]
    return out


def command_line(meta: Mapping[str, Any]) -> tuple[str, str]:
    """("command", the user's command as a shell line) for ``probe record``; ("recorded by",
    the probe's own command) where the workload's command is not known (collect, attach,
    and recordings from before ``probe_command`` was kept)."""
    import shlex

    cmd = meta.get("command")
    if not cmd:
        return "command", ""
    words = [str(w) for w in cmd] if isinstance(cmd, list) else shlex.split(str(cmd))
    ours = meta.get("probe_command")
    if words and (words[0] in ("probe", "collect", "attach") or words == ours):
        if words[0] != "probe":
            words = ["probe", *words]
        return "recorded by", shlex.join(words)
    return "command", shlex.join(words)


def render_report(rep: Mapping[str, Any], console: Console) -> None:
    hr = rep["hit_rates"]
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    meta = rep.get("meta") or {}
    label, line = command_line(meta)
    if line:
        head.add_row(label, line)
    ha = rep.get("hit_rates_all") or hr
    head.add_row(
        "forward steps",
        f"{ha['steps']:,}  (FULL {ha['full']:,} · PIECEWISE "
        f"{ha['piecewise']:,} · NONE {ha['none']:,}); steady state {hr['steps']:,}, "
        f"warm-up {ha['steps'] - hr['steps']:,} (rates, times and shares below: steady)"
        + (
            f"; {rep['nonforward_steps']:,} more steps ran no forward"
            if rep.get("nonforward_steps")
            else ""
        ),
    )
    head.add_row("full hit rate", _pct(hr["full_hit_rate"]))
    head.add_row("graph rate", _pct(hr["graph_rate"]))
    head.add_row(
        "decode FULL hit rate",
        f"{_pct(hr['decode_full_hit_rate'])}  "
        f"({hr['decode_full']:,} of {hr['decode_steps']:,} uniform decode steps incl. warm-up)",
    )
    head.add_row("replay confirmed", f"{_pct(hr['replay_confirmed_rate'])} of graph steps")
    head.add_row("padding waste", _pct(hr["padding_waste"]))
    tp = rep.get("throughput") or {}
    if tp.get("tokens_per_s"):
        head.add_row(
            "steady throughput",
            f"{tp['tokens_per_s']:,.0f} scheduled tokens/s of steady serving time "
            f"({tp['tokens']:,} tokens in {tp['serving_ns'] / 1e9:,.2f} s)",
        )
    sample = int(meta.get("sample_every") or 1)
    if sample > 1:
        head.add_row(
            "sampled",
            f"1 engine step in {sample} recorded (counts are of recorded steps; "
            "rates and percentiles estimate all steps)",
        )
    console.print(
        Panel(head, title=f"vllm-graph-probe report: {rep['recording']}", title_align="left")
    )

    verdict = Text()
    for line in rep["verdict"]:
        verdict.append("• " + line + "\n")
    for trap in rep.get("traps", []):
        verdict.append("⚠ " + trap["message"] + "\n", style="yellow")
    for skipped in rep.get("not_checked", []):
        verdict.append(f"not checked: {skipped['code']}: {skipped['message']}\n", style="dim")
    for a in rep.get("anomalies", [])[:5]:
        verdict.append("‼ " + a + "\n", style="bold red")
    console.print(Panel(verdict, title="verdict (steady state)", title_align="left"))
    _render_warmup(rep.get("warmup") or {}, console)

    mr = Table(title="graph mode and miss reason", title_justify="left")
    for col, just in (
        ("mode", "left"),
        ("reason", "left"),
        ("steps", "right"),
        ("share", "right"),
        ("example (pid:step tokens/reqs max_q uq)", "left"),
    ):
        mr.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rep["miss_reasons"]:
        ex = r["examples"][0] if r["examples"] else None
        exs = (
            (
                f"{ex['pid']}:{ex['step']} {ex['num_tokens']}/{ex['num_reqs']} "
                f"{ex['max_query_len']} {ex['uniform_decode_query_len']}"
            )
            if ex
            else ""
        )
        mr.add_row(r["mode"].upper(), r["reason"], f"{r['count']:,}", _pct(r["share"]), exs)
    console.print(mr)

    ph = Table(title="host time per step by phase (µs, steady state)", title_justify="left")
    ph.add_column("phase")
    for c in ("mean", "p50", "p90", "p99"):
        ph.add_column(c, justify="right")
    allp = rep["phases"].get("all", {})
    for name in ["cpu_launch_overhead_ns", "host_ns", *analysis.PHASES]:
        st = allp.get(name) or {}
        if not st.get("n") or not st.get("p99"):
            continue
        label = name.removesuffix("_ns")
        style = "bold" if name == "cpu_launch_overhead_ns" else None
        ph.add_row(
            label, _us(st["mean"]), _us(st["p50"]), _us(st["p90"]), _us(st["p99"]), style=style
        )
    console.print(ph)

    by_mode = Table(title="CPU launch overhead by mode (µs, steady)", title_justify="left")
    by_mode.add_column("mode")
    for c in ("steps", "p50", "p90", "p99"):
        by_mode.add_column(c, justify="right")
    for mode, st in rep["phases"].items():
        if mode == "all":
            continue
        lo = st["cpu_launch_overhead_ns"]
        by_mode.add_row(
            mode.upper(), f"{lo['n']:,}", _us(lo["p50"]), _us(lo["p90"]), _us(lo["p99"])
        )
    console.print(by_mode)

    if rep["builds"]:
        bt = Table(title="metadata builds (µs; builder: …MetadataBuilder)", title_justify="left")
        for c in ("builder", "tag", "calls", "p50", "p99", "total ms"):
            bt.add_column(c, justify="left" if c in ("builder", "tag") else "right")
        for b in rep["builds"][:10]:
            tag = b["tag"] + (" (drafter)" if b["drafter"] else "")
            bt.add_row(
                b["builder"].removesuffix("MetadataBuilder") or b["builder"],
                tag,
                f"{b['n']:,}",
                _us(b["p50"]),
                _us(b["p99"]),
                f"{b['total_ns'] / 1e6:,.1f}",
            )
        console.print(bt)

    ro = rep["reorder"]
    gpu = rep["gpu"]
    tail = Table.grid(padding=(0, 2))
    tail.add_column(style="bold")
    tail.add_column()
    tail.add_row(
        "reorder decisions",
        f"{ro['decisions']:,}; order changed in "
        f"{ro['changed']:,} ({ro['moved_requests']:,} requests moved); "
        f"reorder_batch_threshold {_thresholds(ro['thresholds'])}; spec tokens counted as "
        f"decodes in {ro['spec_as_decode']:,}",
    )
    if gpu["steps_timed"]:
        tail.add_row(
            "GPU",
            f"forward busy p50 {_us(gpu['forward_busy_ns']['p50'])} µs; idle "
            f"before step p50 {_us(gpu['idle_before_ns']['p50'])} µs; idle share "
            f"{_pct(gpu['idle_share'])}; host-bound {_pct(gpu['host_bound_share'])} of "
            f"{gpu['idle_before_ns']['n']:,} steps (GPU waiting for the host over "
            f"{gpu['host_bound_threshold']:.0%} of the step period)",
        )
    else:
        tail.add_row("GPU", "no device timings (CPU engine, or PROBE_GPU_TIMING=0)")
    if "engine_idle_ns" in gpu:
        tail.add_row(
            "engine idle",
            f"{gpu['engine_idle_ns'] / 1e9:,.2f} s in {gpu['engine_idle_gaps']:,} gap(s) "
            f"{analysis.idle_rule_words(gpu)}; not in the GPU idle share or the host-bound "
            "verdict",
        )
    drops = sum(p.get("dropped") or 0 for p in rep["processes"])
    faults = sum(f["count"] for f in rep["faults"])
    tail.add_row("probe health", f"{drops:,} records dropped; {faults:,} hook faults")
    cost = analysis.cost_line(rep.get("probe_cost"))
    if cost:
        c = rep["probe_cost"]
        tail.add_row(
            "probe cost",
            f"{cost.removeprefix('probe cost ')}; {c['span_calls_per_step']:.1f} span and "
            f"{c['hook_calls_per_step']:.1f} hook calls per step at "
            f"{_ns_pair(c, '')} ns in a hot loop"
            + (f", {_ns_pair(c, '_cold')} ns data evicted" if c.get("span_cold_ns") else "")
            + (
                f", {_ns_pair(c, '_cold_code')} ns with code evicted too"
                if c.get("span_cold_code_ns")
                else ""
            )
            + f" ({', '.join(c['hot_path'])})",
        )
    console.print(Panel(tail, title="reorder · GPU · probe", title_align="left"))
    if len(rep["per_rank"]) > 1:
        rt = Table(title="per rank (host-bound and phase: steady state)", title_justify="left")
        for c in ("pid", "tp/pp/dp", "steps", "warm", "FULL", "dec FULL", "host-bound"):
            rt.add_column(c, justify="right")
        rt.add_column("top phase")
        for r in rep["per_rank"]:
            h = r["hit_rates"]
            g = r.get("gpu") or {}
            rt.add_row(
                str(r["pid"]),
                f"{r['tp_rank']}/{r['pp_rank']}/{r['dp_rank']}",
                f"{h['steps']:,}",
                f"{r.get('warmup_steps', 0):,}",
                _pct(h["full_hit_rate"]),
                _pct(h["decode_full_hit_rate"]),
                _pct(g.get("host_bound_share")),
                g.get("host_bound_top_phase") or "-",
            )
        console.print(rt)
    render_ranks(rep.get("ranks") or {}, console)


def render_ranks(rr: Mapping[str, Any], console: Console) -> None:
    """The ranks section: per engine, who was last to arrive at each step, by how much,
    and which phase made it late (:mod:`probe.analysis.ranks`); the data-parallel costs per rank."""
    for e in rr.get("engines") or ():
        body = Text()
        offs = ", ".join(f"{lab} {o:+d}" for lab, o in zip(e["labels"], e["offsets"], strict=True))
        body.append(
            f"{e['matched']:,} steps matched {e['alignment']} (step-number offsets {offs}); "
            f"unmatched {', '.join(f'{n:,}' for n in e['unmatched'])}; "
            f"batch mismatches {e['batch_mismatches']:,}\n"
            f"arrival: {e['arrival']}; clock: {e['clock']}\n",
            style="dim",
        )
        t = Table(box=None, padding=(0, 1))
        for c in ("rank", "pid", "last", "share", "skew p50 µs", "phase behind it"):
            t.add_column(c, justify="left" if c in ("rank", "phase behind it") else "right")
        for c in ("others' wait ms", "launch µs", "fwd launch µs"):
            t.add_column(c, justify="right")
        for lab, r in zip(e["labels"], e["ranks"], strict=True):
            named = sum(n for _, n in r["phases"]) or 1
            t.add_row(
                lab,
                str(r["rank"]["pid"]),
                f"{r['last']:,}",
                _pct(r["share"]),
                _us(r["skew_p50_ns"]),
                ", ".join(f"{p} {n / named:.0%}" for p, n in r["phases"][:2] if n / named >= 0.1)
                or "-",
                f"{r['wait_caused_ns'] / 1e6:,.1f} ({r['wait_steps']:,} st)"
                if r["wait_steps"]
                else "-",
                _us(r["mean_cpu_launch_overhead_ns"]),
                _us(r["mean_forward_launch_ns"]),
            )
        skew = (
            f"skew (the last rank's lead over the median of the others): p50 "
            f"{_us(e['skew_p50_ns'])} µs, p90 {_us(e['skew_p90_ns'])} µs, p99 "
            f"{_us(e['skew_p99_ns'])} µs, max {_us(e['skew_max_ns'])} µs over "
            f"{e['matched'] - e['within_uncertainty']:,} steps"
            + (
                f"; {e['within_uncertainty']:,} within the clock uncertainty "
                f"({_us(e['uncertainty_ns'])} µs), no rank named"
                if e["within_uncertainty"]
                else ""
            )
        )
        tail = Text(skew + "\n")
        tail.append(
            ("• " + e["verdict"]) if e["verdict"] else "• no rank holds more than its share",
            style="bold" if e["verdict"] else None,
        )
        tail.append("\n" + e["rule"], style="dim")
        from rich.console import Group

        console.print(
            Panel(
                Group(body, t, tail),
                title=f"ranks side by side (engine dp{e['dp_rank']})",
                title_align="left",
            )
        )
    dp = rr.get("dp") or ()
    if dp:
        t = Table(title="data-parallel costs per rank", title_justify="left")
        for c in ("rank", "steps", "forced eager", "host ms", "GPU ms", "padded", "host ms",
                  "GPU ms", "dummy-run records"):  # fmt: skip
            t.add_column(c, justify="left" if c == "rank" else "right")
        for d in dp:
            t.add_row(
                d["label"],
                f"{d['steps']:,}",
                f"{d['forced_eager']:,}",
                f"{d['forced_eager_host_ns'] / 1e6:,.1f}",
                f"{d['forced_eager_gpu_ns'] / 1e6:,.1f}",
                f"{d['padded']:,}",
                f"{d['padded_host_ns'] / 1e6:,.1f}",
                f"{d['padded_gpu_ns'] / 1e6:,.1f}",
                f"{d['outside_records']:,}",
            )
        console.print(t)


def _ns_pair(cost: Mapping[str, Any], timing: str) -> str:
    """ "S and H": the span and hook figures of one timing, one per calibration ("a/b")."""
    return " and ".join(
        "/".join(f"{x:.0f}" for x in cost[f"{k}{timing}_ns"]) for k in ("span", "hook")
    )


def _render_warmup(w: Mapping[str, Any], console: Console) -> None:
    """The warm-up steps, apart, with the rule that set them apart."""
    if not w:
        return
    body = Text(w["rule"] + "\n", style="dim")
    if not w["steps"]:
        body.append("no warm-up steps in this recording")
        console.print(Panel(body, title="warm-up (apart)", title_align="left"))
        return
    lo = w["cpu_launch_overhead_ns"]
    why = ", ".join(f"{k} {v}" for k, v in w["why"].items())
    body.append(
        f"{w['steps']:,} step(s) ({why}); CPU launch overhead p50 {_us(lo['p50'])} µs, "
        f"p99 {_us(lo['p99'])} µs; {w['host_ns_total'] / 1e6:,.0f} ms of host time"
    )
    console.print(Panel(body, title="warm-up (apart)", title_align="left"))
    shown = w["listed"][:5]
    wt = Table(title=f"warm-up steps ({len(shown)} of {w['steps']:,})", title_justify="left")
    for c in ("pid:step", "why", "mode", "tokens", "launch µs", "host µs"):
        wt.add_column(c, justify="right" if c in ("tokens", "launch µs", "host µs") else "left")
    for s in shown:
        wt.add_row(
            f"{s['pid']}:{s['step']}",
            s["why"],
            s["mode"].upper(),
            f"{s['num_tokens']:,}",
            _us(s["cpu_launch_overhead_ns"]),
            _us(s["host_ns"]),
        )
    console.print(wt)


def _thresholds(counts: Mapping[str, int]) -> str:
    """``{"1": 120, "-1": 15}`` as "1 in 120, none in 15" (-1: the builder sets none)."""
    if not counts:
        return "-"
    return ", ".join(f"{'none' if k == '-1' else k} in {n:,}" for k, n in counts.items())


def doctor(
    snapshot: Mapping[str, Any], counts: Mapping[tuple[str, str], int] | None = None
) -> dict[str, Any]:
    """The static view from one process's snapshot, with ``traps`` and ``not_checked``
    from :func:`probe.analysis.traps.traps` (``counts``: that process's steps by (mode,
    miss reason), from a recording)."""
    from probe.analysis.traps import traps

    out = dict(snapshot)
    out.update(traps(snapshot, counts=counts))
    return out


def _hot_path_line(probe: Any) -> str:
    """Which hot path ran in the engine and its calibrated cost per call."""
    if not isinstance(probe, Mapping) or not probe.get("hot_path"):
        return "unknown (recorded before the probe said)"
    path = str(probe["hot_path"])
    if probe.get("clock") == "tsc":  # recordings from before the clock choice carry none
        path += ", TSC clock"
    elif probe.get("clock") == "boottime" and isinstance(probe.get("clock_why"), str):
        path += f", clock_gettime ({probe['clock_why']})" if probe["clock_why"] else ""
    cal = probe.get("calibration")
    if not isinstance(cal, Mapping) or not has_timing(cal, ""):
        return path

    def pair(timing: str) -> str:
        return (
            f"span {float(cal[f'span{timing}_ns']) / 1e3:.2f} µs, "
            f"hook {float(cal[f'hook{timing}_ns']) / 1e3:.2f} µs"
        )

    try:
        dormant = f", dormant {float(cal.get('dormant_ns', 0)) / 1e3:.2f} µs"
    except (TypeError, ValueError):
        dormant = ""
    cold = f"; cold: {pair('_cold')}" if has_timing(cal, "_cold") else ""
    if cold and has_timing(cal, "_cold_code"):
        cold += f"; with code evicted too: {pair('_cold_code')}"
    return f"{path} (per call: {pair('')}{dormant}{cold})"


def render_doctor(snap: Mapping[str, Any], console: Console) -> None:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    comp = snap.get("compilation") or {}
    res = snap.get("resolve") or {}
    for k, v in (
        ("vLLM", snap.get("vllm_version")),
        ("runner", f"{snap.get('runner')} ({snap.get('runner_class')})"),
        ("platform", snap.get("platform")),
        ("model", snap.get("model")),
        (
            "ranks",
            f"tp {snap.get('tp_rank')} · pp {snap.get('pp_rank')} · dp {snap.get('dp_rank')}",
        ),
        (
            "cudagraph_mode",
            f"{comp.get('cudagraph_mode')}"
            + (
                f" (asked {res.get('requested_mode')})"
                if res and res.get("requested_mode") != res.get("resolved_mode")
                else ""
            ),
        ),
        (
            "capture sizes",
            f"{comp.get('cudagraph_capture_sizes')} (max {comp.get('max_cudagraph_capture_size')})",
        ),
        ("decode query len", snap.get("uniform_decode_query_len")),
        ("speculative", snap.get("speculative")),
        ("reorder threshold", snap.get("reorder_batch_threshold")),
        ("breakable graphs", comp.get("breakable_cudagraph")),
        ("override (what-if)", snap.get("override") or "none"),
        ("probe hot path", _hot_path_line(snap.get("probe"))),
    ):
        head.add_row(k, str(v))
    console.print(Panel(head, title=f"probe doctor: pid {snap.get('pid')}", title_align="left"))
    # One block per group, not a wide table: at 80 columns a table cuts the support
    # levels (UNIFORM_SINGLE_TOKEN_DECODE) to "UNIFORM_…".
    gt = Table.grid(padding=(0, 2))
    gt.add_column(style="bold", no_wrap=True)
    gt.add_column(overflow="fold")
    lim = snap.get("limiting_group") or {}
    for g in snap.get("groups", []):
        limiting = g.get("builder") == lim.get("builder") and g.get("role") == "target"
        support = f"support {g.get('support')}"
        if g.get("declared_support") != g.get("support"):
            support += f" (declared {g.get('declared_support')})"
        lines = [f"{g.get('backend')} · {g.get('builder')} · {g.get('layers')} layers", support]
        if g.get("reorder_batch_threshold") is not None:
            lines.append(f"reorder threshold {g.get('reorder_batch_threshold')}")
        gt.add_row(g.get("role", ""), "\n".join(lines), style="bold yellow" if limiting else None)
    console.print(Panel(gt, title="attention groups", title_align="left"))
    if snap.get("min_support"):
        console.print(
            f"minimum support: [bold]{snap['min_support']}[/bold], set by "
            f"{lim.get('builder')} ({lim.get('backend')})"
        )
    traps = snap.get("traps") or []
    if traps:
        for t in traps:
            console.print(f"[yellow]⚠ {t['code']}[/yellow]: {t['message']}")
    else:
        console.print("[green]no known traps[/green]")
    for t in snap.get("not_checked") or []:
        console.print(f"[dim]not checked: {t['code']}: {t['message']}[/dim]")
    missing = (snap.get("hooks") or {}).get("missing") or []
    if missing:
        console.print(
            f"[dim]{len(missing)} hook target(s) not in this vLLM: "
            + ", ".join(m[0] for m in missing[:8])
            + "[/dim]"
        )
