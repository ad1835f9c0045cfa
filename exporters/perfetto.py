"""Perfetto timelines of a recording: steps, phases, builds and graph decisions on BOOTTIME.

:func:`write_recording` writes a ``.pftrace`` (protobuf ``TracePacket``/``TrackEvent``,
the format ``ui.perfetto.dev`` and ``trace_processor`` read natively)::

    from exporters.perfetto import write_recording
    from probe.reader.recording import Recording

    write_recording(Recording.open("run.probe.db"), "run.pftrace")
    # open https://ui.perfetto.dev and drop run.pftrace on it ("Open trace file")

Layout: one process track per vLLM process (pid), named by role and rank, and under it

- a thread track ``<role> tp<N> pp<M>`` with one slice per engine step (``step 12 FULL
  hit``; args: mode, reason, tokens, padding, CPU launch overhead, GPU busy/idle...) and
  the host phases nested inside it (``execute`` > ``prepare_inputs`` > ...);
- ``graph decisions``: one slice per dispatch (args ``mode``, ``reason``, batch shape)
  and per confirmed replay or capture;
- ``metadata builds``: one slice per builder call (builder class, tag, batch shape);
- ``reorder``: one slice per reorder decision, and an instant mark when the batch order
  changed.

Every packet carries ``timestamp_clock_id = BUILTIN_CLOCK_BOOTTIME`` (6), the clock of
the recording, of rocprofv3 and of Perfetto's own system traces, so the file lines up with
them without translation. The recording's (BOOTTIME, wall-clock) pair is written as a
``ClockSnapshot`` so that tools can convert to wall time.

:class:`TraceBuilder` is the lower layer (tracks, slices that nest, flows); the merge of a
recording with a GPU profile (:mod:`exporters.timelines.merge`) uses it too. Needs the ``perfetto``
package (``pip install 'vllm-graph-probe[perfetto]'``).
"""

from __future__ import annotations

import enum
import itertools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exporters.perfetto_stream import (  # noqa: F401  (re-exported)
    SPILL_AT,
    ArgValue,
    EventEncoder,
    Item,
    Key,
    Runs,
    framed,
    lane_events,
    packed,
    unpacked,
    varint,
)
from exporters.perfetto_stream import (
    Slice as Slice,
)
from exporters.perfetto_stream import (
    Spool as Spool,
)
from exporters.perfetto_stream import (
    split_lanes as split_lanes,
)

# the trace writer (re-exported: callers import it here)
from exporters.perfetto_trace import BOOTTIME_CLOCK_ID as BOOTTIME_CLOCK_ID
from exporters.perfetto_trace import REALTIME_CLOCK_ID as REALTIME_CLOCK_ID
from exporters.perfetto_trace import (
    PerfettoUnavailableError as PerfettoUnavailableError,
)
from exporters.perfetto_trace import TraceBuilder as TraceBuilder
from exporters.perfetto_trace import protos as protos
from probe.progress import SILENT, Progress
from probe.reader.recording import Recording
from probe.reader.recording_schema import DETAIL_TABLES
from probe.records import Dispatch, Flag, Mode, Phase, Replay, Span
from probe.step import Step

__all__ = [
    "BOOTTIME_CLOCK_ID",
    "PerfettoUnavailableError",
    "Slice",
    "TraceBuilder",
    "drafter_prefix",
    "phase_name",
    "recording_tracks",
    "step_name",
    "write_recording",
]

# --------------------------------------------------------------------------- recordings


def _process_name(proc: Mapping[str, Any]) -> str:
    role = proc.get("role") or "vLLM process"
    parts = [f"vLLM {role}"]
    for key, label in (("tp_rank", "tp"), ("pp_rank", "pp"), ("dp_rank", "dp")):
        if proc.get(key) is not None:
            parts.append(f"{label}{proc[key]}")
    return " ".join(parts)


def _thread_name(proc: Mapping[str, Any]) -> str:
    role = proc.get("role") or "main"
    return f"{role} tp{proc.get('tp_rank') or 0} pp{proc.get('pp_rank') or 0}"


_STEP_ARGS = (
    "mode",
    "reason",
    "runner",
    "num_tokens",
    "padded_tokens",
    "num_reqs",
    "padded_reqs",
    "max_query_len",
    "uniform_decode_query_len",
    "uniform",
    "replayed",
    "pieces",
    "captures",
    "host_ns",
    "cpu_launch_overhead_ns",
    "gpu_busy_ns",
    "gpu_idle_before_ns",
    "gpu_step_ns",
    "draft_mode",
    "draft_reason",
    "draft_replays",
    "draft_dispatches",
)


