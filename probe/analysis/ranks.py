"""Who holds the step: one engine's ranks side by side.

Under tensor (and pipeline) parallelism every rank is its own worker process with its own
host thread, and every step ends in collectives: the rank whose host is last to finish
enqueuing its forward sets the step for all of them while the others' GPUs wait. This
module matches one engine's workers step by step and says, per step, which rank was last,
by how much, and which phase made it late.

    >>> from probe.reader.recording import Recording, default_recording
    >>> from probe.analysis.ranks_columns import ranks_of_recording
    >>> ranks_of_recording(Recording.open(default_recording())).engines  # one worker: none
    ()

The matching itself is :mod:`probe.analysis.ranks_match`'s, over columns: Steps are turned
into them here, a recording's are read as they are by :mod:`probe.analysis.ranks_columns`.

Definitions (the report prints them with the numbers):

- a rank's **enqueue end** is ``t0 + cpu_launch_overhead_ns``: the moment its forward's
  device work was fully enqueued, on the aligned clock (below). Where the forward call
  runs the model itself (a CPU engine: ``sync_launch``), its collectives block until every
  rank has arrived, so the call ends together on all ranks and the early ones' wait is
  inside it; there a rank's arrival is its forward's start
  (``t0 + cpu_launch_overhead_ns - forward_launch``) and ``forward_launch`` is no
  candidate phase;
- the **last rank** of a step is the one whose enqueue end is latest; its **skew** is its
  lead over the median enqueue end of the other ranks;
- the **phase behind it** is the candidate whose time on the last rank exceeds the
  median of the other ranks by most: ``start`` (the step began later on that rank: its
  previous step's tail or its wait for the batch) or one of the phases up to the forward
  launch (:data:`PHASES_BEFORE_FORWARD`);
- the others' **GPU wait** attributable to it is the sum, over the other ranks, of the
  time the step's collectives waited for the last rank's device: its lead over each
  other rank, but no more than its own device sat idle waiting for its host before the
  step (``gpu_idle_before_ns``: a host that is late while its device is still busy with
  earlier work holds nobody). Steps without device timing have no such figure. Under
  ``sync_launch`` the early ranks' wait is inside their forward call: the lead itself.

Matching. The probe numbers steps per process from the moment it was enabled, so ranks
enabled one step apart carry step numbers one apart. Tensor- and pipeline-parallel ranks of
one engine run the same batches, so the offset is read from the batches themselves: the
offset (within :data:`MAX_OFFSET`) under which the first :data:`ALIGN_WINDOW` steps agree
on (tokens, requests) is taken when it matches at least :data:`ALIGN_MIN_AGREE` of them
and more than plain step numbers do; otherwise step numbers are used as they are. Pairs
whose batches still disagree are counted (``batch_mismatches``).

Clocks. Ranks on one host share CLOCK_BOOTTIME: no alignment, no uncertainty. Ranks on
several hosts are put on the Unix epoch through each process's recorded (BOOTTIME, epoch)
pair; the uncertainty is the hosts' wall-clock agreement (``epoch_sync_ns``, an input:
what chrony/PTP reports for the hosts) plus each pair's read window. A step whose skew is
not larger than that uncertainty names no last rank (``within_uncertainty``).

Memory: steps are streamed per rank in step order, as columns a chunk
(:data:`RANKS_CHUNK_ROWS`) at a time; what is held is at most two chunks per rank, one
skew figure per matched step that names a last rank (8 bytes, for exact percentiles) and
counters per rank and phase.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from probe.analysis import ranks_match
from probe.analysis.order_stats import Values, order_stats, percentile
from probe.analysis.ranks_match import FL, PHASES_BEFORE_FORWARD, START
from probe.records import Reason
from probe.step import Step

__all__ = [
    "ALIGN_WINDOW",
    "DEFAULT_EPOCH_SYNC_NS",
    "MAX_OFFSET",
    "PHASES_BEFORE_FORWARD",
    "RANKS_CHUNK_ROWS",
    "VERDICT_RULE",
    "DpRank",
    "EngineRanks",
    "Matching",
    "RankFigures",
    "RankId",
    "RankInput",
    "RanksSummary",
    "RecordingRanks",
    "StepRanks",
    "align_offsets",
    "compare",
    "compare_many",
    "dp_costs",
    "engine_figures",
    "engine_ranks",
    "exact_sum",
    "matched",
    "matching",
    "per_step",
    "ranks_summary",
    "recording_ranks",
]

ARRIVAL = {
    False: "enqueue end: t0 + cpu_launch_overhead_ns",
    True: "forward start: t0 + cpu_launch_overhead_ns - forward_launch "
    "(the forward call runs the model and its collectives wait for every rank)",
}
ALIGN_WINDOW = 256
#: rows per rank read at a time while matching (a window holds at most two per rank)
RANKS_CHUNK_ROWS = 8192
MAX_OFFSET = 8
ALIGN_MIN_AGREE = 0.9
#: steps each rank holds before a live matcher reads the offsets
LIVE_ALIGN = 32
#: the hosts' wall clocks are taken to agree within this (NTP on a LAN); pass what
#: ``chronyc tracking`` or PTP reports for the hosts instead
DEFAULT_EPOCH_SYNC_NS = 1_000_000
#: a pair whose read window cannot be told from the record counts this much
_PAIR_WINDOW_UNKNOWN_NS = 1_000_000
SIGMAS = 3.0
VERDICT_RULE = (
    f"a rank holds more than its share when it is last on more than 1/n of the steps "
    f"(n ranks) by over {SIGMAS:g} standard errors of a fair draw: "
    f"share > 1/n + {SIGMAS:g}*sqrt((1/n)(1-1/n)/N), N the steps that name a last rank"
)


@dataclass(frozen=True)
class RankId:
    """One worker process of an engine."""

    pid: int
    tp_rank: int = 0
    pp_rank: int = 0
    dp_rank: int = 0
    host: str = ""

    @property
    def label(self) -> str:
        base = f"tp{self.tp_rank}" + (f"/pp{self.pp_rank}" if self.pp_rank else "")
        return base + (f"/dp{self.dp_rank}" if self.dp_rank else "")


@dataclass(frozen=True)
class RankInput:
    """A rank's steps (in step order) and its process's recorded clock pair."""

    rank: RankId
    steps: Iterable[Step]
    boottime_ns: int | None = None
    epoch_ns: int | None = None
    perf_counter_ns: int | None = None
    outside: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StepRanks:
    """One matched step across an engine's ranks (tuples in the engine's rank order).

    ``step`` is the first rank's step number, ``steps`` each rank's; ``start_ns`` each
    rank's step start and ``end_ns`` each
    rank's arrival (its enqueue end, or its forward's start under ``sync_launch``) on the
    aligned clock. ``last`` is an index into the ranks, None
    when the skew is within the clock uncertainty; ``phase`` and ``phase_excess_ns`` say
    what made it late; ``wait_ns`` is the other ranks' wait attributable to it.
    """

    step: int
    steps: tuple[int, ...]
    start_ns: tuple[int, ...]
    end_ns: tuple[int, ...]
    forward_launch_ns: tuple[int, ...]
    cpu_launch_overhead_ns: tuple[int, ...]
    last: int | None
    skew_ns: int
    phase: str | None
    phase_excess_ns: int
    wait_ns: int | None


@dataclass(frozen=True)
class RankFigures:
    """One rank of an engine over its matched steps."""

    rank: RankId
    last: int
    share: float | None
    phases: tuple[tuple[str, int], ...]
    """when last: how often each phase was behind it, most frequent first"""
    skew_p50_ns: float | None
    """the rank's skew on the steps it was last"""
    wait_caused_ns: int
    """the others' wait attributable to this rank, over ``wait_steps``"""
    wait_steps: int
    """the steps it was last that have a wait figure (device timing, or ``sync_launch``)"""
    mean_forward_launch_ns: float | None
    mean_cpu_launch_overhead_ns: float | None


