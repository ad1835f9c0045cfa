"""The attach's CPU share: by default (``--session-nice auto``) raised where it is permitted.

With autogroups (``sched_autogroup_enabled``), Linux shares the CPU between sessions first
and only then between the processes of one, so a process's own nice weighs it only against
its session's other processes. On a host whose CPUs a saturated server keeps busy, a reader
at its user's priority waits in the run queue far longer than it works: the requested
duration ran over by seconds (docs/reliability.md, "The attach's session weight"); its
session's weight is what changes that.

``auto`` (the default): with CAP_SYS_NICE (root), the attach goes on in a session of its own
whose autogroup has nice -5, and has nice -5 itself (which is what counts where autogroups do
not apply: autogroups off, or a container's CPU cgroup); without it, it runs as started.
``N``: the same with N, and a one-line error where N is not permitted. ``off``: as started.
Where ``auto`` cannot write the nice (a read-only ``/proc``, say) the attach goes on as
started; the recording's meta (``reader_share``) says what was done.

How it gets into a session of its own, in this order: a session leader already has one (only
the autogroup's nice is written); a process that leads no process group and has no terminal
(a script's or a service's child) calls ``setsid`` itself, so its pid stays the attach's;
otherwise (a terminal's job, which leads its process group) it forks: the child runs the
attach in a new session and the parent stays in the terminal's job control, forwarding
signals and returning the child's status.

:func:`early` runs first thing in the ``probe`` command (:mod:`probe.cli.entry`), before the
parser and the commands' modules are imported, so the interpreter's start is the only work
done at the old weight (``probe.cli.main.main`` itself does not: called from a program, only an
explicit value is taken, by the command's handler, and never with a fork). ``probe top``,
the other live reader, takes its share the same way.
"""

from __future__ import annotations

import os
import sys
import time

from probe.errors import UsageError

# Only what the interpreter has loaded already (and probe.errors): this runs before the
# raise, at the user's weight, where each ms of CPU waited 3-50 ms on the saturated host.

AUTOGROUP_ENABLED = "/proc/sys/kernel/sched_autogroup_enabled"
AUTO_NICE = -5
"""What ``auto`` asks for: on the saturated CPU server of docs/reliability.md ("The default
share") 20 of 34 attaches within D + 2 s, against 3 of 18 as started, and the server served
as many requests per second either way."""
CAP_SYS_NICE = 23

STARTED = time.monotonic()
"""When this module was imported: first thing in the ``probe`` command (``time`` is built
into the interpreter, so this costs no import)."""
WAIT_NOTE_S = 1.0
"""The least run-queue wait that :func:`wait_note` reports (and at least a tenth of the
time the command ran)."""

MOVED = False
"""True once this process runs with the share :func:`raise_share` set (also in a fork's child)."""
SHARE = "as started"
"""What was done, for the recording's meta (``reader_share``)."""


def may_raise(status_path: str = "/proc/self/status") -> bool:
    """Whether this process may lower a nice value (CAP_SYS_NICE in its effective set)."""
    try:
        with open(status_path) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def autogroups_on(enabled_path: str = AUTOGROUP_ENABLED) -> bool:
    try:
        with open(enabled_path) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def _has_terminal() -> bool:
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
    except OSError:
        return False
    return True


def _set(nice: int, group: bool) -> None:
    """Write ``nice`` to this session's autogroup (``group``) and to this process."""
    if group:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    os.setpriority(os.PRIO_PROCESS, 0, nice)


def _refused(nice: int, why: str) -> UsageError:
    return UsageError(
        f"--session-nice {nice}: {why} (a value below the session's present one needs "
        "CAP_SYS_NICE, or root)"
    )


def raise_share(
    setting: int | str = "auto",
    enabled_path: str = AUTOGROUP_ENABLED,
    fork: bool = True,
    command: str = "attach",
) -> int | None:
    """Give the attach (or ``probe top``: ``command``) the CPU share ``setting`` asks for
    (``auto``, ``off`` or a nice value; see the module's text). Returns None where the
    command goes on in this process, the child's exit status in a parent that forked and
    waited. Raises UsageError for an explicit value that is not permitted (nothing is
    started then), and where a fork is needed but not allowed (``fork=False``:
    ``probe.cli.main.main`` called from a program)."""
    global MOVED, SHARE
    if setting == "off" or MOVED:
        return None
    strict = setting != "auto"  # auto never stops an attach: as started where it cannot
    if setting == "auto":
        if not may_raise():
            SHARE = "as started (raising it needs CAP_SYS_NICE)"
            return None
        nice = AUTO_NICE
    else:
        nice = int(setting)
    group = autogroups_on(enabled_path)
    if not group:
        try:
            _set(nice, group=False)
        except OSError as exc:
            _not_set(nice, exc, strict)
            return None
        MOVED, SHARE = True, f"nice {nice} (no session groups)"
        return None
    done = f"a session of its own, autogroup nice {nice}"
    pid = os.getpid()
    if os.getsid(0) == pid or (os.getpgrp() != pid and not _has_terminal()):
        try:
            if os.getsid(0) != pid:
                os.setsid()
            _set(nice, group=True)
        except OSError as exc:
            _not_set(nice, exc, strict)
            return None
        MOVED, SHARE = True, done
        return None
    if not fork:
        raise UsageError(
            f"--session-nice {nice}: this process leads its process group (or has a terminal), "
            f"so only a fork could give it a session of its own; run probe {command} as a "
            "command"
        )
    return _fork(nice, done, strict)


