"""The one summary of a set of steps (a rank, a process, a recording, several recordings,
a live window): every figure the report, ``probe ab``, the live view, the metric set and
the dashboards show is computed here, by the rules of :mod:`probe.analysis.rules`.

A :class:`Summary` is built in one streaming pass over numpy columns (a recording's
``steps`` table read in chunks: :func:`probe.reader.recording_columns.iter_step_columns`, or a
batch of
:class:`~probe.step.Step` objects: :func:`columns_of_steps`), and holds one accumulator per
group (rank, mode, miss reason, uniform decode and query length, steady or warm-up class):
exact counts and sums, and a log-bucketed histogram per timing from which percentiles are
read (:data:`PERCENTILE_ERROR`). Memory grows with the number of groups, not of steps.
Summaries merge (:meth:`Summary.merge`): those of several files of the same ranks, in time
order, give the summary of them all; what depends on the order (a rank's first replay, the
first use of a shape) is resolved when the figures are read (:meth:`Summary.figures`).

    >>> from probe.analysis.summary_read import summarize_recording
    >>> from probe.reader.recording import Recording, default_recording
    >>> s = summarize_recording(Recording.open(default_recording()))
    >>> f = s.figures()
    >>> f["hit_rates"]["decode_full_hit_rate"], f["warmup"]["steps"]
    (0.0, 2)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from probe.analysis import rules
from probe.analysis.accumulators import (
    NB,
    NQ,
    PENDING,
    PERCENTILE_ERROR,
    PHASE_NS,
    QUANTITIES,
    SCALARS,
    Acc,
    Key,
    Q,
    S,
    Selected,
    add_bins,
    bins_of,
    group_codes,
    key_counts,
    keys_of_codes,
    percentile_of,
    q_zero,
    segment_stats,
    segment_sums,
    total_of,
)
from probe.analysis.figures import (
    REASON_TEXT,
    FiguresOf,
    decode_split,
    gpu,
    headline,
    hit_rates,
    miss_reasons,
    phase_figures,
    throughput,
    verdict,
)
from probe.analysis.rules import CLASSES, STEADY
from probe.analysis.summary_state import Candidate, Rank
from probe.records import BuildTag, Mode, Reason
from probe.step import PHASES, Step

__all__ = [
    "PERCENTILE_ERROR",
    "QUANTITIES",
    "Summary",
    "columns_of_steps",
    "percentile_of",
]

# -- columns ---------------------------------------------------------------------------------

_RUNNERS = ("v1", "mrv2")


def columns_of_steps(
    steps: Sequence[Step], calibrations: Mapping[int, Mapping[str, Any] | None] | None = None
) -> dict[str, np.ndarray]:
    """Steps as the columns :func:`probe.reader.recording_columns.iter_step_columns` gives
    (codes, NULL
    -1), with each step's hooked calls (``_span_calls``, ``_hook_calls``; -1 for a rank
    without a calibration) counted by :func:`probe.analysis.cost.calls_with`."""
    from probe.analysis.cost import calls_with

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
        "carried_reqs": arr(opt(s.carried_reqs) for s in steps),
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


class _Contiguous(Mapping[str, np.ndarray]):
    """A chunk's columns, each made contiguous the first time it is read: a column that is
    a strided view (a row of every field in turn) is read once at memory speed, and every
    pass after that runs over contiguous memory. A column read once is read as it lies
    (``cols``)."""

    def __init__(self, cols: Mapping[str, np.ndarray]) -> None:
        self.cols = cols
        self.got: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        got = self.got.get(name)
        if got is None:
            got = self.got[name] = np.ascontiguousarray(self.cols[name])
        return got

    def take(self, name: str, rows: np.ndarray) -> np.ndarray:
        """The column's values at ``rows``, read where they lie (one pass over them)."""
        got = self.got.get(name)
        return np.take(self.cols[name] if got is None else got, rows)

    def at(self, name: str, row: int) -> int:
        """One value of the column, as an int."""
        return int(self.cols[name][row])

    def __contains__(self, name: object) -> bool:
        return name in self.cols

    def __iter__(self) -> Iterator[str]:
        return iter(self.cols)

    def __len__(self) -> int:
        return len(self.cols)


