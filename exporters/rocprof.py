"""rocprofv3 and rocpd: read AMD profiles, write a rocpd side-car, emit roctx ranges live.

Readers (all return a :class:`~exporters.profiles.Profile` on ``CLOCK_BOOTTIME``):

- :func:`read_rocprofv3_csv` reads ``kernel_trace.csv`` (old and new column sets),
  ``hip_api_trace.csv`` / ``hip_trace.csv`` / ``hip_runtime_trace.csv`` / ``hsa_api_trace.csv``,
  ``marker_api_trace.csv`` and the ``rocpd convert`` CSVs that carry a leading ``Guid``.
- :func:`read_rocprofv3_json` reads ``rocprofv3 --output-format json`` (``.json``/``.json.gz``).
- :func:`read_rocpd` reads a rocpd SQLite database (``*_results.db``) through its views,
  schema 3.x (``nid``/``pid``/``tid`` inline) or 4.1.x (``rocpd_track`` based).

Writer: :func:`create_rocpd_db` makes an empty database with the published rocpd schema
(tables suffixed with the database uuid, un-suffixed views over them), and
:func:`write_rocpd_regions` adds probe spans to it. ``rocpd merge`` / ``rocpd convert -i
rocprof.db probe.db`` then show both on one timeline::

    with create_rocpd_db("probe_results.db", layout="3.0.0") as db:
        write_rocpd_regions(db, spans)  # name, start_ns, end_ns, pid, tid, category
    profile = read_rocpd("probe_results.db")

Live: :class:`RoctxEmitter` pushes and pops roctx ranges so that ``rocprofv3 --marker-trace``
records them in the same database as the kernels. The ``roctx`` module ships with ROCm's
rocprofiler-sdk (``/opt/rocm/lib/pythonX.Y/site-packages``), not on PyPI; it is imported
only when an emitter is created.

The module uses only the standard library (``csv``, ``json``, ``sqlite3``).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import hashlib
import json
import os
import platform
import re
import socket
import sqlite3
import struct
import uuid as uuid_module
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from exporters.profiles import (
    CLOCK_BOOTTIME,
    GpuKernel,
    HostCall,
    Marker,
    Profile,
    ProfileError,
    read_json_document,
)

__all__ = [
    "DEFAULT_SPAN_CATEGORY",
    "ROCPD_LAYOUTS",
    "RegionSpan",
    "RocpdWriter",
    "RoctxEmitter",
    "RoctxUnavailableError",
    "create_rocpd_db",
    "read_rocpd",
    "read_rocprofv3_csv",
    "read_rocprofv3_json",
    "write_rocpd_regions",
]

PathLike = str | os.PathLike[str]

# =========================================================================== CSV

_KERNEL_COLUMNS = (
    "Kernel_Name",
    "Agent_Id",
    "Queue_Id",
    "Thread_Id",
    "Correlation_Id",
    "Start_Timestamp",
    "End_Timestamp",
)
_API_COLUMNS = (
    "Domain",
    "Function",
    "Process_Id",
    "Thread_Id",
    "Correlation_Id",
    "Start_Timestamp",
    "End_Timestamp",
)
_KERNEL_FILE_HINTS = ("kernel_trace", "kernel_dispatch")
_API_FILE_HINTS = ("api_trace", "hip_trace", "runtime_trace", "marker_trace", "regions")
_AGENT_INDEX = re.compile(r"(-?\d+)\s*$")


def _is_marker_domain(domain: str) -> bool:
    return "MARKER" in domain.upper()


def _csv_kind(path: Path, header: Sequence[str]) -> str | None:
    """Classify a CSV as a kernel trace, an API trace, or neither (by name, then header)."""
    name = path.name.lower()
    cols = set(header)
    if "counter_collection" in name or "Counter_Name" in cols:
        return None  # one row per counter per dispatch, not a dispatch trace
    if any(h in name for h in _KERNEL_FILE_HINTS):
        return "kernel"
    if any(h in name for h in _API_FILE_HINTS):
        return "api"
    if "Kernel_Name" in cols and "Dispatch_Id" in cols:
        return "kernel"
    if "Domain" in cols and "Function" in cols:
        return "api"
    return None


class _CsvRows:
    """One CSV file: its header, then its rows streamed as dicts, with typed accessors
    whose errors name the file, line and column."""

    def __init__(self, path: Path) -> None:
        self.path = path
        header: list[str] = []
        with self._reader() as reader:
            for row in reader:
                header = [h.strip() for h in row]
                break
        if not any(header):
            raise ProfileError(path, "empty file, no header row")
        self.header = header

    @contextlib.contextmanager
    def _reader(self) -> Iterator[Iterator[list[str]]]:
        try:
            with self.path.open(newline="", encoding="utf-8-sig") as fh:
                yield csv.reader(fh)
        except FileNotFoundError as exc:
            raise ProfileError(self.path, "no such file") from exc
        except UnicodeDecodeError as exc:
            raise ProfileError(self.path, f"not a CSV text file: not UTF-8 ({exc.reason})") from exc
        except csv.Error as exc:
            raise ProfileError(self.path, f"malformed CSV: {exc}") from exc
        except OSError as exc:
            raise ProfileError(self.path, f"cannot read file: {exc.strerror or exc}") from exc

    def rows(self) -> Iterator[tuple[int, dict[str, str]]]:
        """``(line number, {column: text})`` for each non-blank data row."""
        width = len(self.header)
        with self._reader() as reader:
            for lineno, row in enumerate(reader, start=1):
                if lineno == 1 or not any(cell.strip() for cell in row):
                    continue
                if len(row) != width:
                    raise ProfileError(
                        self.path,
                        f"line {lineno} has {len(row)} fields but the header has {width} "
                        "(truncated or malformed row)",
                    )
                yield lineno, dict(zip(self.header, row, strict=True))

    def require(self, columns: Sequence[str], what: str) -> None:
        missing = [c for c in columns if c not in self.header]
        if missing:
            raise ProfileError(
                self.path,
                f"missing required column(s) for a rocprofv3 {what}: {', '.join(missing)} "
                f"(header has: {', '.join(self.header)})",
            )

    def integer(self, lineno: int, row: Mapping[str, str], column: str) -> int:
        value = row[column].strip()
        try:
            return int(value)
        except ValueError:
            raise ProfileError(
                self.path, f"line {lineno}, column {column}: {value!r} is not an integer"
            ) from None

    def optional_integer(self, lineno: int, row: Mapping[str, str], column: str) -> int | None:
        if column not in row or not row[column].strip():
            return None
        return self.integer(lineno, row, column)

    def agent(self, lineno: int, row: Mapping[str, str], column: str) -> int | None:
        value = row[column].strip()
        if not value:
            return None
        match = _AGENT_INDEX.search(value)
        if match is None:
            raise ProfileError(
                self.path,
                f"line {lineno}, column {column}: {value!r} is neither a number nor 'Agent N'",
            )
        return int(match.group(1))


def _expand_csv_inputs(paths_or_dir: PathLike | Iterable[PathLike]) -> tuple[list[Path], bool]:
    """Return the CSV files to read and whether they came from a directory scan."""
    if isinstance(paths_or_dir, str | os.PathLike):
        items = [Path(paths_or_dir)]
    else:
        items = [Path(p) for p in paths_or_dir]
    files: list[Path] = []
    scanned = False
    for item in items:
        if item.is_dir():
            scanned = True
            files.extend(sorted(p for p in item.iterdir() if p.suffix.lower() == ".csv"))
        else:
            files.append(item)
    return files, scanned


def read_rocprofv3_csv(paths_or_dir: PathLike | Iterable[PathLike]) -> Profile:
    """Read rocprofv3 (or ``rocpd convert``) CSV traces into one profile.

    ``paths_or_dir`` is a directory, one file, or several files/directories. Files are
    classified by name (``*kernel_trace*``, ``*api_trace*``, ``*hip_trace*``...) and then
    by header, so any output prefix (``<pid>_kernel_trace.csv``) works:

    - kernel traces: both column sets (ROCm 6.2 ``Private_Segment_Size``, no
      ``Stream_Id``, numeric ``Agent_Id``; ROCm 6.4+ ``Stream_Id``, ``"Agent N"``);
    - API traces (``Domain,Function,Process_Id,...``): HIP/HSA/RCCL calls become
      :class:`HostCall`, ``MARKER_*`` domains (roctx) become :class:`Marker`;
    - an optional leading ``Guid`` column (``rocpd convert``) and fully quoted files.

    In a directory, CSVs that are neither (memory copies, stats, counters) are skipped and
    listed in ``meta["skipped_files"]``; a file named explicitly must be a trace. Kernel
    rows carry no process id; when the API rows show exactly one pid for the kernel's
    thread id, that pid is used (``meta["kernel_pid_from_api_rows"]``), otherwise it is
    ``None``.

    Raises :class:`ProfileError` naming the file for a missing file, missing columns (it
    lists them), a row with the wrong number of fields or a non-integer field.
    """
    files, scanned = _expand_csv_inputs(paths_or_dir)
    kernel_tables: list[_CsvRows] = []
    api_tables: list[_CsvRows] = []
    read_files: list[str] = []
    skipped: list[str] = []
    for path in files:
        table = _CsvRows(path)
        kind = _csv_kind(path, table.header)
        if kind is None:
            if scanned:
                skipped.append(str(path))
                continue
            raise ProfileError(
                path,
                "not a rocprofv3 kernel or API trace: expected the columns "
                f"{', '.join(_KERNEL_COLUMNS)} or {', '.join(_API_COLUMNS)} "
                f"(header has: {', '.join(table.header)})",
            )
        if kind == "kernel":
            table.require(_KERNEL_COLUMNS, "kernel trace")
            kernel_tables.append(table)
        else:
            table.require(_API_COLUMNS, "API trace")
            api_tables.append(table)
        read_files.append(str(path))
    if not read_files:
        where = ", ".join(str(f) for f in files) or str(paths_or_dir)
        raise ProfileError(
            str(paths_or_dir),
            f"no rocprofv3 kernel or API trace CSV found (looked at: {where})",
        )

    host_calls: list[HostCall] = []
    markers: list[Marker] = []
    guids: set[str] = set()
    tid_pids: dict[int, set[int]] = {}
    # API rows first: they tell which process each launching thread belongs to.
    for table in api_tables:
        has_guid = "Guid" in table.header
        for lineno, row in table.rows():
            if has_guid and row["Guid"]:
                guids.add(row["Guid"])
            domain = row["Domain"].strip()
            pid = table.integer(lineno, row, "Process_Id")
            tid = table.integer(lineno, row, "Thread_Id")
            start = table.integer(lineno, row, "Start_Timestamp")
            end = table.integer(lineno, row, "End_Timestamp")
            if _is_marker_domain(domain):
                markers.append(Marker(row["Function"], start, end, pid, tid, domain))
                continue
            tid_pids.setdefault(tid, set()).add(pid)
            host_calls.append(
                HostCall(
                    name=row["Function"],
                    domain=domain,
                    start_ns=start,
                    end_ns=end,
                    pid=pid,
                    tid=tid,
                    correlation_id=table.optional_integer(lineno, row, "Correlation_Id"),
                )
            )

    inferred = 0
    kernels: list[GpuKernel] = []
    kernel_column_sets: set[str] = set()
    for table in kernel_tables:
        kernel_column_sets.add("new" if "Stream_Id" in table.header else "old")
        has_guid = "Guid" in table.header
        for lineno, row in table.rows():
            if has_guid and row["Guid"]:
                guids.add(row["Guid"])
            tid = table.integer(lineno, row, "Thread_Id")
            kernel_pid = table.optional_integer(lineno, row, "Process_Id")
            if kernel_pid is None:
                pids = tid_pids.get(tid, set())
                if len(pids) == 1:
                    kernel_pid = next(iter(pids))
                    inferred += 1
            kernels.append(
                GpuKernel(
                    name=row["Kernel_Name"],
                    start_ns=table.integer(lineno, row, "Start_Timestamp"),
                    end_ns=table.integer(lineno, row, "End_Timestamp"),
                    device=table.agent(lineno, row, "Agent_Id"),
                    stream=table.optional_integer(lineno, row, "Stream_Id"),
                    correlation_id=table.optional_integer(lineno, row, "Correlation_Id"),
                    pid=kernel_pid,
                    tid=tid,
                    queue=table.optional_integer(lineno, row, "Queue_Id"),
                )
            )

    meta: dict[str, Any] = {
        "files": read_files,
        "skipped_files": skipped,
        "kernel_column_sets": sorted(kernel_column_sets),
        "kernel_pid_from_api_rows": inferred,
    }
    if guids:
        meta["guids"] = sorted(guids)
    return Profile.build("rocprofv3-csv", CLOCK_BOOTTIME, kernels, host_calls, markers, meta)


# =========================================================================== JSON


def _dig(path: Path, where: str, obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...`` or a ProfileError that names the record and the missing key."""
    cur = obj
    for i, key in enumerate(keys):
        if not isinstance(cur, dict) or key not in cur:
            dotted = ".".join(keys[: i + 1])
            raise ProfileError(path, f"{where}: missing field {dotted!r}")
        cur = cur[key]
    return cur


