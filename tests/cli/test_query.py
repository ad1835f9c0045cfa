"""``probe query``: SQL over a fleet's recordings (two hosts, three recordings, in the
agent's ``host=/day=`` layout) as one dataset. The figure queries of docs/fleet.md, read
from the page, give ``probe report --json``'s figures over the same folder; the views carry
each recording's host, day and path; a SQLite recording is read through a temporary copy
that is gone afterwards; bad SQL, a damaged table and a glob that matches nothing are one
error line."""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
import shutil
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from fleet import (
    FLEET,
    as_host,
    committed,
    doc_queries,
    expected,
    in_order,
    probe,
)

from probe.reader.columnar import ColumnarWriter
from probe.reader.columnar_convert import convert
from probe.reader.recording import Recording


def query(*args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    r = probe("query", *args, "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    rows: list[dict[str, Any]] = json.loads(r.stdout)
    return rows


def test_the_set_is_two_hosts(rep: dict[str, Any]) -> None:
    hosts = {p["host"] for p in rep["processes"]}
    assert hosts == {host for _, host, _ in FLEET} and len(hosts) == 2
    assert len(rep["recordings"]) == len(FLEET)


@pytest.mark.parametrize("name", sorted(doc_queries()))
def test_doc_figure_equals_the_report(name: str, fleet: Path, rep: dict[str, Any]) -> None:
    rows = query(doc_queries()[name], str(fleet))
    want = expected(name, rep)
    assert want, name
    assert in_order(name, rows) == want


def test_the_doc_has_the_headline_figures() -> None:
    assert set(doc_queries()) == {"hit_rates_all", "miss_reasons", "nonforward_steps", "per_rank"}


def test_views_carry_host_day_and_recording(fleet: Path) -> None:
    rows = query(
        "SELECT recording, host, day, count(*) AS steps FROM steps GROUP BY ALL ORDER BY ALL",
        str(fleet),
    )
    want = []
    for name, host, day in FLEET:
        path = fleet / f"host={host}" / f"day={day}" / f"{name}.probe"
        with closing(Recording.open(path)) as rec:
            n = sum(rec.step_counts().values())
        want.append({"recording": str(path), "host": host, "day": day, "steps": n})
    assert rows == sorted(want, key=lambda r: (r["recording"], r["host"], r["day"]))
    assert query("SELECT * FROM recordings ORDER BY recording", str(fleet)) == [
        {k: r[k] for k in ("recording", "host", "day")} for r in rows
    ]
    # every table has the three columns, processes its host replaced by the folder's
    for table in ("spans", "dispatches", "replays", "builds", "reorders", "processes"):
        got = query(f"SELECT DISTINCT host, day FROM {table} ORDER BY ALL", str(fleet))
        assert {(r["host"], r["day"]) for r in got} <= {(h, d) for _, h, d in FLEET}
        assert got, table


def test_reasons_and_ranks_views(fleet: Path, rep: dict[str, Any]) -> None:
    reasons = query("SELECT * FROM reasons ORDER BY host, mode, reason", str(fleet))
    total: dict[tuple[str, str], int] = {}
    for r in reasons:
        total[(r["mode"], r["reason"])] = total.get((r["mode"], r["reason"]), 0) + r["steps"]
    assert total == {(m["mode"], m["reason"]): m["count"] for m in rep["miss_reasons"]}
    for host in {r["host"] for r in reasons}:
        assert sum(r["share"] for r in reasons if r["host"] == host) == pytest.approx(1.0)

    ranks = query("SELECT * FROM ranks ORDER BY host, pid", str(fleet))
    assert [(r["host"], r["pid"], r["forward_steps"], r["tp_rank"]) for r in ranks] == sorted(
        (p["host"], p["pid"], p["forward_steps"], p["tp_rank"]) for p in rep["processes"]
    )
    # the mean CPU launch overhead, from the recordings' own steps
    for name, host, day in FLEET:
        with closing(
            Recording.open(fleet / f"host={host}" / f"day={day}" / f"{name}.probe")
        ) as rec:
            launch: dict[int, list[int]] = {}
            for s in rec.iter_steps():
                if s.forward and s.cpu_launch_overhead_ns is not None:
                    launch.setdefault(s.pid, []).append(s.cpu_launch_overhead_ns)
        for r in ranks:
            if r["host"] == host and r["pid"] in launch:
                xs = launch[r["pid"]]
                assert r["mean_cpu_launch_overhead_ns"] == pytest.approx(sum(xs) / len(xs))


def test_explain_views_lists_every_view(fleet: Path) -> None:
    r = probe("query", "--explain-views", str(fleet), "--json")
    assert r.returncode == 0, r.stderr
    views = {v["view"]: [c["name"] for c in v["columns"]] for v in json.loads(r.stdout)}
    assert set(views) == {
        "steps", "spans", "dispatches", "replays", "builds", "reorders", "processes",
        "reasons", "ranks", "recordings",
    }  # fmt: skip
    for table in ("steps", "spans", "dispatches", "replays", "builds", "reorders", "processes"):
        assert views[table][-2:] == ["day", "recording"], table
        assert "host" in views[table] and views[table].count("host") == 1
    assert views["reasons"] == ["host", "mode", "reason", "steps", "share"]
    text = probe("query", "--explain-views", str(fleet))
    assert text.returncode == 0 and "mean_cpu_launch_overhead_ns" in text.stdout


def test_host_and_day_from_the_recording_without_partitions(tmp_path: Path) -> None:
    """A recording outside the host=/day= layout: its meta's host, the UTC day it started."""
    out = tmp_path / "loose.probe"
    as_host(committed("cpu_graphs_off"), out, "node-7", tmp_path)
    with closing(Recording.open(out)) as rec:
        started = rec.meta()["started_epoch_ns"]
    day = datetime.datetime.fromtimestamp(started // 10**9, tz=datetime.UTC).date()
    assert query("SELECT * FROM recordings", str(out)) == [
        {"recording": str(out), "host": "node-7", "day": day.isoformat()}
    ]


def test_sqlite_recording_through_a_temporary_copy(tmp_path: Path) -> None:
    db = tmp_path / "run.probe.db"
    n = convert(committed("cpu_graphs_off"), db)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    rows = query("SELECT recording, count(*) AS n FROM steps GROUP BY ALL", str(db), env=env)
    assert rows == [{"recording": str(db), "n": n}]
    assert list(scratch.iterdir()) == []
    # a bad query leaves nothing behind either
    r = probe("query", "SELECT nope FROM steps", str(db), env=env)
    assert r.returncode == 2 and list(scratch.iterdir()) == []


def test_a_recording_being_written_reads_to_its_last_flush(tmp_path: Path) -> None:
    with closing(Recording.open(committed("cpu_graphs_off"))) as rec:
        steps = list(rec.iter_steps())
    w = ColumnarWriter(tmp_path / "live.probe", commit_every_s=float("inf"))
    try:
        for pid in sorted({s.pid for s in steps}):
            w.add_process(pid, None)
        w.add_steps(steps[:40])
        w.commit()
        w.add_steps(steps[40:])  # not flushed: not read
        scratch = tmp_path / "scratch"
        scratch.mkdir()
        env = {**os.environ, "TMPDIR": str(scratch)}
        rows = query("SELECT count(*) AS n FROM steps", str(tmp_path / "live.probe"), env=env)
        assert rows == [{"n": 40}]
        assert list(scratch.iterdir()) == []  # its compacted copy is gone
    finally:
        w.close()
    assert query("SELECT count(*) AS n FROM steps", str(tmp_path / "live.probe")) == [
        {"n": len(steps)}
    ]


def test_csv_and_table(fleet: Path) -> None:
    sql = "SELECT host, count(*) AS steps FROM steps GROUP BY host ORDER BY host"
    r = probe("query", sql, str(fleet), "--csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert rows[0] == ["host", "steps"]
    assert [row[0] for row in rows[1:]] == sorted({h for _, h, _ in FLEET})
    t = probe("query", sql, str(fleet), "--width", "100")
    assert t.returncode == 0, t.stderr
    assert all(row[1] in t.stdout for row in rows[1:]) and "2 rows" in t.stdout
    empty = probe("query", "SELECT * FROM steps WHERE false", str(fleet), "--json")
    assert empty.returncode == 0 and json.loads(empty.stdout) == []


@pytest.mark.parametrize(
    "args, says",
    [
        (["SELEC 1"], "probe: error: query: Parser Error"),
        (["SELECT * FROM nope"], "probe: error: query: Catalog Error"),
        (["SELECT 1", "no-such-dir/*.probe"], "probe: error: no-such-dir/*.probe: no recording"),
        ([], "probe: error: query: give the SQL to run"),
    ],
)
def test_bad_input_is_one_line(args: list[str], says: str, fleet: Path) -> None:
    extra = [str(fleet)] if args and len(args) == 1 else []
    r = probe("query", *args, *extra)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    assert r.stderr.startswith(says) and r.stderr.count("\n") == 1, r.stderr


def test_a_damaged_table_is_one_line(fleet: Path, tmp_path: Path) -> None:
    copy = tmp_path / "fleet"
    shutil.copytree(fleet, copy)
    name, host, day = FLEET[0]
    steps = copy / f"host={host}" / f"day={day}" / f"{name}.probe" / "steps.parquet"
    steps.write_bytes(steps.read_bytes()[:100])
    r = probe("query", "SELECT count(*) FROM steps", str(copy))
    assert r.returncode in (1, 2), r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.startswith("probe: error: ") and r.stderr.count("\n") == 1, r.stderr
