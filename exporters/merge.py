"""Merge a probe recording with a GPU profile: one timeline, and a per-step cross-check.

The profile is any file :func:`load_profile` reads: a rocprofv3 CSV directory or CSV files,
rocprofv3 JSON, a rocpd database, or a Kineto (torch profiler) trace::

    from exporters.merge import align, load_profile, merge_to_perfetto, step_table
    from probe.recording import Recording

    rec = Recording.open("run.probe.db")
    prof = load_profile(["trace.json.gz"])
    al = align(rec, prof)                # Alignment(offset_ns=..., method="clock pair", ...)
    merge_to_perfetto(rec, [(prof, al)], "merged.pftrace")
    for row in step_table(rec, prof, al).rows: ...

Clock alignment (``profile time + offset_ns = BOOTTIME``):

- rocprofv3 and rocpd are BOOTTIME already: offset 0.
- Kineto is wall-clock (epoch) ns: the recording's clock pair (``processes.boottime_ns``
  and ``epoch_ns``, sampled together when the probe attached) gives the offset. Where that
  is not enough (no pair, or the host's wall clock stepped), the k-th ``_model_forward``
  Python event is matched with the k-th ``forward_launch`` span (by their durations) and
  the median start difference is used. :class:`Alignment` says which was used and how well
  the forwards agree.
- ``offset_ns`` forces an offset; ``allow_unaligned`` puts a profile that does not overlap
  the recording at the recording's first step (for a look, not a measurement).

A profile whose processes are not in the recording (another host or run), or whose time
range does not overlap the recording after alignment, raises :class:`AlignmentError`
naming the file.

Per-step analysis (:func:`step_table`): each host call is attributed to the probe step
whose host interval holds its start (same pid), each kernel to the step of the call that
launched it (correlation id). Per step: graph launches and eager kernel launches, those
inside the probe's forward span, kernels, GPU busy/idle over the step period (from this
step's start to the next one's, the HTA union of kernel intervals), launch delays (HTA's
definition, extended to graph launches: see :class:`exporters.profiles.LaunchDelay`) and
the probe's own numbers beside them (FULL replays, piecewise pieces, forward GPU time).
"""

from __future__ import annotations

import bisect
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from exporters.profiles import (
    CLOCK_BOOTTIME,
    CLOCK_UNIX_EPOCH,
    GpuKernel,
    HostCall,
    Marker,
    Profile,
    ProfileError,
    gpu_busy_idle,
    is_graph_launch,
    launch_delays,
)

__all__ = [
    "Alignment",
    "AlignmentError",
    "StepRow",
    "StepTable",
    "align",
    "load_profile",
    "load_profiles",
    "merge_to_perfetto",
    "shift_profile",
    "step_table",
]

FORWARD_MARKER = "_model_forward"
"""Kineto Python event of the V1 runner's forward
(``vllm/v1/worker/gpu_model_runner.py(N): _model_forward``)."""

CLOCK_PAIR_TOLERANCE_NS = 1_000_000
"""Largest disagreement between the clock pair and the forward matching that still counts
as agreement (1 ms); beyond it the forward matching wins."""

_EAGER_LAUNCH = ("LaunchKernel", "LaunchCooperativeKernel", "ModuleLaunchKernel", "cuLaunch")


class AlignmentError(ValueError):
    """A profile cannot be put on the recording's clock; the message names the file."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


# --------------------------------------------------------------------------- loading


def _kind(p: Path) -> str:
    if p.is_dir():
        return "csv"
    name = p.name.lower()
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".db", ".sqlite", ".sqlite3", ".rpd")):
        return "rocpd"
    try:
        with p.open("rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise ProfileError(p, f"cannot read file: {exc.strerror or exc}") from exc
    if head.startswith(b"SQLite format 3"):
        return "rocpd"
    return "json"


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read one profile file or directory, choosing the reader by its name and content.

    A directory or ``.csv``: rocprofv3 CSV; ``.db`` or an SQLite header: rocpd; JSON (or
    ``.json.gz``): Kineto when it has ``traceEvents``, rocprofv3 JSON otherwise.
    Raises :class:`ProfileError` naming the file.
    """
    return load_profiles([path])[0]


