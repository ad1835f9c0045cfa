"""Opening a recording for reading, whatever is beside it: a path SQLite cannot take, a
``-wal`` without its ``-shm`` (read whole from a private copy), a file that is not a
recording. The one error type of the readers, :class:`RecordingError`, lives here too."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from probe.reader.sqlite_errors import SQLITE_DAMAGED, sqlite_message


class RecordingError(ValueError):
    """A recording cannot be read; the message names the file and the problem."""


def first_line(exc: BaseException) -> str:
    """An error (DuckDB's) in one line: its first (the lines after it point into the
    query)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def damaged_error(p: Path, exc: BaseException) -> RecordingError:
    return RecordingError(f"{p}: damaged or truncated recording ({sqlite_message(exc)})")


def connect_read_only(p: Path) -> sqlite3.Connection:
    """Open ``p`` read-only, creating nothing beside it.

    Only a regular file is opened (a FIFO would block, a device is not a recording). The
    URI is built from the absolute path with every reserved character quoted (``?``,
    ``#`` and ``%`` in a name are that file's name, never URI syntax). A recording that
    is still being written (WAL mode with its ``-wal`` and ``-shm`` beside it) is read
    through them, so its readers see what the writer committed; any other file is opened
    ``immutable=1``: nothing is created beside it, a read-only medium works, and a
    recording left by a killed reader is read from the ``.db`` alone up to its last
    checkpoint (the writer checkpoints on every commit).
    """
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise RecordingError(f"{p}: no such file") from None
    except OSError as exc:
        raise RecordingError(f"{p}: cannot read ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise RecordingError(f"{p}: is a directory, not a recording")
    if not stat.S_ISREG(st.st_mode):
        raise RecordingError(f"{p}: not a regular file (a FIFO, socket or device), not a recording")
    try:
        # O_NONBLOCK: a FIFO swapped in after the stat must not block the open
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise RecordingError(f"{p}: not a regular file, not a recording")
            head = os.pread(fd, 100, 0)
        finally:
            os.close(fd)
    except OSError as exc:
        raise RecordingError(f"{p}: cannot read ({exc.strerror})") from None
    if head[:16] != b"SQLite format 3\x00":
        raise RecordingError(f"{p}: not a probe recording (not an SQLite database)")
    wal_mode = len(head) > 19 and head[18] == 2 and head[19] == 2
    wal, shm = Path(f"{p}-wal"), Path(f"{p}-shm")
    live = wal_mode and wal.is_file() and shm.is_file()
    too_long = len(os.fsencode(p.absolute())) + len("-wal") > SQLITE_PATH_MAX
    try:
        if too_long or (wal_mode and not live and _has_frames(wal)):
            db = _read_copy(p, wal if wal_mode and _has_frames(wal) else None)
        else:
            uri = p.absolute().as_uri() + ("?mode=ro" if live else "?mode=ro&immutable=1")
            db = sqlite3.connect(uri, uri=True)
    except SQLITE_DAMAGED as exc:
        raise damaged_error(p, exc) from None
    db.text_factory = lambda b: b.decode("utf-8", "replace")
    return db


SQLITE_PATH_MAX = 500
"""SQLite's Unix VFS takes paths of 512 bytes at most (and resolves links to their long
target), where the system takes 4,096: a longer path is read from a private copy."""


def _has_frames(wal: Path) -> bool:
    """A ``-wal`` beside the file that holds frames (more than its 32-byte header)."""
    try:
        st = os.lstat(wal)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 32


def _read_copy(p: Path, wal: Path | None) -> sqlite3.Connection:
    """``p`` (with the committed frames of ``wal``) read from a private copy.

    Two cases need it. A ``-wal`` whose ``-shm`` is gone (a copy made without it):
    opened ``immutable`` the ``.db`` alone would read as of its last checkpoint, silently
    missing what the ``-wal`` committed since, and opened in place SQLite would rebuild
    the ``-shm`` beside the user's file; so both are copied, SQLite recovers the pair in
    the copy (committed frames only) and checkpoints it, and the copy is read. A path
    longer than SQLite takes: the copy's is short. Nothing is created beside ``p``.
    """
    from probe.reader.sqlite_read import private_copy

    try:
        return private_copy(p, wal)
    except OSError as exc:
        raise RecordingError(
            f"{p}: reading it needs a private copy (a -wal without its -shm, or a path "
            f"longer than SQLite takes), which failed ({exc.strerror or exc})"
        ) from None
