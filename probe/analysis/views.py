"""Analyzers over :class:`~probe.step.Step` (HTA style): thin views of the one summary
(:mod:`probe.analysis.summary`), split by the rules of :mod:`probe.analysis.rules`, and the
ratios the
metric set exports with the PromQL beside each (:data:`RATIOS`).

Each function takes ``Iterable[Step]`` (a recording's, or the live view's window) and
returns plain data; the figures come from :func:`probe.analysis.steady.summarize_steps`, so the
report, the live view, ``probe ab``, the metric set and the dashboards agree:

- :data:`RATIOS`: every ratio (hit rates, padding waste, GPU idle share, host-bound
  share, mean CPU launch overhead, ...) over steady-state steps, each with the counters
  that export its sums and the PromQL that computes it from them (:meth:`Ratio.promql`:
  the series of steady steps by default, ``steady="true"``).
- :func:`hit_rates` (every forward step), :func:`miss_reasons`, :func:`phase_breakdown`,
  :func:`gpu_summary`, :func:`verdict` (steady state), :func:`warmup` and
  :func:`split_steady` (the steady-state rule, :data:`WARMUP_RULE`).

    >>> from probe.reader.recording import Recording, default_recording
    >>> steps = list(Recording.open(default_recording()).iter_steps())
    >>> round(ratio("gpu_idle_share", steps), 3)
    0.172
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probe.analysis import rules
from probe.analysis.cost import calibration_of, cost_line, hooked_calls, probe_cost
from probe.analysis.figures import idle_rule_words
from probe.analysis.summary import REASON_TEXT
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
    "build_summary",
    "calibration_of",
    "cost_line",
    "forward_steps",
    "gpu_summary",
    "hit_rates",
    "hooked_calls",
    "host_bound",
    "idle_rule_words",
    "is_steady",
    "miss_reasons",
    "percentile",
    "phase_breakdown",
    "probe_cost",
    "ratio",
    "ratios_of",
    "reorder_summary",
    "split_steady",
    "verdict",
    "warmup",
]

HOST_BOUND_SHARE = rules.HOST_BOUND_SHARE
#: the steady-state rule, printed with the numbers it splits
WARMUP_RULE = rules.RULES["steady"]
WARMUP_WHY = rules.WARMUP_WHY


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of values at hand; None for none."""
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
    """:func:`probe.analysis.rules.host_bound` of one step's device timing; None without it (the
    engine-idle test needs the step before: :mod:`probe.analysis.summary` applies both)."""
    g = s.gpu if isinstance(s, Step) else s
    if g is None or g.idle_before_ns is None or g.step_ns is None:
        return None
    return bool(rules.host_bound(g.idle_before_ns, g.step_ns, share))


def _summary(steps: Iterable[Step], cals: Mapping[int, Any] | None = None) -> Any:
    from probe.analysis.steady import summarize_steps

    return summarize_steps(list(steps), cals)


def _figures(steps: Iterable[Step]) -> dict[str, Any]:
    return _summary(steps).figures()  # type: ignore[no-any-return]


def warmup(steps: Iterable[Step]) -> dict[tuple[int, int], str]:
    """The warm-up steps of a set of steps, ``(pid, step) -> why`` (:data:`WARMUP_WHY`),
    by :mod:`probe.analysis.rules` as :mod:`probe.analysis.summary` decides them."""
    from probe.analysis.summary import Summary, columns_of_steps

    rows = sorted(forward_steps(steps), key=lambda s: (s.pid, s.step))
    if not rows:
        return {}
    summ = Summary()
    summ.add_columns(columns_of_steps(rows))
    raw, _, cand, *_ = summ.last
    _, decided = summ.resolved()
    replayed = {p for p, r in summ.ranks.items() if r.replayed}
    out: dict[tuple[int, int], str] = {}
    for j, s in enumerate(rows):
        c = int(raw[j])
        if cand[j]:
            why = decided.get((s.pid, s.step))
            if why:
                out[(s.pid, s.step)] = why
            continue
        if c == 5:  # before a first replay
            if s.pid in replayed:
                out[(s.pid, s.step)] = rules.CLASSES[rules.BEFORE_REPLAY]
        elif c > 0:
            out[(s.pid, s.step)] = rules.CLASSES[c]
    return out


