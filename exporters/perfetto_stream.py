"""A Perfetto trace as a stream: slices laid into lanes, sorted in runs spilled to a
temporary file past a bound, and packets framed as they are written
(:mod:`exporters.perfetto` builds the trace from them)."""

from __future__ import annotations

import heapq
import operator
import os
import pickle
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

ArgValue = str | int | float | bool | None


# A slice as it is kept until it is written: its sort key on its track and its fields,
# the args flattened (k1, v1, k2, v2, ...); picklable, smaller than a Slice with a dict.
Key = tuple[int, int, int, int]
Item = tuple[Key, tuple[Any, ...]]
SPILL_AT = 1 << 17
"""Slices held in memory before the held ones are sorted and written to a temporary run."""


_CHUNK = 256
"""Slices per pickled chunk of a run: a track's merge holds one chunk of each run, so
memory is :data:`SPILL_AT` slices plus this many per run."""


@dataclass(frozen=True, slots=True)
class Slice:
    """One interval on a track; ``start_ns == end_ns`` is written as an instant.

    ``flows_out`` start flow arrows at this slice, ``flows_in`` end them here.
    """

    name: str
    start_ns: int
    end_ns: int
    category: str = ""
    args: Mapping[str, ArgValue] = field(default_factory=dict)
    flows_out: tuple[int, ...] = ()
    flows_in: tuple[int, ...] = ()


def split_lanes(slices: Iterable[Slice]) -> list[list[Slice]]:
    """Split slices into lanes in which every pair either nests or is disjoint.

    Perfetto draws the slices of one track as a stack; two slices that overlap without
    nesting cannot share one. Properly nested data (the probe's phases) stays in one lane.
    """
    lanes: list[list[Slice]] = []
    stacks: list[list[int]] = []
    for s in sorted(slices, key=lambda s: (s.start_ns, -s.end_ns)):
        for lane, stack in zip(lanes, stacks, strict=True):
            while stack and stack[-1] <= s.start_ns:
                stack.pop()
            if not stack or s.end_ns <= stack[-1]:
                lane.append(s)
                stack.append(s.end_ns)
                break
        else:
            lanes.append([s])
            stacks.append([s.end_ns])
    return lanes


def lane_events(lane: Sequence[Slice]) -> Iterator[tuple[int, str, Slice]]:
    """Begin/end/instant events of one lane in an order that keeps the nesting."""
    stack: list[Slice] = []
    for s in lane:  # sorted by (start, -end) by _lanes
        while stack and stack[-1].end_ns <= s.start_ns:
            top = stack.pop()
            yield top.end_ns, "E", top
        if s.start_ns == s.end_ns:
            yield s.start_ns, "I", s
        else:
            yield s.start_ns, "B", s
            stack.append(s)
    while stack:
        top = stack.pop()
        yield top.end_ns, "E", top


def packed(s: Slice) -> tuple[Any, ...]:
    flat: list[Any] = []
    for k, v in s.args.items():
        flat += (k, v)
    return (s.name, s.start_ns, s.end_ns, s.category, tuple(flat), s.flows_out, s.flows_in)


def unpacked(t: tuple[Any, ...]) -> Slice:
    name, start, end, category, flat, flows_out, flows_in = t
    args = dict(zip(flat[::2], flat[1::2], strict=True))
    return Slice(name, start, end, category, args, flows_out, flows_in)


class Runs:
    """Every track's slices in their writing order (start, longest first, then the order
    they were added in), in memory bounded by :data:`SPILL_AT`: past it, each track's
    held slices are sorted and appended to a temporary file as a run, and a track is read
    back as the merge of its runs."""

    def __init__(self, spill_at: int = SPILL_AT) -> None:
        self.spill_at = spill_at
        self.held: dict[int, list[Item]] = {}
        self.n_held = 0
        self.total: dict[int, int] = {}
        self.runs: dict[int, list[tuple[int, int]]] = {}  # track -> (offset, chunks)
        self.first: dict[int, tuple[int, int]] = {}  # track -> (rank, order) of its first
        self.file: IO[bytes] | None = None

    def add(self, track: int, key: Key, s: Slice) -> None:
        held = self.held.get(track)
        if held is None:
            held = self.held[track] = []
            if track not in self.total:
                self.total[track] = 0
                self.runs[track] = []
                self.first[track] = key[2:]
        held.append((key, packed(s)))
        self.total[track] += 1
        self.n_held += 1
        if self.n_held >= self.spill_at:
            self.spill()

    def spill(self) -> None:
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="probe-trace-")  # noqa: SIM115 (close())
        f = self.file
        f.seek(0, os.SEEK_END)
        for track, held in self.held.items():
            if not held:
                continue
            held.sort(key=operator.itemgetter(0))
            start, chunks = f.tell(), 0
            for i in range(0, len(held), _CHUNK):
                pickle.dump(held[i : i + _CHUNK], f, protocol=pickle.HIGHEST_PROTOCOL)
                chunks += 1
            self.runs[track].append((start, chunks))
            held.clear()
        self.n_held = 0

    def _run(self, offset: int, chunks: int) -> Iterator[Item]:
        f = self.file
        assert f is not None
        pos = offset
        for _ in range(chunks):
            f.seek(pos)
            items: list[Item] = pickle.load(f)
            pos = f.tell()
            yield from items

    def tracks(self) -> Iterator[int]:
        """The tracks in the order of their first slice's (rank, order added)."""
        return iter(sorted(self.first, key=self.first.__getitem__))

    def sorted(self, track: int) -> Iterator[Slice]:
        held = self.held.get(track, [])
        held.sort(key=operator.itemgetter(0))
        runs = [self._run(o, c) for o, c in self.runs.get(track, [])]
        items = heapq.merge(*runs, held, key=operator.itemgetter(0)) if runs else iter(held)
        for _, t in items:
            yield unpacked(t)
        self.held[track] = []

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class Spool:
    """Items kept in order, in memory up to a bound and in a temporary file past it."""

    def __init__(self, bound: int = SPILL_AT) -> None:
        self.bound = bound
        self.items: list[Any] = []
        self.file: IO[bytes] | None = None
        self.chunks = 0

    def append(self, item: Any) -> None:
        self.items.append(item)
        if len(self.items) >= self.bound:
            if self.file is None:
                self.file = tempfile.TemporaryFile(prefix="probe-lane-")  # noqa: SIM115 (read once)
            pickle.dump(self.items, self.file, protocol=pickle.HIGHEST_PROTOCOL)
            self.chunks += 1
            self.items = []

    def __iter__(self) -> Iterator[Any]:
        if self.file is not None:
            self.file.seek(0)
            for _ in range(self.chunks):
                yield from pickle.load(self.file)
            self.file.close()
            self.file = None
        yield from self.items
        self.items = []


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def framed(packet: Any) -> bytes:
    """One ``TracePacket`` as the ``Trace`` message's field 1 holds it: a trace file is
    these, one after the other (what ``Trace.SerializeToString`` gives for them all)."""
    data: bytes = packet.SerializeToString()
    return b"\x0a" + varint(len(data)) + data
