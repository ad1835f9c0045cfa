"""What a long writer reports its progress to.

Writers report to a :class:`Progress`: ``stage(description, total, unit)`` starts a piece
of work, ``advance(n)`` adds ``n`` units done to it. :data:`SILENT` ignores both; it is the
default of every writer that takes ``progress=``, so nothing changes for a caller that
does not ask. The CLI draws it on stderr (:mod:`probe.cli.progress`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol, TypeVar

__all__ = ["SILENT", "Progress", "counted"]

T = TypeVar("T")


class Progress(Protocol):
    """What a long writer reports to."""

    def stage(self, description: str, total: int | None = None, unit: str = "steps") -> None:
        """A new piece of work of ``total`` ``unit`` (None: not known in advance)."""

    def advance(self, n: int = 1) -> None:
        """``n`` more units of the current stage are done."""


class _Silent:
    def stage(self, description: str, total: int | None = None, unit: str = "steps") -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


SILENT: Progress = _Silent()


def counted(items: Iterable[T], progress: Progress, every: int = 256) -> Iterator[T]:
    """``items``, advancing ``progress`` by ``every`` at a time and by the rest at the end."""
    n = 0
    for item in items:
        yield item
        n += 1
        if n == every:
            progress.advance(n)
            n = 0
    if n:
        progress.advance(n)
