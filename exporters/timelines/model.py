"""The neutral timeline model every foreign-format reader returns.

Every reader in :mod:`exporters.timelines` (rocprofv3 CSV and JSON, rocpd SQLite, Kineto
chrome traces) returns the same :class:`Profile`: GPU kernels, host runtime calls and user
markers with nanosecond timestamps, sorted by start. Analyses over it are plain functions
in :mod:`exporters.timelines.analyses`.

Readers never let a parser traceback escape: a file they cannot use raises
:class:`ProfileError`, whose message names the file, the place in it (table, field, row)
and the problem.

Clocks: rocprofv3 and rocpd timestamps are ``CLOCK_BOOTTIME`` ns (:data:`CLOCK_BOOTTIME`);
Kineto timestamps are wall-clock ns since the Unix epoch (:data:`CLOCK_UNIX_EPOCH`).
Nothing here converts between them; ``Profile.clock`` says which one a profile uses
(:mod:`exporters.timelines.align` does).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CLOCK_BOOTTIME",
    "CLOCK_UNIX_EPOCH",
    "GRAPH_LAUNCH_NAMES",
    "GpuKernel",
    "HostCall",
    "Marker",
    "Profile",
    "ProfileError",
    "is_graph_launch",
]

CLOCK_BOOTTIME = "CLOCK_BOOTTIME"
"""Linux ``CLOCK_BOOTTIME`` nanoseconds: rocprofv3, rocpd, rocprof-sys and probe records."""

CLOCK_UNIX_EPOCH = "UNIX_EPOCH"
"""Wall-clock nanoseconds since 1970-01-01 UTC: Kineto (torch profiler) traces."""

GRAPH_LAUNCH_NAMES = frozenset({"cudaGraphLaunch", "hipGraphLaunch", "cuGraphLaunch"})
"""Runtime/driver calls that replay a captured CUDA or HIP graph (base names)."""

# CUPTI and HIP decorate API names with an ABI version (``cudaGraphLaunch_v10000``) or a
# per-thread-default-stream variant (``_ptsz``, ``_spt``); they are the same call.
_API_SUFFIX = re.compile(r"(?:_v\d+|_ptsz|_ptds|_spt)+$")


class ProfileError(ValueError):
    """A profile file could not be read; the message names the file, where and the problem.

    ``path`` is the offending file, ``where`` the place in it when there is one (``table
    rocpd_region row 5 column start``, ``traceEvents[12] field ts``, ``line 3 column
    Start_Timestamp``) and ``problem`` the reason, so callers can report either. Readers
    raise this instead of the underlying ``json``, ``csv``, ``gzip`` or ``sqlite3``
    exception (which stays available as ``__cause__``).
    """

    def __init__(self, path: str | os.PathLike[str], problem: str, where: str = "") -> None:
        self.path = str(path)
        self.where = _one_line(where)
        self.problem = _one_line(problem)
        shown = _one_line(self.path)
        super().__init__(
            f"{shown}: {self.where}: {self.problem}" if where else f"{shown}: {self.problem}"
        )


def _one_line(text: str) -> str:
    """Text quoted from a file (a header, a name) with its control characters escaped, so
    the error stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclass(frozen=True, slots=True)
class GpuKernel:
    """One kernel execution on a GPU.

    ``device`` is the profiler's device index (rocprofv3's logical agent index, the
    "N" of ``Agent N``; Kineto's ``args.device``). ``stream`` is the HIP/CUDA stream and
    ``queue`` the HSA queue (ROCm only). ``correlation_id`` is the id shared with the host
    call that launched it: every kernel of one graph replay shares the graph launch's id.
    ``pid``/``tid`` are the launching host process and thread when the source knows them.
    ``external_id`` is the profiler's external correlation (Kineto ``External id``,
    rocprofiler's external correlation id), when set.
    """

    name: str
    start_ns: int
    end_ns: int
    device: int | None
    stream: int | None
    correlation_id: int | None
    pid: int | None
    tid: int | None
    queue: int | None = None
    external_id: int | None = None

    @property
    def duration_ns(self) -> int:
        """``end_ns - start_ns``."""
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class HostCall:
    """One runtime or driver API call on a host thread (hipLaunchKernel, cudaGraphLaunch...).

    ``domain`` is the profiler's category: rocprofv3's ``Domain`` column
    (``HIP_RUNTIME_API_EXT``...) or Kineto's ``cat`` (``cuda_runtime``, ``cuda_driver``).
    """

    name: str
    domain: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    correlation_id: int | None
    external_id: int | None = None

    @property
    def duration_ns(self) -> int:
        """``end_ns - start_ns``."""
        return self.end_ns - self.start_ns

    @property
    def is_graph_launch(self) -> bool:
        """Whether this call replays a CUDA/HIP graph (see :func:`is_graph_launch`)."""
        return is_graph_launch(self.name)


