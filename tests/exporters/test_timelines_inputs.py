"""Hostile foreign inputs: each class of bad input is a clear ProfileError, at once.

Every case here hung, took memory, raised a parser exception, created files beside the
input or passed silently before the readers went through ``exporters.timelines.inputs``.
The error must name the file and, where there is one, the place in it.
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from recordings import raw_rows

from exporters.timelines.align import AlignmentError, align
from exporters.timelines.kineto import read_kineto
from exporters.timelines.load import load_profiles
from exporters.timelines.model import ProfileError
from exporters.timelines.rocpd import read_rocpd
from exporters.timelines.rocpd_writer import create_rocpd_db
from exporters.timelines.rocprofv3_csv import read_rocprofv3_csv
from probe.reader.recording import Recording

ROOT = Path(__file__).resolve().parents[2]
WINDOW = ROOT / "tests/data/groundtruth-window.probe"
KERNEL_HEADER = (
    "Kind,Agent_Id,Queue_Id,Kernel_Id,Kernel_Name,Correlation_Id,Start_Timestamp,"
    "End_Timestamp,Thread_Id\n"
)


def _probe(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "probe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def _one_error_line(r: subprocess.CompletedProcess[str], *mentions: str) -> None:
    assert r.returncode in (1, 2), r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("probe: error: "), r.stderr
    for m in mentions:
        assert m in lines[0], lines[0]


@pytest.fixture()
def rocpd_db(tmp_path: Path) -> Path:
    db = tmp_path / "r_results.db"
    with create_rocpd_db(db, "3", machine_id="m") as w:
        w.add_kernels(
            read_rocprofv3_csv(
                _csv(tmp_path, "kernel_trace.csv", ["KERNEL_DISPATCH,1,1,3,gemm,10,1000,2000,77"])
            ).kernels
        )
    return db


def _csv(d: Path, name: str, rows: list[str]) -> Path:
    p = d / name
    p.write_text(KERNEL_HEADER + "".join(r + "\n" for r in rows))
    return p


# -- inputs that are not regular files --------------------------------------------------------


def test_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    r = _probe("merge", str(WINDOW), str(fifo), "--report", timeout=20)  # hung before
    _one_error_line(r, str(fifo), "FIFO", "regular file")
    with pytest.raises(ProfileError, match="FIFO"):
        load_profiles([fifo])


def test_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="a device"):  # /dev/zero read forever before
        load_profiles(["/dev/zero"])
    with pytest.raises(ProfileError, match="a device"):
        read_rocpd("/dev/null")


def test_directory_named_as_a_database_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "x.db"
    d.mkdir()
    with pytest.raises(ProfileError, match="a directory"):
        read_rocpd(d)


# -- bounded decompression and nesting --------------------------------------------------------


def test_gzip_bomb_is_refused_without_the_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.json.gz"
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    with bomb.open("wb") as fh:
        chunk = b" " * (16 << 20)
        for _ in range(64):  # 1 GiB of spaces
            fh.write(comp.compress(chunk))
        fh.write(comp.flush())
    assert bomb.stat().st_size < 2 << 20
    code = (
        "import sys\n"
        "from exporters.timelines.kineto import read_kineto\n"
        "from exporters.timelines.model import ProfileError\n"
        "try:\n"
        f"    read_kineto({str(bomb)!r})\n"
        "except ProfileError as e:\n"
        "    print(e)\n"
        # VmHWM is this process's peak (ru_maxrss would include pytest's, kept over exec)
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    message, peak_kib = r.stdout.strip().splitlines()
    assert "decompression bomb" in message and str(bomb) in message
    assert int(peak_kib) < 400 * 1024  # KiB: far below the 1 GiB it expands to


def test_json_nested_deep_in_a_top_level_field(tmp_path: Path) -> None:
    p = tmp_path / "deep.json"
    p.write_text('{"traceEvents": [], "deviceProperties": ' + "[" * 900 + "]" * 900 + "}")
    with pytest.raises(ProfileError, match="nested deeper than 32 levels") as err:
        read_kineto(p)
    assert "deviceProperties" in str(err.value)


def test_huge_numbers_cost_nothing(tmp_path: Path) -> None:
    p = tmp_path / "huge.json"
    event = {"ph": "X", "cat": "cuda_runtime", "name": "x", "pid": 1, "tid": 1, "dur": 1}
    p.write_text(json.dumps({"traceEvents": [event]})[:-3] + ', "ts": 1e999999999}]}')
    with pytest.raises(ProfileError, match=r"'ts' is .*not a finite number"):
        read_kineto(p)
    p.write_text('{"traceEvents": [{"ts": ' + "9" * 5000 + "}]}")
    with pytest.raises(ProfileError, match="not JSON that can be read"):
        read_kineto(p)


# -- values of the wrong type or range --------------------------------------------------------


def test_kineto_nan_timestamp(tmp_path: Path) -> None:
    p = tmp_path / "nan.json"
    p.write_text(
        '{"traceEvents": [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", '
        '"pid": 1, "tid": 1, "ts": NaN, "dur": 3}]}'
    )
    with pytest.raises(ProfileError, match=r"traceEvents\[0\].*'ts' is nan, not a finite") as e:
        read_kineto(p)
    assert e.value.path == str(p) and e.value.where.startswith("traceEvents[0]")


def test_rocpd_start_stored_as_text(rocpd_db: Path) -> None:
    conn = sqlite3.connect(rocpd_db)
    (table,) = conn.execute(
        "SELECT name FROM sqlite_master WHERE name LIKE 'rocpd_kernel_dispatch_%'"
    ).fetchone()
    conn.execute(f"UPDATE {table} SET start = 'soon'")
    conn.commit()
    conn.close()
    with pytest.raises(ProfileError) as err:
        read_rocpd(rocpd_db)
    assert err.value.where == f"table {table} row id 1 column start"
    assert "'soon' (str) is not an integer timestamp" in err.value.problem


def test_csv_kernel_with_negative_times(tmp_path: Path) -> None:
    p = _csv(tmp_path, "kernel_trace.csv", ["KERNEL_DISPATCH,1,1,3,gemm,10,-5,-1,77"])
    with pytest.raises(ProfileError, match="line 2, column Start_Timestamp: timestamp -5"):
        read_rocprofv3_csv(p)


def test_overlap_looks_at_every_row(tmp_path: Path) -> None:
    """Two kernels far before and far after the recording straddle it, none inside."""
    rec = Recording.open(WINDOW)
    lo, hi = raw_rows(WINDOW).execute("SELECT min(t0_ns), max(t1_ns) FROM steps").fetchone()
    rows = [f"KERNEL_DISPATCH,1,1,3,a,10,{lo // 2},{lo // 2 + 5},77"]
    rows.append(f"KERNEL_DISPATCH,1,1,3,b,11,{hi * 2},{hi * 2 + 5},77")
    prof = read_rocprofv3_csv(_csv(tmp_path, "kernel_trace.csv", rows))
    with pytest.raises(AlignmentError, match="none of its events falls inside"):
        align(rec, prof)
    inside = read_rocprofv3_csv(
        _csv(tmp_path, "k2_kernel_trace.csv", [*rows, f"KERNEL_DISPATCH,1,1,3,c,12,{lo},{lo},77"])
    )
    assert align(rec, inside).method == "same clock"


# -- SQLite: views, URIs, nothing created beside the input -------------------------------------


def test_recursive_view_in_place_of_kernels_does_not_spin(rocpd_db: Path) -> None:
    conn = sqlite3.connect(rocpd_db)
    conn.execute("DROP VIEW IF EXISTS kernels")
    conn.execute(
        "CREATE VIEW kernels AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
        'SELECT n AS name, n AS start, n AS "end" FROM r'
    )
    conn.commit()
    conn.close()
    r = _probe("merge", str(WINDOW), str(rocpd_db), "--report", "--allow-unaligned", timeout=20)
    assert r.returncode == 0, r.stderr  # the file's views are never run
    assert "steps" in r.stdout


def test_base_table_replaced_by_a_view_is_refused(rocpd_db: Path) -> None:
    conn = sqlite3.connect(rocpd_db)
    (table,) = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'rocpd_region_%'"
    ).fetchone()
    conn.execute(f"ALTER TABLE {table} RENAME TO old_region")
    conn.execute(f"CREATE VIEW {table} AS SELECT * FROM old_region")
    conn.commit()
    conn.close()
    with pytest.raises(ProfileError, match=f"{table} is a view, expected a plain table"):
        read_rocpd(rocpd_db)


@pytest.mark.parametrize("name", ["run#1.db", "what?.db", "x%41.db", "sp ace.db"])
def test_database_names_with_uri_characters(tmp_path: Path, rocpd_db: Path, name: str) -> None:
    target = tmp_path / "d" / name
    target.parent.mkdir()
    target.write_bytes(rocpd_db.read_bytes())
    for decoy in ("run", "what", "xA.db", "sp"):  # what a wrongly built URI would open
        (target.parent / decoy).write_bytes(b"")
    assert [k.name for k in read_rocpd(target).kernels] == ["gemm"]


def test_wal_database_read_creates_nothing_beside_it(tmp_path: Path, rocpd_db: Path) -> None:
    conn = sqlite3.connect(rocpd_db)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()
    before = sorted(os.listdir(rocpd_db.parent))
    assert [k.name for k in read_rocpd(rocpd_db).kernels] == ["gemm"]
    assert sorted(os.listdir(rocpd_db.parent)) == before  # mode=ro made -wal and -shm


def test_gzip_csv_and_errors_name_the_file(tmp_path: Path) -> None:
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": 3}'))
    with pytest.raises(ProfileError, match=f"{p}: not a Kineto trace"):
        read_kineto(p)
