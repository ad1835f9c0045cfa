"""The event model: every record kind declared once, with its fields, types and units.

Every hook inside vLLM writes fixed 64-byte records into the per-process shared-memory
ring (:mod:`probe.ring`); readers decode them into the frozen dataclasses below and
assemble them into steps (:mod:`probe.reader.assemble`). Each dataclass *is* the declaration of
its record kind: every field says where it lives in the 64 bytes (:func:`at`), its type
(``int``, ``bool`` or an ``IntEnum``) and its unit. From that one declaration come

- the packers: one positional function per kind, ``pack_<kind>(*fields)``, with the
  fields in declaration order (:func:`packer_source` generates the Python one; the
  compiled accelerator, :mod:`probe.engine.accel`, is handed the same layout by
  :func:`c_layout`), used by hooks as ``RT.put.span(...)``, ``RT.put.dispatch(...)``;
- the decoder: :func:`decode` unpacks a record into its dataclass through the same
  layout, checking enum values.

Layout (little endian, 64 bytes)::

    offset  size  slot      meaning
    0       1     kind      RecordKind
    1       1     a         small unsigned field (phase id, mode, tag, ...)
    2       1     b         small unsigned field (reason, flags, ...)
    3       1     c         small unsigned field (Flag bits)
    4       4     step      the writer's step sequence number (or a string/blob id)
    8       8     t0        signed 64-bit (CLOCK_BOOTTIME ns, usually)
    16      8     t1        signed 64-bit
    24      40    v0..v4    five signed 64-bit values; a value slot may hold two unsigned
                            31-bit counts (``part="hi"``/``"lo"``)

A field with ``unknown_as=-1`` may be -1 ("unknown"); it is stored +1 so that 0 means
unknown. STRING and BLOB records reuse bytes 8..63 as 56 bytes of UTF-8 payload.

Example::

    >>> put = packers(lambda *rec: print(rec))
    >>> put.span(7, 4, 100, 250, 0, 0, 0, 0)
    (1, 4, 0, 0, 7, 100, 250, 0, 0, 0, 0, 0)
    >>> decode(encode(1, 4, 0, 0, 7, 100, 250))
    Span(step=7, phase=<Phase.DISPATCH: 4>, t0=100, t1=250, flags=0, v0=0, v1=0, v2=0)

Adding a field: add it to the dataclass with :func:`at` naming a free slot (or half
slot); the packers, the decoder, the round-trip test (``tests/engine/test_records.py``) and the
compiled path follow from the declaration. Then write it at the hook's ``RT.put`` call.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

RECORD_FORMAT = "<BBBBIqqqqqqq"
RECORD = struct.Struct(RECORD_FORMAT)
RECORD_SIZE = RECORD.size
PAYLOAD = struct.Struct("<BBBBI56s")
PAYLOAD_BYTES = 56
if RECORD_SIZE != 64 or PAYLOAD.size != 64:
    raise ImportError("probe.records: the record layout is not 64 bytes")

SLOTS = ("a", "b", "c", "step", "t0", "t1", "v0", "v1", "v2", "v3", "v4")
"""The value slots of a record, in wire order (after ``kind``)."""
_SLOT_INDEX = {name: i for i, name in enumerate(SLOTS)}
_SMALL = {"a": 0xFF, "b": 0xFF, "c": 0xFF, "step": 0xFFFFFFFF}
PART_MASK = 0x7FFFFFFF  # a half slot holds an unsigned 31-bit count


class RecordKind(enum.IntEnum):
    SPAN = 1
    DISPATCH = 2
    REPLAY = 3
    BUILD = 4
    REORDER = 5
    GPU = 6
    STRING = 7
    BLOB = 8
    FAULT = 9
    HELLO = 10
    FORWARD = 11


class Phase(enum.IntEnum):
    """Host phases of an engine step (docs/architecture.md, "Definitions")."""

    EXECUTE = 1  # Worker/runner execute_model: opens a step
    SAMPLE_TOKENS = 2  # runner sample_tokens: closes a step
    REORDER = 3
    DISPATCH = 4
    PREPARE_INPUTS = 5
    METADATA_BUILD = 6
    FORWARD_LAUNCH = 7
    LOGITS = 8
    SAMPLE = 9
    DRAFT = 10
    SYNC_STALL = 11


class Mode(enum.IntEnum):
    """CUDAGraphMode runtime values, as vLLM numbers them."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2


