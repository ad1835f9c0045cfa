"""Ranks side by side live: the matcher a live sink (Prometheus, OTLP) feeds as batches of
steps arrive from each process, over :mod:`probe.analysis.ranks`'s alignment and compare.

    >>> from probe.analysis.ranks_live import RankMatcher
    >>> RankMatcher().add  # doctest: +ELLIPSIS
    <bound method RankMatcher.add of ...>
"""

from __future__ import annotations

from collections.abc import Sequence

from probe.analysis.ranks import LIVE_ALIGN, RankId, StepRanks, align_offsets, compare_many
from probe.step import Step


class RankMatcher:
    """Ranks side by side for a live sink: steps arrive per process, in batches, in any
    order across processes; :meth:`add` returns the steps it could match so far.

    One host (shared BOOTTIME). An engine's ranks are the processes of one data-parallel
    rank that sent steps; their offsets are read (:func:`align_offsets`) once each has
    :data:`LIVE_ALIGN` steps, and read again when a rank joins. Holds at most ``pending``
    unmatched steps per rank (the oldest go first): a feed of one process's steps after
    another's would be matched only up to that many steps per rank, so
    :func:`exporters.base.replay` feeds the processes in turns, a batch each;
    :func:`per_step` has no such bound.
    """

    def __init__(self, *, sync_launch: bool = False, pending: int = 4096) -> None:
        self.sync_launch = sync_launch
        self.pending = pending
        self._ranks: dict[int, list[RankId]] = {}
        self._steps: dict[int, dict[int, Step]] = {}
        self._offsets: dict[int, tuple[int, ...]] = {}
        self._unordered: set[int] = set()  # pids whose held steps came out of step order
        #: per data-parallel rank, the pids of its ranks and those holding fewer than
        #: LIVE_ALIGN steps (its offsets wait for none): each step's work is its own rank's
        self._pids: dict[int, set[int]] = {}
        self._short: dict[int, set[int]] = {}
        self._retired: set[int] = set()  # workers of an engine generation that was replaced

    def _held(self, dp: int, pid: int) -> None:
        """Note ``pid``'s held steps changed (short of LIVE_ALIGN or not)."""
        if len(self._steps.get(pid, ())) < LIVE_ALIGN:
            self._short.setdefault(dp, set()).add(pid)
        else:
            self._short.get(dp, set()).discard(pid)

    def add(self, rank: RankId, steps: Sequence[Step]) -> list[tuple[list[RankId], StepRanks]]:
        """Matched steps, each with its engine's ranks (in the order of its tuples).

        One engine generation at a time: a worker that takes a (pp, tp) place another
        one held starts the next generation (a restarted engine), whose workers are
        matched only with each other; the earlier generation's are let go and their
        steps from then on ignored, so a restarted single-worker engine has no ranks."""
        import bisect

        if rank.pid in self._retired:
            return []
        members = self._ranks.setdefault(rank.dp_rank, [])
        pids = self._pids.setdefault(rank.dp_rank, set())
        if rank.pid not in pids:
            place = (rank.pp_rank, rank.tp_rank)
            if any((r.pp_rank, r.tp_rank) == place for r in members):
                for r in members:
                    self._retired.add(r.pid)
                    self._steps.pop(r.pid, None)
                    self._unordered.discard(r.pid)
                members.clear()
                pids.clear()
                self._short.pop(rank.dp_rank, None)
            pids.add(rank.pid)
            bisect.insort(members, rank, key=lambda r: (r.pp_rank, r.tp_rank, r.pid))
            self._offsets.pop(rank.dp_rank, None)
        mine = self._steps.setdefault(rank.pid, {})
        if not mine:
            self._unordered.discard(rank.pid)
        for s in steps:
            if mine and s.step < next(reversed(mine)):
                self._unordered.add(rank.pid)
            mine[s.step] = s
        # steps held in step order (as they come): the oldest is the first key
        ordered = rank.pid not in self._unordered
        while len(mine) > self.pending:
            del mine[next(iter(mine)) if ordered else min(mine)]
        self._held(rank.dp_rank, rank.pid)
        if len(members) < 2:
            return []
        offsets = self._offsets.get(rank.dp_rank)
        if offsets is None:
            if self._short.get(rank.dp_rank):
                return []
            held = [sorted(self._steps[r.pid].values(), key=lambda s: s.step) for r in members]
            offsets = self._offsets[rank.dp_rank] = align_offsets(held)[0]
        ref = self._steps[members[0].pid]
        matched: list[list[Step]] = []
        for k in sorted(ref):
            keys = [k + d for d in offsets]
            held_steps = [self._steps[r.pid].get(x) for r, x in zip(members, keys, strict=True)]
            if any(h is None for h in held_steps):
                continue
            for r, x in zip(members, keys, strict=True):
                del self._steps[r.pid][x]
                self._held(rank.dp_rank, r.pid)
            matched.append([h for h in held_steps if h is not None])
        # compared together: one matrix for the steps matched now
        return [
            (list(members), sr)
            for sr in compare_many(matched, sync_launch=self.sync_launch)
            if sr is not None
        ]

    def forget(self, pid: int) -> None:
        """Nothing kept of ``pid`` (a process that ended a while ago)."""
        self._retired.discard(pid)
        self._steps.pop(pid, None)
        self._unordered.discard(pid)
        for dp, members in self._ranks.items():
            if any(r.pid == pid for r in members):
                members[:] = [r for r in members if r.pid != pid]
                self._offsets.pop(dp, None)
                self._pids.get(dp, set()).discard(pid)
                self._short.get(dp, set()).discard(pid)
