"""A recording's summary in one streaming pass (the reader side of :mod:`probe.analysis.summary`):
the ``steps`` table in validated numpy chunks, each step's hooked calls counted in SQLite
from the detail tables, reorders and builds aggregated there; several recordings merged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from probe.analysis.accumulators import BINS_PER_OCTAVE, NB
from probe.analysis.summary import Summary
from probe.records import Mode


def summarize_recording(rec: Any, chunk: int | None = None) -> Summary:
    """A recording's summary in one streaming pass (:func:`probe.reader.recording.
    iter_step_columns`, each rank's hooked calls from the detail tables, reorders and
    builds aggregated in SQLite)."""
    from probe.analysis.cost import calibration_of
    from probe.reader.recording_columns import (
        STEP_CHUNK_ROWS,
        check_detail_tables,
        iter_step_columns,
    )

    s = Summary(sample_every=int(rec.meta().get("sample_every") or 1))
    check_detail_tables(rec)
    cals = {p["pid"]: calibration_of(p.get("snapshot")) for p in rec.processes()}
    s.calibrations = {p: c for p, c in cals.items() if c is not None}
    calls = _call_counts(rec, s.calibrations) if s.calibrations else None
    for cols in iter_step_columns(rec, chunk=chunk or STEP_CHUNK_ROWS):
        if calls is not None:
            cols = dict(cols)
            cols["_span_calls"], cols["_hook_calls"] = calls.take(cols)
        s.add_columns(cols)
    for row in rec._rows(
        "SELECT threshold, count(*), sum(changed), sum(moved), sum(spec_as_decode), "
        "sum(num_decodes), sum(num_reqs) FROM reorders AS r WHERE EXISTS "
        "(SELECT 1 FROM steps AS s WHERE s.pid = r.pid AND s.step = r.step) GROUP BY threshold"
    ):
        thr, n, changed, moved, spec, dec, reqs = (int(x or 0) for x in row)
        s.reorders["decisions"] += n
        s.reorders["changed"] += changed
        s.reorders["moved_requests"] += moved
        s.reorders["spec_as_decode"] += spec
        s.reorders["decodes"] += dec
        s.reorders["reqs"] += reqs
        s.thresholds[thr] += n
    for name, tag, drafter, b, n, total in rec._rows(
        "SELECT builder, tag, drafter, CASE WHEN t1_ns - t0_ns <= 0 THEN 0 ELSE min("
        f"{NB - 1}, 1 + CAST(floor(log2(t1_ns - t0_ns) * {BINS_PER_OCTAVE}) AS INTEGER)) END "
        "AS b, count(*), sum(t1_ns - t0_ns) FROM builds AS d WHERE EXISTS (SELECT 1 FROM "
        "steps AS s WHERE s.pid = d.pid AND s.step = d.step) GROUP BY 1, 2, 3, 4"
    ):
        key = (name if isinstance(name, str) else "?", str(tag), bool(drafter))
        s._build(key, 0, int(n), int(b))
        s.builds[key][NB + 1] += int(total)
    s.sources = 1
    return s


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

    def take(self, cols: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        self._counts(int(cols["pid"][-1]), int(cols["step"][-1]))
        k = cols["pid"] * (1 << 40) + cols["step"]
        i = np.searchsorted(self.keys, k)
        i = np.minimum(i, max(len(self.keys) - 1, 0))
        ok = (
            (len(self.keys) > 0) & (self.keys[i] == k) if len(self.keys) else np.zeros(len(k), bool)
        )
        fw = cols["mode"] >= 0
        has_cal = np.isin(cols["pid"], self.pids)
        spans = np.where(ok, self.spans[i] if len(self.keys) else 0, 0)
        hooks = np.where(ok, self.hooks[i] if len(self.keys) else 0, 0)
        # the merged launch: one hook fewer on a replayed FULL step with its launch span
        merged = np.isin(cols["pid"], self.merged_mrv2) & (cols["runner"] == 1)
        merged |= np.isin(cols["pid"], self.merged_v1) & (cols["runner"] == 0)
        launch = np.where(ok, self.launch[i] if len(self.keys) else 0, 0)
        less = merged & (cols["mode"] == int(Mode.FULL)) & (cols["replayed"] == 1) & (launch > 0)
        hooks = hooks - less.astype(np.int64)
        dip = np.isin(cols["pid"], self.dispatch_in_phase) & (cols["runner"] == 1)
        spans = spans - np.where(dip & ok, self.in_phase[i] if len(self.keys) else 0, 0)
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


def _call_counts(rec: Any, cals: Mapping[int, Mapping[str, Any]]) -> _Calls:
    """Per step, the counts :func:`probe.analysis.cost.hooked_calls` makes, from SQL aggregates
    (each grouped by (pid, step), read in that order as the steps' chunks are)."""
    # the step's bracket spans; the others are the rest of its rows (only the rows of a
    # step in steps are looked up, and those are checked: a known, non-NULL phase)
    bracket = (
        "CASE phase WHEN 'execute' THEN 1 WHEN 'sample_tokens' THEN 1 "
        "WHEN 'forward_launch' THEN 1 ELSE 0 END"
    )
    parts = {
        "spans": (
            f"SELECT pid, step, count(*) - sum({bracket}), sum({bracket}), "
            "max(phase = 'forward_launch' AND drafter = 0) FROM spans GROUP BY pid, step"
        ),
        "derived": (
            "SELECT a.pid, a.step, count(DISTINCT a.t0_ns || ':' || a.t1_ns) FROM spans AS a "
            "JOIN spans AS b ON b.pid = a.pid AND b.step = a.step AND b.phase = 'metadata_build'"
            " AND b.drafter = 0 AND b.t0_ns = a.t1_ns WHERE a.phase = 'prepare_inputs' AND "
            "a.drafter = 0 GROUP BY a.pid, a.step"
        ),
        # each step's dispatches, and those inside its dispatch phase, in one scan
        "dispatches": (
            "SELECT d.pid, d.step, count(*), sum(CASE WHEN d.drafter = 0 AND EXISTS (SELECT 1 "
            "FROM spans AS s WHERE s.pid = d.pid AND s.step = d.step AND s.phase = 'dispatch' "
            "AND s.drafter = 0 AND s.t0_ns = d.t0_ns AND s.t1_ns = d.t1_ns) THEN 1 ELSE 0 END) "
            "FROM dispatches AS d GROUP BY d.pid, d.step"
        ),
        "replays": "SELECT pid, step, count(*) FROM replays WHERE kind != 'capture' GROUP BY 1, 2",
        "builds": "SELECT pid, step, count(*) FROM builds GROUP BY 1, 2",
        "reorders": "SELECT pid, step, count(*) FROM reorders GROUP BY 1, 2",
    }
    c = _Calls(rec, parts)
    c.pids = np.array(sorted(cals), dtype=np.int64)
    c.merged_mrv2 = np.array([p for p, x in cals.items() if x.get("launch_is_replay")], np.int64)
    c.merged_v1 = np.array([p for p, x in cals.items() if x.get("v1_launch_is_replay")], np.int64)
    c.dispatch_in_phase = np.array(
        [p for p, x in cals.items() if x.get("dispatch_in_phase")], np.int64
    )
    return c