@dataclass
class Summary(FiguresOf):
    """The mergeable summary of a set of steps (see the module's docstring)."""

    groups: dict[Key, Acc] = field(default_factory=dict)
    ranks: dict[int, Rank] = field(default_factory=dict)
    candidates: dict[tuple[int, int], Candidate] = field(default_factory=dict)
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
    #: per rank, its groups of steps before a first replay not seen yet
    pending: dict[int, set[Key]] = field(default_factory=dict, repr=False)
    #: one engine step in this many recorded (``--sample N``): the gap before a recorded
    #: step spans N steps, so its period is that gap's N-th part and the engine-idle gap N
    #: times as long; rates then estimate all steps (counts stay of recorded steps)
    sample_every: int = 1

    # -- building ------------------------------------------------------------------------

    def add_columns(
        self, cols: Mapping[str, np.ndarray], forced: np.ndarray | None = None
    ) -> np.ndarray:
        """Add a chunk of steps in (pid, step) order, continuing each rank where the last
        chunk left it; returns each row's class (:data:`probe.analysis.rules.CLASSES` code; -1 for
        a step that ran no forward; first uses not yet decided read steady)."""
        n = len(cols["pid"])
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        cols = _Contiguous(cols)
        pid = cols["pid"]
        mode = cols["mode"]
        fw = mode >= 0
        self.nonforward += int(n - fw.sum())
        t0, t1 = cols.cols["t0_ns"], cols["t1_ns"]
        # the gap before each step on its rank, and whether it was engine idle
        new_rank = np.ones(n, dtype=bool)
        new_rank[1:] = pid[1:] != pid[:-1]
        prev = np.empty(n, dtype=np.int64)
        prev[1:] = t1[:-1]
        has_prev = ~new_rank
        starts = np.flatnonzero(new_rank)
        for i in starts:
            r = self.ranks.setdefault(int(pid[i]), Rank())
            if r.first_step is None:
                r.first_step = cols.at("step", i)
            if r.prev_t1 is not None:
                prev[i] = r.prev_t1
                has_prev[i] = True
        gap = np.where(has_prev, t0 - prev, 0)
        every = max(1, self.sample_every)
        carried = cols.get("carried_reqs")
        if carried is None:  # columns without the engine's state
            carried = np.full(n, -1, dtype=np.int64)
        idle = has_prev & rules.engine_idle(gap, carried, every)
        span = t1 - prev
        if every > 1:
            span //= every
        period = np.where(has_prev & ~idle, span, t1 - t0)
        # per run of a rank's rows: its engine-idle gaps, and the gaps judged each way
        idle_gaps = Selected(idle, starts)
        idle_ns = idle_gaps.sums(gap)
        known = carried >= 0
        by_state = segment_sums(has_prev & known, starts)
        by_gap = segment_sums(has_prev & ~known, starts)
        ends = np.append(starts[1:], n) - 1
        for i, end in enumerate(ends.tolist()):
            r = self.ranks[int(pid[end])]
            r.idle_ns += int(idle_ns[i])
            r.idle_gaps += int(idle_gaps.counts[i])
            r.by_state += int(by_state[i])
            r.by_gap += int(by_gap[i])
            r.prev_t1 = int(t1[end])

        graph = fw & (mode != int(Mode.NONE))
        reason = cols["reason"]
        cls = np.full(n, STEADY, dtype=np.int64)
        cls[~fw] = -1
        # captures and warm-up/profile dispatches
        cls[fw & (reason == int(Reason.WARMUP_OR_PROFILE))] = rules.PROFILE
        cls[fw & (cols.cols["captures"] > 0)] = rules.CAPTURE
        # before the rank's first replay
        replay = graph & (cols.cols["replayed"] == 1)
        for a, b in zip(starts, ends + 1, strict=True):
            r = self.ranks[int(pid[a])]
            if r.replayed:
                continue
            hit = np.flatnonzero(replay[a:b])
            upto = b if len(hit) == 0 else a + int(hit[0])
            seg = cls[a:upto]
            seg[seg == STEADY] = rules.BEFORE_REPLAY if len(hit) else PENDING
            if len(hit):
                r.replayed = True
                self._resolve_pending(int(pid[a]))
        # first use of each shape on its rank
        shape = np.where(graph, mode * (1 << 40) + cols.cols["padded_tokens"], 0)
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
                if cls[j] in (STEADY, PENDING):
                    cand[j] = True
        decode = (cols.cols["uniform"] == 1) & (cols["uniform_decode_query_len"] >= 1)
        uq = np.minimum(cols["uniform_decode_query_len"], 255)
        # each first use apart: a group of its own per row
        grouped, each = self._group_accs(
            cols, fw & ~cand, cand, cls, decode, uq, idle, gap, period, graph
        )
        for key, acc in grouped:
            self._add_group(key, acc)
        for j, (key, acc) in zip(np.flatnonzero(cand), each, strict=True):
            k = (int(pid[j]), int(shape[j]))
            self.candidates[k] = Candidate(
                key.of_class(STEADY),
                int(cls[j]),
                cols.at("step", j),
                cols.at("host_ns", j),
                acc,
                cols.at("padded_tokens", j),
                cols.at("cpu_launch_overhead_ns", j),
            )
        out = cls.copy()
        out[out == PENDING] = STEADY
        self._list(cols, cls, cand)
        self._examples(cols, fw)
        self.last = (cls, idle, cand, shape, period, gap)
        return out

    def _list(self, cols: _Contiguous, cls: np.ndarray, cand: np.ndarray) -> None:
        room = 20 - len(self.listed)
        if room <= 0:
            return
        warm = np.flatnonzero((cls > STEADY) & ~cand)[:room]
        for j in warm:
            self.listed.append(
                (
                    cols.at("pid", j),
                    cols.at("step", j),
                    int(cls[j]),
                    cols.at("mode", j),
                    cols.at("num_tokens", j),
                    cols.at("padded_tokens", j),
                    cols.at("cpu_launch_overhead_ns", j),
                    cols.at("host_ns", j),
                )
            )

    def _examples(self, cols: _Contiguous, fw: np.ndarray) -> None:
        mr = cols["mode"] * 64 + cols["reason"]
        idx = np.flatnonzero(fw)
        if not len(idx):
            return
        _, first = np.unique(mr[idx], return_index=True)
        for j0 in idx[first]:
            key = (cols.at("mode", j0), cols.at("reason", j0))
            have = self.examples.setdefault(key, [])
            if len(have) >= 3:
                continue
            same = idx[mr[idx] == mr[j0]][: 3 - len(have)]
            for j in same:
                have.append(
                    {
                        "pid": cols.at("pid", j),
                        "step": cols.at("step", j),
                        "num_tokens": cols.at("num_tokens", j),
                        "num_reqs": cols.at("num_reqs", j),
                        "max_query_len": cols.at("max_query_len", j),
                        "uniform_decode_query_len": cols.at("uniform_decode_query_len", j),
                        "uniform": bool(cols.at("uniform", j)),
                        "padded_tokens": cols.at("padded_tokens", j),
                    }
                )

    def _resolve_pending(self, pid: int) -> None:
        for key in self.pending.pop(pid, ()):
            acc = self.groups.pop(key)
            self._add_group(key.of_class(rules.BEFORE_REPLAY), acc)
        self.listed = [
            (*x[:2], rules.BEFORE_REPLAY, *x[3:]) if x[0] == pid and x[2] == PENDING else x
            for x in self.listed
        ]

    def _add_group(self, key: Key, acc: Acc) -> None:
        cur = self.groups.get(key)
        if cur is None:
            self.groups[key] = acc
            if key.step_class == PENDING:
                self.pending.setdefault(key.pid, set()).add(key)
        else:
            cur.add(acc)

    def _group_accs(
        self,
        cols: _Contiguous,
        rows: np.ndarray,
        apart: np.ndarray,
        cls: np.ndarray,
        decode: np.ndarray,
        uq: np.ndarray,
        idle: np.ndarray,
        gap: np.ndarray,
        period: np.ndarray,
        graph: np.ndarray,
    ) -> tuple[list[tuple[Key, Acc]], list[tuple[Key, Acc]]]:
        """The accumulators of ``rows`` by group (:class:`Key`), in key order, and those of
        each row of ``apart`` as a group of its own, in row order: all in one pass over the
        rows sorted by group, each figure summed per group run."""
        grouped = np.flatnonzero(rows)
        each = np.flatnonzero(apart)
        if len(grouped) + len(each) == 0:
            return [], []
        code_of_row = group_codes(cols["pid"], cols["mode"], cols["reason"], decode, uq, cls)
        code = code_of_row[grouped]
        # stable: each group's rows stay in row order, so every column is read forward
        by_code = np.argsort(code, kind="stable")
        code = code[by_code]
        new = np.ones(len(code), dtype=bool)
        new[1:] = code[1:] != code[:-1]
        # the rows in group order, where each group starts, and each row's group
        order = np.concatenate([grouped[by_code], each])
        starts = np.concatenate([np.flatnonzero(new), len(grouped) + np.arange(len(each))])
        keys = keys_of_codes(np.concatenate([code[new], code_of_row[each]]))
        g = len(keys)
        sizes = np.diff(starts, append=len(order))
        group = np.repeat(np.arange(g), sizes)
        # each column read in group order once, and let go after its last use: the
        # temporaries of one chunk stay few (memory reused, not faulted in again)
        taken: dict[str, np.ndarray] = {}

        def col(name: str, last: bool = False) -> np.ndarray:
            got = taken.pop(name) if name in taken else cols.take(name, order)
            if not last:
                taken[name] = got
            return got

        gi = Selected(graph[order], starts)
        idle_after = Selected(idle[order], starts)
        idle_before = col("gpu_idle_before_ns")
        gstep = col("gpu_step_ns")
        timed_rows = (idle_before >= 0) & (gstep >= 0) & ~idle[order]
        timed = Selected(timed_rows, starts)
        bound = Selected(timed_rows & rules.host_bound(idle_before, gstep), starts)
        del timed_rows
        replayed = Selected(graph[order] & (col("replayed", last=True) == 1), starts)
        idle_sums = timed.sums(idle_before)
        tokens = col("num_tokens", last=True)
        sums = {
            "steps": sizes,
            "tokens": segment_sums(tokens, starts),
            "graph_tokens": gi.sums(tokens),
            "graph_padded_tokens": gi.sums(col("padded_tokens", last=True)),
            "replayed": replayed.counts,
            "serving_ns": segment_sums(period[order], starts),
            "timed": timed.counts,
            "idle_ns": idle_sums,
            "device_ns": idle_sums + timed.sums(gstep),
            "host_bound": bound.counts,
            "engine_idle_ns": idle_after.sums(gap[order]),
            "engine_idle_gaps": idle_after.counts,
        }
        del tokens, idle_before, gstep
        if "_span_calls" in cols:
            costed = Selected(col("_span_calls") >= 0, starts)
            sums["costed"] = costed.counts
            sums["span_calls"] = costed.sums(col("_span_calls", last=True))
            sums["hook_calls"] = costed.sums(col("_hook_calls", last=True))
        q = np.tile(q_zero(), (g, 1, 1))
        # the histograms: each value's (group, quantity, bucket) as one flat key, counted
        # per quantity into every group's buckets where those are few beside the rows,
        # else the keys kept and counted at the end
        dense = np.zeros((g, NQ, NB), dtype=np.int64) if g * NB <= 2 * len(order) else None
        kept: list[np.ndarray] = []
        slot = np.empty(len(order), dtype=np.int64)
        # each row's key of bucket 0 of the quantity in hand, a value left out keyed `out`
        at = group * NB if dense is not None else group * (NQ * NB)
        out = g * NB if dense is not None else g * NQ * NB
        for qi, name in enumerate(QUANTITIES):
            v = col(name, last=True)
            if name in PHASE_NS:
                sums[f"bound_{name}"] = bound.sums(v)
            if name == "gpu_idle_before_ns" or name == "gpu_step_ns":
                ok = timed
            elif name == "host_ns":
                ok = Selected(v > 0, starts)
            else:
                ok = Selected(v >= 0, starts)
            if not ok.most and not len(ok.rows):
                continue
            q[:, qi] = segment_stats(v, ok)
            if ok.most:
                add_bins(v, slot, at)
                slot[ok.rows] = out
            else:
                slot[:] = out
                add_bins(v[ok.rows], slot[: len(ok.rows)], at[ok.rows])
            if dense is not None:
                dense[:, qi] = np.bincount(slot, minlength=out + 1)[:out].reshape(g, NB)
            else:
                kept.append(slot + qi * NB)
        if dense is not None:
            hk = np.flatnonzero(dense)
            hv = dense.reshape(-1)[hk]
        else:
            hk, hv = key_counts(np.concatenate(kept) if kept else slot[:0], out)
        none = np.zeros(g, dtype=np.int64)
        s = np.stack([sums.get(name, none) for name in SCALARS], axis=1)
        bounds = np.searchsorted(hk, np.arange(g + 1) * (NQ * NB))
        accs = [
            (
                key,
                Acc.sparse(
                    s[j],
                    q[j],
                    hk[bounds[j] : bounds[j + 1]] - j * (NQ * NB),
                    hv[bounds[j] : bounds[j + 1]],
                ),
            )
            for j, key in enumerate(keys)
        ]
        return accs[: g - len(each)], accs[g - len(each) :]

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
        b = int(bins_of(np.array([dur]))[0]) if bin_ is None else bin_
        h[b] += n
        h[NB] += n
        h[NB + 1] += dur if bin_ is None else 0

    # -- merging -------------------------------------------------------------------------

    def merge(self, later: Summary) -> Summary:
        """This summary and ``later``'s, as one: ``later`` holds steps after these on the
        ranks they share (rolling files of one agent), or other ranks (other hosts).
        Exact: counts, sums and histograms add; a shape first used here is no first use
        there; a rank that replayed here has no steps before its first replay there."""
        out = Summary(sample_every=max(self.sample_every, later.sample_every))
        out.calibrations = {**self.calibrations, **later.calibrations}
        for k, a in self.groups.items():
            out._add_group(k, a.copy())
        out.candidates = dict(self.candidates)
        out.ranks = {p: r.copy() for p, r in self.ranks.items()}
        for k, a in later.groups.items():
            pid = k.pid
            cls = k.step_class
            mine = out.ranks.get(pid)
            if mine is not None and cls == PENDING:
                cls = STEADY if mine.replayed else PENDING
            out._add_group(k.of_class(cls), a.copy())
        for (pid, sh), c in later.candidates.items():
            mine = out.ranks.get(pid)
            if mine is not None and sh in mine.seen:
                base = c.base if not (mine.replayed and c.base == PENDING) else STEADY
                out._add_group(c.key.of_class(base), c.acc.copy())
            else:
                out.candidates[(pid, sh)] = c
        for pid, r in later.ranks.items():
            mine = out.ranks.get(pid)
            if mine is None:
                out.ranks[pid] = r.copy()
                continue
            mine.idle_ns += r.idle_ns
            mine.idle_gaps += r.idle_gaps
            mine.by_state += r.by_state
            mine.by_gap += r.by_gap
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
        """The groups with every class decided (:mod:`probe.analysis.rules`), and the warm-up steps
        that the decisions added, ``(pid, step) -> why``: the first uses judged to show
        compile/JIT cost, and (as a class of the groups) the steps before a rank's first
        replay, which are steady state when the rank never replayed."""
        groups: dict[Key, Acc] = {}
        for k, a in self.groups.items():
            cls = k.step_class
            if cls == PENDING:
                cls = STEADY
            key = k.of_class(cls)
            if key in groups:
                groups[key].add(a)
            else:
                groups[key] = a.copy()
        decided: dict[tuple[int, int], str] = {}
        medians: dict[tuple[int, int], float | None] = {}
        # each rank's steady groups (the median of a rank looks at its own alone)
        steady: dict[int, dict[Key, Acc]] = {}
        for k, a in groups.items():
            if k.step_class == STEADY:
                steady.setdefault(k.pid, {})[k] = a

        def steady_median(pid: int, mode: int) -> float | None:
            if (pid, mode) not in medians:
                mine = steady.get(pid, {})
                same = list(mine.values())
                of_mode = [a for k, a in mine.items() if k.mode == mode]
                pool = of_mode if any(a.q[Q["host_ns"], 0] for a in of_mode) else same
                medians[(pid, mode)] = (
                    percentile_of(total_of(pool), "host_ns", 50) if pool else None
                )
            return medians[(pid, mode)]

        for (pid, _), c in sorted(self.candidates.items(), key=lambda kv: kv[1].step):
            base = c.base
            if base == PENDING and self.ranks[pid].replayed:
                cls = rules.BEFORE_REPLAY
                decided[(pid, c.step)] = CLASSES[cls]
            else:
                med = steady_median(pid, c.key.mode)
                slow = rules.first_use_slow(c.host_ns, med)
                cls = rules.FIRST_USE if slow else STEADY
                if slow:
                    decided[(pid, c.step)] = CLASSES[cls]
            key = c.key.of_class(cls)
            if key in groups:
                groups[key].add(c.acc)
            else:
                groups[key] = c.acc.copy()
                if cls == STEADY:
                    steady.setdefault(pid, {})[key] = groups[key]
        return groups, decided

    def settled(self, pid: np.ndarray, step: np.ndarray, raw: np.ndarray) -> np.ndarray:
        """Each row's class once every class is decided (as :meth:`resolved` decides):
        ``raw``, the classes ``last[0]`` held for those rows when their chunk was added
        (-1 for a step without a forward); the rows in (pid, step) order."""
        _, decided = self.resolved()
        out = raw.copy()
        replayed = [p for p, r in self.ranks.items() if r.replayed]
        pend = out == PENDING
        out[pend] = np.where(np.isin(pid[pend], replayed), rules.BEFORE_REPLAY, STEADY)
        if decided:
            code = {name: i for i, name in enumerate(CLASSES)}
            key = (pid.astype(np.int64) << 32) | step
            want = np.array([(p << 32) | s for p, s in decided], dtype=np.int64)
            at = np.minimum(np.searchsorted(key, want), len(key) - 1)
            hit = key[at] == want
            out[at[hit]] = [code[w] for w, h in zip(decided.values(), hit, strict=True) if h]
        return out

    def first_replay_pending(self) -> dict[int, bool]:
        """Per rank, whether its steps before the first replay are warm-up (it replayed)."""
        return {p: r.replayed for p, r in self.ranks.items()}

    def figures(self, pid: int | None = None) -> dict[str, Any]:
        """Every figure of this summary (of one rank with ``pid``), as plain data: what
        every surface renders (see ``docs/rules.md`` for the rules). The figures of every
        rank: :meth:`rank_figures`."""
        groups, decided = self.resolved()
        if pid is None:
            return self._figures_of(groups, decided, None, self.candidates.values(), self.ranks)
        mine = {k: a for k, a in groups.items() if k.pid == pid}
        cands = [c for (p, _), c in self.candidates.items() if p == pid]
        return self._figures_of(mine, decided, pid, cands, {pid: self.ranks.get(pid)})

    def rank_figures(self) -> dict[int, dict[str, Any]]:
        """``figures(pid)`` of every rank with forward steps, by pid in order: the groups
        decided once for them all and each rank's read apart (time linear in ranks)."""
        groups, decided = self.resolved()
        by_pid: dict[int, dict[Key, Acc]] = {}
        for k, a in groups.items():
            by_pid.setdefault(k.pid, {})[k] = a
        cands: dict[int, list[Candidate]] = {}
        for (p, _), c in self.candidates.items():
            cands.setdefault(p, []).append(c)
        return {
            p: self._figures_of(by_pid[p], decided, p, cands.get(p, []), {p: self.ranks.get(p)})
            for p in sorted(by_pid)
        }

    def _figures_of(
        self,
        groups: Mapping[Key, Acc],
        decided: Mapping[tuple[int, int], str],
        pid: int | None,
        candidates: Iterable[Candidate],
        ranks: Mapping[int, Rank | None],
    ) -> dict[str, Any]:
        """The figures of ``groups`` (resolved: :meth:`resolved`), all of one rank with
        ``pid``: ``candidates`` and ``ranks`` are that rank's (all with None)."""
        steady = {k: a for k, a in groups.items() if k.step_class == STEADY}
        warm = {k: a for k, a in groups.items() if k.step_class != STEADY}
        tot = total_of(groups.values())
        st = total_of(steady.values())
        wm = total_of(warm.values())
        out: dict[str, Any] = {
            "rules": dict(rules.RULES),
            "percentile_error": PERCENTILE_ERROR,
            "forward_steps": int(tot.s[S["steps"]]),
            # the steps that ran no forward (recorded, counted by `probe record`), all ranks
            "nonforward_steps": self.nonforward,
            "steady_steps": int(st.s[S["steps"]]),
            "hit_rates": hit_rates(steady),
            "hit_rates_all": hit_rates(groups),
            "miss_reasons": miss_reasons(groups, self.examples),
            "phases": phase_figures(steady),
            "gpu": gpu(st, [r for r in ranks.values() if r is not None]),
            "throughput": throughput(st),
            "warmup": self._warmup(warm, wm, decided, pid, candidates),
            "probe_cost": self._probe_cost(steady, st),
            "decode": decode_split(steady),
            "ranks": sorted({k.pid for k in groups}),
        }
        out["headline"] = headline(out)
        return out


__all__ += [
    "REASON_TEXT",
    "Acc",
    "headline",
    "verdict",
]
