"""Analyses over any imported :class:`~exporters.timelines.model.Profile` (HTA-style).

They work the same on an AMD rocprofv3 capture and a torch-profiler trace::

    >>> from exporters.timelines.kineto import read_kineto
    >>> from exporters.timelines.analyses import count_graph_launches, kernels_by_launch
    >>> profile = read_kineto("graph_execution.json.gz")  # doctest: +SKIP
    >>> count_graph_launches(profile)  # doctest: +SKIP
    1
    >>> {corr: len(ks) for corr, ks in kernels_by_launch(profile).items()}  # doctest: +SKIP
    {505113: 421}
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from exporters.timelines.model import GpuKernel, HostCall, Profile, is_graph_launch

__all__ = [
    "BusyIdle",
    "LaunchDelay",
    "count_graph_launches",
    "gpu_busy_idle",
    "is_graph_launch",
    "kernels_by_launch",
    "launch_delays",
]


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
    # a kernel overlaps (start, end) when it starts before end and ends after start: all
    # that start before end, less those that end by start. Those two sets differ by the
    # zero-length kernels at t in a zero-length window (t, t): ended by start, yet not
    # started before end; they are counted back
    instants = Counter(k.start_ns for k in kernels if k.start_ns == k.end_ns)
    out: list[BusyIdle] = []
    for start, end in windows:
        if end < start:
            raise ValueError(f"window ({start}, {end}) ends before it starts")
        busy = covered_before(end) - covered_before(start)
        count = bisect.bisect_left(starts_sorted, end) - bisect.bisect_right(ends_sorted, start)
        if start == end:
            count += instants[start]
        out.append(BusyIdle(start, end, busy, (end - start) - busy, count))
    return tuple(out)
