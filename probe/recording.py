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

import json
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.assemble import PHASE_COLUMNS, Step
from probe.records import GpuTiming, Hello

SCHEMA_VERSION = 1
APPLICATION_ID = 0x56475052  # "VGPR"

_PHASE_COLS = [f"{p.name.lower()}_ns" for p in PHASE_COLUMNS]

DDL = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS processes (
  pid INTEGER PRIMARY KEY, role TEXT, tp_rank INTEGER, pp_rank INTEGER, dp_rank INTEGER,
  vllm_version TEXT, runner TEXT, model TEXT, boottime_ns INTEGER, epoch_ns INTEGER,
  perf_counter_ns INTEGER, dropped INTEGER DEFAULT 0, snapshot TEXT);
CREATE TABLE IF NOT EXISTS steps (
  pid INTEGER, step INTEGER, t0_ns INTEGER, t1_ns INTEGER, host_ns INTEGER,
  num_tokens INTEGER, num_reqs INTEGER, mode TEXT, reason TEXT,
  padded_tokens INTEGER, padded_reqs INTEGER, max_query_len INTEGER,
  uniform_decode_query_len INTEGER, uniform INTEGER, replayed INTEGER, pieces INTEGER,
  captures INTEGER, cpu_launch_overhead_ns INTEGER,
  {", ".join(f"{c} INTEGER" for c in _PHASE_COLS)},
  gpu_busy_ns INTEGER, gpu_idle_before_ns INTEGER, gpu_step_ns INTEGER,
  draft_mode TEXT, draft_reason TEXT, draft_replays INTEGER, draft_dispatches INTEGER,
  runner TEXT, PRIMARY KEY (pid, step));
CREATE TABLE IF NOT EXISTS spans (
  pid INTEGER, step INTEGER, phase TEXT, t0_ns INTEGER, t1_ns INTEGER, drafter INTEGER);
CREATE TABLE IF NOT EXISTS dispatches (
  pid INTEGER, step INTEGER, drafter INTEGER, mode TEXT, reason TEXT, t0_ns INTEGER,
  t1_ns INTEGER, num_tokens INTEGER, padded_tokens INTEGER, num_reqs INTEGER,
  padded_reqs INTEGER, max_query_len INTEGER, uniform_decode_query_len INTEGER,
  uniform INTEGER);
CREATE TABLE IF NOT EXISTS replays (
  pid INTEGER, step INTEGER, drafter INTEGER, mode TEXT, kind TEXT, t0_ns INTEGER,
  t1_ns INTEGER, num_tokens INTEGER, breakable INTEGER);
CREATE TABLE IF NOT EXISTS builds (
  pid INTEGER, step INTEGER, builder TEXT, tag TEXT, drafter INTEGER, t0_ns INTEGER,
  t1_ns INTEGER, padded_tokens INTEGER, real_tokens INTEGER, padded_reqs INTEGER,
  real_reqs INTEGER, max_query_len INTEGER, reorder_batch_threshold INTEGER,
  num_decodes INTEGER, num_prefills INTEGER, num_decode_tokens INTEGER,
  num_prefill_tokens INTEGER);
CREATE TABLE IF NOT EXISTS reorders (
  pid INTEGER, step INTEGER, t0_ns INTEGER, t1_ns INTEGER, threshold INTEGER,
  spec_as_decode INTEGER, num_reqs INTEGER, num_decodes INTEGER,
  num_decode_tokens INTEGER, changed INTEGER, moved INTEGER);
CREATE TABLE IF NOT EXISTS faults (pid INTEGER, hook TEXT, count INTEGER, disabled INTEGER,
  PRIMARY KEY (pid, hook));
CREATE TABLE IF NOT EXISTS outside (pid INTEGER, kind TEXT, count INTEGER,
  PRIMARY KEY (pid, kind));
CREATE TABLE IF NOT EXISTS anomalies (pid INTEGER, message TEXT);
CREATE TABLE IF NOT EXISTS gpu (pid INTEGER, step INTEGER, busy_ns INTEGER,
  idle_before_ns INTEGER, step_ns INTEGER, PRIMARY KEY (pid, step));
