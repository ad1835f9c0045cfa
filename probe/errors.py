"""Exceptions shared by the command line and its subcommands.

Imported before ``probe attach`` raises its CPU share (:mod:`probe.reader.session`), so only what
the interpreter has loaded already: SQLite's damage is :mod:`probe.reader.sqlite_errors`.
"""

from __future__ import annotations


class UsageError(Exception):
    """A user mistake: ``probe`` prints it as one line and exits with status 2."""


class RuntimeFailure(Exception):
    """Something failed while running (a write, a network export): one line, status 1."""
