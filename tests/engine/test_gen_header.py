"""The generated C header (probe/engine/accel/_accel_gen.h) is what
probe.engine.gen_header writes from the declarations, and the compiled extension was
built from it."""

from __future__ import annotations

import re

import pytest

from probe import calls, records, ring
from probe.engine import accel, gen_header


def test_the_committed_header_is_what_the_generator_writes() -> None:
    assert gen_header.HEADER_PATH.read_text() == gen_header.render(), (
        "probe/engine/accel/_accel_gen.h is stale: run python -m probe.engine.gen_header"
    )


def test_check_says_stale_when_the_header_differs(tmp_path, monkeypatch) -> None:
    stale = tmp_path / "_accel_gen.h"
    stale.write_text(gen_header.render().replace("#define KIND_SPAN 1", "#define KIND_SPAN 9"))
    monkeypatch.setattr(gen_header, "HEADER_PATH", stale)
    assert gen_header.main(["--check"]) == 1
    stale.write_text(gen_header.render())
    assert gen_header.main(["--check"]) == 0


def test_every_enum_value_and_slot_offset_is_in_the_header() -> None:
    text = gen_header.render()
    defined = dict(re.findall(r"^#define (\w+) (\S+)$", text, re.M))
    for member in records.RecordKind:
        assert defined[f"KIND_{member.name}"] == str(int(member))
    for member in records.Reason:
        assert defined[f"REASON_{member.name}"] == str(int(member))
    for member in records.Flag:
        if member.name:
            assert defined[f"FLAG_{member.name}"] == str(int(member))
    # the offsets agree with the decoder's struct
    raw = records.RECORD.pack(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
    assert raw[int(defined["OFF_A"])] == 2
    assert raw[int(defined["OFF_STEP"])] == 5
    assert raw[int(defined["OFF_V4"])] == 12
    assert defined["ARG_NEED_EAGER"] == f'"{calls.NEED_EAGER}"'


def test_each_kind_stages_its_fields_at_the_declared_slots() -> None:
    text = gen_header.render()
    body = text[text.index("static inline void put_dispatch") :]
    body = body[: body.index("}\n")]
    assert "p[OFF_A] = (uint8_t)(x->mode);" in body
    assert "((uint64_t)x->max_query_len << 32) | (uint32_t)x->uniform_decode_query_len" in body
    build = text[text.index("static inline void put_build") :]
    assert "(uint32_t)(x->real_tokens + 1)" in build[: build.index("}\n")]  # unknown_as=-1


@pytest.mark.skipif(not accel.COMPILED, reason=f"compiled hot path not in use: {accel.WHY_NOT}")
def test_the_built_extension_carries_the_declaration_it_was_generated_from() -> None:
    import probe.engine.accel._accel as c

    assert gen_header.declaration_digest() == c.DECLARATION
    assert c.HEADER_SIZE == ring.HEADER_SIZE and c.RECORD_SIZE == records.RECORD_SIZE
