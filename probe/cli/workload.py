"""The workload ``probe record`` and ``probe ab`` run under the probe: the command after
``--``, checked before anything starts."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from probe.errors import UsageError


def check_command(cmd: list[str], who: str) -> list[str]:
    """The command after ``--``, checked: it exists and can be executed."""
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError(
            f"{who}: give the command to run after --, e.g. "
            "probe record --out run.probe -- vllm serve MODEL"
        )
    exe = cmd[0]
    found = shutil.which(exe) if os.sep not in exe else exe
    if found is None or not Path(found).exists():
        raise UsageError(f"{who}: command not found: {exe}")
    if Path(found).is_dir():
        raise UsageError(f"{who}: {exe} is a directory, not a command")
    if not os.access(found, os.X_OK):
        raise UsageError(f"{who}: {exe} is not executable")
    return cmd