def _not_set(nice: int, exc: OSError, strict: bool) -> None:
    """An explicit value that could not be set is the user's error; ``auto``'s is noted."""
    global SHARE
    why = exc.strerror or str(exc)
    if strict:
        raise _refused(nice, why) from None
    SHARE = f"as started (nice {nice}: {why})"


def _fork(nice: int, done: str, strict: bool = True) -> int | None:
    """A terminal's job: the attach in a child that makes a new session; this process
    forwards signals to it (job control: Ctrl-Z stops both, ``fg`` continues both), waits
    and returns its status (128 + N for a signal)."""
    global MOVED, SHARE
    import contextlib  # before the fork, at the old weight: small, and site loads them
    import signal

    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCONT, signal.SIGWINCH)
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    # held until the parent's handlers are in, so none comes between the fork and them
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {*forwarded, signal.SIGTSTP})
    pid = os.fork()
    if pid == 0:  # the child: the attach itself
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(r)
        with contextlib.suppress(OSError, AttributeError):  # gone with the parent
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PDEATHSIG
        try:
            os.setsid()
            _set(nice, group=True)
            SHARE = done
        except OSError as exc:
            why = exc.strerror or str(exc)
            if strict:
                os.write(w, why.encode()[:200])
                os._exit(2)
            SHARE = f"a session of its own, as started (nice {nice}: {why})"
        os.write(w, b"ok")
        os.close(w)
        MOVED = True
        return None
    os.close(w)

    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    def stop(_sig: int, _frame: object) -> None:
        # the child leads an orphaned process group, where the kernel drops SIGTSTP
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stops here until SIGCONT
        signal.signal(signal.SIGTSTP, stop)

    # SIGINT and SIGTERM always, as the attach handles them itself whatever it inherited
    # (a shell without job control starts background commands with SIGINT ignored); the
    # others unless ignored at the start (nohup's SIGHUP stays ignored)
    for sig in forwarded:
        if sig in (signal.SIGINT, signal.SIGTERM) or signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, forward)
    if signal.getsignal(signal.SIGTSTP) is not signal.SIG_IGN:
        signal.signal(signal.SIGTSTP, stop)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    with os.fdopen(r, "rb") as pipe:
        said = pipe.read()
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue
    if said != b"ok":
        raise _refused(nice, said.decode(errors="replace"))
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def parse_setting(text: str) -> int | str:
    """``--session-nice``'s value: ``auto``, ``off`` or a nice value from -20 to 19; a
    ValueError with the parser's message otherwise."""
    if text in ("auto", "off"):
        return text
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"{text!r}: give auto, off or a nice value") from None
    if not -20 <= v <= 19:
        raise ValueError(f"{text!r}: give a nice value from -20 to 19")
    return v


def setting_value(text: str) -> int | str:
    """:func:`parse_setting` as an argparse ``type``."""
    import argparse  # loaded by then: this runs in the parser

    try:
        return parse_setting(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


COMMANDS = ("attach", "top", "agent")
"""The readers that take a share: each drains the engines' rings live while attached."""


def early(argv: list[str]) -> int | None:
    """``probe attach ...`` (or ``probe top ...``): take the share ``--session-nice`` asks for
    (default ``auto``) before anything else is imported (:mod:`probe.cli.entry`). Returns the
    exit status in a parent that forked and waited, None where the command goes on (here or
    in the child, or a command line this does not apply to: another command, a value the
    parser will refuse, or ``--help``, is left to it). Raises UsageError like
    :func:`raise_share`."""
    if not argv or argv[0] not in COMMANDS:
        return None
    value = "auto"
    for i, a in enumerate(argv):
        if a == "--":
            break
        if a == "--session-nice" and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--session-nice="):
            value = a.split("=", 1)[1]
    if "-h" in argv or "--help" in argv:
        return None
    try:
        setting = parse_setting(value)
    except ValueError:
        return None
    return raise_share(setting, command=argv[0])  # a UsageError: main's one-line error


def cpu_wait_s(path: str = "/proc/self/schedstat") -> float | None:
    """Seconds this process's main thread has spent runnable but not running (waiting in
    the run queue) since it started: the second field of ``/proc/self/schedstat``. None
    where the kernel does not say."""
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def wait_note(waited_s: float | None, ran_s: float) -> str | None:
    """One line for a reader that waited for a CPU a good part of the time it ran (at least
    :data:`WAIT_NOTE_S` and a tenth of ``ran_s``), else None. On a saturated host that wait,
    not its own work, is what makes an attach finish late; the recording is not affected
    (the hooks keep their own deadline in each process)."""
    if waited_s is None or waited_s < WAIT_NOTE_S or waited_s < 0.1 * ran_s:
        return None
    return (
        f"this reader waited {waited_s:.1f} s of its {ran_s:.1f} s for a CPU (the host's "
        "CPUs are saturated), so it started and finished late; the hooks kept their own "
        "deadline. Started in a session raised before the interpreter starts (as root: "
        "sudo setsid -w sh -c 'echo -5 > /proc/self/autogroup && exec probe attach ...'; "
        'docs/attach.md, "On a host the server keeps busy") it waits far less'
    )
