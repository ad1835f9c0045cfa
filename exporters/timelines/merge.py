"""A recording and GPU profiles on one Perfetto timeline.

from exporters.timelines.align import align
from exporters.timelines.load import load_profiles
from exporters.timelines.merge import merge_to_perfetto

prof = load_profiles(["trace.json.gz"])[0]
merge_to_perfetto(recording, [(prof, align(recording, prof))], "merged.pftrace")
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from exporters.perfetto import Slice, TraceBuilder, recording_tracks, split_lanes
from exporters.timelines.align import Alignment, shift_profile
from exporters.timelines.model import GpuKernel, Profile
from probe.progress import SILENT, Progress, counted

__all__ = ["merge_to_perfetto"]


def _thread_name(profile: Profile, pid: int, tid: int) -> str:
    names = profile.meta.get("thread_names")
    name = names.get(f"{pid} {tid}") if isinstance(names, dict) else None
    return name if isinstance(name, str) and name else f"{profile.source} thread {tid}"


def merge_to_perfetto(
    recording: Any,
    profiles: Sequence[tuple[Profile, Alignment]],
    path: str | os.PathLike[str],
    *,
    progress: Progress = SILENT,
) -> dict[str, int]:
    """Write one Perfetto trace: the recording's tracks above each profile's GPU kernels.

    A profile's host calls and markers (Kineto's CPU events, rocprofv3's API calls and
    roctx ranges) go on their own thread's track: a Perfetto thread track with the event's
    pid and tid, inside that process (the recording's, when it is one), so they sit with
    the thread's other tracks. Slices of one thread that overlap without nesting are
    spread over several thread tracks of that thread. Kernels go on ``GPU <device>``
    tracks, one child per stream; each launch (graph launches included) gets a flow arrow
    to every kernel it launched. Returns counts of what was written. ``progress`` gets a
    stage for the recording's records, one per profile (its events) and one for the
    encoding (the slices).
    """
    b = TraceBuilder()
    tracks = recording_tracks(b, recording, progress)
    counts = dict(tracks.counts)
    counts.update(kernels=0, host_calls=0, markers=0, flows=0)
    for profile, al in profiles:
        prof = shift_profile(profile, al.offset_ns)
        src = profile.source
        progress.stage(
            f"placing {src} events",
            len(prof.host_calls) + len(prof.markers) + len(prof.kernels),
            "events",
        )
        by_corr: dict[int, list[GpuKernel]] = {}
        for k in prof.kernels:
            if k.correlation_id is not None:
                by_corr.setdefault(k.correlation_id, []).append(k)
        flow_in: dict[int, int] = {}
        per_thread: dict[tuple[int, int], list[Slice]] = {}
        for c in counted(prof.host_calls, progress):
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
            per_thread.setdefault((c.pid, c.tid), []).append(
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
                )
            )
            counts["host_calls"] += 1
        for m in counted(prof.markers, progress):
            per_thread.setdefault((m.pid, m.tid), []).append(
                Slice(m.name, m.start_ns, m.end_ns, m.category)
            )
            counts["markers"] += 1
        for (pid, tid), slices in sorted(per_thread.items()):
            if pid not in tracks.process:
                tracks.process[pid] = b.process_track(pid, f"{src} process {pid}")
            name = _thread_name(profile, pid, tid)
            # one thread track per lane: a lane the builder split off itself would be a
            # plain named track, no longer the thread's
            for lane in split_lanes(slices):
                b.extend(b.thread_track(pid, tid, name), lane)
        gpus: dict[int | None, int] = {}
        streams: dict[tuple[int | None, int | None], int] = {}
        for k in counted(prof.kernels, progress):
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
    b.write(path, progress)
    return counts
