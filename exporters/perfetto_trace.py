"""The Perfetto trace writer: tracks and slices collected, then one protobuf trace written
(:class:`TraceBuilder`), its events encoded a slice at a time (:mod:`exporters.perfetto_stream`).
:mod:`exporters.perfetto` turns a recording into its tracks and writes it with this; a
recording with a GPU profile (:mod:`exporters.timelines.merge`) does too. Needs the
``perfetto`` package (``pip install 'vllm-graph-probe[perfetto]'``) for its trace protos.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from exporters.base import MissingExtra
from exporters.perfetto_stream import (
    EventEncoder,
    Runs,
    Slice,
    Spool,
    framed,
)
from probe.progress import SILENT, Progress

BOOTTIME_CLOCK_ID = 6
"""``BUILTIN_CLOCK_BOOTTIME`` in Perfetto's ``BuiltinClock`` enum."""
REALTIME_CLOCK_ID = 1
"""``BUILTIN_CLOCK_REALTIME``."""

_SEQUENCE_ID = 0x5647  # any non-zero id; all packets are on one writer sequence


class PerfettoUnavailableError(MissingExtra):
    """The ``perfetto`` package (its trace protos) is not installed."""

    def __init__(self) -> None:
        super().__init__("perfetto", "perfetto", "perfetto")


def protos() -> Any:
    """The trace protos (``perfetto_trace_pb2``); :class:`PerfettoUnavailableError` without
    the ``perfetto`` package."""
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
    except ImportError as exc:
        raise PerfettoUnavailableError() from exc
    return perfetto_trace_pb2


