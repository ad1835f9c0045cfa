"""Put a profile on the recording's clock: ``BOOTTIME = profile time + offset_ns``.

    from exporters.timelines.align import align, shift_profile

    al = align(recording, profile)     # Alignment(offset_ns=..., method="clock pair", ...)
    on_boottime = shift_profile(profile, al.offset_ns)

- rocprofv3 and rocpd are BOOTTIME already: offset 0.
- Kineto is wall-clock (epoch) ns: the recording's clock pair (``processes.boottime_ns``
  and ``epoch_ns``, sampled together when the probe attached) gives the offset. Where that
  is not enough (no pair, or the host's wall clock stepped), the k-th ``_model_forward``
  Python event is matched with the k-th ``forward_launch`` span (by their durations) and
  the median start difference is used. :class:`Alignment` says which was used and how well
  the forwards agree.
- ``offset_ns`` forces an offset; ``allow_unaligned`` puts a profile that does not overlap
  the recording at the recording's first step (for a look, not a measurement).

A profile whose processes are not in the recording (another host or run), or none of whose
events falls inside the recording's steps after alignment, raises :class:`AlignmentError`
naming the file.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from exporters.timelines.load import profile_path
from exporters.timelines.model import CLOCK_BOOTTIME, CLOCK_UNIX_EPOCH, Marker, Profile
from probe.reader.recording import Recording
from probe.records import Flag, Phase
from probe.step import Step

__all__ = [
    "CLOCK_PAIR_TOLERANCE_NS",
    "FORWARD_MARKER",
    "Alignment",
    "AlignmentError",
    "align",
    "overlapping_events",
    "profile_range",
    "shift_profile",
]

FORWARD_MARKER = "_model_forward"
"""Kineto Python event of the V1 runner's forward
(``vllm/v1/worker/gpu_model_runner.py(N): _model_forward``)."""

CLOCK_PAIR_TOLERANCE_NS = 1_000_000
"""Largest disagreement between the clock pair and the forward matching that still counts
as agreement (1 ms); beyond it the forward matching wins."""


class AlignmentError(ValueError):
    """A profile cannot be put on the recording's clock; the message names the file."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class Alignment:
    """How a profile's timestamps map to BOOTTIME: ``boottime = profile time + offset_ns``.

    ``method``: ``same clock`` (BOOTTIME profiles), ``clock pair``, ``forward matching``,
    ``explicit`` or ``unaligned`` (``allow_unaligned``: start placed at the first step).
    ``detail`` says how it was found in words; ``forward_pairs`` and
    ``forward_residual_ns`` (median, and the largest absolute, residual of the matched
    forwards after the offset) are set when forwards were matched.
    """

    offset_ns: int
    method: str
    detail: str
    forward_pairs: int = 0
    forward_residual_ns: tuple[int, int] | None = None
    clock_pair_offset_ns: int | None = None
    forward_offset_ns: int | None = None

    def describe(self) -> str:
        return f"offset {self.offset_ns} ns ({self.method}): {self.detail}"


def _recording_range(steps: Iterable[Step]) -> tuple[int, int] | None:
    """The earliest step start and the latest step end, the steps read once as they come."""
    lo = hi = None
    for s in steps:
        lo = s.t0 if lo is None or s.t0 < lo else lo
        hi = s.t1 if hi is None or s.t1 > hi else hi
    return None if lo is None or hi is None else (lo, hi)


def profile_range(profile: Profile) -> tuple[int, int] | None:
    """Earliest start and latest end over every kernel, host call and marker (None if empty)."""
    seqs = (profile.kernels, profile.host_calls, profile.markers)
    starts = [min(x.start_ns for x in seq) for seq in seqs if seq]
    ends = [max(x.end_ns for x in seq) for seq in seqs if seq]
    if not starts:
        return None
    return min(starts), max(ends)


def overlapping_events(profile: Profile, lo: int, hi: int, offset_ns: int = 0) -> int:
    """How many events (kernels, host calls, markers) intersect ``[lo, hi]`` once shifted.

    Every row counts, not the extremes: a profile whose first and last rows straddle the
    window but none of whose events lies in it overlaps nothing.
    """
    a, b = lo - offset_ns, hi - offset_ns
    seqs = (profile.kernels, profile.host_calls, profile.markers)
    return sum(1 for seq in seqs for x in seq if x.start_ns <= b and x.end_ns >= a)


def _forward_spans(steps: Iterable[Step], pid: int | None = None) -> list[tuple[int, int]]:
    """The target model's forward_launch spans (of ``pid``, or all), by start."""
    return sorted(
        (sp.t0, sp.t1)
        for s in steps
        if pid is None or s.pid == pid
        for sp in s.spans
        if sp.phase == Phase.FORWARD_LAUNCH and not sp.flags & Flag.DRAFTER
    )


