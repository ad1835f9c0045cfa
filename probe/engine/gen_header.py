"""The compiled hot path's one C header, generated from the Python declarations.

``probe/engine/accel/_accel_gen.h`` holds every fact the C code
(``probe/engine/accel/_accel*.h``) shares with Python: the ring header's size and word indices
(:mod:`probe.ring`), the record layout
and one staging function per record kind (:mod:`probe.records`), every enum value, the
GPU timer's points (:mod:`probe.records`) and vLLM's call signatures
(:mod:`probe.calls`). The header is committed, so that a build needs no Python step;
``tests/engine/test_gen_header.py`` fails when it differs from what this module writes.

    python -m probe.engine.gen_header           # rewrite probe/engine/accel/_accel_gen.h
    python -m probe.engine.gen_header --check   # exit 1 when it is stale

The header also carries :func:`declaration_digest` of the records and call declarations;
:mod:`probe.engine.accel` refuses a compiled extension built from another one (a stale build
would write records to the wrong slots), and runs the pure-Python path instead.
"""

from __future__ import annotations

import argparse
import enum
import hashlib
import struct
import sys
from pathlib import Path

from probe import calls, records

HEADER_PATH = Path(__file__).parent / "accel" / "_accel_gen.h"

_ENUMS: tuple[tuple[str, type[enum.IntEnum] | type[enum.IntFlag]], ...] = (
    ("KIND", records.RecordKind),
    ("PHASE", records.Phase),
    ("MODE", records.Mode),
    ("REASON", records.Reason),
    ("RK", records.ReplayKind),
    ("BUILD_TAG", records.BuildTag),
    ("BLOB", records.BlobType),
    ("FLAG", records.Flag),
)

_SMALL_SLOTS = ("a", "b", "c")


def _offsets() -> dict[str, int]:
    """Byte offset of each slot of a record, from the wire format."""
    fmt = records.RECORD_FORMAT
    out = {"kind": 0}
    for i, slot in enumerate(records.SLOTS):
        out[slot] = struct.calcsize(fmt[: i + 2])  # "<" and the kind byte come first
    return out


def _enums() -> list[str]:
    lines = []
    for prefix, cls in _ENUMS:
        lines.append(f"/* {cls.__name__} */")
        for member in cls:
            if member.name is not None:
                lines.append(f"#define {prefix}_{member.name} {int(member)}")
    return lines


def _kind_section(spec: records.RecordSpec) -> list[str]:
    """The record struct of one kind, its staging function and its field indices."""
    name, upper = spec.name, spec.name.upper()
    fields = [f.name for f in spec.fields]
    slot: dict[str, list[str]] = {}
    for f in spec.fields:
        v = f"x->{f.name}" if f.unknown_as is None else f"(x->{f.name} + 1)"
        if f.part == "hi":
            slot.setdefault(f.slot, []).append(f"((uint64_t){v} << 32)")
        elif f.part == "lo":
            slot.setdefault(f.slot, []).append(f"(uint32_t){v}")
        else:
            slot[f.slot] = [v]

    def value(s: str) -> str:
        parts = slot.get(s)
        if not parts:
            return "0"
        if len(parts) == 1 and not parts[0].startswith("((uint64_t)"):
            return parts[0]
        return f"(int64_t)({' | '.join(parts)})"

    sig = ", ".join(fields)
    lines = [
        f"/* {upper}: RT.put.{name}({sig}) */",
        "typedef struct {",
        f"    long long {', '.join(fields)};",
        f"}} rec_{name};",
        f"#define {upper}_FIELDS {len(fields)}",
    ]
    lines += [f"#define {upper}_F_{n.upper()} {i}" for i, n in enumerate(fields)]
    wide = ", ".join(value(s) for s in records.SLOTS[4:])
    lines += [
        f"static inline void put_{name}(uint8_t *p, const rec_{name} *x) {{",
        f"    uint32_t s = (uint32_t)({value('step')});",
        f"    int64_t v[7] = {{{wide}}};",
        f"    p[OFF_KIND] = KIND_{spec.kind.name};",
    ]
    lines += [f"    p[OFF_{s.upper()}] = (uint8_t)({value(s)});" for s in _SMALL_SLOTS]
    lines += [
        "    memcpy(p + OFF_STEP, &s, 4);",
        "    memcpy(p + OFF_T0, v, 56);",
        "}",
        f"#define STAGE_{upper}(ring, ...)"
        f" do {{ put_{name}(ring_slot(ring), &(rec_{name}){{__VA_ARGS__}});"
        " ring_staged(ring); } while (0)",
        "",
    ]
    return lines