def step_name(step: Step) -> str:
    """``step 12 FULL hit`` (``step 12`` when the step ran no forward)."""
    if step.mode is None:
        return f"step {step.step}"
    reason = step.reason.name.lower() if step.reason is not None else ""
    return f"step {step.step} {step.mode.name} {reason}".strip()


@dataclass(frozen=True)
class RecordingTracks:
    """What :func:`recording_tracks` added to a builder, per pid."""

    process: dict[int, int]
    thread: dict[int, int]
    counts: dict[str, int]


def drafter_prefix(rec: Dispatch | Replay) -> str:
    """``"drafter "`` for a record of the drafter (MTP proposer), else ``""``."""
    return "drafter " if rec.flags & Flag.DRAFTER else ""


def phase_name(span: Span) -> str:
    """``forward_launch``; ``forward_launch (drafter)`` for the drafter's."""
    return span.phase.name.lower() + (" (drafter)" if span.flags & Flag.DRAFTER else "")


def _kept(known: _StepKeys, c: Mapping[str, Any]) -> Any:
    """The rows of a detail batch's checked columns ``c`` that belong to a step."""
    return known.mask(c["pid"], c["step"])


class _StepKeys:
    """Which detail rows belong to a step of the ``steps`` table (a row of a step not there
    belongs to none, as :meth:`Recording.iter_steps` reads it), for batches in (pid, step)
    order: the step keys read a batch at a time as far as the rows asked about reach."""

    def __init__(self, recording: Any) -> None:
        import numpy as np

        self._batches = iter(recording.batches("steps", ["pid", "step"]))
        self._pid = np.zeros(0, np.int64)
        self._step = np.zeros(0, np.int64)
        self._done = False

    def mask(self, pid: Any, step: Any) -> Any:
        import numpy as np

        if len(pid) == 0:
            return np.zeros(0, bool)
        last = (int(pid[-1]), int(step[-1]))
        while not self._done and (
            len(self._pid) == 0 or (int(self._pid[-1]), int(self._step[-1])) < last
        ):
            b = next(self._batches, None)
            if b is None:
                self._done = True
                break
            self._pid = np.concatenate([self._pid, b.column(0).to_numpy().astype(np.int64)])
            self._step = np.concatenate([self._step, b.column(1).to_numpy().astype(np.int64)])
        wide = (
            max(int(pid.max()), int(self._pid.max(initial=0))) >= 1 << 31
            or max(int(step.max()), int(self._step.max(initial=0))) >= 1 << 32
        )
        if wide:  # keys that do not pack into one integer: as tuples
            have = set(zip(self._pid.tolist(), self._step.tolist(), strict=True))
            out = np.array([k in have for k in zip(pid.tolist(), step.tolist(), strict=True)])
        else:
            have_k = (self._pid << 32) | self._step
            k = (pid.astype(np.int64) << 32) | step.astype(np.int64)
            at = np.searchsorted(have_k, k)
            out = have_k[np.minimum(at, len(have_k) - 1)] == k if len(have_k) else at < 0
        first = (int(pid[0]), int(step[0]))
        keep = 0  # keys before this batch's first row are not asked about again
        while keep < len(self._pid) and (int(self._pid[keep]), int(self._step[keep])) < first:
            keep += 1
        if keep:
            self._pid, self._step = self._pid[keep:], self._step[keep:]
        return out


def _names(kind: Any) -> tuple[list[str], list[str]]:
    """An enum's members as a column's codes index them: their names, and lower-case."""
    members = [kind.__members__[n] for n in kind.__members__]
    return [m.name for m in members], [m.name.lower() for m in members]


def _step_values(cols: Mapping[str, Any], c: Any) -> list[Any]:
    """One column of a chunk of :func:`iter_step_columns` as :func:`step_fields` gives its
    values: an enum its lower-case name, the runner its text, NULL None."""
    from probe.reader.recording_columns import null_mask

    v = cols[c.name]
    if c.kind is str:
        return [c.choices[i] for i in v.tolist()]
    if isinstance(c.kind, type) and issubclass(c.kind, enum.Enum):
        lower = {int(m.value): m.name.lower() for m in c.kind.__members__.values()}
        return [lower.get(i) for i in v.tolist()]  # NULL (-1): None
    out: list[Any] = v.tolist()
    if c.nullable:
        for i in np.flatnonzero(null_mask(cols, c.name)).tolist():
            out[i] = None
    return out