def _dig_int(path: Path, where: str, obj: Any, *keys: str) -> int:
    value = _dig(path, where, obj, *keys)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(path, f"{where}: field {'.'.join(keys)!r} is not an integer")
    return value


def _key_value_map(raw: Any) -> dict[int, str]:
    """cereal writes ``std::map`` as ``[{"key": k, "value": v}, ...]``; accept a dict too."""
    out: dict[int, str] = {}
    if isinstance(raw, dict):
        for k, v in raw.items():
            with contextlib.suppress(ValueError):
                out[int(k)] = str(v)
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict) and "key" in item and "value" in item:
                with contextlib.suppress(TypeError, ValueError):
                    out[int(item["key"])] = str(item["value"])
    return out


def _external(value: Any) -> int | None:
    if isinstance(value, dict):  # some versions nest {"value": n}
        value = value.get("value")
    if isinstance(value, int) and not isinstance(value, bool) and value != 0:
        return value
    return None


def _op_names(kinds: Sequence[Any], kind: int, operation: int) -> tuple[str, str]:
    """Domain and operation names from ``strings.buffer_records`` (indexed by enum value)."""
    if 0 <= kind < len(kinds) and isinstance(kinds[kind], dict):
        domain = str(kinds[kind].get("kind", kind))
        ops = kinds[kind].get("operations") or []
        op = str(ops[operation]) if 0 <= operation < len(ops) else str(operation)
        return domain, op
    return str(kind), str(operation)


