"""The ``probe`` subcommands, one module each, and the helpers they share.

A command module defines ``add_parser(subparsers)``; the parser it adds sets
``func=<callable(args) -> int>``. User mistakes raise :class:`probe.errors.UsageError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from probe.errors import UsageError

if TYPE_CHECKING:
    from probe.recording import Recording

__all__ = ["open_recording"]


def open_recording(path: str | Path | None) -> Recording:
    """The recording at ``path`` (None: the bundled one), opened and validated; a file
    that is not a readable recording is a :class:`UsageError` naming it."""
    from probe.recording import Recording, RecordingError, default_recording

    try:
        return Recording.open(Path(path) if path else default_recording())
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