@dataclass(frozen=True)
class EngineRanks:
    """One engine's workers side by side (one data-parallel rank's TP x PP workers)."""

    dp_rank: int
    ranks: tuple[RankFigures, ...]
    offsets: tuple[int, ...]
    """each rank's step number minus the first rank's, for the same batch"""
    alignment: str
    arrival: str
    """what a rank's arrival at the step is (the enqueue end, or the forward's start)"""
    matched: int
    unmatched: tuple[int, ...]
    """each rank's steps that matched no step of the others"""
    batch_mismatches: int
    no_launch: int
    """matched steps where a rank had no launch time (no forward)"""
    clock: str
    uncertainty_ns: int
    within_uncertainty: int
    skew_p50_ns: float | None
    skew_p90_ns: float | None
    skew_p99_ns: float | None
    skew_max_ns: int | None
    wait_ns: int
    """the others' wait attributable to the last rank, summed over ``wait_steps``"""
    wait_steps: int
    verdict: str | None
    rule: str = VERDICT_RULE


@dataclass(frozen=True)
class DpRank:
    """A rank's steps that data parallelism costs: forced-eager steps (the DP sync forces
    eager when ranks disagree), padded steps (padded tokens above the real ones), with
    their host and device time; and its dummy runs, tallied as records outside steps (the
    probe records no time for them)."""

    rank: RankId
    steps: int
    forced_eager: int
    forced_eager_host_ns: int
    forced_eager_gpu_ns: int
    padded: int
    padded_host_ns: int
    padded_gpu_ns: int
    outside_records: int


