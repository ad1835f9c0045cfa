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
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from probe.reader.recording_open import RecordingError
from probe.reader.recording_rows import detail_records, steps_of_rows
from probe.reader.recording_schema import DETAIL_TABLES, DetailTable
from probe.records import Flag
from probe.step import STEP_COLUMNS, Step, new_step

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


def step_kwargs(checked: Mapping[str, Any]) -> list[dict[str, Any]]:
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
    names = list(out_cols)
    rows = [dict(zip(names, r, strict=True)) for r in zip(*out_cols.values(), strict=True)]
    pnames = list(phase_cols)
    for kw, ph in zip(rows, zip(*phase_cols.values(), strict=True), strict=True):
        kw["phases"] = dict(zip(pnames, ph, strict=True))
    return rows


def _exactly(batches: Iterator[Any], size: int) -> Iterator[Any]:
    """Arrow record batches of ``size`` rows each (the last: what is left), whatever
    rows the batches read come in."""
    import pyarrow as pa

    held: list[Any] = []
    n = 0
    for b in batches:
        while b.num_rows:
            take = min(size - n, b.num_rows)
            held.append(b.slice(0, take))
            n += take
            b = b.slice(take)
            if n == size:
                yield held[0] if len(held) == 1 else pa.concat_batches(held)
                held, n = [], 0
    if held:
        yield held[0] if len(held) == 1 else pa.concat_batches(held)


def _step_batches(
    rec: Any, pid: int | None, size: int, counts: bool = False, exact: bool = False
) -> Iterator[tuple[dict[str, Any], np.ndarray, np.ndarray]]:
    """The ``steps`` table (of ``pid``, or all) ``size`` rows at a time, each batch's values
    checked (a batch that fails is read again by the row decoder, which raises the error
    naming the value): (the checked columns, as
    :func:`probe.reader.columnar_columns.iter_columnar_step_columns` gives them, each row's
    (pid, step) key, and True where a row repeats the step before it). ``counts``: with each
    step's record counts (:data:`probe.reader.columnar_schema.COUNT_COLUMNS`; a columnar file
    stores them). ``exact``: every batch ``size`` rows (the last: what is left)."""
    from probe.reader.columnar_columns import iter_columnar_step_columns, numpy_of
    from probe.reader.columnar_schema import COUNT_COLUMNS

    cols = [c.name for c in STEP_COLUMNS]
    extra = list(COUNT_COLUMNS) if counts else []
    # exact: read in larger batches (fewer Arrow reads), cut to size
    batches = rec.batches("steps", cols + extra, pid, max(size, BATCH) if exact else size)
    for b in _exactly(batches, size) if exact else batches:
        try:
            [checked] = list(iter_columnar_step_columns(_One(rec, b), None, size, cols))
        except RecordingError:
            for _ in steps_of_rows(rec.path, _rows_of(b), {t.name: () for t in DETAIL_TABLES}, {}):
                pass
            raise
        for n in extra:
            checked[n] = np.asarray(numpy_of(b.column(n)), dtype=np.int64)
        keys = _key(checked["pid"], checked["step"])
        # a step twice (an SQLite recording may hold one): its records go with the first
        again = np.zeros(len(keys), bool)
        again[1:] = keys[1:] == keys[:-1]
        yield checked, keys, again


def steps_of_batches(rec: Any, pid: int | None = None, records: bool = True) -> Iterator[Step]:
    """Every step of ``rec`` (of ``pid``, or all), in (pid, step) order, with its detail
    records (``records``; without: none read, each Step's record lists empty), from
    ``rec.batches``; every value checked (module docstring)."""
    names = rec.builder_names(pid) if records else {}
    ids = {p: {n: i for i, n in m.items()} for p, m in names.items()}
    details = [(_Details(rec, t, pid, ids), t) for t in DETAIL_TABLES] if records else []
    for checked, keys, again in _step_batches(rec, pid, STEP_BATCH):
        kws = step_kwargs(checked)
        last = int(keys[-1])
        for d, t in details:
            dk, drecs = d.upto(last)
            lo = np.searchsorted(dk, keys, side="left").tolist()
            hi = np.searchsorted(dk, keys, side="right").tolist()
            for kw, i, j, dup in zip(kws, lo, hi, again.tolist(), strict=True):
                kw[t.step_field] = () if dup else tuple(drecs[i:j])
        for kw in kws:
            yield new_step(**kw)


@dataclass
class StepBatch:
    """A batch of steps as checked columns (:func:`step_batches`): ``steps`` the step
    columns (as :func:`probe.reader.recording_columns.iter_step_columns` gives them, with the
    record counts where the file stores them), ``details`` per detail table asked for its
    rows of these steps in (pid, step) order: ``row`` the step's row in the batch, and the
    table's checked columns (:func:`probe.reader.columnar_columns.detail_columns`; a
    builder's name as stored, ``builder``, a list)."""

    steps: dict[str, np.ndarray]
    details: dict[str, dict[str, Any]]

    def __len__(self) -> int:
        return len(self.steps["pid"])