class Reason(enum.IntEnum):
    """Why a step did or did not replay a FULL graph (docs/architecture.md, "Definitions")."""

    UNKNOWN = 0
    HIT = 1
    PIECEWISE_ONLY = 2
    GRAPHS_DISABLED = 3
    WARMUP_OR_PROFILE = 4
    FORCED_EAGER = 5
    BATCH_TOO_BIG = 6
    NOT_UNIFORM = 7
    BACKEND_SUPPORT_TOO_LOW = 8
    NO_FULL_KEY_FOR_SIZE = 9
    MIXED_BATCH_IN_FULL_DECODE_ONLY = 10
    CASCADE_ATTENTION = 11
    LORA_MISMATCH = 12

    @property
    def label(self) -> str:
        return self.name.lower()


class ReplayKind(enum.IntEnum):
    REPLAY = 0
    CAPTURE = 1  # a capture: an anomaly outside a capture window
    PASSTHROUGH = 2


class BuildTag(enum.IntEnum):
    STEP = 0
    CAPTURE = 1
    DRAFTING = 2


class BlobType(enum.IntEnum):
    SNAPSHOT = 1  # JSON of the static (doctor) snapshot


class Flag(enum.IntFlag):
    NONE = 0
    DRAFTER = 1  # written inside the MTP drafter / speculator
    OUTSIDE_STEP = 2  # written outside execute_model/sample_tokens (capture, dummy, profile)
    UNIFORM = 4  # batch is a uniform decode batch
    MRV2 = 8  # Model Runner V2
    BREAKABLE = 16  # breakable CUDA graph wrapper
    LAST = 32  # last chunk of a STRING/BLOB
    SPAN = 64  # a DISPATCH record whose t0..t1 is also the step's dispatch phase
    # MRV2's prepare_inputs phase begins where the step's dispatch phase ended. On a
    # METADATA_BUILD span (the model state's prepare_attn): the phase ends where this span
    # begins (the reader adds its span); on a PREPARE_INPUTS span (the runner's
    # prepare_attn, where the state's is not called every step; every MRV2 recording
    # from before the model state's span was hooked): the phase ends with it (extended back)
    FROM_DISPATCH = 128


# -- the declaration machinery ------------------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """Where one declared field lives in the record, and what it is."""

    name: str
    slot: str  # one of SLOTS
    part: str  # "" (the whole slot), "hi" or "lo" (an unsigned 31-bit half of a v slot)
    unknown_as: int | None  # -1: stored +1, so that 0 on the wire means -1
    type: Any  # int, bool or an IntEnum class
    unit: str
    doc: str


def at(
    slot: str,
    part: str = "",
    *,
    unit: str = "",
    doc: str = "",
    unknown_as: int | None = None,
    default: Any = dataclasses.MISSING,
) -> Any:
    """Declare a record field: its slot (and half), unit and meaning."""
    if slot not in _SLOT_INDEX:
        raise ValueError(f"unknown slot {slot!r}")
    if part not in ("", "hi", "lo") or (part and not slot.startswith("v")):
        raise ValueError(f"part {part!r} is only for v slots (hi/lo)")
    meta = {"slot": slot, "part": part, "unit": unit, "doc": doc, "unknown_as": unknown_as}
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class RecordSpec:
    """One record kind: its wire kind, its name (``pack_<name>``) and its fields."""

    kind: RecordKind
    name: str
    cls: type
    fields: tuple[FieldSpec, ...]


SPECS: dict[RecordKind, RecordSpec] = {}


