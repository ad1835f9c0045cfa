"""The committed recordings as the tests need them.

The committed recordings (probe/data/default.probe, tests/data/*.probe) are columnar folders.
Tests of SQLite behaviour (damaged bytes, WAL, edits with sqlite3, the schema) read them as
SQLite: :func:`sqlite_of` converts one once and keeps the result in a per-user cache, named by
the hash of what it was made from, so every test process (parallel ones too) shares it.
:func:`copy_recording` copies either format to where a test may change it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import probe.reader.columnar_convert
import probe.reader.columnar_read
import probe.reader.recording

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"

#: the code that writes a SQLite recording from a columnar one: part of the cache key, so a
#: changed converter or writer makes a new file rather than reusing a stale one
_WRITERS = (
    probe.reader.columnar_convert.__file__,
    probe.reader.columnar_read.__file__,
    probe.reader.recording.__file__,
)


def committed() -> list[str]:
    """The committed recordings, as paths from the repository's root, sorted: each columnar
    folder (the one holding a committed ``recording.json``) and any SQLite ``*.probe.db``."""
    files = subprocess.run(
        ["git", "ls-files", "*.probe/recording.json", "*.probe.db"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return sorted(str(Path(f).parent) if f.endswith("recording.json") else f for f in files)


def _key(src: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    for w in _WRITERS:
        h.update(Path(str(w)).read_bytes())
    return h.hexdigest()[:24]


def _cache() -> Path:
    d = Path(tempfile.gettempdir()) / f"vllm-graph-probe-tests-{os.getuid()}" / "sqlite"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def sqlite_of(src: str | Path) -> Path:
    """The recording ``src`` as a SQLite file (``*.probe.db``): ``src`` itself when it is one,
    else its conversion, made once and cached. Every test shares the cached file: a test that
    changes a recording changes a copy (:func:`copy_recording`)."""
    from probe.reader.columnar_convert import convert

    src = Path(src)
    if not src.is_dir():
        return src
    out = _cache() / f"{src.name.removesuffix('.probe')}-{_key(src)}.probe.db"
    if out.exists():
        return out
    fd, name = tempfile.mkstemp(prefix=f".{out.stem}-", suffix=".db", dir=out.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        convert(src, tmp, to_sqlite=True)
        for side in ("-wal", "-shm", "-journal"):
            assert not Path(f"{tmp}{side}").exists(), f"the converted {tmp} left {side} beside it"
        tmp.chmod(0o644)  # mkstemp's 0o600, as a file written by the probe
        os.replace(tmp, out)  # atomic: a parallel run sees no file or the whole file
    finally:
        tmp.unlink(missing_ok=True)
    return out


def raw_rows(src: str | Path) -> sqlite3.Connection:
    """A read-only sqlite3 connection to the recording ``src`` as SQLite (:func:`sqlite_of`):
    its raw rows, for figures computed with SQL beside the probe's own."""
    con = sqlite3.connect(f"{sqlite_of(src).absolute().as_uri()}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row  # as the codec's own connection: by index or by name
    return con


def copy_recording(src: str | Path, dst: str | Path) -> Path:
    """Copy the recording ``src`` (a SQLite file or a columnar folder) to ``dst``; ``dst``."""
    src, dst = Path(src), Path(dst)
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=shutil.copyfile)
    else:
        shutil.copyfile(src, dst)
    return dst


def rows_of_no_step(db: sqlite3.Connection, table: str) -> int:
    """How many rows of the detail ``table`` of an SQLite recording have no step in
    ``steps`` (a test that removes steps checks it left some)."""
    (n,) = db.execute(
        f"SELECT count(*) FROM {table} AS d WHERE NOT EXISTS "
        "(SELECT 1 FROM steps AS s WHERE s.pid = d.pid AND s.step = d.step)"
    ).fetchone()
    return int(n)