def read_rocprofv3_json(path: PathLike) -> Profile:
    """Read ``rocprofv3 --output-format json`` output (``.json`` or ``.json.gz``).

    Kernel dispatches (``buffer_records.kernel_dispatch``) are named through
    ``kernel_symbols`` (``formatted_kernel_name``, the name rocprofv3 writes to CSV);
    ``device`` is the agent's ``logical_node_id`` (the ``Agent N`` of rocprofv3's default
    CSV), ``queue``/``stream`` are the queue and stream handles, and ``correlation_id`` the
    internal correlation id. HIP/HSA/RCCL API records become host calls and marker
    records become markers (named by ``strings.marker_api``) when the capture has them;
    operation and domain names come from ``strings.buffer_records``. One file may hold
    several processes; all are merged.

    Raises :class:`ProfileError` for a file that is not JSON, not rocprofv3 output (no
    ``rocprofiler-sdk-tool`` key) or has a record without a required field.
    """
    p = Path(path)
    doc = read_json_document(p)
    if not isinstance(doc, dict) or "rocprofiler-sdk-tool" not in doc:
        raise ProfileError(p, "not rocprofv3 JSON output: no top-level 'rocprofiler-sdk-tool' key")
    entries = doc["rocprofiler-sdk-tool"]
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        raise ProfileError(p, "'rocprofiler-sdk-tool' holds no process records")

    kernels: list[GpuKernel] = []
    host_calls: list[HostCall] = []
    markers: list[Marker] = []
    processes: list[dict[str, Any]] = []
    unresolved = 0
    skipped_markers = 0

    for n, entry in enumerate(entries):
        where = f"rocprofiler-sdk-tool[{n}]"
        pid = _dig_int(p, where, entry, "metadata", "pid")
        agents: dict[int, dict[str, Any]] = {}
        for a in _dig(p, where, entry, "agents") or []:
            handle = _dig_int(p, f"{where}.agents", a, "id", "handle")
            agents[handle] = a
        symbols_raw = entry.get("kernel_symbols") or []
        symbols = symbols_raw.values() if isinstance(symbols_raw, dict) else symbols_raw
        names: dict[int, str] = {}
        for s in symbols:
            if isinstance(s, dict) and isinstance(s.get("kernel_id"), int):
                names[s["kernel_id"]] = (
                    s.get("formatted_kernel_name")
                    or s.get("demangled_kernel_name")
                    or s.get("kernel_name")
                    or ""
                )
        strings = entry.get("strings") or {}
        kinds = strings.get("buffer_records") or []
        messages = _key_value_map(strings.get("marker_api"))
        records = _dig(p, where, entry, "buffer_records")

        for i, rec in enumerate(records.get("kernel_dispatch") or []):
            rw = f"{where}.buffer_records.kernel_dispatch[{i}]"
            kernel_id = _dig_int(p, rw, rec, "dispatch_info", "kernel_id")
            name = names.get(kernel_id)
            if not name:
                unresolved += 1
                name = "unknown_kernel"
            agent = agents.get(_dig_int(p, rw, rec, "dispatch_info", "agent_id", "handle"), {})
            device = agent.get("logical_node_id", agent.get("node_id"))
            stream = rec.get("stream_id")
            kernels.append(
                GpuKernel(
                    name=name,
                    start_ns=_dig_int(p, rw, rec, "start_timestamp"),
                    end_ns=_dig_int(p, rw, rec, "end_timestamp"),
                    device=device if isinstance(device, int) else None,
                    stream=stream.get("handle") if isinstance(stream, dict) else None,
                    correlation_id=_dig_int(p, rw, rec, "correlation_id", "internal"),
                    pid=pid,
                    tid=_dig_int(p, rw, rec, "thread_id"),
                    queue=_dig_int(p, rw, rec, "dispatch_info", "queue_id", "handle"),
                    external_id=_external(rec["correlation_id"].get("external")),
                )
            )

        for section in ("hip_api", "hsa_api", "rccl_api", "marker_api"):
            for i, rec in enumerate(records.get(section) or []):
                rw = f"{where}.buffer_records.{section}[{i}]"
                domain, op = _op_names(
                    kinds, _dig_int(p, rw, rec, "kind"), _dig_int(p, rw, rec, "operation")
                )
                corr = _dig_int(p, rw, rec, "correlation_id", "internal")
                start = _dig_int(p, rw, rec, "start_timestamp")
                end = _dig_int(p, rw, rec, "end_timestamp")
                tid = _dig_int(p, rw, rec, "thread_id")
                if section == "marker_api":
                    message = messages.get(corr)
                    if message is None:  # pops and thread-id queries carry no message
                        skipped_markers += 1
                        continue
                    markers.append(Marker(message, start, end, pid, tid, domain))
                    continue
                host_calls.append(
                    HostCall(
                        op,
                        domain,
                        start,
                        end,
                        pid,
                        tid,
                        corr,
                        _external(rec["correlation_id"].get("external")),
                    )
                )

        meta_entry = entry.get("metadata") or {}
        processes.append(
            {
                "pid": pid,
                "command": meta_entry.get("command"),
                "hostname": (meta_entry.get("node") or {}).get("hostname"),
                "agents": [
                    {
                        "handle": h,
                        "type": a.get("type"),
                        "node_id": a.get("node_id"),
                        "logical_node_id": a.get("logical_node_id"),
                        "name": a.get("name"),
                        "product_name": a.get("product_name"),
                    }
                    for h, a in sorted(agents.items())
                ],
            }
        )

    meta = {
        "path": str(p),
        "processes": processes,
        "unresolved_kernel_ids": unresolved,
        "marker_records_without_message": skipped_markers,
    }
    return Profile.build("rocprofv3-json", CLOCK_BOOTTIME, kernels, host_calls, markers, meta)


# =========================================================================== rocpd schema
#
# The DDL below is written from the public rocpd schema files of rocprofiler-sdk (MIT):
#   layout "3.0.0" (nid/pid/tid inline):
#     ROCm/rocm-systems projects/rocprofiler-sdk/source/share/rocprofiler-sdk-rocpd/
#       versions/3.0.0/rocpd_tables.sql @ 0c5fd9ba (the 20 tables of rocpd_tables.sql
#       @ 1b1610fc; the later rocpd_event_operation table is left out, its published DDL
#       declares "type_id" twice, which SQLite rejects), versions/3.0.0/rocpd_views.sql
#       @ d4c91d65, and the regions/samples/kernels views of data_views.sql @ 4afa0d44;
#       rocpd_metadata.sql @ 25cd7e5b (ROCm/rocprofiler-sdk) for the metadata rows.
#   layout "4.1.0" (rocpd_track based):
#     same directory, versions/4.1.0/rocpd_tables.sql @ a195360b and
#     versions/4.1.0/data_views.sql @ b9871a31 (tracks/events/regions/samples/kernels).
# How rows are filled follows rocprofv3's own writer, ROCm/rocprofiler-sdk
# source/lib/output/generateRocpd.cpp @ 02b3987d: "{{uuid}}" becomes "_" + uuid (the guid
# with '-' -> '_'); rocpd_event.stack_id holds the internal correlation id and
# rocpd_event.correlation_id the external one (0 when none); info_process.id is the pid;
# an API record with start == end is a rocpd_sample, not a rocpd_region; a marker's text
# is extdata {"message": ...}.

ROCPD_LAYOUTS = ("3.0.0", "4.1.0")
"""Schema layouts :func:`create_rocpd_db` can write and :func:`read_rocpd` can read."""

# (table, columns, foreign keys). Every table but rocpd_metadata also gets the leading
# "id" (autoincrement primary key) and "guid" columns. Foreign keys: (column, table).
_TableSpec = tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]

_NODE_PROC = (("nid", "rocpd_info_node"), ("pid", "rocpd_info_process"))


