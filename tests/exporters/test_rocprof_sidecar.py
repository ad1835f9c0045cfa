"""rocpd side-car of the real H200 window recording: written, read back, schema detected;
the regions read from columns are those of the steps, on every committed recording."""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from recordings import committed, copy_recording, raw_rows, sqlite_of

from exporters.rocprof_sidecar import (
    SidecarSpan,
    detect_rocpd_layout,
    sidecar_spans,
    write_sidecar,
)
from exporters.timelines.model import GpuKernel, ProfileError
from exporters.timelines.rocpd import read_rocpd
from exporters.timelines.rocpd_writer import create_rocpd_db
from probe.reader.recording import Recording
from probe.reader.recording_set import RecordingSet, open_many
from probe.step import Step

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


def _step_spans(rec: Recording | RecordingSet) -> list[SidecarSpan]:
    """The side-car's regions built from :meth:`Recording.iter_steps`, named as the
    Perfetto timeline names its slices: the steps, then each kind's records in step order."""
    from exporters.perfetto import drafter_prefix, phase_name, step_name

    names = rec.builder_names()
    steps = list(rec.iter_steps())
    out = [SidecarSpan(step_name(s), s.t0, s.t1, s.pid, s.pid, "PROBE_MARKER_STEP") for s in steps]

    def span(s: Step, x: Any, name: str, marker: str) -> SidecarSpan:
        return SidecarSpan(name, x.t0, x.t1, s.pid, s.pid, f"PROBE_MARKER_{marker}")

    out += [span(s, x, phase_name(x), "PHASE") for s in steps for x in s.spans]
    out += [
        span(s, d, f"{drafter_prefix(d)}dispatch {d.mode.name} {d.reason.label} step {s.step}",
             "DISPATCH")
        for s in steps for d in s.dispatches
    ]  # fmt: skip
    out += [
        span(s, r, f"{drafter_prefix(r)}{r.kind.name.lower()} {r.mode.name} step {s.step}",
             "REPLAY")
        for s in steps for r in s.replays
    ]  # fmt: skip
    out += [
        span(s, b, f"{names[s.pid][b.builder_id]} ({b.tag.name.lower()})", "BUILD")
        for s in steps for b in s.builds
    ]  # fmt: skip
    out += [
        span(s, o, f"reorder {'changed' if o.changed else 'unchanged'} moved {o.moved} "
             f"step {s.step}", "REORDER")
        for s in steps for o in s.reorders
    ]  # fmt: skip
    return out


@pytest.mark.parametrize("path", committed())
@pytest.mark.parametrize("fmt", ["columnar", "sqlite"])
def test_the_regions_read_from_columns_are_those_of_the_steps(path: str, fmt: str) -> None:
    rec = Recording.open(path if fmt == "columnar" else sqlite_of(path))
    want = _step_spans(rec)
    assert len(want) == rec.record_count()
    assert list(sidecar_spans(rec, size=97)) == want


def test_the_regions_of_several_recordings_read_as_one() -> None:
    rs = open_many([ROOT / "probe/data/default.probe", ROOT / "tests/data/serve-tp2.probe"])
    got = list(sidecar_spans(rs, size=1000))
    assert len({s.pid for s in got}) == 3
    assert got == _step_spans(rs)


@pytest.mark.parametrize(
    ("table", "damage", "why"),
    [
        ("spans", "t1_ns = t0_ns - 1", "spans row .* t1"),
        ("dispatches", "drafter = 2", "dispatches row .* drafter is 2, not 0 or 1"),
        ("replays", "kind = 'bogus'", "replays row .* kind"),
        ("steps", "t0_ns = 'soon'", "steps"),
    ],
)
@pytest.mark.parametrize("flag", ["--rocpd", "--parquet"])
def test_a_damaged_value_is_one_error_and_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, damage: str, why: str,
    flag: str,
) -> None:  # fmt: skip
    from probe.cli.main import main

    if flag == "--parquet":
        pytest.importorskip("pyarrow")
    rec = copy_recording(sqlite_of(WINDOW), tmp_path / "bad.probe.db")
    with sqlite3.connect(rec) as db:
        db.execute(f"UPDATE {table} SET {damage} WHERE rowid = (SELECT max(rowid) FROM {table})")
    db.close()
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["export", str(rec), flag, str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("probe: error: ")
    assert re.search(f"damaged recording: {why}", err[0]), err[0]
    # no file written (the Parquet export's partition folders may be left, empty)
    assert not out.exists() or not [p for p in out.rglob("*") if not p.is_dir()]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.is_dir()) == ["bad.probe.db"]
