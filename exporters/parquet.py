"""A recording as Parquet: its tables, typed, hive-partitioned by host and day.

``probe export run.probe.db --parquet DIR`` writes the ``steps`` table, each per-step
detail table (``spans``, ``dispatches``, ``replays``, ``builds``, ``reorders``) and
``processes`` as one Parquet file per table and recording::

    DIR/steps/host=<host>/date=<YYYY-MM-DD>/<recording>-<id>.parquet
    DIR/dispatches/host=<host>/date=<YYYY-MM-DD>/<recording>-<id>.parquet
    ...

``host`` is the recording's ``meta`` host, ``date`` the UTC day it started; ``<id>`` tells
apart two recordings of one name. Many hosts' exports go into one ``DIR`` (or a bucket)
and are read as one table per name by DuckDB, Spark or Trino::

    SELECT host, count(*) FROM read_parquet('DIR/steps/**/*.parquet', hive_partitioning = true)
    GROUP BY host

The columns are the recording's (``docs/recording-schema.md``): INTEGER as ``int64``, TEXT
as ``string``, enum members their lower-case names, flags and booleans 0/1, NULL where the
recording has NULL. Each field's metadata carries ``unit`` (``ns`` for times and
durations, ``0/1`` for flags, ``count`` for counts) and, for an enum, ``values``; the file
metadata carries the recording's schema version and ``meta``. Each table is read as
column batches (:meth:`Recording.batches <probe.reader.recording.Recording.batches>`), every
value checked as :meth:`~probe.reader.recording.Recording.iter_steps` checks it, and written
a row group per batch: memory holds one batch, whatever the recording's length. Needs
``pyarrow`` (``pip install 'vllm-graph-probe[parquet]'``).
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from probe.progress import SILENT, Progress
from probe.reader.columnar_schema import is_text, names_of
from probe.reader.output import path_for
from probe.reader.recording import Recording
from probe.reader.recording_columns import (
    check_detail_tables,
    iter_detail_columns,
    iter_step_columns,
    null_mask,
)
from probe.reader.recording_rows import NULL
from probe.reader.recording_schema import DETAIL_TABLES, SCHEMA_VERSION
from probe.reader.recording_set import RecordingSet
from probe.records import Flag
from probe.step import STEP_COLUMNS

__all__ = ["PROCESS_COLUMNS", "TABLES", "schema", "write"]

BATCH_ROWS = 65_536
"""Rows per row group (and what memory holds of a table at once)."""

PROCESS_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("pid", pa.int64()),
    ("role", pa.string()),
    ("tp_rank", pa.int64()),
    ("pp_rank", pa.int64()),
    ("dp_rank", pa.int64()),
    ("vllm_version", pa.string()),
    ("runner", pa.string()),
    ("model", pa.string()),
    ("boottime_ns", pa.int64()),
    ("epoch_ns", pa.int64()),
    ("perf_counter_ns", pa.int64()),
    ("dropped", pa.int64()),
    ("snapshot", pa.string()),
)
TABLES = ("steps", *(t.name for t in DETAIL_TABLES), "processes")


def _unit(name: str, kind: Any) -> str | None:
    if name.endswith("_ns"):
        return "ns"
    if isinstance(kind, Flag) or kind is bool:
        return "0/1"
    if name in ("pid", "step"):
        return None
    if kind is int:
        return "count"
    return None


def _field(name: str, kind: Any, nullable: bool) -> pa.Field:
    meta: dict[str, str] = {}
    unit = _unit(name, kind)
    if unit:
        meta["unit"] = unit
    text = kind is str or (
        isinstance(kind, type) and issubclass(kind, enum.Enum) and not isinstance(kind, Flag)
    )
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        meta["values"] = ",".join(m.lower() for m in kind.__members__)
    typ = pa.string() if text else pa.int64()
    return pa.field(name, typ, nullable=nullable, metadata=meta or None)


def schema(table: str) -> pa.Schema:
    """The Arrow schema of ``table`` (one of :data:`TABLES`), units in field metadata."""
    if table == "steps":
        fields = [_field(c.name, c.kind, c.nullable) for c in STEP_COLUMNS]
    elif table == "processes":
        fields = [
            pa.field(n, t, metadata={b"unit": b"ns"} if n.endswith("_ns") else None)
            for n, t in PROCESS_COLUMNS
        ]
    else:
        t = next(x for x in DETAIL_TABLES if x.name == table)
        fields = [_field("pid", int, False), _field("step", int, False)]
        fields += [_field(c.name, c.kind, False) for c in t.columns]
    return pa.schema(fields)


def _partition(value: str) -> str:
    """A hive partition value safe as one path component."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", value) or "_"


def _where(rec: Recording) -> tuple[str, str, dict[bytes, bytes]]:
    """(partition folders, file name, file metadata) of one recording."""
    meta = rec.meta()
    host = _partition(str(meta.get("host") or "unknown"))
    started = meta.get("started_epoch_ns") or meta.get("created_epoch_ns")
    day = (
        datetime.datetime.fromtimestamp(int(started) / 1e9, datetime.UTC).date().isoformat()
        if isinstance(started, int)
        else "unknown"
    )
    stem = rec.path.name.removesuffix(".db").removesuffix(".probe")
    ident = hashlib.sha256(
        f"{host}\0{meta.get('created_epoch_ns')}\0{rec.path.resolve()}".encode()
    ).hexdigest()[:8]
    file_meta = {
        b"vllm_graph_probe.schema_version": str(SCHEMA_VERSION).encode(),
        b"vllm_graph_probe.meta": json.dumps(meta, default=str).encode(),
        b"vllm_graph_probe.recording": rec.path.name.encode(),
    }
    return f"host={host}/date={day}", f"{_partition(stem)}-{ident}.parquet", file_meta


