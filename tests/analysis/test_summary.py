"""The one summary: streaming in chunks, merging, and the per-value checks of the
columnar read."""

from __future__ import annotations

import pickle
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recordings import copy_recording, sqlite_of

from probe.analysis.accumulators import NB, Key, add_bins, bins_of, key_counts
from probe.analysis.cost import calibration_of
from probe.analysis.rules import STEADY
from probe.analysis.steady import summarize_steps
from probe.analysis.summary_read import summarize_recording, summarize_recordings
from probe.reader.recording import Recording, RecordingError, default_recording
from probe.reader.recording_columns import iter_step_columns

ROOT = Path(__file__).resolve().parents[2]
TP2 = ROOT / "tests/data/serve-tp2.probe"
# calibrated: each step's hooked calls are counted from the detail tables, chunk by chunk
CHUNKED = ROOT / "tests/data/chunked_mrv2_k1.probe"


@pytest.mark.parametrize("chunk", [7, 13, 97])
@pytest.mark.parametrize("path", [default_recording(), TP2, CHUNKED])
def test_chunks_of_any_size_give_the_same_summary(path: Path, chunk: int) -> None:
    """The streaming pass carries each rank across chunks: 7, 13 or 97 rows at a time is
    the whole recording at once (a step whose warm-up class is decided in a later chunk is
    listed with its own recorded values)."""
    rec = Recording.open(path)
    whole = summarize_recording(rec, chunk=1 << 20).figures()
    small = summarize_recording(rec, chunk=chunk).figures()
    assert small == whole


def test_the_hooked_call_counts_follow_chunks_of_any_size() -> None:
    """Each aggregate of the detail tables is read alongside the steps' chunks: 7 rows at
    a time give the probe cost of the whole recording at once."""
    rec = Recording.open(CHUNKED)
    whole = summarize_recording(rec, chunk=1 << 20).figures()
    assert whole["probe_cost"] and summarize_recording(rec, chunk=7).figures() == whole


def test_the_columnar_pass_equals_the_steps_pass() -> None:
    """Recording columns (SQL-counted hooked calls) and Step objects (probe.analysis.cost's
    calls_with) give one summary."""
    rec = Recording.open(default_recording())
    steps = list(rec.iter_steps())
    cals = {p["pid"]: calibration_of(p.get("snapshot")) for p in rec.processes()}
    a = summarize_recording(rec).figures()
    b = summarize_steps(steps, cals).figures()
    for k in ("hit_rates", "hit_rates_all", "phases", "gpu", "throughput", "headline"):
        assert a[k] == b[k], k


def test_two_halves_merge_into_the_whole() -> None:
    """Two rolling files of one rank: their summaries merged are the whole's (counts,
    sums and histograms exactly; the first step of the second file has no step before it
    in its file, so its period is its own span)."""
    steps = list(Recording.open(default_recording()).iter_steps())
    half = len(steps) // 2
    whole = summarize_steps(steps).figures()
    merged = summarize_steps(steps[:half]).merge(summarize_steps(steps[half:])).figures()
    assert merged["hit_rates"] == whole["hit_rates"]
    assert merged["phases"] == whole["phases"]
    assert merged["warmup"]["steps"] == whole["warmup"]["steps"]
    assert merged["gpu"]["host_bound_steps"] == whole["gpu"]["host_bound_steps"]
    assert merged["throughput"]["tokens"] == whole["throughput"]["tokens"]
    assert merged["throughput"]["tokens_per_s"] == pytest.approx(
        whole["throughput"]["tokens_per_s"], rel=1e-3
    )


