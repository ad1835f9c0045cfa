"""Ranks side by side over a recording's ``steps`` columns: the figures
:func:`probe.analysis.ranks.engine_ranks` computes from Steps, computed with numpy over
each rank's validated columns (:func:`probe.reader.recording_columns.iter_step_columns`),
a window of matched steps at a time.

    >>> from probe.reader.recording import Recording, default_recording
    >>> ranks_of_recording(Recording.open(default_recording())).engines  # one worker: none
    ()

The rules are :mod:`probe.analysis.ranks`'s, to the bit: the same offsets (read from the
same first steps), the same last rank (the latest arrival, the first listed on a tie),
the same skew (the lead over the median, rounded as :func:`round` rounds), the same phase
behind it (the first listed of the largest leads) and the same wait. Where a window's
values are too large for that arithmetic in 64-bit integers (no real clock comes near),
its steps go through :func:`probe.analysis.ranks.compare` one by one.

Memory: per rank, at most two chunks of the dozen columns matching reads; per matched
step that names a last rank, one skew figure (8 bytes, for exact percentiles), as the
Step path holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from probe.analysis.ranks import (
    ALIGN_WINDOW,
    ARRIVAL,
    DEFAULT_EPOCH_SYNC_NS,
    FL,
    PHASES_BEFORE_FORWARD,
    START,
    DpRank,
    EngineRanks,
    RankFigures,
    RankInput,
    RanksSummary,
    align_offsets,
    clock_shifts,
    compare,
    rank_verdict,
    recording_ranks,
)
from probe.records import Reason

__all__ = ["RANKS_CHUNK_ROWS", "engine_ranks_of_columns", "ranks_of_recording"]

#: rows per rank read at a time while matching (a window holds at most two per rank)
RANKS_CHUNK_ROWS = 8192
_PHASES = tuple(f"{p}_ns" for p in PHASES_BEFORE_FORWARD)
_READ = ("step", "t0_ns", "cpu_launch_overhead_ns", "gpu_idle_before_ns", "num_tokens",
         "num_reqs", *_PHASES)  # fmt: skip
_I64 = 2**63


@dataclass(frozen=True)
class _Batch:
    """What :func:`align_offsets` reads of a step."""

    step: int
    num_tokens: int
    num_reqs: int


class _Stream:
    """One rank's columns that matching reads, in step order, buffered a chunk ahead."""

    def __init__(self, rec: Any, pid: int, chunk: int) -> None:
        from probe.reader.recording_columns import iter_step_columns, null_mask

        self._null_mask = null_mask
        self._it = iter_step_columns(rec, pid, chunk, only=_READ)
        self.buf: dict[str, np.ndarray] = {k: np.zeros(0, np.int64) for k in self._names()}
        self.done = False
        self.count = 0

    @staticmethod
    def _names() -> tuple[str, ...]:
        return (*_READ, "_no_launch", "_no_idle")

    def __len__(self) -> int:
        return len(self.buf["step"])

    def fill(self, want: int) -> None:
        """Read chunks until ``want`` rows are buffered or the rank has no more."""
        parts = [self.buf]
        n = len(self)
        while not self.done and n < want:
            cols = next(self._it, None)
            if cols is None:
                self.done = True
                break
            # copies: a view would hold the whole chunk (every column) alive
            part = {k: np.array(cols[k]) for k in _READ}
            part["_no_launch"] = self._null_mask(cols, "cpu_launch_overhead_ns").astype(np.int64)
            part["_no_idle"] = self._null_mask(cols, "gpu_idle_before_ns").astype(np.int64)
            parts.append(part)
            n += len(part["step"])
            self.count += len(part["step"])
        if len(parts) > 1:
            self.buf = {k: np.concatenate([p[k] for p in parts]) for k in self._names()}

    def take(self, upto: int | None) -> dict[str, np.ndarray]:
        """The buffered rows with step <= ``upto`` (None: all), removed from the buffer."""
        k = len(self) if upto is None else int(np.searchsorted(self.buf["step"], upto, "right"))
        out = {n: a[:k] for n, a in self.buf.items()}
        self.buf = {n: a[k:] for n, a in self.buf.items()}
        return out


