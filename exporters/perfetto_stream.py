"""A Perfetto trace as a stream: slices laid into lanes, sorted in runs spilled to a
temporary file past a bound, and packets framed as they are written
(:mod:`exporters.perfetto` builds the trace from them)."""

from __future__ import annotations

import heapq
import operator
import os
import pickle
import struct
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

ArgValue = str | int | float | bool | None


# A slice as it is kept until it is written: its sort key on its track and its fields
# (:func:`packed`); picklable, smaller than a Slice with a dict, the args' names a tuple
# that slices of one kind share.
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
    """``s`` as a tuple: name, start, end, category, the args' names and their values
    (two tuples), flows out, flows in."""
    return (s.name, s.start_ns, s.end_ns, s.category, tuple(s.args), tuple(s.args.values()),
            s.flows_out, s.flows_in)  # fmt: skip


def unpacked(t: tuple[Any, ...]) -> Slice:
    name, start, end, category, keys, values, flows_out, flows_in = t
    return Slice(name, start, end, category, dict(zip(keys, values, strict=True)), flows_out,
                 flows_in)  # fmt: skip


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
        self.runs: dict[int, list[tuple[Key, int, int]]] = {}  # track -> (first, offset, chunks)
        self.first: dict[int, tuple[int, int]] = {}  # track -> (rank, order) of its first
        self.file: IO[bytes] | None = None

    def add(self, track: int, key: Key, s: Slice) -> None:
        self.extend(track, [(key, packed(s))])

    def extend(self, track: int, items: list[Item]) -> None:
        """Add ``items`` (keys and packed slices) to ``track``, as :meth:`add` one by one;
        past the bound, every track's held items are spilled after them."""
        if not items:
            return
        held = self.held.get(track)
        if held is None:
            held = self.held[track] = []
            if track not in self.total:
                self.total[track] = 0
                self.runs[track] = []
                self.first[track] = items[0][0][2:]
        held += items
        self.total[track] += len(items)
        self.n_held += len(items)
        if self.n_held >= self.spill_at:
            self.spill()

    def reserve(self, track: int, rank: int, order: int) -> None:
        """Place ``track`` among the tracks as if its first item's key ended in
        (``rank``, ``order``); nothing when it has items already."""
        if track not in self.total:
            self.total[track] = 0
            self.runs[track] = []
            self.first[track] = (rank, order)

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
            self.runs[track].append((held[0][0], start, chunks))
            held.clear()
        self.n_held = 0

    def _run(self, offset: int, chunks: int) -> Iterator[Item]:  # a spilled run, in order
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
        for _, t in self.items(track):
            yield unpacked(t)

    def items(self, track: int) -> Iterator[Item]:
        """``track``'s items in key order: its runs merged, each run read only from when
        the merge reaches its first key (runs that follow on hold one chunk between them,
        whatever their number)."""
        held = self.held.get(track, [])
        held.sort(key=operator.itemgetter(0))
        self.held[track] = []
        runs = sorted(self.runs.get(track, []))
        if not runs:
            yield from held
            return
        sources: list[tuple[Key, Iterator[Item]]] = [(k, self._run(o, c)) for k, o, c in runs]
        if held:
            sources.append((held[0][0], iter(held)))
            sources.sort(key=operator.itemgetter(0))
        heap: list[tuple[Key, int, Item, Iterator[Item]]] = []
        nxt = 0
        while heap or nxt < len(sources):
            while nxt < len(sources) and (not heap or sources[nxt][0] < heap[0][0]):
                it = sources[nxt][1]
                first = next(it)
                heapq.heappush(heap, (first[0], nxt, first, it))
                nxt += 1
            _, i, item, it = heap[0]
            yield item
            following = next(it, None)
            if following is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (following[0], i, following, it))

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


# -- the event packets, encoded by hand ------------------------------------------------------
#
# A trace's bulk is its slices' begin, end and instant packets; they are written here as the
# bytes the protobuf runtime gives for the same message (fields in number order, as it
# writes them), which the tests check by parsing a trace and serialising it again.

_SEQ = b"\x50" + varint(0x5647)  # TracePacket.trusted_packet_sequence_id (one sequence)
_TAIL = b"\x68\x02\xd0\x03\x06"  # sequence_flags NEEDS_INCREMENTAL_STATE, clock BOOTTIME
_TYPE = {"B": b"\x48\x01", "E": b"\x48\x02", "I": b"\x48\x03"}  # TrackEvent.type
_SMALL = [varint(n) for n in range(1 << 14)]
_U64 = (1 << 64) - 1
INTERN_CAP = 1 << 17
"""Interned names held at once; past it the table starts afresh (a name met again is
interned again under a new id), so memory stays bounded on any trace."""
_CACHED_ARGS = 1 << 16
"""Encoded (name, value) arguments kept for reuse before the cache starts afresh."""