def _batch(rows: list[list[Any]], sch: pa.Schema) -> pa.RecordBatch:
    cols = list(zip(*rows, strict=True)) if rows else [() for _ in sch]
    return pa.RecordBatch.from_arrays(
        [pa.array(list(c), type=f.type) for c, f in zip(cols, sch, strict=True)], schema=sch
    )


def _names(kind: Any, codes: Any, names: tuple[str, ...]) -> pa.Array:
    """A text column from its codes in :func:`iter_step_columns` (an enum its member's
    value, a ``choices`` column its index; NULL -1)."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        values = np.array([int(m.value) for m in kind.__members__.values()])
    else:
        values = np.arange(len(names))
    at = np.zeros(int(values.max()) + 1, np.int32)
    at[values] = np.arange(len(values))
    nulls = codes == NULL
    indices = pa.array(at[np.where(nulls, values[0], codes)], mask=nulls if nulls.any() else None)
    return pa.DictionaryArray.from_arrays(indices, pa.array(names)).cast(pa.string())


def _step_batch(cols: dict[str, Any], sch: pa.Schema) -> pa.RecordBatch:
    """A chunk of :func:`iter_step_columns` (checked) as the ``steps`` table's rows."""
    arrays = []
    for c in STEP_COLUMNS:
        v = cols[c.name]
        if is_text(c.kind):
            arrays.append(_names(c.kind, v, names_of(c)))
        else:
            nulls = null_mask(cols, c.name)
            arrays.append(pa.array(v, pa.int64(), mask=nulls if nulls.any() else None))
    return pa.RecordBatch.from_arrays(arrays, schema=sch)


def _detail_batch(batch: pa.RecordBatch, sch: pa.Schema) -> pa.RecordBatch:
    """A detail table's batch (checked) as its Parquet rows: text plain, flags and booleans
    0/1, a build whose builder's name was lost ``?``."""
    arrays = []
    for f in sch:
        a = batch.column(f.name)
        if pa.types.is_dictionary(a.type):
            a = a.cast(pa.string())
        if a.type != f.type:
            a = a.cast(f.type)
        if not f.nullable and a.null_count:
            a = a.fill_null("?")
        arrays.append(a)
    return pa.RecordBatch.from_arrays(arrays, schema=sch)


def _recordings(rec: Recording | RecordingSet) -> Iterator[Recording]:
    if isinstance(rec, RecordingSet):
        yield from rec.recordings
    else:
        yield rec


def write(
    recording: Recording | RecordingSet,
    target: str | os.PathLike[str],
    *,
    progress: Progress = SILENT,
    force: bool = False,
) -> int:
    """Write ``recording`` (several: each file its own partition files) into the folder
    ``target`` (made when missing); returns the number of rows written. A file the export
    would write that exists already raises ``FileExistsError`` unless ``force``."""
    root = Path(target)
    if root.exists() and not root.is_dir():
        raise ValueError(f"{root}: not a folder")
    recs = list(_recordings(recording))
    progress.stage("writing parquet", sum(r.record_count() for r in recs), "records")
    plan = []
    for r in recs:
        part, name, file_meta = _where(r)
        paths = {t: root / t / part / name for t in TABLES}
        for p in paths.values():
            if p.exists() and not force:
                raise FileExistsError(f"{p} exists (use --force to overwrite)")
        plan.append((r, paths, file_meta))
    n = 0
    for r, paths, file_meta in plan:
        n += _write_one(r, paths, file_meta, progress)
    return n


def _write_one(
    rec: Recording, paths: dict[str, Path], file_meta: dict[bytes, bytes], progress: Progress
) -> int:
    for p in paths.values():
        p.parent.mkdir(parents=True, exist_ok=True)
    schemas = {t: schema(t).with_metadata(file_meta) for t in TABLES}
    n = 0
    with (
        path_for(paths["processes"]) as tmp,
        pq.ParquetWriter(tmp, schemas["processes"], compression="zstd") as w,
    ):
        rows = [
            [
                json.dumps(p[c], default=str) if c == "snapshot" and p[c] is not None else p[c]
                for c, _ in PROCESS_COLUMNS
            ]
            for p in rec.processes()
        ]
        w.write_batch(_batch(rows, schemas["processes"]))
        n += len(rows)
    check_detail_tables(rec)
    with _Writers({t: paths[t] for t in TABLES if t != "processes"}, schemas) as writers:
        for cols in iter_step_columns(rec, chunk=BATCH_ROWS):
            writers["steps"].write_batch(_step_batch(cols, schemas["steps"]))
            n += len(cols["pid"])
            progress.advance(len(cols["pid"]))
        for t in DETAIL_TABLES:
            for b, _ in iter_detail_columns(rec, t.name, size=BATCH_ROWS):
                writers[t.name].write_batch(_detail_batch(b, schemas[t.name]))
                n += b.num_rows
                progress.advance(b.num_rows)
    return n


class _Writers(dict[str, Any]):
    """A ParquetWriter per table, each on a temporary file that becomes its path when
    every table is written (:func:`probe.reader.output.path_for`): nothing partial is left."""

    def __init__(self, paths: dict[str, Path], schemas: dict[str, pa.Schema]) -> None:
        super().__init__()
        self.paths = paths
        self.schemas = schemas
        self._stack: Any = None

    def __enter__(self) -> _Writers:
        import contextlib

        self._stack = contextlib.ExitStack()
        try:
            for t, p in self.paths.items():
                tmp = self._stack.enter_context(path_for(p))
                self[t] = self._stack.enter_context(
                    pq.ParquetWriter(tmp, self.schemas[t], compression="zstd")
                )
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.__exit__(*exc)
