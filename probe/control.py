"""The reader's client of the per-process control socket (the server is
:mod:`probe.control_server`, inside vLLM).

    >>> from probe.control import request
    >>> request(path, "status")                                 # doctest: +SKIP
    {'ok': True, 'pid': 4242, 'role': 'worker', 'enabled': False, ...}
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from typing import Any

# the protocol's shared pieces are declared once, on the engine side
from probe.control_server import (
    CLIENT_TIMEOUT_S,
    COMMANDS,
    MAX_LINE,
    SOCK_RE,
    ControlError,
    ControlServer,
    PeerRefused,
    check_peer,
    peer_cred,
    pid_alive,
    role_from,
    socket_path,
    start_server,
)


def request(
    path: str | os.PathLike[str], cmd: str, *, timeout: float = CLIENT_TIMEOUT_S, **args: Any
) -> dict[str, Any]:
    """Send one command to the socket at ``path``; returns the reply.

    Raises :class:`ControlError` for an error reply, ``OSError`` when nobody answers, and
    :class:`PeerRefused` when the server is not our user (or root).
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(os.fspath(path))
        check_peer(peer_cred(s))
        with contextlib.suppress(BrokenPipeError):  # refused: the reply is there to read
            s.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            if len(buf) > 16 * MAX_LINE:
                raise ControlError(f"{path}: reply too long")
    if not buf:
        raise ControlError(f"{path}: no reply")
    try:
        reply = json.loads(buf)
    except ValueError as exc:
        raise ControlError(f"{path}: malformed reply ({exc})") from None
    if not isinstance(reply, dict):
        raise ControlError(f"{path}: malformed reply")
    if not reply.get("ok"):
        raise ControlError(str(reply.get("error", "refused")))
    return reply


__all__ = [
    "COMMANDS",
    "MAX_LINE",
    "SOCK_RE",
    "ControlError",
    "ControlServer",
    "PeerRefused",
    "check_peer",
    "peer_cred",
    "pid_alive",
    "request",
    "role_from",
    "socket_path",
    "start_server",
]
