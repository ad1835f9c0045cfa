"""Ranks side by side (probe.analysis.ranks) on the committed H200 TP=2 ``vllm serve`` recording,
checked against the same figures computed here from the recording's raw rows with SQL (sqlite3
on its SQLite conversion, none of the probe's analysis code); Steps built here only where a rule
must be pinned to exact inputs (clocks across hosts, the offset, the verdict rule, data-parallel
costs).
"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from recordings import sqlite_of
from rich.console import Console

from probe.analysis import ranks, ranks_live
from probe.analysis.ranks_columns import ranks_of_recording
from probe.cli.render_report import build_report, render_report
from probe.reader.recording import Recording
from probe.records import Mode, Reason
from probe.step import PHASES, Step, new_step

ROOT = Path(__file__).resolve().parents[2]
TP2 = ROOT / "tests/data/serve-tp2.probe"
TP2_DB = sqlite_of(TP2)  # the same recording as SQLite, for the raw-row SQL

# the candidates in the order probe.analysis.ranks breaks ties (first listed wins)
CANDIDATES = ("start", "reorder", "prepare_inputs", "dispatch", "metadata_build",
              "forward_launch", "sync_stall")  # fmt: skip


def _interp(xs: list[int], q: float) -> float:
    """Linear-interpolated percentile of sorted ``xs`` (numpy's default method)."""
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@pytest.fixture(scope="module")
def sql() -> dict[str, Any]:
    """The ranks figures of the TP=2 recording, from its raw rows."""
    db = sqlite3.connect(f"file:{TP2_DB}?mode=ro", uri=True)
    (p0,), (p1,) = db.execute(
        "SELECT pid FROM processes WHERE role = 'worker' ORDER BY tp_rank"
    ).fetchall()
    counts = dict(db.execute("SELECT pid, count(*) FROM steps GROUP BY pid").fetchall())

    def agree(d: int) -> tuple[int, int]:
        n, same = db.execute(
            "SELECT count(*), coalesce(sum(a.num_tokens = b.num_tokens AND "
            "a.num_reqs = b.num_reqs), 0) FROM steps a JOIN steps b "
            "ON a.pid = ? AND b.pid = ? AND b.step = a.step + ?",
            (p0, p1, d),
        ).fetchone()
        return int(n), int(same)

    by_offset = {d: agree(d) for d in range(-8, 9)}
    diffs = " UNION ALL ".join(
        f"SELECT step, {i} AS ord, '{c}' AS phase, "
        + ("lt0 - ot0" if c == "start" else f"l_{c} - o_{c}")
        + " AS d FROM late"
        for i, c in enumerate(CANDIDATES)
    )
    cols = ", ".join(f"x.{c}_ns AS x_{c}" for c in CANDIDATES[1:])
    lcols = ", ".join(
        f"CASE WHEN ea > eb THEN a_{c} ELSE b_{c} END AS l_{c}, "
        f"CASE WHEN ea > eb THEN b_{c} ELSE a_{c} END AS o_{c}"
        for c in CANDIDATES[1:]
    )
    q = f"""
    WITH a AS (SELECT step, t0_ns AS t0, t0_ns + cpu_launch_overhead_ns AS e,
                      gpu_idle_before_ns AS idle, {cols.replace("x.", "")}
               FROM steps AS x WHERE pid = :p0),
         b AS (SELECT step, t0_ns AS t0, t0_ns + cpu_launch_overhead_ns AS e,
                      gpu_idle_before_ns AS idle, {cols.replace("x.", "")}
               FROM steps AS x WHERE pid = :p1),
         m AS (SELECT a.step, a.t0 AS at0, b.t0 AS bt0, a.e AS ea, b.e AS eb,
                      a.idle AS aidle, b.idle AS bidle,
                      {", ".join(f"a.x_{c} AS a_{c}, b.x_{c} AS b_{c}" for c in CANDIDATES[1:])}
               FROM a JOIN b ON b.step = a.step + :d),
         late AS (SELECT step, CASE WHEN ea > eb THEN 0 ELSE 1 END AS last,
                         abs(ea - eb) AS skew,
                         CASE WHEN ea > eb THEN at0 ELSE bt0 END AS lt0,
                         CASE WHEN ea > eb THEN bt0 ELSE at0 END AS ot0,
                         CASE WHEN ea > eb THEN aidle ELSE bidle END AS idle, {lcols}
                  FROM m WHERE ea != eb),
         d AS ({diffs}),
         best AS (SELECT step, phase FROM (SELECT step, phase, row_number() OVER
                  (PARTITION BY step ORDER BY d DESC, ord) AS rn FROM d) WHERE rn = 1)
    SELECT late.step, last, skew, phase, CASE WHEN idle IS NULL THEN NULL
           ELSE min(skew, idle) END AS wait
    FROM late JOIN best USING (step) ORDER BY late.step
    """
    d = max(by_offset, key=lambda k: (by_offset[k][1] / max(by_offset[k][0], 1), -abs(k)))
    rows = db.execute(q, {"p0": p0, "p1": p1, "d": d}).fetchall()
    matched = db.execute(
        "SELECT count(*) FROM steps a JOIN steps b ON a.pid = ? AND b.pid = ? "
        "AND b.step = a.step + ?",
        (p0, p1, d),
    ).fetchone()[0]
    db.close()
    return {"pids": (p0, p1), "counts": counts, "offset": d, "by_offset": by_offset,
            "rows": rows, "matched": matched}  # fmt: skip


@pytest.fixture(scope="module")
def engine() -> ranks.EngineRanks:
    (e,) = ranks_of_recording(Recording.open(TP2)).engines
    return e


def test_the_recording_is_two_workers_whose_step_numbers_are_one_apart(sql: dict[str, Any]) -> None:
    p0, p1 = sql["pids"]
    assert (sql["counts"][p0], sql["counts"][p1]) == (1194, 1193)
    # the same batches one step number apart on every one of the 1,193 pairs ...
    assert sql["offset"] == -1 and sql["by_offset"][-1] == (1193, 1193)
    # ... and only by chance under the plain step number
    assert sql["by_offset"][0] == (1193, 703)


def test_matching_follows_the_batches(sql: dict[str, Any], engine: ranks.EngineRanks) -> None:
    assert engine.offsets == (0, sql["offset"])
    assert "batch contents" in engine.alignment
    assert engine.matched == sql["matched"] == 1193
    assert engine.unmatched == (1, 0)
    assert engine.batch_mismatches == 0
    assert engine.clock == "one host: shared CLOCK_BOOTTIME" and engine.uncertainty_ns == 0


def test_last_rank_skew_phase_and_wait_match_sql(
    sql: dict[str, Any], engine: ranks.EngineRanks
) -> None:
    rows = sql["rows"]
    for i, r in enumerate(engine.ranks):
        mine = [row for row in rows if row[1] == i]
        assert r.last == len(mine)
        phases: dict[str, int] = {}
        for row in mine:
            phases[row[3]] = phases.get(row[3], 0) + 1
        assert dict(r.phases) == phases
        waits = [row[4] for row in mine if row[4] is not None]
        assert (r.wait_caused_ns, r.wait_steps) == (sum(waits), len(waits))
        assert r.skew_p50_ns == pytest.approx(_interp(sorted(row[2] for row in mine), 50))
    skews = sorted(row[2] for row in rows)
    assert engine.within_uncertainty == engine.matched - len(rows)
    assert engine.skew_p50_ns == pytest.approx(_interp(skews, 50))
    assert engine.skew_p90_ns == pytest.approx(_interp(skews, 90))
    assert engine.skew_p99_ns == pytest.approx(_interp(skews, 99))
    assert engine.skew_max_ns == skews[-1]
    assert engine.wait_ns == sum(row[4] for row in rows if row[4] is not None)
    # the figures the report gives for this recording
    assert [r.last for r in engine.ranks] == [899, 294]
    assert engine.ranks[0].phases[0] == ("start", 894)


def test_verdict_names_the_rank_that_holds_more_than_its_share(
    engine: ranks.EngineRanks,
) -> None:
    n = sum(r.last for r in engine.ranks)
    assert ranks.holds_more_than_share(899, n, 2) and not ranks.holds_more_than_share(294, n, 2)
    assert engine.verdict is not None
    assert engine.verdict.startswith("tp0 (pid 3602) holds the step: last on 899 of 1,193")
    assert "start (894 of those steps)" in engine.verdict


def test_report_has_the_ranks_section_and_json() -> None:
    rep = build_report(Recording.open(TP2))
    (e,) = rep["ranks"]["engines"]
    assert [r["last"] for r in e["ranks"]] == [899, 294] and e["labels"] == ["tp0", "tp1"]
    json.dumps(rep)  # plain data
    console = Console(width=100, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    render_report(rep, console)
    text = console.export_text()
    assert "ranks side by side" in text
    assert "tp0" in text and "899" in text and "holds the step" in text
    flat = " ".join(w for w in text.split() if w not in "│╭╮╰╯")
    assert ranks.VERDICT_RULE.split(":")[0] in flat


def test_report_json_from_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "probe", "report", str(TP2), "--json"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    e = json.loads(out.stdout)["ranks"]["engines"][0]
    assert e["matched"] == 1193 and e["offsets"] == [0, -1]


def test_one_worker_has_no_ranks_section() -> None:
    from probe.reader.recording import default_recording

    assert ranks_of_recording(Recording.open(default_recording())).engines == ()


# -- rules pinned to exact inputs ------------------------------------------------------------


def _step(pid: int, n: int, t0: int, *, tokens: int = 8, clo: int = 1000, **phases: int) -> Step:
    ph = dict.fromkeys(PHASES, 0) | phases
    return new_step(
        pid=pid, step=n, t0=t0, t1=t0 + 5000, host_ns=5000, num_tokens=tokens, num_reqs=2,
        mode=Mode.FULL, reason=Reason.HIT, padded_tokens=tokens, padded_reqs=2,
        max_query_len=1, uniform_decode_query_len=1, uniform=True, replayed=True, pieces=0,
        captures=0, cpu_launch_overhead_ns=clo, phases=ph,
    )  # fmt: skip


def test_across_hosts_the_pairs_align_and_skew_within_uncertainty_is_not_named() -> None:
    # host b's BOOTTIME runs 7 s behind host a's; the pairs put both on the epoch
    a_boot, b_boot, epoch = 100_000_000_000, 93_000_000_000, 1_700_000_000_000_000_000
    late = {2: 5_000_000, 4: 200_000}  # step -> how late rank 1's metadata build made it
    a = [_step(1, n, a_boot + n * 10_000_000) for n in range(1, 7)]
    b = [
        _step(2, n, b_boot + n * 10_000_000, clo=1000 + late.get(n, 0),
              metadata_build=late.get(n, 0))
        for n in range(1, 7)
    ]  # fmt: skip
    inputs = [
        ranks.RankInput(ranks.RankId(1, 0, host="a"), a, a_boot, epoch, a_boot + 1000),
        ranks.RankInput(ranks.RankId(2, 1, host="b"), b, b_boot, epoch, b_boot + 2000),
    ]
    it, facts = ranks.per_step(inputs, epoch_sync_ns=1_000_000)
    got = list(it)
    assert facts["uncertainty_ns"] == 1_000_000 + 2000 + 1000
    assert "2 hosts" in facts["clock"] and "uncertainty 1,003.0 us" in facts["clock"]
    named = {s.step: (s.last, s.phase, s.skew_ns) for s in got if s.last is not None}
    assert named == {2: (1, "metadata_build", 5_000_000)}
    four = next(s for s in got if s.step == 4)
    assert four.skew_ns == 200_000 and four.last is None and four.phase is None
    # on one host the same 200 us is skew
    one = [ranks.RankInput(ranks.RankId(i.rank.pid, i.rank.tp_rank), i.steps) for i in inputs]
    b_same = [_step(2, s.step, s.t0 + (a_boot - b_boot), clo=s.cpu_launch_overhead_ns or 0,
                    metadata_build=s.phases["metadata_build"]) for s in b]  # fmt: skip
    e = ranks.engine_ranks([one[0], ranks.RankInput(one[1].rank, b_same)])
    assert e.ranks[1].last == 2 and e.within_uncertainty == 4


def test_across_hosts_without_a_clock_pair_is_an_error() -> None:
    a = ranks.RankInput(ranks.RankId(1, host="a"), [_step(1, 1, 0)], 1, 2)
    b = ranks.RankInput(ranks.RankId(2, 1, host="b"), [_step(2, 1, 0)])
    with pytest.raises(ValueError, match="no clock pair for tp1"):
        ranks.per_step([a, b])


def test_step_numbers_apart_are_matched_by_batch_and_mismatches_counted() -> None:
    toks = [3, 9, 4, 4, 7, 1, 8, 8, 2, 5]
    a = [_step(1, n + 1, n * 1000, tokens=t) for n, t in enumerate(toks)]
    b = [_step(2, n + 4, n * 1000, tokens=t) for n, t in enumerate(toks)]  # enabled 3 later
    offsets, how = ranks.align_offsets([a, b])
    assert offsets == (0, 3) and "batch contents" in how
    # batches that agree under no offset: plain step numbers, every mismatch counted
    c = [_step(2, n + 1, n * 1000, tokens=100 + n) for n in range(10)]
    e = ranks.engine_ranks([ranks.RankInput(ranks.RankId(1), a),
                            ranks.RankInput(ranks.RankId(2, 1), c)])  # fmt: skip
    assert e.offsets == (0, 0) and e.alignment == "by step number"
    assert e.matched == 10 and e.batch_mismatches == 10


def test_verdict_rule_is_three_standard_errors_over_the_fair_share() -> None:
    # n = 2, N = 100: 1/2 + 3 * sqrt(0.25 / 100) = 0.65
    assert not ranks.holds_more_than_share(65, 100, 2)
    assert ranks.holds_more_than_share(66, 100, 2)
    # n = 8, N = 800: 1/8 + 3 * sqrt(0.125 * 0.875 / 800) = 0.16008
    assert not ranks.holds_more_than_share(128, 800, 8)
    assert ranks.holds_more_than_share(129, 800, 8)


def test_data_parallel_costs_per_rank() -> None:
    s = [
        _step(1, 1, 0, tokens=8),
        new_step(**(ranks_fields(_step(1, 2, 0, tokens=3)) | {
            "reason": Reason.FORCED_EAGER, "mode": Mode.NONE, "host_ns": 700,
            "padded_tokens": 8, "gpu_busy_ns": 50})),
    ]  # fmt: skip
    r = ranks.RankInput(ranks.RankId(1, dp_rank=1), s, outside={"span": 4, "build": 2})
    d = ranks.dp_rank(r, s)
    assert (d.steps, d.forced_eager, d.forced_eager_host_ns, d.forced_eager_gpu_ns) == (
        2, 1, 700, 50)  # fmt: skip
    assert (d.padded, d.padded_host_ns, d.padded_gpu_ns, d.outside_records) == (1, 700, 50, 6)
    assert d.rank.label == "tp0/dp1"


def ranks_fields(s: Step) -> dict[str, Any]:
    return dict(s.__dict__)


class _Proc:
    """The parts of probe.reader.collector.ProcessState the live view reads."""

    def __init__(self, pid: int, snapshot: dict[str, Any] | None) -> None:
        self.pid, self.snapshot, self.dropped, self.hook_faults = pid, snapshot, 0, 0

    @property
    def rank_label(self) -> str:
        return f"tp{(self.snapshot or {}).get('tp_rank') or 0}"


def test_live_view_has_a_skew_line_per_rank(engine: ranks.EngineRanks) -> None:
    from probe.cli.render_live import LiveStats, plain_lines, skew_lines

    rec = Recording.open(TP2)
    stats = LiveStats(window=2048, clock_ns=lambda: 0)
    for p in rec.processes():
        proc = _Proc(p["pid"], p["snapshot"])
        stats.on_process(proc)  # type: ignore[arg-type]
        steps = list(rec.iter_steps(p["pid"]))
        if steps:
            stats.on_steps(proc, steps)  # type: ignore[arg-type]
    lines = skew_lines(stats)
    assert set(lines) == {3602, 3603}
    # the window holds the whole recording: the same figures as the report's
    assert lines[3602] == (
        "  skew: last on 75% of 1,193 matched steps, p50 11,612 µs when last (start)"
    )
    assert lines[3603].startswith("  skew: last on 25% of 1,193 matched steps")
    assert lines[3602] in plain_lines(stats)


def test_perfetto_has_the_ranks_as_aligned_tracks_with_the_late_rank_marked(
    tmp_path: Path, engine: ranks.EngineRanks
) -> None:
    pytest.importorskip("perfetto", reason="the perfetto extra is not installed")
    from perfetto_read import read_trace

    from exporters.perfetto import write_recording

    t = read_trace(write_recording(Recording.open(TP2), tmp_path / "tp2.pftrace"))
    names = {u: t.track_name(u) for u in t.tracks}
    (top,) = [u for u, n in names.items() if n == "ranks side by side (engine dp0)"]
    per_track: dict[str, list[Any]] = {}
    for s in t.slices:
        if s.category in ("rank", "rank_last"):
            per_track.setdefault(names[s.track], []).append(s)
    assert sorted(per_track) == ["tp0 pid 3602", "tp1 pid 3603"]
    assert all(len(v) == engine.matched for v in per_track.values())
    last = {k: sum(s.category == "rank_last" for s in v) for k, v in per_track.items()}
    assert last == {"tp0 pid 3602": 899, "tp1 pid 3603": 294}
    marks = [s for s in t.by_category("rank_mark") if s.track == top]
    assert len(marks) == engine.matched and all(s.start_ns == s.end_ns for s in marks)
    # one step, from the raw rows: tp1's step 299 is tp0's step 300 (same batch)
    db = sqlite3.connect(f"file:{TP2_DB}?mode=ro", uri=True)
    want = {
        pid: db.execute(
            "SELECT t0_ns, t0_ns + cpu_launch_overhead_ns FROM steps WHERE pid = ? AND step = ?",
            (pid, n),
        ).fetchone()
        for pid, n in ((3602, 300), (3603, 299))
    }
    db.close()
    for track, pid in (("tp0 pid 3602", 3602), ("tp1 pid 3603", 3603)):
        (s,) = [x for x in per_track[track] if x.name.startswith("step 300")]
        assert (s.start_ns, s.end_ns) == want[pid]
    late = 3602 if want[3602][1] > want[3603][1] else 3603
    (mark,) = [m for m in marks if m.args["step"] in (300, 299) and m.end_ns == want[late][1]]
    assert mark.args["skew_ns"] == abs(want[3602][1] - want[3603][1])


def test_live_otlp_sink_sends_the_rank_series_on_the_last_ranks_resource() -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otlp extra is not installed")
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from exporters.base import replay
    from exporters.otlp import OtlpSink

    got: list[Any] = []

    class Keep(MetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kw: Any) -> Any:
            got.append(metrics_data)
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kw: Any) -> None:
            pass

    sink = OtlpSink(InMemorySpanExporter, Keep, sampling=0.0, export_interval_s=3600)
    replay(Recording.open(TP2), sink)
    sink.close()
    last: dict[tuple[str, str], float] = {}
    skews: dict[str, int] = {}
    for md in got:
        for rm in md.resource_metrics:
            pid = str(rm.resource.attributes.get("process.pid"))
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        a = dict(p.attributes)
                        assert a["pid"] == pid or m.name not in (
                            "vllm_graph_probe_rank_last_steps",
                            "vllm_graph_probe_rank_skew_seconds",
                        )
                        if m.name == "vllm_graph_probe_rank_last_steps":
                            last[(a["tp_rank"], a["phase"])] = p.value
                        elif m.name == "vllm_graph_probe_rank_skew_seconds":
                            skews[a["tp_rank"]] = p.count
    assert last == {("0", "start"): 894, ("0", "prepare_inputs"): 4,
                    ("0", "forward_launch"): 1, ("1", "start"): 294}  # fmt: skip
    assert skews == {"0": 899, "1": 294}


def _last_rank_total(sink: Any) -> int:
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in sink.exposition().decode().splitlines()
        if line.startswith("vllm_graph_probe_rank_last_steps_total{")
    )


