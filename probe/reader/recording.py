"""The recording file: one SQLite database per session (schema version 2; version 1 reads).

Queryable with standard tools (``sqlite3``, pandas, DuckDB) and crash-safe: it is written
in WAL mode by the reader process and committed every half second, so a crash of either
the engine or the reader loses at most the last moments. ``docs/recording-schema.md``
documents every table and column.

    $ sqlite3 run.probe.db "select mode, reason, count(*) from steps group by 1, 2"

Tables: ``meta`` (key/value: schema version, command, clock pair, ...), ``processes``
(one row per vLLM process with its static snapshot), ``steps`` (one row per engine step
and rank), and per-step detail: ``spans``, ``dispatches``, ``replays``, ``builds``,
``reorders``, ``faults``, ``strings``. Times are CLOCK_BOOTTIME ns; durations ns.
"""

from __future__ import annotations

import contextlib
import enum
import json
import operator
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.reader.recording_meta import META_TYPES as META_TYPES
from probe.reader.recording_meta import SNAPSHOT_SHAPE as SNAPSHOT_SHAPE
from probe.reader.recording_meta import meta_ok, snapshot_of
from probe.reader.recording_meta import snapshot_mismatch as snapshot_mismatch

# opening a file and the readers' one error type (re-exported: callers import them here)
from probe.reader.recording_open import (
    RecordingError as RecordingError,
)
from probe.reader.recording_open import (
    connect_read_only,
)
from probe.reader.recording_open import (
    damaged_error as damaged_error,
)
from probe.reader.recording_rows import Reader as Reader
from probe.reader.recording_rows import check_order as check_order
from probe.reader.recording_rows import steps_of_rows
from probe.reader.recording_schema import (
    APPLICATION_ID,
    DDL,
    DETAIL_TABLES,
    READ_VERSIONS,
    SCHEMA_VERSION,
    DetailTable,
    check_pids,
    check_schema,
    upgrade_sql,
)
from probe.reader.sqlite_errors import SQLITE_DAMAGED
from probe.records import (
    Build,
    Dispatch,
    Flag,
    Hello,
    Reorder,
    Replay,
    Span,
)
from probe.step import STEP_COLUMNS, GpuSample, Step


def default_recording() -> Path:
    """The bundled real recording (H200, tiny DeepSeek-V3.2 + MTP; see
    benchmarks/evidence/bundled-recording.md)."""
    from importlib import resources  # here: its import is a cost every command paid at start

    return Path(str(resources.files("probe") / "data" / "default.probe"))


def _encode(kind: Any, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, enum.Enum):
        return value.name.lower()
    if kind is bool:
        return int(bool(value))
    return value


Names = Callable[[int], "str | None"]  # a builder id -> its class name (the ring's strings)


def _converter(kind: Any) -> Callable[[Any, Names], Any] | None:
    """How a value of ``kind`` is stored, as :func:`_encode` does it; None: as it is (an
    ``int`` field holds an ``int``)."""
    if isinstance(kind, Flag):
        bit = int(kind)  # an int mask: IntFlag arithmetic is slow
        return lambda v, names: int(bool(v & bit))
    if kind is str:
        return lambda v, names: names(v)
    if kind is int or kind is None:
        return None
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        # each member's stored name, once: ``member.name`` runs enum code on every read
        stored = {m: m.name.lower() for m in kind}
        return lambda v, names: stored[v] if type(v) is kind else _encode(kind, v)
    return lambda v, names: _encode(kind, v)


def _row_encoder(
    segments: list[tuple[Callable[[Any], Any], int]], kinds: list[Any]
) -> Callable[[Any, Names], list[Any]]:
    """``(obj, names) -> row``: each segment is a getter of ``n`` consecutive values
    (``operator.attrgetter`` of several attributes: one C call), then the columns whose
    kind needs it are converted. The per-column decisions are taken here, once."""
    convs = [(i, f) for i, k in enumerate(kinds) if (f := _converter(k)) is not None]

    def encode(obj: Any, names: Names) -> list[Any]:
        row: list[Any] = []
        for get, n in segments:
            row.extend(get(obj) if n > 1 else (get(obj),))
        for i, f in convs:
            if row[i] is not None:
                row[i] = f(row[i], names)
        return row

    return encode


