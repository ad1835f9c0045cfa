"""The recording's schema, declared once: its version and application id, every detail
table (one record kind per step) with its columns and the record attributes they hold,
and the DDL made from them (:mod:`probe.reader.recording` writes and reads by it; the checks at
open compare a file's tables and columns with it)."""

from __future__ import annotations

import contextlib
import enum
import functools
import re
import sqlite3
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.reader.recording_open import RecordingError
from probe.records import (
    Build,
    BuildTag,
    Dispatch,
    Flag,
    Mode,
    Phase,
    Reason,
    Reorder,
    Replay,
    ReplayKind,
    Span,
)
from probe.step import STEP_COLUMNS

SCHEMA_VERSION = 2
APPLICATION_ID = 0x56475052  # "VGPR"

#: the ``steps`` columns added since version 1, with the version that added them: a file
#: of an earlier version has none of them, and reads them as NULL (not recorded)
ADDED_COLUMNS: dict[str, int] = {"carried_reqs": 2}
#: the schema versions this probe reads (it writes :data:`SCHEMA_VERSION`)
READ_VERSIONS: tuple[int, ...] = (1, 2)


def absent_columns(version: int) -> tuple[str, ...]:
    """The ``steps`` columns a file of schema ``version`` does not have."""
    return tuple(c for c, v in ADDED_COLUMNS.items() if v > version)


def upgrade_sql(version: int, have: Collection[str]) -> str | None:
    """SQL that makes a file of an earlier ``version`` whose ``steps`` table has the
    columns ``have`` read as this version on a read-only connection: a temporary ``steps``
    view over the file's table (unqualified names find the temporary schema first), with
    each column it lacks as NULL. None when nothing is missing."""
    absent = [c for c in absent_columns(version) if c not in have]
    if not absent:
        return None
    nulls = ", ".join(f"NULL AS {c}" for c in absent)
    return f"CREATE TEMP VIEW steps AS SELECT *, {nulls} FROM main.steps"


# -- the per-step detail tables ---------------------------------------------------------------


@dataclass(frozen=True)
class DetailColumn:
    """One column of a detail table and the record attribute it holds.

    ``kind``: ``int``, ``bool``, an enum class (stored as its lower-case name), a
    :class:`~probe.records.Flag` bit of the record's ``flags`` (stored 0/1), or ``str``
    for the builder's class name (the record holds the ring's string id).
    """

    name: str
    attr: str
    kind: Any = int
    min: int | None = 0

    @property
    def sql_type(self) -> str:
        text = self.kind is str or (
            isinstance(self.kind, type) and issubclass(self.kind, enum.Enum)
        )
        return "TEXT" if text and not isinstance(self.kind, Flag) else "INTEGER"


@dataclass(frozen=True)
class DetailTable:
    """A table of one record kind per step (``pid``, ``step`` first, then ``columns``)."""

    name: str
    record: type
    step_field: str
    columns: tuple[DetailColumn, ...]


def _c(name: str, attr: str | None = None, kind: Any = int, min: int | None = 0) -> DetailColumn:
    return DetailColumn(name, attr or name, kind, min)


_T0, _T1 = _c("t0_ns", "t0"), _c("t1_ns", "t1")
_DRAFTER = _c("drafter", "flags", Flag.DRAFTER)
DETAIL_TABLES: tuple[DetailTable, ...] = (
    DetailTable("spans", Span, "spans", (_c("phase", kind=Phase), _T0, _T1, _DRAFTER)),
    DetailTable(
        "dispatches",
        Dispatch,
        "dispatches",
        (
            _DRAFTER,
            _c("mode", kind=Mode),
            _c("reason", kind=Reason),
            _T0,
            _T1,
            _c("num_tokens"),
            _c("padded_tokens"),
            _c("num_reqs"),
            _c("padded_reqs"),
            _c("max_query_len"),
            _c("uniform_decode_query_len"),
            _c("uniform", "flags", Flag.UNIFORM),
        ),
    ),
    DetailTable(
        "replays",
        Replay,
        "replays",
        (
            _DRAFTER,
            _c("mode", kind=Mode),
            _c("kind", kind=ReplayKind),
            _T0,
            _T1,
            _c("num_tokens"),
            _c("breakable", "flags", Flag.BREAKABLE),
        ),
    ),
    DetailTable(
        "builds",
        Build,
        "builds",
        (
            _c("builder", "builder_id", str),
            _c("tag", kind=BuildTag),
            _DRAFTER,
            _T0,
            _T1,
            _c("padded_tokens"),
            _c("real_tokens"),
            _c("padded_reqs"),
            _c("real_reqs"),
            _c("max_query_len"),
            # -1: the builder has no threshold, or the split was unavailable
            _c("reorder_batch_threshold", min=-1),
            _c("num_decodes", min=-1),
            _c("num_prefills", min=-1),
            _c("num_decode_tokens", min=-1),
            _c("num_prefill_tokens", min=-1),
        ),
    ),
    DetailTable(
        "reorders",
        Reorder,
        "reorders",
        (
            _T0,
            _T1,
            _c("threshold", min=-1),
            _c("spec_as_decode", kind=bool),
            _c("num_reqs"),
            _c("num_decodes"),
            _c("num_decode_tokens"),
            _c("changed", kind=bool),
            _c("moved"),
        ),
    ),
)


def _ddl() -> str:
    steps = ", ".join(f"{c.name} {c.sql_type}" for c in STEP_COLUMNS)
    details = "\n".join(
        f"CREATE TABLE IF NOT EXISTS {t.name} (pid INTEGER, step INTEGER, "
        + ", ".join(f"{c.name} {c.sql_type}" for c in t.columns)
        + ");"
        for t in DETAIL_TABLES
    )
    return f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS processes (
  pid INTEGER PRIMARY KEY, role TEXT, tp_rank INTEGER, pp_rank INTEGER, dp_rank INTEGER,
  vllm_version TEXT, runner TEXT, model TEXT, boottime_ns INTEGER, epoch_ns INTEGER,
  perf_counter_ns INTEGER, dropped INTEGER DEFAULT 0, snapshot TEXT);
CREATE TABLE IF NOT EXISTS steps ({steps}, PRIMARY KEY (pid, step));
{details}
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


DDL = _ddl()
TABLES = tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", DDL))
INDEXES = tuple(re.findall(r"CREATE INDEX IF NOT EXISTS (\w+)", DDL))


# -- checks of a file's schema, on open ----------------------------------------------------


@functools.cache
def _columns() -> dict[str, list[str]]:
    """Every table's columns, as :data:`DDL` makes them (the one declaration)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        db.executescript(DDL)
        return {t: [r[1] for r in db.execute(f"PRAGMA table_info({t})")] for t in TABLES}


def check_schema(p: Path, db: sqlite3.Connection, version: int = SCHEMA_VERSION) -> None:
    """Refuse anything but this schema's tables and indexes (a view, a trigger, a table
    that is not ours, a column missing; a file of an earlier ``version`` lacks the
    columns added since, :func:`probe.reader.recording_schema.absent_columns`)."""
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
    later = set(absent_columns(version))
    for table, cols in _columns().items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        lost = [c for c in cols if c not in have and not (table == "steps" and c in later)]
        if lost:
            raise RecordingError(
                f"{p}: damaged or incomplete recording (table {table} has no {', '.join(lost)})"
            )


def check_pids(p: Path, db: sqlite3.Connection) -> None:
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
