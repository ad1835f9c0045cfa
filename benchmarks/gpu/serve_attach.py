"""``probe attach`` against a live OpenAI-compatible vLLM server, on any machine with vLLM.

Starts the server (``python -m vllm.entrypoints.openai.api_server``: what ``vllm serve``
runs) with the probe's plugin discoverable, drives a bounded HTTP load on loopback, and
goes through what a user does:

1. greedy reference outputs, ``probe ps --url`` (every process: api, engine, workers);
2. a load window with nothing attached (HTTP output tok/s);
3. ``probe attach --url --record --duration`` under the same load (tok/s in that window),
   with the greedy prompts sent again while attached;
4. the same load window after detaching; ``probe ps`` shows every process disabled;
5. the greedy prompts again (identical?), ``probe doctor --url``, attach again by pid;
6. ``probe report --json`` of the recording: per-rank numbers.

Everything lands in ``--out`` (``serve-<name>.json``, the recording, the server log).

    python benchmarks/gpu/serve_attach.py --name tp2 --tp 2 --out OUT -- \\
        --attention-backend FLASHMLA_SPARSE --kv-cache-dtype fp8_ds_mla ...

Arguments after ``--`` go to the server. The script needs ``vllm`` and this project
importable by the interpreter that runs it (``PYTHONPATH``), and the project's
``vllm.general_plugins`` entry point visible to the server's processes
(``pip install .``, or ``--plugin-shim`` to write a minimal ``.dist-info`` for a tree
that is only on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def log(*a: Any) -> None:
    print(f"[serve {time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_plugin_shim(root: Path) -> Path:
    """A ``.dist-info`` with the project's entry point, for a tree run from PYTHONPATH."""
    d = root / "vllm_graph_probe-0.1.0.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-graph-probe\nVersion: 0.1.0\n")
    (d / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nvllm_graph_probe = probe.engine.plugin:register\n"
    )
    return root


class Client:
    def __init__(self, url: str, model: str, vocab: int) -> None:
        self.url, self.model, self.vocab = url, model, vocab
        self.tokens = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def complete(self, prompt: list[int], max_tokens: int) -> list[int]:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        req = urllib.request.Request(
            f"{self.url}/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            out: list[int] = json.loads(r.read())["choices"][0]["token_ids"]
        with self.lock:
            self.tokens += len(out)
        return out

    def prompts(self, seed: int, n: int, plen: int) -> list[list[int]]:
        rng = random.Random(seed)
        return [[rng.randrange(2, self.vocab) for _ in range(plen)] for _ in range(n)]

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        with cf.ThreadPoolExecutor(len(prompts)) as ex:
            return list(ex.map(lambda p: self.complete(p, max_tokens), prompts))


class Load:
    """``conc`` client threads sending requests back to back until stopped."""

    def __init__(self, c: Client, conc: int, plen: int, olen: int) -> None:
        self.c, self.conc, self.plen, self.olen = c, conc, plen, olen
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(conc)]

    def _run(self, i: int) -> None:
        rng = random.Random(1000 + i)
        while not self.stop.is_set():
            p = [rng.randrange(2, self.c.vocab) for _ in range(self.plen)]
            try:
                self.c.complete(p, self.olen)
            except Exception as exc:  # counted, the run goes on
                self.c.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.5)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=300)

    def window(self, seconds: float) -> float:
        t0, n0 = time.monotonic(), self.c.tokens
        time.sleep(seconds)
        return (self.c.tokens - n0) / (time.monotonic() - t0)


