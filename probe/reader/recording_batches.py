"""Steps from column batches: :class:`~probe.step.Step` objects built a batch at a time from
checked columns (the per-step API for users, tests and the consumers that walk steps one
by one), for every recording kind that gives :meth:`batches` (a columnar recording, an SQLite
one, several read as one).

Every value is checked vectorised first (:func:`probe.reader.columnar_columns.detail_columns`,
:func:`probe.reader.recording_rows.column_checks` through
:func:`probe.reader.columnar_columns.iter_columnar_step_columns`); a batch that fails is read
again by the row decoder (:mod:`probe.reader.recording_rows`), so the error names the table,
the step, the column and the value exactly as :meth:`Recording.iter_steps` always has.
Detail rows of a step not in ``steps`` belong to no step. Memory: a batch of each table.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any

import numpy as np

from probe.reader.recording_open import RecordingError
from probe.reader.recording_rows import detail_records, steps_of_rows
from probe.reader.recording_schema import DETAIL_TABLES, DetailTable
from probe.records import Flag
from probe.step import STEP_COLUMNS, Step

#: rows of a detail table built into records at a time
BATCH = 2048
#: steps built at a time: their detail records are held until they are handed out, so a
#: reader walking many processes side by side (an export's replay) holds this many steps'
#: records per process (512: a textfile export of 8 processes peaks at 300 MB, not 590)
STEP_BATCH = 512
#: a (pid, step) key as one int64: the pid above this many bits of step number
_STEP_BITS = 40


def _key(pid: np.ndarray, step: np.ndarray) -> np.ndarray:
    if len(step) and (int(step.max()) >> _STEP_BITS or int(pid.max()) >> (63 - _STEP_BITS)):
        raise RecordingError(f"a step number or pid too large to read: {int(step.max())}")
    return (pid.astype(np.int64) << _STEP_BITS) | step.astype(np.int64)


def _rows_of(batch: Any) -> list[tuple[Any, ...]]:
    """A batch's rows as the SQLite cursor gives them (booleans 0/1)."""
    import pyarrow as pa

    cols = []
    for c in batch.columns:
        if pa.types.is_boolean(c.type):
            c = c.cast(pa.int64())
        cols.append(c.to_pylist())
    return list(zip(*cols, strict=True))


def _members(kind: Any) -> list[Any]:
    return list(kind.__members__.values())


class _Details:
    """One detail table's records, a batch at a time, as (keys, records) in (pid, step)
    order; :meth:`upto` hands out those up to a key."""

    def __init__(
        self, rec: Any, t: DetailTable, pid: int | None, ids: Mapping[int, Mapping[str, int]]
    ) -> None:
        self.rec, self.t, self.ids = rec, t, ids
        self.cols = ["pid", "step", *(c.name for c in t.columns)]
        self.it = rec.batches(t.name, self.cols, pid, BATCH)
        self.keys = np.zeros(0, np.int64)
        self.recs: list[Any] = []
        self.done = False
        names = {f.name for f in fields(t.record)}
        self.has_flags = "flags" in names

    def _more(self) -> bool:
        from probe.reader.columnar_columns import detail_columns

        b = next(self.it, None)
        if b is None:
            self.done = True
            return False
        try:
            a = detail_columns(self.rec, self.t.name, b)
            recs = self._records(a, b)
        except RecordingError:
            # the row decoder names the value as it always has
            for _ in detail_records(self.rec.path, self.t, _rows_of(b), self.ids):
                pass
            raise
        self.keys = np.concatenate([self.keys, _key(a["pid"], a["step"])])
        self.recs.extend(recs)
        return True

    def _records(self, a: Mapping[str, Any], b: Any) -> list[Any]:
        t = self.t
        n = b.num_rows
        kw: dict[str, list[Any]] = {"step": a["step"].tolist()}
        flags = np.zeros(n, np.int64)
        pids = a["pid"].tolist()
        for c in t.columns:
            if isinstance(c.kind, Flag):
                flags |= a[c.name] * int(c.kind)
            elif c.kind is str:  # the builder's name: its id in builder_names()
                got = []
                for p, name in zip(pids, b.column(c.name).to_pylist(), strict=True):
                    bid = self.ids.get(p, {}).get(name if name is not None else "?")
                    if bid is None:
                        raise RecordingError("an unknown builder")  # named by the row decoder
                    got.append(bid)
                kw[c.attr] = got
            elif isinstance(c.kind, type) and issubclass(c.kind, enum.Enum):
                m = _members(c.kind)
                kw[c.attr] = [m[i] for i in a[c.name].tolist()]
            else:
                kw[c.attr] = a[c.name].tolist()
        if self.has_flags:
            kw["flags"] = flags.tolist()
        # positional, in the record's field order (a field no column holds: its default)
        args = [
            kw[f.name] if f.name in kw else itertools.repeat(f.default, n)
            for f in fields(t.record)
            if f.init
        ]
        return list(itertools.starmap(t.record, zip(*args, strict=True)))

    def upto(self, last: int) -> tuple[np.ndarray, list[Any]]:
        """The records of keys up to ``last``, taken out of the buffer."""
        while not self.done and (not len(self.keys) or self.keys[-1] <= last):
            self._more()
        n = int(np.searchsorted(self.keys, last, side="right"))
        keys, recs = self.keys[:n], self.recs[:n]
        self.keys, self.recs = self.keys[n:], self.recs[n:]
        return keys, recs


