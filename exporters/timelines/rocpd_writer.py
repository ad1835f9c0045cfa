"""Write rocpd databases: the probe's side-car, or any profile, in AMD's schema.

:func:`create_rocpd_db` makes an empty database with AMD's schema for a version (the
installed ROCm's SQL files, else the built-in tables: :mod:`exporters.timelines.rocpd_schema`)
and :func:`write_rocpd_regions` adds probe spans to it. ``rocpd merge`` / ``rocpd convert -i
rocprof.db probe.db`` then show both on one timeline::

    with create_rocpd_db("probe_results.db", "3") as db:
        write_rocpd_regions(db, spans)  # name, start_ns, end_ns, pid, tid, category
    profile = read_rocpd("probe_results.db")

How rows are filled follows rocprofv3's own writer (ROCm/rocprofiler-sdk
``source/lib/output/generateRocpd.cpp``): ``rocpd_event.stack_id`` holds the internal
correlation id and ``rocpd_event.correlation_id`` the external one (0 when none);
``info_process.id`` is the pid; an API record with start == end is a ``rocpd_sample``, not a
``rocpd_region``; a marker's text is extdata ``{"message": ...}``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import platform
import re
import socket
import sqlite3
import uuid as uuid_module
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from exporters.timelines.model import GpuKernel, HostCall, Marker, Profile
from exporters.timelines.rocpd_schema import DEFAULT_VERSION, RocpdSql, layout_of, schema_for

__all__ = [
    "CREATED_BY",
    "DEFAULT_SPAN_CATEGORY",
    "RegionSpan",
    "RocpdWriter",
    "create_rocpd_db",
    "write_rocpd_regions",
]

PathLike = str | os.PathLike[str]

CREATED_BY = "vllm-graph-probe exporters.timelines.rocpd_writer"
"""The ``created_by`` metadata row of every database this module writes."""

_GRID_COLUMNS = (
    "workgroup_size_x",
    "workgroup_size_y",
    "workgroup_size_z",
    "grid_size_x",
    "grid_size_y",
    "grid_size_z",
)

DEFAULT_SPAN_CATEGORY = "PROBE_MARKER"
"""Category for spans written without one. It contains ``MARKER`` so rocpd's marker views
(``markers``, ``rocpd2summary --region-categories``) pick the spans up."""

_GUID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z_-]*$")


class RegionSpan(Protocol):
    """What :func:`write_rocpd_regions` needs from a span: a named host interval.

    :class:`~exporters.profiles.Marker` satisfies it; so does any probe record type with
    these attributes. Times are ``CLOCK_BOOTTIME`` ns, the clock of rocprofv3.
    """

    @property
    def name(self) -> str: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def tid(self) -> int: ...
    @property
    def category(self) -> str: ...


def _machine_id() -> str:
    for candidate in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        with contextlib.suppress(OSError):
            text = Path(candidate).read_text(encoding="ascii").strip()
            if text:
                return text
    return uuid_module.UUID(int=uuid_module.getnode()).hex


_STRINGS_HELD = 1 << 16
"""Strings whose id is held in memory; past it they move to a private temporary database
(attached as ``probe_scratch``, never part of the file written) and are looked up there."""

_DEFERRED = ("rocpd_event", "rocpd_region", "rocpd_sample", "rocpd_kernel_dispatch")
"""The tables whose rows are written in batches (:meth:`RocpdWriter._defer`), in the order a
batch is written: an event before the rows that name it."""

_HOLD_ROWS = 16_384
"""Deferred rows held before they are written."""

_WRITER_CACHES = (
    "_deferring",
    "_strings",
    "_categories",
    "_processes",
    "_threads",
    "_thread_ids",
    "_tracks",
    "_agents",
    "_queues",
    "_streams",
    "_code_objects",
    "_symbols",
)


class RocpdWriter:
    """An open rocpd database being written by this project (see :func:`create_rocpd_db`).

    Add rows with :meth:`add_regions` (probe spans), :meth:`add_markers`,
    :meth:`add_host_calls`, :meth:`add_kernels` or :meth:`add_profile`; each call is one
    transaction. Close it (or use it as a context manager) when done.

    Rows follow rocprofv3's own writer: ``rocpd_info_process.id`` is the pid, a span with
    ``start_ns == end_ns`` is stored as a ``rocpd_sample``, ``rocpd_event.stack_id`` holds
    the (internal) correlation id and ``rocpd_event.correlation_id`` the external one.
    Kernel grid and workgroup sizes are not in the neutral model and are written as 0.
    Values the 3.x tables do not allow to be NULL are written as: unknown pid -> process
    0 (read back as ``None``), unknown tid/queue/stream -> 0.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        layout: str,
        guid: str,
        sfx: str,
        node_id: int,
        *,
        tmp: Path | None = None,
        schema: RocpdSql | None = None,
    ) -> None:
        self._conn = conn
        # ATTACH cannot run inside a transaction: here, before any row is written
        conn.execute("ATTACH DATABASE '' AS probe_scratch")
        self.path = path
        self.layout = layout
        self.guid = guid
        self.schema = schema
        self.uuid = sfx[1:]
        """The table suffix without its leading ``_`` (empty for unsuffixed tables)."""
        self._sfx = sfx
        self._tmp = tmp
        self._node_id = node_id
        self._strings: dict[str, int] = {}
        self._strings_moved = False  # some of them are in probe_scratch.strings
        self._categories: dict[str, int] = {}
        self._processes: set[int] = set()
        self._threads: dict[tuple[int, int], int] = {}
        self._thread_ids: set[int] = set()
        self._tracks: dict[tuple[Any, ...], int] = {}
        self._agents: dict[tuple[int, int | None], int] = {}
        self._queues: dict[int, int] = {}
        self._streams: dict[int, int] = {}
        self._code_objects: dict[int, int] = {}
        self._symbols: dict[tuple[int, str], int] = {}
        self._next_event = 1
        self._next_dispatch = 1
        self._closed = False
        #: rows written at the end of the transaction (:meth:`_defer`)
        self._pending: dict[tuple[str, tuple[str, ...]], list[tuple[Any, ...]]] = {}
        self._held = 0
        self._deferring: set[str] = set()  # the tables whose first row is written

    # -- context management

    def __enter__(self) -> RocpdWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()

    def close(self) -> None:
        """Commit, close and move the database onto its path (idempotent)."""
        if not self._closed:
            self._conn.commit()
            self._conn.close()
            self._closed = True
            if self._tmp is not None:
                os.replace(self._tmp, self.path)

    def discard(self) -> None:
        """Close without keeping anything: the temporary file is removed."""
        if not self._closed:
            self._conn.close()
            self._closed = True
            if self._tmp is not None:
                self._tmp.unlink(missing_ok=True)

    # -- public adders

    def add_regions(self, spans: Iterable[RegionSpan]) -> int:
        """Add host spans (probe phases, markers); returns how many were written.

        Each becomes a region (or a sample when ``start_ns == end_ns``) whose event has the
        span's category (:data:`DEFAULT_SPAN_CATEGORY` when empty) and extdata
        ``{"message": name}``, the way rocpd stores roctx messages.
        """
        n = 0
        with self._tx():
            for s in spans:
                if s.end_ns < s.start_ns:
                    raise ValueError(
                        f"span {s.name!r} ends ({s.end_ns}) before it starts ({s.start_ns})"
                    )
                self._host_row(
                    s.name,
                    s.category or DEFAULT_SPAN_CATEGORY,
                    s.start_ns,
                    s.end_ns,
                    s.pid,
                    s.tid,
                    None,
                    None,
                    message=s.name,
                )
                n += 1
        return n

    def add_markers(self, markers: Iterable[Marker]) -> int:
        """Add markers (roctx ranges and marks); the same storage as :meth:`add_regions`."""
        return self.add_regions(markers)

    def add_host_calls(self, calls: Iterable[HostCall]) -> int:
        """Add runtime API calls as regions whose category is the call's domain."""
        n = 0
        with self._tx():
            for c in calls:
                self._host_row(
                    c.name,
                    c.domain,
                    c.start_ns,
                    c.end_ns,
                    c.pid,
                    c.tid,
                    c.correlation_id,
                    c.external_id,
                    message=c.name if c.start_ns == c.end_ns else None,
                )
                n += 1
        return n

    def add_kernels(self, kernels: Iterable[GpuKernel]) -> int:
        """Add kernel dispatches (category ``KERNEL_DISPATCH``)."""
        n = 0
        with self._tx():
            for k in kernels:
                self._kernel_row(k)
                n += 1
        return n

    def add_profile(self, profile: Profile) -> None:
        """Add every kernel, host call and marker of an imported profile."""
        self.add_kernels(profile.kernels)
        self.add_host_calls(profile.host_calls)
        self.add_markers(profile.markers)

    # -- internals

    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        if self._closed:
            raise ValueError(f"rocpd database {self.path} is closed")
        # The id caches must roll back with the transaction, or later rows would point at
        # rows that were never committed.
        saved = {name: copy.copy(getattr(self, name)) for name in _WRITER_CACHES}
        counters = (self._next_event, self._next_dispatch)
        try:
            with self._conn:
                yield
                self._flush()
        except BaseException:
            for name, value in saved.items():
                setattr(self, name, value)
            self._next_event, self._next_dispatch = counters
            self._pending.clear()
            self._held = 0
            raise

    def _t(self, table: str) -> str:
        return f"`{table}{self._sfx}`"

    def _insert(self, table: str, values: Mapping[str, Any]) -> int:
        cols = ", ".join(f'"{c}"' for c in values)
        marks = ", ".join("?" for _ in values)
        cur = self._conn.execute(
            f"INSERT INTO {self._t(table)} ({cols}) VALUES ({marks})", tuple(values.values())
        )
        return int(cur.lastrowid or 0)

    def _defer(self, table: str, values: Mapping[str, Any]) -> None:
        """An ``INSERT`` whose row id nobody reads, held and written with its table's others
        in one ``executemany`` (:data:`_DEFERRED` order: an event before the rows naming
        it); every :data:`_HOLD_ROWS` rows, and at the end of the transaction."""
        if table not in self._deferring:
            # a table's first row goes in at once, as every row used to (after the rows
            # held, which it may name): the database's sqlite_sequence lists the tables in
            # the order they were first written
            self._flush()
            self._insert(table, values)
            self._deferring.add(table)
            return
        self._pending.setdefault((table, tuple(values)), []).append(tuple(values.values()))
        self._held += 1
        if self._held >= _HOLD_ROWS:
            self._flush()

    def _flush(self) -> None:
        for (table, cols), rows in sorted(
            self._pending.items(), key=lambda kv: _DEFERRED.index(kv[0][0])
        ):
            names = ", ".join(f'"{c}"' for c in cols)
            marks = ", ".join("?" for _ in cols)
            self._conn.executemany(f"INSERT INTO {self._t(table)} ({names}) VALUES ({marks})", rows)
        self._pending.clear()
        self._held = 0

    def _string(self, text: str) -> int:
        sid = self._strings.get(text)
        if sid is None:
            if self._strings_moved:
                row = self._conn.execute(
                    "SELECT id FROM probe_scratch.strings WHERE string = ?", (text,)
                ).fetchone()
                sid = None if row is None else int(row[0])
            if sid is None:
                sid = self._insert("rocpd_string", {"string": text})
            if len(self._strings) >= _STRINGS_HELD:
                self._move_strings()
            self._strings[text] = sid
        return sid

    def _move_strings(self) -> None:
        """The held string ids into the scratch database (memory stays bounded)."""
        if not self._strings_moved:
            # a private temporary database; DDL there is no part of the file written
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS probe_scratch.strings "
                "(string TEXT PRIMARY KEY, id INTEGER) WITHOUT ROWID"
            )
        self._conn.executemany(
            "INSERT OR REPLACE INTO probe_scratch.strings VALUES (?, ?)", self._strings.items()
        )
        self._strings.clear()
        self._strings_moved = True

    def _category(self, name: str) -> int:
        if self.layout == "inline":
            return self._string(name)
        cid = self._categories.get(name)
        if cid is None:
            cid = self._insert("rocpd_info_category", {"name": name})
            self._categories[name] = cid
        return cid

    def _process(self, pid: int) -> int:
        if pid not in self._processes:
            self._insert("rocpd_info_process", {"id": pid, "nid": self._node_id, "pid": pid})
            self._processes.add(pid)
        return pid

    def _thread(self, pid: int, tid: int) -> int:
        key = (pid, tid)
        row = self._threads.get(key)
        if row is None:
            self._process(pid)
            # rocprofv3 uses the tid as the row id; fall back when two pids share a tid.
            row = tid if tid not in self._thread_ids else max(self._thread_ids) + 1
            self._insert(
                "rocpd_info_thread", {"id": row, "nid": self._node_id, "pid": pid, "tid": tid}
            )
            self._thread_ids.add(row)
            self._threads[key] = row
        return row

    def _event(self, category: str, corr: int | None, external: int | None, extdata: str) -> int:
        eid = self._next_event
        self._next_event += 1
        self._defer(
            "rocpd_event",
            {
                "id": eid,
                "category_id": self._category(category),
                "stack_id": corr,
                "parent_stack_id": corr,
                "correlation_id": external or 0,
                "extdata": extdata,
            },
        )
        return eid

    def _track(self, key: tuple[Any, ...], values: Mapping[str, Any]) -> int:
        tid = self._tracks.get(key)
        if tid is None:
            tid = self._insert("rocpd_track", {"nid": self._node_id, **values})
            self._tracks[key] = tid
        return tid

    def _host_row(
        self,
        name: str,
        category: str,
        start: int,
        end: int,
        pid: int,
        tid: int,
        corr: int | None,
        external: int | None,
        *,
        message: str | None,
    ) -> None:
        extdata = _extdata(message) if message is not None else "{}"
        event = self._event(category, corr, external, extdata)
        thread_row = self._thread(pid, tid)
        if self.layout == "inline":
            if start == end:
                track = self._track(
                    ("host", pid, thread_row, category),
                    {"pid": pid, "tid": thread_row, "name_id": self._string(category)},
                )
                self._defer(
                    "rocpd_sample", {"track_id": track, "timestamp": start, "event_id": event}
                )
            else:
                self._defer(
                    "rocpd_region",
                    {
                        "nid": self._node_id,
                        "pid": pid,
                        "tid": thread_row,
                        "start": start,
                        "end": end,
                        "name_id": self._string(name),
                        "event_id": event,
                    },
                )
            return
        track = self._track(("host", pid, tid), {"pid": pid, "tid": tid})
        if start == end:
            self._defer(
                "rocpd_sample",
                {
                    "track_id": track,
                    "name_id": self._string(name),
                    "timestamp": start,
                    "event_id": event,
                },
            )
        else:
            self._defer(
                "rocpd_region",
                {
                    "track_id": track,
                    "name_id": self._string(name),
                    "start": start,
                    "end": end,
                    "event_id": event,
                },
            )

    def _agent(self, pid: int, device: int | None) -> int:
        key = (pid, device)
        aid = self._agents.get(key)
        if aid is None:
            aid = self._insert(
                "rocpd_info_agent",
                {"nid": self._node_id, "pid": pid, "type": "GPU", "logical_index": device},
            )
            self._agents[key] = aid
        return aid

    def _queue_or_stream(self, table: str, seen: dict[int, int], value: int, pid: int) -> None:
        owner = seen.get(value)
        if owner is None:
            kind = "Queue" if table == "rocpd_info_queue" else "Stream"
            self._insert(
                table, {"id": value, "nid": self._node_id, "pid": pid, "name": f"{kind} {value}"}
            )
            seen[value] = pid
        elif owner != pid and self.layout == "inline":
            raise ValueError(
                f"{table[len('rocpd_info_') :]} {value} is used by pids {owner} and {pid}; "
                "rocpd 3.x keys queues and streams by id, one process each"
            )

    def _symbol(self, pid: int, name: str) -> int:
        key = (pid, name)
        sid = self._symbols.get(key)
        if sid is None:
            co = self._code_objects.get(pid)
            if co is None:
                co = self._insert(
                    "rocpd_info_code_object",
                    {
                        "nid": self._node_id,
                        "pid": pid,
                        "extdata": json.dumps(
                            {"note": "placeholder: kernels imported without code objects"}
                        ),
                    },
                )
                self._code_objects[pid] = co
            sid = self._insert(
                "rocpd_info_kernel_symbol",
                {
                    "nid": self._node_id,
                    "pid": pid,
                    "code_object_id": co,
                    "kernel_name": name,
                    "display_name": name,
                },
            )
            self._symbols[key] = sid
        return sid

    def _kernel_row(self, k: GpuKernel) -> None:
        if k.end_ns < k.start_ns:
            raise ValueError(f"kernel {k.name!r} ends ({k.end_ns}) before it starts ({k.start_ns})")
        pid = 0 if k.pid is None else k.pid
        self._process(pid)
        agent = self._agent(pid, k.device)
        event = self._event("KERNEL_DISPATCH", k.correlation_id, k.external_id, "{}")
        dispatch = self._next_dispatch
        self._next_dispatch += 1
        common = {
            "kernel_id": self._symbol(pid, k.name),
            "dispatch_id": dispatch,
            "start": k.start_ns,
            "end": k.end_ns,
            **dict.fromkeys(_GRID_COLUMNS, 0),
            "region_name_id": self._string(""),
            "event_id": event,
        }
        if self.layout == "inline":
            queue = 0 if k.queue is None else k.queue
            stream = 0 if k.stream is None else k.stream
            self._queue_or_stream("rocpd_info_queue", self._queues, queue, pid)
            self._queue_or_stream("rocpd_info_stream", self._streams, stream, pid)
            thread_row = self._thread(pid, 0 if k.tid is None else k.tid)
            self._defer(
                "rocpd_kernel_dispatch",
                {
                    "nid": self._node_id,
                    "pid": pid,
                    "tid": thread_row,
                    "agent_id": agent,
                    "queue_id": queue,
                    "stream_id": stream,
                    **common,
                },
            )
            return
        if k.queue is not None:
            self._queue_or_stream("rocpd_info_queue", self._queues, k.queue, pid)
        if k.stream is not None:
            self._queue_or_stream("rocpd_info_stream", self._streams, k.stream, pid)
        if k.tid is not None:
            self._thread(pid, k.tid)
        track = self._track(
            ("gpu", k.pid, k.tid, agent, k.queue, k.stream),
            {
                "pid": k.pid,
                "tid": k.tid,
                "agent_id": agent,
                "queue_id": k.queue,
                "stream_id": k.stream,
            },
        )
        self._defer("rocpd_kernel_dispatch", {"track_id": track, **common})


