"""``probe ps --clean``: the rings and control sockets of processes that are gone are
removed (a process killed while attached leaves its ring in shared memory); those of
live processes, and files that are not ours to delete, stay."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_ps_clean_removes_what_dead_processes_left(run_dir: Path) -> None:
    dead, alive = _dead_pid(), os.getpid()
    (run_dir / f"ring-{dead}.shm").write_bytes(b"\0" * 4096)
    (run_dir / f"ring-{alive}.shm").write_bytes(b"\0" * 4096)
    (run_dir / "ring-notapid.shm").write_bytes(b"")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(run_dir / f"ctl-{dead}.sock"))
    s.close()
    out = subprocess.run(
        [sys.executable, "-m", "probe", "ps", "--clean", "--run-dir", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert "removed 1 ring(s) and 1 control socket(s)" in out.stderr, out.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == [f"ring-{alive}.shm", "ring-notapid.shm"]
