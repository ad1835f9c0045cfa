"""``probe export --parquet``: the recording's tables as Parquet, queried by DuckDB and
pyarrow with the report's figures; several recordings (or a glob) exported as one."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from recordings import committed, copy_recording, raw_rows, sqlite_of

from probe.cli.main import main
from probe.reader.recording import (
    Recording,
    RecordingWriter,
    default_recording,
    record_fields,
    step_fields,
)
from probe.reader.recording_schema import DETAIL_TABLES
from probe.reader.recording_set import open_many
from probe.records import Mode, Reason
from probe.step import STEP_COLUMNS

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")

ROOT = Path(__file__).resolve().parents[2]
TP2 = ROOT / "tests" / "data" / "serve-tp2.probe"

# the headline as docs/parquet.md gives it, over every forward step (the report's `ratios`)
HEADLINE = """
SELECT
  count(*) FILTER (WHERE mode = 'full') / count(*) AS full_hit_rate,
  count(*) FILTER (WHERE mode IN ('full', 'piecewise')) / count(*) AS graph_rate,
  count(*) FILTER (WHERE mode = 'full' AND uniform = 1 AND uniform_decode_query_len >= 1)
    / count(*) FILTER (WHERE uniform = 1 AND uniform_decode_query_len >= 1)
    AS decode_full_hit_rate,
  avg(cpu_launch_overhead_ns) AS cpu_launch_overhead_mean
