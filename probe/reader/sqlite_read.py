"""Reading an SQLite file that is not ours to change (a recording, a rocpd profile),
creating nothing beside it: what lies beside it decides how it is opened
(:func:`how_to_open`), and where its content waits in a ``-wal`` or a ``-journal`` that
SQLite would have to touch files beside it to read, it is read from a private copy
(:func:`private_copy`)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import sqlite3

#: how a file is opened: ``immutable`` (nothing beside it holds anything: no locks, no
#: ``-shm``), ``live`` (a writer's ``-wal`` and ``-shm`` are both there: read through them,
#: creating nothing), ``copy`` (a ``-wal`` with frames but no ``-shm``, or a rollback
#: journal with content: SQLite would create the ``-shm`` or roll the journal back beside
#: the file)
How = Literal["immutable", "live", "copy"]


def holds_content(side: Path, header: int) -> bool:
    """A regular file beside the database that holds more than its ``header`` bytes (a
    zero-length ``-wal`` or ``-journal`` holds nothing to read)."""
    try:
        st = os.lstat(side)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > header


def how_to_open(p: Path, wal_mode: bool) -> tuple[How, Path | None]:
    """How to read ``p`` (see :data:`How`), and the ``-wal`` or ``-journal`` whose content
    a private copy takes along (None: none)."""
    wal, shm, journal = Path(f"{p}-wal"), Path(f"{p}-shm"), Path(f"{p}-journal")
    if wal_mode and holds_content(wal, 32):
        return ("live", None) if shm.is_file() else ("copy", wal)
    if not wal_mode and holds_content(journal, 0):
        return "copy", journal
    return "immutable", None


def private_copy(p: Path, side: Path | None) -> sqlite3.Connection:
    """``p`` (with what ``side`` holds: a ``-wal``'s committed frames, or a hot rollback
    journal rolled back) read from a private copy in a temporary folder, opened read-only
    ``immutable``; the copy's name is gone when this returns (the open descriptor keeps it
    readable). Raises :class:`OSError` where the copy cannot be made and
    :class:`sqlite3.Error` where SQLite cannot recover it."""
    import shutil
    import sqlite3
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="probe-read-"))
    try:
        copy = d / "r.db"
        shutil.copyfile(p, copy)
        if side is not None:
            suffix = "-wal" if side.name.endswith("-wal") else "-journal"
            shutil.copyfile(side, Path(f"{copy}{suffix}"))
            with contextlib.closing(sqlite3.connect(copy)) as w:
                # the first read recovers the pair (a journal rolled back, a -wal's
                # committed frames found); the checkpoint writes them into the copy
                w.execute("SELECT count(*) FROM sqlite_master").fetchone()
                if suffix == "-wal":
                    w.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    w.execute("PRAGMA journal_mode=DELETE")
        return sqlite3.connect(copy.absolute().as_uri() + "?mode=ro&immutable=1", uri=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
