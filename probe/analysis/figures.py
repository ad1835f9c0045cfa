"""The figures of a :class:`probe.analysis.summary.Summary`, as every surface renders them: hit
rates, miss reasons, phases, GPU and host-bound, throughput, warm-up, probe cost, the
headline and the verdict in words (:func:`verdict`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from probe.analysis import rules
from probe.analysis.accumulators import (
    NB,
    PENDING,
    PHASE_NS,
    Acc,
    Key,
    Q,
    S,
    pcts,
    percentile_of,
    total_of,
)
from probe.analysis.cost import cost_figures, cost_line
from probe.analysis.rules import CLASSES, STEADY
from probe.analysis.summary_state import Candidate, Rank
from probe.records import Mode, Reason


class FiguresOf:
    """The figures a :class:`probe.analysis.summary.Summary` reads from its groups (a base class:
    these methods read the summary's state)."""

    listed: list[tuple[int, ...]]
    ranks: dict[int, Rank]
    candidates: dict[tuple[int, int], Candidate]
    calibrations: dict[int, dict[str, Any]]
    reorders: Counter[str]
    thresholds: Counter[int]
    builds: dict[tuple[str, str, bool], np.ndarray]

    def _warmup(
        self,
        warm: Mapping[Key, Acc],
        wm: Acc,
        decided: Mapping[tuple[int, int], str],
        pid: int | None,
        candidates: Iterable[Candidate],
    ) -> dict[str, Any]:
        """The warm-up figures; ``candidates``: the first uses of the rank ``pid`` (all
        with None), those ``decided`` warm-up listed."""
        why: Counter[str] = Counter()
        for k, a in warm.items():
            why[CLASSES[k.step_class]] += int(a.s[S["steps"]])
        listed = []
        rows = [x for x in self.listed if pid is None or x[0] == pid]
        extra = [c for c in candidates if (c.key.pid, c.step) in decided]
        for x in rows:
            cls = x[2]
            if cls == PENDING:
                if not self.ranks[x[0]].replayed:
                    continue
                cls = rules.BEFORE_REPLAY
            listed.append(_listed(x[0], x[1], CLASSES[cls], x[3], x[4], x[5], x[6], x[7]))
        for c in extra:
            a = c.acc
            listed.append(
                _listed(
                    c.key.pid,
                    c.step,
                    decided[(c.key.pid, c.step)],
                    c.key.mode,
                    int(a.s[S["tokens"]]),
                    c.padded_tokens,
                    c.cpu_launch_overhead_ns,
                    c.host_ns,
                )
            )
        listed.sort(key=lambda r: (r["pid"], r["step"]))
        return {
            "rule": rules.RULES["steady"],
            "steps": int(wm.s[S["steps"]]),
            "why": dict(why.most_common()),
            "cpu_launch_overhead_ns": pcts(wm, "cpu_launch_overhead_ns"),
            "host_ns": pcts(wm, "host_ns"),
            "host_ns_total": int(wm.q[Q["host_ns"], 1]),
            "listed": listed[:20],
        }

    def _probe_cost(self, steady: Mapping[Key, Acc], st: Acc) -> dict[str, Any] | None:
        """:func:`probe.analysis.cost.cost_figures` of the steady steps whose rank has a
        calibration, counted per group."""
        cals = self.calibrations
        per = [
            (c, a)
            for k, a in steady.items()
            if (c := cals.get(k.pid)) is not None and a.s[S["costed"]]
        ]
        launch = total_of(a for _, a in per)
        li = Q["cpu_launch_overhead_ns"]
        mean_launch = float(launch.q[li, 1]) / int(launch.q[li, 0]) if launch.q[li, 0] else None
        counts = [
            (c, int(a.s[S["costed"]]), int(a.s[S["span_calls"]]), int(a.s[S["hook_calls"]]))
            for c, a in per
        ]
        return cost_figures(counts, mean_launch)

    def reorder_figures(self) -> dict[str, Any]:
        r = self.reorders
        return {
            "decisions": r["decisions"],
            "changed": r["changed"],
            "moved_requests": r["moved_requests"],
            "thresholds": {str(k): v for k, v in self.thresholds.most_common()},
            "spec_as_decode": r["spec_as_decode"],
            "decodes": r["decodes"],
            "reqs": r["reqs"],
        }

    def build_figures(self) -> list[dict[str, Any]]:
        out = []
        for (name, tag, drafter), h in self.builds.items():
            n = int(h[NB])
            i = Q["host_ns"]
            nz = np.flatnonzero(h[:NB])
            empty = Acc()
            a = Acc.sparse(empty.s, empty.q, i * NB + nz, h[:NB][nz])
            a.q[i] = (n, int(h[NB + 1]), 0, np.iinfo(np.int64).max)
            out.append(
                {
                    "builder": name,
                    "tag": tag,
                    "drafter": drafter,
                    "n": n,
                    "mean": float(h[NB + 1]) / n if n else None,
                    "p50": percentile_of(a, "host_ns", 50),
                    "p90": percentile_of(a, "host_ns", 90),
                    "p99": percentile_of(a, "host_ns", 99),
                    "total_ns": int(h[NB + 1]),
                }
            )
        return sorted(out, key=lambda b: -b["total_ns"])


def _listed(
    pid: int, step: int, why: str, mode: int, tokens: int, padded: int, launch: int, host: int
) -> dict[str, Any]:
    return {
        "pid": pid,
        "step": step,
        "why": why,
        "mode": Mode(mode).name.lower() if mode >= 0 else "none",
        "num_tokens": tokens,
        "padded_tokens": padded,
        "cpu_launch_overhead_ns": launch if launch >= 0 else None,
        "host_ns": host,
    }


def _count(groups: Mapping[Key, Acc], pred: Callable[[Key], bool] | None = None) -> int:
    return sum(int(a.s[S["steps"]]) for k, a in groups.items() if pred is None or pred(k))


def hit_rates(groups: Mapping[Key, Acc]) -> dict[str, Any]:
    n = _count(groups)
    full = _count(groups, lambda k: k.mode == Mode.FULL)
    pw = _count(groups, lambda k: k.mode == Mode.PIECEWISE)
    dec = _count(groups, lambda k: k.decode == 1)
    dec_full = _count(groups, lambda k: k.decode == 1 and k.mode == Mode.FULL)
    tot = total_of(groups.values())
    graph = full + pw
    real = int(tot.s[S["graph_tokens"]])
    padded = int(tot.s[S["graph_padded_tokens"]])
    confirmed = int(tot.s[S["replayed"]])
    return {
        "steps": n,
        "full": full,
        "piecewise": pw,
        "none": n - full - pw,
        "decode_steps": dec,
        "decode_full": dec_full,
        "full_hit_rate": full / n if n else None,
        "graph_rate": graph / n if n else None,
        "decode_full_hit_rate": dec_full / dec if dec else None,
        "replay_confirmed": confirmed,
        "replay_confirmed_rate": confirmed / graph if graph else None,
        "padded_tokens": padded,
        "real_tokens": real,
        "padding_waste": (padded - real) / padded if padded else None,
    }


def decode_split(steady: Mapping[Key, Acc]) -> dict[str, Any]:
    """Steady steps by decode or not: modes, the reasons of those not FULL, the query
    length of the decode steps (the verdict's words)."""
    modes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    others: Counter[str] = Counter()
    uq: Counter[int] = Counter()
    for k, a in steady.items():
        n = int(a.s[S["steps"]])
        if k.decode == 1:
            modes[_mode_name(k.mode)] += n
            uq[k.query_len] += n
            if k.mode != Mode.FULL:
                reasons[_reason_name(k.reason)] += n
        elif k.mode != Mode.FULL:
            others[_reason_name(k.reason)] += n
    return {
        "modes": dict(modes.most_common()),
        "reasons": dict(reasons.most_common()),
        "others": dict(others.most_common()),
        "query_len": uq.most_common(1)[0][0] if uq else None,
    }


REASON_TEXT = {
    "backend_support_too_low": "the minimum attention support is {support} ({group}), below "
    "UNIFORM_BATCH, so uniform multi-token decode batches cannot replay FULL graphs",
    "graphs_disabled": "CUDA graphs are off for this engine (enforce_eager, -O0, or the mode "
    "resolved to NONE)",
    "not_uniform": "the batch mixed prefill and decode (or short drafts)",
    "batch_too_big": "the batch was larger than the largest capture size",
    "no_full_key_for_size": "no FULL graph was captured for the padded size",
    "mixed_batch_in_full_decode_only": "FULL_DECODE_ONLY runs mixed batches eagerly",
    "piecewise_only": "the configured mode has no FULL graphs",
    "warmup_or_profile": "the graphs were not captured yet (warm-up or profile)",
    "forced_eager": "the step was forced eager (DP peer, encoder inputs, profile)",
    "cascade_attention": "cascade attention disables FULL graphs",
    "lora_mismatch": "no graph for this LoRA configuration",
}


def verdict(
    fig: Mapping[str, Any],
    snapshot: Mapping[str, Any] | None = None,
    per_rank: Sequence[tuple[int, Mapping[str, Any]]] = (),
) -> list[str]:
    """Plain-words findings about steady state, most important first, from
    :meth:`Summary.figures` (``per_rank``: (pid, figures) of each rank, for the
    host-bound line per rank)."""
    out: list[str] = []
    n_warm = fig["forward_steps"] - fig["steady_steps"]
    if not fig["steady_steps"]:
        if n_warm:
            return [f"all {n_warm} forward steps are warm-up: no steady state yet"]
        return ["no forward steps were recorded"]
    snap = snapshot or {}
    lim = snap.get("limiting_group") or {}
    support = snap.get("min_support") or (snap.get("resolve") or {}).get("min_cg_support") or "?"
    group = lim.get("builder") or (snap.get("resolve") or {}).get("min_cg_attn_backend") or "?"

    def why(reason: str | None) -> str:
        return REASON_TEXT.get(reason or "", reason or "unknown").format(
            support=support, group=group
        )

    rates = fig["hit_rates"]
    dec = fig["decode"]
    n_dec = sum(dec["modes"].values())
    if n_dec:
        top_mode = next(iter(dec["modes"]))
        uq = dec["query_len"] or 1
        what = f"decode steps with MTP (query length {uq})" if uq > 1 else "decode steps"
        if top_mode == "full":
            out.append(
                f"{what} replayed FULL graphs: {rates['decode_full_hit_rate']:.0%} of {n_dec:,}"
            )
        else:
            reason = next(iter(dec["reasons"]), "unknown")
            out.append(
                f"{what} ran {top_mode.upper()} because {why(reason)} "
                f"({dec['modes'][top_mode]:,} of {n_dec:,} decode steps)"
            )
    for reason, n in list(dec["others"].items())[:2]:
        out.append(f"{n:,} non-decode step(s) missed FULL: {why(reason)}")
    rc = rates["replay_confirmed_rate"]
    if rc is not None and rc < 0.999:
        out.append(
            f"only {rc:.1%} of graph-dispatched steps showed a replay: check for captures "
            "during serving or unhooked wrappers"
        )
    lo = fig["phases"]["all"]["cpu_launch_overhead_ns"]
    if lo["p50"] is not None:
        out.append(
            f"CPU launch overhead median {lo['p50'] / 1e3:,.0f} µs, p99 "
            f"{(lo['p99'] or 0) / 1e3:,.0f} µs per step (steady state)"
        )
    line = cost_line(fig.get("probe_cost"))
    if line:
        out.append(line)
    w = fig["warmup"]
    if w["steps"]:
        worst = (w["cpu_launch_overhead_ns"] or {}).get("p99") or 0
        out.append(
            f"{w['steps']:,} warm-up step(s) apart from these figures (CPU launch overhead p99 "
            f"{worst / 1e3:,.0f} µs, {w['host_ns_total'] / 1e6:,.0f} ms of host time)"
        )
    g = fig["gpu"]
    if g["engine_idle_gaps"]:
        out.append(
            f"engine idle {g['engine_idle_ns'] / 1e9:,.1f} s in {g['engine_idle_gaps']:,} gap(s) "
            f"{idle_rule_words(g)}: apart from the GPU idle share and the host-bound verdict"
        )
    if g["host_bound_share"] is not None:
        n = g["idle_before_ns"]["n"]
        thr = g["host_bound_threshold"]
        rule = f"the GPU waiting for the host over {thr:.0%} of the step period"
        if g["host_bound_steps"]:
            line = (
                f"host-bound: {g['host_bound_share']:.0%} of {n:,} timed steps ({rule}); "
                "their largest host phases: "
                + ", ".join(f"{p['phase']} {p['share']:.0%}" for p in g["host_bound_phases"][:2])
                + " of their phase time"
            )
        else:
            line = (
                f"not host-bound: 0 of {n:,} timed steps had {rule} "
                f"(GPU idle share {g['idle_share']:.1%})"
            )
        out.append(line)
        timed = [(p, f) for p, f in per_rank if f["gpu"]["host_bound_share"] is not None]
        if len(timed) > 1:
            out.append(
                "host-bound steps per rank: "
                + ", ".join(
                    f"pid {p} {f['gpu']['host_bound_share']:.0%} of "
                    f"{f['gpu']['idle_before_ns']['n']}"
                    for p, f in timed
                )
            )
    return out


def _mode_name(m: int) -> str:
    return Mode(m).name.lower() if m >= 0 else "none"


def _reason_name(r: int) -> str:
    return Reason(r).label if r >= 0 else "unknown"


def miss_reasons(
    groups: Mapping[Key, Acc], examples: Mapping[tuple[int, int], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str]] = Counter()
    steady: Counter[tuple[str, str]] = Counter()
    ex: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for k, a in groups.items():
        key = (_mode_name(k.mode), _reason_name(k.reason))
        ex.setdefault(key, examples.get((k.mode, k.reason), []))
        counts[key] += int(a.s[S["steps"]])
        if k.step_class == STEADY:
            steady[key] += int(a.s[S["steps"]])
    total = sum(counts.values())
    return [
        {
            "mode": m,
            "reason": r,
            "count": c,
            "steady": steady[(m, r)],
            "share": c / total if total else 0.0,
            "examples": ex[(m, r)],
        }
        for (m, r), c in counts.most_common()
    ]


def phase_figures(steady: Mapping[Key, Acc]) -> dict[str, Any]:
    groups: dict[str, Acc] = {"all": total_of(steady.values())}
    for k, a in sorted(steady.items(), key=lambda kv: -kv[0][1]):
        name = _mode_name(k.mode)
        if name in groups:
            groups[name].add(a)
        else:
            groups[name] = a.copy()
    return {
        name: {
            q if q in ("cpu_launch_overhead_ns", "host_ns") else q.removesuffix("_ns"): pcts(a, q)
            for q in ("cpu_launch_overhead_ns", "host_ns", *PHASE_NS)
        }
        for name, a in groups.items()
    }


def gpu(st: Acc, ranks: Sequence[Any]) -> dict[str, Any]:
    timed = int(st.s[S["timed"]])
    bound = int(st.s[S["host_bound"]])
    phase_ns = {p.removesuffix("_ns"): int(st.s[S[f"bound_{p}"]]) for p in PHASE_NS}
    total = sum(phase_ns.values())
    ranked = sorted((p for p in phase_ns if phase_ns[p]), key=lambda p: -phase_ns[p])
    top = ranked[0] if bound and ranked else None
    device = int(st.s[S["device_ns"]])
    return {
        "steps_timed": int(st.q[Q["gpu_busy_ns"], 0]),
        "forward_busy_ns": pcts(st, "gpu_busy_ns"),
        "idle_before_ns": pcts(st, "gpu_idle_before_ns"),
        "idle_share": int(st.s[S["idle_ns"]]) / device if device else None,
        "host_bound_threshold": rules.HOST_BOUND_SHARE,
        "host_bound_steps": bound,
        "host_bound_share": bound / timed if timed else None,
        "host_bound_top_phase": top,
        "host_bound_top_phase_share": phase_ns[top] / total if top and total else None,
        "host_bound_phases": [
            {"phase": p, "share": phase_ns[p] / total} for p in ranked[:3] if bound and total
        ],
        # engine idle before every step (warm-up and no-forward ones too): nothing to run
        "engine_idle_ns": sum(r.idle_ns for r in ranks),
        "engine_idle_gaps": sum(r.idle_gaps for r in ranks),
        "engine_idle_rule": _idle_rule(ranks),
        "engine_idle_threshold_ns": rules.ENGINE_IDLE_GAP_NS,
    }


def idle_rule_words(g: Mapping[str, Any]) -> str:
    """How the engine-idle gaps of ``g`` (the figures' ``gpu``) were judged, in words, for
    every surface that prints them."""
    rule = g.get("engine_idle_rule", "host_gap")
    gap = f"of {g['engine_idle_threshold_ns'] / 1e6:g} ms or more between steps"
    if rule == "engine_state":
        return "with no request in flight (the engine's state)"
    if rule == "mixed":
        return (
            "with no request in flight (the engine's state; steps recorded without it: "
            f"gaps {gap}, the fallback)"
        )
    return f"{gap} (fallback rule: recorded without the engine's state)"


def _idle_rule(ranks: Sequence[Any]) -> str:
    """Which engine-idle rule judged the gaps between steps
    (:func:`probe.analysis.rules.engine_idle`): ``engine_state`` (the steps carry
    ``carried_reqs``), ``host_gap`` (the fallback: recorded without it), ``mixed``."""
    by_gap = sum(r.by_gap for r in ranks)
    by_state = sum(r.by_state for r in ranks)
    if by_gap and by_state:
        return "mixed"
    return "host_gap" if by_gap else "engine_state"


def throughput(st: Acc) -> dict[str, Any]:
    tokens = int(st.s[S["tokens"]])
    serving = int(st.s[S["serving_ns"]])
    return {
        "tokens": tokens,
        "serving_ns": serving,
        "tokens_per_s": tokens / (serving / 1e9) if serving else None,
    }


def headline(fig: Mapping[str, Any]) -> dict[str, float | None]:
    """The figures every surface shows, by name (the cross-surface test compares these)."""
    h = fig["hit_rates"]
    lo = fig["phases"]["all"]["cpu_launch_overhead_ns"]
    g = fig["gpu"]
    cost = fig.get("probe_cost") or {}
    return {
        "full_hit_rate": h["full_hit_rate"],
        "decode_full_hit_rate": h["decode_full_hit_rate"],
        "graph_rate": h["graph_rate"],
        "cpu_launch_overhead_mean_ns": lo["mean"],
        "cpu_launch_overhead_p50_ns": lo["p50"],
        "gpu_idle_share": g["idle_share"],
        "host_bound_share": g["host_bound_share"],
        "engine_idle_s": g["engine_idle_ns"] / 1e9,
        "probe_cost_per_step_ns": cost.get("per_step_ns"),
        "steady_tokens_per_s": fig["throughput"]["tokens_per_s"],
    }