def _detail_encoder(t: DetailTable) -> Callable[[Any, Names], list[Any]]:
    attrs = [c.attr for c in t.columns]
    return _row_encoder([(operator.attrgetter(*attrs), len(attrs))], [c.kind for c in t.columns])


def _step_encoder() -> Callable[[Step, Names], list[Any]]:
    """The ``steps`` row: the fields in runs of consecutive columns, ``phases`` as its
    ``<phase>_ns`` columns (0 when a phase did not run)."""
    segments: list[tuple[Callable[[Any], Any], int]] = []
    run: list[str] = []
    phases: list[str] = []

    def close_run() -> None:
        if run:
            segments.append((operator.attrgetter(*run), len(run)))
            run.clear()
        if phases:
            names = tuple(phases)
            segments.append((lambda s: tuple(s.phases.get(p, 0) for p in names), len(names)))
            phases.clear()

    for c in STEP_COLUMNS:
        if c.phase:
            if run:
                close_run()
            phases.append(c.phase)
        else:
            if phases:
                close_run()
            run.append(c.field)
    close_run()
    # a text field is stored as it is (``str`` in a detail table is a builder's name)
    kinds = [None if c.phase or c.kind is str else c.kind for c in STEP_COLUMNS]
    return _row_encoder(segments, kinds)


def no_names(builder_id: int) -> None:
    return None


STEP_ROW = _step_encoder()
_STEP_NAMES = tuple(c.name for c in STEP_COLUMNS)
DETAIL_ROWS = tuple((t, _detail_encoder(t)) for t in DETAIL_TABLES)
_DETAIL_BY_RECORD = {t.record: (t, encode) for t, encode in DETAIL_ROWS}


def step_fields(s: Step) -> dict[str, Any]:
    """``s`` as its ``steps`` row holds it: column name -> value, in column order.

    Enum members are their lower-case names, booleans 0/1, a missing value None. The
    writers of foreign formats name a step's values with it (Perfetto's slice args).
    """
    return dict(zip(_STEP_NAMES, STEP_ROW(s, no_names), strict=True))


def record_fields(
    rec: Span | Dispatch | Replay | Build | Reorder, builder_name: Names = no_names
) -> dict[str, Any]:
    """One detail record of a :class:`Step` as its table's row holds it, after ``pid``
    and ``step``: column name -> value, in column order, encoded as :func:`step_fields`
    does (and each :class:`~probe.records.Flag` column 0/1). ``builder_name`` turns a
    build's builder id into its class name (``Recording.builder_names()[pid].get``).
    """
    t, encode = _DETAIL_BY_RECORD[type(rec)]
    return dict(zip((c.name for c in t.columns), encode(rec, builder_name), strict=True))