def load_profiles(paths: Sequence[str | os.PathLike[str]]) -> list[Profile]:
    """Read profiles; all CSV files and directories given together form one profile."""
    from exporters.kineto import read_kineto
    from exporters.rocprof import read_rocpd, read_rocprofv3_csv, read_rocprofv3_json

    out: list[Profile] = []
    csvs: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise ProfileError(p, "no such file or directory")
        kind = _kind(p)
        if kind == "csv":
            csvs.append(p)
        elif kind == "rocpd":
            out.append(read_rocpd(p))
        else:
            from exporters.profiles import read_json_document

            doc = read_json_document(p)
            if isinstance(doc, dict) and "traceEvents" in doc:
                out.append(read_kineto(p))
            elif isinstance(doc, dict) and "rocprofiler-sdk-tool" in doc:
                out.append(read_rocprofv3_json(p))
            else:
                raise ProfileError(
                    p,
                    "not a profile this probe reads: JSON without 'traceEvents' (Kineto) "
                    "or 'rocprofiler-sdk-tool' (rocprofv3)",
                )
    if csvs:
        prof = read_rocprofv3_csv(csvs)
        meta = dict(prof.meta)
        meta.setdefault("path", ", ".join(str(c) for c in csvs))
        out.insert(0, replace(prof, meta=meta))
    return out


def profile_path(profile: Profile) -> str:
    """The file(s) a profile came from, for messages."""
    meta = profile.meta
    for key in ("path", "paths", "files"):
        v = meta.get(key)
        if isinstance(v, str) and v:
            return v
        if isinstance(v, list | tuple) and v:
            return ", ".join(str(x) for x in v)
    return f"<{profile.source} profile>"


# --------------------------------------------------------------------------- alignment


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


def _recording_range(recording: Any) -> tuple[int, int] | None:
    row = recording.db.execute("SELECT min(t0_ns), max(t1_ns) FROM steps").fetchone()
    if row is None or row[0] is None:
        return None
    return int(row[0]), int(row[1])


def _profile_range(profile: Profile) -> tuple[int, int] | None:
    starts = [
        x.start_ns
        for seq in (profile.kernels, profile.host_calls, profile.markers)
        for x in seq[:1]
    ]
    ends = [
        max(x.end_ns for x in seq)
        for seq in (profile.kernels, profile.host_calls, profile.markers)
        if seq
    ]
    if not starts:
        return None
    return min(starts), max(ends)


def _forward_spans(recording: Any, pid: int | None = None) -> list[tuple[int, int]]:
    q = "SELECT t0_ns, t1_ns FROM spans WHERE phase = 'forward_launch' AND drafter = 0"
    params: tuple[Any, ...] = ()
    if pid is not None:
        q += " AND pid = ?"
        params = (pid,)
    return [(int(a), int(b)) for a, b in recording.db.execute(q + " ORDER BY t0_ns", params)]


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
    import math

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


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _check_pids(recording: Any, profile: Profile, path: str) -> None:
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
    recording: Any,
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
    rec_range = _recording_range(recording)
    prof_range = _profile_range(profile)
    if rec_range is None:
        raise AlignmentError(str(recording.path), "the recording has no steps to align to")
    if prof_range is None:
        raise AlignmentError(path, "the profile holds no kernels, calls or markers")
    if offset_ns is not None:
        return Alignment(offset_ns, "explicit", "offset given by the user")
    try:
        al = _align(recording, profile, path, forward_marker)
        shifted = (prof_range[0] + al.offset_ns, prof_range[1] + al.offset_ns)
        if not _overlaps(shifted, rec_range):
            raise AlignmentError(
                path,
                f"its time range [{shifted[0]}, {shifted[1]}] ns ({al.method}) does not "
                f"overlap the recording's steps [{rec_range[0]}, {rec_range[1]}] BOOTTIME ns: "
                "a trace from another host, boot or run (use --offset-ns, or "
                "--allow-unaligned to merge anyway)",
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


def _align(recording: Any, profile: Profile, path: str, forward_marker: str) -> Alignment:
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
    spans = _forward_spans(recording, next(iter(prof_pids)) if len(prof_pids) == 1 else None)
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


# --------------------------------------------------------------------------- per step


def is_eager_launch(name: str) -> bool:
    """A kernel launch that is not a graph replay (``cudaLaunchKernel``, ``hipLaunchKernel``,
    ``hipExtModuleLaunchKernel``, ``cuLaunchKernelEx``...)."""
    return not is_graph_launch(name) and any(t in name for t in _EAGER_LAUNCH)


@dataclass(frozen=True)
class StepRow:
    """One probe step with what the profile saw in it (times in ns)."""

    pid: int
    step: int
    t0_ns: int
    t1_ns: int
    mode: str | None
    reason: str | None
    probe_full_replays: int
    probe_piecewise_pieces: int
    probe_forward_ns: int
    probe_gpu_busy_ns: int | None
    graph_launches: int
    graph_launches_in_forward: int
    eager_launches: int
    kernels: int
    gpu_busy_ns: int
    gpu_idle_ns: int
    forward_gpu_ns: int | None
    graph_launch_delay_ns: int | None
    eager_launch_delay_median_ns: int | None

    @property
    def launches_agree(self) -> bool:
        """The probe's target replays equal the graph launches inside its forward span."""
        return (
            self.probe_full_replays + self.probe_piecewise_pieces == self.graph_launches_in_forward
        )


@dataclass(frozen=True)
class StepTable:
    """Per-step rows and their totals; ``alignment`` is how the profile was placed."""

    rows: tuple[StepRow, ...]
    alignment: Alignment
    unattributed_calls: int
    totals: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "alignment": {
                "offset_ns": self.alignment.offset_ns,
                "method": self.alignment.method,
                "detail": self.alignment.detail,
                "forward_pairs": self.alignment.forward_pairs,
                "forward_residual_ns": self.alignment.forward_residual_ns,
                "clock_pair_offset_ns": self.alignment.clock_pair_offset_ns,
                "forward_offset_ns": self.alignment.forward_offset_ns,
            },
            "totals": self.totals,
            "unattributed_calls": self.unattributed_calls,
            "steps": [
                {
                    **{f: getattr(r, f) for f in r.__dataclass_fields__},
                    "launches_agree": r.launches_agree,
                }
                for r in self.rows
            ],
        }