def record(kind: RecordKind, name: str) -> Callable[[type], type]:
    """Class decorator: register a frozen dataclass as the declaration of ``kind``."""

    def deco(cls: type) -> type:
        hints = _resolved_hints(cls)
        specs = []
        used: set[tuple[str, str]] = set()
        for f in dataclasses.fields(cls):
            m = f.metadata
            if "slot" not in m:
                raise TypeError(f"{cls.__name__}.{f.name}: declare it with at(...)")
            where = (m["slot"], m["part"])
            clash = where in used or (m["slot"], "") in used
            clash = clash or (not m["part"] and any(s == m["slot"] for s, _ in used))
            if clash:
                raise TypeError(f"{cls.__name__}.{f.name}: slot {where} used twice")
            used.add(where)
            specs.append(
                FieldSpec(
                    f.name,
                    m["slot"],
                    m["part"],
                    m["unknown_as"],
                    hints[f.name],
                    m["unit"],
                    m["doc"],
                )
            )
        spec = RecordSpec(kind, name, cls, tuple(specs))
        if kind in SPECS:
            raise TypeError(f"record kind {kind.name} declared twice")
        SPECS[kind] = spec
        cls.SPEC = spec  # type: ignore[attr-defined]
        return cls

    return deco


def _resolved_hints(cls: type) -> dict[str, Any]:
    names = {
        "int": int,
        "bool": bool,
        "Phase": Phase,
        "Mode": Mode,
        "Reason": Reason,
        "ReplayKind": ReplayKind,
        "BuildTag": BuildTag,
    }
    out: dict[str, Any] = {}
    for name, ann in cls.__annotations__.items():
        if ann in ("ClassVar[RecordSpec]",):
            continue
        out[name] = names[ann] if isinstance(ann, str) else ann
    return out


# -- the record kinds ---------------------------------------------------------------------


@record(RecordKind.SPAN, "span")
@dataclass(frozen=True, slots=True)
class Span:
    """A host phase span: ``execute_model``/``sample_tokens`` (the step bracket) and any
    phase not folded into a DISPATCH or FORWARD record."""

    SPEC: ClassVar[RecordSpec]
    step: int = at("step")
    phase: Phase = at("a")
    t0: int = at("t0", unit="ns", doc="CLOCK_BOOTTIME at entry")
    t1: int = at("t1", unit="ns", doc="CLOCK_BOOTTIME at exit")
    flags: int = at("c", default=0)
    v0: int = at("v0", unit="tokens", doc="EXECUTE: total scheduled tokens", default=0)
    v1: int = at("v1", unit="requests", doc="EXECUTE: scheduled requests", default=0)
    v2: int = at(
        "v2",
        unit="requests",
        doc="EXECUTE: scheduled requests carried over from an earlier step (not new); -1 unknown",
        default=-1,
    )

    @property
    def dur_ns(self) -> int:
        return self.t1 - self.t0


@record(RecordKind.DISPATCH, "dispatch")
@dataclass(frozen=True, slots=True)
class Dispatch:
    """One graph-dispatch decision (V1 dispatcher or MRV2 graph manager).

    ``num_tokens``/``num_reqs`` are real; ``padded_*`` are what the graph runs with. With
    ``Flag.SPAN`` set, ``t0..t1`` is the runner's whole dispatch phase (the decision and
    its span in one record); otherwise the dispatcher call alone.
    """

    SPEC: ClassVar[RecordSpec]
    step: int = at("step")
    mode: Mode = at("a")
    reason: Reason = at("b")
    flags: int = at("c")
    t0: int = at("t0", unit="ns")
    t1: int = at("t1", unit="ns")
    num_tokens: int = at("v0", unit="tokens")
    padded_tokens: int = at("v1", unit="tokens")
    num_reqs: int = at("v2", unit="requests")
    padded_reqs: int = at("v3", unit="requests")
    max_query_len: int = at("v4", "hi", unit="tokens")
    uniform_decode_query_len: int = at("v4", "lo", unit="tokens")


@record(RecordKind.REPLAY, "replay")
@dataclass(frozen=True, slots=True)
class Replay:
    """A graph replay, capture or piecewise pass seen outside a target forward scope
    (the drafter's, or a wrapper called with no forward hook around it)."""

    SPEC: ClassVar[RecordSpec]
    step: int = at("step")
    mode: Mode = at("a")
    kind: ReplayKind = at("b")
    flags: int = at("c")
    t0: int = at("t0", unit="ns")
    t1: int = at("t1", unit="ns")
    num_tokens: int = at("v0", unit="tokens")


