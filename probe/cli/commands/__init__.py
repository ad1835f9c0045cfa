"""The ``probe`` subcommands, one module each, and the helpers they share.

A command module defines ``add_parser(subparsers)``; the parser it adds sets
``func=<callable(args) -> int>``. User mistakes raise :class:`probe.errors.UsageError`
(exit status 2); runtime failures raise :class:`probe.errors.RuntimeFailure` (exit 1).
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probe.errors import UsageError

if TYPE_CHECKING:
    from rich.console import Console


__all__ = [
    "address",
    "boottime_ns",
    "console",
    "endpoint",
    "open_recording",
    "positive_float",
    "positive_int",
    "probe_version",
    "process_id",
    "storage_guard",
    "width",
]


def open_recording(path: str | Path | None) -> Any:
    """The recording at ``path`` (None: the bundled one), opened and validated; a file
    that is not a readable recording is a :class:`UsageError` naming it."""
    from probe.reader.recording import Recording, RecordingError, default_recording

    try:
        return Recording.open(Path(path) if path else default_recording())
    except RecordingError as exc:
        raise UsageError(str(exc)) from None


def console(width: int | None = None) -> Console:
    """A rich console for a command's output, ``width`` (``--width``) columns when given;
    the text it renders has its control characters escaped (:mod:`probe.cli.terminal`)."""
    from probe.cli.terminal import SafeConsole

    return SafeConsole(width=width or None, soft_wrap=False)


def storage_guard(fn: Callable[[], Any], out: Path) -> str | None:
    """Run a step of the reader; a storage failure (disk full, read-only) becomes a line."""
    try:
        fn()
    except (sqlite3.Error, OSError) as exc:
        return f"{out}: {' '.join(str(exc).split())}"
    return None


def boottime_ns() -> int:
    """``CLOCK_BOOTTIME`` in nanoseconds: the clock of every record."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def probe_version() -> str:
    """The package's version (``probe.__version__``, which pyproject.toml reads too), the same
    from an install and from a checkout."""
    from probe import __version__

    return __version__


# -- argument types: a bad value is argparse's one-line usage error (exit 2) --------------


def positive_float(text: str) -> float:
    """A finite number of seconds above 0 (``--interval``, ``--duration``, ``--timeout``)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number above 0")
    if v > 1e7:
        raise argparse.ArgumentTypeError(f"{text!r}: at most 10000000")
    return v


def _int_in(text: str, lo: int, hi: int, noun: str, give: str) -> int:
    """``text`` as an integer in ``lo..hi``, else one argparse error in these words."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
    if not lo <= v <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: {give}")
    return v


def positive_int(text: str) -> int:
    """An integer from 1 to 2**20 (``--reps``, ``--sample``)."""
    return _int_in(text, 1, 1 << 20, "an integer", f"give an integer from 1 to {1 << 20}")


def process_id(text: str) -> int:
    """A process id, 1 to 2**22 (Linux's largest ``pid_max``); 0 and -1 name no process
    (``ps --pid -1`` printed "no armed vLLM process found" and exited 1)."""
    return _int_in(text, 1, 1 << 22, "a process id", f"a process id is from 1 to {1 << 22}")


def width(text: str) -> int:
    """A terminal width in columns, 20 to 1000."""
    return _int_in(text, 20, 1000, "an integer", "give a width from 20 to 1000 columns")


def address(text: str) -> str:
    """``HOST:PORT`` or ``PORT`` to listen on (``--prometheus``); the port 0..65535."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: give HOST:PORT with a port 0..65535")
    if any(c.isspace() for c in host) or "/" in host:
        raise argparse.ArgumentTypeError(f"{text!r}: {host!r} is not a host name or address")
    return text


def endpoint(text: str) -> str:
    """An OTLP endpoint: ``http(s)://HOST:PORT[/path]`` or ``HOST:PORT`` (gRPC)."""
    from urllib.parse import urlsplit

    url = text if "://" in text else f"http://{text}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give http://HOST:PORT, https://HOST:PORT or HOST:PORT"
        )
    if port == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: port 0")
    return text
