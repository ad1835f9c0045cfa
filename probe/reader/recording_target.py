"""A new recording's target, checked before any work starts, and its writer: a columnar
recording folder, or an SQLite file for a name ending in ``.db``. Light to import (the
writers are imported when one is made): ``probe attach`` checks its target before it
enables the probe."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from probe.reader.recording_names import is_columnar, is_sqlite_name


def check_recording_target(path: str | Path, *, force: bool, flag: str) -> Path:
    """The new recording's path, checked before any work starts (as every output is: a
    missing or read-only folder, a name in the way without ``force`` is a
    :class:`UsageError`)."""
    from probe.errors import UsageError
    from probe.reader.output import check_target

    p = Path(path)
    if str(path) == "-":
        raise UsageError(f"{flag} -: a recording is written while it grows, not a stream")
    if is_sqlite_name(p):
        out = check_target(p, force=force, flag=flag)
        assert out is not None
        return out
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        raise UsageError(f"{flag} {p}: exists and is not a recording folder")
    if p.exists() and any(p.iterdir()):
        if not force:
            raise UsageError(f"{flag} {p}: exists (use --force to overwrite)")
        if not is_columnar(p):
            raise UsageError(f"{flag} {p}: a folder that is not a recording; not overwritten")
    if not p.parent.is_dir():
        raise UsageError(f"{flag} {p}: directory {p.parent} does not exist")
    if not os.access(p.parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {p}: directory {p.parent} is not writable")
    return p


def writer_at(p: Path, who: str = "") -> Any:
    """The writer of a new recording at ``p`` (checked by :func:`check_recording_target`;
    what was there is replaced): :class:`ColumnarWriter`, or
    :class:`~probe.reader.recording.RecordingWriter` for a name ending in ``.db``."""
    import shutil
    import sqlite3

    from probe.errors import RuntimeFailure
    from probe.reader.columnar import ColumnarWriter
    from probe.reader.output import new_file_in_place, os_reason
    from probe.reader.recording import RecordingWriter
    from probe.reader.recording_open import RecordingError

    prefix = f"{who}: " if who else ""
    if is_sqlite_name(p):
        new_file_in_place(p)
        try:
            return RecordingWriter(p)
        except (OSError, sqlite3.Error) as exc:
            p.unlink(missing_ok=True)
            why = " ".join(str(exc).split())
            raise RuntimeFailure(f"{prefix}cannot write {p}: {why}") from None
    try:
        if is_columnar(p):
            shutil.rmtree(p)
        return ColumnarWriter(p)
    except (OSError, RecordingError) as exc:
        why = os_reason(exc) if isinstance(exc, OSError) else str(exc)
        raise RuntimeFailure(f"{prefix}cannot write {p}: {why}") from None


def new_writer(path: str | Path, *, force: bool, flag: str, who: str = "") -> Any:
    """:func:`check_recording_target` then :func:`writer_at`, in one call."""
    return writer_at(check_recording_target(path, force=force, flag=flag), who)