@record(RecordKind.FORWARD, "forward")
@dataclass(frozen=True, slots=True)
class Forward:
    """The forward launch and what replayed inside it, in one record.

    ``t0..t1`` is the host time of the forward call (the FORWARD_LAUNCH phase). Inside
    it: ``full_replays`` FULL graph replays, ``pieces`` PIECEWISE piece replays,
    ``captures`` captures, ``passes`` calls into MRV2's piecewise runner, and the
    ``mode``/``num_tokens`` of the last replay seen (NONE and 0 when none).
    """

    SPEC: ClassVar[RecordSpec]
    step: int = at("step")
    mode: Mode = at("a")
    flags: int = at("c")
    t0: int = at("t0", unit="ns")
    t1: int = at("t1", unit="ns")
    full_replays: int = at("v0", "hi", unit="replays")
    pieces: int = at("v0", "lo", unit="replays")
    captures: int = at("v1", "hi", unit="captures")
    passes: int = at("v1", "lo", unit="calls")
    num_tokens: int = at("v2", unit="tokens")
    replay_t0: int = at("v3", unit="ns", doc="first replay's start (0: none)")
    replay_t1: int = at("v4", unit="ns", doc="last replay's end (0: none)")


@record(RecordKind.BUILD, "build")
@dataclass(frozen=True, slots=True)
class Build:
    """One attention-metadata build: builder class, split and timing.

    The split is what the builder itself decided (read off its metadata) or, where the
    metadata carries none, what ``split_decodes_and_prefills`` returns for its inputs.
    Counts are -1 where neither is available.

    The hook reads only plain attributes inside vLLM. ``real_tokens``, ``real_reqs``
    and a missing ``num_prefill_tokens`` are derived by the reader
    (:func:`probe.reader.assemble.fill_builds`, from the step's dispatch): the engine writes -1.
    """

    SPEC: ClassVar[RecordSpec]
    step: int = at("step")
    tag: BuildTag = at("a")
    builder_id: int = at("b", doc="string id of the builder class (0: over 255)")
    flags: int = at("c")
    t0: int = at("t0", unit="ns")
    t1: int = at("t1", unit="ns")
    padded_tokens: int = at("v0", "hi", unit="tokens")
    real_tokens: int = at("v0", "lo", unit="tokens", unknown_as=-1)
    padded_reqs: int = at("v1", "hi", unit="requests")
    real_reqs: int = at("v1", "lo", unit="requests", unknown_as=-1)
    max_query_len: int = at("v2", "hi", unit="tokens")
    reorder_batch_threshold: int = at("v2", "lo", unit="tokens", unknown_as=-1)
    num_decodes: int = at("v3", "hi", unit="requests", unknown_as=-1)
    num_prefills: int = at("v3", "lo", unit="requests", unknown_as=-1)
    num_decode_tokens: int = at("v4", "hi", unit="tokens", unknown_as=-1)
    num_prefill_tokens: int = at("v4", "lo", unit="tokens", unknown_as=-1)

    @property
    def dur_ns(self) -> int:
        return self.t1 - self.t0


@record(RecordKind.REORDER, "reorder")
@dataclass(frozen=True, slots=True)
class Reorder:
    SPEC: ClassVar[RecordSpec]
    step: int = at("step")
    changed: bool = at("a")
    flags: int = at("c")
    t0: int = at("t0", unit="ns")
    t1: int = at("t1", unit="ns")
    threshold: int = at("v0", unit="tokens", doc="-1: no threshold")
    num_reqs: int = at("v1", unit="requests")
    num_decodes: int = at("v2", unit="requests")
    num_decode_tokens: int = at("v3", unit="tokens")
    moved: int = at("v4", unit="requests")
    spec_as_decode: bool = at("b")


@record(RecordKind.GPU, "gpu")
@dataclass(frozen=True, slots=True)
class GpuTiming:
    """Device-event timings of one sampled step (read lazily in the writer)."""

    SPEC: ClassVar[RecordSpec]
    step: int = at("step")
    busy_ns: int = at("v0", unit="ns", doc="forward: first to last event on the stream")
    idle_before_ns: int = at("v1", unit="ns", doc="gap since the previous step; -1 unknown")
    span_ns: int = at("v2", unit="ns", doc="the step's device span")


@record(RecordKind.FAULT, "fault")
@dataclass(frozen=True, slots=True)
class Fault:
    SPEC: ClassVar[RecordSpec]
    hook_id: int = at("step", doc="string id of the hook name")
    count: int = at("v0")
    disabled: bool = at("a")


