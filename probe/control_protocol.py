"""The control protocol between a reader and the probe inside each vLLM process.

One Unix socket per process (``ctl-<pid>.sock`` in the run directory, owner-only), one
JSON line per request and per reply, parsed within bounds (:func:`parse_message`). The
server (:mod:`probe.engine.control_server`, inside vLLM) and the client
(:mod:`probe.reader.control`) share what is declared here: the commands and their
arguments, the limits, where a socket lives, and who may connect.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probe import config

if TYPE_CHECKING:
    import logging


def _log() -> logging.Logger:
    """The "probe" logger, imported when something is logged."""
    import logging

    return logging.getLogger("probe")


PROTOCOL = 1

MAX_LINE = 64 * 1024

MAX_DEPTH = 32  # of a request or reply's JSON nesting (the protocol's are 3 deep at most)


def parse_message(line: bytes | str) -> Any:
    """One protocol message, parsed within bounds: ``ValueError`` for JSON nested deeper
    than :data:`MAX_DEPTH` (never a ``RecursionError``) or an object with a key twice
    (``{"cmd": "status", "cmd": "enable"}`` is not obeyed by either)."""
    import re

    raw = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else line
    depth = deepest = 0
    for b in re.sub(rb'"(?:[^"\\]|\\.)*"', b"", raw):
        if b in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif b in b"]}":
            depth -= 1
    if deepest > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    return json.loads(raw, object_pairs_hook=_unique_keys)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the key {k!r} is given twice")
        out[k] = v
    return out


SOCK_PREFIX = "ctl-"

SOCK_SUFFIX = ".sock"

SOCK_RE = re.compile(r"^ctl-(\d+)\.sock$")

DEFAULT_HEARTBEAT_TIMEOUT_S = 5.0

LIVE_READER_SILENCE_S = 60.0
"""How long a reader that is still running may go without reading before the watchdog
turns the hooks off. On a saturated host a live reader waits for a CPU for many seconds
(3.5-19 s early trips at 5 s in 3 of 48 attaches under load, docs/reliability.md), and
turning the hooks off under it loses the rest of its attachment. A reader that is gone is
caught at the next wake whatever its heartbeat; one that is stopped (SIGSTOP, Ctrl-Z) or
whose state cannot be read keeps ``heartbeat_timeout_s``."""

WATCHDOG_INTERVAL_S = 0.5

CLIENT_TIMEOUT_S = 5.0

REQUEST_DEADLINE_S = 5.0  # a request line must arrive whole within this, however it trickles

MAX_CLIENTS = 16  # connections served at once; more get an error reply and are closed

MAX_DURATION_S = 1e7  # as ``probe attach --duration`` accepts

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

COMMANDS: dict[str, frozenset[str]] = {
    "status": frozenset(),
    "enable": frozenset({"duration_s", "gpu_timing", "hooks", "sample_every"}),
    "disable": frozenset(),
    "snapshot": frozenset(),
}


class ControlError(Exception):
    """A request was refused; the message is what the server (or client) said."""


class PeerRefused(PermissionError):
    """The peer at the other end of the socket is not our user (nor root)."""

    def __init__(self, pid: int, uid: int, want: int) -> None:
        super().__init__(f"peer pid {pid} has uid {uid}; only uid {want} or root may connect")
        self.pid = pid
        self.uid = uid


def socket_path(pid: int, run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / f"{SOCK_PREFIX}{pid}{SOCK_SUFFIX}"


def peer_cred(conn: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end, from the kernel."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return int(pid), int(uid), int(gid)


def check_peer(cred: tuple[int, int, int], my_uid: int | None = None) -> None:
    """Raise :class:`PeerRefused` unless the peer's uid is ours or root's."""
    want = os.getuid() if my_uid is None else my_uid
    pid, uid, _gid = cred
    if uid not in (want, 0):
        raise PeerRefused(pid, uid, want)


def pid_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time)`` of ``pid`` from ``/proc/PID/stat`` (the state letter: R, S,
    D, T, t, Z, ...; the start in clock ticks since boot), or None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode("ascii", "replace"), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    st = pid_stat(pid)  # a zombie is gone for our purposes
    return st is None or st[0] != "Z"


def run_dir(
    environ: Mapping[str, str] | None = None,
    *,
    shm_root: str = "/dev/shm",
    tmp_root: str | None = None,
) -> Path:
    """The run directory for control sockets and rings, created 0700 and checked.

    ``$PROBE_RUN_DIR`` when set (used as given: an unsafe one is an error). Otherwise the
    shared default (:func:`probe.ring_dir.default_ring_dir`); when that one is not safe
    (another user created it, it is group-writable, a link), ``$XDG_RUNTIME_DIR``'s
    ``vllm-graph-probe``, then a private temporary folder ``vllm-graph-probe-<uid>-*``,
    each with a warning that names the unsafe directory.
    :func:`probe.ring_dir.candidate_run_dirs` lists the same places for readers.
    """
    from probe.ring_dir import (
        FALLBACK_PREFIX,
        UnsafeRingDirError,
        check_ring_dir,
        default_ring_dir,
        private_tmp_dirs,
    )

    env = os.environ if environ is None else environ
    if env.get(config.RUN_DIR.name):
        return default_ring_dir(environ=env)
    try:
        return default_ring_dir(environ=env, shm_root=shm_root, tmp_root=tmp_root)
    except UnsafeRingDirError as exc:
        unsafe = exc
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        d = Path(xdg) / "vllm-graph-probe"
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o700)
            chosen = check_ring_dir(d)
            _log().warning("vllm-graph-probe: %s; using %s instead", unsafe, chosen)
            return chosen
        except OSError:
            pass
    for d in private_tmp_dirs(tmp_root):
        _log().warning("vllm-graph-probe: %s; using %s instead", unsafe, d)
        return d
    import tempfile

    d = Path(tempfile.mkdtemp(prefix=f"{FALLBACK_PREFIX}{os.getuid()}-", dir=tmp_root))
    _log().warning("vllm-graph-probe: %s; using the private folder %s instead", unsafe, d)
    return d


def role_from(title: Sequence[str], stack_modules: Sequence[str] = ()) -> str:
    """``api``, ``engine``, ``worker`` or ``other``, from the process title and argv (as
    ``/proc/<pid>/cmdline`` shows them after vLLM's ``setproctitle``) or, before the title
    is set, from the modules on the stack of the plugin's caller.

    >>> role_from(["VLLM::Worker_TP1"])
    'worker'
    """
    text = " ".join(title)
    if "EngineCore" in text:
        return "engine"
    if "VLLM::Worker" in text or "VllmWorker" in text:
        return "worker"
    if "vllm.entrypoints" in text or re.search(r"(^|/|\s)vllm\s+serve\b", text):
        return "api"
    mods = " ".join(stack_modules)
    if "vllm.v1.worker" in mods:
        return "worker"
    if "vllm.v1.engine.core" in mods:
        return "engine"
    if "vllm.entrypoints.openai" in mods or "vllm.entrypoints.cli" in mods:
        return "api"
    return "other"
