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
import shutil
import tempfile
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.reader.columnar_schema import (
    COUNT_COLUMNS,
    FORMAT,
    LIVE,
    MANIFEST,
    READ_FORMAT_VERSIONS,
    TABLES,
    is_text,
    names_of,
)
from probe.reader.recording_meta import META_TYPES, meta_ok, snapshot_of
from probe.reader.recording_open import RecordingError
from probe.reader.recording_rows import BAD, NULL, steps_of_rows
from probe.reader.recording_schema import DETAIL_TABLES
from probe.step import STEP_COLUMNS, Step

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

    @classmethod
    def open(cls, path: str | Path) -> ColumnarRecording:
        p = Path(path)
        m = read_manifest(p)
        tmp = None
        if m.get("state") != "closed":
            from probe.reader.columnar_compact import compact, write_json

            tmp = Path(tempfile.mkdtemp(prefix="probe-read-"))
            try:
                (tmp / LIVE).mkdir()
                for t in (*TABLES, "gpu"):
                    src = p / LIVE / f"{t}.arrows"
                    if src.is_file():
                        (tmp / LIVE / src.name).symlink_to(src.resolve())
                write_json(tmp / MANIFEST, m)
                compact(tmp)
                m = read_manifest(tmp)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
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
                # memory is a chunk's columns, not a row group's
                self._parquet[table] = pq.ParquetFile(
                    str(self.files[table]), page_checksum_verification=True,
                    read_dictionary=text, pre_buffer=False, buffer_size=1 << 20,
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
        import pyarrow as pa
        import pyarrow.compute as pc

        f = self.parquet(table)
        groups = self.row_groups(table, pid)
        if not groups:
            return
        # one process's rows are told apart by their pid, read even where not asked for
        want = columns if columns is None or pid is None or "pid" in columns else ["pid", *columns]
        try:
            for b in f.iter_batches(
                batch_size=size, row_groups=groups, columns=want, use_threads=True
            ):
                if pid is not None:
                    b = b.filter(pc.equal(b.column("pid"), pid))
                    if b.num_rows == 0:
                        continue
                yield b if want is columns else b.select(columns)
        except (OSError, pa.ArrowException) as exc:
            raise RecordingError(f"{self.path}: damaged recording: {table}: {exc}") from None

    def builder_names(self, pid: int | None = None) -> dict[int, dict[int, str]]:
        """Per pid, the id of each builder class name in :attr:`Step.builds`, in the order
        the names first appear (as :meth:`Recording.builder_names`)."""
        out: dict[int, dict[int, str]] = {}
        for b in self.batches("builds", ["pid", "builder"], pid):
            for p, name in zip(b.column(0).to_pylist(), b.column(1).to_pylist(), strict=True):
                names = out.setdefault(p, {})
                shown = name if isinstance(name, str) else "?"
                if shown not in names.values():
                    names[len(names) + 1] = shown
        return out

    def step_counts(self) -> dict[int, int]:
        import numpy as np

        out: dict[int, int] = {}
        for b in self.batches("steps", ["pid"]):
            pids, n = np.unique(b.column(0).to_numpy(), return_counts=True)
            for p, k in zip(pids.tolist(), n.tolist(), strict=True):
                out[p] = out.get(p, 0) + k
        return out

    def record_count(self) -> int:
        return sum(self.parquet(t).metadata.num_rows for t in TABLES)

    def first_t0(self) -> int | None:
        """The earliest step's start (None without steps): the row groups' statistics,
        their column read only where a row group has none."""
        import pyarrow.compute as pc

        f = self.parquet("steps")
        at = f.schema_arrow.get_field_index("t0_ns")
        lo = None
        for i in range(f.metadata.num_row_groups):
            st = f.metadata.row_group(i).column(at).statistics
            if st is not None and st.has_min_max:
                m = st.min
            else:
                m = pc.min(f.read_row_group(i, columns=["t0_ns"]).column(0)).as_py()
            if m is not None and (lo is None or m < lo):
                lo = m
        return lo

    def iter_steps(self, pid: int | None = None) -> Iterator[Step]:
        """Every step (of ``pid``, or all), in (pid, step) order, with its detail records;
        every value checked as :meth:`Recording.iter_steps` checks it."""
        steps = self._rows("steps", [c.name for c in STEP_COLUMNS], pid)
        details = {
            t.name: self._rows(t.name, ["pid", "step", *(c.name for c in t.columns)], pid)
            for t in DETAIL_TABLES
        }
        yield from steps_of_rows(self.path, steps, details, self.builder_names(pid))

    def _rows(self, table: str, columns: list[str], pid: int | None) -> Iterator[tuple[Any, ...]]:
        """The table's rows as the SQLite recording's cursor gives them (booleans 0/1)."""
        import pyarrow as pa

        for b in self.batches(table, columns, pid, size=4096):
            cols = []
            for c in b.columns:
                if pa.types.is_boolean(c.type):
                    c = c.cast(pa.int64())
                cols.append(c.to_pylist())
            yield from zip(*cols, strict=True)

    def close(self) -> None:
        self._parquet.clear()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


# -- the steps as numpy columns -----------------------------------------------------------


def text_codes(col: Any, names: tuple[str, ...]) -> Any:
    """A text column as the codes of its names (NULL -1, a name not among them -2): its
    dictionary mapped once (in Python: building an Arrow array from a list imports
    pandas, a second of a report's start), its indices taken."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    code = {n: i for i, n in enumerate(names)}
    lut = np.array([code.get(v, BAD) for v in col.dictionary.to_pylist()] + [NULL], np.int64)
    return lut[col.indices.fill_null(len(lut) - 1).to_numpy(zero_copy_only=False)]


def iter_columnar_step_columns(
    rec: Any, pid: int | None, chunk: int, only: Collection[str] | None
) -> Iterator[dict[str, Any]]:
    """The ``steps`` table as :func:`probe.reader.recording_columns.iter_step_columns`
    gives it (int64 columns, text as codes, NULL -1 with the ``_nulls`` bits), from the
    Arrow batches of ``rec`` (a columnar recording, or several recordings read as one);
    of a columnar file, every column with each step's record counts
    (:data:`COUNT_COLUMNS`)."""
    import enum

    import numpy as np

    from probe.reader.recording_rows import column_checks, nullable_ints

    keep = {"pid", "step", "t0_ns", "t1_ns", *only} if only is not None else None
    columns = [c for c in STEP_COLUMNS if keep is None or c.name in keep]
    nullable = nullable_ints()
    names = [c.name for c in columns]
    counts = list(COUNT_COLUMNS) if keep is None and isinstance(rec, ColumnarRecording) else []
    for b in rec.batches("steps", names + counts, pid, size=chunk):
        cols: dict[str, Any] = {}
        nulls = np.zeros(b.num_rows, dtype=np.int64)
        for c in columns:
            a = b.column(c.name)
            if is_text(c.kind):
                codes = text_codes(a, names_of(c))
                if isinstance(c.kind, type) and issubclass(c.kind, enum.Enum):
                    values = np.array([int(m.value) for m in c.kind.__members__.values()])
                    ok = codes >= 0
                    codes[ok] = values[codes[ok]]
                cols[c.name] = codes
                continue
            isnull = a.is_null().to_numpy(zero_copy_only=False) if a.null_count else None
            v = a.fill_null(0 if c.kind is bool else NULL) if a.null_count else a
            arr = v.to_numpy(zero_copy_only=False).astype(np.int64)
            if isnull is not None:
                if c.kind is bool or not c.nullable:
                    raise RecordingError(
                        f"{rec.path}: damaged recording: steps: {c.name} is NULL "
                        f"(pid {b.column('pid')[int(np.argmax(isnull))]})"
                    )
                arr[isnull] = NULL
                nulls |= isnull.astype(np.int64) << nullable.index(c)
            cols[c.name] = arr
        for n in counts:
            cols[n] = b.column(n).to_numpy(zero_copy_only=False).astype(np.int64)
        bad = column_checks(cols, nulls, columns)
        if bad.any():
            i = int(np.argmax(bad))
            why = "t1_ns is before t0_ns"
            if cols["t1_ns"][i] >= cols["t0_ns"][i]:
                c = next(c for c in columns if column_checks(cols, nulls, [c])[i])
                why = f"{c.name} does not fit its column"
            raise RecordingError(
                f"{rec.path}: damaged recording: steps row (pid {cols['pid'][i]}, step "
                f"{cols['step'][i]}): {why}"
            )
        cols["_nulls"] = nulls
        yield cols


def read_ahead(chunks: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """``chunks`` as they are, read by a thread up to ``depth`` ahead of the consumer:
    decoding the next row group (Arrow and numpy release the GIL) overlaps the work on this
    one. An error of the reading is raised here, at the chunk where it happened; a consumer
    that stops early stops the thread."""
    import queue
    import threading

    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for c in chunks:
                if not put(("chunk", c)):
                    return
            put(("end", None))
        except BaseException as exc:  # handed to the consumer, raised there
            put(("error", exc))

    t = threading.Thread(target=run, name="probe-read-ahead", daemon=True)
    t.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        t.join()


def detail_columns(rec: Any, table: str, batch: Any) -> dict[str, Any]:
    """A detail table's batch as int64 numpy columns (an enum its member index, a flag
    0/1), every value checked against its column: a value that does not fit raises the
    :class:`RecordingError` naming the table, the step and the column."""
    import numpy as np
    import pyarrow as pa

    t = next(t for t in DETAIL_TABLES if t.name == table)
    kinds = {c.name: c for c in t.columns}
    out: dict[str, Any] = {}
    pid = batch.column("pid").to_numpy(zero_copy_only=False)
    step = batch.column("step").to_numpy(zero_copy_only=False)

    def fail(mask: Any, column: str, why: str) -> RecordingError:
        i = int(np.argmax(mask))
        return RecordingError(
            f"{rec.path}: damaged recording: {table} row (pid {pid[i]}, step {step[i]}): "
            f"{column} {why}"
        )

    for name in batch.schema.names:
        col = batch.column(name)
        c = kinds.get(name)
        if name in ("pid", "step"):
            v = col.to_numpy(zero_copy_only=False)
            if col.null_count or (v < 0).any():
                raise fail(v < 0, name, "is not a step key")
            out[name] = v.astype(np.int64)
        elif c is None or c.kind is str:
            continue  # a builder's name: any text, or missing
        elif is_text(c.kind):
            names = names_of(c)
            idx = text_codes(col, names)
            if (idx < 0).any():
                raise fail(idx < 0, name, f"is not one of {', '.join(names)}")
            out[name] = idx
        else:
            if col.null_count:
                raise fail(col.is_null().to_numpy(zero_copy_only=False), name, "is NULL")
            v = col.to_numpy(zero_copy_only=False).astype(np.int64)
            if c.min is not None and not pa.types.is_boolean(col.type) and (v < c.min).any():
                raise fail(v < c.min, name, f"is below {c.min}")
            out[name] = v
    if "t0_ns" in out and "t1_ns" in out and (out["t1_ns"] < out["t0_ns"]).any():
        raise fail(out["t1_ns"] < out["t0_ns"], "t1", "is before t0")
    return out
