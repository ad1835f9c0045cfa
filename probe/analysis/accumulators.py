"""The accumulators of :mod:`probe.analysis.summary`: per group, exact sums (:data:`SCALARS`) and
per timing (:data:`QUANTITIES`) a count, sum, min, max and a log-bucketed histogram
(32 buckets per doubling) from which percentiles are read within
:data:`PERCENTILE_ERROR`. They add, so summaries merge exactly."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from probe.step import PHASES

PENDING = 5  # a class: before a rank's first replay, the replay not seen yet: resolved later
BINS_PER_OCTAVE = 32
_OCTAVES = 44  # 1 ns .. 4.9 hours
NB = 1 + _OCTAVES * BINS_PER_OCTAVE
#: a percentile read from the histograms is within this relative error of the value at
#: that rank (half a bucket of width 2^(1/32)), and within [min, max] of its group
PERCENTILE_ERROR = 2 ** (1 / (2 * BINS_PER_OCTAVE)) - 1

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
Q = {q: i for i, q in enumerate(QUANTITIES)}
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
S = {s: i for i, s in enumerate(SCALARS)}
NS = len(SCALARS)
NQ = len(QUANTITIES)

Key = tuple[int, int, int, int, int, int]  # pid, mode, reason, decode, query len, class


def bins_of(v: np.ndarray) -> np.ndarray:
    out = np.zeros(len(v), dtype=np.int64)
    pos = v > 0
    if pos.any():
        b = 1 + np.floor(np.log2(v[pos].astype(np.float64)) * BINS_PER_OCTAVE).astype(np.int64)
        out[pos] = np.minimum(b, NB - 1)
    return out


def _bin_value(b: int) -> float:
    return 0.0 if b == 0 else 2 ** ((b - 0.5) / BINS_PER_OCTAVE)


#: a histogram of more non-empty buckets than this is held dense (every bucket), one of
#: fewer as its non-empty buckets only: a group of a few steps (a fleet of short-lived
#: processes holds many) costs a few hundred bytes, not every bucket of every timing
DENSE_AT = NQ * NB // 16


class Acc:
    """One group's exact sums (:data:`SCALARS`), and per timing (:data:`QUANTITIES`) its
    count, sum, min and max and histogram (:meth:`buckets`; held sparse while it has few
    non-empty buckets, see :data:`DENSE_AT`)."""

    __slots__ = ("_dense", "_hk", "_hv", "q", "s")

    def __init__(
        self,
        s: np.ndarray | None = None,
        q: np.ndarray | None = None,
        h: np.ndarray | None = None,
    ) -> None:
        self.s = np.zeros(NS, dtype=np.int64) if s is None else s
        self.q = q_zero() if q is None else q
        #: the histogram, dense (NQ, NB); or None and sparse: flat indices, counts
        self._dense: np.ndarray | None = h
        self._hk = _NO_KEYS
        self._hv = _NO_COUNTS

    @classmethod
    def sparse(cls, s: np.ndarray, q: np.ndarray, keys: np.ndarray, counts: np.ndarray) -> Acc:
        """An accumulator whose histogram holds ``counts`` at the flat indices ``keys``
        (``quantity * NB + bucket``, unique and sorted)."""
        a = cls(s, q)
        a._hk, a._hv = keys, counts
        if len(keys) > DENSE_AT:
            a._to_dense()
        return a

    def _to_dense(self) -> np.ndarray:
        if self._dense is None:
            d = np.zeros(NQ * NB, dtype=np.int64)
            d[self._hk] = self._hv
            self._dense = d.reshape(NQ, NB)
            self._hk, self._hv = _NO_KEYS, _NO_COUNTS
        return self._dense

    def buckets(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The non-empty buckets of quantity ``i`` (:data:`QUANTITIES`) in order, and
        their counts."""
        if self._dense is not None:
            b = np.flatnonzero(self._dense[i])
            return b, self._dense[i][b]
        lo, hi = np.searchsorted(self._hk, (i * NB, (i + 1) * NB))
        return self._hk[lo:hi] - i * NB, self._hv[lo:hi]

    def add(self, o: Acc) -> None:
        self.s += o.s
        self.q[:, 0] += o.q[:, 0]
        self.q[:, 1] += o.q[:, 1]
        self.q[:, 2] = np.minimum(self.q[:, 2], o.q[:, 2])
        self.q[:, 3] = np.maximum(self.q[:, 3], o.q[:, 3])
        if self._dense is not None:
            if o._dense is not None:
                self._dense += o._dense
            else:
                self._dense.reshape(-1)[o._hk] += o._hv
        elif o._dense is not None:
            mine, self._hk, self._hv = (self._hk, self._hv), _NO_KEYS, _NO_COUNTS
            self._dense = o._dense.copy()
            self._dense.reshape(-1)[mine[0]] += mine[1]
        elif len(o._hk):
            if not len(self._hk):
                self._hk, self._hv = o._hk, o._hv  # shared until either changes: copied then
                return
            k, inv = np.unique(np.concatenate([self._hk, o._hk]), return_inverse=True)
            v = np.bincount(inv, weights=np.concatenate([self._hv, o._hv]), minlength=len(k))
            self._hk, self._hv = k, np.rint(v).astype(np.int64)
            if len(k) > DENSE_AT:
                self._to_dense()

    def copy(self) -> Acc:
        a = Acc(self.s.copy(), self.q.copy(), None if self._dense is None else self._dense.copy())
        a._hk, a._hv = self._hk, self._hv  # never changed in place: a sparse add makes new ones
        return a


