"""The attach's start and end talk to every process at once, and find them cheaply.

``request_all`` asks every control socket together (a busy process answers late: one
after the other, the attach waited for the sum); discovery by ``--url``/``--pid`` reads
the listener from the kernel's sock_diag and the armed processes' own ancestry instead of
every process's files. Real Unix sockets and real listening TCP sockets here.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from probe.engine.control_server import ControlError, ControlServer
from probe.reader import discover
from probe.reader.control import request, request_all


def serve(path: Path, answer: Callable[[dict[str, object]], bytes | None]) -> threading.Thread:
    """A one-connection server at ``path``: reads one request line and sends what
    ``answer`` gives for it (None: closes without a reply)."""
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(str(path))
    lsock.listen()

    def run() -> None:
        with lsock:
            conn, _ = lsock.accept()
            with conn:
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    buf += chunk
                out = answer(json.loads(buf))
                if out is not None:
                    with contextlib.suppress(OSError):
                        conn.sendall(out)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_every_process_is_asked_before_any_answer_is_awaited(run_dir: Path) -> None:
    """Each server answers only once the other has its request: asked one after the
    other this cannot finish (the first waits for the second forever); together it does."""
    got = {"a": threading.Event(), "b": threading.Event()}

    def answer(me: str, other: str) -> Callable[[dict[str, object]], bytes]:
        def f(req: dict[str, object]) -> bytes:
            got[me].set()
            ok = got[other].wait(5.0)
            return json.dumps({"ok": ok, "me": me, "cmd": req["cmd"]}).encode() + b"\n"

        return f

    serve(run_dir / "a.sock", answer("a", "b"))
    serve(run_dir / "b.sock", answer("b", "a"))
    replies = request_all([run_dir / "a.sock", run_dir / "b.sock"], "status", timeout=10)
    assert [r["me"] for r in replies if isinstance(r, dict)] == ["a", "b"]
    assert all(isinstance(r, dict) and r["cmd"] == "status" for r in replies)


def test_each_reply_or_its_error_in_the_order_asked(run_dir: Path) -> None:
    serve(run_dir / "ok.sock", lambda req: b'{"ok": true, "n": 1}\n')
    serve(run_dir / "refused.sock", lambda req: b'{"ok": false, "error": "nope"}\n')
    serve(run_dir / "silent.sock", lambda req: None)  # closes without a word
    serve(run_dir / "junk.sock", lambda req: b"not json\n")
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # listens, never answers
    hung.bind(str(run_dir / "hung.sock"))
    hung.listen()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a file nobody listens on
    dead.bind(str(run_dir / "dead.sock"))
    dead.close()
    names = ["ok", "refused", "silent", "junk", "hung", "dead", "missing"]
    with hung:
        out = request_all([run_dir / f"{n}.sock" for n in names], "status", timeout=1.0)
    assert out[0] == {"ok": True, "n": 1}
    assert isinstance(out[1], ControlError) and str(out[1]) == "nope"
    assert isinstance(out[2], ControlError) and "no reply" in str(out[2])
    assert isinstance(out[3], ControlError) and "malformed reply" in str(out[3])
    assert isinstance(out[4], TimeoutError) and "hung.sock" in str(out[4])
    assert isinstance(out[5], ConnectionRefusedError)
    assert isinstance(out[6], FileNotFoundError)
    # request() is the same code for one socket: it raises what request_all returns
    with pytest.raises(ControlError, match="nope"):
        serve(run_dir / "again.sock", lambda req: b'{"ok": false, "error": "nope"}\n')
        request(run_dir / "again.sock", "status")


def test_attach_enables_and_disables_every_process_and_undoes_a_failed_start(
    run_dir: Path, clean_probe: None
) -> None:
    """One process refusing the enable: the one that accepted is disabled again and the
    error names the refusing pid (as when they were asked one after the other)."""
    from probe.cli.attach_session import Session
    from probe.engine.runtime import RT
    from probe.errors import UsageError

    srv = ControlServer(run_dir, environ={"PROBE_GPU_TIMING": "0"})
    srv.open()
    try:
        serve(run_dir / "other.sock", lambda req: b'{"ok": false, "error": "busy"}\n')
        ok = SimpleNamespace(socket=srv.path, pid=os.getpid(), role="worker")
        bad = SimpleNamespace(socket=run_dir / "other.sock", pid=4242, role="engine")
        session = Session([ok, bad], run_dir, [])
        with pytest.raises(UsageError, match=r"pid 4242 \(engine\): busy"):
            session.enable(duration_s=3)
        assert not RT.enabled and session.enabled == []
        assert request(srv.path, "status")["last_off"]["reason"] == "disable"
        session = Session([ok], run_dir, [])
        session.enable(duration_s=3)
        assert RT.enabled and srv.deadline_ns is not None
        assert session.close() == [] and not RT.enabled
    finally:
        srv.close()


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_the_kernels_listener_table_agrees_with_proc_net_tcp(family: int) -> None:
    host = "127.0.0.1" if family == socket.AF_INET else "::1"
    with socket.socket(family) as lsock, socket.socket(family) as bound:
        try:
            lsock.bind((host, 0))
        except OSError:
            pytest.skip(f"no {host} here")
        lsock.listen()
        port = lsock.getsockname()[1]
        bound.bind((host, 0))  # bound, not listening: not a listener
        inode = os.fstat(lsock.fileno()).st_ino
        fast = discover._listen_inodes_netlink(port)
        assert inode in fast and fast == discover._listen_inodes_proc(port)
        assert discover._listen_inodes_netlink(bound.getsockname()[1]) == set()
        assert discover._listen_inodes(port) == fast


def test_without_netlink_the_listener_comes_from_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.socket

    def no_netlink(family: int = -1, *args: object, **kw: object) -> socket.socket:
        if family == socket.AF_NETLINK:
            raise PermissionError("netlink refused (as under a seccomp profile)")
        return real(family, *args, **kw)  # type: ignore[arg-type]

    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen()
        port = lsock.getsockname()[1]
        monkeypatch.setattr(discover.socket, "socket", no_netlink)
        with pytest.raises(PermissionError):
            discover._listen_inodes_netlink(port)
        assert discover._listen_inodes(port) == {os.fstat(lsock.fileno()).st_ino}


def test_the_armed_tree_is_found_from_its_own_ancestry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a URL or a pid, the armed pids in the tree: the same set as the full scan
    of /proc, without listing /proc when the listener is among them or their ancestors."""
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen()
        url = f"http://127.0.0.1:{lsock.getsockname()[1]}"
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            among = {os.getpid(), child.pid, os.getppid()}
            full_url = discover.tree_of_url(url) & among
            full_pid = discover.tree_of_pid(os.getpid()) & among
            real_listdir = os.listdir

            def no_proc_scan(path: str | os.PathLike[str] = ".") -> list[str]:
                assert os.fspath(path) != "/proc", "the whole of /proc was listed"
                return real_listdir(path)

            monkeypatch.setattr(discover.os, "listdir", no_proc_scan)
            assert discover.tree_of_url(url, among=among) == full_url == {os.getpid(), child.pid}
            assert discover.tree_of_pid(os.getpid(), among=among) == full_pid == full_url
            assert discover.ancestry(child.pid)[:2] == [child.pid, os.getpid()]
            monkeypatch.undo()
            # neither the armed pids nor their ancestors listen: the full scan decides
            assert discover.tree_of_url(url, among={1}) == set()
        finally:
            child.kill()
            child.wait()
    with pytest.raises(discover.DiscoveryError, match="listens on port"):
        discover.tree_of_url(url, among=among)  # closed: nobody listens any more
