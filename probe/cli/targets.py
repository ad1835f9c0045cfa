"""Which armed vLLM processes a command means (``--url``, ``--pid``, ``--run-dir``; ``probe
ps``, ``attach``, ``top`` and ``doctor`` take them) and finding them over their control
sockets."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.cli.commands import process_id
from probe.errors import UsageError


@dataclass(frozen=True)
class Target:
    """The processes asked for: a server's URL or a process id (each with its children),
    or every one; and where their control sockets are (None: the default places)."""

    url: str | None = None
    pid: int | None = None
    run_dir: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Target:
        """From a parser that :func:`add_target_args` set up."""
        return cls(url=args.url, pid=args.pid, run_dir=args.run_dir)

    def where(self) -> str:
        """`` for URL``, `` under pid N`` or nothing: for a message about these processes."""
        if self.url:
            return f" for {self.url}"
        return f" under pid {self.pid}" if self.pid else ""


def add_target_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--url", help="the server's URL: its listening process and children")
    g.add_argument("--pid", type=process_id, help="a process id: it and its children")
    p.add_argument("--run-dir", help="where the control sockets are (default: PROBE_RUN_DIR)")


def run_dir(target: Target) -> Path:
    """``--run-dir``, checked, or the default run directory."""
    from probe.ring_dir import UnsafeRingDirError, default_ring_dir

    try:
        if target.run_dir:
            from probe.ring_dir import check_ring_dir

            return check_ring_dir(target.run_dir)
        return default_ring_dir()
    except (UnsafeRingDirError, FileNotFoundError, NotADirectoryError) as exc:
        raise UsageError(str(exc)) from None


def run_dirs(target: Target) -> list[Path]:
    """``--run-dir``, or every safe place a server of ours may have its socket in (the
    shared default and the fallbacks a server uses when that one is not safe)."""
    if target.run_dir:
        return [run_dir(target)]
    from probe.ring_dir import candidate_run_dirs

    return candidate_run_dirs() or [run_dir(target)]


def discover(target: Target) -> list[Any]:
    """The armed processes of ``target``, one per pid (those that did not answer carry
    their error)."""
    from probe.reader.discover import DiscoveryError, find_processes

    out: dict[int, Any] = {}
    try:
        for d in run_dirs(target):
            for a in find_processes(d, pids=[target.pid] if target.pid else None, url=target.url):
                out.setdefault(a.pid, a)
    except DiscoveryError as exc:
        raise UsageError(str(exc)) from None
    return list(out.values())
