"""Analyzers: plain functions over :class:`~probe.step.Step` (HTA style), and the one
definition of every derived number.

Each takes ``Iterable[Step]`` (from :meth:`probe.reader.recording.Recording.iter_steps`, or the
live view's window) and returns plain data, so the report, the live view, ``probe ab``,
the metric set and the dashboards share one set of definitions:

- :data:`RATIOS`: every ratio (hit rates, padding waste, GPU idle share, host-bound
  share, ...) as a sum over steps divided by a sum over steps, each sum named by the
  counter that exports it, with the PromQL that computes the same ratio beside it
  (:func:`ratio`, :meth:`Ratio.promql`).
- :func:`hit_rates`: ``full_hit_rate`` (FULL / forward steps), ``graph_rate`` (FULL or
  PIECEWISE / forward steps), ``decode_full_hit_rate`` (FULL / uniform decode steps; the
  headline with MTP), ``padding_waste`` ((padded - real) / padded tokens), replay
  confirmation.
- :func:`miss_reasons`: counts and a few example steps per (mode, reason).
- :func:`phase_breakdown`: percentiles of CPU launch overhead and of every phase.
- :func:`warmup`, :class:`WarmupRule`, :func:`split_steady`: the steady-state rule
  (:data:`WARMUP_RULE`): which steps are start-up, reported apart so percentiles and
  verdicts describe serving.
- :func:`probe_cost`: the probe's own cost per step, from the calibration taken at attach.
- :func:`reorder_summary`, :func:`build_summary`, :func:`gpu_summary`, :func:`verdict`.

    >>> from probe.reader.recording import Recording, default_recording
    >>> steps = list(Recording.open(default_recording()).iter_steps())
    >>> round(ratio("gpu_idle_share", steps), 3)
    0.313
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probe.analysis.cost import calibration_of, cost_line, hooked_calls, probe_cost
from probe.records import BuildTag, Mode, Reason
from probe.step import PHASES, GpuSample, Step

__all__ = [
    "HOST_BOUND_SHARE",
    "PHASES",
    "RATIOS",
    "REASON_TEXT",
    "WARMUP_RULE",
    "WARMUP_WHY",
    "Ratio",
    "Term",
    "WarmupRule",
    "build_summary",
    "calibration_of",
    "cost_line",
    "forward_steps",
    "gpu_summary",
    "hit_rates",
    "hooked_calls",
    "host_bound",
    "miss_reasons",
    "percentile",
    "phase_breakdown",
    "probe_cost",
    "ratio",
    "reorder_summary",
    "shape_key",
    "split_steady",
    "verdict",
    "warmup",
    "warmup_summary",
]

#: a step is host-bound when the GPU sat idle before it for more than this share of the
#: step period (idle gap + the step's span on the device)
HOST_BOUND_SHARE = 0.10


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


def forward_steps(steps: Iterable[Step]) -> list[Step]:
    """The steps that ran the model (the ones every rate counts)."""
    return [s for s in steps if s.forward]


def host_bound(s: Step | GpuSample, share: float = HOST_BOUND_SHARE) -> bool | None:
    """Did the GPU wait for the host before the step for more than ``share`` of the step
    period (idle gap + the step's span on the device)? None without device timing."""
    g = s.gpu if isinstance(s, Step) else s
    if g is None or g.idle_before_ns is None or g.step_ns is None:
        return None
    return g.idle_before_ns > share * (g.idle_before_ns + g.step_ns)


# -- steady state ----------------------------------------------------------------------------

#: the steady-state rule, printed with the numbers it splits
WARMUP_RULE = (
    "warm-up, reported apart: on each rank, the steps before its first graph replay, the "
    "first step of each graph shape (mode and padded tokens) and its first eager step (the "
    "compile/JIT and first-use costs), and steps that captured a graph or were dispatched "
    "as warm-up/profile; every later step is steady state"
)

#: why a step is warm-up (the ``why`` of :func:`warmup`)
WARMUP_WHY = {
    "before_first_replay": "before the rank's first graph replay",
    "first_shape": "first step of its graph shape (or the first eager step)",
    "capture": "captured a graph",
    "warmup_or_profile": "dispatched as warm-up or profile",
}


def shape_key(s: Step) -> tuple[Mode | None, int]:
    """The batch shape whose first use is warm-up: a graph's (mode, padded tokens); every
    eager step shares one key (the eager path compiles once for all sizes)."""
    return (s.mode, s.padded_tokens) if s.graph else (Mode.NONE, 0)


class WarmupRule:
    """:data:`WARMUP_RULE` for one rank, fed its forward steps in step order.

    :meth:`feed` returns the steps (by number) found to be warm-up by that step: the step
    itself, and at the rank's first graph replay every earlier step not flagged yet. The
    offline report (:func:`warmup`) and the live view feed one of these per rank, so both
    draw the line in the same place. ``pending`` bounds the steps held while no replay
    has been seen (the live view's window; None offline).
    """

    def __init__(self, pending: int | None = None) -> None:
        self.seen: set[tuple[Mode | None, int]] = set()
        self.replayed = False
        self._pending: deque[int] = deque(maxlen=pending)

    def feed(self, s: Step) -> list[tuple[int, str]]:
        if not s.forward:
            return []
        out: list[tuple[int, str]] = []
        if s.graph and s.replayed and not self.replayed:
            out.extend((n, "before_first_replay") for n in self._pending)
            self._pending.clear()
            self.replayed = True
        key = shape_key(s)
        why = None
        if s.captures:
            why = "capture"
        elif s.reason == Reason.WARMUP_OR_PROFILE:
            why = "warmup_or_profile"
        elif key not in self.seen:
            why = "first_shape"
        self.seen.add(key)
        if why is not None:
            out.append((s.step, why))
        elif not self.replayed:
            self._pending.append(s.step)
        return out


def warmup(steps: Iterable[Step]) -> dict[tuple[int, int], str]:
    """The warm-up steps of a recording, ``(pid, step) -> why`` (:data:`WARMUP_WHY`)."""
    by_pid: dict[int, list[Step]] = defaultdict(list)
    for s in steps:
        by_pid[s.pid].append(s)
    out: dict[tuple[int, int], str] = {}
    for pid, rows in by_pid.items():
        rule = WarmupRule()
        for s in sorted(rows, key=lambda s: s.step):
            out.update(((pid, n), why) for n, why in rule.feed(s))
    return out


def split_steady(
    steps: Iterable[Step], flags: Mapping[tuple[int, int], str] | None = None
) -> tuple[list[Step], list[Step]]:
    """(steady-state forward steps, warm-up forward steps); ``flags``: from
    :func:`warmup` (computed here when not given)."""
    fw = forward_steps(steps)
    flags = warmup(fw) if flags is None else flags
    steady = [s for s in fw if (s.pid, s.step) not in flags]
    warm = [s for s in fw if (s.pid, s.step) in flags]
    return steady, warm


def warmup_summary(
    warm: Sequence[Step], flags: Mapping[tuple[int, int], str], listed: int = 20
) -> dict[str, Any]:
    """The warm-up steps' own figures: how many, why, their CPU launch overhead and host
    time, and the first ``listed`` of them."""
    why = Counter(flags.get((s.pid, s.step), "?") for s in warm)
    rows = sorted(warm, key=lambda s: (s.pid, s.step))
    return {
        "rule": WARMUP_RULE,
        "steps": len(warm),
        "why": dict(why.most_common()),
        "cpu_launch_overhead_ns": _pcts(
            [s.cpu_launch_overhead_ns for s in warm if s.cpu_launch_overhead_ns is not None]
        ),
        "host_ns": _pcts([s.host_ns for s in warm if s.host_ns]),
        "host_ns_total": sum(s.host_ns for s in warm),
        "listed": [
            {
                "pid": s.pid,
                "step": s.step,
                "why": flags.get((s.pid, s.step), "?"),
                "mode": _mode(s),
                "num_tokens": s.num_tokens,
                "padded_tokens": s.padded_tokens,
                "cpu_launch_overhead_ns": s.cpu_launch_overhead_ns,
                "host_ns": s.host_ns,
            }
            for s in rows[:listed]
        ],
    }


# -- the ratios, each defined once ------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """A sum over forward steps, and the exported series that carries the same sum.

    ``series`` is the Prometheus name without the ``vllm_graph_probe_`` namespace and
    ``matcher`` its label matcher; ``value`` is one step's contribution (times in ns).
    """

    series: str
    value: Callable[[Step], float]
    matcher: str = ""
    sign: int = 1

    def total(self, steps: Sequence[Step]) -> float:
        return self.sign * sum(self.value(s) for s in steps)


@dataclass(frozen=True)
class Ratio:
    """``sum(numerator) / sum(denominator)`` over forward steps; None when the
    denominator is 0 (no data, never a made-up 0)."""

    name: str
    help: str
    numerator: tuple[Term, ...]
    denominator: tuple[Term, ...]
    #: the PromQL's value is this ratio times ``promql_scale`` (ns here, s there)
    promql_scale: float = 1.0

    def of(self, steps: Iterable[Step]) -> float | None:
        fw = forward_steps(steps)
        den = sum(t.total(fw) for t in self.denominator)
        return sum(t.total(fw) for t in self.numerator) / den if den else None

    def promql(
        self,
        window: str = "5m",
        by: str = "",
        selector: str = "",
        namespace: str = "vllm_graph_probe",
    ) -> str:
        """The same ratio over the exported counters (``by``: e.g. ``"pid"``; ``selector``:
        label matchers without braces, e.g. ``model_name=~"$model_name"``)."""
        agg = f"sum by ({by})" if by else "sum"

        def series(t: Term) -> str:
            inner = ", ".join(x for x in (t.matcher, selector) if x)
            return f"{namespace}_{t.series}" + (f"{{{inner}}}" if inner else "")

        def rate(t: Term) -> str:
            return f"rate({series(t)}[{window}])"

        def side(terms: tuple[Term, ...], base: Term | None) -> str:
            parts = []
            for i, t in enumerate(terms):
                if i == 0 and base is not None and (t.series, t.matcher) != (base.series, ""):
                    # `or 0 * base`: a numerator with no series yet (no FULL step at all)
                    # reads 0, not "no data"; the zeros add nothing to the sum
                    parts.append(f"{agg}({rate(t)} or 0 * rate({series(base)}[{window}]))")
                else:
                    parts.append(f"{agg}({rate(t)})")
            out = parts[0] + "".join(
                f" {'-' if t.sign < 0 else '+'} {p}"
                for t, p in zip(terms[1:], parts[1:], strict=True)
            )
            return f"({out})" if len(parts) > 1 else out

        base = Term(self.denominator[0].series, self.denominator[0].value)
        return f"{side(self.numerator, base)}\n  / {side(self.denominator, None)}"


def _one(pred: Callable[[Step], bool]) -> Callable[[Step], float]:
    return lambda s: 1.0 if pred(s) else 0.0


def _graph_tokens(attr: str) -> Callable[[Step], float]:
    return lambda s: float(getattr(s, attr)) if s.graph else 0.0


_STEPS = Term("steps_total", _one(lambda s: True))
_GRAPH = Term("steps_total", _one(lambda s: s.graph), 'mode=~"full|piecewise"')
# device and host times are summed in integer ns (exact); the series carry seconds, which
# a ratio of two times does not see
_IDLE = Term("gpu_idle_before_step_seconds_sum", lambda s: s.gpu_idle_before_ns or 0)
_REORDERS = Term("reorder_decisions_total", lambda s: float(len(s.reorders)))
_LAUNCH_N = Term(
    "cpu_launch_overhead_seconds_count", _one(lambda s: s.cpu_launch_overhead_ns is not None)
)

RATIOS: Mapping[str, Ratio] = {
    r.name: r
    for r in (
        Ratio(
            "full_hit_rate",
            "FULL / forward steps",
            (Term("steps_total", _one(lambda s: s.mode == Mode.FULL), 'mode="full"'),),
            (_STEPS,),
        ),
        Ratio("graph_rate", "FULL or PIECEWISE / forward steps", (_GRAPH,), (_STEPS,)),
        Ratio(
            "decode_full_hit_rate",
            "FULL / uniform decode steps (the MTP headline)",
            (Term("decode_full_steps_total", _one(lambda s: s.decode and s.mode == Mode.FULL)),),
            (Term("decode_steps_total", _one(lambda s: s.decode)),),
        ),
        Ratio(
            "padding_waste",
            "(padded - real) / padded tokens, over graph-dispatched steps",
            (
                Term("padded_tokens_total", _graph_tokens("padded_tokens")),
                Term("real_tokens_total", _graph_tokens("num_tokens"), sign=-1),
            ),
            (Term("padded_tokens_total", _graph_tokens("padded_tokens")),),
        ),
        Ratio(
            "replay_confirmed_rate",
            "graph-dispatched steps whose replay was observed / graph-dispatched steps",
            (Term("replays_confirmed_total", _one(lambda s: s.graph and s.replayed)),),
            (_GRAPH,),
        ),
        Ratio(
            "gpu_idle_share",
            "GPU idle before steps / the step periods (idle gap + the step's span on the "
            "device), over steps with device timing",
            (_IDLE,),
            (_IDLE, Term("gpu_step_seconds_sum", lambda s: s.gpu_step_ns or 0)),
        ),
        Ratio(
            "host_bound_share",
            f"host-bound steps (GPU idle before the step > {HOST_BOUND_SHARE:.0%} of the step "
            "period) / steps with device timing",
            (Term("host_bound_steps_total", _one(lambda s: bool(host_bound(s)))),),
            (
                Term(
                    "gpu_idle_before_step_seconds_count",
                    _one(lambda s: s.gpu_idle_before_ns is not None),
                ),
            ),
        ),
        Ratio(
            "cpu_launch_overhead_mean",
            "mean CPU launch overhead per forward step (ns here; seconds in PromQL)",
            (Term("cpu_launch_overhead_seconds_sum", lambda s: s.cpu_launch_overhead_ns or 0),),
            (_LAUNCH_N,),
            promql_scale=1e-9,
        ),
        Ratio(
            "reorder_changed_share",
            "batch reorder decisions that changed the order / reorder decisions",
            (
                Term(
                    "reorder_decisions_total",
                    lambda s: float(sum(1 for o in s.reorders if o.changed)),
                    'changed="true"',
                ),
            ),
            (_REORDERS,),
        ),
    )
}


def ratio(name: str, steps: Iterable[Step]) -> float | None:
    """One of :data:`RATIOS` over ``steps``."""
    return RATIOS[name].of(steps)


def hit_rates(steps: Iterable[Step]) -> dict[str, Any]:
    fw = forward_steps(steps)
    n = len(fw)
    full = sum(1 for s in fw if s.mode == Mode.FULL)
    pw = sum(1 for s in fw if s.mode == Mode.PIECEWISE)
    dec = [s for s in fw if s.decode]
    dec_full = sum(1 for s in dec if s.mode == Mode.FULL)
    confirmed = sum(1 for s in fw if s.graph and s.replayed)
    real = sum(s.num_tokens for s in fw if s.graph)
    padded = sum(s.padded_tokens for s in fw if s.graph)
    return {
        "steps": n,
        "full": full,
        "piecewise": pw,
        "none": n - full - pw,
        "decode_steps": len(dec),
        "decode_full": dec_full,
        "full_hit_rate": ratio("full_hit_rate", fw),
        "graph_rate": ratio("graph_rate", fw),
        "decode_full_hit_rate": ratio("decode_full_hit_rate", fw),
        "replay_confirmed": confirmed,
        "replay_confirmed_rate": ratio("replay_confirmed_rate", fw),
        "padded_tokens": padded,
        "real_tokens": real,
        "padding_waste": ratio("padding_waste", fw),
    }


def _mode(s: Step) -> str:
    return s.mode.name.lower() if s.mode is not None else "none"


def _reason(s: Step) -> str:
    return s.reason.label if s.reason is not None else "unknown"


def miss_reasons(steps: Iterable[Step], examples: int = 3) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str]] = Counter()
    ex: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for s in forward_steps(steps):
        key = (_mode(s), _reason(s))
        counts[key] += 1
        if len(ex[key]) < examples:
            ex[key].append(
                {
                    "pid": s.pid,
                    "step": s.step,
                    "num_tokens": s.num_tokens,
                    "num_reqs": s.num_reqs,
                    "max_query_len": s.max_query_len,
                    "uniform_decode_query_len": s.uniform_decode_query_len,
                    "uniform": s.uniform,
                    "padded_tokens": s.padded_tokens,
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


def phase_breakdown(steps: Iterable[Step], by_mode: bool = True) -> dict[str, Any]:
    fw = forward_steps(steps)
    groups: dict[str, list[Step]] = {"all": fw}
    if by_mode:
        for s in fw:
            groups.setdefault(_mode(s), []).append(s)
    out: dict[str, Any] = {}
    for name, group in groups.items():
        entry: dict[str, Any] = {
            "cpu_launch_overhead_ns": _pcts(
                [s.cpu_launch_overhead_ns for s in group if s.cpu_launch_overhead_ns is not None]
            ),
            "host_ns": _pcts([s.host_ns for s in group if s.host_ns]),
        }
        for p in PHASES:
            entry[p] = _pcts([s.phases.get(p, 0) for s in group])
        out[name] = entry
    return out


def gpu_summary(steps: Iterable[Step], share: float = HOST_BOUND_SHARE) -> dict[str, Any]:
    """Device timings and the host-bound verdict of DESIGN: a step is host-bound when the
    GPU waited for the host before it for more than ``share`` of the step period
    (:func:`host_bound`); the phase that dominates those steps is the one with the most
    host time summed over them (``host_bound_top_phase_share``: its part of their phase
    time; ``host_bound_phases``: the first three, as close seconds happen)."""
    fw = [s for s in forward_steps(steps) if s.gpu_busy_ns is not None]
    idle = [s.gpu_idle_before_ns for s in fw if s.gpu_idle_before_ns is not None]
    bound = [s for s in fw if host_bound(s, share)]
    phase_ns = {p: sum(s.phases.get(p, 0) for s in bound) for p in PHASES}
    total = sum(phase_ns.values())
    ranked = sorted((p for p in PHASES if phase_ns[p]), key=lambda p: -phase_ns[p])
    top = ranked[0] if bound and ranked else None
    return {
        "steps_timed": len(fw),
        "forward_busy_ns": _pcts([s.gpu_busy_ns for s in fw if s.gpu_busy_ns is not None]),
        "idle_before_ns": _pcts(idle),
        "idle_share": ratio("gpu_idle_share", fw),
        "host_bound_threshold": share,
        "host_bound_steps": len(bound),
        # RATIOS["host_bound_share"] at the default threshold (the exported one)
        "host_bound_share": len(bound) / len(idle) if idle else None,
        "host_bound_top_phase": top,
        "host_bound_top_phase_share": phase_ns[top] / total if top and total else None,
        "host_bound_phases": [
            {"phase": p, "share": phase_ns[p] / total} for p in ranked[:3] if bound and total
        ],
    }


def reorder_summary(steps: Iterable[Step]) -> dict[str, Any]:
    rows = [o for s in steps for o in s.reorders]
    thresholds = Counter(r.threshold for r in rows)
    return {
        "decisions": len(rows),
        "changed": sum(1 for r in rows if r.changed),
        "moved_requests": sum(r.moved for r in rows),
        "thresholds": {str(k): v for k, v in thresholds.most_common()},
        "spec_as_decode": sum(1 for r in rows if r.spec_as_decode),
        "decodes": sum(r.num_decodes for r in rows),
        "reqs": sum(r.num_reqs for r in rows),
    }


def build_summary(
    steps: Iterable[Step], builder_names: Mapping[int, Mapping[int, str]]
) -> list[dict[str, Any]]:
    """Metadata builds per (builder class, tag, drafter); ``builder_names``: per pid, the
    builder id -> class name table (:meth:`Recording.builder_names`)."""
    groups: dict[tuple[str, str, bool], list[int]] = defaultdict(list)
    for s in steps:
        names = builder_names.get(s.pid, {})
        for b in s.builds:
            name = names.get(b.builder_id) or "?"
            groups[(name, BuildTag(b.tag).name.lower(), bool(b.flags & 1))].append(b.dur_ns)
    return [
        {"builder": k[0], "tag": k[1], "drafter": k[2], **_pcts(v), "total_ns": sum(v)}
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


def verdict(
    steps: Iterable[Step],
    snapshot: Mapping[str, Any] | None = None,
    *,
    warm: Sequence[Step] | None = None,
    cost: Mapping[str, Any] | None = None,
) -> list[str]:
    """Plain-words findings about steady state, most important first.

    ``steps`` are split by :data:`WARMUP_RULE` here; with ``warm`` given they are taken as
    the steady-state steps already (the live view keeps its own split). ``cost``: from
    :func:`probe_cost`.
    """
    out: list[str] = []
    if warm is None:
        fw, warm = split_steady(steps)
    else:
        fw = forward_steps(steps)
    if not fw:
        if warm:
            return [f"all {len(warm)} forward steps are warm-up: no steady state yet"]
        return ["no forward steps were recorded"]
    snap = snapshot or {}
    lim = snap.get("limiting_group") or {}
    support = snap.get("min_support") or (snap.get("resolve") or {}).get("min_cg_support") or "?"
    group = lim.get("builder") or (snap.get("resolve") or {}).get("min_cg_attn_backend") or "?"

    def why(reason: str | None) -> str:
        return REASON_TEXT.get(reason or "", reason or "unknown").format(
            support=support, group=group
        )

    def label(s: Step) -> str | None:
        return s.reason.label if s.reason is not None else None

    rates = hit_rates(fw)
    dec = [s for s in fw if s.decode]
    if dec:
        by_mode = Counter(_mode(s) for s in dec)
        top_mode, _ = by_mode.most_common(1)[0]
        reasons = Counter(label(s) for s in dec if s.mode != Mode.FULL)
        uq = dec[0].uniform_decode_query_len or 1
        what = f"decode steps with MTP (query length {uq})" if uq > 1 else "decode steps"
        if top_mode == "full":
            out.append(
                f"{what} replayed FULL graphs: {rates['decode_full_hit_rate']:.0%} of {len(dec):,}"
            )
        else:
            reason, _ = reasons.most_common(1)[0] if reasons else ("unknown", 0)
            out.append(
                f"{what} ran {top_mode.upper()} because {why(reason)} "
                f"({by_mode[top_mode]:,} of {len(dec):,} steady-state decode steps)"
            )
    others = Counter(label(s) for s in fw if not s.decode and s.mode != Mode.FULL)
    for reason, n in others.most_common(2):
        out.append(f"{n} non-decode step(s) missed FULL: {why(reason)}")
    if rates["replay_confirmed_rate"] is not None and rates["replay_confirmed_rate"] < 0.999:
        out.append(
            f"only {rates['replay_confirmed_rate']:.1%} of graph-dispatched steps showed a "
            "replay: check for captures during serving or unhooked wrappers"
        )
    lo = phase_breakdown(fw, by_mode=False)["all"]["cpu_launch_overhead_ns"]
    if lo["p50"] is not None:
        out.append(
            f"CPU launch overhead median {lo['p50'] / 1e3:,.0f} µs, p99 "
            f"{(lo['p99'] or 0) / 1e3:,.0f} µs per step (steady state)"
        )
    line = cost_line(cost)
    if line:
        out.append(line)
    if warm:
        worst = max((s.cpu_launch_overhead_ns or 0 for s in warm), default=0)
        out.append(
            f"{len(warm)} warm-up step(s) apart from these figures (CPU launch overhead up "
            f"to {worst / 1e3:,.0f} µs, {sum(s.host_ns for s in warm) / 1e6:,.0f} ms of host "
            "time)"
        )
    gpu = gpu_summary(fw)
    if gpu["host_bound_share"] is not None:
        n = gpu["idle_before_ns"]["n"]
        thr = gpu["host_bound_threshold"]
        rule = f"the GPU waiting for the host over {thr:.0%} of the step period"
        if gpu["host_bound_steps"]:
            line = (
                f"host-bound: {gpu['host_bound_share']:.0%} of {n:,} steady-state timed steps "
                f"({rule}); "
                "their largest host phases: "
                + ", ".join(f"{p['phase']} {p['share']:.0%}" for p in gpu["host_bound_phases"][:2])
                + " of their phase time"
            )
        else:
            line = (
                f"not host-bound: 0 of {n:,} steady-state timed steps had {rule} "
                f"(GPU idle share {gpu['idle_share']:.1%})"
            )
        out.append(line)
        ranks = sorted({s.pid for s in fw if s.gpu_idle_before_ns is not None})
        if len(ranks) > 1:
            per = []
            for pid in ranks:
                g = gpu_summary([s for s in fw if s.pid == pid])
                per.append(f"pid {pid} {g['host_bound_share']:.0%} of {g['idle_before_ns']['n']}")
            out.append("host-bound steps per rank: " + ", ".join(per))
    return out
