"""The ``probe`` command's entry point (``python -m probe`` too).

``probe attach`` and ``probe top`` take their CPU share here (:func:`probe.reader.session.early`),
before the parser and the commands are imported, so only the interpreter's own start runs
at the user's weight; everything else is :func:`probe.cli.main.main`.
"""

from __future__ import annotations

import sys


def main() -> int:
    from probe.errors import UsageError
    from probe.reader import session  # os, sys and probe.errors only

    try:
        moved = session.early(sys.argv[1:])  # nothing for a command not in session.COMMANDS
    except UsageError as exc:
        from probe.cli.main import EXIT_USAGE, fail

        return fail(str(exc), EXIT_USAGE)
    if moved is not None:  # the parent of a fork: the command ran in the child
        return moved
    from probe.cli.main import main as cli_main

    return cli_main()
