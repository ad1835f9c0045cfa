"""A recording set as one SQL dataset: DuckDB views over the Parquet tables of every
recording in it (``probe query``; ``docs/fleet.md``).

Each table of the columnar recording (:data:`TABLE_VIEWS`) is a view over that table's
Parquet file in every recording of the set, with three columns added:

- ``host``: the ``host=`` folder above the recording where its path has one (the agent's
  ``--record-dir`` layout, as DuckDB's and Spark's hive partitioning read it), else the
  host the recording names (``meta`` ``host``);
- ``day``: the ``day=`` folder likewise (a DATE), else the UTC day the recording started;
- ``recording``: the recording's path as the set names it.

Beside them, the convenience views of :data:`VIEWS` (steps by miss reason, each rank's
place and step counts). A SQLite recording in the set is read through a columnar copy in
a temporary folder, removed when the dataset is closed (every command reads both
formats). A recording still being written is read up to its last flush.

    >>> from probe.reader.recording import default_recording
    >>> with open_dataset([default_recording()]) as ds:
    ...     ds.sql("SELECT count(*) FROM steps WHERE mode IS NOT NULL").fetchall()
    [(1298,)]
"""

from __future__ import annotations

import datetime
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from probe.reader.columnar_schema import TABLES
from probe.reader.recording_open import RecordingError, first_line

#: the tables of a recording, each a view of the same name
TABLE_VIEWS: tuple[str, ...] = (*TABLES, "processes")
#: the columns every table view adds to the table's own
ADDED_COLUMNS: dict[str, str] = {
    "host": "the host= folder above the recording, else the host the recording names",
    "day": "the day= folder above the recording (DATE), else the UTC day it started",
    "recording": "the recording's path, as the set names it",
}


@dataclass(frozen=True)
class View:
    """A convenience view: its name, what a row is, and its SQL over the table views."""

    name: str
    doc: str
    sql: str


#: the convenience views, over the table views (the same SQL runs in Spark over views of
#: the same names)
VIEWS: tuple[View, ...] = (
    View(
        "reasons",
        "forward steps (steps with a mode) per host, mode and miss reason: steps, and "
        "share of the host's forward steps",
        """
        SELECT host, mode, reason, count(*) AS steps,
               count(*) / sum(count(*)) OVER (PARTITION BY host) AS share
        FROM steps
        WHERE mode IS NOT NULL
        GROUP BY host, mode, reason
        """,
    ),
    View(
        "ranks",
        "each process per host and pid: role and tp/pp/dp rank, its steps, forward steps "
        "and mean CPU launch overhead (ns, over its forward steps that have one)",
        """
        WITH p AS (
            SELECT host, pid, max(role) AS role, max(tp_rank) AS tp_rank,
                   max(pp_rank) AS pp_rank, max(dp_rank) AS dp_rank
            FROM processes GROUP BY host, pid
        ), s AS (
            SELECT host, pid, count(*) AS steps,
                   count(*) FILTER (WHERE mode IS NOT NULL) AS forward_steps,
                   avg(cpu_launch_overhead_ns) FILTER (WHERE mode IS NOT NULL)
                       AS mean_cpu_launch_overhead_ns
            FROM steps GROUP BY host, pid
        )
        SELECT host, pid, p.role, p.tp_rank, p.pp_rank, p.dp_rank,
               coalesce(s.steps, 0) AS steps, coalesce(s.forward_steps, 0) AS forward_steps,
               s.mean_cpu_launch_overhead_ns
        FROM p FULL JOIN s USING (host, pid)
        """,
    ),
    View(
        "recordings",
        "each recording of the set: its path, host and day",
        "SELECT DISTINCT recording, host, day FROM probe_files",
    ),
)


def partition(path: Path) -> dict[str, str]:
    """The ``key=value`` folders of ``path`` (the nearest wins), values unescaped as the
    hive layout writes them (``%2F`` for ``/``)."""
    out: dict[str, str] = {}
    for part in path.parts[:-1]:
        key, eq, value = part.partition("=")
        if eq and key:
            out[key] = unquote(value)
    return out


