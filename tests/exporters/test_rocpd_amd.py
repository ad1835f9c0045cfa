"""rocpd against AMD's own SQL (``tests/data/rocpd-schema``, copied from ROCm/rocm-systems).

For each schema version stored there, a database is built by executing AMD's SQL (tables,
indexes, views, with the ``{{uuid}}``/``{{guid}}`` rule of ``SOURCES.md`` §4), the side-car
writer fills one with the probe's rows (a real recording's spans, real rocprofv3 kernels and
API calls), and both the probe's reader and AMD's own views read them back. The built-in
schema (no ROCm installed) must have exactly AMD's tables, columns and foreign keys.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from profiles_data import profile_path, rocpd_schema_dir

from exporters.rocprof_sidecar import sidecar_spans
from exporters.timelines.model import GpuKernel
from exporters.timelines.rocpd import read_rocpd
from exporters.timelines.rocpd_schema import (
    RocpdSql,
    amd_sql,
    fallback_sql,
    find_installed,
    schema_for,
    substitute,
)
from exporters.timelines.rocpd_writer import create_rocpd_db
from exporters.timelines.rocprofv3_csv import read_rocprofv3_csv
from probe.reader.recording import Recording

ROOT = Path(__file__).resolve().parents[2]
WINDOW = ROOT / "tests/data/groundtruth-window.probe"
GUID = "00000000-0000-0000-0000-000000000000"


def _schema_dir() -> Path:
    return rocpd_schema_dir()


def _amd(version: str) -> RocpdSql:
    """The consistent set of AMD's files for ``version`` (SOURCES.md §5)."""
    d = _schema_dir()
    read = lambda rel: (d / rel).read_text(encoding="utf-8")  # noqa: E731
    if version == "3":  # the whole set of one commit: what rocprofv3 of ROCm 7.0 writes
        found = amd_sql(d / "snapshot-1b1610fc", "3")
        assert found is not None
        return found
    if version == "3.0.3":  # 3.0.3 has no rocpd_views.sql of its own; the top-level one fits
        views = (read("rocpd_views.sql"), read("versions/3.0.3/data_views.sql"))
        return RocpdSql("3.0.3", read("versions/3.0.3/rocpd_tables.sql"), "", views, str(d))
    if version == "3.0.4":  # versions.yml maps 3.0.4 to the top-level files
        found = amd_sql(d, "3.0.4")
        assert found is not None
        return found
    assert version == "4.1.0"  # not in versions.yml; its views need unsuffixed tables
    return RocpdSql(
        "4.1.0",
        read("versions/4.1.0/rocpd_tables.sql"),
        read("versions/4.1.0/rocpd_indexes.sql"),
        (read("versions/4.1.0/data_views.sql"),),
        str(d),
        suffixed=False,
    )


def _build_amd(path: Path, sql: RocpdSql) -> None:
    """Execute AMD's SQL the way rocprofiler-sdk's Python RocpdSchema.write_schema does."""
    conn = sqlite3.connect(path)
    uuid = GUID if sql.suffixed else ""
    conn.executescript("PRAGMA foreign_keys = ON;\n\n" + substitute(sql.tables, uuid, GUID))
    conn.executescript(substitute(sql.indexes, uuid, GUID))
    conn.executescript("\n".join(substitute(v, uuid, GUID) for v in sql.views))
    conn.commit()
    conn.close()