def _uvarint(n: int) -> bytes:
    return _SMALL[n] if n < 16384 else varint(n)


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: ``tag``, the length, the bytes."""
    n = len(data)
    return tag + (_SMALL[n] if n < 16384 else varint(n)) + data


def _interned(tag: bytes, iid: int, name: str) -> bytes:
    """An ``InternedData`` entry (``EventName`` or ``DebugAnnotationName``): id and name."""
    return _field(tag, b"\x08" + _uvarint(iid) + _field(b"\x12", name.encode()))


class Intern:
    """The interned names of one table (event names, or argument names) on the trace's one
    packet sequence: each name's id, new ids counting on after the table starts afresh."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.last = 0

    def get(self, name: str) -> tuple[int, bool]:
        """``name``'s id and whether it is new (then the packet defines it)."""
        iid = self.ids.get(name)
        if iid is not None:
            return iid, False
        if len(self.ids) >= INTERN_CAP:
            self.ids.clear()
        self.last = iid = self.last + 1
        self.ids[name] = iid
        return iid, True


class EventEncoder:
    """Framed ``TracePacket`` bytes of slice events (:func:`framed` of the message the
    builder describes), names interned as they first appear on the sequence."""

    def __init__(self) -> None:
        self.names = Intern()
        self.arg_names = Intern()
        self._args: dict[Any, bytes] = {}

    def _annotation(self, key: str, value: ArgValue, interned: list[bytes]) -> bytes:
        """One ``DebugAnnotation`` field of a ``TrackEvent``."""
        cache_key: Any = (key, value.__class__, value)
        try:
            hit = self._args.get(cache_key)
        except TypeError:  # a value that is no ArgValue: written as its text, not kept
            hit, cache_key = None, None
        if hit is not None:
            return hit
        iid, new = self.arg_names.get(key)
        if new:
            if len(self.arg_names.ids) == 1:
                self._args.clear()  # the table started afresh: the cached ids are gone
            interned.append(_interned(b"\x1a", iid, key))
        if isinstance(value, bool):
            body = b"\x10\x01" if value else b"\x10\x00"
        elif isinstance(value, int):
            body = b"\x20" + (_uvarint(value) if value >= 0 else varint(value & _U64))
        elif isinstance(value, float):
            body = b"\x29" + struct.pack("<d", value)
        else:
            body = _field(b"\x32", ("" if value is None else str(value)).encode())
        out = _field(b"\x22", b"\x08" + _uvarint(iid) + body)
        if cache_key is not None:
            if len(self._args) >= _CACHED_ARGS:
                self._args.clear()
            self._args[cache_key] = out
        return out

    def event(self, ts: int, kind: str, track: int, t: tuple[Any, ...]) -> bytes:
        """The framed packet of event ``kind`` (``B``, ``E`` or ``I``) of the packed slice
        ``t`` (:func:`packed`) at ``ts`` on ``track``."""
        if kind == "E":
            te = b"\x48\x02\x58" + _uvarint(track)
            body = b"\x40" + _uvarint(ts) + _SEQ + _field(b"\x5a", te) + _TAIL
            return _field(b"\x0a", body)
        name, _, _, category, keys, values, flows_out, flows_in = t
        interned: list[bytes] = []
        iid, new = self.names.get(name)
        if new:
            interned.append(_interned(b"\x12", iid, name))
        ann = self._annotation
        parts = [ann(k, v, interned) for k, v in zip(keys, values, strict=True) if v is not None]
        parts.append(_TYPE[kind] + b"\x50" + _uvarint(iid) + b"\x58" + _uvarint(track))
        if category:
            parts.append(_field(b"\xb2\x01", category.encode()))
        for f in flows_out:
            parts.append(b"\xf9\x02" + struct.pack("<Q", f))
        for f in flows_in:
            parts.append(b"\x81\x03" + struct.pack("<Q", f))
        body = b"\x40" + _uvarint(ts) + _SEQ + _field(b"\x5a", b"".join(parts))
        if interned:
            body += _field(b"\x62", b"".join(interned))
        return _field(b"\x0a", body + _TAIL)
