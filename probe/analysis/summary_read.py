"""A recording's summary in one streaming pass (the reader side of :mod:`probe.analysis.summary`):
the ``steps`` table in validated numpy chunks, each step's hooked calls counted from the
detail tables, reorders and builds aggregated in SQL (one text: SQLite over an SQLite
recording, DuckDB over a columnar one's Parquet); several recordings merged."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from probe.analysis.accumulators import BINS_PER_OCTAVE, NB
from probe.analysis.summary import Summary
from probe.records import BuildTag, Mode


def summarize_recording(rec: Any, chunk: int | None = None) -> Summary:
    """A recording's summary in one streaming pass (:func:`probe.reader.recording.
    iter_step_columns`, each rank's hooked calls from the detail tables, reorders and
    builds aggregated in SQL: :func:`reorder_totals_sql`, :func:`build_histogram_sql`)."""
    from probe.analysis.cost import calibration_of
    from probe.reader.columnar_read import ColumnarRecording
    from probe.reader.recording_columns import (
        STEP_CHUNK_ROWS,
        check_detail_tables,
        iter_step_columns,
    )

    s = Summary(sample_every=int(rec.meta().get("sample_every") or 1))
    check_detail_tables(rec)
    cals = {p["pid"]: calibration_of(p.get("snapshot")) for p in rec.processes()}
    s.calibrations = {p: c for p, c in cals.items() if c is not None}
    columnar = isinstance(rec, ColumnarRecording)
    calls = _call_counts(rec, s.calibrations) if s.calibrations else None
    # a columnar file's reorders and builds aggregated by DuckDB (the GIL let go) while
    # the steps are summarised here
    pool = ThreadPoolExecutor(1, thread_name_prefix="probe-sql") if columnar else None
    try:
        details = (
            pool.submit(lambda: (_columnar_reorders(rec), _columnar_builds(rec)))
            if pool is not None
            else None
        )
        for cols in iter_step_columns(rec, chunk=chunk or STEP_CHUNK_ROWS):
            if calls is not None:
                cols = dict(cols)
                cols["_span_calls"], cols["_hook_calls"] = calls.take(cols)
            s.add_columns(cols)
        if details is not None:
            reorders, builds = details.result()
        else:
            reorders, builds = rec._rows(reorder_totals_sql()), rec._rows(build_histogram_sql())
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    for row in reorders:
        thr, n, changed, moved, spec, dec, reqs = (int(x or 0) for x in row)
        s.reorders["decisions"] += n
        s.reorders["changed"] += changed
        s.reorders["moved_requests"] += moved
        s.reorders["spec_as_decode"] += spec
        s.reorders["decodes"] += dec
        s.reorders["reqs"] += reqs
        s.thresholds[thr] += n
    for name, tag, drafter, b, n, total in builds:
        key = (name if isinstance(name, str) else "?", str(tag), bool(drafter))
        s._build(key, 0, int(n), int(b))
        s.builds[key][NB + 1] += int(total)
    s.sources = 1
    return s


def _on_steps(alias: str) -> str:
    """The condition that keeps the detail rows of a step in ``steps`` (a row of no step
    belongs to no step)."""
    return (
        f" WHERE EXISTS (SELECT 1 FROM steps AS s WHERE s.pid = {alias}.pid AND "
        f"s.step = {alias}.step)"
    )


def reorder_totals_sql(on_steps: bool = True) -> str:
    """The reorder decisions per threshold, in its order: (threshold, decisions, changed,
    moved, spec_as_decode, decodes, requests). One text for SQLite and DuckDB; without
    ``on_steps``, for a recording whose every reorder row has its step."""
    where = _on_steps("r") if on_steps else ""
    return (
        "SELECT threshold, count(*), sum(changed), sum(moved), sum(spec_as_decode), "
        f"sum(num_decodes), sum(num_reqs) FROM reorders AS r{where} GROUP BY threshold "
        "ORDER BY threshold"
    )


def build_histogram_sql(on_steps: bool = True) -> str:
    """The metadata builds per (builder, tag, drafter, duration bucket), in that order (a
    missing builder name first): (builder, tag, drafter, bucket, count, total ns). The
    bucket is :func:`probe.analysis.accumulators.bins_of`'s. One text for SQLite and
    DuckDB; without ``on_steps``, for a recording whose every build row has its step."""
    where = _on_steps("d") if on_steps else ""
    octaves = f"log2(t1_ns - t0_ns) * {BINS_PER_OCTAVE}"
    return (
        f"SELECT builder, tag, drafter, CASE WHEN t1_ns - t0_ns <= 0 THEN 0 "
        f"WHEN {octaves} >= {NB - 2} THEN {NB - 1} "
        f"ELSE 1 + CAST(floor({octaves}) AS INTEGER) END AS b, count(*), sum(t1_ns - t0_ns) "
        f"FROM builds AS d{where} GROUP BY 1, 2, 3, 4 ORDER BY 1 NULLS FIRST, 2, 3, 4"
    )


#: the detail columns the summary reads, per table (checked as they are read)
_REORDER_COLUMNS = ("threshold", "changed", "moved", "spec_as_decode", "num_decodes", "num_reqs")
_BUILD_COLUMNS = ("builder", "tag", "drafter", "t0_ns", "t1_ns")


def _all_on_steps(rec: Any, table: str) -> bool:
    """Whether every row of a columnar recording's detail ``table`` has its step: the
    steps' record counts (:data:`probe.reader.columnar_schema.COUNT_COLUMNS`) add up to
    the table's rows."""
    (n,) = rec.sql(f"SELECT coalesce(sum(n_{table}), 0) FROM steps")[0]
    return bool(int(n) == rec.parquet(table).metadata.num_rows)


def _checked_sql(
    rec: Any, table: str, columns: Sequence[str], query: str,
    suspect: Callable[[list[tuple[Any, ...]]], bool] = lambda rows: False,
) -> list[tuple[Any, ...]]:  # fmt: skip
    """The rows of ``query`` over a columnar recording's detail ``table`` (DuckDB), the
    values of ``columns`` checked: where the file's statistics cannot show them fitting
    (:meth:`~probe.reader.columnar_read.ColumnarRecording.statistics_fit`), the rows are
    ``suspect`` or DuckDB cannot read them, the table is read and checked
    (:func:`probe.reader.columnar_columns.detail_columns` raises the error naming the first
    value that does not fit)."""
    from probe.reader.columnar_read import detail_columns
    from probe.reader.recording_open import RecordingError

    read = ["pid", "step", *columns]
    fits = rec.statistics_fit(table, read)
    failed: RecordingError | None = None
    rows: list[tuple[Any, ...]] = []
    try:
        rows = rec.sql(query)
    except RecordingError as exc:
        failed = exc
    if failed or not fits or suspect(rows):
        for b in rec.batches(table, read):
            detail_columns(rec, table, b)
    if failed:
        raise failed
    return rows


def _columnar_reorders(rec: Any) -> list[tuple[Any, ...]]:
    """:func:`reorder_totals_sql` of a columnar recording, its values checked."""
    query = reorder_totals_sql(not _all_on_steps(rec, "reorders"))
    return _checked_sql(rec, "reorders", _REORDER_COLUMNS, query)


def _columnar_builds(rec: Any) -> list[tuple[Any, ...]]:
    """:func:`build_histogram_sql` of a columnar recording, its values checked; suspect:
    a tag not among its names, a missing drafter flag, or a bucket 0 where a build may end
    before it starts."""

    def suspect(rows: list[tuple[Any, ...]]) -> bool:
        if any(tag not in _TAGS or drafter is None for _, tag, drafter, *_ in rows):
            return True
        if any(r[3] == 0 for r in rows):
            return bool(rec.sql("SELECT count(*) FROM builds WHERE t1_ns < t0_ns")[0][0])
        return False

    query = build_histogram_sql(not _all_on_steps(rec, "builds"))
    return _checked_sql(rec, "builds", _BUILD_COLUMNS, query, suspect)


def ab_values(s: Summary) -> dict[str, float | None]:
    """The figures ``probe ab`` compares, of a whole summary (steady state)."""
    fig = s.figures()
    lo = fig["phases"]["all"]
    return {
        "steady_tokens_per_s": fig["throughput"]["tokens_per_s"],
        "steady_host_ns": lo["host_ns"]["mean"],
        "cpu_launch_overhead_ns": lo["cpu_launch_overhead_ns"]["mean"],
        "decode_full_share": fig["hit_rates"]["decode_full_hit_rate"],
        "forward_launch_ns": lo["forward_launch"]["mean"],
        "draft_ns": lo["draft"]["mean"],
    }


def summarize_recordings(recs: Sequence[Any]) -> Summary:
    """Several recordings as one: each summarised, merged in the order of their first
    step's time (rolling files of one agent; ranks of several hosts)."""
    parts = []
    for rec in recs:
        first = rec.first_t0() if hasattr(rec, "first_t0") else None
        if first is None and not hasattr(rec, "first_t0"):
            first = rec._rows("SELECT min(t0_ns) FROM steps")[0][0]
        parts.append((first if first is not None else 0, summarize_recording(rec)))
    parts.sort(key=lambda p: p[0])
    out = Summary()
    for _, s in parts:
        out = out.merge(s)
    return out


class _Part:
    """One per-step aggregate's rows, in (pid, step) order, read as far as the steps'
    chunks reach (memory: a fetch, not the recording)."""

    def __init__(self, rec: Any, sql: str) -> None:
        from probe.reader.recording_columns import iter_aggregate

        self.it = iter_aggregate(rec, sql + " ORDER BY 1, 2")
        self.buf: np.ndarray | None = None
        self.done = False

    def upto(self, pid: int, step: int) -> np.ndarray:
        """The rows up to (``pid``, ``step``), those before included, taken off."""
        while not self.done and (
            self.buf is None or len(self.buf) == 0 or tuple(self.buf[-1, :2]) <= (pid, step)
        ):
            rows = next(self.it, None)
            if rows is None:
                self.done = True
                break
            a = np.array(rows, dtype=np.int64).reshape(len(rows), -1)
            self.buf = a if self.buf is None else np.concatenate([self.buf, a])
        if self.buf is None:
            return np.zeros((0, 5), np.int64)
        p, s = self.buf[:, 0], self.buf[:, 1]
        n = int(((p < pid) | ((p == pid) & (s <= step))).sum())
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


class _Calls:
    """Each step's hooked calls (:func:`probe.analysis.cost.hooked_calls`), counted in SQLite from
    the detail tables, each aggregate read alongside the steps' chunks (in (pid, step)
    order both) and looked up per chunk by (pid, step)."""

    def __init__(self, rec: Any, parts: Mapping[str, str]) -> None:
        self.parts = {name: _Part(rec, sql) for name, sql in parts.items()}

    def _counts(self, pid: int, step: int) -> None:
        """The counts of the steps up to (``pid``, ``step``) not yet taken."""
        tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, part in self.parts.items():
            a = part.upto(pid, step)
            tables[name] = (a[:, 0] * (1 << 40) + a[:, 1], a[:, 2:])
        keys = np.unique(np.concatenate([k for k, _ in tables.values()]))

        def col(name: str, j: int = 0) -> np.ndarray:
            k, v = tables[name]
            out = np.zeros(len(keys), dtype=np.int64)
            if len(k):
                out[np.searchsorted(keys, k)] = v[:, j]
            return out

        self.keys = keys
        self.spans = col("spans", 0) - col("derived")
        self.hooks = (
            col("spans", 1) + col("replays") + col("dispatches") + col("builds") + col("reorders")
        )
        self.launch = col("spans", 2)
        self.in_phase = col("dispatches", 1)

    def lookup(self, cols: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """Per row of the chunk: (spans, hooks, launch, in_phase), 0 for a step with no
        detail rows."""
        self._counts(int(cols["pid"][-1]), int(cols["step"][-1]))
        k = cols["pid"] * (1 << 40) + cols["step"]
        if not len(self.keys):
            z = np.zeros(len(k), np.int64)
            return z, z, z, z
        i = np.minimum(np.searchsorted(self.keys, k), len(self.keys) - 1)
        ok = self.keys[i] == k
        return tuple(
            np.where(ok, a[i], 0) for a in (self.spans, self.hooks, self.launch, self.in_phase)
        )

    def take(self, cols: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Per row of the chunk: the step's span and hook calls (-1 where it has no
        forward or its process no calibration)."""
        spans, hooks, launch, in_phase = self.lookup(cols)
        fw = cols["mode"] >= 0
        has_cal = np.isin(cols["pid"], self.pids)
        # the merged launch: one hook fewer on a replayed FULL step with its launch span
        merged = np.isin(cols["pid"], self.merged_mrv2) & (cols["runner"] == 1)
        merged |= np.isin(cols["pid"], self.merged_v1) & (cols["runner"] == 0)
        less = merged & (cols["mode"] == int(Mode.FULL)) & (cols["replayed"] == 1) & (launch > 0)
        hooks = hooks - less.astype(np.int64)
        dip = np.isin(cols["pid"], self.dispatch_in_phase) & (cols["runner"] == 1)
        spans = spans - np.where(dip, in_phase, 0)
        use = fw & has_cal
        return np.where(use, spans, -1), np.where(use, hooks, -1)

    keys: np.ndarray
    spans: np.ndarray
    hooks: np.ndarray
    pids: np.ndarray
    merged_mrv2: np.ndarray
    merged_v1: np.ndarray
    dispatch_in_phase: np.ndarray
    launch: np.ndarray
    in_phase: np.ndarray


class _StoredCalls(_Calls):
    """The counts of a columnar recording: stored beside each step when it was compacted
    (:data:`probe.reader.columnar_schema.COUNT_COLUMNS`), read with the step's columns."""

    def __init__(self) -> None:
        pass

    def lookup(self, cols: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        spans = cols["n_spans"] - cols["n_derived_spans"]
        hooks = (
            cols["n_bracket_spans"] + cols["n_replays"] + cols["n_dispatches"]
            + cols["n_builds"] + cols["n_reorders"]
        )  # fmt: skip
        return spans, hooks, cols["n_launch_spans"], cols["n_dispatches_in_phase"]


def _call_counts(rec: Any, cals: Mapping[int, Mapping[str, Any]]) -> _Calls:
    """Per step, the counts :func:`probe.analysis.cost.hooked_calls` makes: of a columnar
    recording, the record counts stored beside each step; of an SQLite one, the same
    aggregates (:func:`probe.reader.columnar_schema.count_sql`) run by SQLite, read
    alongside the steps' chunks (both in (pid, step) order)."""
    from probe.reader.columnar_read import ColumnarRecording
    from probe.reader.columnar_schema import count_sql

    c: _Calls = _StoredCalls() if isinstance(rec, ColumnarRecording) else _Calls(rec, count_sql())
    return _calibrated(c, cals)


def stored_calls(cals: Mapping[int, Mapping[str, Any]]) -> _Calls:
    """Per step, the hooked calls of the processes calibrated in ``cals``
    (:meth:`_Calls.take`), from the record counts a columnar file stores beside each step
    (:data:`probe.reader.columnar_schema.COUNT_COLUMNS`, read with the step's columns)."""
    return _calibrated(_StoredCalls(), cals)


def _calibrated(c: _Calls, cals: Mapping[int, Mapping[str, Any]]) -> _Calls:
    """``c`` with the calibrated processes of ``cals`` and their hooks' shape."""
    c.pids = np.array(sorted(cals), dtype=np.int64)
    c.merged_mrv2 = np.array([p for p, x in cals.items() if x.get("launch_is_replay")], np.int64)
    c.merged_v1 = np.array([p for p, x in cals.items() if x.get("v1_launch_is_replay")], np.int64)
    c.dispatch_in_phase = np.array(
        [p for p, x in cals.items() if x.get("dispatch_in_phase")], np.int64
    )
    return c


_TAGS = [m.lower() for m in BuildTag.__members__]