def _pid_runs(pids: Any) -> list[tuple[int, int, int]]:
    """(pid, first row, end row) of each run of one pid in a batch's pid column."""
    cuts = [0, *(np.flatnonzero(np.diff(pids)) + 1).tolist(), len(pids)]
    return [(int(pids[a]), a, b) for a, b in itertools.pairwise(cuts)]


_STEP_KEYS = ("step", *_STEP_ARGS)
_DETAIL_KEYS = {
    t.name: ("step", *(c.name for c in t.columns if c.name not in ("t0_ns", "t1_ns")))
    for t in DETAIL_TABLES
}


def recording_tracks(
    builder: TraceBuilder, recording: Recording, progress: Progress = SILENT
) -> RecordingTracks:
    """Add a recording's processes, steps, phases and decisions to ``builder``.

    Returns the track uuids and the number of slices of each category (``step``,
    ``phase``, ``dispatch``, ``replay``, ``build``, ``reorder``, ``reorder_mark``). The
    args of a slice are the values its recording row holds
    (:func:`probe.reader.recording.step_fields`, :func:`probe.reader.recording.record_fields`).
    ``progress`` counts the records (steps and their detail records) as they are added.

    The recording is read as column batches, a table at a time, every value checked
    (:func:`probe.reader.recording_columns.iter_step_columns`,
    :func:`probe.reader.columnar_columns.detail_columns`); each kind of slice has its rank,
    so the trace is the one a pass over the steps (:meth:`Recording.iter_steps`) adding
    each step's slices in turn gives.
    """
    procs = {int(p["pid"]): p for p in recording.processes()}
    progress.stage("reading records", recording.record_count(), "records")
    for pid in recording.step_counts():  # a step whose process row is missing gets a track
        procs.setdefault(pid, {"pid": pid})
    process: dict[int, int] = {}
    thread: dict[int, int] = {}
    sub: dict[tuple[int, str], int] = {}
    for pid in sorted(procs):
        p = procs[pid]
        process[pid] = builder.process_track(pid, _process_name(p))
        thread[pid] = builder.thread_track(pid, pid, _thread_name(p))
        for name in ("graph decisions", "metadata builds", "reorder"):
            sub[(pid, name)] = builder.child_track(process[pid], name)
        if p.get("boottime_ns") is not None and p.get("epoch_ns") is not None:
            builder.clock_pair(int(p["boottime_ns"]), int(p["epoch_ns"]))
    counts = dict.fromkeys(
        ("step", "phase", "dispatch", "replay", "build", "reorder", "reorder_mark"), 0
    )
    _add_steps(builder, recording, thread, counts, progress)
    _add_spans(builder, recording, thread, counts, progress)
    _place_decisions(builder, recording, sub)
    _add_details(builder, recording, sub, counts, progress)
    return RecordingTracks(process, thread, counts)


def _add_steps(
    builder: TraceBuilder, rec: Any, thread: Mapping[int, int], counts: dict[str, int],
    progress: Progress,
) -> None:  # fmt: skip
    """One slice per step (rank 0), named ``step 12 FULL hit``, its row's values as args."""
    from probe.reader.recording_columns import iter_step_columns
    from probe.step import STEP_COLUMNS

    by_name = {c.name: c for c in STEP_COLUMNS}
    upper = {int(m.value): m.name for m in Mode.__members__.values()}
    for cols in iter_step_columns(rec, chunk=16_384, only=_STEP_ARGS):
        values = {k: _step_values(cols, by_name[k]) for k in _STEP_ARGS}
        steps = cols["step"].tolist()
        modes = [upper.get(m) for m in cols["mode"].tolist()]
        reasons = values["reason"]
        names = [
            f"step {n}" if m is None else f"step {n} {m} {r or ''}".strip()
            for n, m, r in zip(steps, modes, reasons, strict=True)
        ]
        args = list(zip(steps, *(values[k] for k in _STEP_ARGS), strict=True))
        t0, t1 = cols["t0_ns"].tolist(), cols["t1_ns"].tolist()
        for pid, a, b in _pid_runs(cols["pid"]):
            rows = [
                (names[i], t0[i], t1[i], "step", _STEP_KEYS, args[i], (), ()) for i in range(a, b)
            ]
            builder._add_packed(thread[pid], 0, rows)
        counts["step"] += len(steps)
        progress.advance(len(steps))


