"""Analyzers: plain functions over a recording's rows (HTA style).

Each takes rows as :meth:`probe.recording.Recording.steps` returns them (dicts) and
returns plain data, so reports, exporters and tests share one set of definitions:

- :func:`hit_rates`: ``full_hit_rate`` (FULL / forward steps), ``graph_rate`` (FULL or
  PIECEWISE / forward steps), ``decode_full_hit_rate`` (FULL / uniform decode steps; the
  headline with MTP), ``padding_waste`` ((padded - real) / padded tokens), replay
  confirmation.
- :func:`miss_reasons`: counts and a few example steps per (mode, reason).
- :func:`phase_breakdown`: percentiles of CPU launch overhead and of every phase.
- :func:`reorder_summary`, :func:`gpu_summary`, :func:`verdict`.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from probe.assemble import PHASE_COLUMNS

PHASES = [p.name.lower() for p in PHASE_COLUMNS]
Row = Mapping[str, Any]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def forward_steps(steps: Iterable[Row]) -> list[Row]:
    return [s for s in steps if s.get("mode") is not None]


def is_decode(s: Row) -> bool:
    return bool(s.get("uniform")) and (s.get("uniform_decode_query_len") or 0) >= 1


def hit_rates(steps: Iterable[Row]) -> dict[str, Any]:
    fw = forward_steps(steps)
    n = len(fw)
    full = sum(1 for s in fw if s["mode"] == "full")
    pw = sum(1 for s in fw if s["mode"] == "piecewise")
    dec = [s for s in fw if is_decode(s)]
    dec_full = sum(1 for s in dec if s["mode"] == "full")
    confirmed = sum(1 for s in fw if s["mode"] in ("full", "piecewise") and s.get("replayed"))
    real = sum(s.get("num_tokens") or 0 for s in fw if s["mode"] != "none")
    padded = sum(s.get("padded_tokens") or 0 for s in fw if s["mode"] != "none")
    return {
        "steps": n,
        "full": full,
        "piecewise": pw,
        "none": n - full - pw,
        "decode_steps": len(dec),
        "decode_full": dec_full,
        "full_hit_rate": full / n if n else None,
        "graph_rate": (full + pw) / n if n else None,
        "decode_full_hit_rate": dec_full / len(dec) if dec else None,
        "replay_confirmed": confirmed,
        "replay_confirmed_rate": confirmed / (full + pw) if full + pw else None,
        "padded_tokens": padded,
        "real_tokens": real,
        "padding_waste": (padded - real) / padded if padded else None,
    }


def miss_reasons(steps: Iterable[Row], examples: int = 3) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str]] = Counter()
    ex: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for s in forward_steps(steps):
        key = (s["mode"], s.get("reason") or "unknown")
        counts[key] += 1
        if len(ex[key]) < examples:
            ex[key].append(
                {
                    "pid": s["pid"],
                    "step": s["step"],
                    "num_tokens": s.get("num_tokens"),
                    "num_reqs": s.get("num_reqs"),
                    "max_query_len": s.get("max_query_len"),
                    "uniform_decode_query_len": s.get("uniform_decode_query_len"),
                    "uniform": bool(s.get("uniform")),
                    "padded_tokens": s.get("padded_tokens"),
                }
            )
    total = sum(counts.values())
    return [
        {
            "mode": m,
            "reason": r,
            "count": c,
            "share": c / total if total else 0.0,
            "examples": ex[(m, r)],
        }
        for (m, r), c in counts.most_common()
    ]


def _pcts(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "n": len(values),
        "mean": (sum(values) / len(values)) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


def phase_breakdown(steps: Iterable[Row], by_mode: bool = True) -> dict[str, Any]:
    fw = forward_steps(steps)
    groups: dict[str, list[Row]] = {"all": fw}
    if by_mode:
        for s in fw:
            groups.setdefault(s["mode"], []).append(s)
    out: dict[str, Any] = {}
    for name, rows in groups.items():
        entry: dict[str, Any] = {
            "cpu_launch_overhead_ns": _pcts(
                [
                    r["cpu_launch_overhead_ns"]
                    for r in rows
                    if r.get("cpu_launch_overhead_ns") is not None
                ]
            ),
            "host_ns": _pcts([r["host_ns"] for r in rows if r.get("host_ns")]),
        }
        for p in PHASES:
            entry[p] = _pcts([r.get(f"{p}_ns") or 0 for r in rows])
        out[name] = entry
    return out


def gpu_summary(steps: Iterable[Row]) -> dict[str, Any]:
    fw = [s for s in forward_steps(steps) if s.get("gpu_busy_ns") is not None]
    idle = [s["gpu_idle_before_ns"] for s in fw if s.get("gpu_idle_before_ns") is not None]
    busy = [s["gpu_busy_ns"] for s in fw]
    step_ns = [s["gpu_step_ns"] for s in fw if s.get("gpu_step_ns")]
    total_idle = sum(idle)
    total_step = sum(step_ns) + total_idle
    return {
        "steps_timed": len(fw),
        "forward_busy_ns": _pcts(busy),
        "idle_before_ns": _pcts(idle),
        "idle_share": total_idle / total_step if total_step else None,
        "cpu_bound_steps": sum(1 for i in idle if i > 0),
    }


def reorder_summary(reorders: Iterable[Row]) -> dict[str, Any]:
    rows = list(reorders)
    thresholds = Counter(r["threshold"] for r in rows)
    return {
        "decisions": len(rows),
        "changed": sum(1 for r in rows if r["changed"]),
        "moved_requests": sum(r["moved"] for r in rows),
        "thresholds": {str(k): v for k, v in thresholds.most_common()},
        "spec_as_decode": sum(1 for r in rows if r["spec_as_decode"]),
        "decodes": sum(r["num_decodes"] for r in rows),
        "reqs": sum(r["num_reqs"] for r in rows),
    }


def build_summary(builds: Iterable[Row]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for b in builds:
        groups[(b.get("builder") or "?", b.get("tag") or "step", b.get("drafter") or 0)].append(
            b["t1_ns"] - b["t0_ns"]
        )
    return [
        {"builder": k[0], "tag": k[1], "drafter": bool(k[2]), **_pcts(v), "total_ns": sum(v)}
        for k, v in sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    ]


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


def verdict(steps: Sequence[Row], snapshot: Mapping[str, Any] | None = None) -> list[str]:
    """Plain-words findings, most important first."""
    out: list[str] = []
    fw = forward_steps(steps)
    if not fw:
        return ["no forward steps were recorded"]
    snap = snapshot or {}
    lim = snap.get("limiting_group") or {}
    support = snap.get("min_support") or (snap.get("resolve") or {}).get("min_cg_support") or "?"
    group = lim.get("builder") or (snap.get("resolve") or {}).get("min_cg_attn_backend") or "?"
    rates = hit_rates(fw)
    dec = [s for s in fw if is_decode(s)]
    if dec:
        by_mode = Counter(s["mode"] for s in dec)
        top_mode, _ = by_mode.most_common(1)[0]
        reasons = Counter(s.get("reason") for s in dec if s["mode"] != "full")
        uq = dec[0].get("uniform_decode_query_len") or 1
        what = f"decode steps with MTP (query length {uq})" if uq > 1 else "decode steps"
        if top_mode == "full":
            out.append(
                f"{what} replayed FULL graphs: {rates['decode_full_hit_rate']:.0%} of {len(dec)}"
            )
        else:
            reason, _ = reasons.most_common(1)[0] if reasons else ("unknown", 0)
            text = REASON_TEXT.get(reason or "", reason or "unknown").format(
                support=support, group=group
            )
            out.append(
                f"{what} ran {top_mode.upper()} because {text} "
                f"({by_mode[top_mode]} of {len(dec)} decode steps)"
            )
    others = Counter(s.get("reason") for s in fw if not is_decode(s) and s["mode"] != "full")
    for reason, n in others.most_common(2):
        text = REASON_TEXT.get(reason or "", reason or "unknown").format(
            support=support, group=group
        )
        out.append(f"{n} non-decode step(s) missed FULL: {text}")
    if rates["replay_confirmed_rate"] is not None and rates["replay_confirmed_rate"] < 0.999:
        out.append(
            f"only {rates['replay_confirmed_rate']:.1%} of graph-dispatched steps showed a "
            "replay: check for captures during serving or unhooked wrappers"
        )
    lo = phase_breakdown(fw, by_mode=False)["all"]["cpu_launch_overhead_ns"]
    if lo["p50"] is not None:
        out.append(
            f"CPU launch overhead median {lo['p50'] / 1e3:.0f} µs, p99 "
            f"{(lo['p99'] or 0) / 1e3:.0f} µs per step"
        )
    return out
