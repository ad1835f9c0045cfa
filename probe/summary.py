"""The one summary of a set of steps (a rank, a process, a recording, several recordings,
a live window): every figure the report, ``probe ab``, the live view, the metric set and
the dashboards show is computed here, by the rules of :mod:`probe.rules`.

A :class:`Summary` is built in one streaming pass over numpy columns (a recording's
``steps`` table read in chunks: :func:`probe.recording.iter_step_columns`, or a batch of
:class:`~probe.step.Step` objects: :func:`columns_of_steps`), and holds one accumulator per
group (rank, mode, miss reason, uniform decode and query length, steady or warm-up class):
exact counts and sums, and a log-bucketed histogram per timing from which percentiles are
read (:data:`PERCENTILE_ERROR`). Memory grows with the number of groups, not of steps.
Summaries merge (:meth:`Summary.merge`): those of several files of the same ranks, in time
order, give the summary of them all; what depends on the order (a rank's first replay, the
first use of a shape) is resolved when the figures are read (:meth:`Summary.figures`).

    >>> from probe.recording import Recording, default_recording
    >>> s = summarize_recording(Recording.open(default_recording()))
    >>> f = s.figures()
    >>> f["hit_rates"]["decode_full_hit_rate"], f["warmup"]["steps"]
    (0.0, 2)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from probe import rules
from probe.records import BuildTag, Mode, Reason
from probe.rules import CLASSES, STEADY
from probe.step import PHASES, Step

__all__ = [
    "PERCENTILE_ERROR",
    "QUANTITIES",
    "Summary",
    "columns_of_steps",
    "percentile_of",
    "steady_mask",
    "summarize_recording",
    "summarize_recordings",
    "summarize_steps",
]

_PENDING = 5  # before a rank's first replay, the replay not seen yet: resolved later
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


# -- columns ---------------------------------------------------------------------------------

_RUNNERS = ("v1", "mrv2")


def columns_of_steps(
    steps: Sequence[Step], calibrations: Mapping[int, Mapping[str, Any] | None] | None = None
) -> dict[str, np.ndarray]:
    """Steps as the columns :func:`probe.recording.iter_step_columns` gives (codes, NULL
    -1), with each step's hooked calls (``_span_calls``, ``_hook_calls``; -1 for a rank
    without a calibration) counted by :func:`probe.cost.calls_with`."""
    from probe.cost import calls_with

    n = len(steps)

    def arr(vals: Iterable[int]) -> np.ndarray:
        return np.fromiter(vals, dtype=np.int64, count=n)

    def opt(v: int | None) -> int:
        return -1 if v is None else v

    cols = {
        "pid": arr(s.pid for s in steps),
        "step": arr(s.step for s in steps),
        "t0_ns": arr(s.t0 for s in steps),
        "t1_ns": arr(s.t1 for s in steps),
        "host_ns": arr(s.host_ns for s in steps),
        "num_tokens": arr(s.num_tokens for s in steps),
        "num_reqs": arr(s.num_reqs for s in steps),
        "max_query_len": arr(s.max_query_len for s in steps),
        "mode": arr(opt(s.mode) for s in steps),
        "reason": arr(opt(s.reason) for s in steps),
        "padded_tokens": arr(s.padded_tokens for s in steps),
        "uniform_decode_query_len": arr(s.uniform_decode_query_len for s in steps),
        "uniform": arr(int(s.uniform) for s in steps),
        "replayed": arr(int(s.replayed) for s in steps),
        "captures": arr(s.captures for s in steps),
        "cpu_launch_overhead_ns": arr(opt(s.cpu_launch_overhead_ns) for s in steps),
        "gpu_busy_ns": arr(opt(s.gpu_busy_ns) for s in steps),
        "gpu_idle_before_ns": arr(opt(s.gpu_idle_before_ns) for s in steps),
        "gpu_step_ns": arr(opt(s.gpu_step_ns) for s in steps),
        "runner": arr(_RUNNERS.index(s.runner) if s.runner in _RUNNERS else 0 for s in steps),
    }
    for p, col in zip(PHASES, PHASE_NS, strict=True):
        cols[col] = arr(s.phases.get(p, 0) or 0 for s in steps)
    cals = calibrations or {}
    spans = np.full(n, -1, dtype=np.int64)
    hooks = np.full(n, -1, dtype=np.int64)
    for i, s in enumerate(steps):
        cal = cals.get(s.pid)
        if cal is not None and s.mode is not None:
            spans[i], hooks[i] = calls_with(s, cal)
    cols["_span_calls"] = spans
    cols["_hook_calls"] = hooks
    return cols


# -- the summary -----------------------------------------------------------------------------


@dataclass
class _Rank:
    prev_t1: int | None = None
    idle_ns: int = 0  # engine idle: the gaps before its steps (forward or not)
    idle_gaps: int = 0
    replayed: bool = False
    first_step: int | None = None
    seen: set[int] = field(default_factory=set)

    def copy(self) -> _Rank:
        return _Rank(
            self.prev_t1, self.idle_ns, self.idle_gaps, self.replayed, self.first_step,
            set(self.seen),
        )  # fmt: skip


@dataclass
class _Candidate:
    """The first use of a shape on a rank, decided when the figures are read."""

    key: Key  # its group, class aside
    base: int  # STEADY or _PENDING
    step: int
    host_ns: int
    acc: Acc


@dataclass
class Summary:
    """The mergeable summary of a set of steps (see the module's docstring)."""

    groups: dict[Key, Acc] = field(default_factory=dict)
    ranks: dict[int, _Rank] = field(default_factory=dict)
    candidates: dict[tuple[int, int], _Candidate] = field(default_factory=dict)
    calibrations: dict[int, dict[str, Any]] = field(default_factory=dict)
    nonforward: int = 0
    #: the first warm-up steps (pid, step, class, mode, tokens, padded, launch, host)
    listed: list[tuple[int, ...]] = field(default_factory=list)
    reorders: Counter[str] = field(default_factory=Counter)
    thresholds: Counter[int] = field(default_factory=Counter)
    builds: dict[tuple[str, str, bool], np.ndarray] = field(default_factory=dict)
    sources: int = 0
    #: a few example steps per (mode, reason)
    examples: dict[tuple[int, int], list[dict[str, Any]]] = field(default_factory=dict)
    #: the last chunk's rows: raw class, engine idle, first use, shape, period, gap
    last: tuple[Any, ...] = field(default=(), repr=False)

    # -- building ------------------------------------------------------------------------

    def add_columns(
        self, cols: Mapping[str, np.ndarray], forced: np.ndarray | None = None
    ) -> np.ndarray:
        """Add a chunk of steps in (pid, step) order, continuing each rank where the last
        chunk left it; returns each row's class (:data:`probe.rules.CLASSES` code; -1 for
        a step that ran no forward; first uses not yet decided read steady)."""
        n = len(cols["pid"])
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        pid = cols["pid"]
        mode = cols["mode"]
        fw = mode >= 0
        self.nonforward += int(n - fw.sum())
        t0, t1 = cols["t0_ns"], cols["t1_ns"]
        # the gap before each step on its rank, and whether it was engine idle
        new_rank = np.ones(n, dtype=bool)
        new_rank[1:] = pid[1:] != pid[:-1]
        prev = np.empty(n, dtype=np.int64)
        prev[1:] = t1[:-1]
        has_prev = ~new_rank
        starts = np.flatnonzero(new_rank)
        for i in starts:
            r = self.ranks.setdefault(int(pid[i]), _Rank())
            if r.first_step is None:
                r.first_step = int(cols["step"][i])
            if r.prev_t1 is not None:
                prev[i] = r.prev_t1
                has_prev[i] = True
        gap = np.where(has_prev, t0 - prev, 0)
        idle = has_prev & (gap >= rules.ENGINE_IDLE_GAP_NS)
        period = np.where(has_prev & ~idle, t1 - prev, t1 - t0)
        for j in np.flatnonzero(idle):
            r = self.ranks[int(pid[j])]
            r.idle_ns += int(gap[j])
            r.idle_gaps += 1
        ends = np.append(starts[1:], n) - 1
        for i in ends:
            self.ranks[int(pid[i])].prev_t1 = int(t1[i])

        graph = fw & (mode != int(Mode.NONE))
        reason = cols["reason"]
        cls = np.full(n, STEADY, dtype=np.int64)
        cls[~fw] = -1
        # captures and warm-up/profile dispatches
        cls[fw & (reason == int(Reason.WARMUP_OR_PROFILE))] = rules.PROFILE
        cls[fw & (cols["captures"] > 0)] = rules.CAPTURE
        # before the rank's first replay
        replay = graph & (cols["replayed"] == 1)
        for a, b in zip(starts, ends + 1, strict=True):
            r = self.ranks[int(pid[a])]
            if r.replayed:
                continue
            hit = np.flatnonzero(replay[a:b])
            upto = b if len(hit) == 0 else a + int(hit[0])
            seg = cls[a:upto]
            seg[seg == STEADY] = rules.BEFORE_REPLAY if len(hit) else _PENDING
            if len(hit):
                r.replayed = True
                self._resolve_pending(int(pid[a]))
        # first use of each shape on its rank
        shape = np.where(graph, mode * (1 << 40) + cols["padded_tokens"], 0)
        cand = np.zeros(n, dtype=bool)
        fw_idx = np.flatnonzero(fw)
        if forced is not None:
            cls = np.where(fw, forced, -1)
            fw_idx = fw_idx[:0]
        if len(fw_idx):
            # (pid, shape) as one key: np.unique keeps each key's first index
            order = np.lexsort((shape[fw_idx], pid[fw_idx]))
            ps, ss = pid[fw_idx][order], shape[fw_idx][order]
            change = np.ones(len(order), dtype=bool)
            change[1:] = (ps[1:] != ps[:-1]) | (ss[1:] != ss[:-1])
            # lexsort is stable: the first of each run is the earliest row
            first = order[change]
            for j in fw_idx[first]:
                r = self.ranks[int(pid[j])]
                sh = int(shape[j])
                if sh in r.seen:
                    continue
                r.seen.add(sh)
                if cls[j] in (STEADY, _PENDING):
                    cand[j] = True
        decode = (cols["uniform"] == 1) & (cols["uniform_decode_query_len"] >= 1)
        uq = np.minimum(cols["uniform_decode_query_len"], 255)
        self._accumulate(cols, fw & ~cand, cls, decode, uq, idle, gap, period, graph)
        for j in np.flatnonzero(cand):
            one = np.zeros(n, dtype=bool)
            one[j] = True
            accs = self._group_accs(cols, one, cls, decode, uq, idle, gap, period, graph)
            ((key, acc),) = accs.items()
            k = (int(pid[j]), int(shape[j]))
            self.candidates[k] = _Candidate(
                (*key[:5], STEADY),  # type: ignore[arg-type]
                int(cls[j]),
                int(cols["step"][j]),
                int(cols["host_ns"][j]),
                acc,
            )
        out = cls.copy()
        out[out == _PENDING] = STEADY
        self._list(cols, cls, cand)
        self._examples(cols, fw)
        self.last = (cls, idle, cand, shape, period, gap)
        return out

    def _list(self, cols: Mapping[str, np.ndarray], cls: np.ndarray, cand: np.ndarray) -> None:
        room = 20 - len(self.listed)
        if room <= 0:
            return
        warm = np.flatnonzero((cls > STEADY) & ~cand)[:room]
        for j in warm:
            self.listed.append(
                (
                    int(cols["pid"][j]),
                    int(cols["step"][j]),
                    int(cls[j]),
                    int(cols["mode"][j]),
                    int(cols["num_tokens"][j]),
                    int(cols["padded_tokens"][j]),
                    int(cols["cpu_launch_overhead_ns"][j]),
                    int(cols["host_ns"][j]),
                )
            )

    def _examples(self, cols: Mapping[str, np.ndarray], fw: np.ndarray) -> None:
        mr = cols["mode"] * 64 + cols["reason"]
        idx = np.flatnonzero(fw)
        if not len(idx):
            return
        _, first = np.unique(mr[idx], return_index=True)
        for j0 in idx[first]:
            key = (int(cols["mode"][j0]), int(cols["reason"][j0]))
            have = self.examples.setdefault(key, [])
            if len(have) >= 3:
                continue
            same = idx[mr[idx] == mr[j0]][: 3 - len(have)]
            for j in same:
                have.append(
                    {
                        "pid": int(cols["pid"][j]),
                        "step": int(cols["step"][j]),
                        "num_tokens": int(cols["num_tokens"][j]),
                        "num_reqs": int(cols["num_reqs"][j]),
                        "max_query_len": int(cols["max_query_len"][j]),
                        "uniform_decode_query_len": int(cols["uniform_decode_query_len"][j]),
                        "uniform": bool(cols["uniform"][j]),
                        "padded_tokens": int(cols["padded_tokens"][j]),
                    }
                )

    def _resolve_pending(self, pid: int) -> None:
        for key in [k for k in self.groups if k[0] == pid and k[5] == _PENDING]:
            acc = self.groups.pop(key)
            self._add_group((*key[:5], rules.BEFORE_REPLAY), acc)  # type: ignore[arg-type]
        self.listed = [
            (*x[:2], rules.BEFORE_REPLAY, *x[3:]) if x[0] == pid and x[2] == _PENDING else x
            for x in self.listed
        ]

    def _add_group(self, key: Key, acc: Acc) -> None:
        cur = self.groups.get(key)
        if cur is None:
            self.groups[key] = acc
        else:
            cur.add(acc)

    def _accumulate(self, *args: Any) -> None:
        for key, acc in self._group_accs(*args).items():
            self._add_group(key, acc)

    def _group_accs(
        self,
        cols: Mapping[str, np.ndarray],
        rows: np.ndarray,
        cls: np.ndarray,
        decode: np.ndarray,
        uq: np.ndarray,
        idle: np.ndarray,
        gap: np.ndarray,
        period: np.ndarray,
        graph: np.ndarray,
    ) -> dict[Key, Acc]:
        idx = np.flatnonzero(rows)
        if len(idx) == 0:
            return {}
        code = (
            (cols["pid"][idx] << 20)
            | ((cols["mode"][idx] + 1) << 16)
            | ((cols["reason"][idx] + 1) << 12)
            | (decode[idx].astype(np.int64) << 11)
            | (uq[idx] << 3)
            | cls[idx]
        )
        uniq_code, inv = np.unique(code, return_inverse=True)
        inv = inv.reshape(-1)
        g = len(uniq_code)
        uniq = np.stack(
            [
                uniq_code >> 20,
                ((uniq_code >> 16) & 0xF) - 1,
                ((uniq_code >> 12) & 0xF) - 1,
                (uniq_code >> 11) & 1,
                (uniq_code >> 3) & 0xFF,
                uniq_code & 0x7,
            ]
        )

        def col(name: str) -> np.ndarray:
            return cols[name][idx]

        def gsum(v: np.ndarray) -> np.ndarray:
            v = v.astype(np.int64)
            if len(v) and int(np.abs(v).max()) * len(v) < 2**53:
                return np.rint(np.bincount(inv, weights=v, minlength=g)).astype(np.int64)
            out = np.zeros(g, dtype=np.int64)
            np.add.at(out, inv, v)
            return out

        gi = graph[idx]
        idle_before = col("gpu_idle_before_ns")
        gstep = col("gpu_step_ns")
        timed = (idle_before >= 0) & (gstep >= 0) & ~idle[idx]
        bound = timed & rules.host_bound(idle_before, gstep)
        spans = col("_span_calls") if "_span_calls" in cols else np.full(len(idx), -1)
        hooks = col("_hook_calls") if "_hook_calls" in cols else np.full(len(idx), -1)
        costed = spans >= 0
        sc = {
            "steps": np.ones(len(idx), dtype=np.int64),
            "tokens": col("num_tokens"),
            "graph_tokens": np.where(gi, col("num_tokens"), 0),
            "graph_padded_tokens": np.where(gi, col("padded_tokens"), 0),
            "replayed": (gi & (col("replayed") == 1)).astype(np.int64),
            "serving_ns": period[idx],
            "timed": timed.astype(np.int64),
            "idle_ns": np.where(timed, idle_before, 0),
            "device_ns": np.where(timed, idle_before + gstep, 0),
            "host_bound": bound.astype(np.int64),
            "engine_idle_ns": np.where(idle[idx], gap[idx], 0),
            "engine_idle_gaps": idle[idx].astype(np.int64),
            "costed": costed.astype(np.int64),
            "span_calls": np.where(costed, spans, 0),
            "hook_calls": np.where(costed, hooks, 0),
        }
        for p in PHASE_NS:
            sc[f"bound_{p}"] = np.where(bound, col(p), 0)
        s = np.stack([gsum(sc[name]) for name in SCALARS], axis=1)
        q = np.tile(_q_zero(), (g, 1, 1))
        h = np.zeros((g, NQ, NB), dtype=np.int64)
        for qi, name in enumerate(QUANTITIES):
            v = col(name)
            if name == "gpu_idle_before_ns" or name == "gpu_step_ns":
                ok = timed
            elif name == "host_ns":
                ok = v > 0
            else:
                ok = v >= 0
            if not ok.any():
                continue
            vi, ii = v[ok], inv[ok]
            q[:, qi, 0] = np.bincount(ii, minlength=g)
            q[:, qi, 1] = gsum_sel(vi, ii, g)
            mn = np.full(g, np.iinfo(np.int64).max, dtype=np.int64)
            mx = np.full(g, np.iinfo(np.int64).min, dtype=np.int64)
            np.minimum.at(mn, ii, vi)
            np.maximum.at(mx, ii, vi)
            q[:, qi, 2], q[:, qi, 3] = mn, mx
            h[:, qi, :] = np.bincount(ii * NB + _bins(vi), minlength=g * NB).reshape(g, NB)
        out: dict[Key, Acc] = {}
        for j in range(g):
            key: Key = tuple(int(x) for x in uniq[:, j])  # type: ignore[assignment]
            out[key] = Acc(s[j], q[j], h[j])
        return out

    def add_steps(self, steps: Sequence[Step]) -> np.ndarray:
        """Add Steps (sorted here into (pid, step) order); returns their classes in that
        order (see :meth:`add_columns`)."""
        rows = sorted(steps, key=lambda s: (s.pid, s.step))
        if not rows:
            return np.zeros(0, dtype=np.int64)
        for s in rows:
            for o in s.reorders:
                self._reorder(o.changed, o.moved, o.threshold, o.spec_as_decode, o.num_decodes)
                self.reorders["reqs"] += o.num_reqs
        cls = self.add_columns(columns_of_steps(rows, self.calibrations))
        return cls

    def _reorder(self, changed: bool, moved: int, threshold: int, spec: bool, dec: int) -> None:
        self.reorders["decisions"] += 1
        self.reorders["changed"] += int(changed)
        self.reorders["moved_requests"] += moved
        self.reorders["spec_as_decode"] += int(spec)
        self.reorders["decodes"] += dec
        self.thresholds[threshold] += 1

    def add_builds(self, names: Mapping[int, Mapping[int, str]], steps: Iterable[Step]) -> None:
        """Metadata builds of Steps into the per-(builder, tag, drafter) histograms."""
        for s in steps:
            for b in s.builds:
                name = names.get(s.pid, {}).get(b.builder_id) or "?"
                key = (name, BuildTag(b.tag).name.lower(), bool(b.flags & 1))
                self._build(key, b.dur_ns, 1)

    def _build(self, key: tuple[str, str, bool], dur: int, n: int, bin_: int | None = None) -> None:
        h = self.builds.get(key)
        if h is None:
            h = self.builds[key] = np.zeros(NB + 2, dtype=np.int64)
        b = int(_bins(np.array([dur]))[0]) if bin_ is None else bin_
        h[b] += n
        h[NB] += n
        h[NB + 1] += dur if bin_ is None else 0

    # -- merging -------------------------------------------------------------------------

    def merge(self, later: Summary) -> Summary:
        """This summary and ``later``'s, as one: ``later`` holds steps after these on the
        ranks they share (rolling files of one agent), or other ranks (other hosts).
        Exact: counts, sums and histograms add; a shape first used here is no first use
        there; a rank that replayed here has no steps before its first replay there."""
        out = Summary()
        out.calibrations = {**self.calibrations, **later.calibrations}
        for k, a in self.groups.items():
            out.groups[k] = a.copy()
        out.candidates = dict(self.candidates)
        out.ranks = {p: r.copy() for p, r in self.ranks.items()}
        for k, a in later.groups.items():
            pid = k[0]
            cls = k[5]
            mine = out.ranks.get(pid)
            if mine is not None and cls == _PENDING:
                cls = STEADY if mine.replayed else _PENDING
            out._add_group((*k[:5], cls), a.copy())  # type: ignore[arg-type]
        for (pid, sh), c in later.candidates.items():
            mine = out.ranks.get(pid)
            if mine is not None and sh in mine.seen:
                base = c.base if not (mine.replayed and c.base == _PENDING) else STEADY
                out._add_group((*c.key[:5], base), c.acc.copy())  # type: ignore[arg-type]
            else:
                out.candidates[(pid, sh)] = c
        for pid, r in later.ranks.items():
            mine = out.ranks.get(pid)
            if mine is None:
                out.ranks[pid] = r.copy()
                continue
            mine.idle_ns += r.idle_ns
            mine.idle_gaps += r.idle_gaps
            if r.replayed and not mine.replayed:
                out._resolve_pending(pid)
            mine.replayed |= r.replayed
            mine.seen |= r.seen
            mine.prev_t1 = r.prev_t1
        out.nonforward = self.nonforward + later.nonforward
        out.listed = (self.listed + later.listed)[:20]
        out.reorders = self.reorders + later.reorders
        out.thresholds = self.thresholds + later.thresholds
        out.builds = {b: h.copy() for b, h in self.builds.items()}
        for b, h in later.builds.items():
            if b in out.builds:
                out.builds[b] += h
            else:
                out.builds[b] = h.copy()
        out.sources = self.sources + later.sources
        out.examples = {e: list(x) for e, x in self.examples.items()}
        for e, x in later.examples.items():
            out.examples[e] = (out.examples.get(e, []) + x)[:3]
        return out

    # -- reading -------------------------------------------------------------------------

    def resolved(self) -> tuple[dict[Key, Acc], dict[tuple[int, int], str]]:
        """The groups with every class decided (:mod:`probe.rules`), and the warm-up steps
        that the decisions added, ``(pid, step) -> why``: the first uses judged to show
        compile/JIT cost, and (as a class of the groups) the steps before a rank's first
        replay, which are steady state when the rank never replayed."""
        groups: dict[Key, Acc] = {}
        for k, a in self.groups.items():
            cls = k[5]
            if cls == _PENDING:
                cls = STEADY
            key: Key = (*k[:5], cls)  # type: ignore[assignment]
            if key in groups:
                groups[key].add(a)
            else:
                groups[key] = a.copy()
        decided: dict[tuple[int, int], str] = {}
        medians: dict[tuple[int, int], float | None] = {}

        def steady_median(pid: int, mode: int) -> float | None:
            if (pid, mode) not in medians:
                same = [a for k, a in groups.items() if k[0] == pid and k[5] == STEADY]
                of_mode = [
                    a for k, a in groups.items() if k[0] == pid and k[1] == mode and k[5] == STEADY
                ]
                pool = of_mode if any(a.q[_Q["host_ns"], 0] for a in of_mode) else same
                medians[(pid, mode)] = percentile_of(_total(pool), "host_ns", 50) if pool else None
            return medians[(pid, mode)]

        for (pid, _), c in sorted(self.candidates.items(), key=lambda kv: kv[1].step):
            base = c.base
            if base == _PENDING and self.ranks[pid].replayed:
                cls = rules.BEFORE_REPLAY
                decided[(pid, c.step)] = CLASSES[cls]
            else:
                med = steady_median(pid, c.key[1])
                slow = _slow(c.host_ns, med)
                cls = rules.FIRST_USE if slow else STEADY
                if slow:
                    decided[(pid, c.step)] = CLASSES[cls]
            key = (*c.key[:5], cls)
            if key in groups:
                groups[key].add(c.acc)  # type: ignore[index]
            else:
                groups[key] = c.acc.copy()  # type: ignore[index]
        return groups, decided

    def first_replay_pending(self) -> dict[int, bool]:
        """Per rank, whether its steps before the first replay are warm-up (it replayed)."""
        return {p: r.replayed for p, r in self.ranks.items()}

    def figures(self, pid: int | None = None) -> dict[str, Any]:
        """Every figure of this summary (of one rank with ``pid``), as plain data: what
        every surface renders (see ``docs/rules.md`` for the rules)."""
        groups, decided = self.resolved()
        if pid is not None:
            groups = {k: a for k, a in groups.items() if k[0] == pid}
        steady = {k: a for k, a in groups.items() if k[5] == STEADY}
        warm = {k: a for k, a in groups.items() if k[5] != STEADY}
        tot = _total(groups.values())
        st = _total(steady.values())
        wm = _total(warm.values())
        out: dict[str, Any] = {
            "rules": dict(rules.RULES),
            "percentile_error": PERCENTILE_ERROR,
            "forward_steps": int(tot.s[_S["steps"]]),
            "steady_steps": int(st.s[_S["steps"]]),
            "hit_rates": _hit_rates(steady),
            "hit_rates_all": _hit_rates(groups),
            "miss_reasons": _miss_reasons(groups, self.examples),
            "phases": _phases(steady),
            "gpu": _gpu(st, [r for p, r in self.ranks.items() if pid is None or p == pid]),
            "throughput": _throughput(st),
            "warmup": self._warmup(warm, wm, decided, pid),
            "probe_cost": self._probe_cost(steady, st),
            "decode": _decode_split(steady),
            "ranks": sorted({k[0] for k in groups}),
        }
        out["headline"] = headline(out)
        return out

    def _warmup(
        self,
        warm: Mapping[Key, Acc],
        wm: Acc,
        decided: Mapping[tuple[int, int], str],
        pid: int | None,
    ) -> dict[str, Any]:
        why: Counter[str] = Counter()
        for k, a in warm.items():
            why[CLASSES[k[5]]] += int(a.s[_S["steps"]])
        listed = []
        rows = [x for x in self.listed if pid is None or x[0] == pid]
        extra = [
            c
            for (p, _), c in self.candidates.items()
            if (p, c.step) in decided and (pid is None or p == pid)
        ]
        for x in rows:
            cls = x[2]
            if cls == _PENDING:
                if not self.ranks[x[0]].replayed:
                    continue
                cls = rules.BEFORE_REPLAY
            listed.append(_listed(x[0], x[1], CLASSES[cls], x[3], x[4], x[5], x[6], x[7]))
        for c in extra:
            a = c.acc
            listed.append(
                _listed(
                    c.key[0],
                    c.step,
                    decided[(c.key[0], c.step)],
                    c.key[1],
                    int(a.s[_S["tokens"]]),
                    int(a.s[_S["graph_padded_tokens"]]),
                    int(a.q[_Q["cpu_launch_overhead_ns"], 1])
                    if a.q[_Q["cpu_launch_overhead_ns"], 0]
                    else -1,
                    c.host_ns,
                )
            )
        listed.sort(key=lambda r: (r["pid"], r["step"]))
        return {
            "rule": rules.RULES["steady"],
            "steps": int(wm.s[_S["steps"]]),
            "why": dict(why.most_common()),
            "cpu_launch_overhead_ns": _pcts(wm, "cpu_launch_overhead_ns"),
            "host_ns": _pcts(wm, "host_ns"),
            "host_ns_total": int(wm.q[_Q["host_ns"], 1]),
            "listed": listed[:20],
        }

    def _probe_cost(self, steady: Mapping[Key, Acc], st: Acc) -> dict[str, Any] | None:
        from probe.calibrate import cost_per_step_ns
        from probe.cost import has_timing

        cals = {p: c for p, c in self.calibrations.items() if c is not None}
        per = [(cals[k[0]], a) for k, a in steady.items() if k[0] in cals and a.s[_S["costed"]]]
        if not per:
            return None
        n = sum(int(a.s[_S["costed"]]) for _, a in per)
        spans = sum(int(a.s[_S["span_calls"]]) for _, a in per)
        hooks = sum(int(a.s[_S["hook_calls"]]) for _, a in per)
        used = list({id(c): c for c, _ in per}.values())
        cold_ok = all(has_timing(c, "_cold") for c in used)
        code_ok = cold_ok and all(has_timing(c, "_cold_code") for c in used)

        def cost(timing: str) -> float:
            return sum(
                cost_per_step_ns(
                    dict(c), int(a.s[_S["span_calls"]]), int(a.s[_S["hook_calls"]]), timing
                )
                for c, a in per
            )

        launch = _total(a for _, a in per)
        li = _Q["cpu_launch_overhead_ns"]
        mean_launch = float(launch.q[li, 1]) / int(launch.q[li, 0]) if launch.q[li, 0] else None
        per_step = cost("") / n
        cold = cost("_cold") / n if cold_ok else None
        code = cost("_cold_code") / n if code_ok else None

        def share(x: float | None) -> float | None:
            return x / mean_launch if mean_launch and x is not None else None

        return {
            "steps": n,
            "span_calls_per_step": spans / n,
            "hook_calls_per_step": hooks / n,
            "span_ns": [float(c["span_ns"]) for c in used],
            "hook_ns": [float(c["hook_ns"]) for c in used],
            "hot_path": sorted({str(c.get("hot_path")) for c in used}),
            "per_step_ns": per_step,
            "cpu_launch_overhead_mean_ns": mean_launch,
            "share_of_cpu_launch_overhead": share(per_step),
            "span_cold_ns": [float(c["span_cold_ns"]) for c in used] if cold_ok else None,
            "hook_cold_ns": [float(c["hook_cold_ns"]) for c in used] if cold_ok else None,
            "per_step_cold_ns": cold,
            "share_cold_of_cpu_launch_overhead": share(cold),
            "span_cold_code_ns": [float(c["span_cold_code_ns"]) for c in used] if code_ok else None,
            "hook_cold_code_ns": [float(c["hook_cold_code_ns"]) for c in used] if code_ok else None,
            "per_step_cold_code_ns": code,
            "share_cold_code_of_cpu_launch_overhead": share(code),
        }

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
            a = Acc()
            i = _Q["host_ns"]
            a.h[i] = h[:NB]
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


def _count(groups: Mapping[Key, Acc], pred: Any = None) -> int:
    return sum(int(a.s[_S["steps"]]) for k, a in groups.items() if pred is None or pred(k))


def _hit_rates(groups: Mapping[Key, Acc]) -> dict[str, Any]:
    n = _count(groups)
    full = _count(groups, lambda k: k[1] == Mode.FULL)
    pw = _count(groups, lambda k: k[1] == Mode.PIECEWISE)
    dec = _count(groups, lambda k: k[3] == 1)
    dec_full = _count(groups, lambda k: k[3] == 1 and k[1] == Mode.FULL)
    tot = _total(groups.values())
    graph = full + pw
    real = int(tot.s[_S["graph_tokens"]])
    padded = int(tot.s[_S["graph_padded_tokens"]])
    confirmed = int(tot.s[_S["replayed"]])
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


def _decode_split(steady: Mapping[Key, Acc]) -> dict[str, Any]:
    """Steady steps by decode or not: modes, the reasons of those not FULL, the query
    length of the decode steps (the verdict's words)."""
    modes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    others: Counter[str] = Counter()
    uq: Counter[int] = Counter()
    for k, a in steady.items():
        n = int(a.s[_S["steps"]])
        if k[3] == 1:
            modes[_mode_name(k[1])] += n
            uq[k[4]] += n
            if k[1] != Mode.FULL:
                reasons[_reason_name(k[2])] += n
        elif k[1] != Mode.FULL:
            others[_reason_name(k[2])] += n
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
    from probe.cost import cost_line

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
                f"{what} replayed FULL graphs: {rates['decode_full_hit_rate']:.0%} of {n_dec}"
            )
        else:
            reason = next(iter(dec["reasons"]), "unknown")
            out.append(
                f"{what} ran {top_mode.upper()} because {why(reason)} "
                f"({dec['modes'][top_mode]} of {n_dec} decode steps)"
            )
    for reason, n in list(dec["others"].items())[:2]:
        out.append(f"{n} non-decode step(s) missed FULL: {why(reason)}")
    rc = rates["replay_confirmed_rate"]
    if rc is not None and rc < 0.999:
        out.append(
            f"only {rc:.1%} of graph-dispatched steps showed a replay: check for captures "
            "during serving or unhooked wrappers"
        )
    lo = fig["phases"]["all"]["cpu_launch_overhead_ns"]
    if lo["p50"] is not None:
        out.append(
            f"CPU launch overhead median {lo['p50'] / 1e3:.0f} µs, p99 "
            f"{(lo['p99'] or 0) / 1e3:.0f} µs per step (steady state)"
        )
    line = cost_line(fig.get("probe_cost"))
    if line:
        out.append(line)
    w = fig["warmup"]
    if w["steps"]:
        worst = (w["cpu_launch_overhead_ns"] or {}).get("p99") or 0
        out.append(
            f"{w['steps']} warm-up step(s) apart from these figures (CPU launch overhead p99 "
            f"{worst / 1e3:,.0f} µs, {w['host_ns_total'] / 1e6:,.0f} ms of host time)"
        )
    g = fig["gpu"]
    if g["engine_idle_gaps"]:
        out.append(
            f"engine idle {g['engine_idle_ns'] / 1e9:,.1f} s in {g['engine_idle_gaps']} gap(s) "
            f"of {g['engine_idle_threshold_ns'] / 1e6:g} ms or more (nothing scheduled): "
            "apart from the GPU idle share and the host-bound verdict"
        )
    if g["host_bound_share"] is not None:
        n = g["idle_before_ns"]["n"]
        thr = g["host_bound_threshold"]
        rule = f"the GPU waiting for the host over {thr:.0%} of the step period"
        if g["host_bound_steps"]:
            line = (
                f"host-bound: {g['host_bound_share']:.0%} of {n} timed steps ({rule}); "
                "their largest host phases: "
                + ", ".join(f"{p['phase']} {p['share']:.0%}" for p in g["host_bound_phases"][:2])
                + " of their phase time"
            )
        else:
            line = (
                f"not host-bound: 0 of {n} timed steps had {rule} "
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


def _miss_reasons(
    groups: Mapping[Key, Acc], examples: Mapping[tuple[int, int], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str]] = Counter()
    steady: Counter[tuple[str, str]] = Counter()
    ex: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for k, a in groups.items():
        key = (_mode_name(k[1]), _reason_name(k[2]))
        ex.setdefault(key, examples.get((k[1], k[2]), []))
        counts[key] += int(a.s[_S["steps"]])
        if k[5] == STEADY:
            steady[key] += int(a.s[_S["steps"]])
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


def _phases(steady: Mapping[Key, Acc]) -> dict[str, Any]:
    groups: dict[str, Acc] = {"all": _total(steady.values())}
    for k, a in sorted(steady.items(), key=lambda kv: -kv[0][1]):
        name = _mode_name(k[1])
        if name in groups:
            groups[name].add(a)
        else:
            groups[name] = a.copy()
    return {
        name: {
            q if q in ("cpu_launch_overhead_ns", "host_ns") else q.removesuffix("_ns"): _pcts(a, q)
            for q in ("cpu_launch_overhead_ns", "host_ns", *PHASE_NS)
        }
        for name, a in groups.items()
    }


def _gpu(st: Acc, ranks: Sequence[_Rank]) -> dict[str, Any]:
    timed = int(st.s[_S["timed"]])
    bound = int(st.s[_S["host_bound"]])
    phase_ns = {p.removesuffix("_ns"): int(st.s[_S[f"bound_{p}"]]) for p in PHASE_NS}
    total = sum(phase_ns.values())
    ranked = sorted((p for p in phase_ns if phase_ns[p]), key=lambda p: -phase_ns[p])
    top = ranked[0] if bound and ranked else None
    device = int(st.s[_S["device_ns"]])
    return {
        "steps_timed": int(st.q[_Q["gpu_busy_ns"], 0]),
        "forward_busy_ns": _pcts(st, "gpu_busy_ns"),
        "idle_before_ns": _pcts(st, "gpu_idle_before_ns"),
        "idle_share": int(st.s[_S["idle_ns"]]) / device if device else None,
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
        "engine_idle_threshold_ns": rules.ENGINE_IDLE_GAP_NS,
    }


def _throughput(st: Acc) -> dict[str, Any]:
    tokens = int(st.s[_S["tokens"]])
    serving = int(st.s[_S["serving_ns"]])
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


# -- helpers for the other surfaces ---------------------------------------------------------


def _slow(host_ns: int, median: float | None) -> bool:
    """The first-use test of :mod:`probe.rules`: compile/JIT cost shows."""
    return (
        median is not None
        and host_ns > rules.FIRST_USE_SLOWER * median
        and host_ns > rules.FIRST_USE_MIN_NS
    )


class Classes:
    """Each step's (steady, engine idle) as the metric updates need it, step by step:
    a running :class:`Summary` per rank. ``decided`` and ``replayed`` come from a finished
    summary of the same steps (offline exports: the same split as the report); without
    them (live) a first use is judged against the rank's steady median so far, and steps
    before a first replay that has not come yet count as steady."""

    def __init__(
        self,
        decided: Mapping[tuple[int, int], str] | None = None,
        replayed: Iterable[int] | None = None,
        keep: int = 8192,
    ) -> None:
        self.decided = decided
        self.replayed = set(replayed) if replayed is not None else None
        self.keep = keep
        self.ranks: dict[int, Summary] = {}
        #: why each warm-up step classified so far is warm-up, ``(pid, step) -> class``
        self.why: dict[tuple[int, int], str] = {}
        #: live: per rank, the steps before a first replay not seen yet (steady so far)
        self.pending: dict[int, list[int]] = {}
        #: per rank, per step: (steady, after an engine-idle gap, period ns, gap ns)
        self.recent: dict[int, dict[int, tuple[bool, bool, int, int]]] = {}

    @classmethod
    def of(cls, summ: Summary) -> Classes:
        """The split of a finished summary (an offline export of the steps it summarised)."""
        _, decided = summ.resolved()
        return cls(decided, [p for p, r in summ.ranks.items() if r.replayed])

    def get(self, pid: int, step: int) -> tuple[bool, bool, int, int] | None:
        return self.recent.get(pid, {}).get(step)

    def classify(self, steps: Sequence[Step]) -> list[tuple[int, int, str]]:
        """Classify steps not seen yet (in (pid, step) order per rank); returns the
        warm-up steps found, ``(pid, step, why)``: these, and (live) earlier steps of a
        rank that turned out to precede its first replay when that replay came."""
        todo = [s for s in steps if self.get(s.pid, s.step) is None]
        by_pid: dict[int, list[Step]] = {}
        for s in todo:
            by_pid.setdefault(s.pid, []).append(s)
        found: list[tuple[int, int, str]] = []
        for pid, rows in by_pid.items():
            rows.sort(key=lambda s: s.step)
            summ = self.ranks.setdefault(pid, Summary())
            was_replayed = summ.ranks[pid].replayed if pid in summ.ranks else False
            summ.add_columns(columns_of_steps(rows))
            raw, idle, cand, shape, period, gap = summ.last
            recent = self.recent.setdefault(pid, {})
            pending = self.pending.setdefault(pid, [])
            if self.replayed is None and not was_replayed and summ.ranks[pid].replayed:
                why = CLASSES[rules.BEFORE_REPLAY]
                for n in pending:
                    if n in recent and (pid, n) not in self.why:
                        self.why[(pid, n)] = why
                        recent[n] = (False, *recent[n][1:])
                        found.append((pid, n, why))
                pending.clear()
            for j, s in enumerate(rows):
                c = int(raw[j])
                if c == _PENDING:
                    c = STEADY
                    if self.replayed is not None and pid in self.replayed:
                        c = rules.BEFORE_REPLAY
                    elif self.replayed is None:
                        pending.append(s.step)
                if cand[j]:
                    c = self._first_use(summ, pid, s, int(shape[j]))
                    # judged warm-up: no longer waiting on a first replay
                    if c != STEADY and pending and pending[-1] == s.step:
                        pending.pop()
                if s.mode is not None and c != STEADY:
                    self.why[(pid, s.step)] = CLASSES[c]
                    found.append((pid, s.step, CLASSES[c]))
                recent[s.step] = (
                    c == STEADY and s.mode is not None,
                    bool(idle[j]),
                    int(period[j]),
                    int(gap[j]),
                )
            while len(recent) > self.keep:
                old = next(iter(recent))
                del recent[old]
                self.why.pop((pid, old), None)
            del pending[: max(0, len(pending) - self.keep)]
        return found

    def _first_use(self, summ: Summary, pid: int, s: Step, shape: int) -> int:
        if self.decided is not None:
            return rules.FIRST_USE if (pid, s.step) in self.decided else STEADY
        c = summ.candidates.get((pid, shape))
        mode = int(s.mode) if s.mode is not None else -1
        of_mode = [a for k, a in summ.groups.items() if k[1] == mode and k[5] == STEADY]
        pool = of_mode or [a for k, a in summ.groups.items() if k[5] == STEADY]
        med = percentile_of(_total(pool), "host_ns", 50) if pool else None
        slow = _slow(s.host_ns, med)
        if c is not None:
            # decided now: into the running summary's groups
            del summ.candidates[(pid, shape)]
            summ._add_group((*c.key[:5], rules.FIRST_USE if slow else STEADY), c.acc)  # type: ignore[arg-type]
        return rules.FIRST_USE if slow else STEADY


def steady_mask(steps: Sequence[Step]) -> np.ndarray:
    """Per step (in the order given): True for a steady-state forward step by the rules of
    :mod:`probe.rules`, decided over these steps as one summary decides them (the
    predicate ``probe whatif`` and ``probe doctor`` split by)."""
    order = sorted(range(len(steps)), key=lambda i: (steps[i].pid, steps[i].step))
    s = Summary()
    cls = s.add_columns(columns_of_steps([steps[i] for i in order]))
    _, decided = s.resolved()
    pending = s.first_replay_pending()
    out = np.zeros(len(steps), dtype=bool)
    for j, i in enumerate(order):
        st = steps[i]
        c = int(cls[j])
        if c == STEADY and (st.pid, st.step) in decided:
            c = rules.FIRST_USE
        out[i] = c == STEADY
    del pending
    return out


def summarize_steps(
    steps: Iterable[Step],
    calibrations: Mapping[int, Mapping[str, Any] | None] | None = None,
    builder_names: Mapping[int, Mapping[int, str]] | None = None,
    warm: Mapping[tuple[int, int], str] | None = None,
) -> Summary:
    """The summary of Steps (a live window, a test's steps). ``warm``: the warm-up steps
    decided already, ``(pid, step) -> why`` (a live view's running split); without it the
    rules split these steps."""
    rows = list(steps)
    s = Summary()
    s.calibrations = {p: dict(c) for p, c in (calibrations or {}).items() if c is not None}
    if warm is None:
        s.add_steps(rows)
    else:
        rows.sort(key=lambda x: (x.pid, x.step))
        for x in rows:
            for o in x.reorders:
                s._reorder(o.changed, o.moved, o.threshold, o.spec_as_decode, o.num_decodes)
                s.reorders["reqs"] += o.num_reqs
        code = {name: i for i, name in enumerate(CLASSES)}
        forced = np.array(
            [code.get(warm.get((x.pid, x.step), "steady"), rules.FIRST_USE) for x in rows],
            dtype=np.int64,
        )
        if rows:
            s.add_columns(columns_of_steps(rows, s.calibrations), forced)
    if builder_names is not None:
        s.add_builds(builder_names, rows)
    s.sources = 1
    return s


def summarize_recording(rec: Any, chunk: int | None = None) -> Summary:
    """A recording's summary in one streaming pass (:func:`probe.recording.
    iter_step_columns`, each rank's hooked calls from the detail tables, reorders and
    builds aggregated in SQLite)."""
    from probe.cost import calibration_of
    from probe.recording import STEP_CHUNK_ROWS, iter_step_columns

    s = Summary()
    cals = {p["pid"]: calibration_of(p.get("snapshot")) for p in rec.processes()}
    s.calibrations = {p: c for p, c in cals.items() if c is not None}
    calls = _call_counts(rec, s.calibrations) if s.calibrations else None
    for cols in iter_step_columns(rec, chunk=chunk or STEP_CHUNK_ROWS):
        if calls is not None:
            cols = dict(cols)
            cols["_span_calls"], cols["_hook_calls"] = calls.take(cols)
        s.add_columns(cols)
    for row in rec._rows(
        "SELECT threshold, count(*), sum(changed), sum(moved), sum(spec_as_decode), "
        "sum(num_decodes), sum(num_reqs) FROM reorders AS r WHERE EXISTS "
        "(SELECT 1 FROM steps AS s WHERE s.pid = r.pid AND s.step = r.step) GROUP BY threshold"
    ):
        thr, n, changed, moved, spec, dec, reqs = (int(x or 0) for x in row)
        s.reorders["decisions"] += n
        s.reorders["changed"] += changed
        s.reorders["moved_requests"] += moved
        s.reorders["spec_as_decode"] += spec
        s.reorders["decodes"] += dec
        s.reorders["reqs"] += reqs
        s.thresholds[thr] += n
    for name, tag, drafter, b, n, total in rec._rows(
        "SELECT builder, tag, drafter, CASE WHEN t1_ns - t0_ns <= 0 THEN 0 ELSE min("
        f"{NB - 1}, 1 + CAST(floor(log2(t1_ns - t0_ns) * {_BINS_PER_OCTAVE}) AS INTEGER)) END "
        "AS b, count(*), sum(t1_ns - t0_ns) FROM builds AS d WHERE EXISTS (SELECT 1 FROM "
        "steps AS s WHERE s.pid = d.pid AND s.step = d.step) GROUP BY 1, 2, 3, 4"
    ):
        key = (name if isinstance(name, str) else "?", str(tag), bool(drafter))
        s._build(key, 0, int(n), int(b))
        s.builds[key][NB + 1] += int(total)
    s.sources = 1
    return s


def _steady_sums(s: Summary) -> dict[str, float]:
    st = _total(a for k, a in s.groups.items() if k[5] in (STEADY, _PENDING))
    dec = [a for k, a in s.groups.items() if k[5] in (STEADY, _PENDING) and k[3] == 1]
    full = [
        a
        for k, a in s.groups.items()
        if k[5] in (STEADY, _PENDING) and k[3] == 1 and k[1] == Mode.FULL
    ]
    return {
        "tokens": float(st.s[_S["tokens"]]),
        "serving_ns": float(st.s[_S["serving_ns"]]),
        "host_sum": float(st.q[_Q["host_ns"], 1]),
        "host_n": float(st.q[_Q["host_ns"], 0]),
        "launch_sum": float(st.q[_Q["cpu_launch_overhead_ns"], 1]),
        "launch_n": float(st.q[_Q["cpu_launch_overhead_ns"], 0]),
        "forward_launch_sum": float(st.q[_Q["forward_launch_ns"], 1]),
        "draft_sum": float(st.q[_Q["draft_ns"], 1]),
        "phase_n": float(st.q[_Q["forward_launch_ns"], 0]),
        "decode": float(sum(int(a.s[_S["steps"]]) for a in dec)),
        "decode_full": float(sum(int(a.s[_S["steps"]]) for a in full)),
    }


def block_figures(rec: Any, blocks: int = 10) -> tuple[Summary, list[dict[str, float | None]]]:
    """A recording's summary, and the steady figures of ``blocks`` runs of consecutive
    steps of it (the differences of the running sums after each run): what ``probe ab``
    takes an interval from when an arm has one repetition."""
    from probe.recording import iter_step_columns

    n = sum(rec.step_counts().values())
    size = max(1, -(-n // blocks))
    whole = summarize_recording(rec)
    s = Summary()
    prev = _steady_sums(s)
    out: list[dict[str, float | None]] = []
    for cols in iter_step_columns(rec, chunk=size):
        s.add_columns(cols)
        cur = _steady_sums(s)
        d = {k: cur[k] - prev[k] for k in cur}
        prev = cur
        out.append(_ab_values(d))
    return whole, out


def _ab_values(d: Mapping[str, float]) -> dict[str, float | None]:
    def div(a: float, b: float, scale: float = 1.0) -> float | None:
        return a / b * scale if b else None

    return {
        "steady_tokens_per_s": div(d["tokens"], d["serving_ns"], 1e9),
        "steady_host_ns": div(d["host_sum"], d["host_n"]),
        "cpu_launch_overhead_ns": div(d["launch_sum"], d["launch_n"]),
        "decode_full_share": div(d["decode_full"], d["decode"]),
        "forward_launch_ns": div(d["forward_launch_sum"], d["phase_n"]),
        "draft_ns": div(d["draft_sum"], d["phase_n"]),
    }


def ab_values(s: Summary) -> dict[str, float | None]:
    """The figures ``probe ab`` compares, of a whole summary (steady state)."""
    fig = s.figures()
    lo = fig["phases"]["all"]
    return {
        "steady_tokens_per_s": fig["throughput"]["tokens_per_s"],
        "steady_host_ns": lo["host_ns"]["mean"],
        "cpu_launch_overhead_ns": lo["cpu_launch_overhead_ns"]["mean"],
        "decode_full_share": fig["hit_rates"]["decode_full_hit_rate"],
        "forward_launch_ns": lo["forward_launch"]["mean"],
        "draft_ns": lo["draft"]["mean"],
    }


def summarize_recordings(recs: Sequence[Any]) -> Summary:
    """Several recordings as one: each summarised, merged in the order of their first
    step's time (rolling files of one agent; ranks of several hosts)."""
    parts = []
    for rec in recs:
        first = rec._rows("SELECT min(t0_ns) FROM steps")[0][0]
        parts.append((first if first is not None else 0, summarize_recording(rec)))
    parts.sort(key=lambda p: p[0])
    out = Summary()
    for _, s in parts:
        out = out.merge(s)
    return out


class _Calls:
    """Each step's hooked calls (:func:`probe.cost.hooked_calls`), counted in SQLite from
    the detail tables, looked up per chunk by (pid, step)."""

    def __init__(self, keys: np.ndarray, spans: np.ndarray, hooks: np.ndarray) -> None:
        self.keys, self.spans, self.hooks = keys, spans, hooks

    def take(self, cols: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        k = cols["pid"] * (1 << 40) + cols["step"]
        i = np.searchsorted(self.keys, k)
        i = np.minimum(i, max(len(self.keys) - 1, 0))
        ok = (
            (len(self.keys) > 0) & (self.keys[i] == k) if len(self.keys) else np.zeros(len(k), bool)
        )
        fw = cols["mode"] >= 0
        has_cal = np.isin(cols["pid"], self.pids)
        spans = np.where(ok, self.spans[i] if len(self.keys) else 0, 0)
        hooks = np.where(ok, self.hooks[i] if len(self.keys) else 0, 0)
        # the merged launch: one hook fewer on a replayed FULL step with its launch span
        merged = np.isin(cols["pid"], self.merged_mrv2) & (cols["runner"] == 1)
        merged |= np.isin(cols["pid"], self.merged_v1) & (cols["runner"] == 0)
        launch = np.where(ok, self.launch[i] if len(self.keys) else 0, 0)
        less = merged & (cols["mode"] == int(Mode.FULL)) & (cols["replayed"] == 1) & (launch > 0)
        hooks = hooks - less.astype(np.int64)
        dip = np.isin(cols["pid"], self.dispatch_in_phase) & (cols["runner"] == 1)
        spans = spans - np.where(dip & ok, self.in_phase[i] if len(self.keys) else 0, 0)
        use = fw & has_cal
        return np.where(use, spans, -1), np.where(use, hooks, -1)

    pids: np.ndarray
    merged_mrv2: np.ndarray
    merged_v1: np.ndarray
    dispatch_in_phase: np.ndarray
    launch: np.ndarray
    in_phase: np.ndarray


def _call_counts(rec: Any, cals: Mapping[int, Mapping[str, Any]]) -> _Calls:
    """Per step, the counts :func:`probe.cost.hooked_calls` makes, from SQL aggregates."""
    bracket = "('execute', 'sample_tokens', 'forward_launch')"
    parts = {
        "spans": (
            "SELECT pid, step, sum(phase NOT IN " + bracket + "), sum(phase IN " + bracket + "), "
            "max(phase = 'forward_launch' AND drafter = 0) FROM spans GROUP BY pid, step"
        ),
        "derived": (
            "SELECT a.pid, a.step, count(DISTINCT a.t0_ns || ':' || a.t1_ns) FROM spans AS a "
            "JOIN spans AS b ON b.pid = a.pid AND b.step = a.step AND b.phase = 'metadata_build'"
            " AND b.drafter = 0 AND b.t0_ns = a.t1_ns WHERE a.phase = 'prepare_inputs' AND "
            "a.drafter = 0 GROUP BY a.pid, a.step"
        ),
        "in_phase": (
            "SELECT d.pid, d.step, count(*) FROM dispatches AS d WHERE d.drafter = 0 AND EXISTS "
            "(SELECT 1 FROM spans AS s WHERE s.pid = d.pid AND s.step = d.step AND s.phase = "
            "'dispatch' AND s.drafter = 0 AND s.t0_ns = d.t0_ns AND s.t1_ns = d.t1_ns) "
            "GROUP BY d.pid, d.step"
        ),
        "replays": "SELECT pid, step, count(*) FROM replays WHERE kind != 'capture' GROUP BY 1, 2",
        "dispatches": "SELECT pid, step, count(*) FROM dispatches GROUP BY 1, 2",
        "builds": "SELECT pid, step, count(*) FROM builds GROUP BY 1, 2",
        "reorders": "SELECT pid, step, count(*) FROM reorders GROUP BY 1, 2",
    }
    tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, sql in parts.items():
        rows = rec._rows(sql)
        a = (
            np.array(rows, dtype=np.int64).reshape(len(rows), -1)
            if rows
            else np.zeros((0, 5), np.int64)
        )
        tables[name] = (a[:, 0] * (1 << 40) + a[:, 1], a[:, 2:])
    keys = np.unique(np.concatenate([k for k, _ in tables.values()]))

    def col(name: str, j: int = 0) -> np.ndarray:
        k, v = tables[name]
        out = np.zeros(len(keys), dtype=np.int64)
        if len(k):
            out[np.searchsorted(keys, k)] = v[:, j]
        return out

    spans = col("spans", 0) - col("derived")
    hooks = col("spans", 1) + col("replays") + col("dispatches") + col("builds") + col("reorders")
    c = _Calls(keys, spans, hooks)
    c.launch = col("spans", 2)
    c.in_phase = col("in_phase")
    c.pids = np.array(sorted(cals), dtype=np.int64)
    c.merged_mrv2 = np.array([p for p, x in cals.items() if x.get("launch_is_replay")], np.int64)
    c.merged_v1 = np.array([p for p, x in cals.items() if x.get("v1_launch_is_replay")], np.int64)
    c.dispatch_in_phase = np.array(
        [p for p, x in cals.items() if x.get("dispatch_in_phase")], np.int64
    )
    return c


def gsum_sel(v: np.ndarray, inv: np.ndarray, g: int) -> np.ndarray:
    """Exact int64 sums of ``v`` per group ``inv``."""
    if len(v) and int(np.abs(v).max()) * len(v) < 2**53:
        return np.rint(np.bincount(inv, weights=v.astype(np.float64), minlength=g)).astype(np.int64)
    out = np.zeros(g, dtype=np.int64)
    np.add.at(out, inv, v)
    return out


def iter_chunks(steps: Iterable[Step], n: int = 4096) -> Iterator[list[Step]]:
    """Steps in lists of ``n`` (a stream of Steps summarised as it comes)."""
    buf: list[Step] = []
    for s in steps:
        buf.append(s)
        if len(buf) >= n:
            yield buf
            buf = []
    if buf:
        yield buf