def _forward_markers(profile: Profile, name: str) -> list[Marker]:
    return [m for m in profile.markers if m.name == name or m.name.endswith(f": {name}")]


def _match_forwards(
    fwd: Sequence[Marker], spans: Sequence[tuple[int, int]], hint: int | None
) -> tuple[int, list[int], float] | None:
    """Best placement of the profile's forwards among the probe's forward spans.

    Returns ``(first span index, start differences, score)``: the run of consecutive
    spans whose durations match the forwards' best (mean absolute log ratio), preferring,
    among near-equal scores, the one closest to ``hint`` (an offset estimate).
    """
    n, m = len(fwd), len(spans)
    if n == 0 or m < n:
        return None
    kd = [max(f.end_ns - f.start_ns, 1) for f in fwd]
    best: tuple[float, int, int] | None = None  # (score, hint distance, index)
    for j in range(m - n + 1):
        score = 0.0
        for i in range(n):
            pd = max(spans[j + i][1] - spans[j + i][0], 1)
            score += abs(math.log(pd / kd[i]))
        score /= n
        diffs_med = spans[j][0] - fwd[0].start_ns
        dist = abs(diffs_med - hint) if hint is not None else 0
        key = (round(score, 2), dist, j)
        if best is None or key < best:
            best = key
    assert best is not None
    j = best[2]
    diffs = [spans[j + i][0] - fwd[i].start_ns for i in range(n)]
    return j, diffs, best[0]


def _check_pids(recording: Recording, profile: Profile, path: str) -> None:
    rec_pids = {int(p["pid"]) for p in recording.processes()}
    prof_pids = {c.pid for c in profile.host_calls} | {m.pid for m in profile.markers}
    prof_pids.discard(0)
    if rec_pids and prof_pids and not (rec_pids & prof_pids):
        raise AlignmentError(
            path,
            f"its processes (pids {_few(prof_pids)}) are not the recording's "
            f"({_few(rec_pids)}): a trace from another host or another run",
        )


def _few(values: Iterable[int]) -> str:
    v = sorted(values)
    return ", ".join(map(str, v[:6])) + (f" ... ({len(v)} in all)" if len(v) > 6 else "")


def align(
    recording: Recording,
    profile: Profile,
    *,
    offset_ns: int | None = None,
    allow_unaligned: bool = False,
    forward_marker: str = FORWARD_MARKER,
) -> Alignment:
    """Find the offset that puts ``profile`` on the recording's BOOTTIME clock.

    Raises :class:`AlignmentError` (naming the profile's file) when the profile's
    processes are not the recording's or, after alignment, its time range does not
    overlap the recording's steps; ``offset_ns`` or ``allow_unaligned`` merge anyway.
    """
    path = profile_path(profile)
    # the steps are read as they come (twice when the forwards are matched), never held
    rec_range = _recording_range(recording.iter_steps())
    prof_range = profile_range(profile)
    if rec_range is None:
        raise AlignmentError(str(recording.path), "the recording has no steps to align to")
    if prof_range is None:
        raise AlignmentError(path, "the profile holds no kernels, calls or markers")
    if offset_ns is not None:
        if not -(2**62) <= offset_ns <= 2**62:
            raise AlignmentError(path, f"--offset-ns {offset_ns}: out of range (within ±2^62 ns)")
        if prof_range[0] + offset_ns < 0:
            raise AlignmentError(
                path,
                f"with --offset-ns {offset_ns} its first event would start before 0 ns "
                f"({prof_range[0] + offset_ns})",
            )
        if not allow_unaligned and not overlapping_events(
            profile, rec_range[0], rec_range[1], offset_ns
        ):
            raise AlignmentError(
                path,
                f"with --offset-ns {offset_ns} none of its events falls inside the "
                f"recording's steps [{rec_range[0]}, {rec_range[1]}] BOOTTIME ns "
                "(--allow-unaligned to merge anyway)",
            )
        return Alignment(offset_ns, "explicit", "offset given by the user")
    try:
        al = _align(recording, profile, path, forward_marker)
        shifted = (prof_range[0] + al.offset_ns, prof_range[1] + al.offset_ns)
        if not overlapping_events(profile, rec_range[0], rec_range[1], al.offset_ns):
            raise AlignmentError(
                path,
                f"its time range [{shifted[0]}, {shifted[1]}] ns ({al.method}) does not "
                f"overlap the recording's steps [{rec_range[0]}, {rec_range[1]}] BOOTTIME ns "
                "(none of its events falls inside them): a trace from another host, boot or run "
                "(use --offset-ns, or --allow-unaligned to merge anyway)",
            )
        return al
    except AlignmentError:
        if not allow_unaligned:
            raise
    off = rec_range[0] - prof_range[0]
    return Alignment(
        off,
        "unaligned",
        "no alignment found; the profile's first event was placed at the recording's "
        "first step (--allow-unaligned): times across the two are not comparable",
    )


