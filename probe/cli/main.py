"""The ``probe`` command line (started by :mod:`probe.cli.entry`); each command lives in
``probe/cli/commands/``.

    probe record --out run.probe -- python my_llm_script.py
    probe report run.probe            # no file: the bundled H200 recording
    probe doctor run.probe
    probe env                            # every PROBE_* variable and its value here

User mistakes (a missing file, a bad value) end in one line on stderr naming the problem
and exit status 2; runtime failures (a write that failed, an endpoint that refused) in
one line and exit status 1; never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from probe.errors import RuntimeFailure, UsageError
from probe.reader.output import SignalExit

__all__ = ["main"]  # and default_recording, imported when asked (__getattr__)

EXIT_USAGE = 2
EXIT_RUNTIME = 1
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process ended by SIGPIPE


class _Parser(argparse.ArgumentParser):
    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # An empty value is never a path, a name or a number here; taken as given it read
        # the bundled recording (``probe report "$UNSET"``) or the working directory
        # (``--run-dir ""``) without a word. A workload's own arguments (after ``--``) pass.
        if action.nargs not in (argparse.REMAINDER, argparse.PARSER):
            name = "/".join(action.option_strings) or action.metavar or action.dest
            if "" in arg_strings:
                raise argparse.ArgumentError(
                    None, f"{name}: an empty value (give one, or leave the argument out)"
                )
            if any("\x00" in a for a in arg_strings):  # only from main(argv): exec refuses it
                raise argparse.ArgumentError(None, f"{name}: a value with a NUL byte")
        return super()._get_values(action, arg_strings)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"probe: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


DESCRIPTION = """\
Per engine step of a vLLM server: did it replay a CUDA/HIP graph and, if not, why not;
how long the host spent before the GPU had its work; what the batch reorder decided."""

EXAMPLES = """\
examples:
  probe record --out run.probe -- vllm serve MODEL    run a command with the probe on
  probe attach --url http://127.0.0.1:8000 --duration 30 --record run.probe
  probe top --url http://127.0.0.1:8000                  live view of a running server
  probe agent --prometheus 0.0.0.0:9464 --sample 8       every server of this host, always on
  probe report run.probe                              summarize (no file: a bundled one)
  probe doctor run.probe                              graph support and known traps
  probe whatif run.probe --capture-sizes 1,2,4,8,16   the recorded shapes under other settings
  probe export run.probe --perfetto run.pftrace       Perfetto, Prometheus, OTLP
  probe env                                              every PROBE_* variable

Exit status: 0 done, 1 a runtime failure, 2 a usage error (one `probe: error:` line).
`probe COMMAND --help` for a command's flags."""


class _Version(argparse.Action):
    """``--version``: the installed version, looked up only when asked (the lookup reads
    package metadata, a cost every command paid at start)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS,
            help="show program's version number and exit",
        )  # fmt: skip

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any) -> NoReturn:
        from probe.cli.commands import probe_version

        print(f"{parser.prog} {probe_version()}")
        parser.exit()


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; when ``argv`` starts with a command's name, only that command's module
    is imported (``probe attach`` starts without importing ``ab``, ``export``, ...)."""
    p = _Parser(
        prog="probe",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")
    _add_command_modules(sub, argv)
    return p


def _add_command_modules(sub: Any, argv: Sequence[str] | None = None) -> None:
    """Subcommands living in ``probe/cli/commands/<name>.py``: all of them, or only the one
    ``argv`` names first.

    Each module defines ``add_parser(subparsers) -> None``; the parser it adds sets
    ``func=<callable(args) -> int>`` with ``set_defaults``. Commands raise
    :class:`UsageError` for user mistakes.
    """
    import importlib
    import importlib.util

    first = argv[0] if argv else ""
    if first.isidentifier() and not first.startswith("_"):
        # looked up, not listed: pkgutil's listing imports inspect (5 ms of attach's start)
        spec = importlib.util.find_spec(f"probe.cli.commands.{first}")
        if spec is not None and spec.origin is not None:  # a module, not a stray folder
            importlib.import_module(spec.name).add_parser(sub)
            return
    import pkgutil

    from probe.cli import commands

    names = sorted(m.name for m in pkgutil.iter_modules(commands.__path__))
    for name in [n for n in names if not n.startswith("_")]:
        importlib.import_module(f"probe.cli.commands.{name}").add_parser(sub)


def main(argv: Sequence[str] | None = None) -> int:
    entry = argv is None  # the process's own command line (console script, python -m)
    if entry:
        from probe.reader.output import guard_standard_streams, install_signal_cleanup

        guard_standard_streams()
        install_signal_cleanup()
    try:
        return _main(entry, sys.argv[1:] if argv is None else list(argv))
    except BrokenPipeError:  # a reader that left early (``| head``): quiet, as SIGPIPE
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except SignalExit as exc:  # the temporaries are gone already
        _quiet_stdout()
        return 128 + exc.signum


def _main(entry: bool, argv: list[str]) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        rc = int(args.func(args))
        sys.stdout.flush()  # here, so a full or closed stdout is one line, not a traceback
        if entry and getattr(args, "exit_at_once", False) and not _threads_left():
            # a command that closed everything it opened ends without the interpreter's
            # teardown (freeing every object and module one by one: 30-40 ms of CPU after
            # ``attach``, up to seconds of wall on the saturated host it waits in)
            sys.stderr.flush()
            os._exit(rc)
        return rc
    except UsageError as exc:
        return fail(str(exc), EXIT_USAGE)
    except ValueError as exc:  # a damaged recording met past the command's own checks
        from probe.reader.recording import RecordingError

        if not isinstance(exc, RecordingError):
            raise
        return fail(str(exc), EXIT_USAGE)
    except RuntimeFailure as exc:
        return fail(str(exc), EXIT_RUNTIME)
    except KeyboardInterrupt:
        return 130
    except MemoryError:  # past the address space it may use (ulimit -v): nothing partial left
        return fail("out of memory (the memory this command may use is spent)", EXIT_RUNTIME)
    except BrokenPipeError:
        raise
    except OSError as exc:  # stdout on a full device, a file that vanished mid-read
        where = exc.filename or ("standard output" if exc.errno in _STDOUT_ERRNOS else "probe")
        return fail(f"{where}: {exc.strerror or exc}", EXIT_RUNTIME)


def __getattr__(name: str) -> Any:
    if name == "default_recording":  # imported where asked: the recording module is heavy
        from probe.reader.recording import default_recording

        return default_recording
    raise AttributeError(name)


def _threads_left() -> bool:
    """A thread the interpreter's exit would wait for."""
    import threading

    main = threading.main_thread()
    return any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())


def fail(message: str, status: int) -> int:
    from probe.cli.terminal import sanitize

    _quiet_stdout()
    with contextlib.suppress(OSError):
        print(f"probe: error: {sanitize(' '.join(message.split()))}", file=sys.stderr)
    return status


# what a write to stdout fails with (a file name would be on the exception otherwise)
_STDOUT_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT, errno.EBADF})


def _quiet_stdout() -> None:
    """Point fd 1 at /dev/null when stdout cannot take what is buffered, so the
    interpreter's flush at exit does not print its own traceback."""
    import os

    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