def _spec_3_0_0() -> list[_TableSpec]:
    return [
        (
            "rocpd_info_node",
            (
                "hash BIGINT NOT NULL UNIQUE",
                "machine_id TEXT NOT NULL UNIQUE",
                "system_name TEXT",
                "hostname TEXT",
                "release TEXT",
                "version TEXT",
                "hardware_name TEXT",
                "domain_name TEXT",
            ),
            (),
        ),
        (
            "rocpd_info_process",
            (
                "nid INTEGER NOT NULL",
                "ppid INTEGER",
                "pid INTEGER NOT NULL",
                "init BIGINT",
                "fini BIGINT",
                "start BIGINT",
                "end BIGINT",
                "command TEXT",
                "environment JSONB DEFAULT '{}' NOT NULL",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (("nid", "rocpd_info_node"),),
        ),
        (
            "rocpd_info_thread",
            (
                "nid INTEGER NOT NULL",
                "ppid INTEGER",
                "pid INTEGER NOT NULL",
                "tid INTEGER NOT NULL",
                "name TEXT",
                "start BIGINT",
                "end BIGINT",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            _NODE_PROC,
        ),
        (
            "rocpd_info_agent",
            (
                "nid INTEGER NOT NULL",
                "pid INTEGER NOT NULL",
                "type TEXT CHECK (\"type\" IN ('CPU', 'GPU'))",
                "absolute_index INTEGER",
                "logical_index INTEGER",
                "type_index INTEGER",
                "uuid INTEGER",
                "name TEXT",
                "model_name TEXT",
                "vendor_name TEXT",
                "product_name TEXT",
                "user_name TEXT",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            _NODE_PROC,
        ),
        _info_named("rocpd_info_queue"),
        _info_named("rocpd_info_stream"),
        _pmc_spec(qualifier=False),
        _code_object_spec(),
        _kernel_symbol_spec(),
        (
            "rocpd_track",
            (
                "nid INTEGER NOT NULL",
                "pid INTEGER",
                "tid INTEGER",
                "name_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (*_NODE_PROC, ("tid", "rocpd_info_thread"), ("name_id", "rocpd_string")),
        ),
        (
            "rocpd_event",
            (
                "category_id INTEGER",
                "stack_id INTEGER",
                "parent_stack_id INTEGER",
                "correlation_id INTEGER",
                "call_stack JSONB DEFAULT '{}' NOT NULL",
                "line_info JSONB DEFAULT '{}' NOT NULL",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (("category_id", "rocpd_string"),),
        ),
        _arg_spec(),
        _pmc_event_spec(),
        (
            "rocpd_region",
            (
                "nid INTEGER NOT NULL",
                "pid INTEGER NOT NULL",
                "tid INTEGER NOT NULL",
                "start BIGINT NOT NULL",
                "end BIGINT NOT NULL",
                "name_id INTEGER NOT NULL",
                "event_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (
                *_NODE_PROC,
                ("tid", "rocpd_info_thread"),
                ("name_id", "rocpd_string"),
                ("event_id", "rocpd_event"),
            ),
        ),
        (
            "rocpd_sample",
            (
                "track_id INTEGER NOT NULL",
                "timestamp BIGINT NOT NULL",
                "event_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (("track_id", "rocpd_track"), ("event_id", "rocpd_event")),
        ),
        (
            "rocpd_kernel_dispatch",
            (
                "nid INTEGER NOT NULL",
                "pid INTEGER NOT NULL",
                "tid INTEGER",
                "agent_id INTEGER NOT NULL",
                "kernel_id INTEGER NOT NULL",
                "dispatch_id INTEGER NOT NULL",
                "queue_id INTEGER NOT NULL",
                "stream_id INTEGER NOT NULL",
                "start BIGINT NOT NULL",
                "end BIGINT NOT NULL",
                "private_segment_size INTEGER",
                "group_segment_size INTEGER",
                *_GRID_COLUMNS,
                "region_name_id INTEGER",
                "event_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (
                *_NODE_PROC,
                ("tid", "rocpd_info_thread"),
                ("agent_id", "rocpd_info_agent"),
                ("kernel_id", "rocpd_info_kernel_symbol"),
                ("queue_id", "rocpd_info_queue"),
                ("stream_id", "rocpd_info_stream"),
                ("region_name_id", "rocpd_string"),
                ("event_id", "rocpd_event"),
            ),
        ),
        (
            "rocpd_memory_copy",
            (
                "nid INTEGER NOT NULL",
                "pid INTEGER NOT NULL",
                "tid INTEGER",
                "start BIGINT NOT NULL",
                "end BIGINT NOT NULL",
                "name_id INTEGER NOT NULL",
                "dst_agent_id INTEGER",
                "dst_address INTEGER",
                "src_agent_id INTEGER",
                "src_address INTEGER",
                "size INTEGER NOT NULL",
                "queue_id INTEGER",
                "stream_id INTEGER",
                "region_name_id INTEGER",
                "event_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (
                *_NODE_PROC,
                ("tid", "rocpd_info_thread"),
                ("name_id", "rocpd_string"),
                ("dst_agent_id", "rocpd_info_agent"),
                ("src_agent_id", "rocpd_info_agent"),
                ("stream_id", "rocpd_info_stream"),
                ("queue_id", "rocpd_info_queue"),
                ("region_name_id", "rocpd_string"),
                ("event_id", "rocpd_event"),
            ),
        ),
        (
            "rocpd_memory_allocate",
            (
                "nid INTEGER NOT NULL",
                "pid INTEGER NOT NULL",
                "tid INTEGER",
                "agent_id INTEGER",
                *_ALLOC_TYPE_LEVEL,
                "start BIGINT NOT NULL",
                "end BIGINT NOT NULL",
                "address INTEGER",
                "size INTEGER NOT NULL",
                "queue_id INTEGER",
                "stream_id INTEGER",
                "event_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (
                *_NODE_PROC,
                ("tid", "rocpd_info_thread"),
                ("agent_id", "rocpd_info_agent"),
                ("stream_id", "rocpd_info_stream"),
                ("queue_id", "rocpd_info_queue"),
                ("event_id", "rocpd_event"),
            ),
        ),
    ]


_GRID_COLUMNS = (
    "workgroup_size_x INTEGER NOT NULL",
    "workgroup_size_y INTEGER NOT NULL",
    "workgroup_size_z INTEGER NOT NULL",
    "grid_size_x INTEGER NOT NULL",
    "grid_size_y INTEGER NOT NULL",
    "grid_size_z INTEGER NOT NULL",
)
_ALLOC_TYPE_LEVEL = (
    "type TEXT CHECK (\"type\" IN ('ALLOC', 'FREE', 'REALLOC', 'RECLAIM'))",
    "level TEXT CHECK (\"level\" IN ('REAL', 'VIRTUAL', 'SCRATCH'))",
)


def _info_named(table: str, name_col: str = "name TEXT") -> _TableSpec:
    return (
        table,
        (
            "nid INTEGER NOT NULL",
            "pid INTEGER NOT NULL",
            name_col,
            "extdata JSONB DEFAULT '{}' NOT NULL",
        ),
        _NODE_PROC,
    )


def _pmc_spec(*, qualifier: bool) -> _TableSpec:
    return (
        "rocpd_info_pmc",
        (
            "nid INTEGER NOT NULL",
            "pid INTEGER NOT NULL",
            "agent_id INTEGER",
            "target_arch TEXT CHECK (\"target_arch\" IN ('CPU', 'GPU'))",
            "event_code INT",
            "instance_id INTEGER",
            "name TEXT NOT NULL",
            "symbol TEXT NOT NULL",
            *(("qualifier TEXT",) if qualifier else ()),
            "description TEXT",
            "long_description TEXT DEFAULT ''",
            "component TEXT",
            "units TEXT DEFAULT ''",
            "value_type TEXT CHECK (\"value_type\" IN ('ABS', 'ACCUM', 'RELATIVE'))",
            "block TEXT",
            "expression TEXT",
            "is_constant INTEGER",
            "is_derived INTEGER",
            "extdata JSONB DEFAULT '{}' NOT NULL",
        ),
        (*_NODE_PROC, ("agent_id", "rocpd_info_agent")),
    )


def _code_object_spec() -> _TableSpec:
    return (
        "rocpd_info_code_object",
        (
            "nid INTEGER NOT NULL",
            "pid INTEGER NOT NULL",
            "agent_id INTEGER",
            "uri TEXT",
            "load_base BIGINT",
            "load_size BIGINT",
            "load_delta BIGINT",
            "storage_type TEXT CHECK (\"storage_type\" IN ('FILE', 'MEMORY'))",
            "extdata JSONB DEFAULT '{}' NOT NULL",
        ),
        (*_NODE_PROC, ("agent_id", "rocpd_info_agent")),
    )


def _kernel_symbol_spec() -> _TableSpec:
    return (
        "rocpd_info_kernel_symbol",
        (
            "nid INTEGER NOT NULL",
            "pid INTEGER NOT NULL",
            "code_object_id INTEGER NOT NULL",
            "kernel_name TEXT",
            "display_name TEXT",
            "kernel_object INTEGER",
            "kernarg_segment_size INTEGER",
            "kernarg_segment_alignment INTEGER",
            "group_segment_size INTEGER",
            "private_segment_size INTEGER",
            "sgpr_count INTEGER",
            "arch_vgpr_count INTEGER",
            "accum_vgpr_count INTEGER",
            "extdata JSONB DEFAULT '{}' NOT NULL",
        ),
        (*_NODE_PROC, ("code_object_id", "rocpd_info_code_object")),
    )


def _arg_spec() -> _TableSpec:
    return (
        "rocpd_arg",
        (
            "event_id INTEGER NOT NULL",
            "position INTEGER NOT NULL",
            "type TEXT NOT NULL",
            "name TEXT NOT NULL",
            "value TEXT",
            "extdata JSONB DEFAULT '{}' NOT NULL",
        ),
        (("event_id", "rocpd_event"),),
    )


def _pmc_event_spec() -> _TableSpec:
    return (
        "rocpd_pmc_event",
        (
            "event_id INTEGER",
            "pmc_id INTEGER NOT NULL",
            "value REAL DEFAULT 0.0",
            "extdata JSONB DEFAULT '{}'",
        ),
        (("pmc_id", "rocpd_info_pmc"), ("event_id", "rocpd_event")),
    )


def _spec_4_1_0() -> list[_TableSpec]:
    track = (("track_id", "rocpd_track"),)
    return [
        (
            "rocpd_info_node",
            (
                "hash BIGINT NOT NULL UNIQUE",
                "machine_id TEXT NOT NULL UNIQUE",
                "name TEXT",
                "system_name TEXT",
                "hostname TEXT",
                "release TEXT",
                "version TEXT",
                "hardware_name TEXT",
                "domain_name TEXT",
            ),
            (),
        ),
        (
            "rocpd_info_process",
            (
                "nid INTEGER NOT NULL",
                "ppid INTEGER",
                "pid INTEGER NOT NULL",
                "name TEXT",
                "init BIGINT",
                "fini BIGINT",
                "start BIGINT",
                "end BIGINT",
                "command TEXT",
                "environment JSONB DEFAULT '{}' NOT NULL",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (("nid", "rocpd_info_node"),),
        ),
        (
            "rocpd_info_thread",
            (
                "nid INTEGER NOT NULL",
                "ppid INTEGER",
                "pid INTEGER NOT NULL",
                "tid INTEGER NOT NULL",
                "name TEXT",
                "start BIGINT",
                "end BIGINT",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            _NODE_PROC,
        ),
        ("rocpd_info_category", ("name TEXT NOT NULL", "extdata JSONB DEFAULT '{}' NOT NULL"), ()),
        (
            "rocpd_info_agent",
            (
                "nid INTEGER NOT NULL",
                "pid INTEGER NOT NULL",
                "type TEXT CHECK (\"type\" IN ('CPU', 'GPU'))",
                "absolute_index INTEGER",
                "logical_index INTEGER",
                "type_index INTEGER",
                "uuid INTEGER",
                "name TEXT",
                "generic_name TEXT",
                "model_name TEXT",
                "vendor_name TEXT",
                "product_name TEXT",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            _NODE_PROC,
        ),
        _info_named("rocpd_info_queue"),
        _info_named("rocpd_info_stream"),
        _pmc_spec(qualifier=True),
        _code_object_spec(),
        _kernel_symbol_spec(),
        (
            "rocpd_info_address_range",
            (
                "nid INTEGER NOT NULL",
                "pid INTEGER NOT NULL",
                "address_base BIGINT",
                'address_low BIGINT CHECK ("address_low" >= "address_base")',
                'address_high BIGINT CHECK ("address_high" >= "address_low")',
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            _NODE_PROC,
        ),
        (
            "rocpd_info_source_code",
            (
                "nid INTEGER NOT NULL",
                "pid INTEGER NOT NULL",
                "address_id INTEGER",
                "file TEXT",
                "line_number INTEGER",
                "lines JSONB DEFAULT '[]' NOT NULL",
                "instructions JSONB DEFAULT '[]' NOT NULL",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (*_NODE_PROC, ("address_id", "rocpd_info_address_range")),
        ),
        (
            "rocpd_info_pc",
            (
                "nid INTEGER NOT NULL",
                "pid INTEGER NOT NULL",
                "function TEXT NOT NULL",
                "address_id INTEGER",
                "file TEXT",
                "line INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (*_NODE_PROC, ("address_id", "rocpd_info_address_range")),
        ),
        (
            "rocpd_track",
            (
                "nid INTEGER NOT NULL",
                "ppid INTEGER",
                "pid INTEGER",
                "tid INTEGER",
                "agent_id INTEGER",
                "queue_id INTEGER",
                "stream_id INTEGER",
                "name_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (
                *_NODE_PROC,
                ("tid", "rocpd_info_thread"),
                ("agent_id", "rocpd_info_agent"),
                ("queue_id", "rocpd_info_queue"),
                ("stream_id", "rocpd_info_stream"),
                ("name_id", "rocpd_string"),
            ),
        ),
        (
            "rocpd_event",
            (
                "category_id INTEGER",
                "stack_id INTEGER",
                "parent_stack_id INTEGER",
                "correlation_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (("category_id", "rocpd_info_category"),),
        ),
        _arg_spec(),
        (
            "rocpd_line_info",
            (
                "event_id INTEGER NOT NULL",
                "source_code_id INTEGER",
                "pc_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (
                ("event_id", "rocpd_event"),
                ("source_code_id", "rocpd_info_source_code"),
                ("pc_id", "rocpd_info_pc"),
            ),
        ),
        (
            "rocpd_call_stack",
            (
                "event_id INTEGER NOT NULL",
                "pc_id INTEGER",
                "depth INTEGER NOT NULL",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (("event_id", "rocpd_event"), ("pc_id", "rocpd_info_pc")),
        ),
        _pmc_event_spec(),
        (
            "rocpd_region",
            (
                "track_id INTEGER NOT NULL",
                "name_id INTEGER NOT NULL",
                "start BIGINT NOT NULL",
                "end BIGINT NOT NULL",
                "event_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (*track, ("name_id", "rocpd_string"), ("event_id", "rocpd_event")),
        ),
        (
            "rocpd_sample",
            (
                "track_id INTEGER NOT NULL",
                "name_id INTEGER NOT NULL",
                "timestamp BIGINT NOT NULL",
                "event_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (*track, ("name_id", "rocpd_string"), ("event_id", "rocpd_event")),
        ),
        (
            "rocpd_kernel_dispatch",
            (
                "track_id INTEGER NOT NULL",
                "kernel_id INTEGER NOT NULL",
                "dispatch_id INTEGER NOT NULL",
                "start BIGINT NOT NULL",
                "end BIGINT NOT NULL",
                "private_segment_size INTEGER",
                "group_segment_size INTEGER",
                *_GRID_COLUMNS,
                "region_name_id INTEGER",
                "event_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (
                *track,
                ("kernel_id", "rocpd_info_kernel_symbol"),
                ("region_name_id", "rocpd_string"),
                ("event_id", "rocpd_event"),
            ),
        ),
        (
            "rocpd_memory_copy",
            (
                "track_id INTEGER NOT NULL",
                "start BIGINT NOT NULL",
                "end BIGINT NOT NULL",
                "name_id INTEGER NOT NULL",
                "dst_agent_id INTEGER",
                "dst_address INTEGER",
                "src_agent_id INTEGER",
                "src_address INTEGER",
                "size INTEGER NOT NULL",
                "region_name_id INTEGER",
                "event_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (
                *track,
                ("name_id", "rocpd_string"),
                ("dst_agent_id", "rocpd_info_agent"),
                ("src_agent_id", "rocpd_info_agent"),
                ("region_name_id", "rocpd_string"),
                ("event_id", "rocpd_event"),
            ),
        ),
        (
            "rocpd_memory_allocate",
            (
                "track_id INTEGER NOT NULL",
                *_ALLOC_TYPE_LEVEL,
                "start BIGINT NOT NULL",
                "end BIGINT NOT NULL",
                "name_id INTEGER NOT NULL",
                "address INTEGER",
                "size INTEGER NOT NULL",
                "region_name_id INTEGER",
                "event_id INTEGER",
                "extdata JSONB DEFAULT '{}' NOT NULL",
            ),
            (
                *track,
                ("name_id", "rocpd_string"),
                ("region_name_id", "rocpd_string"),
                ("event_id", "rocpd_event"),
            ),
        ),
    ]


def _table_ddl(spec: _TableSpec, sfx: str, guid: str) -> str:
    table, columns, fks = spec
    lines = [
        '"id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT',
        f"\"guid\" TEXT DEFAULT '{guid}' NOT NULL",
    ]
    for col in columns:
        name, _, decl = col.partition(" ")
        lines.append(f'"{name}" {decl}')
    for col, ref in fks:
        lines.append(f'FOREIGN KEY ("{col}") REFERENCES `{ref}{sfx}` ("id") ON UPDATE CASCADE')
    body = ",\n    ".join(lines)
    return f"CREATE TABLE IF NOT EXISTS `{table}{sfx}` (\n    {body}\n);"


def _schema_sql(layout: str, sfx: str, guid: str) -> str:
    specs = _spec_3_0_0() if layout == "3.0.0" else _spec_4_1_0()
    parts = [
        f"CREATE TABLE IF NOT EXISTS `rocpd_metadata{sfx}` (\n"
        '    "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,\n'
        '    "tag" TEXT NOT NULL,\n    "value" TEXT NOT NULL\n);',
        f"CREATE TABLE IF NOT EXISTS `rocpd_string{sfx}` (\n"
        '    "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,\n'
        f"    \"guid\" TEXT DEFAULT '{guid}' NOT NULL,\n"
        '    "string" TEXT NOT NULL UNIQUE ON CONFLICT ABORT\n);',
    ]
    parts.extend(_table_ddl(s, sfx, guid) for s in specs)
    # rocpd_views.sql: one un-suffixed view per table.
    names = ["rocpd_metadata", "rocpd_string", *(s[0] for s in specs)]
    parts.extend(f"CREATE VIEW IF NOT EXISTS `{n}` AS SELECT * FROM `{n}{sfx}`;" for n in names)
    parts.append(_DATA_VIEWS_3 if layout == "3.0.0" else _DATA_VIEWS_4)
    return "\n\n".join(parts)


# data_views.sql, the views this module reads (same names and output columns as the
# published ones). Each joins the un-suffixed rocpd_* views, so they also cover attached
# or merged databases.
_DATA_VIEWS_3 = """
CREATE VIEW IF NOT EXISTS `regions` AS
SELECT R.id, R.guid,
    (SELECT string FROM `rocpd_string` RS WHERE RS.id = E.category_id AND RS.guid = E.guid)
        AS category,
    S.string AS name, R.nid, P.pid, T.tid, R.start, R.end, (R.end - R.start) AS duration,
    R.event_id, E.stack_id, E.parent_stack_id, E.correlation_id AS corr_id,
    E.extdata, E.call_stack, E.line_info
FROM `rocpd_region` R
    INNER JOIN `rocpd_event` E ON E.id = R.event_id AND E.guid = R.guid
    INNER JOIN `rocpd_string` S ON S.id = R.name_id AND S.guid = R.guid
    INNER JOIN `rocpd_info_process` P ON P.id = R.pid AND P.guid = R.guid
    INNER JOIN `rocpd_info_thread` T ON T.id = R.tid AND T.guid = R.guid;

CREATE VIEW IF NOT EXISTS `samples` AS
SELECT R.id, R.guid,
    (SELECT string FROM `rocpd_string` RS WHERE RS.id = E.category_id AND RS.guid = E.guid)
        AS category,
    (SELECT string FROM `rocpd_string` RS WHERE RS.id = T.name_id AND RS.guid = T.guid)
        AS name,
    T.nid, P.pid, TH.tid, R.timestamp, R.event_id, E.stack_id, E.parent_stack_id,
    E.correlation_id AS corr_id, E.extdata, E.call_stack, E.line_info
FROM `rocpd_sample` R
    INNER JOIN `rocpd_track` T ON T.id = R.track_id AND T.guid = R.guid
    INNER JOIN `rocpd_event` E ON E.id = R.event_id AND E.guid = R.guid
    INNER JOIN `rocpd_info_process` P ON P.id = T.pid AND P.guid = T.guid
    INNER JOIN `rocpd_info_thread` TH ON TH.id = T.tid AND TH.guid = T.guid;

CREATE VIEW IF NOT EXISTS `sample_regions` AS
SELECT id, guid, category, name, nid, pid, tid, timestamp AS start, timestamp AS end,
    0 AS duration, event_id, stack_id, parent_stack_id, corr_id, extdata, call_stack,
    line_info
FROM `samples`;

CREATE VIEW IF NOT EXISTS `regions_and_samples` AS
SELECT * FROM `regions` UNION ALL SELECT * FROM `sample_regions`;

CREATE VIEW IF NOT EXISTS `kernels` AS
SELECT K.id, K.guid, T.tid,
    (SELECT string FROM `rocpd_string` RS WHERE RS.id = E.category_id AND RS.guid = E.guid)
        AS category,
    R.string AS region, S.display_name AS name, K.nid, P.pid,
    A.absolute_index AS agent_abs_index, A.logical_index AS agent_log_index,
    A.type_index AS agent_type_index, A.type AS agent_type,
    S.code_object_id AS code_object_id, K.kernel_id, K.dispatch_id, K.stream_id, K.queue_id,
    Q.name AS queue, ST.name AS stream, K.start, K.end, (K.end - K.start) AS duration,
    K.grid_size_x AS grid_x, K.grid_size_y AS grid_y, K.grid_size_z AS grid_z,
    K.workgroup_size_x AS workgroup_x, K.workgroup_size_y AS workgroup_y,
    K.workgroup_size_z AS workgroup_z, K.group_segment_size AS lds_size,
    K.private_segment_size AS scratch_size, S.arch_vgpr_count AS vgpr_count,
    S.accum_vgpr_count, S.sgpr_count, S.group_segment_size AS static_lds_size,
    S.private_segment_size AS static_scratch_size, E.stack_id, E.parent_stack_id,
    E.correlation_id AS corr_id
FROM `rocpd_kernel_dispatch` K
    INNER JOIN `rocpd_info_agent` A ON A.id = K.agent_id AND A.guid = K.guid
    INNER JOIN `rocpd_event` E ON E.id = K.event_id AND E.guid = K.guid
    INNER JOIN `rocpd_string` R ON R.id = K.region_name_id AND R.guid = K.guid
    INNER JOIN `rocpd_info_kernel_symbol` S ON S.id = K.kernel_id AND S.guid = K.guid
    LEFT JOIN `rocpd_info_stream` ST ON ST.id = K.stream_id AND ST.guid = K.guid
    LEFT JOIN `rocpd_info_queue` Q ON Q.id = K.queue_id AND Q.guid = K.guid
    INNER JOIN `rocpd_info_process` P ON P.id = Q.pid AND P.guid = Q.guid
    INNER JOIN `rocpd_info_thread` T ON T.id = K.tid AND T.guid = K.guid;
"""

_DATA_VIEWS_4 = """
CREATE VIEW IF NOT EXISTS `tracks` AS
SELECT T.id, T.guid, T.name_id AS track_name_id, ST.string AS track_name, T.nid,
    N.name AS node_name, N.hash AS node_hash, N.machine_id AS node_machine_id,
    N.system_name AS node_system_name, N.hostname AS node_hostname,
    N.release AS node_release, N.version AS node_version,
    N.hardware_name AS node_hardware_version, T.pid, P.name AS process_name, P.ppid,
    P.init AS process_init, P.fini AS process_fini, P.start AS process_start,
    P.end AS process_end, P.command AS process_command, T.tid, TH.name AS thread_name,
    TH.start AS thread_start, TH.end AS thread_end, T.agent_id, A.name AS agent_name,
    A.type AS agent_type, A.absolute_index AS agent_absolute_index,
    A.logical_index AS agent_logical_index, A.type_index AS agent_type_index,
    A.uuid AS agent_uuid, A.generic_name AS agent_generic_name,
    A.model_name AS agent_model_name, A.vendor_name AS agent_vendor_name,
    A.product_name AS agent_product_name, T.queue_id, Q.name AS queue_name, T.stream_id,
    S.name AS stream_name
FROM `rocpd_track` T
    LEFT JOIN `rocpd_info_node` N ON N.id = T.nid AND N.guid = T.guid
    LEFT JOIN `rocpd_info_process` P ON P.pid = T.pid AND P.guid = T.guid
    LEFT JOIN `rocpd_info_thread` TH ON TH.tid = T.tid AND TH.guid = T.guid
    LEFT JOIN `rocpd_info_agent` A ON A.id = T.agent_id AND A.guid = T.guid
    LEFT JOIN `rocpd_info_queue` Q ON Q.id = T.queue_id AND Q.guid = T.guid
    LEFT JOIN `rocpd_info_stream` S ON S.id = T.stream_id AND S.guid = T.guid
    LEFT JOIN `rocpd_string` ST ON ST.id = T.name_id AND ST.guid = T.guid;

CREATE VIEW IF NOT EXISTS `events` AS
SELECT E.id, E.guid, E.category_id,
    (SELECT name FROM `rocpd_info_category` C WHERE C.id = E.category_id AND C.guid = E.guid)
        AS category,
    E.stack_id, E.parent_stack_id, E.correlation_id, E.extdata
FROM `rocpd_event` E;

CREATE VIEW IF NOT EXISTS `regions` AS
SELECT R.id, R.guid, E.category, NS.string AS name, T.nid, T.pid, T.tid,
    R.start AS `start`, R.end AS `end`, (R.end - R.start) AS `duration`, R.event_id,
    R.track_id, E.stack_id, E.parent_stack_id, E.correlation_id, E.extdata
FROM `rocpd_region` R
    INNER JOIN `events` E ON E.id = R.event_id AND E.guid = R.guid
    INNER JOIN `tracks` T ON T.id = R.track_id AND T.guid = R.guid
    INNER JOIN `rocpd_string` NS ON NS.id = R.name_id AND NS.guid = R.guid;

CREATE VIEW IF NOT EXISTS `samples` AS
SELECT S.id, S.guid, E.category, NS.string AS `name`, T.nid, T.pid, T.tid,
    S.timestamp AS `timestamp`, S.event_id, S.track_id, E.stack_id, E.parent_stack_id,
    E.correlation_id, E.extdata
FROM `rocpd_sample` S
    INNER JOIN `tracks` T ON T.id = S.track_id AND T.guid = S.guid
    INNER JOIN `events` E ON E.id = S.event_id AND E.guid = S.guid
    INNER JOIN `rocpd_string` NS ON NS.id = S.name_id AND NS.guid = S.guid;

CREATE VIEW IF NOT EXISTS `sample_regions` AS
SELECT S.id, S.guid, S.category, S.name, S.nid, S.pid, S.tid, S.timestamp AS `start`,
    S.timestamp AS `end`, 0 AS `duration`, S.event_id, S.track_id, S.stack_id,
    S.parent_stack_id, S.correlation_id, S.extdata
FROM `samples` S;

CREATE VIEW IF NOT EXISTS `regions_and_samples` AS
SELECT * FROM `regions` UNION ALL SELECT * FROM `sample_regions`;

CREATE VIEW IF NOT EXISTS `kernels` AS
SELECT K.id, K.guid, T.nid, T.pid, T.tid, E.category, R.string AS region,
    S.display_name AS name, T.agent_id, T.agent_absolute_index, T.agent_logical_index,
    T.agent_type_index, T.agent_type, S.code_object_id, K.kernel_id, K.dispatch_id,
    T.queue_id, T.queue_name AS `queue`, T.stream_id, T.stream_name AS `stream`,
    K.start AS `start`, K.end AS `end`, (K.end - K.start) AS `duration`, K.event_id,
    K.track_id, K.grid_size_x AS grid_x, K.grid_size_y AS grid_y, K.grid_size_z AS grid_z,
    K.workgroup_size_x AS workgroup_x, K.workgroup_size_y AS workgroup_y,
    K.workgroup_size_z AS workgroup_z, K.private_segment_size AS scratch_size,
    S.group_segment_size AS static_lds_block_size,
    S.private_segment_size AS static_scratch_size, S.sgpr_count, S.arch_vgpr_count,
    S.accum_vgpr_count, E.stack_id, E.parent_stack_id, E.correlation_id, E.extdata
FROM `rocpd_kernel_dispatch` K
    INNER JOIN `tracks` T ON T.id = K.track_id AND T.guid = K.guid
    INNER JOIN `events` E ON E.id = K.event_id AND E.guid = K.guid
    INNER JOIN `rocpd_string` R ON R.id = K.region_name_id AND R.guid = K.guid
    INNER JOIN `rocpd_info_kernel_symbol` S ON S.id = K.kernel_id AND S.guid = K.guid;
"""

# =========================================================================== rocpd writer

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


_WRITER_CACHES = (
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
    Values the 3.0.0 tables do not allow to be NULL are written as: unknown pid -> process
    0 (read back as ``None``), unknown tid/queue/stream -> 0.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        layout: str,
        guid: str,
        uuid: str,
        node_id: int,
    ) -> None:
        self._conn = conn
        self.path = path
        self.layout = layout
        self.guid = guid
        self.uuid = uuid
        self._sfx = f"_{uuid}"
        self._node_id = node_id
        self._strings: dict[str, int] = {}
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

    # -- context management

    def __enter__(self) -> RocpdWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Commit and close the database (idempotent)."""
        if not self._closed:
            self._conn.commit()
            self._conn.close()
            self._closed = True

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
        except BaseException:
            for name, value in saved.items():
                setattr(self, name, value)
            self._next_event, self._next_dispatch = counters
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

    def _string(self, text: str) -> int:
        sid = self._strings.get(text)
        if sid is None:
            sid = self._insert("rocpd_string", {"string": text})
            self._strings[text] = sid
        return sid

    def _category(self, name: str) -> int:
        if self.layout == "3.0.0":
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
        self._insert(
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
        extdata = json.dumps({"message": message}) if message is not None else "{}"
        event = self._event(category, corr, external, extdata)
        thread_row = self._thread(pid, tid)
        if self.layout == "3.0.0":
            if start == end:
                track = self._track(
                    ("host", pid, thread_row, category),
                    {"pid": pid, "tid": thread_row, "name_id": self._string(category)},
                )
                self._insert(
                    "rocpd_sample", {"track_id": track, "timestamp": start, "event_id": event}
                )
            else:
                self._insert(
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
            self._insert(
                "rocpd_sample",
                {
                    "track_id": track,
                    "name_id": self._string(name),
                    "timestamp": start,
                    "event_id": event,
                },
            )
        else:
            self._insert(
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
        elif owner != pid and self.layout == "3.0.0":
            raise ValueError(
                f"{table[len('rocpd_info_') :]} {value} is used by pids {owner} and {pid}; "
                "rocpd 3.0.0 keys queues and streams by id, one process each"
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
            **{c.split(" ")[0]: 0 for c in _GRID_COLUMNS},
            "region_name_id": self._string(""),
            "event_id": event,
        }
        if self.layout == "3.0.0":
            queue = 0 if k.queue is None else k.queue
            stream = 0 if k.stream is None else k.stream
            self._queue_or_stream("rocpd_info_queue", self._queues, queue, pid)
            self._queue_or_stream("rocpd_info_stream", self._streams, stream, pid)
            thread_row = self._thread(pid, 0 if k.tid is None else k.tid)
            self._insert(
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
        self._insert("rocpd_kernel_dispatch", {"track_id": track, **common})


def _node_hash(machine_id: str) -> int:
    # rocprofv3 uses std::hash (implementation-defined); any stable 63-bit value will do.
    digest = hashlib.sha256(machine_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % (2**63 - 1)


def create_rocpd_db(
    path: PathLike,
    layout: str = "3.0.0",
    guid: str | None = None,
    *,
    machine_id: str | None = None,
    hostname: str | None = None,
    overwrite: bool = False,
) -> RocpdWriter:
    """Create an empty rocpd database with the published schema and return its writer.

    ``layout`` is ``"3.0.0"`` (rocpd schema 3.0.x, with ``nid``/``pid``/
    ``tid`` on every row) or ``"4.1.0"`` (``rocpd_track``-based). ``guid`` identifies the
    database (default: a random UUID); tables are named ``<table>_<guid with - as _>``
    and the un-suffixed ``rocpd_*`` views plus the ``regions``, ``samples``, ``kernels``
    analysis views are created over them. ``rocpd_metadata`` holds ``schema_version``
    (the layout), ``uuid``, ``guid`` and a ``created_by`` row naming this project.
    ``machine_id`` (default ``/etc/machine-id``) and ``hostname`` fill ``rocpd_info_node``;
    pass the values of the rocprof database to share its node.

    Raises ``ValueError`` for an unknown layout or a guid that is not ``[0-9A-Za-z_-]``,
    and ``FileExistsError`` when ``path`` exists and ``overwrite`` is false.
    """
    if layout not in ROCPD_LAYOUTS:
        raise ValueError(
            f"unknown rocpd layout {layout!r}; choose one of {', '.join(ROCPD_LAYOUTS)}"
        )
    guid = guid or str(uuid_module.uuid4())
    if not _GUID.match(guid):
        raise ValueError(f"guid {guid!r} must be letters, digits, '-' and '_' (it names tables)")
    p = Path(path)
    if p.exists():
        if not overwrite:
            raise FileExistsError(f"{p} exists; pass overwrite=True to replace it")
        p.unlink()
    uuid = guid.replace("-", "_")
    sfx = f"_{uuid}"
    conn = sqlite3.connect(p)
    try:
        conn.executescript(_schema_sql(layout, sfx, guid))
        mid = machine_id or _machine_id()
        node_hash = _node_hash(mid)
        node_id = node_hash % (2**32 - 1)
        uname = platform.uname()
        with conn:
            conn.executemany(
                f'INSERT INTO `rocpd_metadata{sfx}` ("tag", "value") VALUES (?, ?)',
                [
                    ("schema_version", layout),
                    ("uuid", sfx),
                    ("guid", guid),
                    ("created_by", "vllm-graph-probe exporters.rocprof"),
                ],
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
        raise
    writer = RocpdWriter(conn, p, layout, guid, uuid, node_id)
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

_SQLITE_MAGIC = b"SQLite format 3\x00"
_VERSION_3 = re.compile(r"^3(\.\d+){0,2}$")
_VERSION_4_1 = re.compile(r"^4\.1(\.\d+)?$")


def rocpd_layout(version: str) -> str | None:
    """The table layout (one of :data:`ROCPD_LAYOUTS`) of a rocpd ``schema_version``;
    None for a version this reader does not know."""
    if _VERSION_3.match(version):
        return "3.0.0"
    if _VERSION_4_1.match(version):
        return "4.1.0"
    return None


def _check_sqlite_file(p: Path) -> None:
    """Reject missing, empty, non-SQLite and truncated files before sqlite3 sees them."""
    try:
        size = p.stat().st_size
        with p.open("rb") as fh:
            header = fh.read(100)
    except FileNotFoundError as exc:
        raise ProfileError(p, "no such file") from exc
    except OSError as exc:
        raise ProfileError(p, f"cannot read file: {exc.strerror or exc}") from exc
    if size == 0:
        raise ProfileError(p, "empty file, not a rocpd database")
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise ProfileError(p, "not an SQLite database (no 'SQLite format 3' header)")
    (page_size,) = struct.unpack(">H", header[16:18])
    page_size = 65536 if page_size == 1 else page_size
    change_counter, page_count = struct.unpack(">II", header[24:32])
    (valid_for,) = struct.unpack(">I", header[92:96])
    wal = Path(f"{p}-wal")
    # The in-header page count is valid when version-valid-for equals the change counter.
    if page_count and valid_for == change_counter and not wal.exists():
        expected = page_count * page_size
        if size < expected:
            raise ProfileError(
                p,
                f"truncated database: the header says {page_count} pages of {page_size} bytes "
                f"({expected} bytes) but the file has {size} bytes",
            )


def _columns(conn: sqlite3.Connection, name: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info(`{name}`)")]


def _pick(cols: Sequence[str], *candidates: str) -> str | None:
    return next((c for c in candidates if c in cols), None)


def _message(extdata: Any) -> str | None:
    if not isinstance(extdata, str | bytes) or not extdata:
        return None
    try:
        data = json.loads(extdata)
    except (ValueError, TypeError):
        return None
    msg = data.get("message") if isinstance(data, dict) else None
    return msg if isinstance(msg, str) else None


def _is_api_category(category: str) -> bool:
    upper = category.upper()
    return "MARKER" not in upper and (upper.endswith("_API") or upper.endswith("_API_EXT"))


def _nz(value: Any) -> int | None:
    return value if isinstance(value, int) and value != 0 else None


def open_sqlite_readonly(p: Path) -> sqlite3.Connection:
    """Open an existing SQLite file read-only; :class:`ProfileError` naming it otherwise."""
    _check_sqlite_file(p)
    try:
        return sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise ProfileError(p, f"cannot open as SQLite: {exc}") from exc


def read_rocpd(path: PathLike) -> Profile:
    """Read a rocpd SQLite database (rocprofv3's ``*_results.db`` or one this module wrote).

    The schema version comes from ``rocpd_metadata`` (``schema_version``): 3.x ("3",
    "3.0.0"... with ``nid``/``pid``/``tid`` on each row) and 4.1.x (``rocpd_track``-based)
    are read; any other version raises :class:`ProfileError`. Rows are read through the
    analysis views, as rocprofv3's own tools do:

    - ``kernels`` -> :class:`GpuKernel` (``device`` is the agent's logical index, the
      ``Agent N`` of ``rocpd convert``; ``correlation_id`` is ``stack_id``, the internal id
      that matches the API call; ``external_id`` the event's ``correlation_id``);
    - ``regions`` and ``samples`` (instant records) -> :class:`HostCall` when the category
      is an API domain (``HIP_RUNTIME_API_EXT``...), otherwise :class:`Marker`, named by
      the event's ``extdata.message`` when there is one (roctx text, probe spans).

    A kernel pid or tid of 0 (unknown, see :class:`RocpdWriter`) is read as ``None``. In a
    3.x database the ``samples`` view names an instant record by its track, which rocprofv3
    names after the category, so an instant API call written by rocprofv3 comes back with
    the category as its name (this module's writer also stores the name as the message).
    Raises :class:`ProfileError` for a missing, empty, non-SQLite, truncated or corrupt
    file, a database without ``rocpd_metadata`` or the views, or an unknown schema version.
    """
    p = Path(path)
    conn = open_sqlite_readonly(p)
    try:
        return _read_rocpd(conn, p)
    except sqlite3.DatabaseError as exc:
        raise ProfileError(p, f"corrupt or unreadable rocpd database: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ProfileError(p, f"text that is not UTF-8 in the database ({exc.reason})") from None
    finally:
        conn.close()


def _read_rocpd(conn: sqlite3.Connection, p: Path) -> Profile:
    objects = {
        name: kind
        for name, kind in conn.execute(
            "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')"
        )
    }
    meta_source = "rocpd_metadata"
    if meta_source not in objects:
        suffixed = sorted(n for n in objects if n.startswith("rocpd_metadata_"))
        if not suffixed:
            raise ProfileError(p, "not a rocpd database: no rocpd_metadata table or view")
        meta_source = suffixed[0]
    tags: dict[str, list[str]] = {}
    for tag, value in conn.execute(f"SELECT tag, value FROM `{meta_source}`"):
        tags.setdefault(str(tag), []).append(str(value))
    versions = sorted(set(tags.get("schema_version", [])))
    if not versions:
        raise ProfileError(p, "rocpd_metadata has no schema_version")
    if len(versions) > 1:
        raise ProfileError(p, f"mixed rocpd schema versions in one database: {', '.join(versions)}")
    version = versions[0]
    layout = rocpd_layout(version)
    if layout is None:
        raise ProfileError(
            p,
            f"unknown rocpd schema version {version!r}; this reader knows 3.x (nid/pid/tid "
            "on each row) and 4.1.x (rocpd_track based)",
        )
    missing = [v for v in ("kernels", "regions", "samples", "rocpd_region") if v not in objects]
    if missing:
        raise ProfileError(p, f"rocpd database lacks the view(s): {', '.join(missing)}")
    region_cols = _columns(conn, "rocpd_region")
    want = "track_id" if layout == "4.1.0" else "pid"
    if want not in region_cols:
        raise ProfileError(
            p,
            f"schema_version {version!r} but rocpd_region has columns {', '.join(region_cols)} "
            f"(expected {want!r}); the layout does not match the version",
        )

    kernels = _read_kernels(conn, p)
    host_calls: list[HostCall] = []
    markers: list[Marker] = []
    for view, start_col, end_col in (
        ("regions", "start", "end"),
        ("samples", "timestamp", "timestamp"),
    ):
        cols = _columns(conn, view)
        corr = _pick(cols, "corr_id", "correlation_id")
        if corr is None or "stack_id" not in cols:
            raise ProfileError(
                p, f"view {view!r} has no correlation columns (has: {', '.join(cols)})"
            )
        query = (
            f'SELECT category, name, pid, tid, "{start_col}", "{end_col}", stack_id, "{corr}", '
            f"extdata FROM `{view}`"
        )
        for category, name, pid, tid, start, end, stack, external, extdata in conn.execute(query):
            category = category or ""
            message = _message(extdata)
            if _is_api_category(category):
                call_name = message if (view == "samples" and message) else (name or "")
                host_calls.append(
                    HostCall(call_name, category, start, end, pid, tid, stack, _nz(external))
                )
            else:
                markers.append(Marker(message or name or "", start, end, pid, tid, category))

    meta = {
        "path": str(p),
        "schema_version": version,
        "layout": layout,
        "guids": tags.get("guid", []),
        "uuids": tags.get("uuid", []),
        "created_by": tags.get("created_by", []),
    }
    return Profile.build("rocpd", CLOCK_BOOTTIME, kernels, host_calls, markers, meta)


def _read_kernels(conn: sqlite3.Connection, p: Path) -> list[GpuKernel]:
    cols = _columns(conn, "kernels")
    device = _pick(cols, "agent_log_index", "agent_logical_index")
    corr = _pick(cols, "corr_id", "correlation_id")
    needed = {"name", "start", "end", "stream_id", "queue_id", "stack_id", "pid", "tid"}
    absent = (
        sorted(needed - set(cols))
        + ([] if device else ["agent_log_index"])
        + ([] if corr else ["corr_id"])
    )
    if absent:
        raise ProfileError(p, f"view 'kernels' lacks column(s): {', '.join(absent)}")
    query = (
        f'SELECT name, start, "end", "{device}", stream_id, queue_id, stack_id, "{corr}", pid, tid '
        "FROM `kernels`"
    )
    return [
        GpuKernel(
            name=name or "",
            start_ns=start,
            end_ns=end,
            device=dev,
            stream=stream,
            correlation_id=stack,
            pid=_nz(pid),
            tid=_nz(tid),
            queue=queue,
            external_id=_nz(external),
        )
        for name, start, end, dev, stream, queue, stack, external, pid, tid in conn.execute(query)
    ]


# =========================================================================== roctx

# The in-engine roctx emitter lives on the engine side (probe.markers); re-exported here
# for readers of this module's API.
from probe.markers import RoctxEmitter, RoctxUnavailableError  # noqa: E402