def _detail_batches(rec: Any, table: str, columns: list[str] | None = None) -> Iterator[Any]:
    """Each batch of detail ``table`` (``columns`` of it) with its checked columns and the
    rows that belong to a step: (batch, columns, kept), kept rows only."""
    from probe.reader.columnar_read import detail_columns

    known = _StepKeys(rec)
    for b in rec.batches(table, columns, size=16_384):
        c = detail_columns(rec, table, b)
        keep = _kept(known, c)
        if not keep.all():
            idx = np.flatnonzero(keep)
            b = b.take(idx)
            c = {k: v[idx] for k, v in c.items()}
        if b.num_rows:
            yield b, c


def _add_spans(
    builder: TraceBuilder, rec: Any, thread: Mapping[int, int], counts: dict[str, int],
    progress: Progress,
) -> None:  # fmt: skip
    """One slice per phase span (rank 1), inside its step's on the thread track."""
    _, lower = _names(Phase)
    keys = ("step",)
    for _, c in _detail_batches(rec, "spans"):
        steps = c["step"].tolist()
        names = [
            lower[p] + (" (drafter)" if d else "")
            for p, d in zip(c["phase"].tolist(), c["drafter"].tolist(), strict=True)
        ]
        t0, t1 = c["t0_ns"].tolist(), c["t1_ns"].tolist()
        for pid, a, b in _pid_runs(c["pid"]):
            rows = [
                (names[i], t0[i], t1[i], "phase", keys, (steps[i],), (), ()) for i in range(a, b)
            ]
            builder._add_packed(thread[pid], 1, rows)
        counts["phase"] += len(steps)
        progress.advance(len(steps))


def _first_steps(rec: Any, table: str) -> dict[int, int]:
    """Per pid, the first step with a row of detail ``table``."""
    out: dict[int, int] = {}
    for _, c in _detail_batches(rec, table, ["pid", "step"]):
        for pid, a, _ in _pid_runs(c["pid"]):
            out.setdefault(pid, int(c["step"][a]))
    return out


def _place_decisions(builder: TraceBuilder, rec: Any, sub: Mapping[tuple[int, str], int]) -> None:
    """A process whose first decision is a replay (no dispatch at or before its step) has
    its decisions track placed with the tracks that begin with a replay, as a pass over
    the steps puts it."""
    dispatched = _first_steps(rec, "dispatches")
    for pid, step in sorted(_first_steps(rec, "replays").items()):
        if pid not in dispatched or step < dispatched[pid]:
            builder._reserve(sub[(pid, "graph decisions")], 3)


def _add_details(
    builder: TraceBuilder, rec: Any, sub: Mapping[tuple[int, str], int], counts: dict[str, int],
    progress: Progress,
) -> None:  # fmt: skip
    """Dispatches (rank 2) and replays (rank 3) on the graph decisions track, builds
    (rank 4) on the metadata builds track, reorders and their marks (rank 5) on the reorder
    track; a slice's args are its row's values but the times, step first."""
    tables = {t.name: t for t in DETAIL_TABLES}
    passes = (("dispatches", 2, "graph decisions"), ("replays", 3, "graph decisions"),
              ("builds", 4, "metadata builds"), ("reorders", 5, "reorder"))  # fmt: skip
    for table, rank, track in passes:
        t = tables[table]
        keys = _DETAIL_KEYS[table]
        decode: dict[str, list[str]] = {}
        for col in t.columns:
            if isinstance(col.kind, type) and issubclass(col.kind, enum.Enum):
                decode[col.name], decode[col.name + ".lower"] = _names(col.kind)
        category = {"dispatches": "dispatch", "replays": "replay", "builds": "build"}.get(
            table, "reorder"
        )
        for b, c in _detail_batches(rec, table):
            n = b.num_rows
            vals: dict[str, list[Any]] = {"step": c["step"].tolist()}
            for k in keys[1:]:
                if k == "builder":
                    vals[k] = [x if isinstance(x, str) else "?" for x in b.column(k).to_pylist()]
                elif k in decode:
                    vals[k] = [decode[k + ".lower"][i] for i in c[k].tolist()]
                else:
                    vals[k] = c[k].tolist()
            args = list(zip(*(vals[k] for k in keys), strict=True))
            if table == "dispatches":
                modes = [decode["mode"][i] for i in c["mode"].tolist()]
                names = [
                    f"{'drafter ' if d else ''}dispatch {m} {r}"
                    for d, m, r in zip(vals["drafter"], modes, vals["reason"], strict=True)
                ]
            elif table == "replays":
                modes = [decode["mode"][i] for i in c["mode"].tolist()]
                names = [
                    f"{'drafter ' if d else ''}{k} {m}"
                    for d, k, m in zip(vals["drafter"], vals["kind"], modes, strict=True)
                ]
            elif table == "builds":
                names = [f"{x} ({g})" for x, g in zip(vals["builder"], vals["tag"], strict=True)]
            else:
                names = ["reorder (changed)" if x else "reorder" for x in vals["changed"]]
            t0, t1 = c["t0_ns"].tolist(), c["t1_ns"].tolist()
            for pid, a, e in _pid_runs(c["pid"]):
                rows: list[tuple[Any, ...]] = []
                for i in range(a, e):
                    rows.append((names[i], t0[i], t1[i], category, keys, args[i], (), ()))
                    if table == "reorders" and vals["changed"][i]:
                        mark = f"reorder moved {vals['moved'][i]}"
                        rows.append((mark, t1[i], t1[i], category, keys, args[i], (), ()))
                builder._add_packed(sub[(pid, track)], rank, rows)
            counts[category] += n
            if table == "reorders":
                counts["reorder_mark"] += sum(vals["changed"])
            progress.advance(n)


