"""A rocpd side-car database of a recording, for ``rocpd merge`` / ``rocpd convert``.

:func:`write_sidecar` writes the probe's steps, phase spans, graph decisions and reorder
decisions as rocpd regions (the storage roctx ranges get), with the rocpd schema of a
rocprofv3 database of the same run when one is given, so ROCm's own tools put both on one
timeline::

    from exporters.rocprof_sidecar import write_sidecar
    from probe.reader.recording import Recording

    write_sidecar(Recording.open("run.probe.db"), "probe_results.db",
                  rocprof_db="1234_results.db")   # schema and node taken from it
    # rocpd convert -i 1234_results.db probe_results.db --output-format pftrace

Times stay BOOTTIME ns, rocprofv3's clock. Categories all contain ``MARKER`` (rocpd's
marker views select on it): ``PROBE_MARKER_STEP``, ``PROBE_MARKER_PHASE``,
``PROBE_MARKER_DISPATCH``, ``PROBE_MARKER_REPLAY``, ``PROBE_MARKER_BUILD``,
``PROBE_MARKER_REORDER``. Reading the file back with :func:`exporters.timelines.rocpd.read_rocpd`
gives them as markers named as on the Perfetto timeline. The recording holds no thread
ids; spans are put on the process's main thread (tid = pid), where vLLM's worker runs its
steps.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from exporters.timelines.model import ProfileError
from exporters.timelines.rocpd import rocpd_origin
from exporters.timelines.rocpd_schema import DEFAULT_VERSION, FALLBACK_VERSIONS, layout_of
from exporters.timelines.rocpd_writer import create_rocpd_db, write_rocpd_regions
from probe.progress import SILENT, Progress, counted
from probe.reader.recording import Recording
from probe.reader.recording_columns import (
    check_detail_tables,
    iter_detail_columns,
    iter_step_columns,
)
from probe.reader.recording_rows import NULL
from probe.reader.recording_set import RecordingSet
from probe.records import BuildTag, Mode, Phase, Reason, ReplayKind

__all__ = [
    "BATCH_ROWS",
    "DEFAULT_VERSION",
    "SidecarSpan",
    "detect_rocpd_layout",
    "sidecar_spans",
    "write_sidecar",
]

BATCH_ROWS = 65_536
"""Rows of a table read at once (what memory holds of it)."""


@dataclass(frozen=True, slots=True)
class SidecarSpan:
    """One region of the side-car (a :class:`exporters.timelines.rocpd_writer.RegionSpan`)."""

    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    category: str


@dataclass(frozen=True)
class RocpdOrigin:
    """What a rocprofv3 database says about itself: schema version, its layout, node."""

    layout: str
    version: str
    machine_id: str | None
    hostname: str | None


def detect_rocpd_layout(path: str | os.PathLike[str]) -> RocpdOrigin:
    """The schema version (and node) of an existing rocpd database.

    Raises :class:`ProfileError` naming the file when it is not a readable rocpd database
    or its schema version is neither 3.x nor 4.1.x (the versions a side-car can match).
    """
    version, machine_id, hostname = rocpd_origin(path)
    layout = layout_of(version)
    if layout not in ("inline", "track"):
        raise ProfileError(
            path,
            f"rocpd schema version {version!r} cannot be matched; a side-car can be written "
            f"as 3.x or 4.1.x (built in: {', '.join(FALLBACK_VERSIONS)})",
        )
    return RocpdOrigin(layout, version, machine_id, hostname)


def sidecar_spans(
    recording: Recording | RecordingSet, progress: Progress = SILENT, size: int | None = None
) -> Iterator[SidecarSpan]:
    """The regions :func:`write_sidecar` writes: the steps, then their phase spans,
    dispatches, replays, builds and reorders (each in step order); ``progress`` counts
    them (one region a record). Each table is read as column batches of ``size`` rows
    (:data:`BATCH_ROWS`), every value checked as :meth:`Recording.iter_steps` checks it:
    memory holds a batch, whatever the recording's length."""
    progress.stage("writing regions", recording.record_count(), "records")
    for r in getattr(recording, "recordings", [recording]):
        check_detail_tables(r)
    yield from counted(_regions(recording, size or BATCH_ROWS), progress)


_MODES = tuple(m.name for m in Mode)  # a step's and a record's mode, as its region names it
_KINDS: tuple[tuple[str, str], ...] = (
    ("spans", "PHASE"),
    ("dispatches", "DISPATCH"),
    ("replays", "REPLAY"),
    ("builds", "BUILD"),
    ("reorders", "REORDER"),
)