@functools.lru_cache(maxsize=4096)
def _extdata(message: str) -> str:
    """An event's extdata of a message (a span's name: few distinct), as rocpd stores it."""
    return json.dumps({"message": message})


def _node_hash(machine_id: str) -> int:
    # rocprofv3 uses std::hash (implementation-defined); any stable 63-bit value will do.
    digest = hashlib.sha256(machine_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % (2**63 - 1)


def create_rocpd_db(
    path: PathLike,
    version: str = DEFAULT_VERSION,
    guid: str | None = None,
    *,
    sql: RocpdSql | None = None,
    sql_dir: PathLike | None = None,
    machine_id: str | None = None,
    hostname: str | None = None,
    overwrite: bool = False,
) -> RocpdWriter:
    """Create an empty rocpd database of schema ``version`` and return its writer.

    The schema is ``sql`` when given, else AMD's SQL files from ``sql_dir``, else those of
    an installed ROCm, else the built-in tables (:func:`~exporters.timelines.rocpd_schema.
    schema_for`). ``version`` is a 3.x version (``nid``/``pid``/``tid`` on every row) or a
    4.1.x one (``rocpd_track`` based). ``guid`` identifies the database (default: a random
    UUID); 3.x tables are named ``<table>_<guid with - as _>`` as rocprofv3 names them.
    ``rocpd_metadata`` holds ``schema_version``, ``uuid``, ``guid`` and a ``created_by`` row
    naming this project. ``machine_id`` (default ``/etc/machine-id``) and ``hostname`` fill
    ``rocpd_info_node``; pass the values of the rocprof database to share its node.

    The database is written to a temporary file beside ``path`` and renamed onto it when
    the writer closes without error, so a failed write leaves nothing behind. Raises
    ``ValueError`` for a version it cannot write or a guid that is not ``[0-9A-Za-z_-]``,
    ``FileExistsError`` when ``path`` exists and ``overwrite`` is false, and
    ``IsADirectoryError`` when it is not a regular file.
    """
    schema = sql or schema_for(version, sql_dir=sql_dir)
    layout = layout_of(schema.version)
    if layout not in ("inline", "track"):
        raise ValueError(
            f"cannot write rocpd schema version {schema.version!r}: the writer knows the 3.x "
            "and 4.1.x layouts"
        )
    guid = guid or str(uuid_module.uuid4())
    if not _GUID.match(guid):
        raise ValueError(f"guid {guid!r} must be letters, digits, '-' and '_' (it names tables)")
    p = Path(path)
    if p.exists() or p.is_symlink():
        if not p.is_file():
            raise IsADirectoryError(f"{p} exists and is not a regular file")
        if not overwrite:
            raise FileExistsError(f"{p} exists; pass overwrite=True to replace it")
    uuid = guid.replace("-", "_") if schema.suffixed else ""
    sfx = f"_{uuid}" if uuid else ""
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    os.close(fd)
    conn = sqlite3.connect(tmp)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.executescript(schema.script(uuid, guid))
        mid = machine_id or _machine_id()
        node_hash = _node_hash(mid)
        node_id = node_hash % (2**32 - 1)
        uname = platform.uname()
        meta = f"`rocpd_metadata{sfx}`"
        with conn:
            have = {str(t) for (t,) in conn.execute(f"SELECT tag FROM {meta}")}
            rows = [("schema_version", schema.version), ("uuid", sfx), ("guid", guid)]
            conn.executemany(
                f'INSERT INTO {meta} ("tag", "value") VALUES (?, ?)',
                [r for r in rows if r[0] not in have] + [("created_by", CREATED_BY)],
            )
            conn.execute(
                f"INSERT INTO `rocpd_info_node{sfx}` "
                '("id", "hash", "machine_id", "system_name", "hostname", "release", "version", '
                '"hardware_name") VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
                (
                    node_id,
                    node_hash,
                    mid,
                    uname.system,
                    hostname if hostname is not None else socket.gethostname(),
                    uname.release,
                    uname.version,
                    uname.machine,
                ),
            )
    except BaseException:
        conn.close()
        tmp.unlink(missing_ok=True)
        raise
    writer = RocpdWriter(conn, p, layout, guid, sfx, node_id, tmp=tmp, schema=schema)
    with writer._tx():
        writer._string("")  # rocprofv3 always has the empty string (kernel region names)
    return writer


def write_rocpd_regions(db: RocpdWriter, spans: Iterable[RegionSpan]) -> int:
    """Add probe spans to a rocpd side-car database; returns how many were written.

    ``spans`` are anything with ``name``, ``start_ns``, ``end_ns``, ``pid``, ``tid`` and
    ``category`` (:class:`RegionSpan`). See :meth:`RocpdWriter.add_regions`.
    """
    return db.add_regions(spans)


# =========================================================================== rocpd reader
