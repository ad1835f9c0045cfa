"""The recording file: one SQLite database per session (schema version 1).

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
import functools
import json
import operator
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from probe.recording_schema import (
    APPLICATION_ID,
    DDL,
    DETAIL_TABLES,
    INDEXES,
    SCHEMA_VERSION,
    TABLES,
    DetailTable,
)
from probe.records import (
    Build,
    Dispatch,
    Flag,
    Hello,
    Reorder,
    Replay,
    Span,
)
from probe.sqlite_errors import SQLITE_DAMAGED, sqlite_message
from probe.step import STEP_COLUMNS, GpuSample, Step


def default_recording() -> Path:
    """The bundled real recording (H200, tiny DeepSeek-V3.2 + MTP; see docs/evidence.md)."""
    from importlib import resources  # here: its import is a cost every command paid at start

    return Path(str(resources.files("probe") / "data" / "default.probe.db"))


class RecordingError(ValueError):
    """A recording cannot be read; the message names the file and the problem."""


def _snapshot(p: Path, row: Mapping[str, Any]) -> dict[str, Any]:
    """A process's static snapshot: a JSON object, or the recording is damaged."""
    where = f"{p}: table processes, pid {row.get('pid')}, column snapshot"
    try:
        snap = json.loads(row["snapshot"])
    except (TypeError, ValueError, RecursionError) as exc:
        raise RecordingError(f"{where}: not JSON ({' '.join(str(exc).split())})") from None
    if not isinstance(snap, dict):
        raise RecordingError(f"{where}: not a JSON object")
    return snap


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


def _no_names(builder_id: int) -> None:
    return None


_STEP_ROW = _step_encoder()
_STEP_NAMES = tuple(c.name for c in STEP_COLUMNS)
_DETAIL_ROWS = tuple((t, _detail_encoder(t)) for t in DETAIL_TABLES)
_DETAIL_BY_RECORD = {t.record: (t, encode) for t, encode in _DETAIL_ROWS}


def step_fields(s: Step) -> dict[str, Any]:
    """``s`` as its ``steps`` row holds it: column name -> value, in column order.

    Enum members are their lower-case names, booleans 0/1, a missing value None. The
    writers of foreign formats name a step's values with it (Perfetto's slice args).
    """
    return dict(zip(_STEP_NAMES, _STEP_ROW(s, _no_names), strict=True))


def record_fields(
    rec: Span | Dispatch | Replay | Build | Reorder, builder_name: Names = _no_names
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
            [_STEP_ROW(s, _no_names) for s in steps],
        )
        for t, encode in _DETAIL_ROWS:
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

    def close(self) -> None:
        self.join_gpu()
        self.commit()
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # a finished recording is one self-contained file: readable on a read-only mount
        # and by readers that create no -wal/-shm beside it
        self.db.execute("PRAGMA journal_mode=DELETE")
        self.db.close()


