"""Cost model: what a steady step costs on the host and on the GPU, per graph mode and batch shape.

A recording's steady forward steps (:func:`steady_keys`, the project's steady-state rule)
are grouped into **curves**, one per (graph mode, uniform decode or not), and within a
curve into **shapes** (scheduled tokens, requests). Each shape keeps its step count and
its mean host time per step (``Step.host_ns``) and mean CPU launch overhead
(``Step.cpu_launch_overhead_ns``). :meth:`Costs.price` gives a shape's cost:

- **measured**: the shape ran in the recording, at that mode: its own means;
- **interpolated**: the curve holds other shapes around it (the shape lies inside the
  curve's measured token range and request range): the inverse-distance mean of the two
  nearest measured shapes, distance in (tokens, requests) each scaled by the curve's
  measured range. Its error, measured by leaving each shape out in turn
  (:func:`leave_one_shape_out`), is in docs/whatif.md;
- nothing, outside the measured shapes or for a curve the recording never ran: the
  what-if says so instead of guessing.

:func:`predict` prices a replayed column's steady steps with one or more :class:`Costs`
(the recording's own first, then ``--costs-from``'s) and gives the predicted steady host
time per step, CPU launch overhead, and the shapes it had no cost for; with the recorded
steps and their :func:`timeline`, the steady throughput too (:func:`periods`: each step's
period from the slower of its host side and its GPU side, each shape's device timing).
Plain functions over :class:`~probe.step.Step`; nothing here imports vLLM.

    >>> from probe.reader.recording import Recording, default_recording
    >>> rec = Recording.open(default_recording())
    >>> costs = Costs.of(list(rec.iter_steps()), "bundled")
    >>> costs.price("PIECEWISE", True, 128, 64).how
    'measured'
    >>> costs.price("FULL", True, 128, 64) is None
    True
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probe.analysis import rules
from probe.analysis import views as analysis
from probe.step import Step

__all__ = [
    "GPU",
    "HOST",
    "Beat",
    "Cost",
    "Costs",
    "Point",
    "between_steps",
    "curve_of",
    "device_side",
    "leave_one_shape_out",
    "measured",
    "predict",
    "steady_keys",
    "timeline",
]

#: the sides that bound a step's period
HOST = "host"
GPU = "gpu"

#: a curve: (graph mode name, uniform decode)
Curve = tuple[str, bool]
#: a shape inside a curve: (scheduled tokens, requests)
Shape = tuple[int, int]


def steady_keys(steps: Iterable[Step]) -> set[tuple[int, int]]:
    """``(pid, step)`` of the steady-state forward steps: the one place this module asks
    for the project's steady-state rule."""
    steady, _ = analysis.split_steady(steps)
    return {(s.pid, s.step) for s in steady}


@dataclass(frozen=True)
class Beat:
    """A step's place in its rank's timeline, by the summary's rules: ``period_ns`` (what
    steady throughput divides by: from the end of the step before to its own end, or its
    own host time after engine idle), ``after_idle`` and the host ``gap_ns`` before it."""

    period_ns: int
    after_idle: bool
    gap_ns: int


def timeline(steps: Iterable[Step]) -> dict[tuple[int, int], Beat]:
    """Each step's :class:`Beat`, ``(pid, step) -> Beat``, from the same pass the summary
    (steady throughput's serving time) makes."""
    from probe.analysis.steady import Classes, summarize_steps

    rows = sorted(steps, key=lambda s: (s.pid, s.step))
    if not rows:
        return {}
    split = Classes.of(summarize_steps(rows))
    split.keep = len(rows) + 1
    split.classify(rows)
    return {
        (pid, n): Beat(period, idle, gap)
        for pid, seen in split.recent.items()
        for n, (_, idle, period, gap) in seen.items()
    }


def device_side(s: Step, after_idle: bool) -> tuple[bool, int] | None:
    """(GPU-fed, device period ns) of one step, None without device timing.

    GPU-fed: the GPU did not wait on the host before the step (not host-bound,
    :func:`probe.analysis.rules.host_bound`); its device period is the idle it could
    not hide plus the step's span on the stream. After engine idle the GPU had nothing
    to wait for: the step's span alone, GPU-fed where it is longer than the host's time.
    """
    span, idle = s.gpu_step_ns, s.gpu_idle_before_ns
    if span is None or span < 0:
        return None
    if after_idle:
        return span > s.host_ns, span
    if idle is None or idle < 0:
        return None
    return not rules.host_bound(idle, span), idle + span


