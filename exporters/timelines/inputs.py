"""Opening foreign profile files safely: regular files only, bounded, never writing.

Every reader goes through these functions, so the rules hold for all formats:

- only a regular file is read; a FIFO, device, socket or directory is refused at once
  (:class:`~exporters.timelines.model.ProfileError`), before anything could block on it;
- a gzip stream is decompressed in bounded chunks: it may expand to at most
  :data:`GZIP_MAX_RATIO` times its compressed size (and at least :data:`GZIP_MIN_LIMIT`
  bytes), so a small decompression bomb fails with a clear error instead of taking memory;
- JSON nesting is bounded by the parser (a document nested too deep is an error);
- SQLite files are opened through a correctly escaped ``file:`` URI, read-only and
  ``immutable=1``, so that nothing is ever created next to the input (read-only media work
  too); a writer's ``-wal`` with its ``-shm`` is read through, and content waiting in a
  ``-wal`` without its ``-shm`` or in a rollback journal is read from a private copy
  (:mod:`probe.reader.sqlite_read`); queries run under a deadline.

:func:`timestamp_ns` is the one check of a timestamp's type and range used by the readers.
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import stat
import struct
import time
import urllib.parse
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from exporters.timelines.model import ProfileError
from probe.reader.sqlite_errors import SQLITE_DAMAGED, sqlite_message

__all__ = [
    "GZIP_MAX_RATIO",
    "GZIP_MIN_LIMIT",
    "MAX_TIMESTAMP_NS",
    "SQLITE_DEADLINE_S",
    "open_regular",
    "open_sqlite",
    "read_bytes",
    "read_json_document",
    "regular_file",
    "timestamp_ns",
]

GZIP_MAX_RATIO = 64
"""A gzip member may expand to this many times its compressed size (real traces: ~25)."""

GZIP_MIN_LIMIT = 64 << 20
"""...and always to at least this many bytes (64 MiB)."""

MAX_TIMESTAMP_NS = (1 << 63) - 1
"""Largest timestamp a profile may hold (Perfetto and SQLite store signed 64-bit ns)."""

SQLITE_DEADLINE_S = 60.0
"""Longest time one SQLite read may run before it is interrupted as an error."""

_CHUNK = 1 << 20
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def regular_file(path: str | os.PathLike[str], what: str = "profile") -> os.stat_result:
    """``os.stat`` of ``path``, or :class:`ProfileError` when it is missing or not a regular
    file (directories, FIFOs, devices and sockets are refused without being opened)."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ProfileError(p, "no such file") from None
    except OSError as exc:
        raise ProfileError(p, f"cannot read file: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ProfileError(p, f"is {_kind(st.st_mode)}; a {what} must be a regular file")
    return st


def open_regular(path: str | os.PathLike[str], what: str = "profile") -> IO[bytes]:
    """Open a regular file for reading in binary mode.

    The file is opened non-blocking and checked again after opening, so a FIFO put in
    its place between the check and the open cannot make the reader wait.
    """
    p = Path(path)
    regular_file(p, what)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ProfileError(p, f"cannot read file: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ProfileError(p, f"is {_kind(st.st_mode)}; a {what} must be a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _gunzip(p: Path, fh: IO[bytes], compressed: int) -> bytes:
    limit = max(GZIP_MIN_LIMIT, GZIP_MAX_RATIO * compressed)
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=fh) as gz:
            while chunk := gz.read(_CHUNK):
                out += chunk
                if len(out) > limit:
                    raise ProfileError(
                        p,
                        f"the gzip stream expands past {limit} bytes ({GZIP_MAX_RATIO} times "
                        f"its {compressed} compressed bytes); refused as a decompression bomb",
                    )
    except EOFError as exc:
        raise ProfileError(p, "truncated gzip stream (file ends before the end marker)") from exc
    except (OSError, zlib.error) as exc:
        raise ProfileError(p, f"corrupt gzip stream: {exc}") from exc
    return bytes(out)


def read_bytes(path: str | os.PathLike[str], what: str = "profile") -> bytes:
    """The bytes of a regular file, gunzipped (bounded) when it starts with the gzip magic."""
    p = Path(path)
    with open_regular(p, what) as fh:
        head = fh.read(2)
        if head == b"\x1f\x8b":
            fh.seek(0)
            return _gunzip(p, fh, os.fstat(fh.fileno()).st_size)
        try:
            return head + fh.read()
        except OSError as exc:
            raise ProfileError(p, f"cannot read file: {exc.strerror or exc}") from None


def read_json_document(
    path: str | os.PathLike[str],
    *,
    parse_float: Callable[[str], Any] | None = None,
) -> Any:
    """Load a ``.json`` or gzip-compressed ``.json.gz`` file (detected by content).

    Raises :class:`ProfileError` for a missing or non-regular file, a truncated, corrupt or
    over-expanding gzip stream, bytes that are not UTF-8, text that is not JSON, or JSON
    nested deeper than the parser allows.
    """
    p = Path(path)
    raw = read_bytes(p)
    if not raw.strip():
        raise ProfileError(p, "empty file, expected JSON")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(
            p, f"not JSON: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from exc
    del raw
    try:
        return json.loads(text, parse_float=parse_float)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            p, f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except RecursionError as exc:
        raise ProfileError(p, "not JSON that can be read: nesting too deep") from exc
    except ValueError as exc:  # e.g. an integer literal longer than Python converts
        raise ProfileError(p, f"not JSON that can be read: {exc}") from exc


def timestamp_ns(p: Path, where: str, value: Any, field: str) -> int:
    """``value`` as a timestamp in ns: an integer in ``[0, 2**63)``, else ProfileError."""
    if isinstance(value, bool) or not isinstance(value, int):
        shown = repr(value) if not isinstance(value, str | bytes) else repr(value[:40])
        kind = type(value).__name__ if value is not None else "NULL"
        raise ProfileError(p, f"{shown} ({kind}) is not an integer timestamp", f"{where} {field}")
    if not 0 <= value <= MAX_TIMESTAMP_NS:
        raise ProfileError(
            p,
            f"timestamp {value} is outside 0..2^63-1 ns (negative or overflowing)",
            f"{where} {field}",
        )
    return value


# --------------------------------------------------------------------------- SQLite


def _check_sqlite_header(p: Path, size: int) -> bytes:
    """Reject empty, non-SQLite and truncated files before sqlite3 sees them; returns the
    header."""
    with open_regular(p, "database") as fh:
        header = fh.read(100)
    if size == 0:
        raise ProfileError(p, "empty file, not an SQLite database")
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise ProfileError(p, "not an SQLite database (no 'SQLite format 3' header)")
    (page_size,) = struct.unpack(">H", header[16:18])
    page_size = 65536 if page_size == 1 else page_size
    change_counter, page_count = struct.unpack(">II", header[24:32])
    (valid_for,) = struct.unpack(">I", header[92:96])
    # The in-header page count is valid when version-valid-for equals the change counter.
    if page_count and valid_for == change_counter and not Path(f"{p}-wal").exists():
        expected = page_count * page_size
        if size < expected:
            raise ProfileError(
                p,
                f"truncated database: the header says {page_count} pages of {page_size} bytes "
                f"({expected} bytes) but the file has {size} bytes",
            )
    return header


def sqlite_uri(p: Path) -> str:
    """The ``file:`` URI that opens exactly ``p`` read-only and creates nothing beside it:
    ``immutable=1`` (no locks, no ``-shm``), or ``mode=ro`` where a writer's ``-wal`` and
    ``-shm`` are both beside it (:func:`probe.reader.sqlite_read.how_to_open`).

    Every character SQLite's URI parser treats specially (``?``, ``#``, ``%``) is escaped.
    """
    from probe.reader.sqlite_read import how_to_open

    path = urllib.parse.quote(str(p.resolve()), safe="/")
    how, _ = how_to_open(p, _wal_mode(p))
    return f"file:{path}?mode=ro" if how == "live" else f"file:{path}?immutable=1"


def _wal_mode(p: Path) -> bool:
    try:
        with open_regular(p, "database") as fh:
            head = fh.read(20)
    except ProfileError:
        return False
    return len(head) == 20 and head[18] == 2 and head[19] == 2


def open_sqlite(
    path: str | os.PathLike[str], deadline_s: float = SQLITE_DEADLINE_S
) -> sqlite3.Connection:
    """Open an existing SQLite file read-only, creating nothing beside it.

    Opened as :func:`sqlite_uri` says; where its content waits in a ``-wal`` without its
    ``-shm`` or in a rollback journal (SQLite would create the ``-shm`` or roll back beside
    it), it is read from a private copy (:func:`probe.reader.sqlite_read.private_copy`). The
    connection refuses writes (``query_only``), does not trust functions named in the
    file's schema (``trusted_schema=OFF``) and interrupts any statement still running
    ``deadline_s`` seconds after the open. Raises :class:`ProfileError` naming the file.
    """
    from probe.reader.sqlite_read import how_to_open, private_copy

    p = Path(path)
    st = regular_file(p, "database")
    header = _check_sqlite_header(p, st.st_size)
    how, side = how_to_open(p, header[18] == 2 and header[19] == 2)
    try:
        conn = private_copy(p, side) if how == "copy" else sqlite3.connect(sqlite_uri(p), uri=True)
    except OSError as exc:
        raise ProfileError(
            p, f"reading it needs a private copy, which failed ({exc.strerror or exc})"
        ) from None
    except sqlite3.Error as exc:
        raise ProfileError(p, f"cannot open as SQLite: {exc}") from exc
    end = time.monotonic() + deadline_s
    conn.set_progress_handler(lambda: int(time.monotonic() > end), 10_000)
    try:
        conn.execute("PRAGMA query_only = ON")
        conn.execute("PRAGMA trusted_schema = OFF")
    except SQLITE_DAMAGED as exc:
        conn.close()
        raise ProfileError(p, f"corrupt or unreadable database: {sqlite_message(exc)}") from None
    return conn
