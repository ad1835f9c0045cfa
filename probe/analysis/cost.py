"""The probe's own cost per step: how many hooked calls each step's records stand for
(:func:`hooked_calls`), the calibration taken at attach (:func:`calibration_of`), and the
two together (:func:`cost_figures`, the one computation of the figure; :func:`probe_cost`
over Steps; :func:`cost_line`). Re-exported by :mod:`probe.analysis.views`,
whose reports print it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from probe.reader.assemble import derived_prepare
from probe.records import Flag, Mode, Phase, ReplayKind
from probe.step import Step

_BRACKET = (Phase.EXECUTE, Phase.SAMPLE_TOKENS)
_DRAFTER_FLAG = int(Flag.DRAFTER)


def hooked_calls(
    s: Step,
    launch_is_replay: bool = False,
    v1_launch_is_replay: bool = False,
    dispatch_in_phase: bool = False,
) -> tuple[int, int]:
    """(plain span calls, Python-bodied hook calls) the probe made in this step, from its
    records: phase spans other than the step bracket and the forward launch are span
    calls; the step bracket (execute_model, sample_tokens), the forward launch, each
    replay or piecewise pass inside it, each dispatch, build and reorder are hook calls
    (a dispatch that also carries its phase span counts as both); MRV2's ``prepare_inputs``
    span that the reader derived from the metadata build's (:func:`probe.reader.assemble.
    derived_prepare`) is none. ``launch_is_replay``
    (:func:`calibration_of`): an MRV2 FULL launch and the target replay counted in it are
    one call, as the hooks since ``3792259`` make them; ``v1_launch_is_replay`` the same
    for V1, whose model's FULL wrapper is the launch when ``_model_forward`` is left
    unhooked. ``dispatch_in_phase``: MRV2's dispatch phase read the decision from what
    ``dispatch_cg_and_sync_dp`` returned (the manager unhooked, DP 1), so a dispatch
    carrying its phase span is one call, not two."""
    spans = sum(1 for sp in s.spans if sp.phase not in (*_BRACKET, Phase.FORWARD_LAUNCH))
    spans -= len(derived_prepare(s.spans))  # added by the reader, not a call
    hooks = (
        sum(1 for sp in s.spans if sp.phase in (*_BRACKET, Phase.FORWARD_LAUNCH))
        + sum(1 for r in s.replays if r.kind != ReplayKind.CAPTURE)
        + len(s.dispatches)
        + len(s.builds)
        + len(s.reorders)
    )
    if dispatch_in_phase and s.runner == "mrv2":
        # the target's decision and its phase span, one record (a recording keeps them
        # apart, the same times): one call
        phase = {
            (sp.t0, sp.t1)
            for sp in s.spans
            if sp.phase == Phase.DISPATCH and not sp.flags & _DRAFTER_FLAG
        }
        spans -= sum(
            1 for d in s.dispatches if not d.flags & _DRAFTER_FLAG and (d.t0, d.t1) in phase
        )
    merged = launch_is_replay if s.runner == "mrv2" else v1_launch_is_replay
    if merged and s.mode == Mode.FULL and s.replayed:
        launches = any(
            sp.phase == Phase.FORWARD_LAUNCH and not sp.flags & _DRAFTER_FLAG for sp in s.spans
        )
        hooks -= 1 if launches else 0
    return spans, hooks


def calls_with(s: Step, cal: Mapping[str, Any]) -> tuple[int, int]:
    """:func:`hooked_calls` of a step with the hooks' shape a calibration carries
    (:func:`calibration_of`: ``launch_is_replay``, ``v1_launch_is_replay``,
    ``dispatch_in_phase``), as the report, the metrics and the dashboards' render count."""
    return hooked_calls(
        s,
        bool(cal.get("launch_is_replay")),
        bool(cal.get("v1_launch_is_replay")),
        bool(cal.get("dispatch_in_phase")),
    )


def calibration_of(snapshot: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The calibration a snapshot carries (``snapshot["probe"]["calibration"]``), or None
    when it has none (recorded before calibration, or calibration failed). With it,
    ``launch_is_replay``: whether the hooks that wrote the recording made MRV2's FULL
    launch one call (``replay.mrv2.run_fullgraph`` installed without the earlier
    ``phase.mrv2.forward_full``), and ``v1_launch_is_replay`` V1's (``replay.wrapper``
    installed, V1's step hooks too, ``phase.v1.forward_launch`` not), for
    :func:`hooked_calls`; ``dispatch_in_phase`` whether MRV2's dispatch phase read the
    decision itself (``dispatch.mrv2.sync_dp`` installed, ``dispatch.mrv2.manager``
    not: DP 1, where the manager is not hooked)."""
    cal = ((snapshot or {}).get("probe") or {}).get("calibration")
    if not isinstance(cal, Mapping):
        return None
    if not has_timing(cal, ""):
        return None
    hooks = (snapshot or {}).get("hooks")
    installed = hooks.get("installed") if isinstance(hooks, Mapping) else None
    ids = {h for h in installed if isinstance(h, str)} if isinstance(installed, list) else set()
    out = dict(cal)
    out["launch_is_replay"] = "replay.mrv2.run_fullgraph" in ids and (
        "phase.mrv2.forward_full" not in ids
    )
    out["dispatch_in_phase"] = "dispatch.mrv2.sync_dp" in ids and "dispatch.mrv2.manager" not in ids
    out["v1_launch_is_replay"] = (
        "replay.wrapper" in ids
        and "step.v1.execute_model" in ids
        and "phase.v1.forward_launch" not in ids
    )
    return out


def probe_cost(
    steps: Iterable[Step], calibrations: Mapping[int, Mapping[str, Any] | None]
) -> dict[str, Any] | None:
    """The probe's cost per forward step by each rank's calibration (``pid ->``
    :func:`calibration_of`), and its share of the CPU launch overhead of the same steps
    (the sums' ratio): :func:`cost_figures` of the steps' hooked calls (:func:`calls_with`),
    counted per calibration. None when no step's rank has a calibration."""
    per: dict[int, list[Any]] = {}  # id(calibration) -> [calibration, steps, spans, hooks]
    launch = launch_n = 0
    for s in steps:
        c = calibrations.get(s.pid)
        if not s.forward or c is None:
            continue
        n_span, n_hook = calls_with(s, c)
        row = per.setdefault(id(c), [c, 0, 0, 0])
        row[1] += 1
        row[2] += n_span
        row[3] += n_hook
        if s.cpu_launch_overhead_ns is not None:
            launch += s.cpu_launch_overhead_ns
            launch_n += 1
    mean_launch = launch / launch_n if launch_n else None
    return cost_figures([(c, n, a, b) for c, n, a, b in per.values()], mean_launch)


def cost_figures(
    per: Sequence[tuple[Mapping[str, Any], int, int, int]], mean_launch_ns: float | None
) -> dict[str, Any] | None:
    """The probe cost's figures, for every surface (the report, ``probe ab``, the live view,
    :func:`probe_cost`): ``per``, the steps counted by calibration, each ``(calibration,
    steps, span calls, hook calls)`` (:func:`calls_with`, summed over those steps);
    ``mean_launch_ns``, the mean CPU launch overhead of the same steps. The cost per step
    by each timing of the calibrations (all of them have it, else None), their share of
    that mean, and the headline (:func:`with_headline`). None without a step."""
    rows = [r for r in per if r[1]]
    if not rows:
        return None
    n = sum(r[1] for r in rows)
    spans = sum(r[2] for r in rows)
    hooks = sum(r[3] for r in rows)
    used = list({id(c): c for c, *_ in rows}.values())
    cold_ok = all(has_timing(c, "_cold") for c in used)
    code_ok = cold_ok and all(has_timing(c, "_cold_code") for c in used)

    def cost(timing: str) -> float:
        return sum(cost_per_step_ns(dict(c), a, b, timing) for c, _, a, b in rows)

    per_step = cost("") / n
    cold = cost("_cold") / n if cold_ok else None
    code = cost("_cold_code") / n if code_ok else None

    def share(x: float | None) -> float | None:
        return x / mean_launch_ns if mean_launch_ns and x is not None else None

    def each(key: str, ok: bool = True) -> list[float] | None:
        return [float(c[key]) for c in used] if ok else None

    return with_headline(
        {
            "steps": n,
            "span_calls_per_step": spans / n,
            "hook_calls_per_step": hooks / n,
            "span_ns": each("span_ns"),
            "hook_ns": each("hook_ns"),
            "hot_path": sorted({str(c.get("hot_path")) for c in used}),
            "per_step_warm_ns": per_step,
            "cpu_launch_overhead_mean_ns": mean_launch_ns,
            "share_warm_of_cpu_launch_overhead": share(per_step),
            "span_cold_ns": each("span_cold_ns", cold_ok),
            "hook_cold_ns": each("hook_cold_ns", cold_ok),
            "per_step_cold_ns": cold,
            "share_cold_of_cpu_launch_overhead": share(cold),
            "span_cold_code_ns": each("span_cold_code_ns", code_ok),
            "hook_cold_code_ns": each("hook_cold_code_ns", code_ok),
            "per_step_cold_code_ns": code,
            "share_cold_code_of_cpu_launch_overhead": share(code),
        }
    )


def cost_key(timing: str) -> str:
    """The key of :func:`probe_cost`'s figure per step by one timing (a suffix of
    :data:`TIMINGS`): ``per_step_warm_ns``, ``per_step_cold_ns``, ``per_step_cold_code_ns``."""
    return f"per_step{timing or '_warm'}_ns"


def with_headline(cost: dict[str, Any]) -> dict[str, Any]:
    """``cost`` with its one headline figure: ``per_step_ns``, the probe's cost per step by
    the calibration's code-evicted timing where it has one (the figure that matches the
    cost measured end to end: :data:`HEADLINE_NOTE`), else by its data-evicted one, else by
    the hot loop's (each a lower bound); ``per_step_timing`` names which (a key of
    :data:`TIMINGS`), ``share_of_cpu_launch_overhead`` is its share of the mean CPU launch
    overhead. Every surface shows this one; the others by their names."""
    for timing in ("cold_code", "cold", "warm"):
        v = cost.get(cost_key(TIMINGS[timing]))
        if v is not None:
            share = f"share{TIMINGS[timing] or '_warm'}_of_cpu_launch_overhead"
            return {
                **cost,
                "per_step_ns": v,
                "per_step_timing": timing,
                "share_of_cpu_launch_overhead": cost.get(share),
            }
    return {**cost, "per_step_ns": None, "per_step_timing": None}


TIMINGS: Mapping[str, str] = {"warm": "", "cold": "_cold", "cold_code": "_cold_code"}
"""The calibration's timings by name (a hot loop; data evicted; code evicted too) and
their key suffixes there (``span{suffix}_ns``, :func:`cost_per_step_ns`);
the metrics' ``timing`` label."""


def has_timing(cal: Mapping[str, Any], timing: str) -> bool:
    """Whether a calibration carries usable span and hook figures of one timing: ``""``
    (warm), ``"_cold"`` (absent from the oldest calibrations), ``"_cold_code"`` (absent from
    calibrations older than the code-evicted timing)."""
    try:
        values = [float(cal[f"{k}{timing}_ns"]) for k in ("span", "hook")]
    except (KeyError, TypeError, ValueError, OverflowError):
        return False
    # a damaged recording's NaN, infinity or absurd figure (over a second a call) is no
    # calibration, rather than a cost line of that size
    return all(0 <= v < 1e9 for v in values)


IN_ENGINE_NOTE = (
    "a lower bound: in a real engine the hooks cost more than around a no-op"
    " (one H200, MRV2 k=1: 34-37 µs per step end to end, benchmarks/evidence/overhead.md)"
)
"""What a warm-only calibration leaves out, as measured end to end
(benchmarks/gpu/crossover.py); printed for recordings without cold timings."""

COLD_NOTE = (
    "calibrated with cold caches: a floor, end to end 1-5x this (benchmarks/evidence/overhead.md)"
)
"""How the data-only cold estimate was taken (:mod:`probe.engine.calibrate`) and what it is worth
alone, measured end to end (``benchmarks/gpu/crossover.py``, same runs): on the real CPU
engine it read 15.3-16.8 µs per V1 step where the crossover measured +14.3 [+10.8, +17.0]
(benchmarks/evidence/overhead.md); on one H200 (MRV2 k=1, a KVM guest with a 300 MB
shared L3) 10.9-26.6 µs where the crossover measured 28-62 µs per run
(benchmarks/evidence/overhead.md). So a floor: printed for recordings whose
calibration has no code-evicted figures (the older ones)."""

HEADLINE_NOTE = (
    "calibrated at attach with code and data evicted, which matches the cost measured end"
    " to end (H200 MRV2: 50.1 µs against +48.9 [+27.0, +65.6]; benchmarks/evidence/overhead.md)"
)
"""Why the code-evicted figure is the headline: of the calibration's three timings it is
the one the end-to-end crossover measured, pooled over the same runs (one H200, MRV2 k = 1:
mean 50.1 µs per step against +48.9 [+27.0, +65.6] enabled against dormant; the CPU engine,
V1: 35.1 against +24.3 [+11.4, +36.6]); the data-evicted figure read about half of it
there (26.1), the hot loop's a tenth (benchmarks/evidence/overhead.md, "The probe's overhead")."""


def cost_line(cost: Mapping[str, Any] | None, short: bool = False) -> str | None:
    """The probe's cost per step, in words: the one headline figure (:func:`with_headline`,
    ``per_step_ns``) and its share of the CPU launch overhead, then the calibration's other
    figures, each named for what it is:

    - with code-evicted timings (every current calibration): "probe cost X µs per step
      (A% of CPU launch overhead; :data:`HEADLINE_NOTE`; data evicted Y µs, hot loop Z
      µs)";
    - with data-only cold timings: "probe cost ≥ X µs per step (A% ...; :data:`COLD_NOTE`;
      hot loop Z µs)";
    - warm only: "probe cost ≥ X µs per step (A% ...; :data:`IN_ENGINE_NOTE`)", a hot loop
      around a no-op, where inside vLLM's step the same hooks cost several times that.

    None without a calibration. ``short``: the same figures within 80 columns, for the live
    view ("probe cost X µs/step, A% of launch (data evicted Y, hot loop Z)")."""
    if not cost or cost.get("per_step_ns") is None:
        return None
    head = cost["per_step_ns"] / 1e3
    timing = cost.get("per_step_timing")
    warm = cost["per_step_warm_ns"] / 1e3
    share = cost.get("share_of_cpu_launch_overhead")
    if short:
        pct = f", {share:.1%} of launch" if share is not None else ""
        if timing == "cold_code":
            cold = cost["per_step_cold_ns"] / 1e3
            tail = f"(data evicted {cold:.1f}, hot loop {warm:.1f})"
            return f"probe cost {head:.1f} µs/step{pct} {tail}"
        if timing == "cold":
            return f"probe cost ≥ {head:.1f} µs/step{pct} (cold floor; hot loop {warm:.1f})"
        return f"probe cost ≥ {head:.1f} µs/step{pct} (warm calibration: a lower bound)"
    of = f"{share:.1%} of CPU launch overhead; " if share is not None else ""
    if timing == "cold_code":
        cold = cost["per_step_cold_ns"] / 1e3
        return (
            f"probe cost {head:.1f} µs per step ({of}{HEADLINE_NOTE}; "
            f"data evicted {cold:.1f} µs, hot loop {warm:.1f} µs)"
        )
    if timing == "cold":
        return f"probe cost ≥ {head:.1f} µs per step ({of}{COLD_NOTE}; hot loop {warm:.1f} µs)"
    return f"probe cost ≥ {head:.1f} µs per step ({of}{IN_ENGINE_NOTE})"


def cost_per_step_ns(cal: dict[str, Any], spans: float, hooks: float, timing: str = "") -> float:
    """The probe's cost for one step that made ``spans`` plain span calls and ``hooks``
    Python-bodied hook calls, by the calibration's hot-loop figures (``timing=""``), its
    cold ones (``"_cold"``) or those with code evicted too (``"_cold_code"``)."""
    return (
        float(cal.get(f"span{timing}_ns", 0.0)) * spans
        + float(cal.get(f"hook{timing}_ns", 0.0)) * hooks
    )