class RecordingWriter:
    """Writes a recording; used by the reader process (``probe record``/``attach``)."""

    def __init__(self, path: str | Path, *, commit_every_s: float = 0.5) -> None:
        self.path = Path(path)
        self.db = sqlite3.connect(str(self.path), check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(f"PRAGMA application_id={APPLICATION_ID}")
        self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self.db.executescript(DDL)
        self.commit_every_s = commit_every_s
        self._builder_names: dict[tuple[int, int], str] = {}
        self._last_commit = time.monotonic()
        self.set_meta(schema_version=SCHEMA_VERSION, created_epoch_ns=time.time_ns())
        self.commit()

    def set_meta(self, **kv: Any) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)",
            [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in kv.items()],
        )

    def add_process(self, pid: int, hello: Hello | None) -> None:
        """The process row (once); its clock pair as soon as a hello is known."""
        self.db.execute("INSERT OR IGNORE INTO processes (pid) VALUES (?)", (pid,))
        if hello is not None:
            self.db.execute(
                "UPDATE processes SET boottime_ns=?, epoch_ns=?, perf_counter_ns=? "
                "WHERE pid=? AND boottime_ns IS NULL",
                (hello.boottime_ns, hello.epoch_ns, hello.perf_counter_ns, pid),
            )

    def add_processes(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Process rows as another recording holds them (``probe convert``): each with the
        ``processes`` table's columns, its snapshot JSON text."""
        cols = [r[1] for r in self.db.execute("PRAGMA table_info(processes)")]
        marks = ", ".join("?" * len(cols))
        self.db.executemany(
            f"INSERT OR REPLACE INTO processes ({', '.join(cols)}) VALUES ({marks})",
            [[r.get(c, 0 if c == "dropped" else None) for c in cols] for r in rows],
        )

    def set_snapshot(self, pid: int, snap: dict[str, Any]) -> None:
        self.db.execute(
            "UPDATE processes SET role=?, tp_rank=?, pp_rank=?, dp_rank=?, vllm_version=?, "
            "runner=?, model=?, snapshot=? WHERE pid=?",
            (
                snap.get("role", "worker"),
                snap.get("tp_rank"),
                snap.get("pp_rank"),
                snap.get("dp_rank"),
                snap.get("vllm_version"),
                snap.get("runner"),
                snap.get("model"),
                json.dumps(snap, default=str),
                pid,
            ),
        )

    def set_dropped(self, pid: int, dropped: int) -> None:
        self.db.execute("UPDATE processes SET dropped=? WHERE pid=?", (dropped, pid))

    def add_steps(self, steps: Iterable[Step]) -> None:
        """The steps and their detail rows, one ``executemany`` per table (each table's
        rows in the order of the steps, as one ``INSERT`` per row would give them)."""
        steps = list(steps)
        cols = ", ".join(c.name for c in STEP_COLUMNS)
        marks = ", ".join("?" * len(STEP_COLUMNS))
        self.db.executemany(
            f"INSERT OR REPLACE INTO steps ({cols}) VALUES ({marks})",
            [STEP_ROW(s, no_names) for s in steps],
        )
        for t, encode in DETAIL_ROWS:
            rows = []
            for s in steps:
                recs = getattr(s, t.step_field)
                if recs:
                    head, names = (s.pid, s.step), self._builder_name(s.pid)
                    rows += [(*head, *encode(r, names)) for r in recs]
            if rows:
                marks = ", ".join("?" * (len(t.columns) + 2))
                self.db.executemany(f"INSERT INTO {t.name} VALUES ({marks})", rows)
        self.maybe_commit()

    def _builder_name(self, pid: int) -> Callable[[int], str | None]:
        return lambda builder_id: self._builder_names.get((pid, builder_id))

    def set_strings(self, pid: int, strings: dict[int, str]) -> None:
        self._builder_names.update({(pid, k): v for k, v in strings.items()})

    def add_gpu(self, pid: int, timings: Iterable[GpuSample]) -> None:
        """Device timings arrive a few steps late; they are joined into steps on close."""
        self.db.executemany(
            "INSERT OR REPLACE INTO gpu VALUES (?, ?, ?, ?, ?)",
            [(pid, g.step, g.busy_ns, g.idle_before_ns, g.step_ns) for g in timings],
        )

    def join_gpu(self) -> None:
        self.db.execute(
            "UPDATE steps SET gpu_busy_ns = g.busy_ns, gpu_idle_before_ns = g.idle_before_ns, "
            "gpu_step_ns = g.step_ns FROM gpu AS g WHERE g.pid = steps.pid AND g.step = steps.step"
        )

    def set_faults(self, pid: int, faults: dict[str, tuple[int, bool]]) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO faults VALUES (?, ?, ?, ?)",
            [(pid, h, n, int(d)) for h, (n, d) in faults.items()],
        )

    def set_outside(self, pid: int, counts: dict[str, int]) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO outside VALUES (?, ?, ?)",
            [(pid, k, n) for k, n in counts.items()],
        )

    def add_anomalies(self, pid: int, messages: Iterable[str]) -> None:
        self.db.executemany("INSERT INTO anomalies VALUES (?, ?)", [(pid, m) for m in messages])

    def maybe_commit(self) -> None:
        if time.monotonic() - self._last_commit >= self.commit_every_s:
            self.commit()

    def commit(self) -> None:
        """Commit, then checkpoint: the ``.db`` alone holds everything committed so far
        (a copy of it, or a killed reader's file read without its ``-wal``)."""
        self.db.commit()
        self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        self._last_commit = time.monotonic()

    def close(self) -> bool:
        """Commit and close; ``True`` when the file was made self-contained, ``False``
        when a reader had it open (see :func:`finish_wal`): it is then complete but keeps
        its ``-wal``/``-shm`` until :func:`finish_wal` succeeds."""
        self.join_gpu()
        self.commit()
        done = _to_rollback_journal(self.db)
        self.db.close()
        return done


