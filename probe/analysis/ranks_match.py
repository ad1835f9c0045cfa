"""The one matching of an engine's ranks side by side, over columns: each rank's steps as
arrays (a recording's columns, :func:`probe.reader.recording_columns.iter_step_columns`, or
Steps turned into the same columns, :func:`step_columns`), read a window of step numbers at
a time (:func:`windows`), paired by step number and offset (:func:`match_window`), and per
matched step the last rank, its skew, the phase behind it and the others' wait
(:func:`match_rows`), by the rules :mod:`probe.analysis.ranks` states.
:func:`probe.analysis.ranks.engine_ranks`, :func:`probe.analysis.ranks.per_step`,
:func:`probe.analysis.ranks.compare` (one step, the live matcher's) and
:func:`probe.analysis.ranks_columns.engine_ranks_of_columns` all read their figures here.

    >>> import numpy as np
    >>> v = {k: np.array([[0, 0]]) for k in READ}
    >>> v["t0_ns"] = np.array([[0, 500]])
    >>> v["cpu_launch_overhead_ns"] = np.array([[1000, 1000]])
    >>> m = match_rows(v | {NO_IDLE: np.array([[1, 1]])}, [0, 0], 0, False, candidates(False))
    >>> int(m.last[0]), int(m.skew[0]), m.cands[int(m.phase[0])]
    (1, 500, 'start')

Arithmetic: in 64-bit integers where a window's values leave room, else in Python
integers (object arrays), with the same results: twice a median in integers, a lead
halved as a float (the lead over a median of two is a half), rounded half to even.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from probe.step import Step

#: the phases that run before a step's forward is fully enqueued (the ones that can make a
#: rank late for the step's collectives); logits, sample and draft run after it and show
#: as a later ``start`` of the next step
PHASES_BEFORE_FORWARD = (
    "reorder",
    "prepare_inputs",
    "dispatch",
    "metadata_build",
    "forward_launch",
    "sync_stall",
)
START = "start"
FL = "forward_launch"
PHASE_COLUMNS = tuple(f"{p}_ns" for p in PHASES_BEFORE_FORWARD)
#: the step columns matching reads
READ = ("step", "t0_ns", "cpu_launch_overhead_ns", "gpu_idle_before_ns", "num_tokens",
        "num_reqs", *PHASE_COLUMNS)  # fmt: skip
#: besides :data:`READ`: 1 where a step has no launch time (no forward) or no device timing
NO_LAUNCH, NO_IDLE = "no_launch", "no_idle"
_I64 = 2**63


def candidates(sync_launch: bool) -> list[str]:
    """The phases that can be behind a late rank: ``start`` and those before the forward
    (not the forward launch itself where it runs the model: ``sync_launch``)."""
    return [START, *(p for p in PHASES_BEFORE_FORWARD if not (sync_launch and p == FL))]


def step_columns(steps: Sequence[Step]) -> dict[str, np.ndarray]:
    """The columns matching reads (:data:`READ`, :data:`NO_LAUNCH`, :data:`NO_IDLE`) of
    Steps, as a recording's columns hold them (a missing value 0, flagged)."""

    def col(vals: Iterable[int]) -> np.ndarray:
        return np.array(list(vals), dtype=np.int64)

    out = {
        "step": col(s.step for s in steps),
        "t0_ns": col(s.t0 for s in steps),
        "cpu_launch_overhead_ns": col(s.cpu_launch_overhead_ns or 0 for s in steps),
        "gpu_idle_before_ns": col(s.gpu_idle_before_ns or 0 for s in steps),
        "num_tokens": col(s.num_tokens for s in steps),
        "num_reqs": col(s.num_reqs for s in steps),
        NO_LAUNCH: col(s.cpu_launch_overhead_ns is None for s in steps),
        NO_IDLE: col(s.gpu_idle_before_ns is None for s in steps),
    }
    for p, c in zip(PHASES_BEFORE_FORWARD, PHASE_COLUMNS, strict=True):
        out[c] = col(s.phases.get(p, 0) for s in steps)
    return out


def step_chunks(steps: Iterable[Step], chunk: int) -> Iterator[dict[str, np.ndarray]]:
    """:func:`step_columns` of ``steps``, ``chunk`` at a time."""
    it = iter(steps)
    while True:
        rows = [s for _, s in zip(range(chunk), it, strict=False)]
        if not rows:
            return
        yield step_columns(rows)