def test_an_offline_export_matches_every_step_whatever_the_matchers_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The replay behind the textfile and OTLP exports feeds the workers in turns, a batch
    each, so the live matcher holding only 64 steps per rank still pairs every step the
    report pairs (fed one worker after the other, it paired at most 64)."""
    import functools

    import exporters.metrics as metrics
    import exporters.prometheus as prom
    from exporters.base import replay

    (e,) = ranks_of_recording(Recording.open(TP2)).engines
    named = sum(r.last for r in e.ranks)
    assert named > 1000
    sinks = []
    for pending in (4096, 64):
        monkeypatch.setattr(
            metrics, "RankMatcher", functools.partial(ranks_live.RankMatcher, pending=pending)
        )
        sink = prom.PrometheusSink()
        replay(Recording.open(TP2), sink, batch=32)
        sinks.append(sink)
    assert _last_rank_total(sinks[0]) == _last_rank_total(sinks[1]) == named
    assert sinks[0].exposition() == sinks[1].exposition()


def test_the_matcher_drops_the_oldest_steps_in_any_arrival_order() -> None:
    """Past its bound a rank's oldest held steps go, whether they came in step order (the
    first held) or not (the smallest step number)."""

    def held(order: list[int]) -> list[int]:
        m = ranks_live.RankMatcher(pending=4)
        rank = ranks.RankId(1, 0, 0, 0)
        for k in order:
            m.add(rank, [_step(1, k, k * 10_000)])
        return sorted(m._steps[1])

    assert held([1, 2, 3, 4, 5, 6]) == [3, 4, 5, 6]
    assert held([6, 5, 4, 3, 2, 1]) == [3, 4, 5, 6]
    assert held([3, 1, 2, 5, 4, 6, 0]) == [3, 4, 5, 6]