def test_several_recordings_as_one_cover_every_rank() -> None:
    rec = Recording.open(default_recording())
    tp2 = Recording.open(TP2)
    both = summarize_recordings([rec, tp2]).figures()
    a, b = summarize_recording(rec).figures(), summarize_recording(tp2).figures()
    assert both["forward_steps"] == a["forward_steps"] + b["forward_steps"]
    assert both["hit_rates"]["full"] == a["hit_rates"]["full"] + b["hit_rates"]["full"]
    assert set(both["ranks"]) == set(a["ranks"]) | set(b["ranks"])


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("host_ns", -5, "host_ns is -5, below 0"),
        ("mode", "fulll", "mode is 'fulll', not one of"),
        ("uniform", 2, "uniform is 2, not 0 or 1"),
        ("num_tokens", 1.5, "num_tokens is 1.5, not an integer"),
        ("t1_ns", 1, "t1 is 1, before t0"),
    ],
)
def test_the_columnar_read_refuses_what_iter_steps_refuses(
    tmp_path: Path, column: str, value: object, why: str
) -> None:
    p = copy_recording(sqlite_of(default_recording()), tmp_path / "bad.probe.db")
    with sqlite3.connect(p) as db:
        db.execute(f"UPDATE steps SET {column} = ? WHERE step = 500", (value,))
    rec = Recording.open(p)
    with pytest.raises(RecordingError) as col:
        for _ in iter_step_columns(rec, chunk=128):
            pass
    with pytest.raises(RecordingError) as obj:
        list(rec.iter_steps())
    assert str(col.value) == str(obj.value)
    assert why in str(col.value) and "step 500" in str(col.value)


def test_report_takes_several_recordings_or_a_glob_as_one() -> None:
    import json
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "probe", "report", "--json", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    stock = "tests/data/stock_mrv2_k1.probe"
    out = run("tests/data/stock_*.probe", str(default_recording()))
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    one = [json.loads(run(p).stdout) for p in (stock, str(default_recording()))]
    assert len(rep["recordings"]) == 2
    assert rep["hit_rates_all"]["steps"] == sum(r["hit_rates_all"]["steps"] for r in one)
    idle = sum(r["headline"]["engine_idle_s"] for r in one)
    assert rep["headline"]["engine_idle_s"] == pytest.approx(idle)
    bad = run("no-such-*.probe.db")
    assert bad.returncode == 2
    assert bad.stderr == "probe: error: no-such-*.probe.db: no recording matches\n"


def test_histogram_keys_counted_in_place_or_sorted_alike() -> None:
    """The group pass's key count gives every distinct key below the size once, in order,
    with its count, whether it counts in place (a small key space) or sorts (a large one);
    keys at or past the size are values left out."""
    rng = np.random.default_rng(7)
    for size in (50, 3 << 20):
        keys = rng.integers(0, size + 20, 5000)
        want = sorted((k, n) for k, n in Counter(keys.tolist()).items() if k < size)
        distinct, counts = key_counts(keys, size)
        assert list(zip(distinct.tolist(), counts.tolist(), strict=True)) == want


def test_buckets_follow_the_log_rule_across_blocks() -> None:
    """A value's bucket is 1 + floor(32 log2 v) (the last at most; 0 for 0 or less), the
    same in every block of a long column and with a per-row offset added."""
    rng = np.random.default_rng(11)
    v = np.concatenate(
        [
            rng.integers(-5, 1 << 44, 20_000),
            np.array([0, 1, 2, 3, 1 << 20, (1 << 20) + 1, (1 << 44) - 1, 1 << 50, 1 << 62]),
        ]
    )
    want = [
        0 if x <= 0 else min(NB - 1, 1 + int(np.floor(np.log2(np.float64(x)) * 32)))
        for x in v.tolist()
    ]
    assert bins_of(v).tolist() == want
    offset = np.arange(len(v), dtype=np.int64) * NB
    out = np.empty(len(v), dtype=np.int64)
    add_bins(v, out, offset)
    assert (out - offset).tolist() == want