def between_steps(steps: Iterable[Step], line: Mapping[tuple[int, int], Beat]) -> float | None:
    """The host's own time between two steps (scheduling, outputs): the median host gap
    before the steps whose GPU waited on the host (then the host had no GPU to wait for,
    and the gap is its own work). None where no step shows it."""
    gaps = []
    for s in steps:
        beat = line.get((s.pid, s.step))
        if beat is None or beat.after_idle:
            continue
        side = device_side(s, False)
        if side is not None and not side[0]:
            gaps.append(float(beat.gap_ns))
    return analysis.percentile(gaps, 50) if gaps else None


def curve_of(s: Step) -> Curve:
    """The curve a step belongs to: its graph mode (NONE when eager or unknown) and
    whether it was a uniform decode batch."""
    return (s.mode.name if s.mode is not None else "NONE", bool(s.uniform))


@dataclass(frozen=True)
class Point:
    """One measured shape: its steady step count and mean costs (ns), and its GPU side:
    ``timed`` steps with device timing, ``gpu_fed`` of them bounded by the GPU (see
    :func:`gpu_fed`), and ``gpu_ns``, the mean device period of those (None: none)."""

    steps: int
    host_ns: float
    launch_ns: float | None
    timed: int = 0
    gpu_fed: int = 0
    gpu_ns: float | None = None

    @property
    def bound(self) -> str | None:
        """Which side bounds this shape's steps: ``gpu`` where at least half of its timed
        steps were GPU-fed, ``host`` otherwise, None without device timing."""
        if not self.timed:
            return None
        return GPU if 2 * self.gpu_fed >= self.timed else HOST


@dataclass(frozen=True)
class Cost:
    """A shape's price: ``how`` is ``measured`` or ``interpolated``; ``source`` names the
    recording the costs came from."""

    host_ns: float
    launch_ns: float | None
    how: str
    source: str
    #: the shape's side (:attr:`Point.bound`; None: no device timing, or interpolated)
    bound: str | None = None
    #: its GPU side, the mean device period of its GPU-fed steps (``bound`` ``gpu`` only)
    gpu_ns: float | None = None


def _points(
    steps: Iterable[Step], line: Mapping[tuple[int, int], Beat] | None = None
) -> dict[Curve, dict[Shape, Point]]:
    host: dict[tuple[Curve, Shape], list[int]] = defaultdict(list)
    launch: dict[tuple[Curve, Shape], list[int]] = defaultdict(list)
    timed: Counter[tuple[Curve, Shape]] = Counter()
    fed: dict[tuple[Curve, Shape], list[int]] = defaultdict(list)
    for s in steps:
        key = (curve_of(s), (s.num_tokens, s.num_reqs))
        host[key].append(s.host_ns)
        if s.cpu_launch_overhead_ns is not None:
            launch[key].append(s.cpu_launch_overhead_ns)
        beat = line.get((s.pid, s.step)) if line is not None else None
        side = device_side(s, beat.after_idle) if beat is not None else None
        if side is not None:
            timed[key] += 1
            if side[0]:
                fed[key].append(side[1])
    out: dict[Curve, dict[Shape, Point]] = defaultdict(dict)
    for (curve, shape), hs in host.items():
        ls = launch.get((curve, shape), [])
        gs = fed.get((curve, shape), [])
        out[curve][shape] = Point(
            len(hs),
            sum(hs) / len(hs),
            sum(ls) / len(ls) if ls else None,
            timed[(curve, shape)],
            len(gs),
            sum(gs) / len(gs) if gs else None,
        )
    return dict(out)


def _interpolate(points: dict[Shape, Point], tokens: int, reqs: int) -> tuple[float, float | None]:
    """The inverse-distance mean of the two nearest points, or ValueError outside the
    measured ranges (or with fewer than two points)."""
    if len(points) < 2:
        raise ValueError("one measured shape")
    ts = [t for t, _ in points]
    rs = [r for _, r in points]
    if not (min(ts) <= tokens <= max(ts) and min(rs) <= reqs <= max(rs)):
        raise ValueError("outside the measured shapes")
    span_t = (max(ts) - min(ts)) or 1
    span_r = (max(rs) - min(rs)) or 1
    near = sorted(
        (math.hypot((t - tokens) / span_t, (r - reqs) / span_r), (t, r), p)
        for (t, r), p in points.items()
    )[:2]
    weights = [1.0 / d for d, _, _ in near]  # d > 0: the shape itself is not a point
    total = sum(weights)
    host = sum(w * p.host_ns for w, (_, _, p) in zip(weights, near, strict=True)) / total
    launch: float | None = None
    if all(p.launch_ns is not None for _, _, p in near):
        launch = (
            sum(w * (p.launch_ns or 0.0) for w, (_, _, p) in zip(weights, near, strict=True))
            / total
        )
    return host, launch


