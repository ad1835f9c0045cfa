"""Writing a columnar recording (``NAME.probe/``, :mod:`probe.reader.columnar_schema`).

The reader process appends: each flush (every half second, and on close) writes one Arrow
record batch per table to the table's live IPC stream, syncs the streams, then replaces
the manifest (written beside, synced, renamed) with the count of whole batches per stream.
A reader or machine killed mid-write leaves streams whose tails the manifest does not
count: the recording reads whole up to the last flush, and nothing after it is read.

On close the live streams are compacted (DuckDB, bounded memory: it sorts out of core)
into one Parquet file per table (zstd), sorted by (pid, step), device timings joined into
their steps and each step's record counts beside it; the streams are then removed.

    >>> import tempfile, pathlib
    >>> w = ColumnarWriter(pathlib.Path(tempfile.mkdtemp()) / "run.probe")
    >>> w.close()
    True
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from probe.reader.columnar_compact import compact, write_json
from probe.reader.columnar_schema import (
    FORMAT,
    FORMAT_VERSION,
    LIVE,
    MANIFEST,
    TABLES,
    live_schema,
)
from probe.reader.recording import (
    DETAIL_ROWS,
    STEP_ROW,
    RecordingError,
    no_names,
)
from probe.reader.recording_schema import SCHEMA_VERSION
from probe.records import Hello
from probe.step import GpuSample, Step

#: how much memory DuckDB may take while compacting (it spills to the recording's folder)
COMPACT_MEMORY = "256MB"
#: rows per Parquet row group of a compacted table
ROW_GROUP_ROWS = 262_144


class _Columns:
    """One table's rows of the current flush, column by column (plain lists)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.cols: list[list[Any]] = [[] for _ in names]
        self.rows = 0

    def add(self, row: Iterable[Any]) -> None:
        for col, v in zip(self.cols, row, strict=True):
            col.append(v)
        self.rows += 1

    def batch(self, schema: Any) -> Any:
        import pyarrow as pa

        arrays = []
        for f, col in zip(schema, self.cols, strict=True):
            if pa.types.is_boolean(f.type):
                col = [None if v is None else bool(v) for v in col]
            arrays.append(pa.array(col, type=f.type))
        self.cols = [[] for _ in self.names]
        self.rows = 0
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


