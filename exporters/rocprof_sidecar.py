"""A rocpd side-car database of a recording, for ``rocpd merge`` / ``rocpd convert``.

:func:`write_sidecar` writes the probe's steps, phase spans, graph decisions and reorder
decisions as rocpd regions (the storage roctx ranges get), with the rocpd schema of a
rocprofv3 database of the same run when one is given, so ROCm's own tools put both on one
timeline::

    from exporters.rocprof_sidecar import write_sidecar
    from probe.progress import SILENT, Progress, counted
from probe.reader.recording import Recording
from probe.step import Step

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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from exporters.perfetto import Spool, drafter_prefix, phase_name, step_name
from exporters.timelines.model import ProfileError
from exporters.timelines.rocpd import rocpd_origin
from exporters.timelines.rocpd_schema import DEFAULT_VERSION, FALLBACK_VERSIONS, layout_of
from exporters.timelines.rocpd_writer import create_rocpd_db, write_rocpd_regions
from probe.progress import SILENT, Progress, counted
from probe.reader.recording import Recording
from probe.step import Step

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


def sidecar_spans(recording: Recording, progress: Progress = SILENT) -> Iterator[SidecarSpan]:
    """The regions :func:`write_sidecar` writes: the steps, then their phase spans,
    dispatches, replays, builds and reorders (each in step order); ``progress`` counts
    them (one region a record)."""
    progress.stage("writing regions", recording.record_count(), "records")
    yield from counted(_regions(recording.iter_steps(), recording.builder_names()), progress)


def _regions(steps: Iterable[Step], names: dict[int, dict[int, str]]) -> Iterator[SidecarSpan]:
    """The steps as they are read, each detail record kept in its kind's spool (memory
    to a bound, then a temporary file); then each kind's records in step order."""
    later = [Spool(_SPOOL_AT) for _ in range(5)]
    for s in steps:
        yield SidecarSpan(step_name(s), s.t0, s.t1, s.pid, s.pid, "PROBE_MARKER_STEP")
        for spool, attr in zip(later, _KINDS, strict=True):
            for x in getattr(s, attr):
                spool.append((s.step, s.pid, x))

    def build_name(s: Any, b: Any) -> str:
        return f"{names.get(s.pid, {}).get(b.builder_id, '?')} ({b.tag.name.lower()})"

    kinds: tuple[tuple[str, Callable[[Any, Any], str], str], ...] = (
        ("spans", lambda s, sp: phase_name(sp), "PHASE"),
        (
            "dispatches",
            lambda s, d: (
                f"{drafter_prefix(d)}dispatch {d.mode.name} {d.reason.name.lower()} step {s.step}"
            ),
            "DISPATCH",
        ),
        (
            "replays",
            lambda s, r: f"{drafter_prefix(r)}{r.kind.name.lower()} {r.mode.name} step {s.step}",
            "REPLAY",
        ),
        ("builds", build_name, "BUILD"),
        (
            "reorders",
            lambda s, o: (
                f"reorder {'changed' if o.changed else 'unchanged'} moved {o.moved} step {s.step}"
            ),
            "REORDER",
        ),
    )
    # each kind in step order, one kind after another
    for spool, (_, name, marker) in zip(later, kinds, strict=True):
        for step, pid, x in spool:
            ref = _StepRef(step, pid)
            yield SidecarSpan(name(ref, x), x.t0, x.t1, pid, pid, f"PROBE_MARKER_{marker}")


_KINDS = ("spans", "dispatches", "replays", "builds", "reorders")
_SPOOL_AT = 1 << 14
"""Detail records held per kind before they go to the spool's temporary file."""


@dataclass(frozen=True, slots=True)
class _StepRef:
    """What a region's name needs of its step."""

    step: int
    pid: int


def write_sidecar(
    recording: Recording,
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
