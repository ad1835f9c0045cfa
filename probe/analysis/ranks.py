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

(:mod:`probe.analysis.ranks_columns` computes the same figures over a recording's columns.)

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

Memory: steps are streamed per rank in step order; what is held is the first
:data:`ALIGN_WINDOW` steps of each rank (to read the offset), one Step per rank while
matching, one skew figure per matched step (8 bytes, for exact percentiles) and counters
per rank and phase.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from probe.records import Reason
from probe.step import Step

__all__ = [
    "ALIGN_WINDOW",
    "DEFAULT_EPOCH_SYNC_NS",
    "MAX_OFFSET",
    "PHASES_BEFORE_FORWARD",
    "VERDICT_RULE",
    "DpRank",
    "EngineRanks",
    "RankFigures",
    "RankId",
    "RankInput",
    "RanksSummary",
    "RecordingRanks",
    "StepRanks",
    "align_offsets",
    "compare",
    "engine_ranks",
    "per_step",
    "ranks_summary",
    "recording_ranks",
]

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
ARRIVAL = {
    False: "enqueue end: t0 + cpu_launch_overhead_ns",
    True: "forward start: t0 + cpu_launch_overhead_ns - forward_launch "
    "(the forward call runs the model and its collectives wait for every rank)",
}
ALIGN_WINDOW = 256
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


class _Peek:
    def __init__(self, it: Iterator[Step]) -> None:
        self.it = it
        self.head: Step | None = next(it, None)
        self.skipped = 0

    def take(self, step: int) -> Step | None:
        """The step numbered ``step``, skipping (and counting) the ones before it."""
        while self.head is not None and self.head.step < step:
            self.skipped += 1
            self.head = next(self.it, None)
        if self.head is not None and self.head.step == step:
            s, self.head = self.head, next(self.it, None)
            return s
        return None

    def rest(self) -> int:
        n = 0
        while self.head is not None:
            n += 1
            self.head = next(self.it, None)
        return n


def _lead(x: int, xs: Sequence[int]) -> float:
    """``x`` minus the median of ``xs``, exactly: epoch-ns values are past a float's 53
    bits, so the median is taken doubled, in integers."""
    ys = sorted(xs)
    m = len(ys) // 2
    twice = 2 * ys[m] if len(ys) % 2 else ys[m - 1] + ys[m]
    return (2 * x - twice) / 2


def compare(
    steps: Sequence[Step],
    shifts: Sequence[int] | None = None,
    *,
    uncertainty_ns: int = 0,
    sync_launch: bool = False,
) -> StepRanks | None:
    """One step of every rank of an engine (in the engine's rank order), side by side;
    None when a rank has no launch time (no forward). ``shifts`` put each rank's BOOTTIME
    on the common clock (none: one host)."""
    if any(s.cpu_launch_overhead_ns is None for s in steps):
        return None
    sh = list(shifts) if shifts is not None else [0] * len(steps)
    clo = [int(s.cpu_launch_overhead_ns or 0) for s in steps]
    fl = [s.phases.get(FL, 0) for s in steps]
    starts = [s.t0 + x for s, x in zip(steps, sh, strict=True)]
    ends = [t + c - (f if sync_launch else 0) for t, c, f in zip(starts, clo, fl, strict=True)]
    last = max(range(len(ends)), key=lambda i: (ends[i], -i))
    others = [i for i in range(len(ends)) if i != last]
    skew_ns = round(_lead(ends[last], [ends[i] for i in others]))
    phase: str | None = None
    excess = 0
    wait: int | None = None
    named: int | None = last
    if skew_ns <= uncertainty_ns:
        named = None
    else:
        cands = {START: _lead(starts[last], [starts[i] for i in others])}
        for p in PHASES_BEFORE_FORWARD:
            if not (sync_launch and p == FL):
                mine = steps[last].phases.get(p, 0)
                cands[p] = _lead(mine, [steps[i].phases.get(p, 0) for i in others])
        phase = max(cands, key=lambda k: cands[k])  # first listed wins a tie
        excess = round(cands[phase])
        if sync_launch:
            wait = sum(ends[last] - ends[i] for i in others)
        elif (idle := steps[last].gpu_idle_before_ns) is not None:
            wait = sum(min(ends[last] - ends[i], idle) for i in others)
    return StepRanks(
        step=steps[0].step,
        steps=tuple(s.step for s in steps),
        start_ns=tuple(starts),
        end_ns=tuple(ends),
        forward_launch_ns=tuple(fl),
        cpu_launch_overhead_ns=tuple(clo),
        last=named,
        skew_ns=skew_ns,
        phase=phase,
        phase_excess_ns=excess,
        wait_ns=wait,
    )


def _match(
    ranks: Sequence[RankInput], shifts: Sequence[int], unc: int, offsets: Sequence[int],
    peeks: Sequence[_Peek], tally: Counter[str], sync_launch: bool,
) -> Iterator[StepRanks]:  # fmt: skip
    ref = peeks[0]
    while ref.head is not None:
        s0 = ref.head
        ref.head = next(ref.it, None)
        got: list[Step | None] = [s0]
        for i in range(1, len(ranks)):
            got.append(peeks[i].take(s0.step + offsets[i]))
        if any(g is None for g in got):
            tally["unmatched0"] += 1
            for i, g in enumerate(got[1:], 1):
                if g is not None:
                    tally[f"unmatched{i}"] += 1
            continue
        steps = [g for g in got if g is not None]
        if any(_batch(s) != _batch(s0) for s in steps[1:]):
            tally["batch_mismatches"] += 1
        sr = compare(steps, shifts, uncertainty_ns=unc, sync_launch=sync_launch)
        if sr is None:
            tally["no_launch"] += 1
            continue
        yield sr
    for i, pk in enumerate(peeks[1:], 1):
        tally[f"unmatched{i}"] += pk.skipped + pk.rest()


def per_step(
    ranks: Sequence[RankInput],
    *,
    epoch_sync_ns: int = DEFAULT_EPOCH_SYNC_NS,
    sync_launch: bool = False,
) -> tuple[Iterator[StepRanks], dict[str, Any]]:
    """The engine's matched steps, streamed in step order, and the matching's facts
    (``offsets``, ``alignment``, ``clock``, ``uncertainty_ns``; after the iterator is
    exhausted also ``tally``: unmatched steps per rank, batch mismatches, steps without a
    launch time)."""
    if len(ranks) < 2:
        raise ValueError("ranks side by side need at least two ranks")
    its = [iter(r.steps) for r in ranks]
    prefixes = [list(itertools.islice(it, ALIGN_WINDOW)) for it in its]
    offsets, how = align_offsets(prefixes)
    shifts, unc, clock = clock_shifts(ranks, epoch_sync_ns)
    peeks = [_Peek(itertools.chain(pre, it)) for pre, it in zip(prefixes, its, strict=True)]
    tally: Counter[str] = Counter()
    facts: dict[str, Any] = {
        "offsets": offsets,
        "alignment": how,
        "clock": clock,
        "uncertainty_ns": unc,
        "tally": tally,
    }
    facts["arrival"] = ARRIVAL[sync_launch]
    return _match(ranks, shifts, unc, offsets, peeks, tally, sync_launch), facts


def _pct(xs: Sequence[int], q: float) -> float | None:
    from probe.analysis.views import percentile

    return percentile(xs, q)


def engine_ranks(
    ranks: Sequence[RankInput],
    *,
    epoch_sync_ns: int = DEFAULT_EPOCH_SYNC_NS,
    sync_launch: bool = False,
) -> EngineRanks:
    """One engine's ranks side by side over all their matched steps."""
    it, facts = per_step(ranks, epoch_sync_ns=epoch_sync_ns, sync_launch=sync_launch)
    n = len(ranks)
    last = [0] * n
    phases: list[Counter[str]] = [Counter() for _ in range(n)]
    mine: list[array[int]] = [array("q") for _ in range(n)]
    caused = [0] * n
    caused_n = [0] * n
    fl = [0] * n
    clo = [0] * n
    skews: array[int] = array("q")
    matched = within = wait = wait_steps = 0
    for sr in it:
        matched += 1
        for i in range(n):
            fl[i] += sr.forward_launch_ns[i]
            clo[i] += sr.cpu_launch_overhead_ns[i]
        if sr.last is None:
            within += 1
            continue
        last[sr.last] += 1
        phases[sr.last][sr.phase or START] += 1
        mine[sr.last].append(sr.skew_ns)
        skews.append(sr.skew_ns)
        if sr.wait_ns is not None:
            caused[sr.last] += sr.wait_ns
            caused_n[sr.last] += 1
            wait += sr.wait_ns
            wait_steps += 1
    tally = facts["tally"]
    named = sum(last)
    figures = tuple(
        RankFigures(
            rank=r.rank,
            last=last[i],
            share=last[i] / named if named else None,
            phases=tuple(sorted(phases[i].items(), key=lambda kv: (-kv[1], kv[0]))),
            skew_p50_ns=_pct(mine[i], 50),
            wait_caused_ns=caused[i],
            wait_steps=caused_n[i],
            mean_forward_launch_ns=fl[i] / matched if matched else None,
            mean_cpu_launch_overhead_ns=clo[i] / matched if matched else None,
        )
        for i, r in enumerate(ranks)
    )
    return EngineRanks(
        dp_rank=ranks[0].rank.dp_rank,
        ranks=figures,
        offsets=facts["offsets"],
        alignment=facts["alignment"],
        arrival=facts["arrival"],
        matched=matched,
        unmatched=tuple(tally[f"unmatched{i}"] for i in range(n)),
        batch_mismatches=tally["batch_mismatches"],
        no_launch=tally["no_launch"],
        clock=facts["clock"],
        uncertainty_ns=facts["uncertainty_ns"],
        within_uncertainty=within,
        skew_p50_ns=_pct(skews, 50),
        skew_p90_ns=_pct(skews, 90),
        skew_p99_ns=_pct(skews, 99),
        skew_max_ns=max(skews) if skews else None,
        wait_ns=wait,
        wait_steps=wait_steps,
        verdict=rank_verdict(figures, named),
    )


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
    """A rank's data-parallel costs (see :class:`DpRank`)."""
    n = fe = fe_h = fe_g = pad = pad_h = pad_g = 0
    for s in steps:
        n += 1
        if s.reason == Reason.FORCED_EAGER:
            fe += 1
            fe_h += s.host_ns
            fe_g += s.gpu_busy_ns or 0
        if s.padded_tokens > s.num_tokens:
            pad += 1
            pad_h += s.host_ns
            pad_g += s.gpu_busy_ns or 0
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
