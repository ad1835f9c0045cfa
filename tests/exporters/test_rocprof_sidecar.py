"""rocpd side-car of the real H200 window recording: written, read back, schema detected."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from recordings import raw_rows

from exporters.rocprof_sidecar import detect_rocpd_layout, sidecar_spans, write_sidecar
from exporters.timelines.model import GpuKernel, ProfileError
from exporters.timelines.rocpd import read_rocpd
from exporters.timelines.rocpd_writer import create_rocpd_db
from probe.reader.recording import Recording

ROOT = Path(__file__).resolve().parents[2]
WINDOW = ROOT / "tests/data/groundtruth-window.probe"


def _key(m: object) -> tuple[object, ...]:
    return tuple(getattr(m, f) for f in ("name", "start_ns", "end_ns", "pid", "tid", "category"))


def test_read_back_gives_the_spans(tmp_path: Path) -> None:
    rec = Recording.open(WINDOW)
    out = tmp_path / "probe_results.db"
    n = write_sidecar(rec, out)
    prof = read_rocpd(out)
    assert prof.meta.get("schema_version") == "3"
    assert sorted(map(_key, prof.markers)) == sorted(map(_key, sidecar_spans(rec)))
    assert prof.kernels == () and prof.host_calls == ()
    counts = Counter(m.category for m in prof.markers)
    db = raw_rows(WINDOW)  # the same recording's rows, read with SQL
    for table, cat in (
        ("steps", "PROBE_MARKER_STEP"),
        ("spans", "PROBE_MARKER_PHASE"),
        ("dispatches", "PROBE_MARKER_DISPATCH"),
        ("replays", "PROBE_MARKER_REPLAY"),
        ("builds", "PROBE_MARKER_BUILD"),
        ("reorders", "PROBE_MARKER_REORDER"),
    ):
        assert counts[cat] == db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    assert n == len(prof.markers) == 483
    phases = {(m.start_ns, m.end_ns) for m in prof.markers if m.category == "PROBE_MARKER_PHASE"}
    assert phases == {tuple(r) for r in db.execute("SELECT t0_ns, t1_ns FROM spans")}


def test_schema_and_node_follow_the_rocprof_db(tmp_path: Path) -> None:
    rocprof = tmp_path / "1424_results.db"
    with create_rocpd_db(rocprof, "4.1.0", machine_id="abc123", hostname="mi355x-7"):
        pass
    origin = detect_rocpd_layout(rocprof)
    assert (origin.version, origin.machine_id, origin.hostname) == ("4.1.0", "abc123", "mi355x-7")
    out = tmp_path / "probe_results.db"
    write_sidecar(Recording.open(WINDOW), out, rocprof_db=rocprof)
    assert detect_rocpd_layout(out).version == "4.1.0"
    assert detect_rocpd_layout(out).hostname == "mi355x-7"
    assert len(read_rocpd(out).markers) == 483
    with pytest.raises(FileExistsError):
        write_sidecar(Recording.open(WINDOW), out)


def test_unknown_schema_in_the_rocprof_db(tmp_path: Path) -> None:
    rocprof = tmp_path / "v5_results.db"
    with create_rocpd_db(rocprof) as w:
        uuid = w.uuid
    con = sqlite3.connect(rocprof)
    con.execute(f"UPDATE rocpd_metadata_{uuid} SET value='5.0.0' WHERE tag='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(ProfileError, match=r"v5_results\.db: rocpd schema version '5\.0\.0'"):
        write_sidecar(Recording.open(WINDOW), tmp_path / "o.db", rocprof_db=rocprof)
    not_db = tmp_path / "x_results.db"
    not_db.write_text("hello")
    with pytest.raises(ProfileError, match="not an SQLite database"):
        detect_rocpd_layout(not_db)


def test_cli_export_and_merge_write_the_side_car(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from probe.cli.main import main

    out = tmp_path / "probe_results.db"
    assert main(["export", str(WINDOW), "--rocpd", str(out)]) == 0
    assert len(read_rocpd(out).markers) == 483
    assert main(["export", str(WINDOW), "--rocpd", str(out)]) == 2  # no silent overwrite
    assert "exists" in capsys.readouterr().err
    rocprof = tmp_path / "1424_results.db"
    with create_rocpd_db(rocprof, "4.1.0", machine_id="abc123", hostname="mi355x-7") as db:
        db.add_kernels([GpuKernel("gemm", 1000, 2000, 0, 0, 7, 1424, 1424)])
    side = tmp_path / "side.db"
    assert (
        main(["merge", str(WINDOW), str(rocprof), "--rocpd", str(side), "--allow-unaligned"]) == 0
    )
    assert "483 probe spans" in capsys.readouterr().out
    origin = detect_rocpd_layout(side)
    assert (origin.version, origin.hostname) == ("4.1.0", "mi355x-7")
