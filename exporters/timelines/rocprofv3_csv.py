"""rocprofv3 CSV traces (and the CSVs of ``rocpd convert``) into a profile on BOOTTIME.

:func:`read_rocprofv3_csv` reads ``kernel_trace.csv`` (old and new column sets),
``hip_api_trace.csv`` / ``hip_trace.csv`` / ``hip_runtime_trace.csv`` / ``hsa_api_trace.csv``,
``marker_api_trace.csv`` and the ``rocpd convert`` CSVs that carry a leading ``Guid``::

    from exporters.timelines.rocprofv3_csv import read_rocprofv3_csv

    profile = read_rocprofv3_csv("rocprof_out/")   # a directory, a file, or several
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from exporters.timelines.inputs import open_regular, timestamp_ns
from exporters.timelines.model import (
    CLOCK_BOOTTIME,
    GpuKernel,
    HostCall,
    Marker,
    Profile,
    ProfileError,
)

__all__ = ["read_rocprofv3_csv"]

PathLike = str | os.PathLike[str]

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
_AGENT_INDEX = re.compile(r"(-?\d{1,19})\s*$")
_INTEGER = re.compile(r"[+-]?\d{1,20}")


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
            with (
                open_regular(self.path) as raw,
                io.TextIOWrapper(raw, newline="", encoding="utf-8-sig") as fh,
            ):
                yield csv.reader(fh)
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
        if not _INTEGER.fullmatch(value):
            raise ProfileError(
                self.path, f"{value[:40]!r} is not an integer", f"line {lineno}, column {column}"
            )
        return int(value)

    def times(self, lineno: int, row: Mapping[str, str]) -> tuple[int, int]:
        """``Start_Timestamp`` and ``End_Timestamp``: BOOTTIME ns, the end not before the start."""
        where = f"line {lineno}, column"
        start = timestamp_ns(
            self.path, where, self.integer(lineno, row, "Start_Timestamp"), "Start_Timestamp"
        )
        end = timestamp_ns(
            self.path, where, self.integer(lineno, row, "End_Timestamp"), "End_Timestamp"
        )
        if end < start:
            raise ProfileError(
                self.path, f"ends ({end}) before it starts ({start})", f"line {lineno}"
            )
        return start, end

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
            try:
                entries = sorted(p for p in item.iterdir() if p.suffix.lower() == ".csv")
            except OSError as exc:
                raise ProfileError(item, f"cannot list directory: {exc.strerror or exc}") from None
            files.extend(entries)
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
            start, end = table.times(lineno, row)
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
            start, end = table.times(lineno, row)
            kernels.append(
                GpuKernel(
                    name=row["Kernel_Name"],
                    start_ns=start,
                    end_ns=end,
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
