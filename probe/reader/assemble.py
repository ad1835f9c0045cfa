"""Records -> steps, in the reader process.

:class:`StepAssembler` takes the decoded records of one ring (one vLLM process) in order
and produces one :class:`Step` per engine step. Every hook stamps its record with the
writer's step number, so a step is simply "all in-step records with the same number";
it is closed when a record of a later step arrives (or on :meth:`flush`). Records written
outside a step (graph capture, profile and dummy runs) are tallied, never made into
steps. GPU timings are read lazily in the writer and arrive a few steps late: they are
returned separately and joined by step number.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from probe.records import (
    Build,
    Decoded,
    Dispatch,
    Fault,
    Flag,
    Forward,
    GpuTiming,
    Mode,
    Phase,
    Reorder,
    Replay,
    ReplayKind,
    Span,
    evolve,
)
from probe.step import PHASE_COLUMNS, Step, new_step

__all__ = ["PHASE_COLUMNS", "Step", "StepAssembler", "fill_builds"]

# the flag bits as plain ints: ``int & IntFlag`` runs enum code, per record
_SPAN, _OUTSIDE_STEP, _DRAFTER = int(Flag.SPAN), int(Flag.OUTSIDE_STEP), int(Flag.DRAFTER)
_UNIFORM, _MRV2 = int(Flag.UNIFORM), int(Flag.MRV2)
_FROM_DISPATCH = int(Flag.FROM_DISPATCH)
_PHASE_NAMES = tuple((p, p.name.lower()) for p in PHASE_COLUMNS)
_PHASE_NAME = dict(_PHASE_NAMES)
_PHASE_KEYS = tuple(name for _, name in _PHASE_NAMES)


def _union_ns(spans: Iterable[Span]) -> int:
    """Total time covered by possibly nested/overlapping spans."""
    total = 0
    end = -1
    for s in sorted(spans, key=lambda s: s.t0):
        if s.t1 <= end:
            continue
        total += s.t1 - max(s.t0, end)
        end = s.t1
    return total


def _one_ns(s: Span) -> int:
    """:func:`_union_ns` of one span."""
    return s.t1 - max(s.t0, -1) if s.t1 > -1 else 0


def _expand(recs: Iterable[Decoded]) -> Iterable[Decoded]:
    """The folded records as the spans and replays they stand for: a DISPATCH with
    ``Flag.SPAN`` is also the dispatch phase; a FORWARD record is the forward-launch span
    and each replay counted in it (their times: the first replay's start to the last
    one's end)."""
    for r in recs:
        if isinstance(r, Forward):
            f = r.flags
            yield Span(r.step, Phase.FORWARD_LAUNCH, r.t0, r.t1, f)
            rt0, rt1 = (r.replay_t0, r.replay_t1) if r.replay_t0 else (r.t0, r.t1)
            n = r.num_tokens
            for _ in range(r.full_replays):
                yield Replay(r.step, Mode.FULL, ReplayKind.REPLAY, f, rt0, rt1, n)
            for _ in range(r.pieces):
                yield Replay(r.step, Mode.PIECEWISE, ReplayKind.REPLAY, f, rt0, rt1, n)
            for _ in range(r.captures):
                yield Replay(r.step, r.mode, ReplayKind.CAPTURE, f, rt0, rt1, n)
            for _ in range(r.passes):
                yield Replay(r.step, Mode.PIECEWISE, ReplayKind.PASSTHROUGH, f, rt0, rt1, 0)
            continue
        if isinstance(r, Dispatch) and r.flags & _SPAN:
            yield Span(r.step, Phase.DISPATCH, r.t0, r.t1, r.flags & ~_SPAN)
        yield r


def _from_dispatch(recs: list[Decoded]) -> list[Decoded]:
    """MRV2's ``prepare_inputs`` phase begins where the step's dispatch phase ended: at the
    end of the last target dispatch span that ended before the marked span began (the
    runner's ``prepare_inputs`` runs between the two, unhooked). A span marked
    ``Flag.FROM_DISPATCH``:

    - of the ``prepare_inputs`` phase (the runner's ``prepare_attn`` hook) is extended back
      to that start;
    - of another phase (the model state's ``prepare_attn``, the metadata build, since the
      recordings that hook it) ends the phase where it begins: the reader adds the
      ``prepare_inputs`` span from that start to the marked span's start, marked
      ``FROM_DISPATCH`` as a recorded one extended back is (:func:`derived_prepare`).

    Without such a dispatch (a step cut by the hooks going on) a ``prepare_inputs`` span
    keeps its own start and none is added."""
    if not any(isinstance(r, Span) and r.flags & _FROM_DISPATCH for r in recs):
        return recs
    ends = [
        r.t1
        for r in recs
        if isinstance(r, Span) and r.phase == Phase.DISPATCH and not r.flags & _DRAFTER
    ]
    out: list[Decoded] = []
    for r in recs:
        if isinstance(r, Span) and r.flags & _FROM_DISPATCH:
            start = max((e for e in ends if e <= r.t0), default=None)
            if start is not None and r.phase == Phase.PREPARE_INPUTS:
                r = evolve(r, t0=start)
            elif start is not None and not r.flags & _DRAFTER:
                out.append(Span(r.step, Phase.PREPARE_INPUTS, start, r.t0, r.flags))
        out.append(r)
    return out


def derived_prepare(spans: Iterable[Span]) -> set[tuple[int, int]]:
    """The (t0, t1) of the ``prepare_inputs`` spans the reader added (:func:`_from_dispatch`)
    among a step's spans: each ends exactly where a target ``metadata_build`` span begins.
    Told by the times, not the flag, so it holds for steps read back from a recording
    (whose spans table keeps the drafter bit only), as ``probe.analysis.cost`` tells a dispatch
    from its phase span; a recorded ``prepare_inputs`` span ends before the build begins
    (the state's ``preprocess_state`` and the slot mappings run between). They are not
    calls the probe made (:func:`probe.analysis.cost.hooked_calls`)."""
    spans = [sp for sp in spans if not sp.flags & _DRAFTER]
    starts = {sp.t0 for sp in spans if sp.phase == Phase.METADATA_BUILD}
    return {(sp.t0, sp.t1) for sp in spans if sp.phase == Phase.PREPARE_INPUTS and sp.t1 in starts}


def _deciding(dispatches: list[Dispatch]) -> list[Dispatch]:
    """The dispatches that decide a step's graphs: the drafter's, and of the target's the
    ones its dispatch phase wrote (``Flag.SPAN``: the runner's own dispatch, a DP
    re-dispatch inside the phase folded into it) where the step has any, else all of
    them. A target dispatch outside the phase asks a different question: MRV2's fast
    prefill (vLLM 0.30 and later, ``kv_sharing_fast_prefill``: ``FastPrefillHelper.
    prepare``) dispatches the logits count after the phase, on steps with a prefill, to
    pad the KV-sharing layers' batch."""
    if any(d.flags & _SPAN and not d.flags & _DRAFTER for d in dispatches):
        return [d for d in dispatches if d.flags & (_SPAN | _DRAFTER)]
    return dispatches


def fill_builds(builds: Iterable[Build], dispatches: Iterable[Dispatch]) -> list[Build]:
    """The builds of one step with what the hook leaves to the reader filled in.

    Inside vLLM the build hook reads plain attributes only and writes -1 for the real
    (unpadded) token and request counts. Here ``real_tokens`` is the ``num_tokens`` of
    the last dispatch of the same model (target or drafter) that started before the
    build, of those that decide (:func:`_deciding`), which is what the build's
    ``query_start_loc_cpu[num_reqs]`` holds (checked against the engine-side read on five
    real H200 recordings, 15,778 builds); with no such dispatch (V1's drafter builds) it
    is the padded count. ``real_reqs`` is the padded request count when nothing was
    padded, else 0; a ``num_prefill_tokens`` the builder left out is the rest of the real
    tokens after the decode tokens.
    """
    ds = _deciding(sorted(dispatches, key=lambda d: d.t0))
    out: list[Build] = []
    for b in builds:
        if b.real_tokens >= 0 and b.real_reqs >= 0:
            out.append(b)
            continue
        drafter = b.flags & _DRAFTER
        real = b.padded_tokens
        for d in ds:
            if d.t0 > b.t0:
                break
            if d.flags & _DRAFTER == drafter:
                real = d.num_tokens
        npt = b.num_prefill_tokens
        if npt < 0 <= b.num_decode_tokens:
            npt = real - b.num_decode_tokens if real >= b.num_decode_tokens else -1
        reqs = b.padded_reqs if real == b.padded_tokens else 0
        out.append(evolve(b, real_tokens=real, real_reqs=reqs, num_prefill_tokens=npt))
    return out


@dataclass
class _Open:
    step: int
    records: list[Decoded] = field(default_factory=list)


class StepAssembler:
    """Assembles the records of one process into steps."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._open: _Open | None = None
        self.outside: Counter[str] = Counter()
        self.gpu: list[GpuTiming] = []
        self.faults: dict[int, Fault] = {}
        self.anomalies: list[str] = []

    def feed(self, rec: Decoded) -> list[Step]:
        if isinstance(rec, GpuTiming):
            self.gpu.append(rec)
            return []
        if isinstance(rec, Fault):
            self.faults[rec.hook_id] = rec
            return []
        flags = getattr(rec, "flags", 0)
        if flags & _OUTSIDE_STEP:
            self.outside[type(rec).__name__.lower()] += 1
            return []
        out: list[Step] = []
        if self._open is not None and rec.step != self._open.step:
            out.append(self._close(self._open))
            self._open = None
        if self._open is None:
            self._open = _Open(rec.step)
        self._open.records.append(rec)
        return out

    def take_gpu(self) -> list[GpuTiming]:
        """The device timings that arrived since the last call (the collector hands them
        to every sink once)."""
        out, self.gpu = self.gpu, []
        return out

    def flush(self) -> list[Step]:
        if self._open is None:
            return []
        step = self._close(self._open)
        self._open = None
        return [step]

    def _close(self, o: _Open) -> Step:
        o.records = _from_dispatch(list(_expand(o.records)))
        # one pass over the records, by kind (the reader's cost per step: each filter of
        # all the records by isinstance was a pass of its own)
        spans: list[Span] = []
        dispatches: list[Dispatch] = []
        replays: list[Replay] = []
        raw_builds: list[Build] = []
        reorders: list[Reorder] = []
        execute: list[Span] = []
        sample: list[Span] = []
        for r in o.records:
            if isinstance(r, Span):
                spans.append(r)
                if r.phase == Phase.EXECUTE:
                    execute.append(r)
                elif r.phase == Phase.SAMPLE_TOKENS:
                    sample.append(r)
            elif isinstance(r, Dispatch):
                dispatches.append(r)
            elif isinstance(r, Replay):
                replays.append(r)
            elif isinstance(r, Build):
                raw_builds.append(r)
            elif isinstance(r, Reorder):
                reorders.append(r)
        builds = fill_builds(raw_builds, dispatches) if raw_builds else []
        bracket = execute + sample
        # a step cut by the hooks going on or off may lack its bracket (or every span):
        # its time is then that of whatever timed records it has
        timed_recs: list[Any] = bracket or spans or [r for r in o.records if getattr(r, "t0", 0)]
        t0 = min((r.t0 for r in timed_recs), default=0)
        t1 = max((r.t1 for r in timed_recs), default=0)
        host = sum(s.t1 - s.t0 for s in bracket)
        ex_rec = execute[0] if execute else None
        target = [d for d in _deciding(dispatches) if not d.flags & _DRAFTER]
        drafts = [d for d in dispatches if d.flags & _DRAFTER]
        d = target[-1] if target else None
        tr = [r for r in replays if not r.flags & _DRAFTER and r.kind != ReplayKind.PASSTHROUGH]
        dr = [r for r in replays if r.flags & _DRAFTER and r.kind == ReplayKind.REPLAY]
        captures = sum(1 for r in replays if r.kind == ReplayKind.CAPTURE)
        if captures:
            self.anomalies.append(
                f"pid {self.pid} step {o.step}: {captures} graph capture(s) during serving"
            )
        mode = d.mode if d is not None else None
        replayed = False
        pieces = sum(1 for r in tr if r.mode == Mode.PIECEWISE and r.kind == ReplayKind.REPLAY)
        if (
            mode is None
            and ex_rec is not None
            and ex_rec.v0 > 0
            and not any(s.flags & _DRAFTER for s in spans if s.phase == Phase.FORWARD_LAUNCH)
            and any(s.phase == Phase.FORWARD_LAUNCH for s in spans)
        ):
            # a forward ran but no dispatch was seen (a runner without a dispatcher)
            mode = Mode.NONE
        if mode == Mode.FULL:
            replayed = any(r.mode == Mode.FULL and r.kind == ReplayKind.REPLAY for r in tr)
        elif mode == Mode.PIECEWISE:
            replayed = pieces > 0
        # REORDER records carry their own time: they are the reorder phase
        by_phase: dict[Phase, list[Span]] = {}
        for s in spans:
            by_phase.setdefault(s.phase, []).append(s)
        if reorders:
            by_phase.setdefault(Phase.REORDER, []).extend(
                Span(r.step, Phase.REORDER, r.t0, r.t1, r.flags) for r in reorders
            )
        phases = dict.fromkeys(_PHASE_KEYS, 0)
        for p, ss in by_phase.items():
            name = _PHASE_NAME.get(p)
            if name is not None:
                phases[name] = _union_ns(ss) if len(ss) > 1 else _one_ns(ss[0])
        fwd = [s for s in spans if s.phase == Phase.FORWARD_LAUNCH and not s.flags & _DRAFTER]
        launch = (fwd[0].t1 - ex_rec.t0) if fwd and ex_rec is not None else None
        dmode = drafts[0].mode if drafts else None
        dreason = drafts[0].reason if drafts else None
        return new_step(
            pid=self.pid,
            step=o.step,
            t0=t0,
            t1=t1,
            host_ns=host,
            num_tokens=ex_rec.v0 if ex_rec is not None else 0,
            num_reqs=ex_rec.v1 if ex_rec is not None else 0,
            carried_reqs=(
                ex_rec.v2 if ex_rec is not None and 0 <= ex_rec.v2 <= ex_rec.v1 else None
            ),
            mode=mode,
            reason=d.reason if d is not None else None,
            padded_tokens=d.padded_tokens if d is not None else 0,
            padded_reqs=d.padded_reqs if d is not None else 0,
            max_query_len=d.max_query_len if d is not None else 0,
            uniform_decode_query_len=d.uniform_decode_query_len if d is not None else 0,
            uniform=bool(d.flags & _UNIFORM) if d is not None else False,
            replayed=replayed,
            pieces=pieces,
            captures=captures,
            cpu_launch_overhead_ns=launch,
            phases=phases,
            draft_mode=dmode,
            draft_reason=dreason,
            draft_replays=len(dr),
            draft_dispatches=len(drafts),
            runner="mrv2" if any(s.flags & _MRV2 for s in execute) else "v1",
            spans=tuple(spans),
            builds=tuple(builds),
            reorders=tuple(reorders),
            dispatches=tuple(dispatches),
            replays=tuple(replays),
        )
