"""Finding armed vLLM processes: control sockets in the run dir, process trees, ports.

Everything here runs in the reader (``probe ps``, ``probe attach``) and reads ``/proc``
(Linux only, like the rest of the probe: ``SO_PEERCRED``, ``/dev/shm``).

    >>> from probe.reader.discover import find_processes
    >>> [p.status["role"] for p in find_processes(url="http://127.0.0.1:8000")]  # doctest: +SKIP
    ['api', 'engine', 'worker']
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from probe.reader.control import SOCK_RE, pid_alive, request_all

RING_NAME = re.compile(r"^ring-(\d+)\.shm$")


class DiscoveryError(LookupError):
    """A --url or --pid that leads to no process; the message says why."""


class Armed:
    """One process with a control socket, and what it said to ``status``.

    Not a dataclass, as :class:`probe.config.EnvVar` is not: ``probe attach`` discovers
    before its enable, and ``dataclasses`` would be most of this module's import."""

    __slots__ = ("error", "pid", "socket", "status")

    def __init__(
        self,
        pid: int,
        socket: Path,
        status: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        self.pid = pid
        self.socket = socket
        self.status: dict[str, Any] = {} if status is None else status
        self.error = error

    def __repr__(self) -> str:
        return (
            f"Armed(pid={self.pid!r}, socket={self.socket!r}, status={self.status!r}, "
            f"error={self.error!r})"
        )

    @property
    def role(self) -> str:
        return str(self.status.get("role") or "?")

    @property
    def rank_label(self) -> str:
        r = self.status.get("ranks") or {}
        if all(v is None for v in r.values()):
            return "-"
        return (
            f"tp{r.get('tp_rank') or 0}"
            + (f"/pp{r['pp_rank']}" if r.get("pp_rank") else "")
            + (f"/dp{r['dp_rank']}" if r.get("dp_rank") else "")
        )


def sockets(run_dir: Path, *, clean: bool = True) -> dict[int, Path]:
    """pid -> control socket in ``run_dir``; sockets of dead pids are removed (``clean``)."""
    out: dict[int, Path] = {}
    if not run_dir.is_dir():
        return out
    for p in run_dir.iterdir():
        m = SOCK_RE.match(p.name)
        if not m:
            continue
        pid = int(m.group(1))
        if pid_alive(pid):
            out[pid] = p
        elif clean:
            remove_stale_socket(p)
    return out


def remove_stale_socket(p: Path) -> None:
    """Remove ``p`` if it is a socket of this user (a server that died left it); anything
    else named like one (a regular file, another user's socket) is not ours to delete."""
    import stat

    with contextlib.suppress(OSError):
        st = os.lstat(p)
        if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.getuid():
            p.unlink()


def remove_stale_ring(p: Path) -> bool:
    """Remove ``p`` if it is a ring of this user (``ring-<pid>.shm``, a regular file)
    whose process is gone: a process killed while attached (SIGKILL, OOM) leaves its
    ring, 4 MiB of shared memory by default. Returns whether it was removed."""
    import stat

    m = RING_NAME.match(p.name)
    if m is None or pid_alive(int(m.group(1))):
        return False
    try:
        st = os.lstat(p)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return False
        p.unlink()
    except OSError:
        return False
    return True


def clean_run_dir(d: Path) -> tuple[int, int]:
    """Remove the control sockets and rings in ``d`` whose processes are gone; returns
    (sockets, rings) removed."""
    socks = rings = 0
    try:
        names = list(d.iterdir())
    except OSError:
        return 0, 0
    for p in names:
        m = SOCK_RE.match(p.name)
        if m is not None and not pid_alive(int(m.group(1))):
            if p.exists():
                remove_stale_socket(p)
                socks += not p.exists()
        elif remove_stale_ring(p):
            rings += 1
    return socks, rings


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def ancestry(pid: int) -> list[int]:
    """``pid``, its parent, theirs, ... up to the first process (from ``/proc/*/stat``):
    a few small reads where :func:`descendants` reads every process's."""
    out = [pid]
    while len(out) < 4096:
        ppid = parent_of(out[-1])
        if ppid is None or ppid <= 0 or ppid in out:
            break
        out.append(ppid)
    return out


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (from ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            ppid = parent_of(int(d))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(d))
    out = {root}
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_NLMSG = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_DIAG_REQ = struct.Struct("=BBBBI48x")  # inet_diag_req_v2: family, proto, ext, pad, states
_DIAG_MSG = struct.Struct("=BBBB2s46xIIIII")  # inet_diag_msg: ..., sport, ..., uid, inode


def _listen_inodes_netlink(port: int) -> set[int]:
    """Inodes of TCP sockets listening on ``port``, asked of the kernel (sock_diag): it
    walks only its table of listeners. Raises ``OSError`` where netlink is not allowed."""
    inodes: set[int] = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as s:
        s.settimeout(2.0)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            req = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
            s.send(
                _NLMSG.pack(_NLMSG.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP,
                            seq, 0) + req
            )  # fmt: skip
            done = False
            while not done:
                data = s.recv(1 << 16)
                if not data:
                    raise OSError("sock_diag: no reply")
                off = 0
                while off + _NLMSG.size <= len(data):
                    size, kind, _f, got, _p = _NLMSG.unpack_from(data, off)
                    if size < _NLMSG.size:
                        raise OSError("sock_diag: malformed reply")
                    if got == seq and kind == _NLMSG_DONE:
                        done = True
                        break
                    if kind == _NLMSG_ERROR:
                        raise OSError("sock_diag: error reply")
                    if got == seq and size >= _NLMSG.size + _DIAG_MSG.size:
                        _fam, state, _t, _r, sport, *_rest, inode = _DIAG_MSG.unpack_from(
                            data, off + _NLMSG.size
                        )
                        if state == _TCP_LISTEN and int.from_bytes(sport, "big") == port:
                            inodes.add(inode)
                    off += (size + 3) & ~3
    inodes.discard(0)
    return inodes


def _listen_inodes_proc(port: int) -> set[int]:
    """As :func:`_listen_inodes_netlink`, from ``/proc/net/tcp{,6}``: the kernel prints
    every bucket of its connection table there (262,144 on this 24 GiB machine: 3.3 ms of
    CPU a file, however few connections)."""
    inodes: set[int] = set()
    hexport = f":{port:04X} "
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    if hexport not in line or " 0A " not in line:
                        continue  # split only the lines that can be the listener
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(int(inode))
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    inodes.discard(0)
    return inodes


def _listen_inodes(port: int) -> set[int]:
    try:
        return _listen_inodes_netlink(port)
    except (OSError, struct.error):
        return _listen_inodes_proc(port)


def _holds(pid: int | str, wanted: set[str]) -> bool:
    """Whether ``pid`` has one of the ``wanted`` links (``socket:[inode]``) open."""
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return True
    return False


def listening_pids(port: int, among: Iterable[int] | None = None) -> set[int]:
    """Pids of our processes holding a TCP socket that listens on ``port`` (only those in
    ``among``, when given: the rest of ``/proc`` is not read)."""
    inodes = _listen_inodes(port)
    if not inodes:
        return set()
    wanted = {f"socket:[{i}]" for i in inodes}
    pids: Iterable[int | str] = (
        among if among is not None else (d for d in os.listdir("/proc") if d.isdigit())
    )
    return {int(p) for p in pids if _holds(p, wanted)}


def port_of(url: str) -> int:
    u = urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = u.port
    except ValueError:
        raise DiscoveryError(f"{url}: not a valid URL") from None
    if port is None:
        return 443 if u.scheme == "https" else 80
    return port


def tree_of_url(url: str, among: Iterable[int] | None = None) -> set[int]:
    """The processes behind ``url``: its listener and every process below it. With
    ``among`` (the armed pids), only those of them, found from their own ancestry (a few
    reads of ``/proc`` per pid instead of every process's files: on a host with many
    processes and descriptors the full scan costs the attach tens of ms of CPU at its
    start); when none of them or their ancestors listens, the full scan decides (and
    raises :class:`DiscoveryError` when nobody listens)."""
    port = port_of(url)
    if among is not None:
        chains = {p: ancestry(p) for p in among}
        owners = listening_pids(port, {q for c in chains.values() for q in c})
        if owners:
            return {p for p, c in chains.items() if owners.intersection(c)}
    owners = listening_pids(port)
    if not owners:
        raise DiscoveryError(
            f"no process of this user listens on port {port} ({url}); is the server up?"
        )
    out: set[int] = set()
    for pid in owners:
        out |= descendants(pid)
    return out if among is None else out & set(among)


def tree_of_pid(pid: int, among: Iterable[int] | None = None) -> set[int]:
    """``pid`` and every process below it (only those in ``among``, when given, each found
    from its own ancestry)."""
    if not pid_alive(pid):
        raise DiscoveryError(f"no process with pid {pid}")
    if among is not None:
        return {p for p in among if pid in ancestry(p)}
    return descendants(pid)


def find_processes(
    run_dir: Path,
    *,
    pids: Iterable[int] | None = None,
    url: str | None = None,
    timeout: float = 2.0,
) -> list[Armed]:
    """Armed processes in ``run_dir`` (optionally those in ``pids``' trees or the tree
    behind ``url``), each with its ``status``; sorted api, engine, worker, then pid."""
    armed = sockets(run_dir)
    allowed: set[int] | None = None
    if url is not None:
        allowed = tree_of_url(url, among=armed)
    if pids is not None:
        tree: set[int] = set()
        for p in pids:
            tree |= tree_of_pid(p, among=armed)
        allowed = tree if allowed is None else allowed & tree
    targets = [
        (pid, path) for pid, path in sorted(armed.items()) if allowed is None or pid in allowed
    ]
    out: list[Armed] = []
    # asked together: a busy process answers late, and each would add its wait
    replies = request_all([path for _, path in targets], "status", timeout=timeout)
    for (pid, path), reply in zip(targets, replies, strict=True):
        a = Armed(pid, path)
        if isinstance(reply, ConnectionRefusedError):
            # a socket file nobody listens on: its process exited or closed it
            remove_stale_socket(path)
            continue
        if isinstance(reply, Exception):
            a.error = str(reply) or type(reply).__name__
        else:
            a.status = reply
        out.append(a)
    order = {"api": 0, "engine": 1, "worker": 2}
    out.sort(key=lambda a: (order.get(a.role, 3), a.pid))
    return out
