"""Reading a columnar recording (``NAME.probe/``): :class:`ColumnarRecording`, with the
reading methods of :class:`probe.reader.recording.Recording`, and its tables as validated
numpy column chunks (what the summary's streaming pass reads).

A recording still being written, or left by a killed reader, is read up to its last
flush: its live streams are compacted into a private temporary folder (removed on close),
nothing is written beside it.

    >>> import tempfile, pathlib
    >>> from probe.reader.columnar_convert import convert
    >>> from probe.reader.recording import default_recording
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "run.probe"
    >>> _ = convert(default_recording(), out)
    >>> rec = ColumnarRecording.open(out)
    >>> next(rec.iter_steps()).runner
    'mrv2'
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

# the checked columns of a batch (re-exported: callers import them here)
from probe.reader.columnar_columns import detail_columns as detail_columns
from probe.reader.columnar_columns import (
    iter_columnar_step_columns as iter_columnar_step_columns,
)
from probe.reader.columnar_columns import nulls_of as nulls_of
from probe.reader.columnar_columns import numpy_of as numpy_of
from probe.reader.columnar_columns import read_ahead as read_ahead
from probe.reader.columnar_columns import text_codes as text_codes
from probe.reader.columnar_schema import (
    FORMAT,
    LIVE,
    MANIFEST,
    READ_FORMAT_VERSIONS,
    TABLES,
    detail_schema,
    is_text,
)
from probe.reader.recording_meta import META_TYPES, meta_ok, snapshot_of
from probe.reader.recording_open import RecordingError, first_line
from probe.reader.recording_schema import DETAIL_TABLES
from probe.step import STEP_COLUMNS, Step

#: how much memory DuckDB may take for a recording's aggregates (it spills beyond, into a
#: private temporary folder)
SQL_MEMORY = "256MB"
#: the most threads DuckDB takes for them
SQL_THREADS = 4
#: the ``processes`` row's keys, in the SQLite table's column order
PROCESS_KEYS: tuple[str, ...] = (
    "pid", "role", "tp_rank", "pp_rank", "dp_rank", "vllm_version", "runner", "model",
    "boottime_ns", "epoch_ns", "perf_counter_ns", "dropped", "snapshot",
)  # fmt: skip


def read_manifest(p: Path) -> dict[str, Any]:
    """The manifest of the recording folder ``p``, checked: its format and version."""
    try:
        raw = (p / MANIFEST).read_bytes()
    except OSError as exc:
        raise RecordingError(f"{p}: cannot read its manifest ({exc.strerror})") from None
    try:
        m = json.loads(raw)
    except (ValueError, RecursionError):
        raise RecordingError(f"{p}: damaged recording: {MANIFEST} is not JSON") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise RecordingError(f"{p}: not a probe recording ({MANIFEST} names another format)")
    v = m.get("format_version")
    if v not in READ_FORMAT_VERSIONS:
        read = " and ".join(str(x) for x in READ_FORMAT_VERSIONS)
        raise RecordingError(f"{p}: recording format version {v!r}; this probe reads {read}")
    for key, kind in (("meta", dict), ("processes", list), ("faults", list),
                      ("outside", list), ("anomalies", list), ("tables", dict)):  # fmt: skip
        if not isinstance(m.get(key, kind()), kind):
            raise RecordingError(f"{p}: damaged recording: {MANIFEST}: {key} is not a {kind}")
    return m


@dataclass
class ColumnarRecording:
    """A columnar recording opened for reading (validated as it is read)."""

    path: Path
    manifest: dict[str, Any]
    #: per table, its Parquet file
    files: dict[str, Path]
    _tmp: Path | None = field(default=None, repr=False)
    _parquet: dict[str, Any] = field(default_factory=dict, repr=False)
    _sql: Any = field(default=None, repr=False)
    _sql_tmp: Path | None = field(default=None, repr=False)
    _vouched: frozenset[str] | None = field(default=None, repr=False)
    #: its ``steps`` table stores each step's record counts (:data:`COUNT_COLUMNS`)
    stores_counts: ClassVar[bool] = True

    @classmethod
    def open(cls, path: str | Path) -> ColumnarRecording:
        """The recording at ``path``. One still being written is read whole up to its
        last flush, compacted into a private temporary folder (nothing is written beside
        it); one its writer closes while it is being read so (the live streams compacted
        and removed under the reader) is read again, closed."""
        p = Path(path)
        m = read_manifest(p)
        tmp = None
        if m.get("state") != "closed":
            try:
                m, tmp = _compact_live(p, m)
            except (RecordingError, OSError):
                m = read_manifest(p)
                if m.get("state") != "closed":
                    raise
                tmp = None  # closed meanwhile: read as it now is
        base = tmp or p
        files = {}
        for t in TABLES:
            name = m["tables"].get(t)
            if not isinstance(name, str) or "/" in name or not (base / name).is_file():
                if tmp:
                    shutil.rmtree(tmp, ignore_errors=True)
                raise RecordingError(f"{p}: damaged recording: table {t} is missing")
            files[t] = base / name
        return cls(p, m, files, tmp)

    # -- the small tables (the manifest) --------------------------------------------------

    def meta(self) -> dict[str, Any]:
        out = dict(self.manifest.get("meta") or {})
        for key, want in META_TYPES.items():
            value = out.get(key)
            if value is not None and not meta_ok(value, want):
                raise RecordingError(f"{self.path}: meta, key {key!r}: {value!r:.40} is not {want}")
        return out

    def processes(self) -> list[dict[str, Any]]:
        rows = []
        for r in self.manifest.get("processes", []):
            if not isinstance(r, dict) or type(r.get("pid")) is not int:
                raise RecordingError(f"{self.path}: damaged recording: a process without a pid")
            row = {k: r.get(k, 0 if k == "dropped" else None) for k in PROCESS_KEYS}
            row["snapshot"] = snapshot_of(self.path, row) if row.get("snapshot") else None
            rows.append(row)
        return sorted(rows, key=lambda r: r["pid"])

    def faults(self) -> list[dict[str, Any]]:
        return [dict(f) for f in self.manifest.get("faults", [])]

    def outside(self) -> list[dict[str, Any]]:
        return [dict(o) for o in self.manifest.get("outside", [])]

    def anomalies(self) -> list[str]:
        return [str(a.get("message")) for a in self.manifest.get("anomalies", [])]

    # -- the tables -----------------------------------------------------------------------

    def parquet(self, table: str) -> Any:
        """The table's Parquet file (opened once; page checksums verified)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if table not in self._parquet:
            try:
                f = pq.ParquetFile(str(self.files[table]))
                text = [x.name for x in f.schema_arrow if pa.types.is_string(x.type)]
                # read as dictionaries where every page is (a delta-encoded text page
                # cannot be decoded into one)
                md = f.metadata
                for g in range(md.num_row_groups):
                    rg = md.row_group(g)
                    for i in range(rg.num_columns):
                        col = rg.column(i)
                        if any(e.startswith("DELTA") for e in col.encodings):
                            name = col.path_in_schema
                            text = [t for t in text if t != name]
                # pages read as they are decoded (not a row group buffered whole):
                # memory is a chunk's columns, not a row group's; each column reader
                # buffers 64 KiB (1 MiB each: 50 MB more for a report over 8 ranks)
                self._parquet[table] = pq.ParquetFile(
                    str(self.files[table]), page_checksum_verification=True,
                    read_dictionary=text, pre_buffer=False, buffer_size=1 << 16,
                )  # fmt: skip
            except (OSError, pa.ArrowException) as exc:
                raise RecordingError(f"{self.path}: damaged recording: {table}: {exc}") from None
        return self._parquet[table]

    def row_groups(self, table: str, pid: int | None) -> list[int]:
        """The table's row groups that may hold ``pid``'s rows (all without one)."""
        f = self.parquet(table)
        n = f.metadata.num_row_groups
        if pid is None:
            return list(range(n))
        out = []
        for i in range(n):
            st = f.metadata.row_group(i).column(0).statistics
            if st is None or not st.has_min_max or st.min <= pid <= st.max:
                out.append(i)
        return out

    def batches(
        self, table: str, columns: list[str] | None = None, pid: int | None = None,
        size: int = 65_536,
    ) -> Iterator[Any]:  # fmt: skip
        """The table's rows (of ``pid``) in (pid, step) order, as Arrow record batches."""
        import numpy as np
        import pyarrow as pa

        f = self.parquet(table)
        groups = self.row_groups(table, pid)
        if not groups:
            return
        # one process's rows are found by their pid, read whether asked for or not
        want = columns if columns is None or pid is None or "pid" in columns else ["pid", *columns]
        try:
            for b in f.iter_batches(
                batch_size=size, row_groups=groups, columns=want, use_threads=False
            ):
                if pid is not None:
                    at = np.flatnonzero(numpy_of(b.column("pid"), null=-1) == pid)
                    if not len(at):
                        continue
                    if at[-1] - at[0] + 1 == len(at):  # a run, as a sorted table holds it
                        b = b.slice(int(at[0]), len(at))
                    else:
                        import pyarrow.compute as pc  # a tenth of a second: only here

                        b = b.filter(pc.equal(b.column("pid"), pid))
                yield b if want is columns else b.select(columns)
        except (OSError, pa.ArrowException) as exc:
            raise RecordingError(f"{self.path}: damaged recording: {table}: {exc}") from None

    def sql(self, query: str) -> list[tuple[Any, ...]]:
        """The rows of ``query``, DuckDB SQL over the recording's tables (each a view of its
        name; :data:`SQL_MEMORY`, :data:`SQL_THREADS`); what DuckDB raises on a damaged
        file is a :class:`RecordingError`."""
        import duckdb

        try:
            if self._sql is None:
                self._sql_tmp = Path(tempfile.mkdtemp(prefix="probe-sql-"))
                self._sql = duckdb.connect(
                    config={
                        "threads": min(SQL_THREADS, os.cpu_count() or 1),
                        "memory_limit": SQL_MEMORY,
                        "temp_directory": str(self._sql_tmp),
                    }
                )
                self._sql.execute("SET enable_progress_bar = false")  # a command prints no bar
                for t, f in self.files.items():
                    path = str(f.resolve()).replace("'", "''")
                    self._sql.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{path}')")
            rows: list[tuple[Any, ...]] = self._sql.execute(query).fetchall()
        except duckdb.Error as exc:
            raise RecordingError(f"{self.path}: damaged recording: {first_line(exc)}") from None
        return rows

    def statistics_fit(self, table: str, columns: Sequence[str]) -> bool:
        """Whether the file's statistics show every value of ``columns`` of detail table
        ``table`` fitting its column as :func:`detail_columns` checks it, short of what
        statistics cannot show (a text column's names, ``t1`` before ``t0``): stored with
        its type, never NULL, never below its minimum. False where they cannot tell."""
        import pyarrow as pa

        f = self.parquet(table)
        want = detail_schema(table)
        kinds = {c.name: c for t in DETAIL_TABLES if t.name == table for c in t.columns}
        at: dict[str, tuple[int, int | None]] = {}
        for name in columns:
            c = kinds.get(name)
            if c is not None and is_text(c.kind):
                continue
            i = f.schema_arrow.get_field_index(name)
            if i < 0 or f.schema_arrow.field(i).type != want.field(name).type:
                return False
            low = 0 if c is None else c.min
            at[name] = (i, None if pa.types.is_boolean(want.field(name).type) else low)
        md = f.metadata
        return all(
            _fits(md.row_group(g), i, False, low, None)
            for g in range(md.num_row_groups)
            for i, low in at.values()
        )

    def steps_vouched(self) -> frozenset[str]:
        """The integer and boolean step columns whose every value the file's statistics
        show fitting its column as :func:`probe.reader.recording_rows.column_checks` checks
        it (every row group: a boolean stored as one; an integer never below its minimum, a
        column that may not be NULL never NULL): their values need no check of their own.
        Text columns and ``t1`` before ``t0`` are always checked. Computed once."""
        if self._vouched is None:
            self._vouched = frozenset(_vouched(self.parquet("steps")))
        return self._vouched

    def builder_names(self, pid: int | None = None) -> dict[int, dict[int, str]]:
        """Per pid, the id of each builder class name in :attr:`Step.builds`, in the order
        the names first appear (as :meth:`Recording.builder_names`)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        out: dict[int, dict[int, str]] = {}
        for b in self.batches("builds", ["pid", "builder"], pid):
            names = b.column(1)
            if not pa.types.is_dictionary(names.type):
                names = pc.dictionary_encode(names)
            text = [*names.dictionary.to_pylist(), None]
            idx = names.indices.fill_null(len(text) - 1).to_numpy(zero_copy_only=False)
            pids = b.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
            # each (pid, name) once, in the order of its first row
            _, first = np.unique(pids * len(text) + idx, return_index=True)
            first.sort()
            for p, i in zip(pids[first].tolist(), idx[first].tolist(), strict=True):
                seen = out.setdefault(p, {})
                shown = text[i] if isinstance(text[i], str) else "?"
                if shown not in seen.values():
                    seen[len(seen) + 1] = shown
        return out

    def step_counts(self) -> dict[int, int]:
        import numpy as np

        out: dict[int, int] = {}
        for b in self.batches("steps", ["pid"]):
            pids, n = np.unique(numpy_of(b.column(0)), return_counts=True)
            for p, k in zip(pids.tolist(), n.tolist(), strict=True):
                out[p] = out.get(p, 0) + k
        return out

    def record_count(self) -> int:
        return sum(self.parquet(t).metadata.num_rows for t in TABLES)

    def first_t0(self) -> int | None:
        """The earliest step's start (None without steps): the row groups' statistics,
        their column read only where a row group has none."""
        f = self.parquet("steps")
        at = f.schema_arrow.get_field_index("t0_ns")
        lo = None
        for i in range(f.metadata.num_row_groups):
            st = f.metadata.row_group(i).column(at).statistics
            if st is not None and st.has_min_max:
                m = st.min
            else:
                import pyarrow.compute as pc  # a tenth of a second: only here

                m = pc.min(f.read_row_group(i, columns=["t0_ns"]).column(0)).as_py()
            if m is not None and (lo is None or m < lo):
                lo = m
        return lo

    def iter_steps(self, pid: int | None = None) -> Iterator[Step]:
        """Every step (of ``pid``, or all), in (pid, step) order, with its detail records;
        every value checked as :meth:`Recording.iter_steps` checks it."""
        from probe.reader.recording_batches import steps_of_batches

        yield from steps_of_batches(self, pid)

    def close(self) -> None:
        self._parquet.clear()
        if self._sql is not None:
            self._sql.close()
            self._sql = None
        if self._sql_tmp is not None:
            shutil.rmtree(self._sql_tmp, ignore_errors=True)
            self._sql_tmp = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def _compact_live(p: Path, m: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """A live recording's flushed batches compacted into a private temporary folder
    (linked, not copied); its manifest and the folder."""
    from probe.reader.columnar_compact import compact, write_json

    tmp = Path(tempfile.mkdtemp(prefix="probe-read-"))
    try:
        (tmp / LIVE).mkdir()
        for t in (*TABLES, "gpu"):
            src = p / LIVE / f"{t}.arrows"
            if src.is_file():
                (tmp / LIVE / src.name).symlink_to(src.resolve())
        write_json(tmp / MANIFEST, m)
        try:
            compact(tmp)
        except RecordingError as exc:  # named by the recording, not the private folder
            raise RecordingError(str(exc).replace(str(tmp), str(p))) from None
        return read_manifest(tmp), tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _vouched(f: Any) -> Iterator[str]:
    """The names :meth:`ColumnarRecording.steps_vouched` gives, of the ``steps`` file ``f``."""
    import pyarrow as pa

    md = f.metadata
    for c in STEP_COLUMNS:
        i = f.schema_arrow.get_field_index(c.name)
        if i < 0 or is_text(c.kind) or (c.kind is not bool and c.min is None):
            continue  # text: always checked; no minimum: nothing to check
        t = f.schema_arrow.field(i).type
        if pa.types.is_boolean(t):
            low, high = None, None  # stored as one: every value fits
        elif pa.types.is_integer(t):
            low, high = (0, 1) if c.kind is bool else (c.min, None)
        else:
            continue
        if all(_fits(md.row_group(g), i, c.nullable, low, high) for g in range(md.num_row_groups)):
            yield c.name


def _fits(rg: Any, i: int, nullable: bool, low: int | None, high: int | None) -> bool:
    """Whether row group ``rg``'s statistics of column ``i`` show every value in
    [``low``, ``high``] (None: no bound), and no NULL unless ``nullable``."""
    st = rg.column(i).statistics
    if st is None or not st.has_null_count or (st.null_count and not nullable):
        return False
    if st.null_count == rg.num_rows or (low is None and high is None):
        return True
    if not st.has_min_max:
        return False
    return (low is None or st.min >= low) and (high is None or st.max <= high)