@functools.cache
def _columns() -> dict[str, list[str]]:
    """Every table's columns, as :data:`DDL` makes them (the one declaration)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        db.executescript(DDL)
        return {t: [r[1] for r in db.execute(f"PRAGMA table_info({t})")] for t in TABLES}


def _check_schema(p: Path, db: sqlite3.Connection) -> None:
    """Refuse anything but this schema's tables and indexes (a view, a trigger, a table
    that is not ours, a column missing)."""
    objects = {(r[0], r[1]) for r in db.execute("SELECT type, name FROM sqlite_master")}
    missing = sorted(t for t in TABLES if ("table", t) not in objects)
    if missing:
        views = sorted(t for t in missing if ("view", t) in objects)
        if views:
            raise RecordingError(f"{p}: not a probe recording ({', '.join(views)}: a view)")
        raise RecordingError(f"{p}: damaged or incomplete recording (no {', '.join(missing)})")
    foreign = sorted(
        f"{kind} {name}"
        for kind, name in objects
        if not (
            (kind == "table" and name in TABLES)
            or (kind == "index" and (name in INDEXES or name.startswith("sqlite_autoindex_")))
        )
    )
    if foreign:
        raise RecordingError(f"{p}: not a probe recording (it also holds {', '.join(foreign)})")
    for table, cols in _columns().items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        lost = [c for c in cols if c not in have]
        if lost:
            raise RecordingError(
                f"{p}: damaged or incomplete recording (table {table} has no {', '.join(lost)})"
            )


def _check_pids(p: Path, db: sqlite3.Connection) -> None:
    """Every row's pid names a process of the recording (a flipped byte in a pid would
    otherwise reach the exporters as a process nobody declared)."""
    for table in ("steps", "gpu", *(t.name for t in DETAIL_TABLES)):
        row = db.execute(
            f"SELECT pid FROM {table} WHERE pid NOT IN (SELECT pid FROM processes) LIMIT 1"
        ).fetchone()
        if row is not None:
            raise RecordingError(
                f"{p}: damaged recording: {table} has pid {row[0]!r}, not in processes"
            )


def _check_order(rd: _Reader, table: str, row: tuple[Any, ...], kw: dict[str, Any]) -> None:
    """A span that ends before it starts is damage, not data."""
    t0, t1 = kw.get("t0"), kw.get("t1")
    if isinstance(t0, int) and isinstance(t1, int) and t1 < t0:
        raise rd.fail(table, row, "t1", f"is {t1}, before t0 {t0}")


class _Reader:
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


def damaged_error(p: Path, exc: BaseException) -> RecordingError:
    return RecordingError(f"{p}: damaged or truncated recording ({sqlite_message(exc)})")


def _connect_read_only(p: Path) -> sqlite3.Connection:
    """Open ``p`` read-only, creating nothing beside it.

    Only a regular file is opened (a FIFO would block, a device is not a recording). The
    URI is built from the absolute path with every reserved character quoted (``?``,
    ``#`` and ``%`` in a name are that file's name, never URI syntax). A recording that
    is still being written (WAL mode with its ``-wal`` and ``-shm`` beside it) is read
    through them, so its readers see what the writer committed; any other file is opened
    ``immutable=1``: nothing is created beside it, a read-only medium works, and a
    recording left by a killed reader is read from the ``.db`` alone up to its last
    checkpoint (the writer checkpoints on every commit).
    """
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise RecordingError(f"{p}: no such file") from None
    except OSError as exc:
        raise RecordingError(f"{p}: cannot read ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise RecordingError(f"{p}: is a directory, not a recording")
    if not stat.S_ISREG(st.st_mode):
        raise RecordingError(f"{p}: not a regular file (a FIFO, socket or device), not a recording")
    try:
        # O_NONBLOCK: a FIFO swapped in after the stat must not block the open
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise RecordingError(f"{p}: not a regular file, not a recording")
            head = os.pread(fd, 100, 0)
        finally:
            os.close(fd)
    except OSError as exc:
        raise RecordingError(f"{p}: cannot read ({exc.strerror})") from None
    if head[:16] != b"SQLite format 3\x00":
        raise RecordingError(f"{p}: not a probe recording (not an SQLite database)")
    wal_mode = len(head) > 19 and head[18] == 2 and head[19] == 2
    live = wal_mode and Path(f"{p}-wal").is_file() and Path(f"{p}-shm").is_file()
    uri = p.absolute().as_uri() + ("?mode=ro" if live else "?mode=ro&immutable=1")
    try:
        db = sqlite3.connect(uri, uri=True)
    except SQLITE_DAMAGED as exc:
        raise damaged_error(p, exc) from None
    db.text_factory = lambda b: b.decode("utf-8", "replace")
    return db


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

    @classmethod
    def open(cls, path: str | Path) -> Recording:
        p = Path(path)
        db = _connect_read_only(p)
        try:
            cls._validate(p, db)
        except BaseException:
            db.close()
            raise
        db.row_factory = sqlite3.Row
        return cls(p, db)

    @staticmethod
    def _validate(p: Path, db: sqlite3.Connection) -> None:
        try:
            app = db.execute("PRAGMA application_id").fetchone()[0]
            ver = db.execute("PRAGMA user_version").fetchone()[0]
        except SQLITE_DAMAGED as exc:
            raise damaged_error(p, exc) from None
        if app != APPLICATION_ID:
            raise RecordingError(f"{p}: an SQLite database, but not a probe recording")
        if ver != SCHEMA_VERSION:
            raise RecordingError(
                f"{p}: recording schema version {ver}; this probe reads version {SCHEMA_VERSION}"
            )
        try:
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise damaged_error(p, RuntimeError(check))
            _check_schema(p, db)
            _check_pids(p, db)
        except SQLITE_DAMAGED as exc:
            raise damaged_error(p, exc) from None

    def _rows(self, sql: str) -> list[Any]:
        """All rows of ``sql``; what SQLite raises on a damaged file is a RecordingError."""
        try:
            return self.db.execute(sql).fetchall()
        except SQLITE_DAMAGED as exc:
            raise damaged_error(self.path, exc) from None

    def meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for row in self._rows("SELECT key, value FROM meta"):
            try:
                out[row[0]] = json.loads(row[1])
            except (TypeError, ValueError):
                out[row[0]] = row[1]
        return out

    def processes(self) -> list[dict[str, Any]]:
        rows = [dict(r) for r in self._rows("SELECT * FROM processes ORDER BY pid")]
        for r in rows:
            r["snapshot"] = _snapshot(self.path, r) if r.get("snapshot") else None
        return rows

    def builder_names(self) -> dict[int, dict[int, str]]:
        """Per pid, the id each builder class name has in :attr:`Step.builds` (as the
        ring's string table gives ids); a build whose name was lost reads ``?``."""
        out: dict[int, dict[int, str]] = {}
        for pid, name in self._rows(
            "SELECT pid, builder FROM builds GROUP BY pid, builder ORDER BY pid, MIN(rowid)"
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
            rd = _Reader(self.path)
            ids = {p: {n: i for i, n in names.items()} for p, names in self.builder_names().items()}
            details = {t.name: self._detail_rows(t, rd, ids, where, params) for t in DETAIL_TABLES}
            pending: dict[str, tuple[tuple[int, int], Any] | None] = {
                name: next(it, None) for name, it in details.items()
            }
            cols = ", ".join(c.name for c in STEP_COLUMNS)
            cur = self.db.cursor()
            cur.row_factory = None
            for row in cur.execute(f"SELECT {cols} FROM steps {where} ORDER BY pid, step", params):
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
                _check_order(rd, "steps", row, kw)
                key = (kw["pid"], kw["step"])
                for t in DETAIL_TABLES:
                    got: list[Any] = []
                    nxt = pending[t.name]
                    while nxt is not None and nxt[0] <= key:
                        if nxt[0] == key:  # rows of a step not in steps: not part of any step
                            got.append(nxt[1])
                        nxt = next(details[t.name], None)
                    pending[t.name] = nxt
                    kw[t.step_field] = tuple(got)
                yield Step(**kw)
        except SQLITE_DAMAGED as exc:
            raise damaged_error(self.path, exc) from None

    def _detail_rows(
        self,
        t: DetailTable,
        rd: _Reader,
        ids: dict[int, dict[str, int]],
        where: str,
        params: tuple[Any, ...],
    ) -> Iterator[tuple[tuple[int, int], Any]]:
        cols = ", ".join(["pid", "step", *(c.name for c in t.columns)])
        cur = self.db.cursor()
        cur.row_factory = None
        q = f"SELECT {cols} FROM {t.name} {where} ORDER BY pid, step, rowid"
        for row in cur.execute(q, params):
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
            if "flags" in {f.name for f in fields(t.record)}:
                kw["flags"] = int(flags)
            _check_order(rd, t.name, row, kw)
            yield (pid, step), t.record(**kw)

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


def iter_step_chunks(
    rec: Recording | RecordingSet, size: int = 1024, pid: int | None = None
) -> Iterator[list[Step]]:
    """The steps of :meth:`Recording.iter_steps` (every value checked as it does) in lists
    of at most ``size``: what a writer holds at once is one chunk, whatever the length of
    the recording (SQLite reads the rows a page at a time under the cursor)."""
    if size < 1:
        raise ValueError(f"chunk size must be at least 1, got {size}")
    chunk: list[Step] = []
    for s in rec.iter_steps(pid):
        chunk.append(s)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def encoded_rows(
    steps: Iterable[Step], builder_names: Mapping[int, Mapping[int, str]]
) -> dict[str, list[list[Any]]]:
    """``steps`` as the rows of the recording's tables hold them: ``steps`` (its columns)
    and each detail table (``pid``, ``step``, then its columns), encoded as the writer
    encodes them (enum members their lower-case names, flags and booleans 0/1).
    ``builder_names``: per pid, a build's builder id -> class name
    (:meth:`Recording.builder_names`)."""
    steps = list(steps)
    out: dict[str, list[list[Any]]] = {"steps": [_STEP_ROW(s, _no_names) for s in steps]}
    for t, encode in _DETAIL_ROWS:
        rows: list[list[Any]] = []
        for s in steps:
            recs = getattr(s, t.step_field)
            if recs:
                names = builder_names.get(s.pid, {}).get
                rows += [[s.pid, s.step, *encode(r, names)] for r in recs]
        out[t.name] = rows
    return out


def expand_paths(names: Iterable[str | Path]) -> list[Path]:
    """Recording names as given on a command line: a name with ``*``, ``?`` or ``[`` that
    is not a file is a glob (``ranks/*.probe.db``, ``'**'`` included), its matches sorted;
    every path once, in the order given. A glob that matches nothing raises
    :class:`RecordingError`."""
    import glob

    out: list[Path] = []
    seen: set[Path] = set()
    for name in names:
        s = str(name)
        if any(c in s for c in "*?[") and not Path(s).exists():
            found = sorted(glob.glob(s, recursive=True))
            if not found:
                raise RecordingError(f"{s}: no recording matches")
            paths = [Path(f) for f in found]
        else:
            paths = [Path(s)]
        for p in paths:
            key = p.resolve()
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def open_many(names: Iterable[str | Path]) -> Recording | RecordingSet:
    """The recordings named (globs expanded, :func:`expand_paths`), opened and validated:
    one :class:`Recording`, or a :class:`RecordingSet` reading several as one. A file that
    is not a readable recording raises :class:`RecordingError` naming it (those opened
    before it are closed)."""
    paths = expand_paths(names)
    if not paths:
        raise RecordingError("no recording given")
    recs: list[Recording] = []
    try:
        for p in paths:
            recs.append(Recording.open(p))
        return recs[0] if len(recs) == 1 else RecordingSet(recs)
    except BaseException:
        for r in recs:
            r.close()
        raise


class RecordingSet:
    """Several recordings read as one, with :class:`Recording`'s reading methods.

    The rolling files of one agent, or the ranks of several hosts: their processes side by
    side, and their steps in (pid, step) order across the files. A pid found in several
    files is one process (an agent's rolling files of one host), its steps read from each
    file in turn; the same pid in the recordings of two hosts (``meta`` ``host``) raises
    :class:`RecordingError`, as they cannot be told apart. Builder ids are renumbered where
    the files numbered one process's builders differently.
    """

    def __init__(self, recordings: list[Recording]) -> None:
        self.recordings = recordings
        self.path = recordings[0].path
        hosts: dict[int, tuple[str, Path]] = {}
        for r in recordings:
            host = str(r.meta().get("host") or "")
            for pid in [int(p["pid"]) for p in r.processes()]:
                seen = hosts.get(pid)
                if seen is not None and seen[0] != host:
                    raise RecordingError(
                        f"{r.path}: pid {pid} is also in {seen[1]}, recorded on another host "
                        f"({host or '?'} and {seen[0] or '?'}): read them apart"
                    )
                hosts.setdefault(pid, (host, r.path))
        self._names: dict[int, dict[int, str]] = {}
        self._remap: list[dict[int, dict[int, int]]] = []  # per file: pid -> its id -> ours
        for r in recordings:
            remap: dict[int, dict[int, int]] = {}
            for pid, names in r.builder_names().items():
                ours = self._names.setdefault(pid, {})
                ids = {n: i for i, n in ours.items()}
                for i, name in names.items():
                    if name not in ids:
                        ids[name] = len(ours) + 1
                        ours[ids[name]] = name
                    if ids[name] != i:
                        remap.setdefault(pid, {})[i] = ids[name]
            self._remap.append(remap)

    def meta(self) -> dict[str, Any]:
        """The first file's meta, with ``files``: how many were read as one."""
        return {**self.recordings[0].meta(), "files": len(self.recordings)}

    def processes(self) -> list[dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for r in self.recordings:
            for p in r.processes():
                out.setdefault(int(p["pid"]), p)
        return [out[pid] for pid in sorted(out)]

    def builder_names(self) -> dict[int, dict[int, str]]:
        return {pid: dict(names) for pid, names in self._names.items()}

    def step_counts(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.recordings:
            for pid, n in r.step_counts().items():
                out[pid] = out.get(pid, 0) + n
        return out

    def record_count(self) -> int:
        return sum(r.record_count() for r in self.recordings)

    def iter_steps(self, pid: int | None = None) -> Iterator[Step]:
        """Every step of every file (of ``pid``, or all) in (pid, step) order; a step
        number found in two files comes from the earlier file first."""
        import dataclasses
        import heapq

        def each(i: int, r: Recording) -> Iterator[tuple[int, int, int, Step]]:
            remap = self._remap[i]
            for s in r.iter_steps(pid):
                ids = remap.get(s.pid)
                if ids and s.builds:
                    builds = tuple(
                        dataclasses.replace(b, builder_id=ids.get(b.builder_id, b.builder_id))
                        for b in s.builds
                    )
                    s = dataclasses.replace(s, builds=builds)
                yield s.pid, s.step, i, s

        its = [each(i, r) for i, r in enumerate(self.recordings)]
        for *_, s in heapq.merge(*its, key=lambda t: t[:3]):
            yield s

    def faults(self) -> list[dict[str, Any]]:
        return [f for r in self.recordings for f in r.faults()]

    def outside(self) -> list[dict[str, Any]]:
        return [o for r in self.recordings for o in r.outside()]

    def anomalies(self) -> list[str]:
        return [a for r in self.recordings for a in r.anomalies()]

    def close(self) -> None:
        for r in self.recordings:
            r.close()
