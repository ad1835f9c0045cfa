"""Read a Perfetto protobuf trace back for tests (trace_processor needs a download here).

Parses with the ``perfetto`` package's protos, resolves interned names the way
trace_processor does (per sequence, in packet order) and rebuilds slices from begin/end
pairs per track, failing on an unbalanced or badly nested track.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


@dataclass
class ParsedSlice:
    track: int
    name: str
    category: str
    start_ns: int
    end_ns: int
    args: dict[str, Any]
    flows_out: list[int]
    flows_in: list[int]


@dataclass
class ParsedTrace:
    packets: list[Any]
    tracks: dict[int, Any] = field(default_factory=dict)
    slices: list[ParsedSlice] = field(default_factory=list)
    clock_ids: set[int] = field(default_factory=set)

    def by_category(self, cat: str) -> list[ParsedSlice]:
        return [s for s in self.slices if s.category == cat]

    def track_name(self, uuid: int) -> str:
        d = self.tracks[uuid]
        if d.HasField("thread"):
            return str(d.thread.thread_name)
        if d.HasField("process"):
            return str(d.process.process_name)
        return str(d.name)


def _value(a: Any) -> Any:
    for f in ("string_value", "int_value", "bool_value", "double_value"):
        if a.HasField(f):
            return getattr(a, f)
    return None


def read_trace(path: str | Path) -> ParsedTrace:
    trace = pb.Trace()
    trace.ParseFromString(Path(path).read_bytes())
    out = ParsedTrace(list(trace.packet))
    names: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    open_: dict[int, list[ParsedSlice]] = {}
    cleared = False
    for p in trace.packet:
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            names.clear()
            arg_names.clear()
            cleared = True
        if p.HasField("interned_data"):
            names.update({e.iid: e.name for e in p.interned_data.event_names})
            arg_names.update({e.iid: e.name for e in p.interned_data.debug_annotation_names})
        if p.HasField("track_descriptor"):
            out.tracks[p.track_descriptor.uuid] = p.track_descriptor
        if not p.HasField("track_event"):
            continue
        assert cleared, "a track event before the sequence was cleared"
        out.clock_ids.add(p.timestamp_clock_id)
        te = p.track_event
        assert te.track_uuid in out.tracks, f"event on undeclared track {te.track_uuid}"
        if te.type == pb.TrackEvent.TYPE_SLICE_END:
            stack = open_.get(te.track_uuid)
            assert stack, f"end without begin on track {te.track_uuid} at {p.timestamp}"
            s = stack.pop()
            assert p.timestamp >= s.start_ns
            s.end_ns = p.timestamp
            continue
        name = te.name if te.HasField("name") else names[te.name_iid]
        args = {
            (a.name if a.HasField("name") else arg_names[a.name_iid]): _value(a)
            for a in te.debug_annotations
        }
        s = ParsedSlice(
            te.track_uuid,
            name,
            te.categories[0] if te.categories else "",
            p.timestamp,
            p.timestamp,
            args,
            list(te.flow_ids),
            list(te.terminating_flow_ids),
        )
        stack = open_.setdefault(te.track_uuid, [])
        if stack:
            assert stack[-1].start_ns <= p.timestamp, "begin before the enclosing begin"
        out.slices.append(s)
        if te.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stack.append(s)
    assert not any(open_.values()), "slices left open"
    return out
