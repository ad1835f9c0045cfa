"""What the tests that talk to a server on loopback share: a free port, a JSON answer
over HTTP, a wait for a condition."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 5.0) -> Any:
    """The JSON body at ``url``; an HTTP error raises."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def get_answer(url: str, timeout: float = 10.0) -> Any:
    """The JSON body at ``url``, an error's too (Prometheus's 400/422 carry it as JSON)."""
    try:
        return get_json(url, timeout)
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def wait_for(pred: Any, timeout: float, what: str) -> None:
    """Poll ``pred()`` every 0.2 s (an OSError counts as not yet) until it is true; after
    ``timeout`` seconds an AssertionError names ``what``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
