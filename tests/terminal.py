"""Reading what programs write to a pseudo-terminal, for the tests that run them on one."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable


def read_terminal(
    fd: int,
    idle: float = 60,
    total: float | None = None,
    on_chunk: Callable[[bytes], None] | None = None,
) -> bytes:
    """Everything written to the terminal whose master is ``fd`` until every writer has
    closed it (EIO), ``idle`` seconds pass without output or ``total`` seconds in all;
    ``on_chunk`` sees the output so far after each read."""
    seen = bytearray()
    start = last = time.monotonic()
    while time.monotonic() - last < idle and (total is None or time.monotonic() - start < total):
        if not select.select([fd], [], [], min(1.0, idle))[0]:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: every process holding the terminal has closed it
            break
        if not chunk:
            break
        seen += chunk
        last = time.monotonic()
        if on_chunk is not None:
            on_chunk(bytes(seen))
    return bytes(seen)