@record(RecordKind.HELLO, "hello")
@dataclass(frozen=True, slots=True)
class Hello:
    """First record of every ring: who wrote it and the session's clock pair."""

    SPEC: ClassVar[RecordSpec]
    pid: int = at("v0")
    boottime_ns: int = at("v1", unit="ns")
    epoch_ns: int = at("v2", unit="ns")
    perf_counter_ns: int = at("v3", unit="ns")
    hot_path: int = at("v4", doc="1: the compiled accelerator, 0: pure Python", default=0)


Decoded = Span | Dispatch | Replay | Forward | Build | Reorder | GpuTiming | Fault


# -- derived: packers ---------------------------------------------------------------------


def packer_source(spec: RecordSpec) -> str:
    """Python source of ``pack_<name>(write)``: a function taking the declared fields in
    order and calling ``write`` with the 12 wire values (kind first)."""
    exprs = {s: "0" for s in SLOTS}
    halves: dict[str, list[str]] = {}
    for f in spec.fields:
        v = f.name if f.unknown_as is None else f"({f.name} + 1)"
        if f.part == "hi":  # int(): a numpy integer would wrap instead of shifting
            halves.setdefault(f.slot, []).append(f"(int({v}) << 32)")
        elif f.part == "lo":
            halves.setdefault(f.slot, []).append(f"({v} & 0xFFFFFFFF)")
        elif f.slot == "step":
            exprs[f.slot] = f"{v} & 0xFFFFFFFF"
        else:
            exprs[f.slot] = v
    for slot, parts in halves.items():
        exprs[slot] = " | ".join(parts)
    args = ", ".join(f.name for f in spec.fields)
    body = ", ".join([str(int(spec.kind))] + [exprs[s] for s in SLOTS])
    return (
        f"def pack_{spec.name}(write):\n"
        f"    def {spec.name}({args}):\n"
        f"        return write({body})\n"
        f"    return {spec.name}\n"
    )


_PACKER_FACTORIES: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {}
for _spec in SPECS.values():
    _ns: dict[str, Any] = {}
    exec(packer_source(_spec), _ns)  # generated from the declaration above, nothing else
    _PACKER_FACTORIES[_spec.name] = _ns[f"pack_{_spec.name}"]


def c_layout(spec: RecordSpec) -> tuple[tuple[int, int, int], ...]:
    """The layout the compiled packer takes: per field ``(slot index, part, bias)`` with
    part 0 whole, 1 hi, 2 lo."""
    return tuple(
        (_SLOT_INDEX[f.slot], {"": 0, "hi": 1, "lo": 2}[f.part], 0 if f.unknown_as is None else 1)
        for f in spec.fields
    )


class Packers:
    """One positional packer per record kind, bound to one ``write`` (12 wire values)."""

    __slots__ = tuple(s.name for s in SPECS.values())

    span: Callable[..., Any]
    dispatch: Callable[..., Any]
    replay: Callable[..., Any]
    forward: Callable[..., Any]
    build: Callable[..., Any]
    reorder: Callable[..., Any]
    gpu: Callable[..., Any]
    fault: Callable[..., Any]
    hello: Callable[..., Any]


def packers(write: Callable[..., Any]) -> Packers:
    """The Python packers of every kind, writing through ``write``."""
    p = Packers()
    for name, factory in _PACKER_FACTORIES.items():
        setattr(p, name, factory(write))
    return p


def encode(
    kind: int,
    a: int = 0,
    b: int = 0,
    c: int = 0,
    step: int = 0,
    t0: int = 0,
    t1: int = 0,
    v0: int = 0,
    v1: int = 0,
    v2: int = 0,
    v3: int = 0,
    v4: int = 0,
) -> bytes:
    """One record from its 12 wire values (tests and raw tools; hooks use packers)."""
    return RECORD.pack(kind, a, b, c, step & 0xFFFFFFFF, t0, t1, v0, v1, v2, v3, v4)


def pack(rec: Decoded | Hello) -> bytes:
    """The 64 bytes of a decoded record (the inverse of :func:`decode`)."""
    spec: RecordSpec = type(rec).SPEC
    out: list[bytes] = []
    _PACKER_FACTORIES[spec.name](lambda *w: out.append(encode(*w)))(
        *(getattr(rec, f.name) for f in spec.fields)
    )
    return out[0]


