"""rocpd SQLite databases (rocprofv3's ``*_results.db``, or a side-car) into a profile.

    from exporters.timelines.rocpd import read_rocpd

    profile = read_rocpd("1234_results.db")

The reader never runs SQL stored in the file: it reads the base tables (``rocpd_region``,
``rocpd_sample``, ``rocpd_kernel_dispatch``... with the database's uuid suffix) with its own
queries, after checking that each is a plain table with the columns of its schema version.
The file's views (AMD's ``regions``, ``kernels``... or anything put in their place) are never
queried, and every value read is checked (integer timestamps within range, ends not before
starts, text where text belongs), each failure a :class:`ProfileError` that names the
table, the row and the column.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from exporters.timelines.inputs import open_sqlite, timestamp_ns
from exporters.timelines.model import (
    CLOCK_BOOTTIME,
    GpuKernel,
    HostCall,
    Marker,
    Profile,
    ProfileError,
)
from exporters.timelines.rocpd_schema import layout_of
from probe.reader.sqlite_errors import SQLITE_DAMAGED, sqlite_message

__all__ = ["read_rocpd", "rocpd_origin"]

_MAX_EXTDATA = 1 << 20

# Columns each layout's tables must have for the reader's queries.
_NEEDED: dict[str, dict[str, tuple[str, ...]]] = {
    "inline": {
        "rocpd_region": ("id", "pid", "tid", "start", "end", "name_id", "event_id"),
        "rocpd_sample": ("id", "track_id", "timestamp", "event_id"),
        "rocpd_kernel_dispatch": (
            "id",
            "pid",
            "tid",
            "agent_id",
            "kernel_id",
            "queue_id",
            "stream_id",
            "start",
            "end",
            "event_id",
        ),
        "rocpd_track": ("id", "pid", "tid", "name_id"),
        "rocpd_event": ("id", "category_id", "stack_id", "correlation_id", "extdata"),
        "rocpd_string": ("id", "string"),
        "rocpd_info_process": ("id", "pid"),
        "rocpd_info_thread": ("id", "tid"),
        "rocpd_info_agent": ("id", "logical_index"),
        "rocpd_info_kernel_symbol": ("id", "kernel_name", "display_name"),
    },
    "track": {
        "rocpd_region": ("id", "track_id", "name_id", "start", "end", "event_id"),
        "rocpd_sample": ("id", "track_id", "name_id", "timestamp", "event_id"),
        "rocpd_kernel_dispatch": ("id", "track_id", "kernel_id", "start", "end", "event_id"),
        "rocpd_track": ("id", "pid", "tid", "agent_id", "queue_id", "stream_id"),
        "rocpd_event": ("id", "category_id", "stack_id", "correlation_id", "extdata"),
        "rocpd_string": ("id", "string"),
        "rocpd_info_category": ("id", "name"),
        "rocpd_info_agent": ("id", "logical_index"),
        "rocpd_info_kernel_symbol": ("id", "kernel_name", "display_name"),
    },
}
_NEEDED["spine"] = {
    **_NEEDED["track"],
    "rocpd_region": ("id", "track_id", "name_id", "start_id", "end_id", "event_id"),
    "rocpd_sample": ("id", "track_id", "name_id", "timestamp_id", "event_id"),
    "rocpd_kernel_dispatch": ("id", "track_id", "kernel_id", "start_id", "end_id", "event_id"),
    "rocpd_timestamp": ("id", "value"),
}


class _Db:
    """The database's objects, its uuid suffix and the checks on the tables read."""

    def __init__(self, conn: sqlite3.Connection, p: Path) -> None:
        self.conn = conn
        self.p = p
        self.objects: dict[str, tuple[str, str]] = {
            str(n): (str(t), str(s or ""))
            for n, t, s in conn.execute("SELECT name, type, sql FROM sqlite_master")
        }
        metas = sorted(
            n
            for n, (t, _) in self.objects.items()
            if t == "table" and (n == "rocpd_metadata" or n.startswith("rocpd_metadata_"))
        )
        if not metas:
            raise ProfileError(p, "not a rocpd database: no rocpd_metadata table")
        if len(metas) > 1:
            raise ProfileError(
                p, f"several rocpd databases in one file ({', '.join(metas)}); read them apart"
            )
        self.sfx = metas[0][len("rocpd_metadata") :]

    def table(self, base: str, needed: Sequence[str] = ()) -> str:
        """The quoted name of a base table, checked to be a plain table with ``needed``."""
        name = base + self.sfx
        kind, sql = self.objects.get(name, ("", ""))
        if not kind:
            raise ProfileError(self.p, f"no table {name}")
        if kind != "table" or sql.lstrip().upper().startswith("CREATE VIRTUAL"):
            what = "a virtual table" if kind == "table" else f"a {kind}"
            raise ProfileError(self.p, f"{name} is {what}, expected a plain table")
        cols = {str(r[1]) for r in self.conn.execute(f'PRAGMA table_info("{name}")')}
        missing = [c for c in needed if c not in cols]
        if missing:
            raise ProfileError(
                self.p,
                f"lacks column(s) {', '.join(missing)} (has: {', '.join(sorted(cols))})",
                f"table {name}",
            )
        return f'"{name}"'

    def has(self, base: str) -> bool:
        return base + self.sfx in self.objects