class Costs:
    """The per-(mode, shape) costs measured in one recording's steady steps."""

    def __init__(
        self,
        points: dict[Curve, dict[Shape, Point]],
        source: str,
        between_ns: float | None = None,
    ) -> None:
        self.points = points
        self.source = source
        #: the host's own time between two steps (:func:`between_steps`; None: no step
        #: showed it)
        self.between_ns = between_ns

    @classmethod
    def of(
        cls,
        steps: Sequence[Step],
        source: str,
        keys: set[tuple[int, int]] | None = None,
        line: Mapping[tuple[int, int], Beat] | None = None,
    ) -> Costs:
        """From a recording's steps (every step: the steady ones, :func:`steady_keys`,
        are picked here unless ``keys`` gives them; their periods, :func:`timeline`,
        unless ``line`` gives them)."""
        keys = steady_keys(steps) if keys is None else keys
        line = timeline(steps) if line is None else line
        rows = [s for s in steps if (s.pid, s.step) in keys and s.num_tokens > 0]
        return cls(_points(rows, line), source, between_steps(rows, line))

    @property
    def shapes(self) -> int:
        return sum(len(p) for p in self.points.values())

    def price(self, mode: str, uniform: bool, tokens: int, reqs: int) -> Cost | None:
        """The cost of one step of this shape (None: no cost here, see the module doc)."""
        curve = self.points.get((mode, uniform))
        if not curve:
            return None
        got = curve.get((tokens, reqs))
        if got is not None:
            return Cost(got.host_ns, got.launch_ns, "measured", self.source, got.bound, got.gpu_ns)
        try:
            host, launch = _interpolate(curve, tokens, reqs)
        except ValueError:
            return None
        return Cost(host, launch, "interpolated", self.source)


def _shape_text(curve: Curve, shape: Shape) -> str:
    kind = "uniform decode" if curve[1] else "mixed/prefill"
    return f"{curve[0]} {kind} {shape[0]} tokens × {shape[1]} requests"


def _price(costs: Sequence[Costs], s: Step) -> Cost | None:
    curve = curve_of(s)
    for c in costs:
        got = c.price(curve[0], curve[1], s.num_tokens, s.num_reqs)
        if got is not None:
            return got
    return None


def _no_cost_rows(missing: Counter[tuple[Curve, Shape]]) -> list[dict[str, Any]]:
    return [
        {
            "mode": curve[0],
            "uniform": curve[1],
            "tokens": shape[0],
            "reqs": shape[1],
            "steps": k,
            "shape": _shape_text(curve, shape),
        }
        for (curve, shape), k in missing.most_common()
    ]


def predict(
    steps: Iterable[Step],
    keys: set[tuple[int, int]],
    costs: Sequence[Costs],
    recorded: Sequence[Step] = (),
    line: Mapping[tuple[int, int], Beat] | None = None,
) -> dict[str, Any]:
    """The predicted steady figures of ``steps`` (one replayed column): each steady step
    (``keys``) priced by the first of ``costs`` that can. ``host_ns_per_step`` and
    ``cpu_launch_overhead_ns`` are None where any steady step has no cost; ``no_cost``
    lists those shapes, most steps first.

    With the ``recorded`` steps (the same steps as recorded) and their :func:`timeline`,
    also the steady throughput (:func:`periods`)."""
    host: list[float] = []
    launch: list[float] = []
    how: Counter[str] = Counter()
    missing: Counter[tuple[Curve, Shape]] = Counter()
    n = 0
    for s in steps:
        if (s.pid, s.step) not in keys:
            continue
        n += 1
        got = _price(costs, s)
        if got is None:
            missing[(curve_of(s), (s.num_tokens, s.num_reqs))] += 1
            continue
        how[f"{got.how} in {got.source}"] += 1
        host.append(got.host_ns)
        if got.launch_ns is not None:
            launch.append(got.launch_ns)
    whole = not missing and bool(host)
    out = {
        "steady_steps": n,
        "host_ns_per_step": sum(host) / len(host) if whole else None,
        "cpu_launch_overhead_ns": sum(launch) / len(launch) if whole and launch else None,
        "priced": dict(how.most_common()),
        "no_cost": _no_cost_rows(missing),
    }
    if line is not None:
        out.update(periods(steps, keys, costs, recorded, line))
    return out


