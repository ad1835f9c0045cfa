"""The steady-state split step by step, for the consumers that need it per step: the
metric updates (:class:`Classes`) and the summary of Steps (:func:`summarize_steps`);
``probe whatif`` splits by :func:`probe.analysis.views.is_steady`, the same rules."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from probe.analysis import rules
from probe.analysis.accumulators import PENDING, percentile_of, total_of
from probe.analysis.rules import CLASSES, STEADY
from probe.analysis.summary import Summary, columns_of_steps
from probe.step import Step


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
        #: ``--sample N``'s N (:attr:`Summary.sample_every`), for ranks not seen yet
        self.sample_every = 1
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
        out = cls(decided, [p for p, r in summ.ranks.items() if r.replayed])
        out.sample_every = summ.sample_every
        return out

    def for_process(self) -> Classes:
        """A split by the same decisions (shared, not copied) with no state yet: one
        process's steps classified apart, whatever others were before (each process's
        state is its own: the work of one does not grow with those classified before)."""
        out = Classes(self.decided, None, self.keep)
        out.replayed = self.replayed
        out.sample_every = self.sample_every
        return out

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
            found += self.classify_columns(pid, columns_of_steps(rows))[0]
        return found

    def classify_columns(
        self, pid: int, cols: Mapping[str, np.ndarray]
    ) -> tuple[list[tuple[int, int, str]], tuple[np.ndarray, ...]]:
        """:meth:`classify` of one rank's steps given as columns (in step order, none
        classified yet; :func:`probe.analysis.summary.columns_of_steps`' or a recording's):
        the warm-up steps found, and per row (steady, after an engine-idle gap, period ns,
        gap ns), as :meth:`get` gives them."""
        found: list[tuple[int, int, str]] = []
        summ = self.ranks.setdefault(pid, Summary(sample_every=self.sample_every))
        was_replayed = summ.ranks[pid].replayed if pid in summ.ranks else False
        summ.add_columns(cols)
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
        # each row's class: as the summary classed it, a pending one and a first use
        # decided here (few rows: in Python)
        c = raw.copy()
        pend = np.flatnonzero(c == PENDING)
        if len(pend):
            if self.replayed is not None and pid in self.replayed:
                c[pend] = rules.BEFORE_REPLAY
            else:
                c[pend] = STEADY
        steps = cols["step"]
        mode = cols["mode"]
        forward = mode >= 0
        waits = np.zeros(len(c), dtype=bool)  # live: steady until a first replay comes
        if self.replayed is None:
            waits[pend] = True
        for j in np.flatnonzero(cand | waits).tolist():
            step = int(steps[j])
            if waits[j]:
                pending.append(step)
            if cand[j]:
                c[j] = self._first_use(
                    summ, pid, step, int(mode[j]), int(cols["host_ns"][j]), int(shape[j])
                )
                # judged warm-up: no longer waiting on a first replay
                if c[j] != STEADY and pending and pending[-1] == step:
                    pending.pop()
        steady = (c == STEADY) & forward
        for j in np.flatnonzero(forward & (c != STEADY)).tolist():
            key = (pid, int(steps[j]))
            self.why[key] = CLASSES[int(c[j])]
            found.append((*key, CLASSES[int(c[j])]))
        recent.update(
            zip(
                steps.tolist(),
                zip(
                    steady.tolist(),
                    idle.astype(bool).tolist(),
                    period.tolist(),
                    gap.tolist(),
                    strict=True,
                ),
                strict=True,
            )
        )
        while len(recent) > self.keep:
            old = next(iter(recent))
            del recent[old]
            self.why.pop((pid, old), None)
        del pending[: max(0, len(pending) - self.keep)]
        return found, (steady, idle.astype(bool), period, gap)

    def _first_use(
        self, summ: Summary, pid: int, step: int, mode: int, host_ns: int, shape: int
    ) -> int:
        if self.decided is not None:
            return rules.FIRST_USE if (pid, step) in self.decided else STEADY
        c = summ.candidates.get((pid, shape))
        of_mode = [a for k, a in summ.groups.items() if k.mode == mode and k.step_class == STEADY]
        pool = of_mode or [a for k, a in summ.groups.items() if k.step_class == STEADY]
        med = percentile_of(total_of(pool), "host_ns", 50) if pool else None
        slow = rules.first_use_slow(host_ns, med)
        if c is not None:
            # decided now: into the running summary's groups
            del summ.candidates[(pid, shape)]
            summ._add_group(c.key.of_class(rules.FIRST_USE if slow else STEADY), c.acc)
        return rules.FIRST_USE if slow else STEADY


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