def _align(recording: Recording, profile: Profile, path: str, forward_marker: str) -> Alignment:
    if profile.clock == CLOCK_BOOTTIME:
        return Alignment(0, "same clock", f"{profile.source} timestamps are BOOTTIME already")
    if profile.clock != CLOCK_UNIX_EPOCH:
        raise AlignmentError(path, f"unknown profile clock {profile.clock!r}")
    _check_pids(recording, profile, path)
    pairs = [
        (int(p["boottime_ns"]), int(p["epoch_ns"]))
        for p in recording.processes()
        if p.get("boottime_ns") is not None and p.get("epoch_ns") is not None
    ]
    pair_off = pairs[0][0] - pairs[0][1] if pairs else None
    base = profile.meta.get("baseTimeNanoseconds")
    base_note = f"Kineto baseTimeNanoseconds {base}" if base else "Kineto absolute epoch µs"
    fwd = _forward_markers(profile, forward_marker)
    prof_pids = {m.pid for m in fwd}
    pid = next(iter(prof_pids)) if len(prof_pids) == 1 else None
    spans = _forward_spans(recording.iter_steps(pid), pid)
    match = _match_forwards(fwd, spans, pair_off)
    fwd_off: int | None = None
    residual: tuple[int, int] | None = None
    if match is not None:
        _, diffs, _score = match
        fwd_off = int(statistics.median(diffs))
    if pair_off is not None:
        if fwd_off is None:
            return Alignment(
                pair_off,
                "clock pair",
                f"recording clock pair (BOOTTIME - epoch) and {base_note}; no "
                f"'{forward_marker}' events to cross-check",
                clock_pair_offset_ns=pair_off,
            )
        assert match is not None
        res = [d - pair_off for d in match[1]]
        residual = (int(statistics.median(res)), max(abs(r) for r in res))
        if abs(fwd_off - pair_off) <= CLOCK_PAIR_TOLERANCE_NS:
            return Alignment(
                pair_off,
                "clock pair",
                f"recording clock pair (BOOTTIME - epoch) and {base_note}; checked on "
                f"{len(fwd)} '{forward_marker}' events matched with the probe's forward "
                f"spans: probe start - profile start = {residual[0]} ns median, "
                f"{residual[1]} ns at most",
                forward_pairs=len(fwd),
                forward_residual_ns=residual,
                clock_pair_offset_ns=pair_off,
                forward_offset_ns=fwd_off,
            )
    if fwd_off is None:
        raise AlignmentError(
            path,
            "cannot align: the recording has no clock pair and the profile has no "
            f"'{forward_marker}' events to match with the probe's forward spans "
            "(use --offset-ns)",
        )
    assert match is not None
    res = [d - fwd_off for d in match[1]]
    why = (
        "no clock pair in the recording"
        if pair_off is None
        else f"the clock pair's offset {pair_off} disagrees by {fwd_off - pair_off} ns"
    )
    return Alignment(
        fwd_off,
        "forward matching",
        f"{why}; the k-th '{forward_marker}' event matched with the k-th forward_launch "
        f"span from span #{match[0]} ({len(fwd)} pairs, by duration), median start "
        "difference",
        forward_pairs=len(fwd),
        forward_residual_ns=(int(statistics.median(res)), max(abs(r) for r in res)),
        clock_pair_offset_ns=pair_off,
        forward_offset_ns=fwd_off,
    )


def shift_profile(profile: Profile, offset_ns: int) -> Profile:
    """A copy of ``profile`` with every timestamp moved by ``offset_ns``, on BOOTTIME."""
    if offset_ns == 0 and profile.clock == CLOCK_BOOTTIME:
        return profile
    return Profile(
        source=profile.source,
        clock=CLOCK_BOOTTIME,
        kernels=tuple(
            replace(k, start_ns=k.start_ns + offset_ns, end_ns=k.end_ns + offset_ns)
            for k in profile.kernels
        ),
        host_calls=tuple(
            replace(c, start_ns=c.start_ns + offset_ns, end_ns=c.end_ns + offset_ns)
            for c in profile.host_calls
        ),
        markers=tuple(
            replace(m, start_ns=m.start_ns + offset_ns, end_ns=m.end_ns + offset_ns)
            for m in profile.markers
        ),
        meta={**profile.meta, "shifted_by_ns": offset_ns, "original_clock": profile.clock},
    )
