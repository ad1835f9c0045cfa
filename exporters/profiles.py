"""A neutral timeline model for imported profiles, and analyses over it.

Every importer in :mod:`exporters` (rocprofv3 CSV and JSON, rocpd SQLite, Kineto chrome
traces) returns the same :class:`Profile`: GPU kernels, host runtime calls and user
markers with nanosecond timestamps, sorted by start. Analyses are plain functions over a
``Profile``, so they work the same on an AMD rocprofv3 capture and a torch-profiler trace::

    >>> from exporters.kineto import read_kineto
    >>> from exporters.profiles import count_graph_launches, kernels_by_launch
    >>> profile = read_kineto("graph_execution.json.gz")  # doctest: +SKIP
    >>> count_graph_launches(profile)  # doctest: +SKIP
    1
    >>> {corr: len(ks) for corr, ks in kernels_by_launch(profile).items()}  # doctest: +SKIP
    {505113: 421}

Readers never let a parser traceback escape: a file they cannot use raises
:class:`ProfileError`, whose message names the file and the problem.

Clocks: rocprofv3 and rocpd timestamps are ``CLOCK_BOOTTIME`` ns (:data:`CLOCK_BOOTTIME`);
Kineto timestamps are wall-clock ns since the Unix epoch (:data:`CLOCK_UNIX_EPOCH`).
Nothing here converts between them; ``Profile.clock`` says which one a profile uses.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CLOCK_BOOTTIME",
    "CLOCK_UNIX_EPOCH",
    "GRAPH_LAUNCH_NAMES",
    "BusyIdle",
    "GpuKernel",
    "HostCall",
    "LaunchDelay",
    "Marker",
    "Profile",
    "ProfileError",
    "count_graph_launches",
    "gpu_busy_idle",
    "is_graph_launch",
    "kernels_by_launch",
    "launch_delays",
    "read_json_document",
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
    """A profile file could not be read; the message names the file and the problem.

    ``path`` is the offending file and ``problem`` the reason without the path, so callers
    can report either. Readers raise this instead of the underlying ``json``, ``csv``,
    ``gzip`` or ``sqlite3`` exception (which stays available as ``__cause__``).
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


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
    A ``Marker`` also satisfies :class:`exporters.rocprof.RegionSpan`, so markers can be
    written to a rocpd side-car as they are.
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


# --------------------------------------------------------------------------- reading


