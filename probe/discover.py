"""Finding armed vLLM processes: control sockets in the run dir, process trees, ports.

Everything here runs in the reader (``probe ps``, ``probe attach``) and reads ``/proc``
(Linux only, like the rest of the probe: ``SO_PEERCRED``, ``/dev/shm``).

    >>> from probe.discover import find_processes
    >>> [p.status["role"] for p in find_processes(url="http://127.0.0.1:8000")]  # doctest: +SKIP
    ['api', 'engine', 'worker']
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from probe.control import SOCK_RE, ControlError, pid_alive, request


class DiscoveryError(LookupError):
    """A --url or --pid that leads to no process; the message says why."""


@dataclass
class Armed:
    """One process with a control socket, and what it said to ``status``."""

    pid: int
    socket: Path
    status: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

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
            with contextlib.suppress(OSError):
                p.unlink()
    return out


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


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


def _listen_inodes(port: int) -> set[int]:
    inodes: set[int] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(int(inode))
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    inodes.discard(0)
    return inodes


def listening_pids(port: int) -> set[int]:
    """Pids of our processes holding a TCP socket that listens on ``port``."""
    inodes = _listen_inodes(port)
    if not inodes:
        return set()
    wanted = {f"socket:[{i}]" for i in inodes}
    out: set[int] = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{d}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{d}/fd/{fd}") in wanted:
                        out.add(int(d))
                        break
    return out


def port_of(url: str) -> int:
    u = urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = u.port
    except ValueError:
        raise DiscoveryError(f"{url}: not a valid URL") from None
    if port is None:
        return 443 if u.scheme == "https" else 80
    return port


def tree_of_url(url: str) -> set[int]:
    port = port_of(url)
    owners = listening_pids(port)
    if not owners:
        raise DiscoveryError(
            f"no process of this user listens on port {port} ({url}); is the server up?"
        )
    out: set[int] = set()
    for pid in owners:
        out |= descendants(pid)
    return out


def tree_of_pid(pid: int) -> set[int]:
    if not pid_alive(pid):
        raise DiscoveryError(f"no process with pid {pid}")
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
    allowed: set[int] | None = None
    if url is not None:
        allowed = tree_of_url(url)
    if pids is not None:
        tree: set[int] = set()
        for p in pids:
            tree |= tree_of_pid(p)
        allowed = tree if allowed is None else allowed & tree
    out: list[Armed] = []
    for pid, path in sorted(sockets(run_dir).items()):
        if allowed is not None and pid not in allowed:
            continue
        a = Armed(pid, path)
        try:
            a.status = request(path, "status", timeout=timeout)
        except ConnectionRefusedError:
            # a socket file nobody listens on: its process exited or closed it
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        except (TimeoutError, OSError, ControlError) as exc:
            a.error = str(exc) or type(exc).__name__
        out.append(a)
    order = {"api": 0, "engine": 1, "worker": 2}
    out.sort(key=lambda a: (order.get(a.role, 3), a.pid))
    return out