def _regions(rec: Recording | RecordingSet, size: int) -> Iterator[SidecarSpan]:
    """The steps, then each detail kind's records, in step order."""
    for cols in iter_step_columns(rec, chunk=size, only=("mode", "reason")):
        for pid, step, t0, t1, name in zip(
            cols["pid"].tolist(), cols["step"].tolist(), cols["t0_ns"].tolist(),
            cols["t1_ns"].tolist(), _step_modes(cols), strict=True,
        ):  # fmt: skip
            yield SidecarSpan(f"step {step}{name}", t0, t1, pid, pid, "PROBE_MARKER_STEP")
    for table, marker in _KINDS:
        category = f"PROBE_MARKER_{marker}"
        for b, cols in iter_detail_columns(rec, table, _NAMED_BY[table], size=size):
            for pid, t0, t1, name in zip(
                cols["pid"].tolist(), cols["t0_ns"].tolist(), cols["t1_ns"].tolist(),
                _record_names(table, b, cols), strict=True,
            ):  # fmt: skip
                yield SidecarSpan(name, t0, t1, pid, pid, category)


def _step_modes(cols: dict[str, Any]) -> list[str]:
    """Per step, what follows ``step N`` in its name (:func:`exporters.perfetto.step_name`):
    `` FULL hit``; `` PIECEWISE`` without a reason; nothing when it ran no forward."""
    modes = {int(m): f" {m.name}" for m in Mode}
    reasons = {int(r): f" {r.name.lower()}" for r in Reason}
    return [
        "" if m == NULL else modes[m] + ("" if r == NULL else reasons[r])
        for m, r in zip(cols["mode"].tolist(), cols["reason"].tolist(), strict=True)
    ]


#: the columns a detail kind's region names read (with pid, step and its times)
_NAMED_BY: dict[str, list[str]] = {
    "spans": ["phase", "drafter", "t0_ns", "t1_ns"],
    "dispatches": ["drafter", "mode", "reason", "t0_ns", "t1_ns"],
    "replays": ["drafter", "kind", "mode", "t0_ns", "t1_ns"],
    "builds": ["builder", "tag", "t0_ns", "t1_ns"],
    "reorders": ["changed", "moved", "t0_ns", "t1_ns"],
}


def _record_names(table: str, batch: Any, cols: dict[str, Any]) -> list[str]:
    """Each record's region name, as the Perfetto timeline names its slice
    (:func:`exporters.perfetto.phase_name`, :func:`~exporters.perfetto.drafter_prefix`)."""
    step = cols["step"].tolist()
    if table == "builds":
        builders = ["?" if n is None else n for n in batch.column("builder").to_pylist()]
        tags = _lower(BuildTag, cols["tag"])
        return [f"{n} ({t})" for n, t in zip(builders, tags, strict=True)]
    if table == "reorders":
        return [
            f"reorder {'changed' if c else 'unchanged'} moved {m} step {s}"
            for c, m, s in zip(cols["changed"].tolist(), cols["moved"].tolist(), step, strict=True)
        ]
    drafter = cols["drafter"].tolist()
    if table == "spans":
        return [
            p + (" (drafter)" if d else "")
            for p, d in zip(_lower(Phase, cols["phase"]), drafter, strict=True)
        ]
    modes = [_MODES[m] for m in cols["mode"].tolist()]
    if table == "dispatches":
        return [
            f"{'drafter ' if d else ''}dispatch {m} {r} step {s}"
            for d, m, r, s in zip(drafter, modes, _lower(Reason, cols["reason"]), step, strict=True)
        ]
    return [
        f"{'drafter ' if d else ''}{k} {m} step {s}"
        for d, k, m, s in zip(drafter, _lower(ReplayKind, cols["kind"]), modes, step, strict=True)
    ]


def _lower(kind: type[enum.Enum], index: Any) -> list[str]:
    """An enum column of :func:`detail_columns` (each row its member's index) as the
    members' lower-case names."""
    names = [m.lower() for m in kind.__members__]
    return [names[i] for i in index.tolist()]


def write_sidecar(
    recording: Recording | RecordingSet,
    path: str | os.PathLike[str],
    version: str | None = None,
    *,
    rocprof_db: str | os.PathLike[str] | None = None,
    sql_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    progress: Progress = SILENT,
) -> int:
    """Write the recording's spans to a new rocpd database at ``path``; returns the count.

    ``version`` is the rocpd schema version to write; when not given it is that of
    ``rocprof_db`` (a rocprofv3 ``*_results.db`` of the same run, whose node id and
    hostname are reused too), else :data:`DEFAULT_VERSION`. The schema comes from
    ``sql_dir`` (AMD's ``share/rocprofiler-sdk-rocpd`` files), else the installed ROCm's,
    else the built-in tables. Raises :class:`ProfileError` for an unreadable
    ``rocprof_db``, ``ValueError`` for a version that cannot be written and
    ``FileExistsError`` when ``path`` exists and ``overwrite`` is false.
    """
    machine_id = hostname = None
    if rocprof_db is not None:
        origin = detect_rocpd_layout(rocprof_db)
        machine_id, hostname = origin.machine_id, origin.hostname
        if version is None:
            version = origin.version
    with create_rocpd_db(
        path,
        version or DEFAULT_VERSION,
        sql_dir=sql_dir,
        machine_id=machine_id,
        hostname=hostname,
        overwrite=overwrite,
    ) as db:
        return write_rocpd_regions(db, sidecar_spans(recording, progress))