class Stream:
    """One rank's columns in step order, buffered a chunk ahead (``chunks``: dicts of
    :data:`READ`, :data:`NO_LAUNCH` and :data:`NO_IDLE`), held as one matrix: a row per
    column (:data:`NAMES`), a column per step."""

    NAMES = (*READ, NO_LAUNCH, NO_IDLE)
    #: each name's row
    AT: ClassVar[dict[str, int]] = {name: i for i, name in enumerate(NAMES)}

    def __init__(self, chunks: Iterator[Mapping[str, np.ndarray]]) -> None:
        self._it = chunks
        self.rows = np.zeros((len(self.NAMES), 0), np.int64)
        self.done = False
        self.count = 0

    def __len__(self) -> int:
        return int(self.rows.shape[1])

    @property
    def buf(self) -> dict[str, np.ndarray]:
        """The buffered steps, a column per name."""
        return {name: self.rows[i] for i, name in enumerate(self.NAMES)}

    def fill(self, want: int) -> None:
        """Read chunks until ``want`` rows are buffered or the rank has no more."""
        parts = [self.rows]
        n = len(self)
        while not self.done and n < want:
            cols = next(self._it, None)
            if cols is None:
                self.done = True
                break
            # one copy: a view would hold the whole chunk (every column) alive
            part = np.array([cols[k] for k in self.NAMES], dtype=np.int64)
            parts.append(part)
            n += part.shape[1]
            self.count += part.shape[1]
        if len(parts) > 1:
            self.rows = np.concatenate(parts, axis=1)

    def take(self, upto: int | None) -> np.ndarray:
        """The buffered rows with step <= ``upto`` (None: all), removed from the buffer."""
        k = len(self) if upto is None else int(np.searchsorted(self.rows[0], upto, "right"))
        out, self.rows = self.rows[:, :k], self.rows[:, k:]
        return out


def windows(
    streams: Sequence[Stream], offsets: Sequence[int], chunk: int
) -> Iterator[list[np.ndarray]]:
    """Every rank's rows a window at a time (each rank's as :class:`Stream` holds them):
    those whose reference step (the first rank's, less the rank's offset) is up to a cut
    that every rank has read past (or has no more rows)."""
    while True:
        for s in streams:
            s.fill(chunk)
        open_ = [(s, off) for s, off in zip(streams, offsets, strict=True) if not s.done]
        cut = min(int(s.rows[0, -1]) - off for s, off in open_) if open_ else None
        ws = [
            s.take(None if cut is None else cut + off)
            for s, off in zip(streams, offsets, strict=True)
        ]
        if ws[0].shape[1]:
            yield ws
        if cut is None:
            return


@dataclass
class Paired:
    """A window's steps paired across the ranks: ``full`` reference steps every rank has,
    ``mismatches`` of them with batches that differ, ``no_launch`` of them where a rank
    has no launch time, and the others' columns (rows: steps; columns: ranks)."""

    full: int
    mismatches: int
    no_launch: int
    cols: dict[str, np.ndarray]


#: the columns of a :class:`Paired` window
PAIRED = ("step", "t0_ns", "cpu_launch_overhead_ns", "gpu_idle_before_ns", NO_IDLE,
          *PHASE_COLUMNS)  # fmt: skip


def match_window(ws: Sequence[np.ndarray], offsets: Sequence[int]) -> Paired:
    """Pair a window's rows (each rank's as :class:`Stream` holds them) by step number and
    offset (see :func:`windows`)."""
    at = Stream.AT
    ref = ws[0][at["step"]]
    full = np.ones(len(ref), bool)
    idx = [np.arange(len(ref))]
    for w, off in zip(ws[1:], offsets[1:], strict=True):
        steps = w[at["step"]]
        keys = ref + off
        i = np.searchsorted(steps, keys)
        ok = i < len(steps)
        ok[ok] = steps[i[ok]] == keys[ok]
        full &= ok
        idx.append(i)
    # each matched step's row in the ranks' windows side by side: (step, rank)
    start = np.cumsum([0, *(w.shape[1] for w in ws[:-1])])
    grid = np.stack([i[full] for i in idx], axis=1) + start
    side = np.concatenate(ws, axis=1)

    def gather(names: Sequence[str], at_steps: np.ndarray) -> np.ndarray:
        """The columns ``names`` at ``at_steps``, in one read: (column, step, rank)."""
        out = np.empty((len(names), *at_steps.shape), np.int64)
        for j, n in enumerate(names):
            np.take(side[at[n]], at_steps, out=out[j])
        return out

    tok, req, no_launch = gather(("num_tokens", "num_reqs", NO_LAUNCH), grid)
    mismatches = int(((tok[:, 1:] != tok[:, :1]) | (req[:, 1:] != req[:, :1])).any(axis=1).sum())
    launch = ~no_launch.astype(bool).any(axis=1)
    both = gather(PAIRED, grid[launch])
    return Paired(
        int(full.sum()),
        mismatches,
        int((~launch).sum()),
        {n: both[j] for j, n in enumerate(PAIRED)},
    )