def pack_pair(hi: int, lo: int) -> int:
    """Two unsigned 31-bit counts in one int64 (values below zero are stored as 0)."""
    return (max(hi, 0) << 32) | (max(lo, 0) & 0xFFFFFFFF)


def unpack_pair(v: int) -> tuple[int, int]:
    return v >> 32, v & 0xFFFFFFFF


# -- derived: the decoder -----------------------------------------------------------------


class RecordDecodeError(ValueError):
    """A record whose kind or enum field holds a value no declaration allows."""


def _field_decoder(f: FieldSpec) -> Callable[[tuple[int, ...]], Any]:
    i = 1 + _SLOT_INDEX[f.slot]  # wire tuple index (kind is 0)
    bias = 0 if f.unknown_as is None else 1
    typ = f.type

    def raw(w: tuple[int, ...]) -> int:
        v = w[i]
        if f.part == "hi":
            v = v >> 32
        elif f.part == "lo":
            v = v & 0xFFFFFFFF
        return v - bias

    if typ is int:
        return raw
    if typ is bool:
        return lambda w: bool(raw(w))

    def as_enum(w: tuple[int, ...]) -> Any:
        v = raw(w)
        try:
            return typ(v)
        except ValueError:
            raise RecordDecodeError(f"{f.name}: {v} is not a {typ.__name__}") from None

    return as_enum


_DECODERS: dict[int, tuple[type, tuple[Callable[[tuple[int, ...]], Any], ...]]] = {
    int(s.kind): (s.cls, tuple(_field_decoder(f) for f in s.fields)) for s in SPECS.values()
}


_SETTERS: dict[type, tuple[tuple[str, Callable[[Any, Any], None]], ...]] = {
    s.cls: tuple((f.name, s.cls.__dict__[f.name].__set__) for f in s.fields) for s in SPECS.values()
}


def _kind_decoder(spec: RecordSpec) -> Callable[[tuple[int, ...]], Any]:
    """One function per kind, generated from the same declaration as :func:`_field_decoder`
    (one call per record instead of one per field: the reader's decode cost per step,
    62-74 µs with the closures). An enum value out of range raises ``KeyError``; the
    caller then decodes field by field for the error that names the field.

    The record is built as the dataclass's own ``__init__`` would build it, without its
    cost: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__`` (about 1 µs for a seven-field record), here each slot's own
    descriptor sets it (0.5 µs), and an enum member by value is a lookup (40 ns against 350
    for ``Phase(v)``). The round-trip tests compare the two builds."""
    cls = spec.cls
    if getattr(cls, "__post_init__", None) is not None or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: the decoder builds slotted records without __init__")
    env: dict[str, Any] = {"new": object.__new__, "cls": cls}
    lines = [f"def decode_{spec.kind.name.lower()}(w):", "    o = new(cls)"]
    for j, f in enumerate(spec.fields):
        v = f"w[{1 + _SLOT_INDEX[f.slot]}]"
        if f.part == "hi":
            v = f"({v} >> 32)"
        elif f.part == "lo":
            v = f"({v} & 0xFFFFFFFF)"
        if f.unknown_as is not None:
            v = f"({v} - 1)"
        if f.type is bool:
            v = f"bool({v})"
        elif f.type is not int:
            env[f"M{j}"] = dict(f.type._value2member_map_)  # type: ignore[attr-defined]
            v = f"M{j}[{v}]"
        env[f"S{j}"] = _SETTERS[cls][j][1]
        lines.append(f"    S{j}(o, {v})")
    lines.append("    return o")
    src = "\n".join(lines) + "\n"
    exec(compile(src, f"<probe.records: {spec.kind.name} decoder>", "exec"), env)
    fn: Callable[[tuple[int, ...]], Any] = env[f"decode_{spec.kind.name.lower()}"]
    return fn


