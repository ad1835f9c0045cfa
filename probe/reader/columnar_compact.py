"""Compacting a columnar recording: its live Arrow streams, up to the batches its manifest
counts, into sorted Parquet files (DuckDB, out of core, bounded memory), and the manifest
written whole (:func:`write_json`). Used when a writer closes, and to read a recording that
was never closed (into a private folder)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from probe.reader.columnar_schema import (
    COUNT_PARTS,
    LIVE,
    MANIFEST,
    TABLES,
    count_sql,
    live_schema,
)
from probe.reader.recording_open import RecordingError
from probe.step import STEP_COLUMNS

#: how much memory DuckDB may take while compacting (it spills to the recording's folder)
COMPACT_MEMORY = "256MB"
#: rows per Parquet row group of a compacted table
ROW_GROUP_ROWS = 262_144


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as JSON at ``path``, whole or not at all (:func:`probe.reader.output.write_to`:
    written beside, synced, renamed, the folder synced), now: a flush's manifest is never
    held back to the end of a command's other outputs."""
    from probe.reader.output import write_to

    with write_to(path, now=True) as f:
        f.write(json.dumps(obj, default=str, separators=(",", ":")).encode())


def committed_batches(path: Path, table: str, count: int) -> Iterator[Any]:
    """The first ``count`` record batches of a table's live stream (fewer when the stream
    ends sooner: a batch the manifest counts but the file lacks is a damaged recording)."""
    import pyarrow as pa

    f = path / LIVE / f"{table}.arrows"
    if count <= 0:
        return
    try:
        src = pa.memory_map(str(f))
        reader = pa.ipc.open_stream(src)
    except (OSError, pa.ArrowInvalid) as exc:
        raise RecordingError(f"{path}: damaged recording: live stream {table}: {exc}") from None
    if reader.schema != live_schema(table):
        raise RecordingError(f"{path}: damaged recording: live stream {table}: not its schema")
    for i in range(count):
        try:
            yield reader.read_next_batch()
        except (StopIteration, pa.ArrowInvalid, OSError) as exc:
            raise RecordingError(
                f"{path}: damaged recording: live stream {table} ends at batch {i} of {count} "
                f"({exc or 'end of stream'})"
            ) from None