class _DetailColumns:
    """One detail table's checked columns, a batch at a time, in (pid, step) order;
    :meth:`upto` hands out those up to a key (the columns of :class:`_Details`' records)."""

    def __init__(
        self, rec: Any, t: DetailTable, pid: int | None, ids: Mapping[int, Mapping[str, int]]
    ) -> None:
        self.rec, self.t, self.ids = rec, t, ids
        self.it = rec.batches(t.name, ["pid", "step", *(c.name for c in t.columns)], pid, BATCH)
        self.text = [c.name for c in t.columns if c.kind is str]
        #: the columns :func:`detail_columns` gives (a builder's name apart: ``text``)
        self.names = ["pid", "step", *(c.name for c in t.columns if c.kind is not str)]
        self.parts: list[tuple[np.ndarray, dict[str, Any]]] = []
        self.done = False

    def _more(self) -> None:
        from probe.reader.columnar_columns import detail_columns

        b = next(self.it, None)
        if b is None:
            self.done = True
            return
        try:
            a = detail_columns(self.rec, self.t.name, b)
            for name in self.text:
                a[name] = b.column(name).to_pylist()
                for p, n in zip(a["pid"].tolist(), a[name], strict=True):
                    if (n if n is not None else "?") not in self.ids.get(p, {}):
                        raise RecordingError("an unknown builder")  # named by the row decoder
        except RecordingError:
            for _ in detail_records(self.rec.path, self.t, _rows_of(b), self.ids):
                pass
            raise
        self.parts.append((_key(a["pid"], a["step"]), a))

    def upto(self, last: int) -> tuple[np.ndarray, dict[str, Any]]:
        """The rows of keys up to ``last`` (their keys, their columns), taken out."""
        while not self.done and (not self.parts or self.parts[-1][0][-1] <= last):
            self._more()
        if not self.parts:  # none: every column, empty
            empty: dict[str, Any] = {n: np.zeros(0, np.int64) for n in self.names}
            return np.zeros(0, np.int64), {**empty, **{n: [] for n in self.text}}
        keys = np.concatenate([k for k, _ in self.parts])
        names = list(self.parts[0][1])
        whole = {
            n: (
                [v for _, a in self.parts for v in a[n]]
                if n in self.text
                else np.concatenate([a[n] for _, a in self.parts])
            )
            for n in names
        }
        k = int(np.searchsorted(keys, last, side="right"))
        rest = {n: v[k:] for n, v in whole.items()}
        self.parts = [(keys[k:], rest)] if k < len(keys) else []
        return keys[:k], {n: v[:k] for n, v in whole.items()}


def step_batches(
    rec: Any, pid: int | None, size: int, tables: tuple[str, ...] = (), counts: bool = False
) -> Iterator[StepBatch]:
    """The steps of ``rec`` (of ``pid``, or all) as :class:`StepBatch`\\ es of ``size``
    rows each (the last: what is left), with the detail ``tables`` asked for (a detail
    row of no step in ``steps`` belongs to none; of a step twice, to the first); every
    value checked as
    :func:`steps_of_batches` checks it, a value that does not fit raising its error."""
    names = rec.builder_names(pid) if "builds" in tables else {}
    ids = {p: {n: i for i, n in m.items()} for p, m in names.items()}
    details = [_DetailColumns(rec, t, pid, ids) for t in DETAIL_TABLES if t.name in tables]
    for checked, keys, _ in _step_batches(rec, pid, size, counts, exact=True):
        out: dict[str, dict[str, Any]] = {}
        last = int(keys[-1])
        for d in details:
            dk, cols = d.upto(last)
            at = np.minimum(np.searchsorted(keys, dk, side="left"), len(keys) - 1)
            keep = keys[at] == dk
            if not keep.all():
                at = at[keep]
                cols = {
                    n: ([x for x, k in zip(v, keep.tolist(), strict=True) if k]
                        if isinstance(v, list) else v[keep])
                    for n, v in cols.items()
                }  # fmt: skip
            out[d.t.name] = {"row": at, **cols}
        yield StepBatch(checked, out)


class _One:
    """One steps batch, as :func:`iter_columnar_step_columns` reads a recording."""

    def __init__(self, rec: Any, batch: Any) -> None:
        self.path = rec.path
        self.batch = batch

    def batches(self, table: str, columns: list[str], pid: int | None, size: int) -> Iterator[Any]:
        yield self.batch.select(columns)
