"""Host-time cost model: what a steady step costs on the host, per graph mode and batch shape.

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
time per step, CPU launch overhead, and the shapes it had no cost for. Plain functions
over :class:`~probe.step.Step`; nothing here imports vLLM.

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from probe.analysis import views as analysis
from probe.step import Step

__all__ = [
    "Cost",
    "Costs",
    "Point",
    "curve_of",
    "leave_one_shape_out",
    "measured",
    "predict",
    "steady_keys",
]

#: a curve: (graph mode name, uniform decode)
Curve = tuple[str, bool]
#: a shape inside a curve: (scheduled tokens, requests)
Shape = tuple[int, int]


def steady_keys(steps: Iterable[Step]) -> set[tuple[int, int]]:
    """``(pid, step)`` of the steady-state forward steps: the one place this module asks
    for the project's steady-state rule."""
    steady, _ = analysis.split_steady(steps)
    return {(s.pid, s.step) for s in steady}


def curve_of(s: Step) -> Curve:
    """The curve a step belongs to: its graph mode (NONE when eager or unknown) and
    whether it was a uniform decode batch."""
    return (s.mode.name if s.mode is not None else "NONE", bool(s.uniform))


@dataclass(frozen=True)
class Point:
    """One measured shape: its steady step count and mean costs (ns)."""

    steps: int
    host_ns: float
    launch_ns: float | None


@dataclass(frozen=True)
class Cost:
    """A shape's price: ``how`` is ``measured`` or ``interpolated``; ``source`` names the
    recording the costs came from."""

    host_ns: float
    launch_ns: float | None
    how: str
    source: str


def _points(steps: Iterable[Step]) -> dict[Curve, dict[Shape, Point]]:
    host: dict[tuple[Curve, Shape], list[int]] = defaultdict(list)
    launch: dict[tuple[Curve, Shape], list[int]] = defaultdict(list)
    for s in steps:
        key = (curve_of(s), (s.num_tokens, s.num_reqs))
        host[key].append(s.host_ns)
        if s.cpu_launch_overhead_ns is not None:
            launch[key].append(s.cpu_launch_overhead_ns)
    out: dict[Curve, dict[Shape, Point]] = defaultdict(dict)
    for (curve, shape), hs in host.items():
        ls = launch.get((curve, shape), [])
        out[curve][shape] = Point(len(hs), sum(hs) / len(hs), sum(ls) / len(ls) if ls else None)
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

    def __init__(self, points: dict[Curve, dict[Shape, Point]], source: str) -> None:
        self.points = points
        self.source = source

    @classmethod
    def of(
        cls, steps: Sequence[Step], source: str, keys: set[tuple[int, int]] | None = None
    ) -> Costs:
        """From a recording's steps (every step: the steady ones, :func:`steady_keys`,
        are picked here unless ``keys`` gives them)."""
        keys = steady_keys(steps) if keys is None else keys
        return cls(
            _points(s for s in steps if (s.pid, s.step) in keys and s.num_tokens > 0), source
        )

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
            return Cost(got.host_ns, got.launch_ns, "measured", self.source)
        try:
            host, launch = _interpolate(curve, tokens, reqs)
        except ValueError:
            return None
        return Cost(host, launch, "interpolated", self.source)


def _shape_text(curve: Curve, shape: Shape) -> str:
    kind = "uniform decode" if curve[1] else "mixed/prefill"
    return f"{curve[0]} {kind} {shape[0]} tokens × {shape[1]} requests"


def predict(
    steps: Iterable[Step], keys: set[tuple[int, int]], costs: Sequence[Costs]
) -> dict[str, Any]:
    """The predicted steady figures of ``steps`` (one replayed column): each steady step
    (``keys``) priced by the first of ``costs`` that can. ``host_ns_per_step`` and
    ``cpu_launch_overhead_ns`` are None where any steady step has no cost; ``no_cost``
    lists those shapes, most steps first."""
    host: list[float] = []
    launch: list[float] = []
    how: Counter[str] = Counter()
    missing: Counter[tuple[Curve, Shape]] = Counter()
    n = 0
    for s in steps:
        if (s.pid, s.step) not in keys:
            continue
        n += 1
        curve = curve_of(s)
        got = None
        for c in costs:
            got = c.price(curve[0], curve[1], s.num_tokens, s.num_reqs)
            if got is not None:
                break
        if got is None:
            missing[(curve, (s.num_tokens, s.num_reqs))] += 1
            continue
        how[f"{got.how} in {got.source}"] += 1
        host.append(got.host_ns)
        if got.launch_ns is not None:
            launch.append(got.launch_ns)
    whole = not missing and bool(host)
    return {
        "steady_steps": n,
        "host_ns_per_step": sum(host) / len(host) if whole else None,
        "cpu_launch_overhead_ns": sum(launch) / len(launch) if whole and launch else None,
        "priced": dict(how.most_common()),
        "no_cost": [
            {
                "mode": curve[0],
                "uniform": curve[1],
                "tokens": shape[0],
                "reqs": shape[1],
                "steps": k,
                "shape": _shape_text(curve, shape),
            }
            for (curve, shape), k in missing.most_common()
        ],
    }


def measured(steps: Iterable[Step], keys: set[tuple[int, int]]) -> dict[str, Any]:
    """The recorded steady figures of ``steps``, the same means :func:`predict` gives."""
    rows = [s for s in steps if (s.pid, s.step) in keys]
    launch = [s.cpu_launch_overhead_ns for s in rows if s.cpu_launch_overhead_ns is not None]
    return {
        "steady_steps": len(rows),
        "host_ns_per_step": sum(s.host_ns for s in rows) / len(rows) if rows else None,
        "cpu_launch_overhead_ns": sum(launch) / len(launch) if launch else None,
    }


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
