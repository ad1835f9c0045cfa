"""The accumulators of :mod:`probe.analysis.summary`: per group, exact sums (:data:`SCALARS`) and
per timing (:data:`QUANTITIES`) a count, sum, min, max and a log-bucketed histogram
(32 buckets per doubling) from which percentiles are read within
:data:`PERCENTILE_ERROR`. They add, so summaries merge exactly."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from probe.step import PHASES

_PENDING = 5  # a class: before a rank's first replay, the replay not seen yet: resolved later
_BINS_PER_OCTAVE = 32
_OCTAVES = 44  # 1 ns .. 4.9 hours
NB = 1 + _OCTAVES * _BINS_PER_OCTAVE
#: a percentile read from the histograms is within this relative error of the value at
#: that rank (half a bucket of width 2^(1/32)), and within [min, max] of its group
PERCENTILE_ERROR = 2 ** (1 / (2 * _BINS_PER_OCTAVE)) - 1

PHASE_NS = tuple(f"{p}_ns" for p in PHASES)
#: the timings with a histogram, per group
QUANTITIES: tuple[str, ...] = (
    "cpu_launch_overhead_ns",
    "host_ns",
    *PHASE_NS,
    "gpu_busy_ns",
    "gpu_idle_before_ns",
    "gpu_step_ns",
)
_Q = {q: i for i, q in enumerate(QUANTITIES)}
#: the exact sums, per group
SCALARS: tuple[str, ...] = (
    "steps",
    "tokens",
    "graph_tokens",
    "graph_padded_tokens",
    "replayed",
    "serving_ns",
    "timed",
    "idle_ns",
    "device_ns",
    "host_bound",
    "engine_idle_ns",
    "engine_idle_gaps",
    "costed",
    "span_calls",
    "hook_calls",
    *(f"bound_{p}" for p in PHASE_NS),
)
_S = {s: i for i, s in enumerate(SCALARS)}
NS = len(SCALARS)
NQ = len(QUANTITIES)

Key = tuple[int, int, int, int, int, int]  # pid, mode, reason, decode, query len, class


def _bins(v: np.ndarray) -> np.ndarray:
    out = np.zeros(len(v), dtype=np.int64)
    pos = v > 0
    if pos.any():
        b = 1 + np.floor(np.log2(v[pos].astype(np.float64)) * _BINS_PER_OCTAVE).astype(np.int64)
        out[pos] = np.minimum(b, NB - 1)
    return out


def _bin_value(b: int) -> float:
    return 0.0 if b == 0 else 2 ** ((b - 0.5) / _BINS_PER_OCTAVE)


@dataclass
class Acc:
    """One group's exact sums (:data:`SCALARS`), and per timing (:data:`QUANTITIES`) its
    count, sum, min and max and histogram."""

    s: np.ndarray = field(default_factory=lambda: np.zeros(NS, dtype=np.int64))
    q: np.ndarray = field(default_factory=lambda: _q_zero())
    h: np.ndarray = field(default_factory=lambda: np.zeros((NQ, NB), dtype=np.int64))

    def add(self, o: Acc) -> None:
        self.s += o.s
        self.q[:, 0] += o.q[:, 0]
        self.q[:, 1] += o.q[:, 1]
        self.q[:, 2] = np.minimum(self.q[:, 2], o.q[:, 2])
        self.q[:, 3] = np.maximum(self.q[:, 3], o.q[:, 3])
        self.h += o.h

    def copy(self) -> Acc:
        return Acc(self.s.copy(), self.q.copy(), self.h.copy())


def _q_zero() -> np.ndarray:
    q = np.zeros((NQ, 4), dtype=np.int64)
    q[:, 2] = np.iinfo(np.int64).max
    q[:, 3] = np.iinfo(np.int64).min
    return q


def _total(accs: Iterable[Acc]) -> Acc:
    out = Acc()
    for a in accs:
        out.add(a)
    return out


def percentile_of(a: Acc, quantity: str, q: float) -> float | None:
    """The ``q``-th percentile (0..100) of one timing from a group's histogram, as the
    linear-interpolated percentile of the values: the values of ranks ``floor(r)`` and
    ``floor(r) + 1`` (``r = q/100 * (n - 1)``) read as the middles of their buckets, kept
    within the group's min and max, interpolated; None without values. Exact for one
    value; within :data:`PERCENTILE_ERROR` of the exact figure otherwise."""
    i = _Q[quantity]
    n = int(a.q[i, 0])
    if n == 0:
        return None
    r = q / 100.0 * (n - 1)
    k = math.floor(r + 1e-9)
    cum = np.cumsum(a.h[i])
    lo_v, hi_v = float(a.q[i, 2]), float(a.q[i, 3])

    def at(rank: int) -> float:
        if rank <= 0:
            return lo_v
        if rank >= n - 1:
            return hi_v
        b = int(np.searchsorted(cum, rank + 1))
        return min(max(_bin_value(b), lo_v), hi_v)

    v = at(k)
    frac = r - k
    if frac > 1e-9 and k + 1 < n:
        v += (at(k + 1) - v) * frac
    return float(v)


def _pcts(a: Acc, quantity: str) -> dict[str, float | None]:
    i = _Q[quantity]
    n = int(a.q[i, 0])
    return {
        "n": n,
        "mean": float(a.q[i, 1]) / n if n else None,
        "p50": percentile_of(a, quantity, 50),
        "p90": percentile_of(a, quantity, 90),
        "p99": percentile_of(a, quantity, 99),
    }


def gsum_sel(v: np.ndarray, inv: np.ndarray, g: int) -> np.ndarray:
    """Exact int64 sums of ``v`` per group ``inv``."""
    if len(v) and int(np.abs(v).max()) * len(v) < 2**53:
        return np.rint(np.bincount(inv, weights=v.astype(np.float64), minlength=g)).astype(np.int64)
    out = np.zeros(g, dtype=np.int64)
    np.add.at(out, inv, v)
    return out