def rank_tracks(builder: TraceBuilder, recording: Recording) -> dict[str, int]:
    """Add ranks side by side (:mod:`probe.analysis.ranks`) as aligned tracks.

    Per engine with two workers or more: a top-level track ``ranks side by side (engine
    dpN)`` with one child track per rank (``tp0 pid 3602``); on each, one slice per matched
    step from the rank's step start to its arrival (its forward fully enqueued; its
    forward's start on a CPU engine), named ``step N`` (category ``rank``). The last
    rank's slice is ``step N last +X us (phase)`` (category ``rank_last``) and an instant
    on the engine's track marks when it arrived (``rank_mark``). One host's recording:
    the tracks share its BOOTTIME. Returns the slices added per category.
    """
    from probe.analysis.ranks import recording_ranks
    from probe.analysis.ranks_columns import per_step_of_columns

    rr = recording_ranks(recording)
    counts = dict.fromkeys(("rank", "rank_last", "rank_mark"), 0)
    for e in rr.engines:
        labels = [r.rank.label for r in e]
        top = builder.child_track(None, f"ranks side by side (engine dp{e[0].rank.dp_rank})")
        tracks = [builder.child_track(top, f"{r.rank.label} pid {r.rank.pid}") for r in e]
        it, _ = per_step_of_columns(recording, e, sync_launch=rr.sync_launch)
        for sr in it:
            for i, track in enumerate(tracks):
                args: dict[str, ArgValue] = {"step": sr.steps[i], "rank": labels[i]}
                if i != sr.last:
                    builder.add(track, Slice(f"step {sr.step}", sr.start_ns[i], sr.end_ns[i],
                                             "rank", args))  # fmt: skip
                    counts["rank"] += 1
                    continue
                why: dict[str, ArgValue] = {"skew_ns": sr.skew_ns, "phase": sr.phase or "",
                       "phase_excess_ns": sr.phase_excess_ns}  # fmt: skip
                if sr.wait_ns is not None:
                    why["others_gpu_wait_ns"] = sr.wait_ns
                name = f"step {sr.step} last +{sr.skew_ns / 1e3:,.1f} us ({sr.phase})"
                builder.add(
                    track, Slice(name, sr.start_ns[i], sr.end_ns[i], "rank_last", args | why)
                )
                builder.add(
                    top,
                    Slice(f"{labels[i]} last ({sr.phase})", sr.end_ns[i], sr.end_ns[i],
                          "rank_mark", args | why),
                )  # fmt: skip
                counts["rank_last"] += 1
                counts["rank_mark"] += 1
    return counts


def write_recording(
    recording: Recording, path: str | os.PathLike[str], *, progress: Progress = SILENT
) -> Path:
    """Write a recording as a Perfetto trace (``.pftrace``); returns the path.

    ``recording`` is an open :class:`probe.reader.recording.Recording`. Timestamps stay on
    BOOTTIME (``timestamp_clock_id = 6``). Raises :class:`PerfettoUnavailableError` when
    the ``perfetto`` package is missing. ``progress`` gets two stages: the records read,
    the slices encoded.
    """
    builder = TraceBuilder()
    recording_tracks(builder, recording, progress)
    rank_tracks(builder, recording)
    return builder.write(path, progress)


def write(
    recording: Recording, target: str | os.PathLike[str], *, progress: Progress = SILENT
) -> Path:
    """The exporter contract's offline half (:mod:`exporters.registry`): :func:`write_recording`."""
    return write_recording(recording, target, progress=progress)
