"""Rows of a recording's tables as :class:`~probe.step.Step` objects: every value checked
against its column (type, enum name, range, ``t1`` not before ``t0``), a value that does not
fit a :class:`RecordingError` naming the table, the step and the column. One decoder for
both formats: the SQLite recording's cursor rows and the columnar recording's batches."""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from probe.reader.recording_open import RecordingError
from probe.reader.recording_schema import DETAIL_TABLES, DetailTable
from probe.records import Flag
from probe.step import STEP_COLUMNS, Step


def check_order(rd: Reader, table: str, row: tuple[Any, ...], kw: dict[str, Any]) -> None:
    """A span that ends before it starts is damage, not data."""
    t0, t1 = kw.get("t0"), kw.get("t1")
    if isinstance(t0, int) and isinstance(t1, int) and t1 < t0:
        raise rd.fail(table, row, "t1", f"is {t1}, before t0 {t0}")


class Reader:
    """Turns rows into typed values, refusing any that does not fit its column."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, table: str, row: tuple[Any, ...], column: str, why: str) -> RecordingError:
        return RecordingError(
            f"{self.path}: damaged recording: {table} row (pid {row[0]!r}, step {row[1]!r}): "
            f"{column} {why}"
        )

    def value(
        self,
        table: str,
        row: tuple[Any, ...],
        column: str,
        v: Any,
        kind: Any,
        *,
        nullable: bool = False,
        min: int | None = 0,
        choices: tuple[str, ...] = (),
    ) -> Any:
        if v is None:
            if nullable:
                return None
            raise self.fail(table, row, column, "is NULL")
        if isinstance(kind, Flag) or kind is bool:
            if type(v) is not int or v not in (0, 1):
                raise self.fail(table, row, column, f"is {v!r}, not 0 or 1")
            return bool(v)
        if kind is int:
            if type(v) is not int:
                raise self.fail(table, row, column, f"is {v!r}, not an integer")
            if min is not None and v < min:
                raise self.fail(table, row, column, f"is {v}, below {min}")
            return v
        if kind is str:
            if type(v) is not str:
                raise self.fail(table, row, column, f"is {v!r}, not text")
            if choices and v not in choices:
                raise self.fail(table, row, column, f"is {v!r}, not one of {', '.join(choices)}")
            return v
        member = kind.__members__.get(v.upper()) if type(v) is str else None
        if member is None:
            names = ", ".join(m.lower() for m in kind.__members__)
            raise self.fail(table, row, column, f"is {v!r}, not one of {names}")
        return member


def detail_records(
    path: Path,
    t: DetailTable,
    rows: Iterable[tuple[Any, ...]],
    ids: Mapping[int, Mapping[str, int]],
) -> Iterator[tuple[tuple[int, int], Any]]:
    """Detail table ``t``'s rows (``pid``, ``step``, then its columns) as ((pid, step),
    record); a builder's class name becomes its id in ``ids`` (per pid: name -> id)."""
    rd = Reader(path)
    has_flags = "flags" in {f.name for f in fields(t.record)}
    for row in rows:
        pid = rd.value(t.name, row, "pid", row[0], int)
        step = rd.value(t.name, row, "step", row[1], int)
        kw: dict[str, Any] = {"step": step}
        flags = 0
        for c, v in zip(t.columns, row[2:], strict=True):
            if isinstance(c.kind, Flag):
                flags |= c.kind if rd.value(t.name, row, c.name, v, c.kind) else 0
            elif c.kind is str:  # the builder's name: its id in builder_names()
                name = rd.value(t.name, row, c.name, v, str, nullable=True)
                bid = ids.get(pid, {}).get(name if name is not None else "?")
                if bid is None:
                    raise rd.fail(t.name, row, c.name, f"{name!r} is not a known builder")
                kw[c.attr] = bid
            else:
                kw[c.attr] = rd.value(t.name, row, c.name, v, c.kind, min=c.min)
        if has_flags:
            kw["flags"] = int(flags)
        check_order(rd, t.name, row, kw)
        yield (pid, step), t.record(**kw)


def steps_of_rows(
    path: Path,
    rows: Iterable[tuple[Any, ...]],
    details: Mapping[str, Iterable[tuple[Any, ...]]],
    builder_names: Mapping[int, Mapping[int, str]],
) -> Iterator[Step]:
    """Steps from the ``steps`` rows (:data:`STEP_COLUMNS` order) and each detail table's
    rows, all in (pid, step) order; detail rows of a step not in ``rows`` belong to no
    step. ``builder_names``: per pid, id -> name (:meth:`Recording.builder_names`)."""
    rd = Reader(path)
    ids = {p: {n: i for i, n in names.items()} for p, names in builder_names.items()}
    its = {t.name: detail_records(path, t, details[t.name], ids) for t in DETAIL_TABLES}
    pending: dict[str, tuple[tuple[int, int], Any] | None] = {
        name: next(it, None) for name, it in its.items()
    }
    for row in rows:
        kw: dict[str, Any] = {"phases": {}}
        for c, v in zip(STEP_COLUMNS, row, strict=True):
            val = rd.value(
                "steps", row, c.name, v, c.kind, nullable=c.nullable, min=c.min,
                choices=c.choices,
            )  # fmt: skip
            if c.phase:
                kw["phases"][c.phase] = val
            else:
                kw[c.field] = val
        check_order(rd, "steps", row, kw)
        key = (kw["pid"], kw["step"])
        for t in DETAIL_TABLES:
            got: list[Any] = []
            nxt = pending[t.name]
            while nxt is not None and nxt[0] <= key:
                if nxt[0] == key:  # rows of a step not in steps: not part of any step
                    got.append(nxt[1])
                nxt = next(its[t.name], None)
            pending[t.name] = nxt
            kw[t.step_field] = tuple(got)
        yield Step(**kw)


# -- the checks of step columns (numpy; both formats' column chunks) -----------------------

#: the code of a NULL in an enum or nullable integer column of a chunk
NULL = -1
#: the code of a text value that is none of its column's names: refused
BAD = -2


def nullable_ints() -> list[Any]:
    return [
        c
        for c in STEP_COLUMNS
        if c.nullable and not (c.kind is str or issubclass(c.kind, enum.Enum))
    ]


def column_checks(
    cols: Mapping[str, Any], nulls: Any, columns: Sequence[Any] = STEP_COLUMNS,
    vouched: Collection[str] = (),
) -> Any:  # fmt: skip
    """Per row: True where some value of ``columns`` does not fit its column (numpy, every
    value), less the integer and boolean columns ``vouched`` for (a file's statistics show
    every value of them fitting); ``t1`` before ``t0`` always."""
    import numpy as np

    bad = np.zeros(len(nulls), dtype=bool)
    any_null = bool(nulls.any())
    for c in columns:
        text = c.kind is str or issubclass(c.kind, enum.Enum)
        if c.name in vouched and not text:
            continue
        v = cols[c.name]
        if text:
            bad |= v == BAD
            if not c.nullable:
                bad |= v == NULL
        elif c.kind is bool:
            bad |= (v != 0) & (v != 1)
        elif c.min is not None:
            below = v < c.min
            if any_null and c.nullable:
                below &= (nulls & (1 << NULL_BITS[c.name])) == 0
            bad |= below
    bad |= cols["t1_ns"] < cols["t0_ns"]
    return bad


#: each nullable integer column's bit in a chunk's ``_nulls`` (set: NULL there)
NULL_BITS = {c.name: i for i, c in enumerate(nullable_ints())}
