"""What SQLite raises on a damaged file, for recordings and rocpd databases alike."""

from __future__ import annotations

import sqlite3

# What SQLite raises on a damaged file. Its message names the damaged object as the file
# spells it; where those bytes are not UTF-8, Python's sqlite3 raises UnicodeDecodeError in
# place of the DatabaseError it was building (seen from a fuzzed schema page).
SQLITE_DAMAGED = (sqlite3.DatabaseError, UnicodeDecodeError)


def sqlite_message(exc: BaseException) -> str:
    """SQLite's message of a :data:`SQLITE_DAMAGED` exception on one line, as far as it
    reads (recordings and rocpd databases alike)."""
    if isinstance(exc, UnicodeDecodeError):
        raw = exc.object if isinstance(exc.object, bytes) else b""
        return f"text that is not UTF-8: {raw.decode('utf-8', 'replace')}"
    return " ".join(str(exc).split())  # SQLite's messages can span lines