def step_table(
    recording: Any, profile: Profile, alignment: Alignment, *, drafter: bool = False
) -> StepTable:
    """Attribute the profile's launches and kernels to the recording's steps.

    Only steps that overlap the profile's time range are listed. ``drafter`` also counts
    the drafter's replays on the probe side (the forward span is the target's).
    """
    prof = shift_profile(profile, alignment.offset_ns)
    pr = _profile_range(prof)
    steps = [
        s
        for s in recording.steps()
        if pr is not None and _overlaps((int(s["t0_ns"]), int(s["t1_ns"])), pr)
    ]
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for s in steps:
        by_pid.setdefault(int(s["pid"]), []).append(s)
    starts = {pid: [int(s["t0_ns"]) for s in ss] for pid, ss in by_pid.items()}
    single_pid = next(iter(by_pid)) if len(by_pid) == 1 else None

    def step_of(pid: int, t: int) -> tuple[int, int] | None:
        key = pid if pid in by_pid else single_pid
        if key is None:
            return None
        i = bisect.bisect_right(starts[key], t) - 1
        if i < 0 or t > int(by_pid[key][i]["t1_ns"]):
            return None
        return key, int(by_pid[key][i]["step"])

    keys = {(int(s["pid"]), int(s["step"])) for s in steps}
    fwd_spans: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r in recording.rows("spans"):
        k = (int(r["pid"]), int(r["step"]))
        if k in keys and r["phase"] == "forward_launch" and not r["drafter"]:
            fwd_spans.setdefault(k, []).append((int(r["t0_ns"]), int(r["t1_ns"])))
    full: dict[tuple[int, int], int] = {}
    pieces: dict[tuple[int, int], int] = {}
    for r in recording.rows("replays"):
        k = (int(r["pid"]), int(r["step"]))
        if k not in keys or r["kind"] != "replay" or (r["drafter"] and not drafter):
            continue
        if r["mode"] == "full":
            full[k] = full.get(k, 0) + 1
        elif r["mode"] == "piecewise":
            pieces[k] = pieces.get(k, 0) + 1

    calls: dict[tuple[int, int], list[HostCall]] = {}
    unattributed = 0
    step_of_corr: dict[int, tuple[int, int]] = {}
    for c in prof.host_calls:
        at = step_of(c.pid, c.start_ns)
        if at is None:
            unattributed += is_graph_launch(c.name) or is_eager_launch(c.name)
            continue
        calls.setdefault(at, []).append(c)
        if c.correlation_id is not None:
            step_of_corr.setdefault(c.correlation_id, at)
    kernels: dict[tuple[int, int], list[GpuKernel]] = {}
    for kern in prof.kernels:
        if kern.correlation_id is not None and kern.correlation_id in step_of_corr:
            kernels.setdefault(step_of_corr[kern.correlation_id], []).append(kern)
    delays: dict[tuple[int, int], list[Any]] = {}
    for d in launch_delays(prof):
        at = step_of_corr.get(d.correlation_id)
        if at is not None:
            delays.setdefault(at, []).append(d)

    rows: list[StepRow] = []
    for pid, ss in sorted(by_pid.items()):
        periods = [
            (int(s["t0_ns"]), int(ss[i + 1]["t0_ns"]) if i + 1 < len(ss) else int(s["t1_ns"]))
            for i, s in enumerate(ss)
        ]
        busy = gpu_busy_idle(prof, periods)
        for s, bi in zip(ss, busy, strict=True):
            k = (pid, int(s["step"]))
            cs = calls.get(k, [])
            spans = fwd_spans.get(k, [])

            def in_fwd(c: HostCall, spans: list[tuple[int, int]] = spans) -> bool:
                return any(a <= c.start_ns <= b for a, b in spans)

            graph = [c for c in cs if is_graph_launch(c.name)]
            eager = [c for c in cs if is_eager_launch(c.name)]
            fwd_corr = {c.correlation_id for c in cs if in_fwd(c) and c.correlation_id}
            fk = [x for x in kernels.get(k, []) if x.correlation_id in fwd_corr]
            ds = delays.get(k, [])
            g_delays = [d.start_to_start_ns for d in ds if d.is_graph_launch]
            e_delays = [d.end_to_start_ns for d in ds if not d.is_graph_launch]
            rows.append(
                StepRow(
                    pid=pid,
                    step=int(s["step"]),
                    t0_ns=int(s["t0_ns"]),
                    t1_ns=int(s["t1_ns"]),
                    mode=s.get("mode"),
                    reason=s.get("reason"),
                    probe_full_replays=full.get(k, 0),
                    probe_piecewise_pieces=pieces.get(k, 0),
                    probe_forward_ns=sum(b - a for a, b in spans),
                    probe_gpu_busy_ns=s.get("gpu_busy_ns"),
                    graph_launches=len(graph),
                    graph_launches_in_forward=sum(1 for c in graph if in_fwd(c)),
                    eager_launches=len(eager),
                    kernels=len(kernels.get(k, [])),
                    gpu_busy_ns=bi.busy_ns,
                    gpu_idle_ns=bi.idle_ns,
                    forward_gpu_ns=(max(x.end_ns for x in fk) - min(x.start_ns for x in fk))
                    if fk
                    else None,
                    graph_launch_delay_ns=g_delays[0] if g_delays else None,
                    eager_launch_delay_median_ns=int(statistics.median(e_delays))
                    if e_delays
                    else None,
                )
            )
    totals = {
        "steps": len(rows),
        "probe_full_replays": sum(r.probe_full_replays for r in rows),
        "probe_piecewise_pieces": sum(r.probe_piecewise_pieces for r in rows),
        "graph_launches": sum(r.graph_launches for r in rows),
        "graph_launches_in_forward": sum(r.graph_launches_in_forward for r in rows),
        "eager_launches": sum(r.eager_launches for r in rows),
        "kernels": sum(r.kernels for r in rows),
        "steps_agreeing": sum(1 for r in rows if r.launches_agree),
    }
    return StepTable(tuple(rows), alignment, unattributed, totals)


