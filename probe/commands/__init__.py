"""The ``probe`` subcommands, one module each, and the helpers they share.

A command module defines ``add_parser(subparsers)``; the parser it adds sets
``func=<callable(args) -> int>``. User mistakes raise :class:`probe.errors.UsageError`
(exit status 2); runtime failures raise :class:`probe.errors.RuntimeFailure` (exit 1).
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probe.errors import UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from probe.recording import Recording

__all__ = ["boottime_ns", "console", "open_recording", "probe_version", "storage_guard"]


def open_recording(path: str | Path | None) -> Recording:
    """The recording at ``path`` (None: the bundled one), opened and validated; a file
    that is not a readable recording is a :class:`UsageError` naming it."""
    from probe.recording import Recording, RecordingError, default_recording

    try:
        return Recording.open(Path(path) if path else default_recording())
    except RecordingError as exc:
        raise UsageError(str(exc)) from None


def console(args: argparse.Namespace) -> Console:
    """A rich console for a command's output, ``--width`` columns when given."""
    from rich.console import Console

    return Console(width=getattr(args, "width", None) or None, soft_wrap=False)


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
    """The installed vllm-graph-probe's version (``0+unknown`` from a bare checkout)."""
    try:
        from importlib.metadata import version

        return version("vllm-graph-probe")
    except Exception:
        return "0+unknown"