def periods(
    steps: Iterable[Step],
    keys: set[tuple[int, int]],
    costs: Sequence[Costs],
    recorded: Sequence[Step],
    line: Mapping[tuple[int, int], Beat],
) -> dict[str, Any]:
    """The steady throughput of ``steps`` (a replayed column of ``recorded``), each step's
    period priced from what bounds it (docs/whatif.md, *what it is worth in throughput*).

    A step's period is the slower of two sides that run side by side: the host side (its
    host time plus the host's own time between steps, :attr:`Costs.between_ns`) and the
    GPU side (the device period of its (mode, shape) where the GPU bounded it,
    :attr:`Point.gpu_ns`). A step whose mode is as recorded keeps its recorded period
    (:class:`Beat`); a changed one moves by the change of the slower side. Where the
    recorded or the new (mode, shape) has no device timing the period moves with the host
    time alone, and the step is counted in ``no_gpu_timing``. Returns
    ``period_ns_per_step``, ``tokens_per_s`` (steady scheduled tokens over the summed
    periods; None where a step has no host cost), the steps per bounding side
    (``bound``: host, gpu, and ``none`` without device timing) and the changed shapes
    priced without device timing (``no_gpu_timing``)."""
    was = {(r.pid, r.step): r for r in recorded}
    between = (costs[0].between_ns if costs else None) or 0.0
    total = 0.0
    tokens = 0
    whole = True
    bound: Counter[str] = Counter()
    untimed: Counter[tuple[Curve, Shape]] = Counter()
    for s in steps:
        k = (s.pid, s.step)
        if k not in keys:
            continue
        r, beat = was.get(k, s), line.get(k)
        if beat is None:
            whole = False
            continue
        tokens += s.num_tokens
        old, new = _price(costs, r), _price(costs, s)
        if curve_of(s) == curve_of(r):
            total += beat.period_ns
            bound[(old.bound if old is not None else None) or "none"] += 1
            continue
        if old is None or new is None:
            whole = False
            continue
        h0, h1 = old.host_ns + between, new.host_ns + between
        if old.bound is None or new.bound is None:
            delta, side = h1 - h0, "none"
            untimed[(curve_of(s), (s.num_tokens, s.num_reqs))] += 1
        else:
            before = old.gpu_ns if old.bound == GPU and old.gpu_ns is not None else h0
            g1 = new.gpu_ns if new.bound == GPU else None
            after = h1 if g1 is None else max(h1, g1)
            delta, side = after - before, GPU if g1 is not None and g1 > h1 else HOST
        total += max(beat.period_ns + delta, new.host_ns)
        bound[side] += 1
    steps_n = sum(bound.values())
    ok = whole and total > 0
    return {
        "period_ns_per_step": total / steps_n if ok and steps_n else None,
        "tokens_per_s": tokens / (total / 1e9) if ok else None,
        "between_steps_ns": costs[0].between_ns if costs else None,
        "bound": {side: bound.get(side, 0) for side in (HOST, GPU, "none")},
        "no_gpu_timing": _no_cost_rows(untimed),
    }


def measured(
    steps: Iterable[Step],
    keys: set[tuple[int, int]],
    line: Mapping[tuple[int, int], Beat] | None = None,
    own: Costs | None = None,
) -> dict[str, Any]:
    """The recorded steady figures of ``steps``, the same means :func:`predict` gives
    (with ``line`` and the recording's ``own`` costs, its steady throughput too)."""
    rows = [s for s in steps if (s.pid, s.step) in keys]
    launch = [s.cpu_launch_overhead_ns for s in rows if s.cpu_launch_overhead_ns is not None]
    out = {
        "steady_steps": len(rows),
        "host_ns_per_step": sum(s.host_ns for s in rows) / len(rows) if rows else None,
        "cpu_launch_overhead_ns": sum(launch) / len(launch) if launch else None,
    }
    if line is not None:
        out.update(periods(rows, keys, [own] if own is not None else [], rows, line))
    return out


def leave_one_shape_out(costs: Costs, min_steps: int = 1) -> list[dict[str, Any]]:
    """The interpolation's error: each measured shape (of at least ``min_steps`` steps)
    left out of its curve and priced from the others, against its own mean. One row per
    curve with at least three shapes: how many shapes could be interpolated, the median,
    90th percentile and largest absolute relative error of the host time, and the error
    weighted by each shape's step count."""
    out = []
    for curve, points in sorted(costs.points.items()):
        if len(points) < 3:
            continue
        errs: list[tuple[float, int]] = []
        for shape, p in points.items():
            if p.steps < min_steps:
                continue
            rest = {k: v for k, v in points.items() if k != shape}
            try:
                host, _ = _interpolate(rest, *shape)
            except ValueError:
                continue
            errs.append((abs(host - p.host_ns) / p.host_ns, p.steps))
        if not errs:
            continue
        rel = sorted(e for e, _ in errs)
        out.append(
            {
                "mode": curve[0],
                "uniform": curve[1],
                "shapes": len(points),
                "interpolated": len(rel),
                "median": analysis.percentile(rel, 50),
                "p90": analysis.percentile(rel, 90),
                "max": rel[-1],
                "weighted": sum(e * n for e, n in errs) / sum(n for _, n in errs),
            }
        )
    return out