def test_group_keys_are_named_and_a_summary_pickles() -> None:
    """The summary's groups are keyed by named fields (rank, mode, reason, uniform decode,
    query length, class), and a summary survives pickling whole (a summary handed between
    processes)."""
    s = summarize_recording(Recording.open(TP2))
    pids = set(s.ranks)
    for k in s.groups:
        assert isinstance(k, Key)
        assert k.pid in pids and k.mode in (0, 1, 2) and k.decode in (0, 1)
        assert 0 <= k.query_len <= 255 and k.step_class in range(6)
        assert k.of_class(STEADY) == Key(k.pid, k.mode, k.reason, k.decode, k.query_len, 0)
    again = pickle.loads(pickle.dumps(s))
    assert list(again.groups) == list(s.groups)
    assert again.figures() == s.figures()
    assert again.merge(s).figures()["forward_steps"] == 2 * s.figures()["forward_steps"]


def _rewrite(rec: Path, table: str, column: str, row: int, value: object, **write: Any) -> str:
    """Table ``table`` of the columnar recording ``rec`` written again with ``column`` of
    ``row`` set to ``value`` (``write``: pyarrow's writer options); the row's step, as an
    error names it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(rec / f"{table}.parquet")
    i = t.schema.get_field_index(column)
    values = t.column(i).to_pylist()
    if value is not _SAME:
        values[row] = value
    kind = t.schema.field(i).type
    kind = kind.value_type if pa.types.is_dictionary(kind) else kind
    t = t.set_column(i, pa.field(column, kind, nullable=True), pa.array(values, kind))
    pq.write_table(t, rec / f"{table}.parquet", **write)
    return f"(pid {t.column('pid')[row]}, step {t.column('step')[row]})"


_SAME = object()


@pytest.mark.parametrize(
    ("table", "column", "value", "why"),
    [
        ("builds", "t1_ns", 0, "t1 is before t0"),
        ("builds", "tag", "stepp", "tag is not one of step, capture, drafting"),
        ("builds", "drafter", None, "drafter is NULL"),
        ("builds", "t0_ns", None, "t0_ns is NULL"),
        ("reorders", "threshold", -2, "threshold is below -1"),
        ("reorders", "moved", None, "moved is NULL"),
        ("reorders", "step", -1, "step is not a step key"),
    ],
)
def test_a_columnar_recordings_detail_values_are_checked(
    tmp_path: Path, table: str, column: str, value: object, why: str
) -> None:
    """The builds and reorders a columnar recording's summary aggregates in SQL: a value
    that does not fit its column is the one error naming its table, step and column."""
    rec = copy_recording(default_recording(), tmp_path / "bad.probe")
    where = _rewrite(rec, table, column, 7, value)
    with pytest.raises(RecordingError) as err:
        summarize_recording(Recording.open(rec))
    assert f"{table} row {where}: {why}" in str(err.value)


def test_a_columnar_recording_without_statistics_gives_the_same_summary(
    tmp_path: Path,
) -> None:
    """Where a file's statistics cannot show its values fitting, they are read and
    checked, and the summary is the same."""
    rec = copy_recording(default_recording(), tmp_path / "plain.probe")
    for table, column in (("builds", "tag"), ("reorders", "threshold")):
        _rewrite(rec, table, column, 0, _SAME, write_statistics=False)
    want = summarize_recording(Recording.open(default_recording())).figures()
    assert summarize_recording(Recording.open(rec)).figures() == want


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("num_tokens", -3, "num_tokens does not fit its column"),
        ("gpu_step_ns", -2, "gpu_step_ns does not fit its column"),
        ("t1_ns", 0, "t1_ns is before t0_ns"),
    ],
)
@pytest.mark.parametrize("statistics", [True, False])
def test_a_columnar_recordings_step_values_are_checked(
    tmp_path: Path, column: str, value: object, why: str, statistics: bool
) -> None:
    """A step value that does not fit its column is the one error naming the step, with
    or without the file's statistics (the columns they vouch for are not checked again:
    a file's own statistics show the bad value, and its column is checked)."""
    rec = copy_recording(default_recording(), tmp_path / "bad.probe")
    where = _rewrite(rec, "steps", column, 7, value, write_statistics=statistics)
    opened = Recording.open(rec)
    if "does not fit" in why:  # t1 before t0 is checked whatever the statistics show
        assert column not in opened.steps_vouched()  # type: ignore[union-attr]
    with pytest.raises(RecordingError) as err:
        summarize_recording(opened)
    assert f"steps row {where}: {why}" in str(err.value)