def is_steady(steps: Sequence[Step]) -> list[bool]:
    """Per step, in the order given: a steady-state forward step (:mod:`probe.analysis.rules`)?
    The predicate every consumer of steps splits by (``probe whatif``'s costs too)."""
    flags = warmup(steps)
    return [s.forward and (s.pid, s.step) not in flags for s in steps]


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


# -- the ratios, each defined once ------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """A sum over steps carried by an exported series: ``series`` is the Prometheus name
    without the ``vllm_graph_probe_`` namespace and ``matcher`` its label matcher;
    ``steady``: the series carries the steady-state split (the ``steady`` label)."""

    series: str
    matcher: str = ""
    sign: int = 1
    steady: bool = True


@dataclass(frozen=True)
class Ratio:
    """``sum(numerator) / sum(denominator)``: the figure ``figure`` of
    :meth:`probe.analysis.summary.Summary.figures` (:func:`ratios_of`), and the same over the
    exported counters (:meth:`promql`). None when the denominator is 0."""

    name: str
    help: str
    numerator: tuple[Term, ...]
    denominator: tuple[Term, ...]
    #: the PromQL's value is this ratio times ``promql_scale`` (ns here, s there)
    promql_scale: float = 1.0

    def of(self, steps: Iterable[Step]) -> float | None:
        summ = _summary(steps)
        return ratios_of(summ.figures(), summ)[self.name]

    def promql(
        self,
        window: str = "5m",
        by: str = "",
        selector: str = "",
        namespace: str = "vllm_graph_probe",
        steady: bool = True,
    ) -> str:
        """The same ratio over the exported counters (``by``: e.g. ``"pid"``; ``selector``:
        label matchers without braces, e.g. ``model_name=~"$model_name"``; ``steady``:
        the steady-state series, as the report; False: every step)."""
        agg = f"sum by ({by})" if by else "sum"

        def series(t: Term) -> str:
            split = 'steady="true"' if steady and t.steady else ""
            inner = ", ".join(x for x in (t.matcher, split, selector) if x)
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

        d = self.denominator[0]
        base = Term(d.series, steady=d.steady)
        return f"{side(self.numerator, base)}\n  / {side(self.denominator, None)}"


_STEPS = Term("steps_total")
_GRAPH = Term("steps_total", 'mode=~"full|piecewise"')
_IDLE = Term("gpu_idle_before_step_seconds_sum")

RATIOS: Mapping[str, Ratio] = {
    r.name: r
    for r in (
        Ratio(
            "full_hit_rate",
            "FULL / forward steps",
            (Term("steps_total", 'mode="full"'),),
            (_STEPS,),
        ),
        Ratio("graph_rate", "FULL or PIECEWISE / forward steps", (_GRAPH,), (_STEPS,)),
        Ratio(
            "decode_full_hit_rate",
            "FULL / uniform decode steps (the MTP headline)",
            (Term("decode_full_steps_total"),),
            (Term("decode_steps_total"),),
        ),
        Ratio(
            "padding_waste",
            "(padded - real) / padded tokens, over graph-dispatched steps",
            (Term("padded_tokens_total"), Term("real_tokens_total", sign=-1)),
            (Term("padded_tokens_total"),),
        ),
        Ratio(
            "replay_confirmed_rate",
            "graph-dispatched steps whose replay was observed / graph-dispatched steps",
            (Term("replays_confirmed_total"),),
            (_GRAPH,),
        ),
        Ratio(
            "gpu_idle_share",
            "GPU idle before steps / the step periods (idle gap + the step's span on the "
            "device), over steps with device timing, the engine not idle (probe.analysis.rules)",
            (_IDLE,),
            (_IDLE, Term("gpu_step_seconds_sum")),
        ),
        Ratio(
            "host_bound_share",
            f"host-bound steps (GPU idle before the step > {HOST_BOUND_SHARE:.0%} of the step "
            "period) / steps with device timing, the engine not idle (probe.analysis.rules)",
            (Term("host_bound_steps_total"),),
            (Term("gpu_idle_before_step_seconds_count"),),
        ),
        Ratio(
            "cpu_launch_overhead_mean",
            "mean CPU launch overhead per forward step (ns here; seconds in PromQL)",
            (Term("cpu_launch_overhead_seconds_sum"),),
            (Term("cpu_launch_overhead_seconds_count"),),
            promql_scale=1e-9,
        ),
        Ratio(
            "steady_tokens_per_second",
            "scheduled tokens / serving time (each step's period, engine-idle gaps out), per s",
            (Term("scheduled_tokens_total"),),
            (Term("serving_seconds_total"),),
        ),
        Ratio(
            "reorder_changed_share",
            "batch reorder decisions that changed the order / reorder decisions (every step)",
            (Term("reorder_decisions_total", 'changed="true"', steady=False),),
            (Term("reorder_decisions_total", steady=False),),
        ),
    )
}


def ratios_of(fig: Mapping[str, Any], summ: Any) -> dict[str, float | None]:
    """Each of :data:`RATIOS` read from :meth:`probe.analysis.summary.Summary.figures` (``summ``:
    that summary, for the reorder counts)."""
    h, g = fig["hit_rates"], fig["gpu"]
    ro = summ.reorder_figures()
    tp = fig["throughput"]["tokens_per_s"]
    return {
        "full_hit_rate": h["full_hit_rate"],
        "graph_rate": h["graph_rate"],
        "decode_full_hit_rate": h["decode_full_hit_rate"],
        "padding_waste": h["padding_waste"],
        "replay_confirmed_rate": h["replay_confirmed_rate"],
        "gpu_idle_share": g["idle_share"],
        "host_bound_share": g["host_bound_share"],
        "cpu_launch_overhead_mean": fig["phases"]["all"]["cpu_launch_overhead_ns"]["mean"],
        "steady_tokens_per_second": tp,
        "reorder_changed_share": ro["changed"] / ro["decisions"] if ro["decisions"] else None,
    }


def ratio(name: str, steps: Iterable[Step]) -> float | None:
    """One of :data:`RATIOS` over ``steps`` (steady state, as exported)."""
    return RATIOS[name].of(steps)


def hit_rates(steps: Iterable[Step]) -> dict[str, Any]:
    """Hit rates over every forward step (:func:`probe.analysis.summary`'s ``hit_rates_all``)."""
    return _figures(steps)["hit_rates_all"]  # type: ignore[no-any-return]


def miss_reasons(steps: Iterable[Step], examples: int = 3) -> list[dict[str, Any]]:
    """Counts per (mode, reason) over every forward step (with the steady ones), and up
    to three example steps of each."""
    rows = _figures(steps)["miss_reasons"]
    return [{**r, "examples": r["examples"][:examples]} for r in rows]


def phase_breakdown(steps: Iterable[Step], by_mode: bool = True) -> dict[str, Any]:
    """Percentiles of CPU launch overhead, host time and every phase of the steady steps
    among ``steps``, all and by mode."""
    out = _figures(steps)["phases"]
    return out if by_mode else {"all": out["all"]}


def gpu_summary(steps: Iterable[Step], share: float = HOST_BOUND_SHARE) -> dict[str, Any]:
    """Device timings of the steady steps among ``steps`` and the host-bound verdict
    (:mod:`probe.analysis.rules`)."""
    del share
    return _figures(steps)["gpu"]  # type: ignore[no-any-return]


def reorder_summary(steps: Iterable[Step]) -> dict[str, Any]:
    return _summary(list(steps), {}).reorder_figures()  # type: ignore[no-any-return]


def build_summary(
    steps: Iterable[Step], builder_names: Mapping[int, Mapping[int, str]]
) -> list[dict[str, Any]]:
    """Metadata builds per (builder class, tag, drafter)."""
    from probe.analysis.summary import Summary

    s = Summary()
    s.add_builds(builder_names, steps)
    return s.build_figures()  # type: ignore[no-any-return]


def verdict(
    steps: Iterable[Step],
    snapshot: Mapping[str, Any] | None = None,
    *,
    cost: Mapping[str, Any] | None = None,
) -> list[str]:
    """Plain-words findings about the steady state of ``steps``
    (:func:`probe.analysis.summary.verdict`)."""
    from probe.analysis.summary import verdict as of_figures

    fig = _figures(steps)
    if cost is not None:
        fig["probe_cost"] = dict(cost)
    return of_figures(fig, snapshot)