def _day(value: str | None, meta: dict[str, Any]) -> datetime.date | None:
    """The ``day=`` value as a date, else the UTC day the recording started."""
    if value is not None:
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            pass
    for key in ("started_epoch_ns", "created_epoch_ns"):
        ns = meta.get(key)
        if isinstance(ns, int) and not isinstance(ns, bool) and ns > 0:
            stamp = datetime.datetime.fromtimestamp(ns // 10**9, tz=datetime.UTC)
            return stamp.date()
    return None


@dataclass(frozen=True)
class Part:
    """One recording of the set: its name, place and Parquet files (table -> path)."""

    recording: str
    host: str | None
    day: datetime.date | None
    files: dict[str, Path]


class Dataset:
    """A recording set's tables as DuckDB views (:func:`open_dataset` opens one).

    ``connection`` is the DuckDB connection holding the views; :meth:`sql` runs a query on
    it. Close the dataset when done: it removes the temporary copies of SQLite recordings.
    """

    def __init__(self, names: Iterable[str | Path]) -> None:
        import duckdb

        from probe.reader.recording_set import expand_paths

        paths = expand_paths(names)
        if not paths:
            raise RecordingError("no recording given")
        self._open: list[Any] = []
        self._tmp: Path | None = None
        try:
            self.parts = [self._part(p) for p in paths]
            self.connection = duckdb.connect()
            try:
                self._views()
            except duckdb.Error as exc:
                raise RecordingError(f"damaged recording in the set: {first_line(exc)}") from None
        except BaseException:
            self.close()
            raise

    def _part(self, path: Path) -> Part:
        from probe.reader.columnar_convert import convert
        from probe.reader.columnar_read import ColumnarRecording
        from probe.reader.columnar_schema import is_columnar

        src = path
        if not is_columnar(path):
            if self._tmp is None:
                self._tmp = Path(tempfile.mkdtemp(prefix="probe-query-"))
            src = self._tmp / f"{len(self._open)}.probe"
            convert(path, src)
        rec = ColumnarRecording.open(src)
        self._open.append(rec)
        processes = rec.manifest["tables"].get("processes")
        base = rec.files["steps"].parent
        if not isinstance(processes, str) or "/" in processes or not (base / processes).is_file():
            raise RecordingError(f"{path}: damaged recording: table processes is missing")
        meta = rec.meta()
        where = partition(path)
        host = where.get("host", meta.get("host"))
        return Part(
            recording=str(path),
            host=None if host is None else str(host),
            day=_day(where.get("day"), meta),
            files={**rec.files, "processes": base / processes},
        )

    def _views(self) -> None:
        import pyarrow as pa

        con = self.connection
        rows = [(str(f.resolve()), p.recording, p.host, p.day) for p in self.parts
                for f in p.files.values()]  # fmt: skip
        files = pa.table(
            {
                "filename": pa.array([r[0] for r in rows], pa.string()),
                "recording": pa.array([r[1] for r in rows], pa.string()),
                "host": pa.array([r[2] for r in rows], pa.string()),
                "day": pa.array([r[3] for r in rows], pa.date32()),
            }
        )
        con.register("probe_files", files)
        for table in TABLE_VIEWS:
            names = ", ".join(_quote(str(p.files[table].resolve())) for p in self.parts)
            # the view's host, day and recording are the set's (processes.parquet has a
            # host of its own: the recording's, which a host= folder above it overrides)
            if table == "processes":
                cols = "t.* EXCLUDE (filename) REPLACE (f.host AS host), f.day, f.recording"
            else:
                cols = "t.* EXCLUDE (filename), f.host, f.day, f.recording"
            con.execute(
                f"CREATE VIEW {table} AS SELECT {cols} FROM read_parquet([{names}], "
                "filename = true, union_by_name = true, hive_partitioning = false) AS t "
                "JOIN probe_files AS f ON f.filename = t.filename"
            )
        for v in VIEWS:
            con.execute(f"CREATE VIEW {v.name} AS {v.sql}")

    def sql(self, query: str) -> Any:
        """``query`` run over the views: a DuckDB relation (read it before closing)."""
        return self.connection.sql(query)

    def describe(self) -> list[tuple[str, str, list[tuple[str, str]]]]:
        """Each view: its name, what it holds, and its columns (name, SQL type)."""
        out = []
        docs = {v.name: v.doc for v in VIEWS}
        for name in (*TABLE_VIEWS, *docs):
            cols = self.connection.execute(f"DESCRIBE {name}").fetchall()
            doc = docs.get(name) or f"the {name} table of every recording, with " + ", ".join(
                ADDED_COLUMNS
            )
            out.append((name, doc, [(str(c[0]), str(c[1])) for c in cols]))
        return out

    def close(self) -> None:
        """Close the connection and the recordings; remove the temporary copies."""
        con = getattr(self, "connection", None)
        if con is not None:
            con.close()
        for rec in self._open:
            rec.close()
        self._open = []
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _quote(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


@contextmanager
def open_dataset(names: Iterable[str | Path]) -> Iterator[Dataset]:
    """The recordings named (a folder, a glob, files: as every command takes them) as one
    :class:`Dataset`, closed on leaving the block."""
    ds = Dataset(names)
    try:
        yield ds
    finally:
        ds.close()