CREATE INDEX IF NOT EXISTS spans_step ON spans (pid, step);
CREATE INDEX IF NOT EXISTS builds_step ON builds (pid, step);
"""


TABLES = tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", DDL))


class RecordingError(ValueError):
    """A recording cannot be read; the message names the file and the problem."""


def _name(v: Any) -> str | None:
    return None if v is None else v.name.lower() if hasattr(v, "name") else str(v)


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
        self.db.execute(
            "INSERT OR IGNORE INTO processes (pid, boottime_ns, epoch_ns, perf_counter_ns) "
            "VALUES (?, ?, ?, ?)",
            (
                pid,
                hello.boottime_ns if hello else None,
                hello.epoch_ns if hello else None,
                hello.perf_counter_ns if hello else None,
            ),
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
        for s in steps:
            self.db.execute(
                f"INSERT OR REPLACE INTO steps (pid, step, t0_ns, t1_ns, host_ns, num_tokens, "
                f"num_reqs, mode, reason, padded_tokens, padded_reqs, max_query_len, "
                f"uniform_decode_query_len, uniform, replayed, pieces, captures, "
                f"cpu_launch_overhead_ns, {', '.join(_PHASE_COLS)}, draft_mode, draft_reason, "
                f"draft_replays, draft_dispatches, runner) VALUES "
                f"({', '.join('?' * (23 + len(_PHASE_COLS)))})",
                (
                    s.pid,
                    s.step,
                    s.t0,
                    s.t1,
                    s.host_ns,
                    s.num_tokens,
                    s.num_reqs,
                    _name(s.mode),
                    _name(s.reason),
                    s.padded_tokens,
                    s.padded_reqs,
                    s.max_query_len,
                    s.uniform_decode_query_len,
                    int(s.uniform),
                    int(s.replayed),
                    s.pieces,
                    s.captures,
                    s.cpu_launch_overhead_ns,
                    *(s.phases.get(p.name.lower(), 0) for p in PHASE_COLUMNS),
                    _name(s.draft_mode),
                    _name(s.draft_reason),
                    s.draft_replays,
                    s.draft_dispatches,
                    s.runner,
                ),
            )
            self.db.executemany(
                "INSERT INTO spans VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (s.pid, s.step, _name(x.phase), x.t0, x.t1, int(bool(x.flags & 1)))
                    for x in s.spans
                ],
            )
            self.db.executemany(
                "INSERT INTO dispatches VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        s.pid,
                        s.step,
                        int(bool(d.flags & 1)),
                        _name(d.mode),
                        _name(d.reason),
                        d.t0,
                        d.t1,
                        d.num_tokens,
                        d.padded_tokens,
                        d.num_reqs,
                        d.padded_reqs,
                        d.max_query_len,
                        d.uniform_decode_query_len,
                        int(bool(d.flags & 4)),
                    )
                    for d in s.dispatches
                ],
            )
            self.db.executemany(
                "INSERT INTO replays VALUES (?,?,?,?,?,?,?,?,?)",
                [
                    (
                        s.pid,
                        s.step,
                        int(bool(r.flags & 1)),
                        _name(r.mode),
                        _name(r.kind),
                        r.t0,
                        r.t1,
                        r.num_tokens,
                        int(bool(r.flags & 16)),
                    )
                    for r in s.replays
                ],
            )
            self.db.executemany(
                "INSERT INTO builds VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        s.pid,
                        s.step,
                        self._builder_names.get((s.pid, b.builder_id), None),
                        _name(b.tag),
                        int(bool(b.flags & 1)),
                        b.t0,
                        b.t1,
                        b.padded_tokens,
                        b.real_tokens,
                        b.padded_reqs,
                        b.real_reqs,
                        b.max_query_len,
                        b.reorder_batch_threshold,
                        b.num_decodes,
                        b.num_prefills,
                        b.num_decode_tokens,
                        b.num_prefill_tokens,
                    )
                    for b in s.builds
                ],
            )
            self.db.executemany(
                "INSERT INTO reorders VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        s.pid,
                        s.step,
                        r.t0,
                        r.t1,
                        r.threshold,
                        int(r.spec_as_decode),
                        r.num_reqs,
                        r.num_decodes,
                        r.num_decode_tokens,
                        int(r.changed),
                        r.moved,
                    )
                    for r in s.reorders
                ],
            )
        self.maybe_commit()

    def set_strings(self, pid: int, strings: dict[int, str]) -> None:
        self._builder_names.update({(pid, k): v for k, v in strings.items()})

    def add_gpu(self, pid: int, timings: Iterable[GpuTiming]) -> None:
        """Device timings arrive a few steps late; they are joined into steps on close."""
        self.db.executemany(
            "INSERT OR REPLACE INTO gpu VALUES (?, ?, ?, ?, ?)",
            [
                (
                    pid,
                    g.step,
                    g.busy_ns,
                    g.idle_before_ns if g.idle_before_ns >= 0 else None,
                    g.span_ns,
                )
                for g in timings
            ],
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
        self.db.commit()
        self._last_commit = time.monotonic()

    def close(self) -> None:
        self.join_gpu()
        self.commit()
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # a finished recording is one self-contained file: readable on a read-only mount
        # and by readers that create no -wal/-shm beside it
        self.db.execute("PRAGMA journal_mode=DELETE")
        self.db.close()


@dataclass(frozen=True)
class Recording:
    """A recording opened for reading (validated)."""

    path: Path
    db: sqlite3.Connection

    @classmethod
    def open(cls, path: str | Path) -> Recording:
        p = Path(path)
        if not p.exists():
            raise RecordingError(f"{p}: no such file")
        if p.is_dir():
            raise RecordingError(f"{p}: is a directory, not a recording")
        try:
            with open(p, "rb") as fh:
                head = fh.read(16)
        except OSError as exc:
            raise RecordingError(f"{p}: cannot read ({exc.strerror})") from None
        if head != b"SQLite format 3\x00":
            raise RecordingError(f"{p}: not a probe recording (not an SQLite database)")

        def damaged(exc: BaseException) -> RecordingError:
            why = " ".join(str(exc).split())  # SQLite's messages can span lines
            return RecordingError(f"{p}: damaged or truncated recording ({why})")

        try:
            db = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
            db.text_factory = lambda b: b.decode("utf-8", "replace")
            app = db.execute("PRAGMA application_id").fetchone()[0]
            ver = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise damaged(exc) from None
        if app != APPLICATION_ID:
            raise RecordingError(f"{p}: an SQLite database, but not a probe recording")
        if ver != SCHEMA_VERSION:
            raise RecordingError(
                f"{p}: recording schema version {ver}; this probe reads version {SCHEMA_VERSION}"
            )
        try:
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
        except sqlite3.DatabaseError as exc:
            raise damaged(exc) from None
        if check != "ok":
            raise damaged(RuntimeError(check))
        missing = sorted(set(TABLES) - tables)
        if missing:
            raise RecordingError(f"{p}: damaged or incomplete recording (no {', '.join(missing)})")
        db.row_factory = sqlite3.Row
        return cls(p, db)

    def meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for row in self.db.execute("SELECT key, value FROM meta"):
            try:
                out[row[0]] = json.loads(row[1])
            except (TypeError, ValueError):
                out[row[0]] = row[1]
        return out

    def processes(self) -> list[dict[str, Any]]:
        rows = [dict(r) for r in self.db.execute("SELECT * FROM processes ORDER BY pid")]
        for r in rows:
            r["snapshot"] = json.loads(r["snapshot"]) if r.get("snapshot") else None
        return rows

    def steps(self, where: str = "", params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        q = "SELECT * FROM steps" + (f" WHERE {where}" if where else "") + " ORDER BY pid, step"
        return [dict(r) for r in self.db.execute(q, params)]

    def rows(self, table: str) -> Iterator[dict[str, Any]]:
        if table not in {
            "spans",
            "dispatches",
            "replays",
            "builds",
            "reorders",
            "faults",
            "outside",
            "anomalies",
        }:
            raise ValueError(f"unknown table {table!r}")
        for r in self.db.execute(f"SELECT * FROM {table}"):
            yield dict(r)

    def close(self) -> None:
        self.db.close()
