"""The recording's ``steps`` table as validated numpy columns, in chunks: what the
summary's streaming pass reads (:func:`iter_step_columns`). Every value is checked as
:meth:`probe.reader.recording.Recording.iter_steps` checks it, vectorised."""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from probe.reader.recording import Reader, Recording, RecordingError, check_order, damaged_error
from probe.reader.recording_rows import (
    BAD,
    NULL,
    NULL_BITS,
    column_checks,
    detail_records,
    nullable_ints,
)
from probe.reader.sqlite_errors import SQLITE_DAMAGED
from probe.step import STEP_COLUMNS

if TYPE_CHECKING:
    from probe.reader.columnar_read import ColumnarRecording

# -- columnar reading (the summary's streaming pass) -------------------------------------------

#: rows per chunk of :meth:`Recording.iter_step_columns` (bounded memory, numpy-sized work)
STEP_CHUNK_ROWS = 65_536


def _column_sql(c: Any) -> str:
    """How a ``steps`` column is selected for a chunk: integers as stored (NULL as -1,
    told apart by the chunk's null mask), an enum or a text column as its code (the
    member's value; the index in ``choices``), -2 for anything else."""
    q = f'"{c.name}"'
    if c.kind is str:
        names = c.choices
    elif isinstance(c.kind, type) and issubclass(c.kind, enum.Enum):
        names = tuple(m.lower() for m in c.kind.__members__)
    else:
        return f"ifnull({q}, {NULL})" if c.nullable else q
    members = [] if c.kind is str else list(c.kind.__members__.values())  # type: ignore[union-attr]
    codes = range(len(names)) if c.kind is str else [int(m.value) for m in members]
    whens = " ".join(f"WHEN '{n}' THEN {v}" for n, v in zip(names, codes, strict=True))
    null = f"WHEN {q} IS NULL THEN {NULL} " if c.nullable else ""
    inner = f"CASE {q} {whens} ELSE {BAD} END"
    return f"CASE {null}WHEN typeof({q}) != 'text' THEN {BAD} ELSE {inner} END"


def _chunk_sql(where: str, columns: Sequence[Any] = STEP_COLUMNS) -> str:
    cols = [_column_sql(c) for c in columns]
    mask = (
        " | ".join(
            f'(("{c.name}" IS NULL) << {i})' for i, c in enumerate(nullable_ints()) if c in columns
        )
        or "0"
    )
    return f"SELECT {', '.join(cols)}, {mask} FROM steps {where} ORDER BY pid, step"


def null_mask(cols: Mapping[str, Any], name: str) -> Any:
    """Per row of a chunk of :func:`iter_step_columns`: True where the nullable integer
    column ``name`` is NULL (its value there reads -1)."""
    import numpy as np

    i = NULL_BITS.get(name)
    if i is None:
        return np.zeros(len(cols["_nulls"]), dtype=bool)
    return ((cols["_nulls"] >> i) & 1).astype(bool)


def _iter_step_columns(
    rec: Recording, pid: int | None, chunk: int, only: Collection[str] | None
) -> Iterator[dict[str, Any]]:
    from array import array
    from itertools import chain

    import numpy as np

    where, params = ("WHERE pid = ?", (pid,)) if pid is not None else ("", ())
    keep = {"pid", "step", "t0_ns", "t1_ns", *only} if only is not None else None
    columns = [c for c in STEP_COLUMNS if keep is None or c.name in keep]
    names = [c.name for c in columns]
    width = len(names) + 1
    cur = rec.db.cursor()
    cur.row_factory = None
    cur.execute(_chunk_sql(where, columns), params)
    while True:
        rows = cur.fetchmany(chunk)
        if not rows:
            return
        try:
            flat = array("q", chain.from_iterable(rows))
        except (TypeError, OverflowError):
            _refuse(rec, rows, None)
            raise AssertionError("unreachable") from None  # _refuse raises
        a = np.frombuffer(flat, dtype=np.int64).reshape(len(rows), width)
        cols = {n: a[:, i] for i, n in enumerate(names)}
        nulls = a[:, -1]
        bad = column_checks(cols, nulls, columns)
        if bad.any():
            _refuse(rec, rows, int(np.argmax(bad)))
        cols["_nulls"] = nulls
        yield cols