@dataclass(frozen=True, slots=True)
class Marker:
    """A user annotation: a roctx/NVTX range or mark, a torch ``record_function``, a probe span.

    An instant mark has ``start_ns == end_ns``. ``category`` says where it came from
    (``MARKER_CORE_API``, ``user_annotation``, ``python_function``, a probe category...).
    A ``Marker`` also satisfies :class:`exporters.timelines.rocpd_writer.RegionSpan`, so
    markers can be written to a rocpd side-car as they are.
    """

    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    category: str = ""

    @property
    def duration_ns(self) -> int:
        """``end_ns - start_ns``."""
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Profile:
    """An imported profile: kernels, host calls and markers, each sorted by start time.

    ``source`` names the importer (``rocprofv3-csv``, ``rocprofv3-json``, ``rocpd``,
    ``kineto``); ``clock`` is :data:`CLOCK_BOOTTIME` or :data:`CLOCK_UNIX_EPOCH`; ``meta``
    holds what the source said about itself (files read, schema version, device
    properties...). Build one with :meth:`Profile.build` to get the canonical order.
    """

    source: str
    clock: str
    kernels: tuple[GpuKernel, ...]
    host_calls: tuple[HostCall, ...]
    markers: tuple[Marker, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def build(
        cls,
        source: str,
        clock: str,
        kernels: Iterable[GpuKernel] = (),
        host_calls: Iterable[HostCall] = (),
        markers: Iterable[Marker] = (),
        meta: Mapping[str, Any] | None = None,
    ) -> Profile:
        """Make a profile with every sequence in the canonical (start-time) order."""
        return cls(
            source=source,
            clock=clock,
            kernels=tuple(sorted(kernels, key=_kernel_key)),
            host_calls=tuple(sorted(host_calls, key=_call_key)),
            markers=tuple(sorted(markers, key=_marker_key)),
            meta=dict(meta or {}),
        )


def _opt(value: int | None) -> int:
    return -1 if value is None else value


def _kernel_key(k: GpuKernel) -> tuple[int, int, int, int, int, int, str, int, int]:
    return (
        k.start_ns,
        k.end_ns,
        _opt(k.device),
        _opt(k.stream),
        _opt(k.queue),
        _opt(k.correlation_id),
        k.name,
        _opt(k.pid),
        _opt(k.tid),
    )


def _call_key(c: HostCall) -> tuple[int, int, int, int, int, str, str]:
    return (c.start_ns, c.end_ns, c.pid, c.tid, _opt(c.correlation_id), c.name, c.domain)


def _marker_key(m: Marker) -> tuple[int, int, int, int, str, str]:
    return (m.start_ns, m.end_ns, m.pid, m.tid, m.name, m.category)


def is_graph_launch(name: str) -> bool:
    """Whether a runtime/driver API name replays a graph.

    Matches ``cudaGraphLaunch``, ``hipGraphLaunch`` and ``cuGraphLaunch``, including the
    ABI-versioned and per-thread-stream spellings (``cudaGraphLaunch_v10000``,
    ``cudaGraphLaunch_ptsz``, ``hipGraphLaunch_spt``).
    """
    return _API_SUFFIX.sub("", name) in GRAPH_LAUNCH_NAMES