def _shape(path: Path) -> dict[str, Any]:
    """Tables (columns, foreign keys), views (output columns) and indexes of a database."""
    conn = sqlite3.connect(path)
    objects = list(
        conn.execute("SELECT name, type FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
    )
    out: dict[str, Any] = {"table": {}, "view": {}, "index": set()}
    for name, kind in objects:
        if kind == "table":
            cols = tuple(tuple(r[1:]) for r in conn.execute(f'PRAGMA table_xinfo("{name}")'))
            fks = frozenset(
                tuple(r[2:5]) for r in conn.execute(f'PRAGMA foreign_key_list("{name}")')
            )
            out["table"][name] = (cols, fks)
        elif kind == "view":
            try:
                cols = tuple(r[1] for r in conn.execute(f'PRAGMA table_xinfo("{name}")'))
            except sqlite3.OperationalError as exc:  # 3.0.4: two of AMD's views name tables
                cols = ("cannot be resolved", str(exc))  # its tables file lacks (SOURCES §5)
            out["view"][name] = cols
        elif kind == "index":
            out["index"].add(name)
    conn.close()
    return out


VERSIONS = ("3", "3.0.3", "3.0.4", "4.1.0")


@pytest.fixture(scope="module")
def rows() -> tuple[list[Any], list[GpuKernel], list[Any]]:
    """What the side-car writes: the H200 window recording's spans, and a real rocprofv3
    capture's kernels and API calls (kernels given the capture's pid so every row of AMD's
    kernels view resolves its process)."""
    spans = list(sidecar_spans(Recording.open(WINDOW)))
    csv = read_rocprofv3_csv(profile_path("rocprofv3-csv", "rocm-systems-2025-08"))
    pid = csv.host_calls[0].pid
    kernels = [replace(k, pid=pid, stream=k.stream or 0, queue=k.queue or 0) for k in csv.kernels]
    return spans, kernels, list(csv.host_calls)


def _write(path: Path, sql: RocpdSql, rows: tuple[list[Any], list[GpuKernel], list[Any]]) -> None:
    spans, kernels, calls = rows
    with create_rocpd_db(path, sql.version, GUID, sql=sql, machine_id="m", hostname="h") as db:
        db.add_regions(spans)
        db.add_kernels(kernels)
        db.add_host_calls(calls)


@pytest.mark.parametrize("version", VERSIONS)
def test_side_car_has_amds_schema_and_reads_back(
    tmp_path: Path, version: str, rows: tuple[list[Any], list[GpuKernel], list[Any]]
) -> None:
    sql = _amd(version)
    amd, ours = tmp_path / "amd.db", tmp_path / "probe_results.db"
    _build_amd(amd, sql)
    _write(ours, sql, rows)
    assert _shape(ours) == _shape(amd)  # the schema diff is empty
    spans, kernels, calls = rows
    back = read_rocpd(ours)
    # 3.0.4's top-level tables file (6f0d58b9) itself inserts schema_version "3"
    assert back.meta["schema_version"] == ("3" if version == "3.0.4" else version)
    assert sorted(back.kernels, key=lambda k: k.start_ns) == sorted(
        kernels, key=lambda k: k.start_ns
    )
    assert len(back.host_calls) == len(calls)
    got = {(m.name, m.start_ns, m.end_ns, m.category) for m in back.markers}
    assert got == {(s.name, s.start_ns, s.end_ns, s.category) for s in spans}


@pytest.mark.parametrize("version", ["3", "3.0.3", "4.1.0"])
def test_amds_own_views_read_the_side_car(
    tmp_path: Path, version: str, rows: tuple[list[Any], list[GpuKernel], list[Any]]
) -> None:
    """AMD's ``regions``, ``samples`` and ``kernels`` views return every row written."""
    ours = tmp_path / "probe_results.db"
    _write(ours, _amd(version), rows)
    spans, kernels, calls = rows
    conn = sqlite3.connect(ours)
    n_regions = conn.execute("SELECT count(*) FROM regions").fetchone()[0]
    n_samples = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
    assert n_regions + n_samples == len(spans) + len(calls)
    assert conn.execute("SELECT count(*) FROM kernels").fetchone()[0] == len(kernels)
    first = min(kernels, key=lambda k: k.start_ns)
    name, start, end = conn.execute(
        'SELECT name, start, "end" FROM kernels ORDER BY start LIMIT 1'
    ).fetchone()
    assert (name, start, end) == (first.name, first.start_ns, first.end_ns)
    for (view,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'"):
        conn.execute(f'SELECT * FROM "{view}" LIMIT 1').fetchall()  # every view works
    conn.close()


@pytest.mark.parametrize("version", ["3", "3.0.3", "4.1.0"])
def test_built_in_schema_is_amds(tmp_path: Path, version: str) -> None:
    """Without ROCm, the side-car's tables, columns and foreign keys are AMD's exactly, and
    its views are AMD's rocpd_views.sql (the analysis views come with ROCm's files)."""
    amd, ours = tmp_path / "amd.db", tmp_path / "ours.db"
    amd_set = _amd(version)
    _build_amd(amd, amd_set)
    create_rocpd_db(ours, version, GUID, sql=fallback_sql(version), machine_id="m").close()
    a, b = _shape(amd), _shape(ours)
    assert b["table"] == a["table"]
    if amd_set.suffixed:
        pass_through = {n: c for n, c in a["view"].items() if n.startswith("rocpd_")}
        assert b["view"] == pass_through
    else:
        assert b["view"] == {}


def test_amd_3_0_0_tables_do_not_load_and_are_not_claimed() -> None:
    """AMD's versions/3.0.0 tables declare rocpd_event_operation.type_id twice."""
    text = (_schema_dir() / "versions/3.0.0/rocpd_tables.sql").read_text(encoding="utf-8")
    with pytest.raises(sqlite3.OperationalError, match="duplicate column name: type_id"):
        sqlite3.connect(":memory:").executescript(substitute(text, GUID, GUID))
    with pytest.raises(ValueError, match="no built-in rocpd schema"):
        schema_for("3.0.0", roots=())


def test_installed_rocm_sql_is_used(tmp_path: Path) -> None:
    """A ROCm install (``<prefix>/share/rocprofiler-sdk-rocpd``) is found and preferred."""
    share = tmp_path / "rocm-7.0.0" / "share" / "rocprofiler-sdk-rocpd"
    share.mkdir(parents=True)
    for f in (_schema_dir() / "snapshot-1b1610fc").iterdir():
        (share / f.name).write_bytes(f.read_bytes())
    root = str(tmp_path / "rocm")  # /opt/rocm absent: /opt/rocm-7.0.0 beside it is used
    found = find_installed("3", roots=(root,))
    assert found is not None and found.source == str(share)
    assert len(found.views) == 4
    assert schema_for("3", roots=(root,)) == found
    assert schema_for("4.1.0", roots=(root,)).source == "built-in tables"


def test_timestamp_spine_layout_is_read(tmp_path: Path) -> None:
    """The rocpd 4.0 layout keeps region, sample and kernel times in ``rocpd_timestamp``
    (start_id/end_id); built here from AMD's 4.1.0 tables with the times moved there."""
    src = tmp_path / "track.db"
    with create_rocpd_db(src, "4.1.0", GUID, sql=_amd("4.1.0"), machine_id="m") as db:
        db.add_kernels([GpuKernel("gemm", 1000, 2000, 0, 0, 7, 42, 43, queue=1)])
        db.add_regions([_Span("step 1", 500, 2500, 42, 43, "PROBE_MARKER_STEP")])
    conn = sqlite3.connect(src)
    conn.execute("CREATE TABLE rocpd_timestamp (id INTEGER PRIMARY KEY, value BIGINT, phase INT)")
    for table in ("rocpd_region", "rocpd_kernel_dispatch"):
        conn.execute(f"ALTER TABLE {table} ADD COLUMN start_id INTEGER")
        conn.execute(f"ALTER TABLE {table} ADD COLUMN end_id INTEGER")
        for rid, start, end in conn.execute(f'SELECT id, start, "end" FROM {table}').fetchall():
            s = conn.execute("INSERT INTO rocpd_timestamp (value, phase) VALUES (?, 1)", (start,))
            e = conn.execute("INSERT INTO rocpd_timestamp (value, phase) VALUES (?, 2)", (end,))
            conn.execute(
                f'UPDATE {table} SET start = -1, "end" = -1, start_id = ?, end_id = ? WHERE id = ?',
                (s.lastrowid, e.lastrowid, rid),
            )
    conn.execute("ALTER TABLE rocpd_sample ADD COLUMN timestamp_id INTEGER")
    conn.execute("UPDATE rocpd_metadata SET value = '4.0.0' WHERE tag = 'schema_version'")
    conn.commit()
    conn.close()
    back = read_rocpd(src)
    assert back.meta["layout"] == "spine"
    assert [(k.name, k.start_ns, k.end_ns) for k in back.kernels] == [("gemm", 1000, 2000)]
    assert [(m.name, m.start_ns, m.end_ns) for m in back.markers] == [("step 1", 500, 2500)]


class _Span:
    def __init__(self, name: str, start: int, end: int, pid: int, tid: int, cat: str) -> None:
        self.name, self.start_ns, self.end_ns = name, start, end
        self.pid, self.tid, self.category = pid, tid, cat