def read_json_document(
    path: str | os.PathLike[str],
    *,
    parse_float: Callable[[str], Any] | None = None,
) -> Any:
    """Load a ``.json`` or gzip-compressed ``.json.gz`` file (detected by content).

    Raises :class:`ProfileError` for a missing file, a truncated or corrupt gzip stream,
    bytes that are not UTF-8, or text that is not JSON.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError as exc:
        raise ProfileError(p, "no such file") from exc
    except OSError as exc:
        raise ProfileError(p, f"cannot read file: {exc.strerror or exc}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except EOFError as exc:
            raise ProfileError(
                p, "truncated gzip stream (file ends before the end marker)"
            ) from exc
        except (OSError, zlib.error) as exc:
            raise ProfileError(p, f"corrupt gzip stream: {exc}") from exc
    if not raw.strip():
        raise ProfileError(p, "empty file, expected JSON")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(
            p, f"not JSON: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from exc
    try:
        return json.loads(text, parse_float=parse_float)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            p, f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except RecursionError as exc:
        raise ProfileError(p, "not JSON that can be read: nesting too deep") from exc


# --------------------------------------------------------------------------- analyses


def is_graph_launch(name: str) -> bool:
    """Whether a runtime/driver API name replays a graph.

    Matches ``cudaGraphLaunch``, ``hipGraphLaunch`` and ``cuGraphLaunch``, including the
    ABI-versioned and per-thread-stream spellings (``cudaGraphLaunch_v10000``,
    ``cudaGraphLaunch_ptsz``, ``hipGraphLaunch_spt``).
    """
    return _API_SUFFIX.sub("", name) in GRAPH_LAUNCH_NAMES


def _in_window(start_ns: int, lo: int | None, hi: int | None) -> bool:
    return (lo is None or start_ns >= lo) and (hi is None or start_ns < hi)


def count_graph_launches(
    profile: Profile, start_ns: int | None = None, end_ns: int | None = None
) -> int:
    """Number of graph-launch host calls whose start lies in ``[start_ns, end_ns)``.

    Either bound may be ``None`` (open). Works on any :class:`Profile`: Kineto
    ``cudaGraphLaunch``/``hipGraphLaunch`` slices and rocprofv3 ``hipGraphLaunch`` rows.
    """
    return sum(
        1
        for c in profile.host_calls
        if c.is_graph_launch and _in_window(c.start_ns, start_ns, end_ns)
    )


def _kernels_by_correlation(profile: Profile) -> dict[int, list[GpuKernel]]:
    out: dict[int, list[GpuKernel]] = {}
    for k in profile.kernels:  # already sorted by start
        if k.correlation_id is not None:
            out.setdefault(k.correlation_id, []).append(k)
    return out


def kernels_by_launch(profile: Profile) -> dict[int, tuple[GpuKernel, ...]]:
    """Map each graph launch's correlation id to the kernels that share it, by start time.

    A graph replay is one host call whose correlation id every replayed kernel carries
    (CUPTI and roctracer/rocprofiler both do this). Launches whose kernels fell outside the
    trace map to an empty tuple; launches without a correlation id are left out.
    """
    by_corr = _kernels_by_correlation(profile)
    return {
        c.correlation_id: tuple(by_corr.get(c.correlation_id, ()))
        for c in profile.host_calls
        if c.is_graph_launch and c.correlation_id is not None
    }


@dataclass(frozen=True, slots=True)
class LaunchDelay:
    """How long after a host launch call its (first) kernel started.

    ``call`` is the runtime call, ``first_kernel`` the earliest-starting kernel with the
    same correlation id and ``kernel_count`` how many kernels share it (1 for a
    ``hipLaunchKernel``, the node count for a graph replay).

    Two differences are given, named by their end points:

    - ``start_to_start_ns`` = first kernel start − call start: the whole time from
      asking for the work to the GPU starting it.
    - ``end_to_start_ns`` = first kernel start − call end: the "launch delay" of HTA's
      documentation (``get_cuda_kernel_launch_stats``: "the difference between GPU kernel
      starting and CPU operator ending"). It is negative when the kernel starts before the
      call returns, which is common for graph launches.
    """

    correlation_id: int
    call: HostCall
    first_kernel: GpuKernel
    kernel_count: int

    @property
    def start_to_start_ns(self) -> int:
        """First kernel start minus call start."""
        return self.first_kernel.start_ns - self.call.start_ns

    @property
    def end_to_start_ns(self) -> int:
        """First kernel start minus call end (HTA's documented launch delay, unclipped)."""
        return self.first_kernel.start_ns - self.call.end_ns

    @property
    def is_graph_launch(self) -> bool:
        """Whether the call replays a graph."""
        return self.call.is_graph_launch


def launch_delays(profile: Profile) -> tuple[LaunchDelay, ...]:
    """One :class:`LaunchDelay` per host call that has kernels with its correlation id.

    HTA pairs a runtime call with its kernel by correlation id and only for
    ``cudaLaunchKernel``/``cudaMemcpyAsync``/``cudaMemsetAsync``; this pairs every host call
    that has at least one kernel, so ``hipLaunchKernel``, ``hipExtModuleLaunchKernel`` and
    graph launches (measured to the graph's first kernel) are included. Ordered by call
    start. When several host calls share a correlation id (it should not happen), the
    earliest is used.
    """
    by_corr = _kernels_by_correlation(profile)
    out: list[LaunchDelay] = []
    seen: set[int] = set()
    for call in profile.host_calls:
        corr = call.correlation_id
        if corr is None or corr in seen:
            continue
        kernels = by_corr.get(corr)
        if not kernels:
            continue
        seen.add(corr)
        out.append(LaunchDelay(corr, call, kernels[0], len(kernels)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class BusyIdle:
    """GPU busy and idle time in one window ``[start_ns, end_ns)``.

    ``busy_ns`` is the length of the union of kernel intervals clipped to the window (two
    overlapping kernels on different streams count once); ``idle_ns`` is the rest of the
    window. ``kernel_count`` is the number of kernels that overlap the window.
    """

    start_ns: int
    end_ns: int
    busy_ns: int
    idle_ns: int
    kernel_count: int

    @property
    def window_ns(self) -> int:
        """``end_ns - start_ns``."""
        return self.end_ns - self.start_ns

    @property
    def busy_fraction(self) -> float:
        """``busy_ns / window_ns`` (0.0 for an empty window)."""
        return self.busy_ns / self.window_ns if self.window_ns else 0.0


def gpu_busy_idle(
    profile: Profile,
    windows: Iterable[tuple[int, int]],
    *,
    device: int | None = None,
) -> tuple[BusyIdle, ...]:
    """Busy and idle GPU time in each window, HTA-style (union of kernel intervals).

    ``windows`` are ``(start_ns, end_ns)`` pairs in the profile's clock. ``device``
    restricts the kernels to one device; by default all kernels count, which only makes
    sense for single-GPU profiles. Only kernels count as busy (memory copies are not part
    of the model).
    """
    kernels = [k for k in profile.kernels if device is None or k.device == device]
    merged_starts: list[int] = []
    merged_ends: list[int] = []
    for k in sorted(kernels, key=lambda k: (k.start_ns, k.end_ns)):
        if merged_ends and k.start_ns <= merged_ends[-1]:
            if k.end_ns > merged_ends[-1]:
                merged_ends[-1] = k.end_ns
        else:
            merged_starts.append(k.start_ns)
            merged_ends.append(k.end_ns)
    prefix = [0]
    for s, e in zip(merged_starts, merged_ends, strict=True):
        prefix.append(prefix[-1] + e - s)

    def covered_before(x: int) -> int:
        i = bisect.bisect_right(merged_starts, x) - 1
        if i < 0:
            return 0
        return prefix[i] + min(x, merged_ends[i]) - merged_starts[i]

    starts_sorted = sorted(k.start_ns for k in kernels)
    ends_sorted = sorted(k.end_ns for k in kernels)
    out: list[BusyIdle] = []
    for start, end in windows:
        if end < start:
            raise ValueError(f"window ({start}, {end}) ends before it starts")
        busy = covered_before(end) - covered_before(start)
        count = bisect.bisect_left(starts_sorted, end) - bisect.bisect_right(ends_sorted, start)
        out.append(BusyIdle(start, end, busy, (end - start) - busy, max(count, 0)))
    return tuple(out)
