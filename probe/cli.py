"""The ``probe`` command line: the entry point; each command lives in ``probe/commands/``.

    probe record --out run.probe.db -- python my_llm_script.py
    probe report run.probe.db            # no file: the bundled H200 recording
    probe doctor run.probe.db
    probe env                            # every PROBE_* variable and its value here

User mistakes (a missing file, a bad value) end in one line on stderr naming the problem
and exit status 2; runtime failures (a write that failed, an endpoint that refused) in
one line and exit status 1; never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from probe.errors import RuntimeFailure, UsageError
from probe.recording import default_recording

__all__ = ["default_recording", "main"]

EXIT_USAGE = 2
EXIT_RUNTIME = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"probe: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="probe", description=__doc__.split("\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    _add_command_modules(sub)
    return p


def _add_command_modules(sub: Any) -> None:
    """Subcommands living in ``probe/commands/<name>.py``.

    Each module defines ``add_parser(subparsers) -> None``; the parser it adds sets
    ``func=<callable(args) -> int>`` with ``set_defaults``. Commands raise
    :class:`UsageError` for user mistakes.
    """
    import importlib
    import pkgutil

    from probe import commands

    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        importlib.import_module(f"probe.commands.{mod.name}").add_parser(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"probe: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeFailure as exc:
        print(f"probe: error: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
