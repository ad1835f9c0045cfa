"""What names a recording: the columnar recording's manifest, and which format a path is
or a new name asks for. Imports nothing of the probe: the commands check their target
before they enable the probe, and a reader's import is a cost the engine's first steps
pay."""

from __future__ import annotations

from pathlib import Path

#: the manifest's file name inside a columnar recording's folder
MANIFEST = "recording.json"


def is_columnar(path: str | Path) -> bool:
    """``path`` is a columnar recording's folder (it holds a manifest)."""
    try:
        return (Path(path) / MANIFEST).is_file()
    except (OSError, ValueError):
        return False


def is_sqlite_name(path: str | Path) -> bool:
    """A recording named ``*.db`` is written as SQLite (the earlier format, for tools that
    read SQLite); any other name is a columnar recording folder."""
    return str(path).endswith(".db")