def evolve(rec: Any, **changes: Any) -> Any:
    """``dataclasses.replace(rec, **changes)`` for a record, built as the generated
    decoders build one (about a tenth of ``replace``'s cost, once per step in the
    reader). Only fields, only records."""
    setters = _SETTERS[type(rec)]
    unknown = changes.keys() - {name for name, _ in setters}
    if unknown:
        raise TypeError(f"{type(rec).__name__} has no field(s) {sorted(unknown)}")
    o = object.__new__(type(rec))
    for name, setter in setters:
        setter(o, changes[name] if name in changes else getattr(rec, name))
    return o


_FAST: dict[int, Callable[[tuple[int, ...]], Any]] = {
    int(s.kind): _kind_decoder(s) for s in SPECS.values()
}
_NOT_DATA = frozenset({int(RecordKind.STRING), int(RecordKind.BLOB), int(RecordKind.HELLO)})
_unpack = RECORD.unpack


def _decode_slowly(w: tuple[int, ...]) -> Decoded:
    """Field by field: the twin of :data:`_FAST`, and the one that names a bad field."""
    try:
        cls, fields = _DECODERS[w[0]]
    except KeyError:
        raise RecordDecodeError(f"unknown record kind {w[0]}") from None
    out: Decoded = cls(*(d(w) for d in fields))
    return out


def decode(rec: bytes | memoryview) -> Decoded | None:
    """Decode one data record; STRING, BLOB and HELLO records return None (see Decoder).

    Raises :class:`RecordDecodeError` for an unknown kind or an enum value out of range.
    """
    w = _unpack(rec)
    kind = w[0]
    if kind in _NOT_DATA:
        return None
    fast = _FAST.get(kind)
    if fast is not None:
        try:
            out: Decoded = fast(w)
            return out
        except KeyError:
            pass  # an enum value out of range: the slow path says which field
    return _decode_slowly(w)


def _decode_hello(rec: bytes | memoryview) -> Hello:
    cls, fields = _DECODERS[int(RecordKind.HELLO)]
    w = RECORD.unpack(rec)
    hello: Hello = cls(*(d(w) for d in fields))
    return hello


class Decoder:
    """Stateful decoder for one ring: resolves STRING ids and reassembles BLOBs."""

    def __init__(self) -> None:
        self.strings: dict[int, str] = {}
        self.blobs: list[tuple[BlobType, bytes]] = []
        self.hello: Hello | None = None
        self._parts: dict[int, list[bytes]] = {}
        self._blob_parts: list[bytes] = []

    def feed(self, rec: bytes | memoryview) -> Decoded | None:
        kind = rec[0]
        if kind == RecordKind.STRING or kind == RecordKind.BLOB:
            _, a, _b, c, ident, payload = PAYLOAD.unpack(rec)
            chunk = payload[:a] if a else payload
            if kind == RecordKind.STRING:
                parts = self._parts.setdefault(ident, [])
                parts.append(chunk)
                if c & Flag.LAST:
                    self.strings[ident] = b"".join(self._parts.pop(ident)).decode(
                        "utf-8", "replace"
                    )
            else:
                self._blob_parts.append(chunk)
                if c & Flag.LAST:
                    self.blobs.append((BlobType(_b), b"".join(self._blob_parts)))
                    self._blob_parts = []
            return None
        if kind == RecordKind.HELLO:
            self.hello = _decode_hello(rec)
            return None
        return decode(rec)

    def name(self, ident: int) -> str:
        return self.strings.get(ident, f"<string {ident}>")


def payload_records(kind: RecordKind, ident: int, data: bytes, sub: int = 0) -> list[bytes]:
    """Split ``data`` into STRING/BLOB records (byte ``a`` = used length, LAST on the end)."""
    out: list[bytes] = []
    chunks = [data[i : i + PAYLOAD_BYTES] for i in range(0, len(data), PAYLOAD_BYTES)] or [b""]
    for i, chunk in enumerate(chunks):
        last = Flag.LAST if i == len(chunks) - 1 else 0
        used = len(chunk) if len(chunk) < PAYLOAD_BYTES else 0
        out.append(PAYLOAD.pack(kind, used, sub, last, ident, chunk))
    return out


# The points of a timed step at which the hooks tick the GPU timer
# (probe.engine.hooks.step.GpuTimer.tick); the C reads the same numbers from the
# generated header.
TICK_STEP_START, TICK_FORWARD_START, TICK_FORWARD_END, TICK_STEP_END, TICK_PREV_END = range(5)
