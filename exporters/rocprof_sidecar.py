"""A rocpd side-car database of a recording, for ``rocpd merge`` / ``rocpd convert``.

:func:`write_sidecar` writes the probe's steps, phase spans, graph decisions and reorder
decisions as rocpd regions (the storage roctx ranges get), with the rocpd schema of a
rocprofv3 database of the same run when one is given, so ROCm's own tools put both on one
timeline::

    from exporters.rocprof_sidecar import write_sidecar
    from probe.recording import Recording

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

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from exporters.timelines.model import ProfileError
from exporters.timelines.rocpd import rocpd_origin
from exporters.timelines.rocpd_schema import DEFAULT_VERSION, FALLBACK_VERSIONS, layout_of
from exporters.timelines.rocpd_writer import create_rocpd_db, write_rocpd_regions
from probe.progress import SILENT, Progress, counted

__all__ = [
    "DEFAULT_VERSION",
    "SidecarSpan",
    "detect_rocpd_layout",
    "sidecar_spans",
    "write_sidecar",
]


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


def _up(v: Any) -> str:
    return str(v).upper() if v else "?"


def sidecar_spans(recording: Any, progress: Progress = SILENT) -> Iterator[SidecarSpan]:
    """The regions :func:`write_sidecar` writes, in recording order; ``progress`` counts
    the rows read."""
    from exporters.perfetto import record_count, step_name

    progress.stage("writing regions", record_count(recording), "records")
    for s in counted(recording.steps(), progress):
        pid = int(s["pid"])
        yield SidecarSpan(
            step_name(s), int(s["t0_ns"]), int(s["t1_ns"]), pid, pid, "PROBE_MARKER_STEP"
        )
    for r in counted(recording.rows("spans"), progress):
        pid = int(r["pid"])
        name = str(r["phase"]) + (" (drafter)" if r["drafter"] else "")
        yield SidecarSpan(name, int(r["t0_ns"]), int(r["t1_ns"]), pid, pid, "PROBE_MARKER_PHASE")
    for r in counted(recording.rows("dispatches"), progress):
        pid = int(r["pid"])
        who = "drafter " if r["drafter"] else ""
        yield SidecarSpan(
            f"{who}dispatch {_up(r['mode'])} {r['reason'] or ''} step {r['step']}".replace(
                "  ", " "
            ),
            int(r["t0_ns"]),
            int(r["t1_ns"]),
            pid,
            pid,
            "PROBE_MARKER_DISPATCH",
        )
    for r in counted(recording.rows("replays"), progress):
        pid = int(r["pid"])
        who = "drafter " if r["drafter"] else ""
        yield SidecarSpan(
            f"{who}{r['kind'] or 'replay'} {_up(r['mode'])} step {r['step']}",
            int(r["t0_ns"]),
            int(r["t1_ns"]),
            pid,
            pid,
            "PROBE_MARKER_REPLAY",
        )
    for r in counted(recording.rows("builds"), progress):
        pid = int(r["pid"])
        yield SidecarSpan(
            f"{r['builder']} ({r['tag']})",
            int(r["t0_ns"]),
            int(r["t1_ns"]),
            pid,
            pid,
            "PROBE_MARKER_BUILD",
        )
    for r in counted(recording.rows("reorders"), progress):
        pid = int(r["pid"])
        yield SidecarSpan(
            f"reorder {'changed' if r['changed'] else 'unchanged'} moved {r['moved']} "
            f"step {r['step']}",
            int(r["t0_ns"]),
            int(r["t1_ns"]),
            pid,
            pid,
            "PROBE_MARKER_REORDER",
        )


def write_sidecar(
    recording: Any,
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
