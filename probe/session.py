"""``probe attach --session-nice N``: the attach in a session (so an autogroup) of its own.

With autogroups (``sched_autogroup_enabled``), Linux shares the CPU between sessions first
and only then between the processes of one, so a process's own nice weighs it only against
its session's other processes. On a host whose CPUs a saturated server keeps busy, a reader
at its user's priority waits in the run queue far longer than it works (docs/reliability.md,
"The attach's session weight"); its session's weight is what changes that.

:func:`early` runs first thing in ``probe``'s ``main``, before the commands' modules are
imported, so the interpreter's start is the only work done at the old weight; ``probe
attach``'s own handler calls :func:`in_own_session` when :func:`early` did not run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from probe.errors import UsageError

AUTOGROUP_ENABLED = "/proc/sys/kernel/sched_autogroup_enabled"
MOVED = False
"""True in the process that now runs in its own session (the child of the fork)."""


def in_own_session(nice: int, enabled_path: str = AUTOGROUP_ENABLED) -> int | None:
    """``--session-nice N``: go on in a session of its own whose autogroup has nice ``N``.

    With autogroups (``sched_autogroup_enabled``), Linux shares the CPU between sessions
    first and only then between the processes of one, so a process's own nice weighs it
    only against its session's other processes; on a host whose CPUs a saturated server
    keeps busy, a reader at its user's priority waits in the run queue far longer than it
    works (docs/reliability.md). This forks: the child makes a new session, writes ``N``
    to ``/proc/self/autogroup`` and returns None (it runs the attach); the parent forwards
    SIGINT, SIGTERM and SIGHUP to it, waits, and returns its exit status. A value below
    the current one needs CAP_SYS_NICE (or root): then a one-line error, nothing started.
    """
    try:
        with open(enabled_path) as f:
            on = f.read().strip() == "1"
    except OSError:
        on = False
    if not on:
        raise UsageError(
            f"--session-nice: this kernel does not share the CPU by session ({enabled_path} "
            "is not 1), so a session's nice would change nothing; use nice(1) instead"
        )
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the attach itself
        os.close(r)
        try:
            os.setsid()
            with open("/proc/self/autogroup", "w") as group:
                group.write(str(nice))
            with contextlib.suppress(OSError, AttributeError):  # gone with the parent
                import ctypes

                ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PDEATHSIG
        except OSError as exc:
            os.write(w, (exc.strerror or str(exc)).encode()[:200])
            os._exit(2)
        os.write(w, b"ok")
        os.close(w)
        global MOVED
        MOVED = True
        return None
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        said = pipe.read()

    def forward(sig: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    _, status = os.waitpid(pid, 0)
    if said != b"ok":
        raise UsageError(
            f"--session-nice {nice}: {said.decode(errors='replace')} (a value below the "
            "session's present one needs CAP_SYS_NICE, or root)"
        )
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def early(argv: Sequence[str]) -> int | None:
    """``probe attach ... --session-nice N ...``: move before anything else is imported.
    Returns the exit status in the process that waited, None where the command goes on
    (the child, or a command line this does not apply to: a value argparse will refuse is
    left to it). Raises UsageError like :func:`in_own_session`."""
    if not argv or argv[0] != "attach":
        return None
    value = None
    for i, a in enumerate(argv):
        if a == "--":
            break
        if a == "--session-nice" and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--session-nice="):
            value = a.split("=", 1)[1]
    if value is None or "-h" in argv or "--help" in argv:
        return None
    from probe.commands import nice_value  # the parser's own check of the value

    try:
        nice = nice_value(value)
    except argparse.ArgumentTypeError:
        return None
    return in_own_session(nice)  # a UsageError goes to main's one-line error