def probe_cmd(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "probe", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return {
        "argv": ["probe", *args],
        "rc": p.returncode,
        "stdout": p.stdout,
        "stderr": p.stderr,
        "wall_s": time.monotonic() - t0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=str(HERE / "tinyv32"))
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--out-len", type=int, default=64)
    ap.add_argument("--window", type=float, default=15.0, help="load window, s")
    ap.add_argument("--attach-s", type=float, default=20.0)
    ap.add_argument("--start-timeout", type=float, default=420.0)
    ap.add_argument("--plugin-shim", action="store_true")
    ap.add_argument("server_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = [x for x in a.server_args if x != "--"]
    run_dir = Path(tempfile.mkdtemp(prefix=f"probe-{a.name}-"))
    os.chmod(run_dir, 0o700)
    env = dict(os.environ, PROBE_RUN_DIR=str(run_dir), PYTHONUNBUFFERED="1")
    pp = [str(REPO)]
    if a.plugin_shim:
        pp.insert(0, str(write_plugin_shim(run_dir / "shim")))
    env["PYTHONPATH"] = ":".join([*pp, env.get("PYTHONPATH", "")]).rstrip(":")
    for k, v in (
        ("NCCL_NVLS_ENABLE", "0"),
        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
        ("VLLM_USE_FLASHINFER_SAMPLER", "0"),
    ):
        env.setdefault(k, v)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", a.model, "--load-format", "dummy", "--skip-tokenizer-init",
        "--tensor-parallel-size", str(a.tp), "--seed", "0",
        "--host", "127.0.0.1", "--port", str(port), *extra,
    ]  # fmt: skip
    res: dict[str, Any] = {"name": a.name, "tp": a.tp, "server_cmd": cmd, "steps": []}
    rfile = out / f"serve-{a.name}.json"

    def save() -> None:
        rfile.write_text(json.dumps(res, indent=1, default=str))

    def step(what: str, **kw: Any) -> None:
        kw = {k: v[-6000:] if k in ("stdout", "stderr") else v for k, v in kw.items()}
        res["steps"].append({"what": what, "t": time.time(), **kw})
        log(what, {k: v for k, v in kw.items() if k not in ("stdout", "stderr", "rows")})
        save()

    slog = open(out / f"server-{a.name}.log", "wb")  # noqa: SIM115
    t_start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=slog, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        while True:
            if proc.poll() is not None:
                step("server exited", rc=proc.returncode)
                return 1
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{url}/health", timeout=2) as r,
            ):
                if r.status == 200:
                    break
            if time.monotonic() - t_start > a.start_timeout:
                step("server not up in time")
                return 1
            time.sleep(1)
        step("server up", start_s=time.monotonic() - t_start)
        vocab = json.loads((Path(a.model) / "config.json").read_text())["vocab_size"]
        c = Client(url, a.model, vocab)
        gp = c.prompts(7, 16, a.prompt_len)
        c.greedy(c.prompts(8, a.concurrency, a.prompt_len), a.out_len)  # warm-up
        before = c.greedy(gp, 24)
        ps = probe_cmd(["ps", "--url", url, "--json"], env, 60)
        rows = json.loads(ps["stdout"]) if ps["rc"] == 0 else []
        step("ps", rc=ps["rc"], rows=rows, stderr=ps["stderr"])
        res["processes"] = rows
        rec = out / f"serve-{a.name}.probe.db"
        with Load(c, a.concurrency, a.prompt_len, a.out_len) as load:
            time.sleep(3)
            step("window before attach", tok_s=load.window(a.window))
            box: dict[str, Any] = {}
            th = threading.Thread(
                target=lambda: box.update(
                    probe_cmd(
                        ["attach", "--url", url, "--record", str(rec), "--force",
                         "--duration", str(a.attach_s), "--no-live"],
                        env, a.attach_s + 120,
                    )
                )
            )  # fmt: skip
            th.start()
            time.sleep(3)  # enabled by now; the window covers the attached part only
            tok_attached = load.window(a.attach_s - 6)
            during = c.greedy(gp, 24)
            th.join()
            step("attach", tok_s=tok_attached, **box)
            time.sleep(2)
            step("window after detach", tok_s=load.window(a.window))
        ps2 = probe_cmd(["ps", "--url", url, "--json"], env, 60)
        rows2 = json.loads(ps2["stdout"]) if ps2["rc"] == 0 else []
        rings = sorted(p.name for p in run_dir.iterdir() if p.name.startswith("ring-"))
        step(
            "ps after detach",
            all_disabled=all(not r.get("enabled") and r.get("attached_by") is None for r in rows2),
            rings_left=rings,
            rows=rows2,
        )
        after = c.greedy(gp, 24)
        res["greedy_identical"] = {"during": during == before, "after": after == before}
        step("greedy", **res["greedy_identical"])
        doc = probe_cmd(["doctor", "--url", url, "--json"], env, 60)
        with contextlib.suppress(ValueError):
            res["doctor"] = json.loads(doc["stdout"])
        step("doctor --url", rc=doc["rc"], stderr=doc["stderr"])
        again = probe_cmd(
            ["attach", "--pid", str(proc.pid), "--duration", "4", "--no-live"], env, 120
        )
        step("attach again by pid", **again)
        if rec.exists():
            rep = probe_cmd(["report", str(rec), "--json"], env, 120)
            with contextlib.suppress(ValueError):
                res["report"] = json.loads(rep["stdout"])
            step("report", rc=rep["rc"], stderr=rep["stderr"])
            txt = probe_cmd(["report", str(rec), "--width", "100"], env, 120)
            (out / f"serve-{a.name}.report.txt").write_text(txt["stdout"])
        res["load_errors"] = c.errors[:20]
        res["load_error_count"] = len(c.errors)
        return 0
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=40)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        slog.close()
        res["wall_s"] = time.monotonic() - t_start
        save()


if __name__ == "__main__":
    sys.exit(main())
