"""The event model: fixed-size binary records written by hooks, decoded by readers.

Every hook inside vLLM writes exactly one 64-byte record per observation into the
per-process shared-memory ring (:mod:`probe.ring`); those written inside an engine step
are held as field tuples until the step ends and then packed into the ring together
(:meth:`probe.runtime.Runtime.attach`). Nothing else happens on the hot path: no
formatting, no allocation beyond the tuple and the ``struct.pack_into``. Readers decode records
into the frozen dataclasses below and assemble them into steps (:mod:`probe.assemble`).

Layout (little endian, 64 bytes)::

    offset  size  field
    0       1     kind      RecordKind
    1       1     a         kind-specific small field (phase id, mode, tag, ...)
    2       1     b         kind-specific small field (reason, flags, ...)
    3       1     c         flags (Flag bits)
    4       4     step      the writer's step sequence number (or a string/blob id)
    8       8     t0        CLOCK_BOOTTIME ns (start)
    16      8     t1        CLOCK_BOOTTIME ns (end)
    24      40    v0..v4    five signed 64-bit kind-specific values

STRING and BLOB records reuse bytes 8..63 as 56 bytes of UTF-8 payload.

Example::

    >>> rec = encode(RecordKind.SPAN, Phase.DISPATCH, 0, 0, 7, 100, 250)
    >>> decode(rec)
    Span(step=7, phase=<Phase.DISPATCH: 4>, t0=100, t1=250, flags=0, v0=0, v1=0)
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

RECORD_FORMAT = "<BBBBIqqqqqqq"
RECORD = struct.Struct(RECORD_FORMAT)
RECORD_SIZE = RECORD.size
PAYLOAD = struct.Struct("<BBBBI56s")
PAYLOAD_BYTES = 56
assert RECORD_SIZE == 64 and PAYLOAD.size == 64


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


class Phase(enum.IntEnum):
    """Host phases of an engine step (DESIGN: "phases (host ns)")."""

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
    """Why a step did or did not replay a FULL graph (DESIGN: miss_reason)."""

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
    return RECORD.pack(kind, a, b, c, step & 0xFFFFFFFF, t0, t1, v0, v1, v2, v3, v4)


# Decoded forms. Readers work with these; the hot path never builds them.


@dataclass(frozen=True, slots=True)
class Span:
    step: int
    phase: Phase
    t0: int
    t1: int
    flags: int = 0
    v0: int = 0  # EXECUTE: total scheduled tokens
    v1: int = 0  # EXECUTE: scheduled requests

    @property
    def dur_ns(self) -> int:
        return self.t1 - self.t0


@dataclass(frozen=True, slots=True)
class Dispatch:
    """One graph-dispatch decision (V1 dispatcher or MRV2 graph manager).

    ``num_tokens``/``num_reqs`` are real; ``padded_*`` are what the graph runs with.
    """

    step: int
    mode: Mode
    reason: Reason
    flags: int
    t0: int
    t1: int
    num_tokens: int
    padded_tokens: int
    num_reqs: int
    padded_reqs: int
    max_query_len: int
    uniform_decode_query_len: int


@dataclass(frozen=True, slots=True)
class Replay:
    step: int
    mode: Mode
    kind: ReplayKind
    flags: int
    t0: int
    t1: int
    num_tokens: int


@dataclass(frozen=True, slots=True)
class Build:
    """One attention-metadata build: builder class, split and timing.

    The split is what the builder itself decided (read off its metadata) or, where the
    metadata carries none, what ``split_decodes_and_prefills`` returns for its inputs.
    Counts are -1 where neither is available.
    """

    step: int
    tag: BuildTag
    builder_id: int
    flags: int
    t0: int
    t1: int
    padded_tokens: int
    real_tokens: int
    padded_reqs: int
    real_reqs: int
    max_query_len: int
    reorder_batch_threshold: int  # -1 when the builder has none
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int

    @property
    def dur_ns(self) -> int:
        return self.t1 - self.t0


@dataclass(frozen=True, slots=True)
class Reorder:
    step: int
    changed: bool
    flags: int
    t0: int
    t1: int
    threshold: int
    num_reqs: int
    num_decodes: int
    num_decode_tokens: int
    moved: int
    spec_as_decode: bool


@dataclass(frozen=True, slots=True)
class GpuTiming:
    step: int
    busy_ns: int  # forward: first event to last event on the stream
    gpu_t0: int  # event time relative to the writer's first event, ns
    gpu_t1: int


@dataclass(frozen=True, slots=True)
class Fault:
    hook_id: int  # string id of the hook name
    count: int
    disabled: bool


def pack_pair(hi: int, lo: int) -> int:
    """Two unsigned 31-bit counts in one int64 (values below zero are stored as 0)."""
    return (max(hi, 0) << 32) | (max(lo, 0) & 0xFFFFFFFF)


def unpack_pair(v: int) -> tuple[int, int]:
    return v >> 32, v & 0xFFFFFFFF


def _minus1(v: int) -> int:
    """Counts that may be unknown are stored +1 so that 0 means unknown (-1)."""
    return v - 1


Decoded = Span | Dispatch | Replay | Build | Reorder | GpuTiming | Fault


def decode(rec: bytes | memoryview) -> Decoded | None:
    """Decode one data record; STRING, BLOB and HELLO records return None (see Decoder)."""
    kind, a, b, c, step, t0, t1, v0, v1, v2, v3, v4 = RECORD.unpack(rec)
    if kind == RecordKind.SPAN:
        return Span(step, Phase(a), t0, t1, c, v0, v1)
    if kind == RecordKind.DISPATCH:
        max_q, uq = unpack_pair(v4)
        return Dispatch(step, Mode(a), Reason(b), c, t0, t1, v0, v1, v2, v3, max_q, uq)
    if kind == RecordKind.REPLAY:
        return Replay(step, Mode(a), ReplayKind(b), c, t0, t1, v0)
    if kind == RecordKind.BUILD:
        padded_tokens, real_tokens = unpack_pair(v0)
        padded_reqs, real_reqs = unpack_pair(v1)
        max_q, thr = unpack_pair(v2)
        nd, npf = unpack_pair(v3)
        ndt, npt = unpack_pair(v4)
        return Build(
            step,
            BuildTag(a),
            b,
            c,
            t0,
            t1,
            padded_tokens,
            real_tokens,
            padded_reqs,
            real_reqs,
            max_q,
            _minus1(thr),
            _minus1(nd),
            _minus1(npf),
            _minus1(ndt),
            _minus1(npt),
        )
    if kind == RecordKind.REORDER:
        return Reorder(step, bool(a), c, t0, t1, v0, v1, v2, v3, v4, bool(b))
    if kind == RecordKind.GPU:
        return GpuTiming(step, v0, v1, v2)
    if kind == RecordKind.FAULT:
        return Fault(step, v0, bool(a))
    return None


@dataclass(frozen=True, slots=True)
class Hello:
    """First record of every ring: who wrote it and the session's clock pair."""

    pid: int
    boottime_ns: int
    epoch_ns: int
    perf_counter_ns: int


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
            _, _, _, _, _, _t0, _t1, v0, v1, v2, v3, _v4 = RECORD.unpack(rec)
            self.hello = Hello(v0, v1, v2, v3)
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