@dataclass(frozen=True)
class RanksSummary:
    engines: tuple[EngineRanks, ...]
    dp: tuple[DpRank, ...]

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the report's ``--json``)."""
        from dataclasses import asdict

        return {
            "engines": [
                asdict(e) | {"labels": [r.rank.label for r in e.ranks]} for e in self.engines
            ],
            "dp": [asdict(d) | {"label": d.rank.label} for d in self.dp],
        }


# -- matching ----------------------------------------------------------------------------------


class Batched(Protocol):
    """What matching reads of a step: its number and its batch (a :class:`Step` is one)."""

    @property
    def step(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_reqs(self) -> int: ...


def _batch(s: Batched) -> tuple[int, int]:
    return (s.num_tokens, s.num_reqs)


def align_offsets(prefixes: Sequence[Sequence[Batched]]) -> tuple[tuple[int, ...], str]:
    """Each rank's step-number offset from the first rank, read from the batches of the
    first steps (see the module's Matching), and how it was decided."""
    ref = {s.step: _batch(s) for s in prefixes[0]}
    offsets = [0]
    moved = False
    for pre in prefixes[1:]:
        mine = {s.step: _batch(s) for s in pre}

        def agree(d: int, mine: dict[int, tuple[int, int]] = mine) -> tuple[float, int]:
            pairs = [(b, mine.get(k + d)) for k, b in ref.items() if k + d in mine]
            hits = sum(1 for b, m in pairs if b == m)
            return (hits / len(pairs) if pairs else 0.0), len(pairs)

        score0, _ = agree(0)
        best, (score, _) = max(
            ((d, agree(d)) for d in range(-MAX_OFFSET, MAX_OFFSET + 1)),
            key=lambda x: (x[1][0], -abs(x[0])),
        )
        if best != 0 and score >= ALIGN_MIN_AGREE and score > score0:
            offsets.append(best)
            moved = True
        else:
            offsets.append(0)
    how = (
        "by batch contents (step numbers differ: the ranks were enabled at different steps)"
        if moved
        else "by step number"
    )
    return tuple(offsets), how


def _pair_window(r: RankInput) -> int:
    if r.boottime_ns is None or r.perf_counter_ns is None:
        return _PAIR_WINDOW_UNKNOWN_NS
    # hello reads BOOTTIME, then the epoch, then perf_counter (MONOTONIC): with no suspend
    # since boot the two monotonic clocks agree, so their difference bounds the window
    d = r.perf_counter_ns - r.boottime_ns
    return d if 0 <= d < _PAIR_WINDOW_UNKNOWN_NS else _PAIR_WINDOW_UNKNOWN_NS


def clock_shifts(ranks: Sequence[RankInput], epoch_sync_ns: int) -> tuple[list[int], int, str]:
    """Per rank the shift onto the common clock, the uncertainty, and the method."""
    hosts = {r.rank.host for r in ranks}
    if len(hosts) <= 1:
        return [0] * len(ranks), 0, "one host: shared CLOCK_BOOTTIME"
    missing = [r.rank.label for r in ranks if r.boottime_ns is None or r.epoch_ns is None]
    if missing:
        raise ValueError(f"ranks on several hosts, but no clock pair for {', '.join(missing)}")
    shifts = [int(r.epoch_ns or 0) - int(r.boottime_ns or 0) for r in ranks]
    windows = sorted((_pair_window(r) for r in ranks), reverse=True)
    unc = epoch_sync_ns + windows[0] + (windows[1] if len(windows) > 1 else 0)
    return (
        shifts,
        unc,
        f"{len(hosts)} hosts: aligned by each process's (BOOTTIME, epoch) pair, "
        f"uncertainty {unc / 1e3:,.1f} us (wall clocks within {epoch_sync_ns / 1e3:,.1f} us "
        "plus the pairs' read windows)",
    )


def compare(
    steps: Sequence[Step],
    shifts: Sequence[int] | None = None,
    *,
    uncertainty_ns: int = 0,
    sync_launch: bool = False,
) -> StepRanks | None:
    """One step of every rank of an engine (in the engine's rank order), side by side;
    None when a rank has no launch time (no forward). ``shifts`` put each rank's BOOTTIME
    on the common clock (none: one host). The live matcher's, one matched step of
    :func:`probe.analysis.ranks_match.match_rows`."""
    return compare_many([steps], shifts, uncertainty_ns=uncertainty_ns, sync_launch=sync_launch)[0]


def compare_many(
    matched: Sequence[Sequence[Step]],
    shifts: Sequence[int] | None = None,
    *,
    uncertainty_ns: int = 0,
    sync_launch: bool = False,
) -> list[StepRanks | None]:
    """:func:`compare` of each of ``matched`` (steps of the same ranks), as one matrix of
    :func:`probe.analysis.ranks_match.match_rows` (its rows are independent)."""
    out: list[StepRanks | None] = [None] * len(matched)
    keep = [
        i
        for i, steps in enumerate(matched)
        if all(s.cpu_launch_overhead_ns is not None for s in steps)
    ]
    if not keep:
        return out
    n = len(matched[keep[0]])
    cols = ranks_match.step_columns([s for i in keep for s in matched[i]])
    v = {k: a.reshape(len(keep), n) for k, a in cols.items()}
    sh = list(shifts) if shifts is not None else [0] * n
    cands = ranks_match.candidates(sync_launch)
    rows = ranks_match.match_rows(v, sh, uncertainty_ns, sync_launch, cands)
    for i, sr in zip(keep, _step_ranks(v, rows), strict=True):
        out[i] = sr
    return out


def _step_ranks(v: Mapping[str, np.ndarray], m: ranks_match.Rows) -> Iterator[StepRanks]:
    """Each matched step of ``m`` (over the columns ``v``) as a :class:`StepRanks`."""
    steps = v["step"].tolist()
    fl = v[f"{FL}_ns"].tolist()
    clo = v["cpu_launch_overhead_ns"].tolist()
    start, end = m.start.tolist(), m.end.tolist()
    for j, (last, skew, phase, excess, wait, has) in enumerate(
        zip(
            m.last.tolist(), m.skew.tolist(), m.phase.tolist(), m.excess.tolist(),
            m.wait.tolist(), m.has_wait.tolist(), strict=True,
        )
    ):  # fmt: skip
        yield StepRanks(
            step=int(steps[j][0]),
            steps=tuple(int(x) for x in steps[j]),
            start_ns=tuple(int(x) for x in start[j]),
            end_ns=tuple(int(x) for x in end[j]),
            forward_launch_ns=tuple(int(x) for x in fl[j]),
            cpu_launch_overhead_ns=tuple(int(x) for x in clo[j]),
            last=None if last < 0 else int(last),
            skew_ns=int(skew),
            phase=None if phase < 0 else m.cands[phase],
            phase_excess_ns=int(excess),
            wait_ns=int(wait) if has else None,
        )


@dataclass
class Matching:
    """An engine's ranks set up for matching: each rank's stream of columns, the offsets
    read from their first steps, the clock shifts and the facts of both."""

    streams: list[ranks_match.Stream]
    offsets: tuple[int, ...]
    shifts: list[int]
    facts: dict[str, Any]
    cands: list[str]
    sync_launch: bool


def matching(
    ranks: Sequence[RankInput],
    chunks: Sequence[Iterator[Mapping[str, np.ndarray]]],
    *,
    epoch_sync_ns: int = DEFAULT_EPOCH_SYNC_NS,
    sync_launch: bool = False,
) -> Matching:
    """``ranks`` with each one's columns (``chunks``, in step order: a recording's, or
    Steps', :func:`probe.analysis.ranks_match.step_chunks`), their offsets read from the
    first :data:`ALIGN_WINDOW` steps and their clocks aligned."""
    if len(ranks) < 2:
        raise ValueError("ranks side by side need at least two ranks")
    streams = [ranks_match.Stream(c) for c in chunks]
    for st in streams:
        st.fill(ALIGN_WINDOW)
    prefixes = [
        [
            _Batch(int(a), int(b), int(c))
            for a, b, c in zip(
                st.buf["step"][:ALIGN_WINDOW].tolist(),
                st.buf["num_tokens"][:ALIGN_WINDOW].tolist(),
                st.buf["num_reqs"][:ALIGN_WINDOW].tolist(),
                strict=True,
            )
        ]
        for st in streams
    ]
    offsets, how = align_offsets(prefixes)
    shifts, unc, clock = clock_shifts(ranks, epoch_sync_ns)
    facts: dict[str, Any] = {
        "offsets": offsets,
        "alignment": how,
        "clock": clock,
        "uncertainty_ns": unc,
        "tally": Counter(),
        "arrival": ARRIVAL[sync_launch],
    }
    return Matching(
        streams, offsets, shifts, facts, ranks_match.candidates(sync_launch), sync_launch
    )


def matched(mt: Matching, chunk: int) -> Iterator[tuple[ranks_match.Paired, ranks_match.Rows]]:
    """The windows of an engine's matched steps: each pairing and its rules' figures; the
    facts' ``tally`` (unmatched steps per rank, batch mismatches, steps without a launch
    time) complete once exhausted."""
    tally: Counter[str] = mt.facts["tally"]
    unc = mt.facts["uncertainty_ns"]
    full = 0
    for ws in ranks_match.windows(mt.streams, mt.offsets, chunk):
        p = ranks_match.match_window(ws, mt.offsets)
        full += p.full
        tally["batch_mismatches"] += p.mismatches
        tally["no_launch"] += p.no_launch
        if len(p.cols["step"]):
            yield p, ranks_match.match_rows(p.cols, mt.shifts, unc, mt.sync_launch, mt.cands)
    for i, st in enumerate(mt.streams):
        tally[f"unmatched{i}"] = st.count - full


def per_step(
    ranks: Sequence[RankInput],
    *,
    epoch_sync_ns: int = DEFAULT_EPOCH_SYNC_NS,
    sync_launch: bool = False,
    chunk: int = RANKS_CHUNK_ROWS,
    chunks: Sequence[Iterator[Mapping[str, np.ndarray]]] | None = None,
) -> tuple[Iterator[StepRanks], dict[str, Any]]:
    """The engine's matched steps, streamed in step order, and the matching's facts
    (``offsets``, ``alignment``, ``clock``, ``uncertainty_ns``; after the iterator is
    exhausted also ``tally``: unmatched steps per rank, batch mismatches, steps without a
    launch time). ``chunks``: each rank's columns (as :func:`matching` takes them) in place
    of its Steps."""
    mt = matching(
        ranks,
        chunks if chunks is not None else [ranks_match.step_chunks(r.steps, chunk) for r in ranks],
        epoch_sync_ns=epoch_sync_ns,
        sync_launch=sync_launch,
    )

    def each() -> Iterator[StepRanks]:
        for p, m in matched(mt, chunk):
            yield from _step_ranks(p.cols, m)

    return each(), mt.facts


def engine_ranks(
    ranks: Sequence[RankInput],
    *,
    epoch_sync_ns: int = DEFAULT_EPOCH_SYNC_NS,
    sync_launch: bool = False,
    chunk: int = RANKS_CHUNK_ROWS,
) -> EngineRanks:
    """One engine's ranks side by side over all their matched steps (:func:`engine_figures`
    of their Steps)."""
    mt = matching(
        ranks,
        [ranks_match.step_chunks(r.steps, chunk) for r in ranks],
        epoch_sync_ns=epoch_sync_ns,
        sync_launch=sync_launch,
    )
    return engine_figures(ranks, mt, chunk)


def engine_figures(ranks: Sequence[RankInput], mt: Matching, chunk: int) -> EngineRanks:
    """An engine's figures over every matched step of ``mt`` (its ranks' columns, from
    Steps or a recording), summed window by window."""
    n = len(ranks)
    k = len(mt.cands)
    last = [0] * n
    phases = np.zeros((n, k), np.int64)
    mine = [Values() for _ in range(n)]  # each rank's skews: exact, in bounded memory
    caused = [0] * n
    caused_n = [0] * n
    fl = [0] * n
    clo = [0] * n
    count = within = wait = wait_steps = 0
    for p, m in matched(mt, chunk):
        v = p.cols
        count += len(v["step"])
        for r in range(n):
            fl[r] += exact_sum(v[f"{FL}_ns"][:, r])
            clo[r] += exact_sum(v["cpu_launch_overhead_ns"][:, r])
        named = m.last >= 0
        within += int((~named).sum())
        at, skew, phase, has = m.last[named], m.skew[named], m.phase[named], m.has_wait[named]
        w = m.wait[named]
        phases += np.bincount(at * k + phase, minlength=n * k).reshape(n, k)
        for r in range(n):
            is_r = at == r
            last[r] += int(is_r.sum())
            mine[r].add(skew[is_r])
            caused[r] += exact_sum(w[is_r & has])
            caused_n[r] += int((is_r & has).sum())
        wait += exact_sum(w[has])
        wait_steps += int(has.sum())
    tally = mt.facts["tally"]
    named_n = sum(last)
    figures = tuple(
        RankFigures(
            rank=r.rank,
            last=last[i],
            share=last[i] / named_n if named_n else None,
            phases=tuple(
                sorted(
                    ((c, int(phases[i, j])) for j, c in enumerate(mt.cands) if phases[i, j]),
                    key=lambda kv: (-kv[1], kv[0]),
                )
            ),
            skew_p50_ns=percentile([mine[i]], 50),
            wait_caused_ns=caused[i],
            wait_steps=caused_n[i],
            mean_forward_launch_ns=fl[i] / count if count else None,
            mean_cpu_launch_overhead_ns=clo[i] / count if count else None,
        )
        for i, r in enumerate(ranks)
    )
    skew_pct = {q: percentile(mine, q) for q in (50, 90, 99)}
    skew_max = order_stats(mine, [named_n - 1])[0] if named_n else None
    for held in mine:
        held.close()
    return EngineRanks(
        dp_rank=ranks[0].rank.dp_rank,
        ranks=figures,
        offsets=mt.offsets,
        alignment=mt.facts["alignment"],
        arrival=mt.facts["arrival"],
        matched=count,
        unmatched=tuple(tally[f"unmatched{i}"] for i in range(n)),
        batch_mismatches=tally["batch_mismatches"],
        no_launch=tally["no_launch"],
        clock=mt.facts["clock"],
        uncertainty_ns=mt.facts["uncertainty_ns"],
        within_uncertainty=within,
        skew_p50_ns=skew_pct[50],
        skew_p90_ns=skew_pct[90],
        skew_p99_ns=skew_pct[99],
        skew_max_ns=skew_max,
        wait_ns=wait,
        wait_steps=wait_steps,
        verdict=rank_verdict(figures, named_n),
    )


@dataclass(frozen=True)
class _Batch:
    """What :func:`align_offsets` reads of a step."""

    step: int
    num_tokens: int
    num_reqs: int


def exact_sum(a: np.ndarray) -> int:
    """The exact sum of int64 values (in Python integers where int64 could overflow)."""
    if len(a) == 0:
        return 0
    if int(np.abs(a).max()) * len(a) < 2**63:
        return int(a.sum())
    return sum(int(x) for x in a.tolist())


def holds_more_than_share(last: int, named: int, n: int) -> bool:
    """:data:`VERDICT_RULE` for a rank last on ``last`` of ``named`` steps among ``n``."""
    if named == 0 or n < 2:
        return False
    fair = 1 / n
    return last / named > fair + SIGMAS * math.sqrt(fair * (1 - fair) / named)


def rank_verdict(figures: Sequence[RankFigures], named: int) -> str | None:
    heavy = [f for f in figures if holds_more_than_share(f.last, named, len(figures))]
    if not heavy:
        return None
    f = max(heavy, key=lambda x: x.last)
    phase, count = f.phases[0] if f.phases else (START, 0)
    wait = (
        f"the others' wait attributable to it {f.wait_caused_ns / 1e6:,.1f} ms over "
        f"{f.wait_steps:,} steps with a figure "
        f"({f.wait_caused_ns / f.wait_steps / 1e3:,.1f} us a step)"
        if f.wait_steps
        else "no device timing to say what the others waited"
    )
    return (
        f"{f.rank.label} (pid {f.rank.pid}) holds the step: last on {f.last:,} of {named:,} "
        f"steps ({f.last / named:.0%}, fair share {1 / len(figures):.0%}); "
        f"behind it most often: {phase} ({count:,} of those steps); {wait}"
    )


def dp_rank(r: RankInput, steps: Iterable[Step]) -> DpRank:
    """A rank's data-parallel costs (see :class:`DpRank`): :func:`dp_costs` of its Steps."""

    def chunks() -> Iterator[dict[str, np.ndarray]]:
        it = iter(steps)
        while rows := [s for _, s in zip(range(RANKS_CHUNK_ROWS), it, strict=False)]:
            yield {
                "reason": np.array([-1 if s.reason is None else s.reason for s in rows], np.int64),
                "padded_tokens": np.array([s.padded_tokens for s in rows], np.int64),
                "num_tokens": np.array([s.num_tokens for s in rows], np.int64),
                "host_ns": np.array([s.host_ns for s in rows], np.int64),
                "gpu_busy_ns": np.array([s.gpu_busy_ns or 0 for s in rows], np.int64),
            }

    return dp_costs(r, chunks())


def dp_costs(r: RankInput, chunks: Iterable[Mapping[str, np.ndarray]]) -> DpRank:
    """A rank's data-parallel costs (see :class:`DpRank`) from its step columns
    (``reason``, ``padded_tokens``, ``num_tokens``, ``host_ns``, ``gpu_busy_ns`` with 0
    where the step has no device timing), a chunk at a time."""
    n = fe = fe_h = fe_g = pad = pad_h = pad_g = 0
    for cols in chunks:
        gpu = cols["gpu_busy_ns"]
        forced = cols["reason"] == int(Reason.FORCED_EAGER)
        padded = cols["padded_tokens"] > cols["num_tokens"]
        n += len(forced)
        fe += int(forced.sum())
        fe_h += exact_sum(cols["host_ns"][forced])
        fe_g += exact_sum(gpu[forced])
        pad += int(padded.sum())
        pad_h += exact_sum(cols["host_ns"][padded])
        pad_g += exact_sum(gpu[padded])
    return DpRank(r.rank, n, fe, fe_h, fe_g, pad, pad_h, pad_g, sum(r.outside.values()))


def ranks_summary(
    engines: Sequence[Sequence[RankInput]],
    dp: Sequence[tuple[RankInput, Iterable[Step]]] = (),
    *,
    epoch_sync_ns: int = DEFAULT_EPOCH_SYNC_NS,
    sync_launch: bool = False,
) -> RanksSummary:
    """Every engine with two ranks or more side by side, and each rank's DP costs."""
    return RanksSummary(
        engines=tuple(
            engine_ranks(e, epoch_sync_ns=epoch_sync_ns, sync_launch=sync_launch)
            for e in engines
            if len(e) >= 2
        ),
        dp=tuple(dp_rank(r, steps) for r, steps in dp),
    )


@dataclass(frozen=True)
class RecordingRanks:
    """A recording's workers as inputs: one list per data-parallel rank (each in (pp, tp)
    order; step iterators not yet started), and whether they run on the CPU platform."""

    by_dp: dict[int, list[RankInput]]
    sync_launch: bool

    @property
    def engines(self) -> list[list[RankInput]]:
        """The engines with two workers or more: per data-parallel rank, one per engine
        generation (:func:`generations`), so a restarted single-worker engine is none."""
        return [g for e in self.by_dp.values() for g in generations(e) if len(g) >= 2]


def generations(ranks: Sequence[RankInput]) -> list[list[RankInput]]:
    """One data-parallel rank's workers split by engine generation: a worker at a
    (pp, tp) place that an earlier worker held belongs to a later engine (a restart),
    so the k-th worker of each place, in the order they started (their clock pair's
    BOOTTIME, then pid), is of generation k; each generation in (pp, tp) order."""
    order = sorted(ranks, key=lambda r: (r.boottime_ns is None, r.boottime_ns or 0, r.rank.pid))
    seen: Counter[tuple[int, int]] = Counter()
    out: list[list[RankInput]] = []
    for r in order:
        place = (r.rank.pp_rank, r.rank.tp_rank)
        k = seen[place]
        seen[place] += 1
        while len(out) <= k:
            out.append([])
        out[k].append(r)
    for g in out:
        g.sort(key=lambda r: (r.rank.pp_rank, r.rank.tp_rank, r.rank.pid))
    return out


def recording_ranks(rec: Any) -> RecordingRanks:
    """The inputs of :func:`engine_ranks` from a :class:`probe.reader.recording.Recording`: its
    workers with steps, all on the recording's host."""
    host = str(rec.meta().get("host") or "")
    counts = rec.step_counts()
    outside: dict[int, dict[str, int]] = {}
    for o in rec.outside():
        outside.setdefault(int(o["pid"]), {})[str(o["kind"])] = int(o["count"] or 0)
    inputs: list[RankInput] = []
    sync_launch = False
    for p in rec.processes():
        if not counts.get(p["pid"]):
            continue
        sync_launch |= str((p.get("snapshot") or {}).get("platform") or "") == "cpu"
        rid = RankId(
            pid=int(p["pid"]),
            tp_rank=int(p.get("tp_rank") or 0),
            pp_rank=int(p.get("pp_rank") or 0),
            dp_rank=int(p.get("dp_rank") or 0),
            host=host,
        )
        steps = rec.iter_steps(rid.pid)
        inputs.append(
            RankInput(
                rid,
                steps,
                p.get("boottime_ns"),
                p.get("epoch_ns"),
                p.get("perf_counter_ns"),
                outside.get(rid.pid, {}),
            )
        )
    inputs.sort(key=lambda r: (r.rank.dp_rank, r.rank.pp_rank, r.rank.tp_rank, r.rank.pid))
    by_dp: dict[int, list[RankInput]] = {}
    for r in inputs:
        by_dp.setdefault(r.rank.dp_rank, []).append(r)
    return RecordingRanks(by_dp, sync_launch)
