"""A recording's summary in one streaming pass (the reader side of :mod:`probe.analysis.summary`):
the ``steps`` table in validated numpy chunks, each step's hooked calls counted in SQLite
from the detail tables, reorders and builds aggregated there; several recordings merged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from probe.analysis.accumulators import BINS_PER_OCTAVE, NB
from probe.analysis.summary import Summary
from probe.records import BuildTag, Mode


def summarize_recording(rec: Any, chunk: int | None = None) -> Summary:
    """A recording's summary in one streaming pass (:func:`probe.reader.recording.
    iter_step_columns`, each rank's hooked calls from the detail tables, reorders and
    builds aggregated in SQLite)."""
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
    for cols in iter_step_columns(rec, chunk=chunk or STEP_CHUNK_ROWS):
        if calls is not None:
            cols = dict(cols)
            cols["_span_calls"], cols["_hook_calls"] = calls.take(cols)
        s.add_columns(cols)
    reorders = reorder_totals(rec) if columnar else _sql_reorder_totals(rec)
    for row in reorders:
        thr, n, changed, moved, spec, dec, reqs = (int(x or 0) for x in row)
        s.reorders["decisions"] += n
        s.reorders["changed"] += changed
        s.reorders["moved_requests"] += moved
        s.reorders["spec_as_decode"] += spec
        s.reorders["decodes"] += dec
        s.reorders["reqs"] += reqs
        s.thresholds[thr] += n
    builds = build_histogram(rec) if columnar else _sql_build_histogram(rec)
    for name, tag, drafter, b, n, total in builds:
        key = (name if isinstance(name, str) else "?", str(tag), bool(drafter))
        s._build(key, 0, int(n), int(b))
        s.builds[key][NB + 1] += int(total)
    s.sources = 1
    return s


def _sql_reorder_totals(rec: Any) -> list[Any]:
    return list(
        rec._rows(
            "SELECT threshold, count(*), sum(changed), sum(moved), sum(spec_as_decode), "
            "sum(num_decodes), sum(num_reqs) FROM reorders AS r WHERE EXISTS (SELECT 1 FROM "
            "steps AS s WHERE s.pid = r.pid AND s.step = r.step) GROUP BY threshold"
        )
    )


def _sql_build_histogram(rec: Any) -> list[Any]:
    return list(
        rec._rows(
            "SELECT builder, tag, drafter, CASE WHEN t1_ns - t0_ns <= 0 THEN 0 ELSE min("
            f"{NB - 1}, 1 + CAST(floor(log2(t1_ns - t0_ns) * {BINS_PER_OCTAVE}) AS INTEGER)) END "
            "AS b, count(*), sum(t1_ns - t0_ns) FROM builds AS d WHERE EXISTS (SELECT 1 FROM "
            "steps AS s WHERE s.pid = d.pid AND s.step = d.step) GROUP BY 1, 2, 3, 4"
        )
    )


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
    c.pids = np.array(sorted(cals), dtype=np.int64)
    c.merged_mrv2 = np.array([p for p, x in cals.items() if x.get("launch_is_replay")], np.int64)
    c.merged_v1 = np.array([p for p, x in cals.items() if x.get("v1_launch_is_replay")], np.int64)
    c.dispatch_in_phase = np.array(
        [p for p, x in cals.items() if x.get("dispatch_in_phase")], np.int64
    )
    return c


def reorder_totals(rec: Any) -> list[tuple[int, ...]]:
    """A columnar recording's reorder decisions per threshold: (threshold, decisions,
    changed, moved, spec_as_decode, decodes, requests), as the SQLite aggregate gives them;
    every value read is checked (:func:`probe.reader.columnar_read.detail_columns`)."""
    from probe.reader.columnar_read import detail_columns

    cols = ["threshold", "changed", "moved", "spec_as_decode", "num_decodes", "num_reqs"]
    acc: dict[int, np.ndarray] = {}
    for b in rec.batches("reorders", ["pid", "step", *cols]):
        a = detail_columns(rec, "reorders", b)
        thr = a["threshold"]
        for t in np.unique(thr).tolist():
            m = thr == t
            row = [int(m.sum()), *(int(a[c][m].sum()) for c in cols[1:])]
            acc[t] = acc.get(t, np.zeros(6, np.int64)) + np.array(row, np.int64)
    return [(t, *v.tolist()) for t, v in sorted(acc.items())]


def build_histogram(rec: Any) -> list[tuple[Any, ...]]:
    """A columnar recording's metadata builds per (builder, tag, drafter, duration bucket):
    (builder, tag, drafter, bucket, count, total ns), as the SQLite aggregate gives them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from probe.analysis.accumulators import bins_of
    from probe.reader.columnar_read import detail_columns

    acc: dict[tuple[Any, ...], list[int]] = {}
    for b in rec.batches("builds", ["pid", "step", "builder", "tag", "drafter", "t0_ns", "t1_ns"]):
        a = detail_columns(rec, "builds", b)
        dur = a["t1_ns"] - a["t0_ns"]
        bins = bins_of(dur)
        names = b.column("builder")
        if not pa.types.is_dictionary(names.type):
            names = pc.dictionary_encode(names)
        uniq = [*names.dictionary.to_pylist(), None]
        nidx_np = names.indices.fill_null(len(uniq) - 1).to_numpy(zero_copy_only=False)
        key = ((nidx_np * 8 + a["tag"]) * 2 + a["drafter"]) * NB + bins
        ks, inv = np.unique(key, return_inverse=True)
        n = np.bincount(inv)
        tot = np.zeros(len(ks), np.int64)
        np.add.at(tot, inv, dur)
        for k, cnt, t in zip(ks.tolist(), n.tolist(), tot.tolist(), strict=True):
            bin_, rest = k % NB, k // NB
            drafter, rest = rest % 2, rest // 2
            tag, ni = rest % 8, rest // 8
            full = (uniq[ni], _TAGS[tag], drafter, bin_)
            got = acc.setdefault(full, [0, 0])
            got[0] += cnt
            got[1] += t
    # in the order SQLite's GROUP BY gives them (a missing name first), as the summary
    # keeps them
    order = sorted(acc, key=lambda k: (k[0] is not None, k[0] or "", k[1], k[2], k[3]))
    return [(*k, *acc[k]) for k in order]


_TAGS = [m.lower() for m in BuildTag.__members__]