def format_step_table(table: StepTable) -> str:
    """The per-step table as plain text (``probe merge --report``)."""

    def us(v: int | None) -> str:
        return "-" if v is None else f"{v / 1000:.1f}"

    head = (
        f"{'step':>6} {'mode/reason':<24} {'probe FULL':>10} {'graph':>5} {'in fwd':>6} "
        f"{'eager':>5} {'kernels':>7} {'GPU busy µs':>11} {'idle µs':>9} "
        f"{'fwd GPU µs':>10} {'probe GPU µs':>12} {'graph delay µs':>14} {'eager delay µs':>14} ok"
    )
    lines = [f"alignment: {table.alignment.describe()}", head]
    for r in table.rows:
        mr = f"{r.mode or '-'}/{r.reason or '-'}"
        lines.append(
            f"{r.step:>6} {mr:<24} {r.probe_full_replays + r.probe_piecewise_pieces:>10} "
            f"{r.graph_launches:>5} {r.graph_launches_in_forward:>6} {r.eager_launches:>5} "
            f"{r.kernels:>7} {us(r.gpu_busy_ns):>11} {us(r.gpu_idle_ns):>9} "
            f"{us(r.forward_gpu_ns):>10} {us(r.probe_gpu_busy_ns):>12} "
            f"{us(r.graph_launch_delay_ns):>14} {us(r.eager_launch_delay_median_ns):>14} "
            f"{'yes' if r.launches_agree else 'NO'}"
        )
    t = table.totals
    lines.append(
        f"total: {t['steps']} steps; probe target replays {t['probe_full_replays']} FULL + "
        f"{t['probe_piecewise_pieces']} piecewise; graph launches {t['graph_launches']} "
        f"({t['graph_launches_in_forward']} inside the forward); eager launches "
        f"{t['eager_launches']}; kernels {t['kernels']}; steps agreeing "
        f"{t['steps_agreeing']}/{t['steps']}; launches outside any step "
        f"{table.unattributed_calls}"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- timeline


def merge_to_perfetto(
    recording: Any,
    profiles: Sequence[tuple[Profile, Alignment]],
    path: str | os.PathLike[str],
) -> dict[str, int]:
    """Write one Perfetto trace: the recording's tracks above each profile's GPU kernels.

    Host calls and markers of a recorded pid go under that process; kernels go on
    ``GPU <device>`` tracks, one child per stream; each launch (graph launches included)
    gets a flow arrow to every kernel it launched. Returns counts of what was written.
    """
    from exporters.perfetto import Slice, TraceBuilder, recording_tracks

    b = TraceBuilder()
    tracks = recording_tracks(b, recording)
    counts = dict(tracks.counts)
    counts.update(kernels=0, host_calls=0, markers=0, flows=0)
    for profile, al in profiles:
        prof = shift_profile(profile, al.offset_ns)
        src = profile.source
        proc: dict[int, int] = dict(tracks.process)
        sub: dict[tuple[int, int, str], int] = {}

        def host_track(
            pid: int,
            tid: int,
            what: str,
            proc: dict[int, int] = proc,
            sub: dict[tuple[int, int, str], int] = sub,
            src: str = src,
        ) -> int:
            if pid not in proc:
                proc[pid] = b.process_track(pid, f"{src} process {pid}")
            key = (pid, tid, what)
            if key not in sub:
                sub[key] = b.child_track(proc[pid], f"{src} {what} (tid {tid})")
            return sub[key]

        by_corr: dict[int, list[GpuKernel]] = {}
        for k in prof.kernels:
            if k.correlation_id is not None:
                by_corr.setdefault(k.correlation_id, []).append(k)
        flow_in: dict[int, int] = {}
        for c in prof.host_calls:
            flows: tuple[int, ...] = ()
            ks = by_corr.get(c.correlation_id) if c.correlation_id is not None else None
            if ks:
                ids = []
                for k in ks:
                    if id(k) not in flow_in:
                        f = b.flow_id()
                        flow_in[id(k)] = f
                        ids.append(f)
                flows = tuple(ids)
                counts["flows"] += len(ids)
            b.add(
                host_track(c.pid, c.tid, "runtime"),
                Slice(
                    c.name,
                    c.start_ns,
                    c.end_ns,
                    c.domain,
                    {
                        "correlation": c.correlation_id,
                        "external_id": c.external_id,
                        "graph_launch": c.is_graph_launch or None,
                    },
                    flows_out=flows,
                ),
            )
            counts["host_calls"] += 1
        for m in prof.markers:
            b.add(
                host_track(m.pid, m.tid, "markers"),
                Slice(m.name, m.start_ns, m.end_ns, m.category),
            )
            counts["markers"] += 1
        gpus: dict[int | None, int] = {}
        streams: dict[tuple[int | None, int | None], int] = {}
        for k in prof.kernels:
            if k.device not in gpus:
                gpus[k.device] = b.child_track(None, f"GPU {k.device} ({src})")
            sk = (k.device, k.stream)
            if sk not in streams:
                streams[sk] = b.child_track(gpus[k.device], f"stream {k.stream}")
            fin = flow_in.get(id(k))
            b.add(
                streams[sk],
                Slice(
                    k.name,
                    k.start_ns,
                    k.end_ns,
                    "kernel",
                    {"correlation": k.correlation_id, "device": k.device, "stream": k.stream},
                    flows_in=(fin,) if fin is not None else (),
                ),
            )
            counts["kernels"] += 1
    b.write(path)
    return counts