def _step_kwargs(b: Any, checked: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Step fields of each row of a checked steps batch."""
    nulls = checked["_nulls"]
    out_cols: dict[str, list[Any]] = {}
    phase_cols: dict[str, list[Any]] = {}
    from probe.reader.recording_rows import nullable_ints

    nullable = nullable_ints()
    for c in STEP_COLUMNS:
        v = checked[c.name]
        if c.kind is bool:
            vals: list[Any] = (v != 0).tolist()
        elif c.kind is str:
            vals = [c.choices[i] if i >= 0 else None for i in v.tolist()]
        elif issubclass(c.kind, enum.Enum):
            by_value = {int(m.value): m for m in _members(c.kind)}
            vals = [by_value.get(i) if i >= 0 else None for i in v.tolist()]
        else:
            vals = v.tolist()
            if c.nullable and c in nullable:
                bit = nullable.index(c)
                isnull = ((nulls >> bit) & 1).astype(bool)
                if isnull.any():
                    vals = [None if z else x for x, z in zip(vals, isnull.tolist(), strict=True)]
        if c.phase:
            phase_cols[c.phase] = vals
        else:
            out_cols[c.field] = vals
    n = b.num_rows
    names = list(out_cols)
    rows = [dict(zip(names, r, strict=True)) for r in zip(*out_cols.values(), strict=True)]
    pnames = list(phase_cols)
    for kw, ph in zip(rows, zip(*phase_cols.values(), strict=True), strict=True):
        kw["phases"] = dict(zip(pnames, ph, strict=True))
    assert len(rows) == n
    return rows


def steps_of_batches(rec: Any, pid: int | None = None) -> Iterator[Step]:
    """Every step of ``rec`` (of ``pid``, or all), in (pid, step) order, with its detail
    records, from ``rec.batches``; every value checked (module docstring)."""
    from probe.reader.columnar_columns import iter_columnar_step_columns

    names = rec.builder_names(pid)
    ids = {p: {n: i for i, n in m.items()} for p, m in names.items()}
    details = [_Details(rec, t, pid, ids) for t in DETAIL_TABLES]
    cols = [c.name for c in STEP_COLUMNS]
    batches = rec.batches("steps", cols, pid, STEP_BATCH)
    for b in batches:
        try:
            [checked] = list(iter_columnar_step_columns(_One(rec, b), None, STEP_BATCH, cols))
        except RecordingError:
            for _ in steps_of_rows(rec.path, _rows_of(b), {t.name: () for t in DETAIL_TABLES}, {}):
                pass
            raise
        keys = _key(checked["pid"], checked["step"])
        # a step twice (an SQLite recording may hold one): its records go with the first
        again = np.zeros(len(keys), bool)
        again[1:] = keys[1:] == keys[:-1]
        kws = _step_kwargs(b, checked)
        last = int(keys[-1])
        for d, t in zip(details, DETAIL_TABLES, strict=True):
            dk, drecs = d.upto(last)
            lo = np.searchsorted(dk, keys, side="left").tolist()
            hi = np.searchsorted(dk, keys, side="right").tolist()
            for kw, i, j, dup in zip(kws, lo, hi, again.tolist(), strict=True):
                kw[t.step_field] = () if dup else tuple(drecs[i:j])
        for kw in kws:
            yield Step(**kw)


class _One:
    """One steps batch, as :func:`iter_columnar_step_columns` reads a recording."""

    def __init__(self, rec: Any, batch: Any) -> None:
        self.path = rec.path
        self.batch = batch

    def batches(self, table: str, columns: list[str], pid: int | None, size: int) -> Iterator[Any]:
        yield self.batch.select(columns)