FROM read_parquet('{root}/steps/**/*.parquet', hive_partitioning = true)
WHERE mode IS NOT NULL AND (pid, step) NOT IN (SELECT * FROM (VALUES {warmup}) AS w(pid, step))
"""
NAMES = ("full_hit_rate", "graph_rate", "decode_full_hit_rate", "cpu_launch_overhead_mean")


def _sql(query: str) -> list[tuple[object, ...]]:
    with duckdb.connect() as con:
        rows: list[tuple[object, ...]] = con.execute(query).fetchall()
    return rows


def _write_recording(path: Path) -> None:
    """A recording written by the probe's writer: the bundled worker's steps and the TP=2
    workers', every third decode step of the bundled one turned FULL (so that each
    headline ratio is neither 0 nor 1)."""
    w = RecordingWriter(path)
    w.set_meta(host="test-host", started_epoch_ns=1_796_023_565_916_789_501)
    for src in (default_recording(), TP2):
        rec = Recording.open(src)
        for p in rec.processes():
            w.add_process(p["pid"], None)
            if p["snapshot"] is not None:
                w.set_snapshot(p["pid"], p["snapshot"])
        for pid, names in rec.builder_names().items():
            w.set_strings(pid, names)
        steps = []
        for s in rec.iter_steps():
            if src == default_recording() and s.decode and s.step % 3 == 0:
                s = dataclasses.replace(s, mode=Mode.FULL, reason=Reason.HIT)
            steps.append(s)
        w.add_steps(steps)
        rec.close()
    w.close()


def _report_ratios(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, float], str]:
    """The report's ratios (over steady state) and its warm-up steps as SQL ``VALUES``
    rows, so that the query leaves out the same steps (docs/rules.md)."""
    capsys.readouterr()
    assert main(["report", str(path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    listed = rep["warmup"]["listed"]
    assert len(listed) == rep["warmup"]["steps"]  # every warm-up step named
    warmup = ", ".join(f"({w['pid']}, {w['step']})" for w in listed) or "(-1, -1)"
    ratios: dict[str, float] = rep["ratios"]
    return ratios, warmup


def test_duckdb_headline_equals_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = tmp_path / "run.probe.db"
    _write_recording(rec)
    out = tmp_path / "pq"
    assert main(["export", str(rec), "--parquet", str(out), "--no-progress"]) == 0
    want, warmup = _report_ratios(rec, capsys)
    [got] = _sql(HEADLINE.format(root=out, warmup=warmup))
    for name, value in zip(NAMES, got, strict=True):
        assert want[name] > 0
        assert value == pytest.approx(want[name], rel=1e-12), name
    assert want["full_hit_rate"] < 1 and want["decode_full_hit_rate"] < 1
    # the partitions: host and the day the recording started
    hosts = _sql(
        f"SELECT DISTINCT host, date::VARCHAR FROM read_parquet('{out}/steps/**/*.parquet', "
        "hive_partitioning = true)"
    )
    assert hosts == [("test-host", "2026-11-30")]


def test_pyarrow_reads_the_schema_and_every_row(tmp_path: Path) -> None:
    out = tmp_path / "pq"
    assert main(["export", "--parquet", str(out), "--no-progress"]) == 0
    rec = Recording.open(default_recording())
    db = raw_rows(default_recording())  # the same recording's rows, read with SQL
    steps = pq.read_table(out / "steps")
    assert steps.column_names[: len(STEP_COLUMNS)] == [c.name for c in STEP_COLUMNS]
    assert steps.num_rows == sum(rec.step_counts().values())
    field = steps.schema.field("cpu_launch_overhead_ns")
    assert field.type == pa.int64() and field.metadata[b"unit"] == b"ns"
    assert steps.schema.field("mode").metadata[b"values"] == b"none,piecewise,full"
    assert steps.schema.field("uniform").metadata[b"unit"] == b"0/1"
    meta = steps.schema.metadata
    assert json.loads(meta[b"vllm_graph_probe.meta"])["host"] == rec.meta()["host"]
    # every detail row, as the recording holds it (rows of a step not in steps aside)
    for table in ("spans", "dispatches", "replays", "builds", "reorders"):
        t = pq.read_table(out / table)
        n = db.execute(
            f"SELECT count(*) FROM {table} AS d WHERE EXISTS "
            "(SELECT 1 FROM steps AS s WHERE s.pid = d.pid AND s.step = d.step)"
        ).fetchone()[0]
        assert t.num_rows == n, table
    spans = pq.read_table(out / "spans").to_pylist()
    first = db.execute(
        "SELECT pid, step, phase, t0_ns, t1_ns, drafter FROM spans ORDER BY pid, step, rowid"
    ).fetchone()
    assert {k: spans[0][k] for k in ("pid", "step", "phase", "t0_ns", "t1_ns", "drafter")} == (
        dict(first)
    )


def test_a_glob_of_recordings_exports_as_one(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for name, src in (("a", default_recording()), ("b", TP2)):
        copy_recording(src, ranks / f"{name}.probe")
    out = tmp_path / "pq"
    assert main(["export", str(ranks / "*.probe"), "--parquet", str(out), "--no-progress"]) == 0
    [n] = _sql(
        f"SELECT count(DISTINCT pid), count(*) FROM read_parquet('{out}/steps/**/*.parquet')"
    )
    both = open_many([ranks / "*.probe"])
    assert n == (len(both.step_counts()), sum(both.step_counts().values()))
    assert len(both.step_counts()) == 3
    # again, into the same folder: refused, nothing overwritten, unless --force
    assert main(["export", str(ranks / "*.probe"), "--parquet", str(out)]) == 2
    assert main(["export", str(ranks / "*.probe"), "--parquet", str(out), "--force"]) == 0


def test_a_glob_that_matches_nothing_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(tmp_path / "*.probe.db"), "--parquet", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("probe: error: ") and "no recording matches" in err
    assert len(err.strip().splitlines()) == 1


def test_missing_pyarrow_names_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.delitem(sys.modules, "exporters.parquet", raising=False)
    assert main(["export", "--parquet", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "needs the 'parquet' extra" in err and "vllm-graph-probe[parquet]" in err
    assert not (tmp_path / "o").exists()


def _tables(out: Path) -> dict[str, list[dict[str, object]]]:
    """Each table's rows of an export of one recording (its one file per table)."""
    from exporters.parquet import TABLES

    got = {}
    for t in TABLES:
        [f] = (out / t).rglob("*.parquet")
        got[t] = pq.read_table(f).to_pylist()
    return got


@pytest.mark.parametrize("path", committed())
@pytest.mark.parametrize("fmt", ["columnar", "sqlite"])
def test_every_table_holds_the_rows_of_the_steps(tmp_path: Path, path: str, fmt: str) -> None:
    """The tables read as columns hold what :meth:`Recording.iter_steps` gives, each value
    as the recording's row holds it (``step_fields``, ``record_fields``), in step order."""
    from exporters.parquet import schema, write

    rec = Recording.open(path if fmt == "columnar" else sqlite_of(path))
    assert write(rec, tmp_path / "pq") == rec.record_count() + len(rec.processes())
    got = _tables(tmp_path / "pq")
    steps = list(rec.iter_steps())
    assert got["steps"] == [step_fields(s) for s in steps]
    names = rec.builder_names()
    for t in DETAIL_TABLES:
        want = [
            {"pid": s.pid, "step": s.step, **record_fields(r, names[s.pid].get)}
            for s in steps
            for r in getattr(s, t.step_field)
        ]
        assert got[t.name] == want, t.name
    for name in got:
        [f] = (tmp_path / "pq" / name).rglob("*.parquet")
        assert pq.read_schema(f).remove_metadata().equals(schema(name), check_metadata=True)