class TraceBuilder:
    """Collects tracks and slices, then writes one Perfetto protobuf trace.

    Timestamps are BOOTTIME ns. Slices added to one track that overlap without nesting are
    spread over sibling tracks named ``<track> (2)``, ``(3)``...::

        b = TraceBuilder()
        proc = b.process_track(1424, "vLLM worker tp0")
        t = b.child_track(proc, "graph decisions")
        b.add(t, Slice("dispatch FULL", 100, 250, "dispatch", {"reason": "hit"}))
        b.write("out.pftrace")
    """

    def __init__(self) -> None:
        self._pb = protos()
        self._next_uuid = 1
        self._descriptors: list[Any] = []
        self._runs = Runs()
        self._seq = 0  # the order slices were added in: a tie's order on a track
        self._rank = 0  # the highest rank given to add()
        self._names: dict[int, tuple[str, int | None, int | None]] = {}
        self._clock_pairs: list[tuple[int, int]] = []
        self._next_flow = 1
        self._extra: list[Any] = []  # descriptors of the sibling tracks of split lanes

    # -- tracks

    def _uuid(self) -> int:
        u = self._next_uuid
        self._next_uuid += 1
        return u

    def process_track(self, pid: int, name: str) -> int:
        """A top-level process track (Perfetto groups a process's tracks under it)."""
        pb = self._pb
        u = self._uuid()
        self._descriptors.append(
            pb.TrackDescriptor(uuid=u, process=pb.ProcessDescriptor(pid=pid, process_name=name))
        )
        return u

    def thread_track(self, pid: int, tid: int, name: str) -> int:
        """A thread track (shown inside its process)."""
        pb = self._pb
        u = self._uuid()
        self._descriptors.append(
            pb.TrackDescriptor(
                uuid=u, thread=pb.ThreadDescriptor(pid=pid, tid=tid, thread_name=name)
            )
        )
        self._names[u] = (name, None, None)
        return u

    def child_track(self, parent: int | None, name: str) -> int:
        """A named track; under ``parent`` when given, top level otherwise."""
        pb = self._pb
        u = self._uuid()
        d = pb.TrackDescriptor(uuid=u, name=name)
        if parent is not None:
            d.parent_uuid = parent
        self._descriptors.append(d)
        self._names[u] = (name, parent, None)
        return u

    def flow_id(self) -> int:
        """A fresh flow id: put it in one slice's ``flows_out`` and another's ``flows_in``."""
        f = self._next_flow
        self._next_flow += 1
        return f

    def clock_pair(self, boottime_ns: int, realtime_ns: int) -> None:
        """Record a (BOOTTIME, REALTIME) sample taken at the same moment."""
        self._clock_pairs.append((boottime_ns, realtime_ns))

    # -- slices

    def add(self, track: int, s: Slice, *, rank: int | None = None) -> None:
        """Add ``s`` to ``track``. Slices of a track are written in time order (start,
        the longer first); a tie goes to the lower ``rank``, then to the slice added
        first; tracks are written in the order of their first slice's (rank, order
        added). A writer that adds several kinds of slice as it reads ranks them by kind:
        the file is the one a pass over the data per kind would give. No ``rank``: the
        highest given so far (what is added after such passes follows them)."""
        if rank is None:
            rank = self._rank
        elif rank > self._rank:
            self._rank = rank
        if s.start_ns < 0:
            raise ValueError(f"slice {s.name!r} starts before 0 ns ({s.start_ns})")
        if s.end_ns < s.start_ns:
            raise ValueError(f"slice {s.name!r} ends before it starts ({s.start_ns}, {s.end_ns})")
        self._seq += 1
        self._runs.add(track, (s.start_ns, -s.end_ns, rank, self._seq), s)

    def extend(self, track: int, slices: Iterable[Slice]) -> None:
        for s in slices:
            self.add(track, s)

    def _add_packed(self, track: int, rank: int, rows: list[tuple[Any, ...]]) -> None:
        """Add slices already packed (:func:`exporters.perfetto_stream.packed`) and known
        to be well formed (a recording's checked values), as :meth:`add` with ``rank``."""
        if rank > self._rank:
            self._rank = rank
        seq = self._seq
        items = [((t[1], -t[2], rank, seq + i), t) for i, t in enumerate(rows, start=1)]
        self._seq = seq + len(rows)
        self._runs.extend(track, items)

    def _reserve(self, track: int, rank: int) -> None:
        """Place ``track`` among the tracks as if a slice of ``rank`` were added to it now
        (nothing when it has slices): a writer that adds its slices kind by kind puts a
        track where a pass over all kinds at once would have."""
        self._seq += 1
        self._runs.reserve(track, rank, self._seq)

    # -- output

    def iter_packets(self, progress: Progress = SILENT) -> Iterator[bytes | None]:
        """Every packet of the trace, framed (:func:`exporters.perfetto_stream.framed`),
        in writing order; ``progress`` counts the slices.

        The track descriptors come first, then each track's events; a track's slices that
        overlap without nesting go to sibling tracks whose descriptors are only known once
        the track is read, so this yields the first packet, then the events (marked by
        ``None`` between the two), and :meth:`write` puts the descriptors in front.
        Event and argument names are interned (``InternedData.event_names`` and
        ``debug_annotation_names``) on the one packet sequence, which the first packet
        clears.
        """
        progress.stage("encoding trace", sum(self._runs.total.values()), "slices")
        pb = self._pb
        first = pb.TracePacket(
            trusted_packet_sequence_id=_SEQUENCE_ID,
            sequence_flags=pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED,
        )
        if self._clock_pairs:
            boot, real = self._clock_pairs[0]
            first.clock_snapshot.CopyFrom(
                pb.ClockSnapshot(
                    clocks=[
                        pb.ClockSnapshot.Clock(clock_id=BOOTTIME_CLOCK_ID, timestamp=boot),
                        pb.ClockSnapshot.Clock(clock_id=REALTIME_CLOCK_ID, timestamp=real),
                    ],
                    primary_trace_clock=BOOTTIME_CLOCK_ID,
                )
            )
            first.timestamp = boot
            first.timestamp_clock_id = BOOTTIME_CLOCK_ID
        yield framed(first)
        yield None
        self._extra = []
        enc = EventEncoder()
        try:
            for track in self._runs.tracks():
                yield from self._track_packets(track, enc, progress)
        finally:
            self._runs.close()

    def _track_packets(self, track: int, enc: EventEncoder, progress: Progress) -> Iterator[bytes]:
        """One track's events: its first lane as the slices come, in time order; the
        others (slices that overlap without nesting) after it, each on a sibling track."""
        pb = self._pb
        event = enc.event
        stacks: list[list[int]] = []  # per lane: the ends of its open slices (_lanes)
        opened: list[list[tuple[Any, ...]]] = []  # per lane: its open slices (_events)
        later: list[Spool] = []  # lanes after the first: their events, in order
        done = 0
        for _, t in self._runs.items(track):
            start, end = t[1], t[2]
            lane = _fit(stacks, start, end)
            if lane == len(opened):
                opened.append([])
                if lane:
                    later.append(Spool())
            if lane == 0:
                top = opened[0]
                while top and top[-1][2] <= start:
                    x = top.pop()
                    yield event(x[2], "E", track, x)
                if start == end:
                    yield event(start, "I", track, t)
                else:
                    yield event(start, "B", track, t)
                    top.append(t)
            else:
                for ev in _lane_events(opened[lane], t):
                    later[lane - 1].append(ev)
            done += 1
            if done == 4096:
                progress.advance(done)
                done = 0
        for lane, stack in enumerate(opened):
            closing = [(x[2], "E", x) for x in reversed(stack)]
            if lane == 0:
                for ts, kind, x in closing:
                    yield event(ts, kind, track, x)
            else:
                for ev in closing:
                    later[lane - 1].append(ev)
        progress.advance(done)
        for i, spool in enumerate(later, start=1):
            name, parent, _ = self._names.get(track, (f"track {track}", None, None))
            uuid = self._uuid()
            d = pb.TrackDescriptor(uuid=uuid, name=f"{name} ({i + 1})")
            if parent is not None:
                d.parent_uuid = parent
            self._extra.append(d)
            for ts, kind, x in spool:
                yield event(ts, kind, uuid, x)

    def _descriptors_framed(self) -> list[bytes]:
        pb = self._pb
        return [
            framed(pb.TracePacket(trusted_packet_sequence_id=_SEQUENCE_ID, track_descriptor=d))
            for d in [*self._descriptors, *self._extra]
        ]

    def packets(self, progress: Progress = SILENT) -> list[Any]:
        """Every packet of the trace, in writing order, as ``TracePacket`` messages (held in
        memory: :meth:`write` streams them)."""
        return list(self._pb.Trace.FromString(self.serialize(progress)).packet)

    def serialize(self, progress: Progress = SILENT) -> bytes:
        """The trace as bytes (a ``Trace`` message: repeated ``TracePacket``)."""
        it = self.iter_packets(progress)
        first = next(it)
        next(it)
        events = b"".join(p for p in it if p is not None)
        return b"".join([first or b"", *self._descriptors_framed(), events])

    def write(self, path: str | os.PathLike[str], progress: Progress = SILENT) -> Path:
        """Write the trace to ``path``; returns the path. The events are encoded as the
        slices are read back in order into a temporary file beside ``path``, then follow
        the descriptors: memory holds one window of slices, not the trace."""
        p = Path(path)
        with tempfile.TemporaryFile(prefix=".probe-events-", dir=p.parent) as events:
            it = self.iter_packets(progress)
            first = next(it) or b""
            next(it)
            buf: list[bytes] = []
            for packet in it:
                buf.append(packet or b"")
                if len(buf) >= 4096:
                    events.write(b"".join(buf))
                    buf.clear()
            events.write(b"".join(buf))
            with p.open("wb") as out:
                out.write(first)
                out.write(b"".join(self._descriptors_framed()))
                events.seek(0)
                while chunk := events.read(1 << 20):
                    out.write(chunk)
        return p


def _fit(stacks: list[list[int]], start: int, end: int) -> int:
    """The first lane a slice from ``start`` to ``end`` nests in or follows (as
    :func:`split_lanes` places it), a new one when none; ``stacks`` holds each lane's open
    ends and takes this one's."""
    for lane, stack in enumerate(stacks):
        while stack and stack[-1] <= start:
            stack.pop()
        if not stack or end <= stack[-1]:
            stack.append(end)
            return lane
    stacks.append([end])
    return len(stacks) - 1


def _lane_events(
    opened: list[tuple[Any, ...]], t: tuple[Any, ...]
) -> list[tuple[int, str, tuple[Any, ...]]]:
    """The events the packed slice ``t`` brings to its lane (sorted input, as
    :func:`lane_events`): the ends of the open slices that end by its start, then its begin
    (or instant)."""
    out: list[tuple[int, str, tuple[Any, ...]]] = []
    while opened and opened[-1][2] <= t[1]:
        top = opened.pop()
        out.append((top[2], "E", top))
    if t[1] == t[2]:
        out.append((t[1], "I", t))
    else:
        out.append((t[1], "B", t))
        opened.append(t)
    return out
