"""Bytes per step of a recording under layouts that keep every value (docs/recording-schema.md).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/recording_size.py REC.probe.db [--json]

Each layout is the same rows copied into a fresh database (``INSERT ... SELECT``, then
``VACUUM``); its size over the number of steps is the figure:

- ``as written``: the recording's own schema (page size 4096), vacuumed;
- ``page_size=N``: the same schema with another page size;
- ``no step indexes``: without ``spans_step`` and ``builds_step`` (the reader's
  ``ORDER BY pid, step, rowid`` then sorts those two tables as it does the others);
- ``integer enums``: every enum column (mode, reason, phase, kind, tag, runner and the
  draft ones) an INTEGER code instead of its lower-case name;
- ``without rowid``: ``steps`` and every detail table clustered on its key (the detail
  tables get a ``seq`` column, the row's place within its step, as their key's last part);
- ``all three``: integer enums, WITHOUT ROWID, no separate indexes.
"""

from __future__ import annotations

import argparse
import enum
import json
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from probe.reader.recording_schema import DDL, DETAIL_TABLES
from probe.step import STEP_COLUMNS

DETAIL = [t.name for t in DETAIL_TABLES]


def _enum_columns() -> dict[str, dict[str, list[str]]]:
    """table -> column -> the names its values take (their index is the code)."""
    out: dict[str, dict[str, list[str]]] = {"steps": {}}
    for c in STEP_COLUMNS:
        if isinstance(c.kind, type) and issubclass(c.kind, enum.Enum):
            out["steps"][c.name] = [m.lower() for m in c.kind.__members__]
        elif c.choices:
            out["steps"][c.name] = list(c.choices)
    for t in DETAIL_TABLES:
        out[t.name] = {
            c.name: [m.lower() for m in c.kind.__members__]
            for c in t.columns
            if isinstance(c.kind, type) and issubclass(c.kind, enum.Enum)
        }
    return out


def _ddl(int_enums: bool, without_rowid: bool, indexes: bool) -> str:
    enums = _enum_columns()
    ddl = DDL
    if not indexes:
        ddl = "\n".join(x for x in ddl.splitlines() if not x.startswith("CREATE INDEX"))
    if int_enums:
        for table, cols in enums.items():
            for col in cols:
                ddl = _retype(ddl, table, col)
    if without_rowid:
        ddl = ddl.replace("PRIMARY KEY (pid, step));", "PRIMARY KEY (pid, step)) WITHOUT ROWID;")
        for t in DETAIL:
            head = f"CREATE TABLE IF NOT EXISTS {t} (pid INTEGER, step INTEGER, "
            line = next(x for x in ddl.splitlines() if x.startswith(head))
            new = line.replace(head, head + "seq INTEGER, ").replace(
                ");", ", PRIMARY KEY (pid, step, seq)) WITHOUT ROWID;"
            )
            ddl = ddl.replace(line, new)
    return ddl


def _retype(ddl: str, table: str, col: str) -> str:
    start = ddl.index(f"CREATE TABLE IF NOT EXISTS {table} (")
    end = ddl.index(";", start)
    body = ddl[start:end].replace(f"{col} TEXT", f"{col} INTEGER")
    return ddl[:start] + body + ddl[end:]


def _copy(src: Path, dst: Path, page: int, int_enums: bool, wr: bool, idx: bool) -> int:
    dst.unlink(missing_ok=True)
    db = sqlite3.connect(dst, isolation_level=None)
    db.execute(f"PRAGMA page_size={page}")
    db.executescript(_ddl(int_enums, wr, idx))
    db.execute("ATTACH ? AS s", (f"file:{src}?mode=ro",))
    enums = _enum_columns()
    db.execute("BEGIN")
    for table in ["meta", "processes", "steps", *DETAIL, "faults", "outside", "anomalies", "gpu"]:
        cols = [r[1] for r in db.execute(f"PRAGMA s.table_info({table})")]
        sel = []
        for c in cols:
            names = enums.get(table, {}).get(c) if int_enums else None
            if names:
                cases = " ".join(f"WHEN '{n}' THEN {i}" for i, n in enumerate(names))
                sel.append(f"CASE {c} {cases} END")
            else:
                sel.append(c)
        if wr and table in DETAIL:
            seq = "row_number() OVER (PARTITION BY pid, step ORDER BY rowid)"
            db.execute(
                f"INSERT INTO {table} (pid, step, seq, {', '.join(cols[2:])}) "
                f"SELECT pid, step, {seq}, {', '.join(sel[2:])} FROM s.{table}"
            )
        else:
            db.execute(
                f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(sel)} FROM s.{table}"
            )
    db.execute("COMMIT")
    db.execute("DETACH s")
    db.execute("VACUUM")
    db.close()
    return dst.stat().st_size


LAYOUTS: dict[str, tuple[int, bool, bool, bool]] = {
    "as written": (4096, False, False, True),
    "page_size=1024": (1024, False, False, True),
    "page_size=16384": (16384, False, False, True),
    "page_size=65536": (65536, False, False, True),
    "no step indexes": (4096, False, False, False),
    "integer enums": (4096, True, False, True),
    "without rowid": (4096, False, True, False),
    "all three": (4096, True, True, False),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("recording", type=Path)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with sqlite3.connect(f"file:{a.recording}?mode=ro", uri=True) as db:
        steps = db.execute("SELECT count(*) FROM steps").fetchone()[0]
        rows = sum(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in DETAIL)
    out: dict[str, Any] = {
        "recording": str(a.recording),
        "steps": steps,
        "detail_rows_per_step": round(rows / steps, 2),
        "file_bytes_per_step": round(a.recording.stat().st_size / steps, 1),
        "layouts": {},
    }
    with tempfile.TemporaryDirectory() as d:
        for name, (page, ie, wr, idx) in LAYOUTS.items():
            size = _copy(a.recording, Path(d) / "x.db", page, ie, wr, idx)
            out["layouts"][name] = round(size / steps, 1)
            if not a.json:
                print(f"{name:<18} {size / steps:8.1f} bytes/step", flush=True)
    if a.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