class _Row:
    """The fields :func:`compare` reads of a step (the per-step path of a window whose
    values are too large for 64-bit arithmetic)."""

    def __init__(self, w: dict[str, np.ndarray], j: int) -> None:
        self.step = int(w["step"][j])
        self.t0 = int(w["t0_ns"][j])
        self.cpu_launch_overhead_ns = int(w["cpu_launch_overhead_ns"][j])
        self.gpu_idle_before_ns = None if w["_no_idle"][j] else int(w["gpu_idle_before_ns"][j])
        self.phases = {p: int(w[f"{p}_ns"][j]) for p in PHASES_BEFORE_FORWARD}


def _isum(a: np.ndarray) -> int:
    """The exact sum of non-negative int64 values (in Python integers where int64 could
    overflow)."""
    if len(a) == 0:
        return 0
    if int(a.max()) * len(a) < _I64:
        return int(a.sum())
    return sum(int(x) for x in a.tolist())


def _twice_median(ys: np.ndarray) -> np.ndarray:
    """Per row, twice the median of the sorted rows ``ys`` (in integers, as
    :func:`probe.analysis.ranks._lead` takes it)."""
    n = ys.shape[1]
    m = n // 2
    return 2 * ys[:, m] if n % 2 else ys[:, m - 1] + ys[:, m]