def live_tables(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Each table's committed rows of a live recording, as Arrow tables (memory-mapped)."""
    import pyarrow as pa

    out = {}
    committed = manifest.get("committed") or {}
    for table in (*TABLES, "gpu"):
        batches = list(committed_batches(path, table, int(committed.get(table, 0))))
        out[table] = pa.Table.from_batches(batches, schema=live_schema(table))
    return out


def _duckdb(path: Path) -> Any:
    import duckdb

    con = duckdb.connect()
    tmp = path / ".compact-tmp"
    con.execute(f"SET memory_limit='{COMPACT_MEMORY}'")
    con.execute(f"SET temp_directory='{tmp}'")
    con.execute("SET preserve_insertion_order=true")
    return con


def compact(path: str | Path) -> None:
    """A live recording's streams as sorted Parquet files (zstd), the manifest ``closed``.

    Steps are read in (pid, step) order (sorted out of core where they came interleaved);
    a step recorded twice keeps its last row; each step gets its device timing (the last
    that came for it) and its record counts (:data:`COUNT_COLUMNS`)."""
    p = Path(path)
    manifest = json.loads((p / MANIFEST).read_text())
    tables = live_tables(p, manifest)
    con = _duckdb(p)
    try:
        for name, t in tables.items():
            con.register(f"live_{name}", t)
        con.execute(
            "CREATE VIEW gpu AS SELECT pid, step, arg_max(busy_ns, n) AS busy_ns, "
            "arg_max(idle_before_ns, n) AS idle_before_ns, arg_max(step_ns, n) AS step_ns, "
            "true AS seen FROM (SELECT *, row_number() OVER () AS n FROM live_gpu) GROUP BY 1, 2"
        )
        cols = [c.name for c in STEP_COLUMNS]
        gpu = {"gpu_busy_ns": "busy_ns", "gpu_idle_before_ns": "idle_before_ns",
               "gpu_step_ns": "step_ns"}  # fmt: skip
        sel = ", ".join(
            f"CASE WHEN g.seen THEN g.{gpu[c]} ELSE s.{c} END AS {c}" if c in gpu else f"s.{c}"
            for c in cols
        )
        dedup = (
            "(SELECT * FROM (SELECT *, row_number() OVER () AS n FROM live_steps) "
            "QUALIFY n = max(n) OVER (PARTITION BY pid, step))"
            if not manifest.get("sorted", False)
            else "live_steps"
        )
        con.execute(
            f"CREATE VIEW steps AS SELECT {sel} FROM {dedup} AS s "
            "LEFT JOIN gpu AS g ON g.pid = s.pid AND g.step = s.step"
        )
        for name in TABLES[1:]:
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM live_{name}")
        counts, joins = [], []
        for i, (part, sql) in enumerate(count_sql(false="false").items()):
            names = COUNT_PARTS[part]
            joins.append(
                f"LEFT JOIN ({sql}) AS c{i}(pid, step, {', '.join(names)}) "
                f"ON c{i}.pid = s.pid AND c{i}.step = s.step"
            )
            counts += [f"coalesce(c{i}.{col}, 0)::BIGINT AS {col}" for col in names]
        files: dict[str, str] = {}
        # sorted whatever order the steps came in: the joins do not keep it
        _copy(
            con,
            f"SELECT s.*, {', '.join(counts)} FROM steps AS s {' '.join(joins)} "
            "ORDER BY s.pid, s.step",
            p / "steps.parquet",
        )
        files["steps"] = "steps.parquet"
        for name in TABLES[1:]:
            order = "" if manifest.get("sorted", False) else " ORDER BY pid, step"
            # a stable sort keeps each step's records in the order they were written
            q = (
                f"SELECT * EXCLUDE (n) FROM (SELECT *, row_number() OVER () AS n FROM {name})"
                f" ORDER BY pid, step, n"
                if order
                else f"SELECT * FROM {name}"
            )
            _copy(con, q, p / f"{name}.parquet")
            files[name] = f"{name}.parquet"
        write_processes(manifest, p / "processes.parquet")
        files["processes"] = "processes.parquet"
    finally:
        con.close()
        shutil.rmtree(p / ".compact-tmp", ignore_errors=True)
    manifest.update(state="closed", committed={}, tables=files)
    write_json(p / MANIFEST, manifest)
    shutil.rmtree(p / LIVE, ignore_errors=True)


#: the columns of ``processes.parquet``: each process's place (for SQL over a fleet; the
#: manifest keeps the whole row with its snapshot)
PROCESS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("pid", "int64"), ("host", "string"), ("role", "string"), ("tp_rank", "int64"),
    ("pp_rank", "int64"), ("dp_rank", "int64"), ("vllm_version", "string"),
    ("runner", "string"), ("model", "string"), ("boottime_ns", "int64"),
    ("epoch_ns", "int64"), ("dropped", "int64"),
)  # fmt: skip


def write_processes(manifest: dict[str, Any], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    host = (manifest.get("meta") or {}).get("host")
    rows = [{**r, "host": host} for r in manifest.get("processes", [])]
    cols = {}
    for name, kind in PROCESS_COLUMNS:
        vals = [r.get(name) for r in rows]
        vals = [v if isinstance(v, (int, str)) and not isinstance(v, bool) else None for v in vals]
        if kind == "int64":
            vals = [v if isinstance(v, int) else None for v in vals]
        else:
            vals = [v if isinstance(v, str) else None for v in vals]
        cols[name] = pa.array(vals, type=getattr(pa, kind)())
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(pa.table(cols), tmp, compression="zstd")
    os.replace(tmp, out)


def _copy(con: Any, query: str, out: Path) -> None:
    tmp = out.with_name(out.name + ".tmp")
    con.execute(
        f"COPY ({query}) TO '{tmp}' (FORMAT parquet, COMPRESSION zstd, "
        f"PARQUET_VERSION v2, ROW_GROUP_SIZE {ROW_GROUP_ROWS})"
    )
    os.replace(tmp, out)