def test_the_step_columns_statistics_vouch_for() -> None:
    """Of the bundled recording, every integer and boolean step column with a bound is
    vouched for by its statistics (text columns never are)."""
    from probe.reader.columnar_schema import is_text
    from probe.step import STEP_COLUMNS

    got = Recording.open(default_recording()).steps_vouched()  # type: ignore[union-attr]
    checked = [c for c in STEP_COLUMNS if c.kind is bool or c.min is not None]
    assert got == {c.name for c in checked if not is_text(c.kind)}


def test_a_columnar_recording_without_step_statistics_gives_the_same_summary(
    tmp_path: Path,
) -> None:
    rec = copy_recording(default_recording(), tmp_path / "plain.probe")
    _rewrite(rec, "steps", "num_tokens", 0, _SAME, write_statistics=False)
    opened = Recording.open(rec)
    assert not opened.steps_vouched()  # type: ignore[union-attr]
    want = summarize_recording(Recording.open(default_recording())).figures()
    assert summarize_recording(opened).figures() == want


def test_detail_rows_of_no_step_count_in_neither_format(tmp_path: Path) -> None:
    """A build or reorder row whose step is not in ``steps`` belongs to no step: the
    summaries of the columnar recording and of its SQLite copy leave it out alike."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from probe.reader.columnar_convert import convert

    rec = copy_recording(default_recording(), tmp_path / "extra.probe")
    for table in ("builds", "reorders"):
        t = pq.read_table(rec / f"{table}.parquet")
        extra = t.slice(0, 1).set_column(1, "step", pa.array([10**9], pa.int64()))
        pq.write_table(pa.concat_tables([t, extra.cast(t.schema)]), rec / f"{table}.parquet")
    db = tmp_path / "extra.probe.db"
    convert(rec, db, to_sqlite=True)
    want = summarize_recording(Recording.open(default_recording()))
    for path in (rec, db):
        got = summarize_recording(Recording.open(path))
        assert got.reorders == want.reorders and got.thresholds == want.thresholds
        assert list(got.builds) == list(want.builds)
        assert all((got.builds[k] == want.builds[k]).all() for k in want.builds)


def test_the_build_buckets_in_sql_are_the_columns_buckets() -> None:
    """The builds' SQL (one text for SQLite and DuckDB) buckets a duration as
    :func:`bins_of` does: in DuckDB across every bucket edge, the last bucket and 0 or
    less; in SQLite, whose log2 can differ in the last place right at an edge, off the
    edges."""
    import duckdb

    from probe.analysis.summary_read import build_histogram_sql

    rng = np.random.default_rng(5)
    edges = np.exp2(np.arange(1, NB) / 32).astype(np.int64)
    spread = np.concatenate([rng.integers(-3, 1 << 40, 2000), [0, 1, 2, 1 << 50, 1 << 62]])
    at_edges = np.concatenate([spread, edges - 1, edges, edges + 1])
    for db, dur in ((duckdb.connect(), at_edges), (sqlite3.connect(":memory:"), spread)):
        dur = np.unique(dur)
        rows = [(f"b{i}", "step", 0, 10**12, 10**12 + d) for i, d in enumerate(dur.tolist())]
        db.execute("CREATE TABLE builds (builder TEXT, tag TEXT, drafter INTEGER, "
                   "t0_ns BIGINT, t1_ns BIGINT)")  # fmt: skip
        db.executemany("INSERT INTO builds VALUES (?, ?, ?, ?, ?)", rows)
        got = {r[0]: r[3] for r in db.execute(build_histogram_sql(False)).fetchall()}
        assert got == dict(zip((r[0] for r in rows), bins_of(dur).tolist(), strict=True))
