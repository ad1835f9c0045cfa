"""Several recordings as one report: the rolling files of an agent on a server restarted
mid-run, and a second host's file, read as a folder's glob, as several files named or as
the folder, in text and ``--json``: each process once, its steps once, the set's steps their sum."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from probe.reader.recording import RecordingWriter
from probe.records import Mode, Reason
from probe.step import PHASES, Step, new_step

ROOT = Path(__file__).resolve().parents[2]


def _steps(pid: int, first: int, n: int, t0: int) -> list[Step]:
    return [
        new_step(
            pid=pid, step=k, t0=t0 + k * 10_000_000, t1=t0 + k * 10_000_000 + 5_000_000,
            host_ns=5_000_000, num_tokens=8, num_reqs=2, mode=Mode.FULL, reason=Reason.HIT,
            padded_tokens=8, padded_reqs=2, max_query_len=1, uniform_decode_query_len=1,
            uniform=True, replayed=True, pieces=0, captures=0, cpu_launch_overhead_ns=1000,
            phases=dict.fromkeys(PHASES, 0),
        )
        for k in range(first, first + n)
    ]  # fmt: skip


def _file(path: Path, host: str, rows: list[tuple[int, int, int, int]], dropped: int = 0) -> None:
    """A rolling file of ``host``: per process (pid, first step, steps, start ns)."""
    w = RecordingWriter(path)
    w.set_meta(host=host, command=["probe", "agent"], agent=True)
    for pid, first, n, t0 in rows:
        w.add_process(pid, None)
        w.set_snapshot(pid, {"role": "worker", "tp_rank": 0, "platform": "cpu", "model": "m"})
        w.set_dropped(pid, dropped)
        w.add_steps(_steps(pid, first, n, t0))
    w.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """Host a: pid 101 across two files (its ring dropped 3 records by the second), then
    the server restarted as pid 202; host b: pid 303."""
    d = tmp_path / "rec"
    d.mkdir()
    s = 10**12
    _file(d / "agent-a-1.probe.db", "a", [(101, 1, 40, s)], dropped=1)
    _file(d / "agent-a-2.probe.db", "a", [(101, 41, 30, s), (202, 1, 25, 2 * s)], dropped=3)
    _file(d / "agent-b-1.probe.db", "b", [(303, 1, 50, s)])
    return d


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probe", "report", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "120", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )


def _forms(d: Path) -> list[list[str]]:
    """The set as a quoted glob, as the files named, and as the folder itself."""
    files = sorted(str(p) for p in d.glob("*.probe.db"))
    return [[f"{d}/*.probe.db"], files, [str(d)]]


def test_json_lists_each_process_once_and_its_steps_add_up(fleet: Path) -> None:
    for args in _forms(fleet):
        out = _report(*args, "--json")
        assert out.returncode == 0, out.stderr
        rep = json.loads(out.stdout)
        procs = rep["processes"]
        assert [p["pid"] for p in procs] == [101, 202, 303]
        assert {p["pid"]: p["host"] for p in procs} == {101: "a", 202: "a", 303: "b"}
        assert {p["pid"]: p["forward_steps"] for p in procs} == {101: 70, 202: 25, 303: 50}
        assert {p["pid"]: p["dropped"] for p in procs} == {101: 3, 202: 3, 303: 0}
        assert sum(p["forward_steps"] for p in procs) == rep["hit_rates_all"]["steps"] == 145
        assert [r["pid"] for r in rep["per_rank"]] == [101, 202, 303]
        assert rep["meta"]["files"] == 3


def test_the_text_report_renders_each_process_once(fleet: Path) -> None:
    for args in _forms(fleet):
        out = _report(*args)
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr
        assert "forward steps" in out.stdout and "145" in out.stdout
        cells = [ln.strip("│ ").split() for ln in out.stdout.splitlines()]
        pids = [c[0] for c in cells if c and c[0] in ("101", "202", "303")]
        assert pids == ["101", "202", "303"], out.stdout
        assert "6 records dropped" in out.stdout  # 3 of 101 once, 3 of 202
        # one worker per engine generation, and one per host: nothing to side by side
        assert "ranks side by side" not in out.stdout, out.stdout


def test_a_folder_in_export_is_its_recordings(fleet: Path, tmp_path: Path) -> None:
    out = tmp_path / "set.prom"
    r = subprocess.run(
        [sys.executable, "-m", "probe", "export", str(fleet), "--prometheus-textfile", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert all(f'pid="{pid}"' in text for pid in (101, 202, 303))


def test_a_folder_without_recordings_is_one_error_line(tmp_path: Path) -> None:
    out = _report(str(tmp_path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"probe: error: {tmp_path}: a folder with no recording "
        "(*.probe.db, or a recording folder) in it"
    ]