def _to_rollback_journal(db: sqlite3.Connection) -> bool:
    """Checkpoint everything and leave WAL mode: a finished recording is one self-contained
    file, readable on a read-only mount and by readers that create no ``-wal``/``-shm``
    beside it. Leaving WAL mode needs the file to itself; while a reader (a ``probe
    report`` of a live file) has it open SQLite refuses at once with "database is
    locked": ``False``, and the file stays in WAL mode, every commit in it and readable.
    A reader never stops a writer."""
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        mode = db.execute("PRAGMA journal_mode=DELETE").fetchone()
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return False
        raise
    return bool(mode) and str(mode[0]).lower() == "delete"


def finish_wal(path: str | Path) -> bool:
    """Make a closed recording that a reader held open at its close self-contained now;
    ``True`` once it is (or was already), ``False`` while a reader still has it open."""
    p = Path(path)
    if not p.is_file() or not (Path(f"{p}-wal").exists() or Path(f"{p}-shm").exists()):
        return True
    with contextlib.closing(sqlite3.connect(str(p), timeout=0.0)) as db:
        return _to_rollback_journal(db)


PID_SCAN_LIMIT = 16  #: more processes: a private index by pid (Recording._rows_of_pid)


@dataclass(frozen=True)
class Recording:
    """A recording opened for reading (validated).

    :meth:`iter_steps` is how analysis, the report, exporters and ``probe ab`` read it:
    every value is checked on the way in (type, enum name, range), and a value that does
    not fit raises :class:`RecordingError` naming the table, the step and the column.

        >>> rec = Recording.open(default_recording())
        >>> next(rec.iter_steps()).runner
        'mrv2'
    """

    path: Path
    db: sqlite3.Connection
    #: per detail table without a (pid, step) index, the last rowid its private index holds
    _indexed: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def open(cls, path: str | Path) -> Any:
        """The recording at ``path``, validated: this class for an SQLite file, a
        :class:`~probe.reader.columnar_read.ColumnarRecording` (the same reading methods)
        for a columnar recording's folder."""
        p = Path(path)
        from probe.reader.columnar_schema import is_columnar

        if is_columnar(p):
            from probe.reader.columnar_read import ColumnarRecording

            return ColumnarRecording.open(p)
        return cls.open_sqlite(p)

    @classmethod
    def open_sqlite(cls, p: Path) -> Recording:
        """An SQLite recording, validated."""
        db = connect_read_only(p)
        try:
            version = cls._validate(p, db)
            have = {r[1] for r in db.execute("PRAGMA table_info(steps)")}
            upgrade = upgrade_sql(version, have)
            if upgrade is not None:
                db.execute(upgrade)
        except BaseException:
            db.close()
            raise
        db.row_factory = sqlite3.Row
        return cls(p, db)

    @staticmethod
    def _validate(p: Path, db: sqlite3.Connection) -> int:
        """Check the file; its schema version."""
        try:
            app = db.execute("PRAGMA application_id").fetchone()[0]
            ver = db.execute("PRAGMA user_version").fetchone()[0]
        except SQLITE_DAMAGED as exc:
            raise damaged_error(p, exc) from None
        if app != APPLICATION_ID:
            raise RecordingError(f"{p}: an SQLite database, but not a probe recording")
        if ver not in READ_VERSIONS:
            read = " and ".join(str(v) for v in READ_VERSIONS)
            raise RecordingError(
                f"{p}: recording schema version {ver}; this probe reads versions {read}"
            )
        try:
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise damaged_error(p, RuntimeError(check))
            check_schema(p, db, ver)
            check_pids(p, db)
        except SQLITE_DAMAGED as exc:
            raise damaged_error(p, exc) from None
        return int(ver)

    def _rows(self, sql: str) -> list[Any]:
        """All rows of ``sql``; what SQLite raises on a damaged file is a RecordingError."""
        try:
            return self.db.execute(sql).fetchall()
        except SQLITE_DAMAGED as exc:
            raise damaged_error(self.path, exc) from None

    def meta(self) -> dict[str, Any]:
        """The ``meta`` table, each value decoded; a key the readers rely on
        (:data:`META_TYPES`) that does not hold its type is a :class:`RecordingError`."""
        out: dict[str, Any] = {}
        for key, raw in self._rows("SELECT key, value FROM meta"):
            try:
                value = json.loads(raw)
            except (TypeError, ValueError, RecursionError):
                value = raw
            want = META_TYPES.get(key)
            if want is not None and value is not None and not meta_ok(value, want):
                shown = str(raw)[:40]
                raise RecordingError(
                    f"{self.path}: table meta, key {key!r}: {shown!r} is not {want}"
                )
            out[key] = value
        return out

    def processes(self) -> list[dict[str, Any]]:
        rows = [dict(r) for r in self._rows("SELECT * FROM processes ORDER BY pid")]
        for r in rows:
            r["snapshot"] = snapshot_of(self.path, r) if r.get("snapshot") else None
        return rows

    def builder_names(self, pid: int | None = None) -> dict[int, dict[int, str]]:
        """Per pid (``pid``'s alone with one), the id each builder class name has in
        :attr:`Step.builds` (as the ring's string table gives ids); a build whose name was
        lost reads ``?``."""
        out: dict[int, dict[int, str]] = {}
        where = "" if pid is None else f"WHERE pid = {int(pid)}"
        for pid, name in self._rows(
            f"SELECT pid, builder FROM builds {where} GROUP BY pid, builder "
            "ORDER BY pid, MIN(rowid)"
        ):
            names = out.setdefault(pid, {})
            names[len(names) + 1] = name if isinstance(name, str) else "?"
        return out

    def step_counts(self) -> dict[int, int]:
        """Steps per pid (what ``iter_steps(pid)`` yields), without reading them."""
        rows = self._rows("SELECT pid, count(*) FROM steps GROUP BY pid")
        return {int(pid): int(n) for pid, n in rows}

    def record_count(self) -> int:
        """Steps and their detail records (spans, dispatches, replays, builds, reorders),
        as many as ``iter_steps()`` yields, without reading them: the total a writer of
        every record counts towards."""
        n = int(self._rows("SELECT count(*) FROM steps")[0][0])
        for t in DETAIL_TABLES:
            n += int(
                self._rows(
                    f"SELECT count(*) FROM {t.name} AS d WHERE EXISTS "
                    "(SELECT 1 FROM steps AS s WHERE s.pid = d.pid AND s.step = d.step)"
                )[0][0]
            )
        return n

    def iter_steps(self, pid: int | None = None) -> Iterator[Step]:
        """Every step (of ``pid``, or all), in (pid, step) order, with its detail records.

        Raises :class:`RecordingError` for a value that does not fit its column, and for
        what SQLite raises on a damaged file.
        """
        try:
            where, params = ("WHERE pid = ?", (pid,)) if pid is not None else ("", ())
            details = {t.name: self._detail_rows(t, "", (), pid=pid) for t in DETAIL_TABLES}
            cols = ", ".join(c.name for c in STEP_COLUMNS)
            cur = self.db.cursor()
            cur.row_factory = None
            rows = cur.execute(f"SELECT {cols} FROM steps {where} ORDER BY pid, step", params)
            yield from steps_of_rows(self.path, rows, details, self.builder_names(pid))
        except SQLITE_DAMAGED as exc:
            raise damaged_error(self.path, exc) from None

    def batches(
        self, table: str, columns: list[str] | None = None, pid: int | None = None,
        size: int = 65_536,
    ) -> Iterator[Any]:  # fmt: skip
        """The table's rows (of ``pid``) in (pid, step) order (within a step, as written),
        as Arrow record batches of the columnar recording's schema
        (:func:`probe.reader.columnar_schema.step_schema` without the per-step counts,
        :func:`~probe.reader.columnar_schema.detail_schema`): what
        :meth:`ColumnarRecording.batches <probe.reader.columnar_read.ColumnarRecording.batches>`
        gives, so a column pass reads either format. Values are as stored: check them as
        that method's callers do (:func:`probe.reader.columnar_columns.detail_columns`)."""
        import pyarrow as pa

        from probe.reader.columnar_schema import detail_schema, step_schema

        full = step_schema(with_counts=False) if table == "steps" else detail_schema(table)
        sch = full if columns is None else pa.schema([full.field(c) for c in columns])
        cols = ", ".join(sch.names)
        cur = self.db.cursor()
        cur.row_factory = None
        try:
            if table == "steps":
                where, params = ("WHERE pid = ?", (pid,)) if pid is not None else ("", ())
                rows = cur.execute(f"SELECT {cols} FROM steps {where} ORDER BY pid, step", params)
            elif pid is not None:
                rows = cur.execute(self._rows_of_pid(table, cols), (pid,))
            else:
                rows = cur.execute(f"SELECT {cols} FROM {table} ORDER BY pid, step, rowid")
            while chunk := rows.fetchmany(size):
                arrays = []
                for i, f in enumerate(sch):
                    values = [r[i] for r in chunk]
                    try:
                        if pa.types.is_boolean(f.type):  # stored 0/1
                            arrays.append(pa.array(values, pa.int64()).cast(pa.bool_()))
                        else:
                            arrays.append(pa.array(values, f.type))
                    except (pa.ArrowException, OverflowError, TypeError) as exc:
                        raise RecordingError(
                            f"{self.path}: damaged recording: {table}: {f.name}: {exc}"
                        ) from None
                yield pa.RecordBatch.from_arrays(arrays, schema=sch.remove_metadata())
        except SQLITE_DAMAGED as exc:
            raise damaged_error(self.path, exc) from None

    def _detail_rows(
        self, t: DetailTable, where: str, params: tuple[Any, ...], *, pid: int | None = None
    ) -> Iterator[tuple[Any, ...]]:
        """The rows of detail table ``t`` (``pid``, ``step``, then its columns), in (pid,
        step) order and, within a step, as written."""
        cols = ", ".join(["pid", "step", *(c.name for c in t.columns)])
        cur = self.db.cursor()
        cur.row_factory = None
        q = f"SELECT {cols} FROM {t.name} {where} ORDER BY pid, step, rowid"
        if pid is not None:
            q, params = self._rows_of_pid(t.name, cols), (pid,)
        return iter(cur.execute(q, params))

    def _rows_of_pid(self, table: str, cols: str) -> str:
        """The query of one process's rows of ``table`` (parameter: the pid). Without a
        (pid, step) index, in a recording of more than :data:`PID_SCAN_LIMIT` processes,
        through a private index of its (pid, step, rowid) made once in the connection's
        temporary schema (never in the file), rows past its last rowid read as well: reading
        every process in turn is one pass over the table, not one a process."""
        if table not in self._indexed:
            self._indexed[table] = -1
            first = [self._rows(f"PRAGMA index_info({ix[1]})")[:1] for ix in self._rows(
                f"PRAGMA index_list({table})")]  # fmt: skip
            many = self._rows("SELECT count(DISTINCT pid) FROM steps")[0][0] > PID_SCAN_LIMIT
            if many and not any(f and f[0][2] == "pid" for f in first):
                at = f"probe_rows_{table}"
                self._rows(f"CREATE TEMP TABLE {at} AS SELECT pid, step, rowid AS r FROM {table}")
                self._rows(f"CREATE INDEX temp.{at}_pid ON {at} (pid, step, r)")
                self._indexed[table] = self._rows(f"SELECT coalesce(max(r), 0) FROM {at}")[0][0]
        last = self._indexed[table]
        if last < 0:
            return f"SELECT {cols} FROM {table} WHERE pid = ? ORDER BY pid, step, rowid"
        inner = ", ".join(f"d.{c.strip()}" for c in cols.split(","))
        return (
            f"SELECT {cols} FROM (SELECT {inner}, d.rowid AS r FROM temp.probe_rows_{table} AS a "
            f"JOIN main.{table} AS d ON d.rowid = a.r WHERE a.pid = ?1 UNION ALL SELECT {inner}, "
            f"d.rowid FROM main.{table} AS d WHERE d.rowid > {last} AND d.pid = ?1) "
            "ORDER BY pid, step, r"
        )

    def faults(self) -> list[dict[str, Any]]:
        """Hook faults per process: ``pid``, ``hook``, ``count``, ``disabled``."""
        return [dict(r) for r in self._rows("SELECT * FROM faults")]

    def outside(self) -> list[dict[str, Any]]:
        """Records written outside steps (capture, profile, dummy runs), per process."""
        return [dict(r) for r in self._rows("SELECT * FROM outside")]

    def anomalies(self) -> list[str]:
        return [str(r[0]) for r in self._rows("SELECT message FROM anomalies")]

    def close(self) -> None:
        self.db.close()


# -- streaming and many files -------------------------------------------------------------
