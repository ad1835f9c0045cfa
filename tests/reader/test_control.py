"""The control socket: a real server on a real Unix socket, in a thread of the test.

Requests go over the socket exactly as ``probe attach`` sends them; the probe behind it is
the real one (hooks installed lazily, a real ring).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from probe.engine import control_server as control
from probe.engine.control_server import (
    ControlError,
    ControlServer,
    PeerRefused,
    check_peer,
    peer_cred,
)
from probe.reader.control import request
from probe.reader.ring_reader import RingReader
from probe.records import Decoder, Hello


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def server(run_dir: Path, clean_probe: None) -> Iterator[ControlServer]:
    from probe.engine import hooks

    hooks.install(list(hooks.ALWAYS_ON))  # as the plugin does; lazy: no vLLM import
    srv = ControlServer(run_dir, environ={"PROBE_GPU_TIMING": "0"})
    srv.open()
    yield srv
    srv.close()


def raw(path: Path, payload: bytes) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(path))
        with contextlib.suppress(BrokenPipeError):  # the server may answer and close first
            s.sendall(payload)
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    reply: dict[str, object] = json.loads(buf)
    return reply


def rings(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("ring-"))


def test_status_enable_snapshot_disable_round_trip(server: ControlServer, run_dir: Path) -> None:
    from probe.engine.runtime import RT

    st = request(server.path, "status")
    assert st["pid"] == os.getpid() and st["enabled"] is False and st["attached_by"] is None
    assert st["protocol"] == control.PROTOCOL and st["ring"] is None
    assert "step" not in st["hook_families"]  # detached: only the always-on hooks

    snap = request(server.path, "snapshot")
    assert snap["complete"] is False

    on = request(server.path, "enable", gpu_timing=False)
    assert on["ring"] == f"ring-{os.getpid()}.shm"
    assert rings(run_dir) == [on["ring"]] and RT.enabled
    with RingReader.open(run_dir / on["ring"]) as reader:
        dec = Decoder()
        for rec in reader.read():
            dec.feed(rec)
        assert isinstance(dec.hello, Hello) and dec.hello.pid == os.getpid()
    st = request(server.path, "status")
    assert st["enabled"] is True and st["attached_by"] == os.getpid() and st["ring"] == on["ring"]
    assert st["reader_heartbeat_age_s"] is not None

    RT.static["snapshot"] = {"tp_rank": 0, "runner": "v1", "model": "tiny"}
    snap = request(server.path, "snapshot")
    assert snap["complete"] is True and snap["snapshot"]["model"] == "tiny"
    st = request(server.path, "status")
    assert st["ranks"]["tp_rank"] == 0 and st["runner"] == "v1" and st["model"] == "tiny"

    off = request(server.path, "disable")
    assert off["was_enabled"] is True
    assert not RT.enabled and rings(run_dir) == []
    assert request(server.path, "disable")["was_enabled"] is False


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (b"{not json\n", "malformed JSON"),
        (b"[1, 2]\n", "one JSON object"),
        (b'{"cmd": "exec", "code": "import os"}\n', "unknown command"),
        (b'{"cmd": "enable", "path": "/tmp/evil.shm"}\n', "unknown argument(s) ['path']"),
        (b'{"cmd": "enable", "gpu_timing": "yes"}\n', "gpu_timing must be"),
        (b'{"cmd": "enable", "hooks": ["nope"]}\n', "unknown hook families"),
        (b'{"cmd": "enable", "sample_every": 0}\n', "sample_every must be"),
        (b'{"cmd": "enable", "sample_every": true}\n', "sample_every must be"),
        (b'{"cmd": "enable", "sample_every": "4"}\n', "sample_every must be"),
        (b'{"cmd": "status", "x": ' + b"1" * (control.MAX_LINE + 10) + b"}\n", "longer than"),
        (b"x" * (control.MAX_LINE * 2), "longer than"),  # no newline at all
    ],
)
def test_bad_requests_get_an_error_and_change_nothing(
    server: ControlServer, run_dir: Path, payload: bytes, error: str
) -> None:
    from probe.engine.runtime import RT

    reply = raw(server.path, payload)
    assert reply["ok"] is False and error in str(reply["error"])
    assert not RT.enabled and rings(run_dir) == [] and server.attached_by is None
    assert not (Path("/tmp") / "evil.shm").exists()
    # the server still answers
    assert request(server.path, "status")["enabled"] is False


def test_several_requests_on_one_connection(server: ControlServer) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(server.path))
        s.sendall(b'{"cmd": "status"}\n{"cmd": "snapshot"}\n')
        f = s.makefile("rb")
        a, b = json.loads(f.readline()), json.loads(f.readline())
    assert a["ok"] and "role" in a and b["ok"] and "snapshot" in b


def test_socket_is_0600_and_dir_0700(server: ControlServer, run_dir: Path) -> None:
    st = os.lstat(server.path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    on = request(server.path, "enable")
    assert stat.S_IMODE(os.stat(run_dir / on["ring"]).st_mode) & 0o077 == 0
    request(server.path, "disable")


def test_unsafe_run_dir_is_refused(run_dir: Path) -> None:
    from probe.ring_dir import UnsafeRingDirError

    os.chmod(run_dir, 0o777)
    with pytest.raises(UnsafeRingDirError):
        ControlServer(run_dir)


def test_peer_credentials() -> None:
    me = os.getuid()
    check_peer((123, me, 0))
    check_peer((123, 0, 0))  # root
    with pytest.raises(PeerRefused, match=f"uid {me + 1}"):
        check_peer((123, me + 1, 0))
    with pytest.raises(PeerRefused):
        check_peer((123, 4242, 0), my_uid=1000)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_cred(a) == (os.getpid(), os.getuid(), os.getgid())


def test_server_refuses_another_uid_on_the_real_connection(
    server: ControlServer, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the test cannot switch users: make the server believe it runs as another uid
    seen: list[tuple[int, int, int]] = []
    real_check = control.check_peer

    def as_other_uid(cred: tuple[int, int, int], my_uid: int | None = None) -> None:
        seen.append(cred)
        real_check((cred[0], cred[1] + 1, cred[2]), cred[1])

    monkeypatch.setattr(control, "check_peer", as_other_uid)
    reply = raw(server.path, b'{"cmd": "enable"}\n')
    assert reply["ok"] is False and "only uid" in str(reply["error"])
    assert seen == [(os.getpid(), os.getuid(), os.getgid())]  # read from SO_PEERCRED
    assert rings(run_dir) == []


def _client(path: Path, cmd: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys, json\n"
        "from probe.reader.control import request, ControlError\n"
        "try:\n"
        f"    print(json.dumps(request({str(path)!r}, {cmd!r})))\n"
        "except ControlError as e:\n"
        "    print('ERROR', e)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )


def test_second_client_gets_attached_by(server: ControlServer, run_dir: Path) -> None:
    request(server.path, "enable")
    with RingReader.open(run_dir / f"ring-{os.getpid()}.shm") as reader:
        reader.read()  # fresh heartbeat
        out = _client(server.path, "enable")
    assert out.stdout.strip() == f"ERROR attached by pid {os.getpid()}"
    assert server.attached_by == os.getpid()
    # the same client enabling again is answered with its ring
    assert request(server.path, "enable")["already"] is True
    request(server.path, "disable")


def test_watchdog_disables_when_a_stopped_readers_heartbeat_stops(
    run_dir: Path, clean_probe: None
) -> None:
    from probe.engine.runtime import RT

    clock = Clock()
    start = control.pid_stat(os.getpid())
    assert start is not None
    srv = ControlServer(
        run_dir,
        environ={},
        clock_ns=clock,
        watchdog_thread=False,
        heartbeat_timeout_s=5.0,
        stat=lambda pid: ("T", start[1]),  # the reader is stopped (SIGSTOP, Ctrl-Z)
    )
    srv.open()
    try:
        ring = run_dir / request(srv.path, "enable")["ring"]
        reader = RingReader.open(ring)
        clock.now += 4_000_000_000
        assert srv.watchdog() is False  # within the grace after enable
        reader.touch_heartbeat(clock.now)
        clock.now += 4_000_000_000
        assert srv.watchdog() is False and RT.enabled  # heartbeat 4 s old
        clock.now += 2_000_000_000
        assert srv.watchdog() is True  # 6 s old
        assert not RT.enabled and not ring.exists() and srv.attached_by is None
        assert request(srv.path, "status")["watchdog_trips"] == 1
        reader.close()
    finally:
        srv.close()


def test_a_running_reader_waiting_for_a_cpu_keeps_the_hooks_on(
    run_dir: Path, clean_probe: None
) -> None:
    # on a saturated host a live reader can go many seconds without a poll; turning the
    # hooks off under it lost the rest of its attachment (3 of 48 attaches under load);
    # it gets live_silence_s, and is caught at once when its process is gone
    from probe.engine.runtime import RT

    clock = Clock()
    gone: set[int] = set()
    srv = ControlServer(
        run_dir,
        environ={},
        clock_ns=clock,
        watchdog_thread=False,
        heartbeat_timeout_s=5.0,
        live_silence_s=60.0,
        alive=lambda pid: pid not in gone,
    )
    srv.open()
    try:
        ring = run_dir / request(srv.path, "enable", duration_s=120)["ring"]
        reader = RingReader.open(ring)
        assert srv.stat(os.getpid())[0] in ("R", "S")  # this process: the reader, running
        clock.now += 20_000_000_000
        assert srv.watchdog() is False and RT.enabled  # 20 s silent, still running
        reader.touch_heartbeat(clock.now)
        clock.now += 59_000_000_000
        assert srv.watchdog() is False and RT.enabled
        clock.now += 2_000_000_000
        assert srv.watchdog() is True  # 61 s silent: stuck, not starved
        assert not RT.enabled and request(srv.path, "status")["watchdog_trips"] == 1
        # a reader that is gone is caught at the next wake, however fresh its heartbeat
        ring = run_dir / request(srv.path, "enable")["ring"]
        reader2 = RingReader.open(ring)
        reader2.touch_heartbeat(clock.now)
        assert srv.watchdog() is False
        gone.add(os.getpid())
        assert srv.watchdog() is True and not RT.enabled
        reader.close()
        reader2.close()
    finally:
        srv.close()


def test_a_reader_whose_pid_was_taken_over_is_gone(run_dir: Path, clean_probe: None) -> None:
    from probe.engine.runtime import RT

    clock = Clock()
    me = control.pid_stat(os.getpid())
    assert me is not None
    stats = {"now": me}
    srv = ControlServer(
        run_dir, environ={}, clock_ns=clock, stat=lambda pid: stats["now"], watchdog_thread=False
    )
    srv.open()
    try:
        request(srv.path, "enable")
        assert srv.reader_start == me[1] and srv.watchdog() is False and RT.enabled
        stats["now"] = ("S", me[1] + 1)  # the reader died and another process got its pid
        assert srv.watchdog() is True and not RT.enabled
    finally:
        srv.close()


def test_watchdog_thread_disables_when_the_reader_is_gone(run_dir: Path, clean_probe: None) -> None:
    from probe.engine.runtime import RT

    gone: set[int] = set()
    srv = ControlServer(
        run_dir, environ={}, watchdog_interval_s=0.02, alive=lambda pid: pid not in gone
    )
    srv.open()
    try:
        request(srv.path, "enable")
        assert RT.enabled
        gone.add(os.getpid())  # the attaching process "exits"
        deadline = time.monotonic() + 5
        # the watchdog turns the hooks off first, then closes and unlinks the ring
        while (RT.enabled or rings(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not RT.enabled and rings(run_dir) == []
    finally:
        srv.close()


def test_the_deadline_turns_the_hooks_off_however_fresh_the_heartbeat(
    run_dir: Path, clean_probe: None
) -> None:
    from probe.engine.runtime import RT

    clock = Clock()
    srv = ControlServer(run_dir, environ={}, clock_ns=clock, watchdog_thread=False)
    srv.open()
    try:
        ring = run_dir / request(srv.path, "enable", duration_s=3)["ring"]
        enabled_at = clock.now
        assert request(srv.path, "status")["deadline_ns"] == enabled_at + 3_000_000_000
        reader = RingReader.open(ring)
        clock.now += 2_999_999_999
        reader.touch_heartbeat(clock.now)
        assert srv.watchdog() is False and RT.enabled
        clock.now += 1
        reader.touch_heartbeat(clock.now)  # the reader is alive and reading: still off
        assert srv.watchdog() is True
        assert not RT.enabled and not ring.exists() and srv.attached_by is None
        st = request(srv.path, "status")
        assert st["last_off"] == {
            "reason": "deadline",
            "at_ns": clock.now,
            "deadline_ns": enabled_at + 3_000_000_000,
        }
        assert st["deadline_ns"] is None and st["watchdog_trips"] == 0
        # the reader's own disable afterwards changes nothing
        assert request(srv.path, "disable") == {"ok": True, "was_enabled": False}
        reader.close()
    finally:
        srv.close()


def test_the_watchdog_thread_wakes_at_the_deadline_not_an_interval_later(
    run_dir: Path, clean_probe: None
) -> None:
    from probe.engine.runtime import RT

    # the default watchdog interval (0.5 s) is longer than the duration: the thread must
    # wake at the deadline itself, not at its next round
    srv = ControlServer(run_dir, environ={})
    srv.open()
    try:
        t0 = time.monotonic()
        ring = run_dir / request(srv.path, "enable", duration_s=0.2)["ring"]
        reader = RingReader.open(ring)
        while RT.enabled and time.monotonic() < t0 + 5:
            reader.touch_heartbeat()
            time.sleep(0.002)
        off = time.monotonic() - t0
        reader.close()
        last = request(srv.path, "status")["last_off"]
        assert last["reason"] == "deadline"
        late_s = (last["at_ns"] - last["deadline_ns"]) / 1e9
        # never before the deadline (how long after it depends on the host's load)
        assert late_s >= 0 and off >= 0.2, (late_s, off)
    finally:
        srv.close()


def test_a_stale_reader_is_taken_over(run_dir: Path, clean_probe: None) -> None:
    clock = Clock()
    srv = ControlServer(run_dir, environ={}, clock_ns=clock, watchdog_thread=False)
    srv.open()
    try:
        srv.attached_by = 1  # as if pid 1 (alive, never ours) had attached long ago
        srv.enabled_at_ns = clock.now
        srv.ring_path = run_dir / "ring-x.shm"
        with pytest.raises(ControlError, match="attached by pid 1"):
            request(srv.path, "enable")
        clock.now += 10_000_000_000  # silent 10 s, but running: it may be starved
        with pytest.raises(ControlError, match="attached by pid 1"):
            request(srv.path, "enable")
        clock.now += 51_000_000_000  # silent 61 s: stuck
        assert request(srv.path, "enable")["ring"] == f"ring-{os.getpid()}.shm"
        assert srv.attached_by == os.getpid()
    finally:
        srv.close()


def test_close_removes_the_socket_and_disables(run_dir: Path, clean_probe: None) -> None:
    from probe.engine.runtime import RT

    srv = ControlServer(run_dir, environ={})
    srv.open()
    request(srv.path, "enable")
    srv.close()
    assert not srv.path.exists() and not RT.enabled and rings(run_dir) == []
    with pytest.raises(OSError):
        request(srv.path, "status", timeout=1)


def test_enable_attaches_the_families_asked_for_and_disable_removes_them(
    server: ControlServer,
) -> None:
    from probe.engine import hooks

    request(server.path, "enable", hooks=["dispatch", "reorder"], gpu_timing=False)
    # (hooks.enable brings in every family when none of them could be installed yet, as
    # here where vLLM is not imported; in a vLLM worker only the two are installed)
    assert {"dispatch", "reorder"} <= set(hooks._families)
    request(server.path, "disable")
    assert hooks._families == ["static"]
    request(server.path, "enable", gpu_timing=2, timeout=120)  # imports torch here
    assert set(hooks.FAMILIES) <= set(hooks._families)
    request(server.path, "disable")
    assert hooks._families == ["static"]


def test_enable_with_sampling_and_disable_stops_it(server: ControlServer) -> None:
    """``sample_every`` reaches the runtime; disabling ends sampling too, so no later
    step can switch the hooks back on."""
    from probe.engine.runtime import RT

    request(server.path, "enable", sample_every=4, gpu_timing=False)
    assert RT.sampling and RT.sample_every == 4 and RT.sample_n == 0
    request(server.path, "disable")
    assert not RT.sampling and not RT.enabled


@pytest.mark.parametrize(
    ("title", "stack", "role"),
    [
        (["VLLM::EngineCore"], (), "engine"),
        (["VLLM::Worker"], (), "worker"),
        (["VLLM::Worker_TP1"], (), "worker"),
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], (), "api"),
        (["/venv/bin/vllm", "serve", "m"], (), "api"),
        (["python"], ("vllm.plugins", "vllm.v1.worker.worker_base"), "worker"),
        (["python"], ("vllm.plugins", "vllm.v1.engine.core"), "engine"),
        (["python"], ("vllm.entrypoints.openai.api_server",), "api"),
        (["python", "script.py"], ("__main__",), "other"),
    ],
)
def test_role_detection(title: list[str], stack: tuple[str, ...], role: str) -> None:
    assert control.role_from(title, stack) == role


def test_ranks_before_the_first_step_come_from_the_process_title() -> None:
    """``probe ps`` shows a TP/PP/DP worker's ranks before anything was attached (the
    snapshot with the ranks is written at the first probed step): from vLLM's process
    titles. The snapshot wins once it exists."""
    assert control.ranks_of({}, ["VLLM::Worker_PP1_TP3"]) == {
        "tp_rank": 3,
        "pp_rank": 1,
        "dp_rank": None,
    }
    assert control.ranks_of({}, ["VLLM::EngineCore_DP2"])["dp_rank"] == 2
    assert control.ranks_of({}, ["python", "-m", "vllm.entrypoints.openai.api_server"]) == {
        "tp_rank": None,
        "pp_rank": None,
        "dp_rank": None,
    }
    snap = {"tp_rank": 0, "pp_rank": 0, "dp_rank": 0}
    assert control.ranks_of(snap, ["VLLM::Worker_TP1"]) == snap


def test_attach_enables_a_server_without_deadlines_without_one(
    run_dir: Path, clean_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server of an older probe refuses ``duration_s`` as an unknown argument: the
    reader enables it without, and turns the hooks off itself."""
    from types import SimpleNamespace

    from probe.cli.attach_session import Session
    from probe.engine.runtime import RT

    old = dict(control.COMMANDS, enable=frozenset({"gpu_timing", "hooks", "sample_every"}))
    monkeypatch.setattr(control, "COMMANDS", old)
    srv = ControlServer(run_dir, environ={})
    srv.open()
    try:
        with pytest.raises(ControlError, match=r"unknown argument.*duration_s"):
            request(srv.path, "enable", duration_s=3)
        proc = SimpleNamespace(socket=srv.path, pid=os.getpid(), role="worker")
        session = Session([proc], run_dir, [])
        session.enable(duration_s=3)
        assert RT.enabled and srv.deadline_ns is None
        assert session.close() == [] and not RT.enabled
        assert request(srv.path, "status")["last_off"]["reason"] == "disable"
    finally:
        srv.close()


def test_attach_ends_with_its_output_and_recording_whole(
    server: ControlServer, run_dir: Path
) -> None:
    """``probe attach`` ends without the interpreter's teardown (``os._exit``): what it
    printed and the recording it wrote are all there, and the process is detached."""
    rec = run_dir / "a.probe.db"
    probe = str(Path(sys.executable).with_name("probe"))
    cmd = [probe, "attach", "--run-dir", str(run_dir), "--duration", "0.5", "--no-live"]
    out = subprocess.run(
        [*cmd, "--record", str(rec)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "detached (duration reached)" in out.stderr
    assert out.stderr.rstrip().endswith(f"probe: recording written to {rec}")
    assert out.stdout.startswith("probe attach | ") and out.stdout.endswith("\n")
    from probe.reader.recording import Recording

    meta = Recording.open(rec).meta()
    assert meta["stop_reason"] == "duration reached" and int(meta["ended_epoch_ns"]) > 0
    assert isinstance(meta["reader_cpu_wait_s"], float) and meta["reader_cpu_wait_s"] >= 0
    assert server.attached_by is None and rings(run_dir) == []