def _declared() -> list[str]:
    """The part of the header that follows from the records and call declarations."""
    off = _offsets()
    lines = ["/* the record: 64 bytes, little endian (probe/records.py) */"]
    lines.append(f"#define REC {records.RECORD_SIZE}")
    lines.append(f"#define PAYLOAD_BYTES {records.PAYLOAD_BYTES}")
    lines += [f"#define OFF_{s.upper()} {o}" for s, o in off.items()]
    lines.append("")
    lines += _enums()
    lines.append("")
    lines.append("/* vLLM's call signatures (probe/calls.py) */")
    for i, n in enumerate(calls.V1_DISPATCH):
        lines.append(f"#define V1_DISPATCH_AT_{n.upper()} {i} /* after self */")
    names = sorted({*calls.V1_DISPATCH, *calls.V1_RUNNER_PHASE, *calls.MRV2_DISPATCH})
    lines += [f'#define ARG_{n.upper()} "{n}"' for n in names]
    lines.append(f'#define ARG_NEED_EAGER "{calls.NEED_EAGER}"')
    lines.append("")
    lines.append(
        "/* one staging function per record kind: STAGE_<KIND>(ring, .field = value, ...) */"
    )
    for spec in records.SPECS.values():
        lines += _kind_section(spec)
    return lines


def declaration_digest() -> str:
    """A digest of the records and call declarations, as the header carries it."""
    text = "\n".join(_declared()).encode()
    return hashlib.sha256(text).hexdigest()[:16]


def render() -> str:
    """The header's text."""
    from probe import ring  # here: probe.ring imports probe.engine.accel, which imports this

    ticks = sorted((v, k) for k, v in vars(records).items() if k.startswith("TICK_"))
    lines = [
        "/* probe/engine/accel/_accel_gen.h: GENERATED by",
        " * `python -m probe.engine.gen_header` from probe/records.py, probe/calls.py,",
        " * probe/ring.py. Do not edit; regenerate. */",
        "#ifndef PROBE_ACCEL_GEN_H",
        "#define PROBE_ACCEL_GEN_H",
        "",
        f'#define DECLARATION "{declaration_digest()}"',
        "",
        "/* the ring's header: its size and the 64-bit words the writer uses (probe/ring.py) */",
        f"#define HEADER {ring.HEADER_SIZE}",
        f"#define W_WRITE {ring.W_WRITE}",
        f"#define W_DROPPED {ring.W_DROPPED}",
        f"#define W_READ {ring.W_READ}",
        "",
        "/* the GPU timer's points (probe/records.py) */",
        *(f"#define {k} {v}" for v, k in ticks),
        "",
        *_declared(),
        "#endif",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m probe.engine.gen_header",
        description="Write probe/engine/accel/_accel_gen.h from the Python declarations.",
    )
    ap.add_argument("--check", action="store_true", help="exit 1 when the header is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = HEADER_PATH.read_text() if HEADER_PATH.exists() else ""
        if current != text:
            print(
                f"{HEADER_PATH} is stale: run python -m probe.engine.gen_header",
                file=sys.stderr,
            )
            return 1
        return 0
    HEADER_PATH.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