class ColumnarWriter:
    """Writes a columnar recording; the reader process's writer (``probe record``,
    ``attach``, ``agent``), with :class:`probe.reader.recording.RecordingWriter`'s methods.

    ``path`` is the recording's folder; it must not exist, or be an empty folder.
    """

    def __init__(self, path: str | Path, *, commit_every_s: float = 0.5) -> None:
        self.path = Path(path)
        if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise RecordingError(f"{self.path}: exists (a columnar recording is a new folder)")
        (self.path / LIVE).mkdir(parents=True, exist_ok=True)
        self.commit_every_s = commit_every_s
        self._last_commit = time.monotonic()
        self._builder_names: dict[tuple[int, int], str] = {}
        self.meta: dict[str, Any] = {}
        self.processes: dict[int, dict[str, Any]] = {}
        self.faults: dict[tuple[int, str], tuple[int, bool]] = {}
        self.outside: dict[tuple[int, str], int] = {}
        self.anomalies: list[tuple[int, str]] = []
        self._buf = {t: _Columns(list(live_schema(t).names)) for t in (*TABLES, "gpu")}
        self._streams: dict[str, Any] = {}
        self._files: dict[str, Any] = {}
        self.committed = dict.fromkeys((*TABLES, "gpu"), 0)
        #: steps came in (pid, step) order, each once: compaction need not sort them
        self._sorted = True
        self._last_key = (-1, -1)
        self.closed = False
        self.set_meta(schema_version=SCHEMA_VERSION, created_epoch_ns=time.time_ns())
        self.commit()

    # -- what the reader process tells it ----------------------------------------------

    def set_meta(self, **kv: Any) -> None:
        self.meta.update(kv)

    def add_process(self, pid: int, hello: Hello | None) -> None:
        p = self.processes.setdefault(pid, {"pid": pid, "dropped": 0})
        if hello is not None and p.get("boottime_ns") is None:
            p.update(
                boottime_ns=hello.boottime_ns,
                epoch_ns=hello.epoch_ns,
                perf_counter_ns=hello.perf_counter_ns,
            )

    def set_snapshot(self, pid: int, snap: dict[str, Any]) -> None:
        p = self.processes.get(pid)
        if p is None:
            return
        p.update(
            role=snap.get("role", "worker"),
            tp_rank=snap.get("tp_rank"),
            pp_rank=snap.get("pp_rank"),
            dp_rank=snap.get("dp_rank"),
            vllm_version=snap.get("vllm_version"),
            runner=snap.get("runner"),
            model=snap.get("model"),
            snapshot=json.dumps(snap, default=str),
        )

    def set_dropped(self, pid: int, dropped: int) -> None:
        if pid in self.processes:
            self.processes[pid]["dropped"] = dropped

    def set_strings(self, pid: int, strings: dict[int, str]) -> None:
        self._builder_names.update({(pid, k): v for k, v in strings.items()})

    def _builder_name(self, pid: int) -> Callable[[int], str | None]:
        return lambda builder_id: self._builder_names.get((pid, builder_id))

    def add_steps(self, steps: Iterable[Step]) -> None:
        """The steps and their detail records, appended to this flush's columns."""
        buf = self._buf["steps"]
        for s in steps:
            key = (s.pid, s.step)
            if key <= self._last_key:
                self._sorted = False
            self._last_key = key
            buf.add(STEP_ROW(s, no_names))
            for t, encode in DETAIL_ROWS:
                recs = getattr(s, t.step_field)
                if recs:
                    b, names = self._buf[t.name], self._builder_name(s.pid)
                    for r in recs:
                        b.add((s.pid, s.step, *encode(r, names)))
        self.maybe_commit()

    def add_gpu(self, pid: int, timings: Iterable[GpuSample]) -> None:
        """Device timings arrive a few steps late; they are joined into steps on close."""
        b = self._buf["gpu"]
        for g in timings:
            b.add((pid, g.step, g.busy_ns, g.idle_before_ns, g.step_ns))

    def set_faults(self, pid: int, faults: dict[str, tuple[int, bool]]) -> None:
        for h, (n, d) in faults.items():
            self.faults[(pid, h)] = (n, bool(d))

    def set_outside(self, pid: int, counts: dict[str, int]) -> None:
        for k, n in counts.items():
            self.outside[(pid, k)] = n

    def add_anomalies(self, pid: int, messages: Iterable[str]) -> None:
        self.anomalies.extend((pid, m) for m in messages)

    # -- flushing ------------------------------------------------------------------------

    def maybe_commit(self) -> None:
        if time.monotonic() - self._last_commit >= self.commit_every_s:
            self.commit()

    def _stream(self, table: str) -> Any:
        import pyarrow as pa

        if table not in self._streams:
            f = open(self.path / LIVE / f"{table}.arrows", "wb")  # noqa: SIM115 (kept open)
            self._files[table] = f
            # each batch's buffers compressed (lz4): the live streams a few times smaller
            opts = pa.ipc.IpcWriteOptions(compression="lz4")
            self._streams[table] = pa.ipc.new_stream(f, live_schema(table), options=opts)
        return self._streams[table]

    def commit(self) -> None:
        """Flush: this flush's rows to the live streams, synced, then the manifest."""
        wrote = []
        for table, buf in self._buf.items():
            if buf.rows:
                self._stream(table).write_batch(buf.batch(live_schema(table)))
                self.committed[table] += 1
                wrote.append(table)
        for table in wrote:
            f = self._files[table]
            f.flush()
            os.fsync(f.fileno())
        write_json(self.path / MANIFEST, self.manifest(state="live"))
        self._last_commit = time.monotonic()

    def manifest(self, state: str, tables: dict[str, str] | None = None) -> dict[str, Any]:
        """The manifest as of now: ``state`` ``live`` (streams, ``committed`` batches
        each) or ``closed`` (``tables``: the Parquet file of each table)."""
        builders: dict[str, list[list[Any]]] = {}
        for (pid, i), name in sorted(self._builder_names.items()):
            builders.setdefault(str(pid), []).append([i, name])
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "state": state,
            "meta": self.meta,
            "processes": [self.processes[p] for p in sorted(self.processes)],
            "faults": [
                {"pid": p, "hook": h, "count": n, "disabled": int(d)}
                for (p, h), (n, d) in self.faults.items()
            ],
            "outside": [{"pid": p, "kind": k, "count": n} for (p, k), n in self.outside.items()],
            "anomalies": [{"pid": p, "message": m} for p, m in self.anomalies],
            "committed": dict(self.committed) if state == "live" else {},
            "sorted": self._sorted,
            "tables": tables or {},
        }

    def close(self, *, wait: bool = True) -> bool:
        """Flush, compact into Parquet and remove the live streams. ``True``: the
        recording is compacted (as ``RecordingWriter.close``'s self-contained file).

        ``wait=False`` (the agent's rotation): flush now, compact in a thread (its
        readers meanwhile read the live streams, whole); :meth:`join` waits for it."""
        if self.closed:
            self.join()
            return True
        self.commit()
        for s in self._streams.values():
            s.close()
        for f in self._files.values():
            f.close()
        self.closed = True
        if wait:
            compact(self.path)
            return True
        import threading

        def run() -> None:
            try:
                compact(self.path)
            except Exception as exc:  # left live: it reads whole; the next reader says why
                self.compact_error = f"{self.path}: not compacted ({exc})"

        self._compacting = threading.Thread(target=run, name="probe-compact", daemon=True)
        self._compacting.start()
        return True

    #: why a compaction in a thread failed (the recording is left live, reading whole)
    compact_error: str | None = None
    _compacting: Any = None

    def join(self) -> None:
        """Wait for a compaction started by ``close(wait=False)``."""
        if self._compacting is not None:
            self._compacting.join()
            self._compacting = None