def _refuse(rec: Recording, rows: list[Any], index: int | None) -> None:
    """Raise the :class:`RecordingError` that :meth:`Recording.iter_steps` raises for the
    first row of a chunk with a value that does not fit (``index``: that row, when the
    vectorised checks found it), naming the table, the step and the column."""
    keys = [(r[0], r[1]) for r in (rows if index is None else rows[index : index + 1])]
    rd = Reader(rec.path)
    cols = ", ".join(f'"{c.name}"' for c in STEP_COLUMNS)
    for pid, step in keys:
        raw = rec.db.execute(
            f"SELECT {cols} FROM steps WHERE pid IS ? AND step IS ?", (pid, step)
        ).fetchone()
        if raw is None:
            continue
        raw = tuple(raw)
        kw: dict[str, Any] = {}
        for c, v in zip(STEP_COLUMNS, raw, strict=True):
            kw[c.field] = rd.value(
                "steps", raw, c.name, v, c.kind, nullable=c.nullable, min=c.min, choices=c.choices
            )
        check_order(rd, "steps", raw, kw)
    raise RecordingError(f"{rec.path}: damaged recording: steps: a value does not fit its column")


def iter_step_columns(
    rec: Any,
    pid: int | None = None,
    chunk: int = STEP_CHUNK_ROWS,
    only: Collection[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """The ``steps`` table (of ``pid``, or all) in (pid, step) order, ``chunk`` rows at a
    time, as numpy ``int64`` columns named as the table's: integers as stored, booleans
    0/1, an enum column its member's value (``mode``: :class:`~probe.records.Mode`), the
    ``runner`` its index in the column's choices, NULL as -1 (``_nulls``: a bit per
    nullable integer column, in table order, set where it is NULL).

    Every value is checked as :meth:`Recording.iter_steps` checks it (type, enum name,
    range, ``t1`` not before ``t0``), vectorised; a value that does not fit raises the
    same :class:`RecordingError`. Memory is one chunk, whatever the recording's size.
    ``only``: the columns to read (with ``pid``, ``step``, ``t0_ns`` and ``t1_ns``), the
    others neither read nor checked.
    """
    from probe.reader.columnar_read import (
        ColumnarRecording,
        iter_columnar_step_columns,
        read_ahead,
    )

    if isinstance(rec, ColumnarRecording) or not isinstance(rec, Recording):
        # a columnar file, or several files read as one (their Arrow batches), read ahead
        # by a thread where no SQLite connection is involved (one is its thread's)
        cols = iter_columnar_step_columns(rec, pid, chunk, only)
        files = getattr(rec, "recordings", [rec])
        yield from (
            read_ahead(cols) if all(isinstance(r, ColumnarRecording) for r in files) else cols
        )
        return
    try:
        yield from _iter_step_columns(rec, pid, chunk, only)
    except SQLITE_DAMAGED as exc:
        raise damaged_error(rec.path, exc) from None


def iter_aggregate(rec: Recording, sql: str, fetch: int = 16_384) -> Iterator[list[Any]]:
    """The rows of ``sql`` (an aggregate over the recording's tables), ``fetch`` at a
    time; what SQLite raises on a damaged file is a :class:`RecordingError`."""
    try:
        cur = rec.db.cursor()
        cur.row_factory = None
        cur.execute(sql)
        while rows := cur.fetchmany(fetch):
            yield rows
    except SQLITE_DAMAGED as exc:
        raise damaged_error(rec.path, exc) from None


def _detail_check_sql(t: Any) -> str:
    """A condition true for a row of detail table ``t`` with a value that does not fit
    its column (what :meth:`Recording.iter_steps` refuses), in SQL."""
    from probe.records import Flag

    bad = ["typeof(pid) != 'integer'", "typeof(step) != 'integer'", "pid < 0", "step < 0"]
    for c in t.columns:
        q = f'"{c.name}"'
        if isinstance(c.kind, Flag) or c.kind is bool:
            bad.append(f"typeof({q}) != 'integer' OR {q} NOT IN (0, 1)")
        elif c.kind is str:
            bad.append(f"({q} IS NOT NULL AND typeof({q}) != 'text')")
        elif isinstance(c.kind, type) and issubclass(c.kind, enum.Enum):
            # a CASE of equalities: true for NULL, a number, a blob and any other text,
            # as ``typeof(x) != 'text' OR x NOT IN (...)``, at half its cost
            whens = " ".join(f"WHEN '{m.lower()}' THEN 0" for m in c.kind.__members__)
            bad.append(f"CASE {q} {whens} ELSE 1 END")
        else:
            low = f" OR {q} < {c.min}" if c.min is not None else ""
            bad.append(f"typeof({q}) != 'integer'{low}")
    bad.append("t1_ns < t0_ns")
    return " OR ".join(f"({b})" for b in bad)


def check_detail_tables(rec: Recording | ColumnarRecording) -> None:
    """Every value of the detail tables (spans, dispatches, replays, builds, reorders)
    checked in one SQLite scan per table; the first that does not fit raises the
    :class:`RecordingError` :meth:`Recording.iter_steps` raises for it. Rows of a step
    that is not in ``steps`` belong to no step, as there."""
    from probe.reader.columnar_read import ColumnarRecording
    from probe.reader.recording_schema import DETAIL_TABLES

    if isinstance(rec, ColumnarRecording):
        return  # types are the file's schema; what the summary reads is checked as it reads
    try:
        for t in DETAIL_TABLES:
            row = rec.db.execute(
                f"SELECT pid, step FROM {t.name} AS d WHERE ({_detail_check_sql(t)}) AND EXISTS "
                "(SELECT 1 FROM steps AS s WHERE s.pid = d.pid AND s.step = d.step) LIMIT 1"
            ).fetchone()
            if row is None:
                continue
            ids = {p: {n: i for i, n in names.items()} for p, names in rec.builder_names().items()}
            rows = rec._detail_rows(t, "WHERE pid IS ? AND step IS ?", tuple(row))
            for _ in detail_records(rec.path, t, rows, ids):
                pass
            raise RecordingError(f"{rec.path}: damaged recording: {t.name}: a value does not fit")
    except SQLITE_DAMAGED as exc:
        raise damaged_error(rec.path, exc) from None


def iter_detail_columns(
    rec: Any,
    table: str,
    columns: Sequence[str] | None = None,
    pid: int | None = None,
    size: int = STEP_CHUNK_ROWS,
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Detail table ``table``'s rows that belong to a step (of ``pid``, or all), in (pid,
    step) order, at most ``size`` at a time: each Arrow batch (of ``columns``, with ``pid``
    and ``step``; all without) and its columns checked by
    :func:`probe.reader.columnar_read.detail_columns`, on every recording kind.

    As :meth:`Recording.iter_steps`, rows of a step that is not in ``steps`` are left out:
    the ``steps`` table's keys are read beside the rows, a batch at a time (memory is a
    batch of each, whatever the recording's length). A flag of an SQLite file reads as
    any non-zero number: :func:`check_detail_tables` checks those values first.
    """
    from probe.reader.columnar_read import detail_columns

    want = None
    if columns is not None:
        want = ["pid", "step", *(c for c in columns if c not in ("pid", "step"))]
    keys = _StepKeys(rec.batches("steps", ["pid", "step"], pid, size))
    for b in rec.batches(table, want, pid, size):
        keep = keys.belong(_keys_of(b, "pid"), _keys_of(b, "step"))
        if not keep.all():
            if not keep.any():
                continue
            b = b.filter(keep)
        yield b, detail_columns(rec, table, b)


def _keys_of(batch: Any, name: str) -> Any:
    """A key column of a batch as int64 numpy (a NULL -1: no step has it)."""
    import numpy as np

    col = batch.column(name)
    if col.null_count:
        col = col.fill_null(-1)
    return col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


class _StepKeys:
    """The ``steps`` table's (pid, step) keys, read a batch at a time as rows of another
    table in the same order ask for them: which of those rows belong to a step."""

    def __init__(self, batches: Iterator[Any]) -> None:
        import numpy as np

        self._batches = batches
        self._pid = self._step = np.empty(0, np.int64)

    def _next(self) -> bool:
        for b in self._batches:
            if b.num_rows:
                self._pid, self._step = _keys_of(b, "pid"), _keys_of(b, "step")
                return True
        return False

    def belong(self, pid: Any, step: Any) -> Any:
        """Per row of sorted (``pid``, ``step``) keys following the previous call's: True
        where ``steps`` holds its key."""
        import numpy as np

        out = np.zeros(len(pid), dtype=bool)
        i = 0
        while i < len(pid):
            # the keys held end before row i: the next batch of them
            while not self._pid.size or (self._pid[-1], self._step[-1]) < (pid[i], step[i]):
                if not self._next():
                    return out
            last_pid, last_step = self._pid[-1], self._step[-1]
            lo = i + int(np.searchsorted(pid[i:], last_pid, "left"))
            hi = i + int(np.searchsorted(pid[i:], last_pid, "right"))
            j = lo + int(np.searchsorted(step[lo:hi], last_step, "right"))  # rows up to there
            for p in np.unique(pid[i:j]).tolist():
                a = i + int(np.searchsorted(pid[i:j], p, "left"))
                b = i + int(np.searchsorted(pid[i:j], p, "right"))
                ka, kb = (
                    np.searchsorted(self._pid, p, "left"),
                    np.searchsorted(self._pid, p, "right"),
                )
                out[a:b] = np.isin(step[a:b], self._step[ka:kb])
            i = j
        return out