@dataclass
class Rows:
    """Per matched step (rows of the ranks' columns): each rank's start and arrival on
    the common clock, the last rank (-1: within the clock uncertainty) and its skew, the
    phase behind it (an index into ``cands``; -1 with no last rank) and its excess, and
    the others' wait (``has_wait``: a figure there)."""

    cands: list[str]
    start: np.ndarray
    end: np.ndarray
    last: np.ndarray
    skew: np.ndarray
    phase: np.ndarray
    excess: np.ndarray
    wait: np.ndarray
    has_wait: np.ndarray


def _twice_median(ys: np.ndarray) -> np.ndarray:
    """Per row, twice the median of ``ys`` sorted along their last axis (in integers)."""
    n = ys.shape[-1]
    m = n // 2
    out: np.ndarray = 2 * ys[..., m] if n % 2 else ys[..., m - 1] + ys[..., m]
    return out


def _leads(v: np.ndarray, last: np.ndarray, top: Any) -> np.ndarray:
    """Per figure and row of ``v`` (figure, row, rank), twice the lead of the ``last``
    rank over the median of the others (``top``: a value above every other, sorted last
    and dropped)."""
    rows = np.arange(v.shape[1])
    others = v.copy()
    others[:, rows, last] = top
    others.sort(axis=-1)
    out: np.ndarray = 2 * v[:, rows, last] - _twice_median(others[..., :-1])
    return out


def _halved(twice: np.ndarray) -> np.ndarray:
    """Twice a lead, halved (a float, as the lead over a median of two can be a half)."""
    out: np.ndarray = twice.astype(np.float64) / 2
    return out


def match_rows(
    v: Mapping[str, np.ndarray],
    shifts: Sequence[int],
    unc: int,
    sync_launch: bool,
    cands: Sequence[str],
) -> Rows:
    """The rules of :mod:`probe.analysis.ranks` over matched steps ``v`` (each column: a
    row per step, a column per rank; every rank with a launch time): the arrival
    (``t0 + cpu_launch_overhead_ns``, less the forward launch under ``sync_launch``, on
    the clock ``shifts`` give), the last rank (the latest arrival, the first listed on a
    tie), its skew (its lead over the median of the others' arrivals, rounded), named
    where over ``unc``; the phase behind it (of ``cands``, the first of the largest leads
    over the others' median) and the others' wait."""
    n = v["t0_ns"].shape[1]
    m = len(v["t0_ns"])
    top: Any = np.iinfo(np.int64).max
    big = max(abs(x) for x in shifts) + sum(int(np.abs(v[k]).max()) for k in v if k != "step" and m)
    if 2 * (n + 3) * big >= _I64:  # past 64-bit arithmetic: in Python integers
        v = {k: a.astype(object) for k, a in v.items()}
        sh = np.array([int(x) for x in shifts], dtype=object)
        top = float("inf")
    else:
        sh = np.asarray(shifts, np.int64)
    rows = np.arange(m)
    starts = v["t0_ns"] + sh[None, :]
    fl = v[f"{FL}_ns"]
    ends = starts + v["cpu_launch_overhead_ns"] - (fl if sync_launch else 0)
    last = np.argmax(ends, axis=1).astype(np.int64)  # the first of equal arrivals
    # the others are every arrival but one copy of the latest
    d = 2 * ends[rows, last] - _twice_median(np.sort(ends, axis=1)[:, :-1])
    skew = np.round(_halved(d)).astype(np.int64)
    named = skew > unc
    lead = _leads(np.stack([starts, *(v[f"{p}_ns"] for p in cands[1:])]), last, top)
    halves = _halved(lead).T
    phase = np.argmax(halves, axis=1).astype(np.int64)  # the first of equal leads
    excess = np.round(halves[rows, phase]).astype(np.int64)
    at_last = ends[rows, last]
    if sync_launch:
        wait = n * at_last - ends.sum(axis=1)
        has = np.ones(m, bool)
    else:
        idle = v["gpu_idle_before_ns"][rows, last]
        has = v[NO_IDLE][rows, last] == 0
        wait = np.minimum(at_last[:, None] - ends, idle[:, None]).sum(axis=1)
    return Rows(
        list(cands),
        starts,
        ends,
        np.where(named, last, -1),
        skew,
        np.where(named, phase, -1),
        np.where(named, excess, 0),
        wait,
        has & named,
    )