def _text(p: Path, where: str, value: Any, column: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ProfileError(
            p, f"{type(value).__name__} value, expected text", f"{where} column {column}"
        )
    return value


def _int(p: Path, where: str, value: Any, column: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ProfileError(
        p, f"{value!r:.40} ({type(value).__name__}) is not an integer", f"{where} column {column}"
    )


def _message(extdata: Any) -> str | None:
    if not isinstance(extdata, str) or not extdata or len(extdata) > _MAX_EXTDATA:
        return None
    try:
        data = json.loads(extdata)
    except (ValueError, RecursionError):
        return None
    msg = data.get("message") if isinstance(data, dict) else None
    return msg if isinstance(msg, str) else None


def _is_api_category(category: str) -> bool:
    upper = category.upper()
    return "MARKER" not in upper and (upper.endswith("_API") or upper.endswith("_API_EXT"))


def _nz(value: int | None) -> int | None:
    return value if value else None


def _metadata(db: _Db) -> dict[str, list[str]]:
    tags: dict[str, list[str]] = {}
    t = db.table("rocpd_metadata", ("tag", "value"))
    for rid, tag, value in db.conn.execute(f"SELECT id, tag, value FROM {t}"):
        where = f"table {t.strip(chr(34))} row id {rid}"
        tags.setdefault(_text(db.p, where, tag, "tag"), []).append(
            _text(db.p, where, value, "value")
        )
    return tags


def rocpd_origin(path: str | os.PathLike[str]) -> tuple[str, str | None, str | None]:
    """``(schema_version, machine_id, hostname)`` of a rocpd database (its node's, if any).

    Raises :class:`ProfileError` when it is not a readable rocpd database with one
    schema version.
    """
    p = Path(path)
    conn = open_sqlite(p)
    try:
        db = _Db(conn, p)
        version = _version(db, _metadata(db))
        machine_id = hostname = None
        if db.has("rocpd_info_node"):
            t = db.table("rocpd_info_node", ("machine_id", "hostname"))
            row = conn.execute(f"SELECT id, machine_id, hostname FROM {t} LIMIT 1").fetchone()
            if row:
                where = f"table {t.strip(chr(34))} row id {row[0]}"
                machine_id = _text(p, where, row[1], "machine_id") or None
                hostname = _text(p, where, row[2], "hostname") or None
        return version, machine_id, hostname
    except SQLITE_DAMAGED as exc:
        msg = sqlite_message(exc)
        raise ProfileError(p, f"corrupt or unreadable rocpd database: {msg}") from None
    finally:
        conn.close()


def _version(db: _Db, tags: dict[str, list[str]]) -> str:
    versions = sorted(set(tags.get("schema_version", [])))
    if not versions:
        raise ProfileError(db.p, "rocpd_metadata has no schema_version")
    if len(versions) > 1:
        raise ProfileError(
            db.p, f"mixed rocpd schema versions in one database: {', '.join(versions)}"
        )
    return versions[0]


def read_rocpd(path: str | os.PathLike[str]) -> Profile:
    """Read a rocpd SQLite database (rocprofv3's ``*_results.db`` or one the probe wrote).

    The schema version comes from ``rocpd_metadata`` (``schema_version``): 3.x (``nid``/
    ``pid``/``tid`` on each row), 4.0.x (times in ``rocpd_timestamp``) and 4.1.x
    (``rocpd_track`` based) are read; any other version raises :class:`ProfileError`.
    The rows become, as rocprofv3's own views present them:

    - kernel dispatches -> :class:`GpuKernel` (``device`` is the agent's logical index, the
      ``Agent N`` of ``rocpd convert``; ``correlation_id`` is ``stack_id``, the internal id
      that matches the API call; ``external_id`` the event's ``correlation_id``);
    - regions and samples (instant records) -> :class:`HostCall` when the category is an
      API domain (``HIP_RUNTIME_API_EXT``...), otherwise :class:`Marker`, named by the
      event's ``extdata.message`` when there is one (roctx text, probe spans).

    A kernel pid or tid of 0 (unknown, see :class:`~exporters.timelines.rocpd_writer.
    RocpdWriter`) is read as ``None``. In a 3.x database a sample is named by its track,
    which rocprofv3 names after the category (the probe's writer also stores the name as
    the message). Raises :class:`ProfileError` for a missing, non-regular, empty,
    non-SQLite, truncated or corrupt file, a missing or wrong table, an unknown schema
    version or a value of the wrong type or range (naming table, row and column).
    """
    p = Path(path)
    conn = open_sqlite(p)
    try:
        return _read(_Db(conn, p))
    except SQLITE_DAMAGED as exc:
        msg = sqlite_message(exc)
        reason = "interrupted after the time limit" if "interrupt" in msg else msg
        raise ProfileError(p, f"corrupt or unreadable rocpd database: {reason}") from None
    finally:
        conn.close()


def _read(db: _Db) -> Profile:
    p = db.p
    tags = _metadata(db)
    version = _version(db, tags)
    layout = layout_of(version)
    if layout is None:
        raise ProfileError(
            p,
            f"unknown rocpd schema version {version!r}; this reader knows 3.x (nid/pid/tid "
            "on each row), 4.0.x (rocpd_timestamp) and 4.1.x (rocpd_track based)",
        )
    if layout == "inline" and not db.has("rocpd_region"):
        raise ProfileError(p, f"schema_version {version!r} but no rocpd_region table")
    region_cols = {str(r[1]) for r in db.conn.execute(f'PRAGMA table_info("rocpd_region{db.sfx}")')}
    want = {"inline": "pid", "track": "track_id", "spine": "start_id"}[layout]
    if want not in region_cols:
        raise ProfileError(
            p,
            f"schema_version {version!r} but rocpd_region has columns "
            f"{', '.join(sorted(region_cols))} (expected {want!r}); the layout does not match "
            "the version",
        )
    t = {base: db.table(base, cols) for base, cols in _NEEDED[layout].items()}
    kernels = list(_kernels(db, layout, t))
    host_calls: list[HostCall] = []
    markers: list[Marker] = []
    for kind, query in (("regions", _regions_sql(layout, t)), ("samples", _samples_sql(layout, t))):
        table = t["rocpd_region" if kind == "regions" else "rocpd_sample"].strip('"')
        for rid, cat, name, pid, tid, start, end, stack, ext, extdata in db.conn.execute(query):
            where = f"table {table} row id {rid}"
            start_ns, end_ns = _times(p, where, start, end)
            category = _text(p, where, cat, "category")
            text = _text(p, where, name, "name")
            pid_v, tid_v = _int(p, where, pid, "pid"), _int(p, where, tid, "tid")
            if pid_v is None or tid_v is None:
                raise ProfileError(p, "has no process or thread (pid/tid NULL)", where)
            stack_v, ext_v = (
                _int(p, where, stack, "stack_id"),
                _int(p, where, ext, "correlation_id"),
            )
            message = _message(extdata)
            if _is_api_category(category):
                call_name = message if (kind == "samples" and message) else text
                host_calls.append(
                    HostCall(
                        call_name, category, start_ns, end_ns, pid_v, tid_v, stack_v, _nz(ext_v)
                    )
                )
            else:
                markers.append(Marker(message or text, start_ns, end_ns, pid_v, tid_v, category))
    meta = {
        "path": str(p),
        "schema_version": version,
        "layout": layout,
        "guids": tags.get("guid", []),
        "uuids": tags.get("uuid", []),
        "created_by": tags.get("created_by", []),
    }
    return Profile.build("rocpd", CLOCK_BOOTTIME, kernels, host_calls, markers, meta)


def _times(p: Path, where: str, start: Any, end: Any) -> tuple[int, int]:
    s = timestamp_ns(p, where, start, "column start")
    e = timestamp_ns(p, where, end, "column end")
    if e < s:
        raise ProfileError(p, f"ends ({e}) before it starts ({s})", where)
    return s, e


def _time_cols(layout: str, t: dict[str, str], alias: str, instant: bool = False) -> str:
    if layout != "spine":
        return (
            f"{alias}.timestamp, {alias}.timestamp" if instant else f'{alias}.start, {alias}."end"'
        )
    ts = t["rocpd_timestamp"]
    if instant:
        one = f"(SELECT value FROM {ts} WHERE id = {alias}.timestamp_id)"
        return f"{one}, {one}"
    return (
        f"(SELECT value FROM {ts} WHERE id = {alias}.start_id), "
        f"(SELECT value FROM {ts} WHERE id = {alias}.end_id)"
    )


def _category(layout: str, t: dict[str, str]) -> str:
    if layout == "inline":
        return f"(SELECT string FROM {t['rocpd_string']} WHERE id = E.category_id)"
    return f"(SELECT name FROM {t['rocpd_info_category']} WHERE id = E.category_id)"


def _regions_sql(layout: str, t: dict[str, str]) -> str:
    common = (
        f"SELECT R.id, {_category(layout, t)}, N.string, {{pid}}, {{tid}}, "
        f"{_time_cols(layout, t, 'R')}, E.stack_id, E.correlation_id, E.extdata "
        f"FROM {t['rocpd_region']} R "
        f"LEFT JOIN {t['rocpd_event']} E ON E.id = R.event_id "
        f"LEFT JOIN {t['rocpd_string']} N ON N.id = R.name_id "
    )
    if layout == "inline":
        return common.format(pid="P.pid", tid="TH.tid") + (
            f"LEFT JOIN {t['rocpd_info_process']} P ON P.id = R.pid "
            f"LEFT JOIN {t['rocpd_info_thread']} TH ON TH.id = R.tid"
        )
    return common.format(pid="TR.pid", tid="TR.tid") + (
        f"LEFT JOIN {t['rocpd_track']} TR ON TR.id = R.track_id"
    )


def _samples_sql(layout: str, t: dict[str, str]) -> str:
    if layout == "inline":
        return (
            f"SELECT S.id, {_category(layout, t)}, "
            f"(SELECT string FROM {t['rocpd_string']} WHERE id = TR.name_id), P.pid, TH.tid, "
            f"{_time_cols(layout, t, 'S', True)}, E.stack_id, E.correlation_id, E.extdata "
            f"FROM {t['rocpd_sample']} S "
            f"LEFT JOIN {t['rocpd_event']} E ON E.id = S.event_id "
            f"LEFT JOIN {t['rocpd_track']} TR ON TR.id = S.track_id "
            f"LEFT JOIN {t['rocpd_info_process']} P ON P.id = TR.pid "
            f"LEFT JOIN {t['rocpd_info_thread']} TH ON TH.id = TR.tid"
        )
    return (
        f"SELECT S.id, {_category(layout, t)}, N.string, TR.pid, TR.tid, "
        f"{_time_cols(layout, t, 'S', True)}, E.stack_id, E.correlation_id, E.extdata "
        f"FROM {t['rocpd_sample']} S "
        f"LEFT JOIN {t['rocpd_event']} E ON E.id = S.event_id "
        f"LEFT JOIN {t['rocpd_string']} N ON N.id = S.name_id "
        f"LEFT JOIN {t['rocpd_track']} TR ON TR.id = S.track_id"
    )


def _kernels(db: _Db, layout: str, t: dict[str, str]) -> Iterator[GpuKernel]:
    if layout == "inline":
        cols = "A.logical_index, K.stream_id, K.queue_id, P.pid, TH.tid"
        joins = (
            f"LEFT JOIN {t['rocpd_info_agent']} A ON A.id = K.agent_id "
            f"LEFT JOIN {t['rocpd_info_process']} P ON P.id = K.pid "
            f"LEFT JOIN {t['rocpd_info_thread']} TH ON TH.id = K.tid"
        )
    else:
        cols = "A.logical_index, TR.stream_id, TR.queue_id, TR.pid, TR.tid"
        joins = (
            f"LEFT JOIN {t['rocpd_track']} TR ON TR.id = K.track_id "
            f"LEFT JOIN {t['rocpd_info_agent']} A ON A.id = TR.agent_id"
        )
    query = (
        f"SELECT K.id, coalesce(S.display_name, S.kernel_name), {_time_cols(layout, t, 'K')}, "
        f"{cols}, E.stack_id, E.correlation_id FROM {t['rocpd_kernel_dispatch']} K "
        f"LEFT JOIN {t['rocpd_info_kernel_symbol']} S ON S.id = K.kernel_id "
        f"LEFT JOIN {t['rocpd_event']} E ON E.id = K.event_id {joins}"
    )
    table = t["rocpd_kernel_dispatch"].strip('"')
    p = db.p
    for rid, name, start, end, dev, stream, queue, pid, tid, stack, ext in db.conn.execute(query):
        where = f"table {table} row id {rid}"
        start_ns, end_ns = _times(p, where, start, end)
        yield GpuKernel(
            name=_text(p, where, name, "display_name"),
            start_ns=start_ns,
            end_ns=end_ns,
            device=_int(p, where, dev, "agent logical_index"),
            stream=_int(p, where, stream, "stream_id"),
            correlation_id=_int(p, where, stack, "stack_id"),
            pid=_nz(_int(p, where, pid, "pid")),
            tid=_nz(_int(p, where, tid, "tid")),
            queue=_int(p, where, queue, "queue_id"),
            external_id=_nz(_int(p, where, ext, "correlation_id")),
        )