def _leads(v: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Per row, twice the lead of the ``last`` column over the median of the others."""
    rows = np.arange(len(v))
    others = v.copy()
    others[rows, last] = np.iinfo(np.int64).max  # sorts last, then dropped
    others.sort(axis=1)
    out: np.ndarray = 2 * v[rows, last] - _twice_median(others[:, :-1])
    return out


def _sorted(parts: Sequence[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def _pct_sorted(xs: np.ndarray, q: float) -> float | None:
    """:func:`probe.analysis.views.percentile` of sorted ``xs``, in the same arithmetic."""
    import math

    if len(xs) == 0:
        return None
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    a, b = int(xs[lo]), int(xs[hi])
    return float(a + (b - a) * (pos - lo))


class _Tally:
    """An engine's figures, summed window by window."""

    def __init__(self, n: int, cands: Sequence[str]) -> None:
        self.n, self.cands = n, list(cands)
        self.matched = self.within = self.wait = self.wait_steps = 0
        self.mismatches = self.no_launch = self.full = 0
        self.last = [0] * n
        self.phases = np.zeros((n, len(cands)), np.int64)
        self.mine: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.caused = [0] * n
        self.caused_n = [0] * n
        self.fl = [0] * n
        self.clo = [0] * n

    def one(self, last: int | None, skew: int, phase: str | None, wait: int | None) -> None:
        if last is None:
            self.within += 1
            return
        self.last[last] += 1
        self.phases[last, self.cands.index(phase or START)] += 1
        self.mine[last].append(np.array([skew], np.int64))
        if wait is not None:
            self.caused[last] += wait
            self.caused_n[last] += 1
            self.wait += wait
            self.wait_steps += 1


def _window(
    t: _Tally, ws: Sequence[dict[str, np.ndarray]], offsets: Sequence[int],
    shifts: Sequence[int], unc: int, sync_launch: bool,
) -> None:  # fmt: skip
    """The steps of one window: every rank's rows whose reference step is in it."""
    ref = ws[0]["step"]
    full = np.ones(len(ref), bool)
    idx = [np.arange(len(ref))]
    for w, off in zip(ws[1:], offsets[1:], strict=True):
        keys = ref + off
        i = np.searchsorted(w["step"], keys)
        ok = i < len(w["step"])
        ok[ok] = w["step"][i[ok]] == keys[ok]
        full &= ok
        idx.append(i)
    if not full.any():
        return
    t.full += int(full.sum())

    def cols(name: str) -> np.ndarray:
        return np.stack([w[name][i[full]] for w, i in zip(ws, idx, strict=True)], axis=1)

    tok, req = cols("num_tokens"), cols("num_reqs")
    t.mismatches += int(((tok[:, 1:] != tok[:, :1]) | (req[:, 1:] != req[:, :1])).any(axis=1).sum())
    launch = ~cols("_no_launch").astype(bool).any(axis=1)
    t.no_launch += int((~launch).sum())
    if not launch.any():
        return
    v = {
        name: cols(name)[launch]
        for name in ("step", "t0_ns", "cpu_launch_overhead_ns", "gpu_idle_before_ns",
                     "_no_idle", *_PHASES)
    }  # fmt: skip
    m = len(v["step"])
    t.matched += m
    for r in range(t.n):
        t.fl[r] += _isum(v[f"{FL}_ns"][:, r])
        t.clo[r] += _isum(v["cpu_launch_overhead_ns"][:, r])
    big = max(abs(x) for x in shifts) + sum(int(v[k].max()) for k in v if k != "step")
    if 2 * (t.n + 3) * big >= _I64:  # past 64-bit arithmetic: step by step, in Python integers
        per_rank = [{k: a[:, r] for k, a in v.items()} for r in range(t.n)]
        for j in range(m):
            steps = [_Row(w, j) for w in per_rank]
            sr = compare(steps, shifts, uncertainty_ns=unc, sync_launch=sync_launch)  # type: ignore[arg-type]
            if sr is not None:  # always: every rank has a launch time here
                t.one(sr.last, sr.skew_ns, sr.phase, sr.wait_ns)
        return
    rows = np.arange(m)
    starts = v["t0_ns"] + np.asarray(shifts, np.int64)[None, :]
    fl = v[f"{FL}_ns"]
    ends = starts + v["cpu_launch_overhead_ns"] - (fl if sync_launch else 0)
    last = np.argmax(ends, axis=1)  # the first of equal arrivals, as compare takes it
    # the others are every arrival but one copy of the latest
    d = 2 * ends[rows, last] - _twice_median(np.sort(ends, axis=1)[:, :-1])
    skew = np.round(d.astype(np.float64) / 2).astype(np.int64)
    named = skew > unc
    t.within += int((~named).sum())
    if not named.any():
        return
    last, skew, ends = last[named], skew[named], ends[named]
    lead = [_leads(starts[named], last)]
    lead += [_leads(v[f"{p}_ns"][named], last) for p in t.cands[1:]]
    phase = np.argmax(np.stack([x.astype(np.float64) / 2 for x in lead], axis=1), axis=1)
    rows = np.arange(len(last))
    if sync_launch:
        wait = t.n * ends[rows, last] - ends.sum(axis=1)
        has = np.ones(len(last), bool)
    else:
        idle = v["gpu_idle_before_ns"][named][rows, last]
        has = v["_no_idle"][named][rows, last] == 0
        wait = np.minimum(ends[rows, last][:, None] - ends, idle[:, None]).sum(axis=1)
    k = len(t.cands)
    t.phases += np.bincount(last * k + phase, minlength=t.n * k).reshape(t.n, k)
    for r in range(t.n):
        mine = last == r
        t.last[r] += int(mine.sum())
        t.mine[r].append(skew[mine])
        w = mine & has
        t.caused[r] += _isum(wait[w])
        t.caused_n[r] += int(w.sum())
    t.wait += _isum(wait[has])
    t.wait_steps += int(has.sum())


def engine_ranks_of_columns(
    rec: Any,
    ranks: Sequence[RankInput],
    *,
    epoch_sync_ns: int = DEFAULT_EPOCH_SYNC_NS,
    sync_launch: bool = False,
    chunk: int = RANKS_CHUNK_ROWS,
) -> EngineRanks:
    """:func:`probe.analysis.ranks.engine_ranks` of ``ranks`` (their ``steps`` unused: each
    rank's are read from ``rec``'s columns by pid), equal to it field for field."""
    if len(ranks) < 2:
        raise ValueError("ranks side by side need at least two ranks")
    streams = [_Stream(rec, r.rank.pid, max(chunk, ALIGN_WINDOW)) for r in ranks]
    for s in streams:
        s.fill(ALIGN_WINDOW)
    prefixes = [
        [
            _Batch(int(a), int(b), int(c))
            for a, b, c in zip(
                s.buf["step"][:ALIGN_WINDOW].tolist(),
                s.buf["num_tokens"][:ALIGN_WINDOW].tolist(),
                s.buf["num_reqs"][:ALIGN_WINDOW].tolist(),
                strict=True,
            )
        ]
        for s in streams
    ]
    offsets, how = align_offsets(prefixes)
    shifts, unc, clock = clock_shifts(ranks, epoch_sync_ns)
    cands = [START, *(p for p in PHASES_BEFORE_FORWARD if not (sync_launch and p == FL))]
    t = _Tally(len(ranks), cands)
    while True:
        for s in streams:
            s.fill(chunk)
        open_ = [(s, off) for s, off in zip(streams, offsets, strict=True) if not s.done]
        # every reference step up to the cut has each rank's rows read (or none left)
        cut = min(int(s.buf["step"][-1]) - off for s, off in open_) if open_ else None
        ws = [
            s.take(None if cut is None else cut + off)
            for s, off in zip(streams, offsets, strict=True)
        ]
        if len(ws[0]["step"]):
            _window(t, ws, offsets, shifts, unc, sync_launch)
        if cut is None:
            break
    unmatched = tuple(s.count - t.full for s in streams)
    named = sum(t.last)
    skews = _sorted([a for m in t.mine for a in m])
    figures = tuple(
        RankFigures(
            rank=r.rank,
            last=t.last[i],
            share=t.last[i] / named if named else None,
            phases=tuple(
                sorted(
                    ((c, int(t.phases[i, j])) for j, c in enumerate(cands) if t.phases[i, j]),
                    key=lambda kv: (-kv[1], kv[0]),
                )
            ),
            skew_p50_ns=_pct_sorted(_sorted(t.mine[i]), 50),
            wait_caused_ns=t.caused[i],
            wait_steps=t.caused_n[i],
            mean_forward_launch_ns=t.fl[i] / t.matched if t.matched else None,
            mean_cpu_launch_overhead_ns=t.clo[i] / t.matched if t.matched else None,
        )
        for i, r in enumerate(ranks)
    )
    return EngineRanks(
        dp_rank=ranks[0].rank.dp_rank,
        ranks=figures,
        offsets=offsets,
        alignment=how,
        arrival=ARRIVAL[sync_launch],
        matched=t.matched,
        unmatched=unmatched,
        batch_mismatches=t.mismatches,
        no_launch=t.no_launch,
        clock=clock,
        uncertainty_ns=unc,
        within_uncertainty=t.within,
        skew_p50_ns=_pct_sorted(skews, 50),
        skew_p90_ns=_pct_sorted(skews, 90),
        skew_p99_ns=_pct_sorted(skews, 99),
        skew_max_ns=int(skews[-1]) if len(skews) else None,
        wait_ns=t.wait,
        wait_steps=t.wait_steps,
        verdict=rank_verdict(figures, named),
    )


def dp_rank_of_columns(rec: Any, r: RankInput) -> DpRank:
    """:func:`probe.analysis.ranks.dp_rank` of ``r``, from ``rec``'s columns of its pid."""
    from probe.reader.recording_columns import iter_step_columns, null_mask

    n = fe = fe_h = fe_g = pad = pad_h = pad_g = 0
    for cols in iter_step_columns(rec, r.rank.pid):
        gpu = np.where(null_mask(cols, "gpu_busy_ns"), 0, cols["gpu_busy_ns"])
        forced = cols["reason"] == int(Reason.FORCED_EAGER)
        padded = cols["padded_tokens"] > cols["num_tokens"]
        n += len(forced)
        fe += int(forced.sum())
        fe_h += _isum(cols["host_ns"][forced])
        fe_g += _isum(gpu[forced])
        pad += int(padded.sum())
        pad_h += _isum(cols["host_ns"][padded])
        pad_g += _isum(gpu[padded])
    return DpRank(r.rank, n, fe, fe_h, fe_g, pad, pad_h, pad_g, sum(r.outside.values()))


def ranks_of_recording(rec: Any, *, epoch_sync_ns: int = DEFAULT_EPOCH_SYNC_NS) -> RanksSummary:
    """A :class:`probe.reader.recording.Recording`'s workers side by side: one engine per
    data-parallel rank, ranks in (pp, tp) order, all on the recording's host;
    ``sync_launch`` where the workers run on the CPU platform. With several data-parallel
    ranks, each rank's data-parallel costs too. Equal to
    :func:`probe.analysis.ranks.ranks_summary` over the recording's Steps."""
    rr = recording_ranks(rec)
    engines = tuple(
        engine_ranks_of_columns(rec, e, epoch_sync_ns=epoch_sync_ns, sync_launch=rr.sync_launch)
        for e in rr.engines
    )
    dp = (
        tuple(dp_rank_of_columns(rec, r) for e in rr.by_dp.values() for r in e)
        if len(rr.by_dp) > 1
        else ()
    )
    return RanksSummary(engines, dp)
