"""What a :class:`probe.analysis.summary.Summary` keeps besides its groups: each rank's
state between chunks (:class:`Rank`) and the first uses of a shape not decided yet
(:class:`Candidate`). Apart from the summary so that its figures
(:mod:`probe.analysis.figures`) read them without importing the summary."""

from __future__ import annotations

from dataclasses import dataclass, field

from probe.analysis.accumulators import Acc, Key


@dataclass
class Rank:
    prev_t1: int | None = None
    idle_ns: int = 0  # engine idle: the gaps before its steps (forward or not)
    idle_gaps: int = 0
    replayed: bool = False
    first_step: int | None = None
    seen: set[int] = field(default_factory=set)
    #: gaps judged by the engine's state (``carried_reqs``), and by the fallback rule
    #: (the step after the gap recorded without it)
    by_state: int = 0
    by_gap: int = 0

    def copy(self) -> Rank:
        return Rank(
            self.prev_t1, self.idle_ns, self.idle_gaps, self.replayed, self.first_step,
            set(self.seen), self.by_state, self.by_gap,
        )  # fmt: skip


@dataclass
class Candidate:
    """The first use of a shape on a rank, decided when the figures are read."""

    key: Key  # its group, class aside
    base: int  # STEADY or _PENDING
    step: int
    host_ns: int
    acc: Acc
    # as the warm-up list shows a step: its padded tokens and launch overhead as recorded
    padded_tokens: int = 0
    cpu_launch_overhead_ns: int = -1
