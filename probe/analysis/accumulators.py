"""The accumulators of :mod:`probe.analysis.summary`: per group, exact sums (:data:`SCALARS`) and
per timing (:data:`QUANTITIES`) a count, sum, min, max and a log-bucketed histogram
(32 buckets per doubling) from which percentiles are read within
:data:`PERCENTILE_ERROR`. They add, so summaries merge exactly."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

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


class Key(NamedTuple):
    """A group of a summary's steps: the steps of one rank with the same mode, miss reason,
    uniform decode and query length, and class."""

    pid: int
    #: :class:`probe.records.Mode` code
    mode: int
    #: :class:`probe.records.Reason` code, -1 for none
    reason: int
    #: 1 for a uniform decode batch (:attr:`probe.step.Step.decode`), else 0
    decode: int
    #: the step's ``uniform_decode_query_len``, at most 255
    query_len: int
    #: :data:`probe.analysis.rules.CLASSES` code, or :data:`PENDING`
    step_class: int

    def of_class(self, step_class: int) -> Key:
        """This group with another class."""
        return Key(self.pid, self.mode, self.reason, self.decode, self.query_len, step_class)


def group_codes(
    pid: np.ndarray,
    mode: np.ndarray,
    reason: np.ndarray,
    decode: np.ndarray,
    query_len: np.ndarray,
    step_class: np.ndarray,
) -> np.ndarray:
    """Each row's group (:class:`Key`) as one int64, ordered as the keys are (rows grouped
    by sorting these; :func:`keys_of_codes` reads them back): ``mode`` and ``reason`` are
    codes from -1 to 14, ``query_len`` at most 255 and ``step_class`` at most 7."""
    codes: np.ndarray = (
        (pid << 20)
        | ((mode + 1) << 16)
        | ((reason + 1) << 12)
        | (decode.astype(np.int64) << 11)
        | (query_len << 3)
        | step_class
    )
    return codes


def keys_of_codes(codes: np.ndarray) -> list[Key]:
    """The keys of :func:`group_codes`' codes."""
    fields = (
        codes >> 20,
        ((codes >> 16) & 0xF) - 1,
        ((codes >> 12) & 0xF) - 1,
        (codes >> 11) & 1,
        (codes >> 3) & 0xFF,
        codes & 0x7,
    )
    return [Key._make(k) for k in zip(*(f.tolist() for f in fields), strict=True)]


def bins_of(v: np.ndarray) -> np.ndarray:
    """The histogram bucket of each integer value (0 for a value of 0 or less)."""
    out = np.empty(len(v), dtype=np.int64)
    add_bins(v, out)
    return out


def add_bins(v: np.ndarray, out: np.ndarray, offset: np.ndarray | int = 0) -> None:
    """``out = offset + bins_of(v)``, in place: the bucket is ``1 + floor(32 log2 v)``, at
    most the last; values of 0 or less go to bucket 0. Worked in blocks whose temporaries
    stay in the CPU's cache."""
    f = np.empty(min(len(v), _BLOCK), dtype=np.float64)
    for i in range(0, len(v), _BLOCK):
        vb, ob, fb = v[i : i + _BLOCK], out[i : i + _BLOCK], f[: len(v) - i]
        np.copyto(fb, vb, casting="unsafe")
        np.maximum(fb, 1.0, out=fb)  # a value of 0 or less: bucket 0, set below
        np.log2(fb, out=fb)
        fb *= BINS_PER_OCTAVE
        np.minimum(fb, NB - 2, out=fb)
        np.copyto(ob, fb, casting="unsafe")  # fb >= 0: truncated is floor
        ob += 1
        if isinstance(offset, np.ndarray):
            ob += offset[i : i + _BLOCK]
        elif offset:
            ob += offset
        low = vb <= 0
        if low.any():
            ob[low] -= 1


_BLOCK = 8192


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


def segment_sums(v: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Exact int64 sums of ``v``'s segments, each from one of ``starts`` (increasing, every
    segment non-empty) to the next or the end."""
    return np.add.reduceat(v, starts, dtype=np.int64)


class Selected:
    """The rows of segments (see :func:`segment_sums`) where ``mask`` holds, to count them
    and sum values over them per segment. Only the rows of the smaller side are listed:
    where most rows hold, a sum is the segment's total less the rest."""

    def __init__(self, mask: np.ndarray, starts: np.ndarray) -> None:
        self.starts = starts
        self.counts = np.add.reduceat(mask, starts, dtype=np.int64)
        self.every = int(self.counts.sum()) == len(mask)
        self.most = 2 * int(self.counts.sum()) > len(mask)
        #: the rows where ``mask`` does not hold (``most``) or does
        self.rows = np.flatnonzero(~mask if self.most else mask)
        self.at = np.searchsorted(self.rows, starts)

    def sums(self, v: np.ndarray) -> np.ndarray:
        """Exact int64 sums of ``v`` over the selected rows, per segment."""
        run = np.zeros(len(self.rows) + 1, dtype=np.int64)
        np.cumsum(v[self.rows], out=run[1:])
        part = np.diff(run[self.at], append=run[-1])
        if self.most:
            return segment_sums(v, self.starts) - part
        return part


def segment_stats(v: np.ndarray, ok: Selected) -> np.ndarray:
    """Per segment of ``v`` the count, sum, min and max of its values where ``ok``: an
    accumulator's ``q`` row of one timing (:func:`q_zero`'s for a segment without any)."""
    starts = ok.starts
    out = np.empty((len(starts), 4), dtype=np.int64)
    out[:, 0] = ok.counts
    out[:, 1] = ok.sums(v)
    if ok.every:
        out[:, 2] = np.minimum.reduceat(v, starts)
        out[:, 3] = np.maximum.reduceat(v, starts)
        return out
    lo, hi = v.copy(), v.copy()
    if ok.most:
        lo[ok.rows] = np.iinfo(np.int64).max
        hi[ok.rows] = np.iinfo(np.int64).min
    else:
        keep = np.zeros(len(v), dtype=bool)
        keep[ok.rows] = True
        lo[~keep] = np.iinfo(np.int64).max
        hi[~keep] = np.iinfo(np.int64).min
    out[:, 2] = np.minimum.reduceat(lo, starts)
    out[:, 3] = np.maximum.reduceat(hi, starts)
    return out


def key_counts(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``keys`` below ``size`` in order, and how often each occurs
    (values of ``size`` or more: left out): counted in place where ``size`` is small beside
    the keys, sorted otherwise."""
    if size <= max(1 << 20, 2 * len(keys)):
        counts = np.bincount(keys, minlength=size + 1)[:size]
        distinct = np.flatnonzero(counts)
        return distinct, counts[distinct]
    distinct, counts = np.unique(keys, return_counts=True)
    n = int(np.searchsorted(distinct, size))
    return distinct[:n], counts[:n]
