"""The reader's client of the per-process control socket (the server is
:mod:`probe.engine.control_server`, inside vLLM).

    >>> from probe.reader.control import request
    >>> request(path, "status")                                 # doctest: +SKIP
    {'ok': True, 'pid': 4242, 'role': 'worker', 'enabled': False, ...}
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import time
import typing
from collections.abc import Sequence
from typing import Any

# the protocol's shared pieces are declared once (probe.control_protocol)
from probe.control_protocol import (
    CLIENT_TIMEOUT_S,
    COMMANDS,
    MAX_LINE,
    SOCK_RE,
    ControlError,
    PeerRefused,
    check_peer,
    parse_message,
    peer_cred,
    pid_alive,
    role_from,
    socket_path,
)


def request(
    path: str | os.PathLike[str], cmd: str, *, timeout: float = CLIENT_TIMEOUT_S, **args: Any
) -> dict[str, Any]:
    """Send one command to the socket at ``path``; returns the reply.

    Raises :class:`ControlError` for an error reply, ``OSError`` when nobody answers, and
    :class:`PeerRefused` when the server is not our user (or root).
    """
    (reply,) = request_all([path], cmd, timeout=timeout, **args)
    if isinstance(reply, BaseException):
        raise reply
    return reply


def request_all(
    paths: Sequence[str | os.PathLike[str]],
    cmd: str,
    *,
    timeout: float = CLIENT_TIMEOUT_S,
    **args: Any,
) -> list[dict[str, Any] | Exception]:
    """Send one command to every socket in ``paths`` at once and wait for all the replies
    together, within ``timeout``: a reply or, in its place, the exception that
    :func:`request` would raise for it, in the order of ``paths``.

    A busy process answers late (its control thread waits for the interpreter's lock and
    a CPU): asked one after the other, ``probe attach`` waited for the sum of those
    waits at its start and at its end; together, for the longest.
    """
    line = json.dumps({"cmd": cmd, **args}).encode() + b"\n"
    out: list[dict[str, Any] | Exception | None] = [None] * len(paths)
    bufs: dict[int, bytearray] = {}
    deadline = time.monotonic() + timeout
    with contextlib.ExitStack() as stack, selectors.DefaultSelector() as sel:
        for i, path in enumerate(paths):
            try:
                s = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
                s.settimeout(max(0.0, deadline - time.monotonic()))
                s.connect(os.fspath(path))
                check_peer(peer_cred(s))
                with contextlib.suppress(BrokenPipeError):  # refused: the reply is there
                    s.sendall(line)
                s.setblocking(False)
            except (OSError, ControlError) as exc:
                out[i] = exc
                continue
            bufs[i] = bytearray()
            sel.register(s, selectors.EVENT_READ, i)
        while bufs:
            left = deadline - time.monotonic()
            events = sel.select(left) if left > 0 else []
            if not events:
                for i in bufs:
                    out[i] = TimeoutError(f"{paths[i]}: no reply within {timeout:g} s")
                break
            for key, _mask in events:
                i, conn = key.data, key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    chunk = conn.recv(65536)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    out[i] = exc
                    chunk = None
                buf = bufs[i]
                if chunk:
                    buf += chunk
                    if len(buf) > 16 * MAX_LINE:
                        out[i] = ControlError(f"{paths[i]}: reply too long")
                    elif not buf.endswith(b"\n"):
                        continue
                if out[i] is None:
                    out[i] = _reply(paths[i], bytes(buf))
                sel.unregister(conn)
                del bufs[i]
    return typing.cast("list[dict[str, Any] | Exception]", out)  # each slot was filled


def _reply(path: str | os.PathLike[str], buf: bytes) -> dict[str, Any] | Exception:
    if not buf:
        return ControlError(f"{path}: no reply")
    try:
        reply = parse_message(buf)
    except (ValueError, RecursionError) as exc:
        return ControlError(f"{path}: malformed reply ({exc})")
    if not isinstance(reply, dict):
        return ControlError(f"{path}: malformed reply")
    if not reply.get("ok"):
        return ControlError(str(reply.get("error", "refused")))
    return reply


__all__ = [
    "COMMANDS",
    "MAX_LINE",
    "SOCK_RE",
    "ControlError",
    "PeerRefused",
    "check_peer",
    "parse_message",
    "peer_cred",
    "pid_alive",
    "request",
    "request_all",
    "role_from",
    "socket_path",
]