_NO_KEYS = np.zeros(0, dtype=np.int64)
_NO_COUNTS = np.zeros(0, dtype=np.int64)


def q_zero() -> np.ndarray:
    q = np.zeros((NQ, 4), dtype=np.int64)
    q[:, 2] = np.iinfo(np.int64).max
    q[:, 3] = np.iinfo(np.int64).min
    return q


def total_of(accs: Iterable[Acc]) -> Acc:
    """The sum of ``accs``, added in one pass (each histogram's buckets once)."""
    accs = list(accs)
    out = Acc()
    if not accs:
        return out
    if len(accs) == 1:
        out.add(accs[0])
        return out
    q = np.stack([a.q for a in accs])
    out.s = np.stack([a.s for a in accs]).sum(axis=0)
    out.q[:, 0] = q[:, :, 0].sum(axis=0)
    out.q[:, 1] = q[:, :, 1].sum(axis=0)
    out.q[:, 2] = np.minimum(out.q[:, 2], q[:, :, 2].min(axis=0))
    out.q[:, 3] = np.maximum(out.q[:, 3], q[:, :, 3].max(axis=0))
    dense = [a._dense for a in accs if a._dense is not None]
    keys = [a._hk for a in accs if a._dense is None and len(a._hk)]
    vals = [a._hv for a in accs if a._dense is None and len(a._hk)]
    k = np.concatenate(keys) if keys else _NO_KEYS
    v = np.concatenate(vals) if vals else _NO_COUNTS
    if dense or len(k) > DENSE_AT:
        flat = np.rint(np.bincount(k, weights=v, minlength=NQ * NB)).astype(np.int64)
        for d in dense:
            flat += d.reshape(-1)
        out._dense = flat.reshape(NQ, NB)
    elif len(k):
        uk, inv = np.unique(k, return_inverse=True)
        out._hk = uk
        out._hv = np.rint(np.bincount(inv.reshape(-1), weights=v, minlength=len(uk))).astype(
            np.int64
        )
    return out


def percentile_of(a: Acc, quantity: str, q: float) -> float | None:
    """The ``q``-th percentile (0..100) of one timing from a group's histogram, as the
    linear-interpolated percentile of the values: the values of ranks ``floor(r)`` and
    ``floor(r) + 1`` (``r = q/100 * (n - 1)``) read as the middles of their buckets, kept
    within the group's min and max, interpolated; None without values. Exact for one
    value; within :data:`PERCENTILE_ERROR` of the exact figure otherwise."""
    i = Q[quantity]
    n = int(a.q[i, 0])
    if n == 0:
        return None
    r = q / 100.0 * (n - 1)
    k = math.floor(r + 1e-9)
    bins, counts = a.buckets(i)
    cum = np.cumsum(counts)
    lo_v, hi_v = float(a.q[i, 2]), float(a.q[i, 3])

    def at(rank: int) -> float:
        if rank <= 0:
            return lo_v
        if rank >= n - 1:
            return hi_v
        b = int(bins[int(np.searchsorted(cum, rank + 1))])
        return min(max(_bin_value(b), lo_v), hi_v)

    v = at(k)
    frac = r - k
    if frac > 1e-9 and k + 1 < n:
        v += (at(k + 1) - v) * frac
    return float(v)


def pcts(a: Acc, quantity: str) -> dict[str, float | None]:
    i = Q[quantity]
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
