"""A columnar table's Arrow batches as checked numpy columns: the step columns as
:func:`probe.reader.recording_columns.iter_step_columns` gives them, a detail table's columns
(:func:`detail_columns`), every value checked vectorised; Arrow arrays read from their
buffers (:func:`numpy_of`). Read from any recording kind's ``batches`` (a columnar file, an
SQLite file, several read as one)."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

from probe.reader.columnar_schema import COUNT_COLUMNS, is_text, names_of
from probe.reader.recording_open import RecordingError
from probe.reader.recording_rows import BAD, NULL
from probe.reader.recording_schema import DETAIL_TABLES
from probe.step import STEP_COLUMNS

# -- the steps as numpy columns -----------------------------------------------------------


def numpy_of(col: Any, null: int | None = None) -> Any:
    """An Arrow integer or boolean array as numpy values read from its buffers: an int64
    array as it lies, a boolean one as bools (``to_numpy``, and ``fill_null`` with a Python
    value, import pandas: half a second of a report's start). A NULL reads as ``null``
    (where None, as what its slot holds)."""
    import numpy as np
    import pyarrow as pa

    t = col.type
    if not len(col):
        out = np.zeros(0, bool if pa.types.is_boolean(t) else np.int64)
    elif pa.types.is_boolean(t):
        out = _bits(col.buffers()[1], col.offset, len(col))
    elif pa.types.is_integer(t):
        kind = np.dtype(f"{'u' if pa.types.is_unsigned_integer(t) else 'i'}{t.bit_width // 8}")
        out = np.frombuffer(col.buffers()[1], kind, len(col), col.offset * kind.itemsize)
    else:
        return col.to_numpy(zero_copy_only=False)
    if null is not None and col.null_count:
        out = np.where(nulls_of(col), null, out)
    return out


def nulls_of(col: Any) -> Any:
    """Per value of an Arrow array: True where it is NULL (read from its validity bitmap:
    ``is_null`` imports Arrow's compute functions, a tenth of a second)."""
    import numpy as np

    valid = col.buffers()[0]
    if valid is None or not col.null_count:
        return np.zeros(len(col), bool)
    return ~_bits(valid, col.offset, len(col))


def _bits(buf: Any, offset: int, n: int) -> Any:
    """``n`` bits of an Arrow bitmap from bit ``offset`` on, as bools."""
    import numpy as np

    bits = np.frombuffer(buf, np.uint8)
    return np.unpackbits(bits, count=offset + n, bitorder="little")[offset:].view(bool)


def text_codes(col: Any, names: tuple[str, ...]) -> Any:
    """A text column as the codes of its names (NULL -1, a name not among them -2): its
    dictionary mapped once (in Python: building an Arrow array from a list imports
    pandas, half a second of a report's start), its indices taken."""
    import numpy as np
    import pyarrow as pa

    if not pa.types.is_dictionary(col.type):
        import pyarrow.compute as pc  # a tenth of a second: only here

        col = pc.dictionary_encode(col)
    code = {n: i for i, n in enumerate(names)}
    lut = np.array([code.get(v, BAD) for v in col.dictionary.to_pylist()] + [NULL], np.int64)
    return lut[numpy_of(col.indices, null=len(lut) - 1)]


def iter_columnar_step_columns(
    rec: Any, pid: int | None, chunk: int, only: Collection[str] | None
) -> Iterator[dict[str, Any]]:
    """The ``steps`` table as :func:`probe.reader.recording_columns.iter_step_columns`
    gives it (int64 columns, text as codes, NULL -1 with the ``_nulls`` bits), from the
    Arrow batches of ``rec`` (a columnar recording, or several recordings read as one);
    of a columnar file, every column with each step's record counts
    (:data:`COUNT_COLUMNS`)."""
    import enum

    import numpy as np

    from probe.reader.recording_rows import NULL_BITS, column_checks

    keep = {"pid", "step", "t0_ns", "t1_ns", *only} if only is not None else None
    columns = [c for c in STEP_COLUMNS if keep is None or c.name in keep]
    names = [c.name for c in columns]
    stored = getattr(rec, "stores_counts", False)  # a compacted file: each step's counts
    counts = list(COUNT_COLUMNS) if keep is None and stored else []
    # the columns a file's statistics show fitting (columnar files): not checked again
    vouched = rec.steps_vouched() if hasattr(rec, "steps_vouched") else frozenset()
    for b in rec.batches("steps", names + counts, pid, size=chunk):
        cols: dict[str, Any] = {}
        nulls = np.zeros(b.num_rows, dtype=np.int64)
        for c in columns:
            a = b.column(c.name)
            if is_text(c.kind):
                codes = text_codes(a, names_of(c))
                if isinstance(c.kind, type) and issubclass(c.kind, enum.Enum):
                    values = np.array([int(m.value) for m in c.kind.__members__.values()])
                    ok = codes >= 0
                    codes[ok] = values[codes[ok]]
                cols[c.name] = codes
                continue
            isnull = nulls_of(a) if a.null_count else None
            # as it lies where it is int64 already
            arr = np.asarray(numpy_of(a, null=0 if c.kind is bool else NULL), dtype=np.int64)
            if isnull is not None:
                if c.kind is bool or not c.nullable:
                    raise RecordingError(
                        f"{rec.path}: damaged recording: steps: {c.name} is NULL "
                        f"(pid {b.column('pid')[int(np.argmax(isnull))]})"
                    )
                nulls |= isnull.astype(np.int64) << NULL_BITS[c.name]
            cols[c.name] = arr
        for n in counts:
            cols[n] = np.asarray(numpy_of(b.column(n)), dtype=np.int64)
        bad = column_checks(cols, nulls, columns, vouched)
        if bad.any():
            i = int(np.argmax(bad))
            why = "t1_ns is before t0_ns"
            if cols["t1_ns"][i] >= cols["t0_ns"][i]:
                c = next(c for c in columns if column_checks(cols, nulls, [c])[i])
                why = f"{c.name} does not fit its column"
            raise RecordingError(
                f"{rec.path}: damaged recording: steps row (pid {cols['pid'][i]}, step "
                f"{cols['step'][i]}): {why}"
            )
        cols["_nulls"] = nulls
        yield cols


def read_ahead(chunks: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """``chunks`` as they are, read by a thread up to ``depth`` ahead of the consumer:
    decoding the next row group (Arrow and numpy release the GIL) overlaps the work on this
    one. An error of the reading is raised here, at the chunk where it happened; a consumer
    that stops early stops the thread."""
    import queue
    import threading

    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for c in chunks:
                if not put(("chunk", c)):
                    return
            put(("end", None))
        except BaseException as exc:  # handed to the consumer, raised there
            put(("error", exc))

    t = threading.Thread(target=run, name="probe-read-ahead", daemon=True)
    t.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        t.join()


def detail_columns(rec: Any, table: str, batch: Any) -> dict[str, Any]:
    """A detail table's batch as int64 numpy columns (an enum its member index, a flag
    0/1), every value checked against its column: a value that does not fit raises the
    :class:`RecordingError` naming the table, the step and the column."""
    import numpy as np
    import pyarrow as pa

    t = next(t for t in DETAIL_TABLES if t.name == table)
    kinds = {c.name: c for c in t.columns}
    out: dict[str, Any] = {}
    pid = numpy_of(batch.column("pid"), null=-1)
    step = numpy_of(batch.column("step"), null=-1)

    def fail(mask: Any, column: str, why: str) -> RecordingError:
        i = int(np.argmax(mask))
        return RecordingError(
            f"{rec.path}: damaged recording: {table} row (pid {pid[i]}, step {step[i]}): "
            f"{column} {why}"
        )

    for name in batch.schema.names:
        col = batch.column(name)
        c = kinds.get(name)
        if name in ("pid", "step"):
            v = numpy_of(col, null=-1)
            if col.null_count or (v < 0).any():
                raise fail(v < 0, name, "is not a step key")
            out[name] = v.astype(np.int64)
        elif c is None or c.kind is str:
            continue  # a builder's name: any text, or missing
        elif is_text(c.kind):
            names = names_of(c)
            idx = text_codes(col, names)
            if (idx < 0).any():
                raise fail(idx < 0, name, f"is not one of {', '.join(names)}")
            out[name] = idx
        else:
            if col.null_count:
                raise fail(nulls_of(col), name, "is NULL")
            v = numpy_of(col).astype(np.int64)
            if c.min is not None and not pa.types.is_boolean(col.type) and (v < c.min).any():
                raise fail(v < c.min, name, f"is below {c.min}")
            out[name] = v
    if "t0_ns" in out and "t1_ns" in out and (out["t1_ns"] < out["t0_ns"]).any():
        raise fail(out["t1_ns"] < out["t0_ns"], "t1", "is before t0")
    return out
