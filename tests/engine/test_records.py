"""The record declaration: every kind round-trips through its derived packers (the Python
one and the compiled one, into a real ring) and its derived decoder."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe import records
from probe.engine import accel
from probe.engine.ring_writer import RingWriter
from probe.reader.ring_reader import RingReader
from probe.records import SPECS, FieldSpec, RecordKind, RecordSpec, decode, encode, pack, packers

KINDS = [s for s in SPECS.values() if s.kind != RecordKind.HELLO]


def _values(f: FieldSpec) -> st.SearchStrategy[Any]:
    if isinstance(f.type, type) and issubclass(f.type, enum.Enum):
        return st.sampled_from(list(f.type))
    if f.type is bool:
        return st.booleans()
    low = -1 if f.unknown_as is not None else 0
    if f.slot in ("a", "b", "c"):
        return st.integers(0, 255)
    if f.slot == "step":
        return st.integers(0, 2**32 - 1)
    if f.part:
        return st.integers(low, records.PART_MASK - 1)
    return st.integers(-(2**62), 2**62)


def _records(spec: RecordSpec) -> st.SearchStrategy[Any]:
    return st.builds(spec.cls, *(_values(f) for f in spec.fields))


def test_every_kind_is_declared_with_distinct_slots() -> None:
    assert {s.kind for s in SPECS.values()} == set(RecordKind) - {
        RecordKind.STRING,
        RecordKind.BLOB,
    }
    for spec in SPECS.values():
        where = [(f.slot, f.part) for f in spec.fields]
        assert len(set(where)) == len(where), spec.name


@pytest.mark.parametrize("spec", KINDS, ids=lambda s: s.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip_through_the_python_packer(spec: RecordSpec, data: st.DataObject) -> None:
    rec = data.draw(_records(spec))
    wire: list[tuple[int, ...]] = []
    getattr(packers(lambda *w: wire.append(w)), spec.name)(
        *(getattr(rec, f.name) for f in spec.fields)
    )
    assert decode(encode(*wire[0])) == rec
    assert decode(pack(rec)) == rec


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled path not built: {accel.WHY_NOT}")
@pytest.mark.parametrize("spec", KINDS, ids=lambda s: s.name)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_compiled_packer_writes_the_same_bytes(
    spec: RecordSpec, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    rec = data.draw(_records(spec))
    path = Path(tmp_path_factory.mktemp("ring")) / "r"
    with accel.use("compiled"), RingWriter.create(path, 16) as writer:
        assert writer.compiled
        packer = writer.hot.packer(int(spec.kind), records.c_layout(spec))
        assert packer(*(getattr(rec, f.name) for f in spec.fields)) is True
        with RingReader.open(path) as reader:
            [raw] = reader.read()
    assert raw == pack(rec)
    assert decode(raw) == rec


@pytest.mark.parametrize("spec", list(SPECS.values()), ids=lambda s: s.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_generated_decoder_and_the_field_by_field_one_agree(
    spec: RecordSpec, data: st.DataObject
) -> None:
    rec = data.draw(_records(spec))
    w = records.RECORD.unpack(pack(rec))
    fast = records._FAST[int(spec.kind)](w)
    assert fast == records._decode_slowly(w) == rec
    # built without __init__: the same types field by field (an IntEnum member, not an int
    # equal to it), and as frozen as one built by the dataclass
    assert [type(getattr(fast, f.name)) for f in spec.fields] == [
        type(getattr(rec, f.name)) for f in spec.fields
    ]
    assert hash(fast) == hash(rec) and repr(fast) == repr(rec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(fast, spec.fields[0].name, 1)


@pytest.mark.parametrize("spec", list(SPECS.values()), ids=lambda s: s.name)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_evolve_is_replace(spec: RecordSpec, data: st.DataObject) -> None:
    """The reader's ``evolve`` (slot by slot, no ``__init__``) builds what
    ``dataclasses.replace`` builds, and refuses what it refuses."""
    rec, other = data.draw(_records(spec)), data.draw(_records(spec))
    names = [f.name for f in spec.fields]
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True))
    changes = {n: getattr(other, n) for n in chosen}
    got = records.evolve(rec, **changes)
    assert got == dataclasses.replace(rec, **changes) and type(got) is type(rec)
    assert [type(getattr(got, n)) for n in names] == [
        type(getattr(dataclasses.replace(rec, **changes), n)) for n in names
    ]
    with pytest.raises(TypeError, match="no field"):
        records.evolve(rec, nope=1)


def test_unknown_kind_and_bad_enum_are_decode_errors() -> None:
    with pytest.raises(records.RecordDecodeError, match="unknown record kind 99"):
        decode(encode(99))
    with pytest.raises(records.RecordDecodeError, match="phase: 200 is not a Phase"):
        decode(encode(RecordKind.SPAN, 200))


def test_a_field_without_a_slot_is_refused() -> None:
    from dataclasses import dataclass

    with pytest.raises(TypeError, match="declare it with at"):

        @records.record(RecordKind.STRING, "nope")
        @dataclass(frozen=True)
        class Nope:
            x: int


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled path not built: {accel.WHY_NOT}")
def test_compiled_packer_refuses_what_does_not_fit() -> None:
    spec = SPECS[RecordKind.BUILD]
    with accel.use("compiled"):
        import mmap

        mm = mmap.mmap(-1, 128 + 16 * 64)
        ring = accel.make_ring(mm, 16)
        assert ring is not None
        packer = ring.packer(int(spec.kind), records.c_layout(spec))
        good = [0] * len(spec.fields)
        with pytest.raises(TypeError, match="takes 16 positional fields"):
            packer(*good[:-1])
        bad = list(good)
        bad[6] = 2**31  # padded_tokens is a 31-bit half
        with pytest.raises(OverflowError, match="does not fit 31 bits"):
            packer(*bad)
        bad = list(good)
        bad[1] = 300  # the tag lives in one byte
        with pytest.raises(ValueError, match=r"not in 0\.\.255"):
            packer(*bad)
        assert ring.written() == 0
        ring.release()
        mm.close()
