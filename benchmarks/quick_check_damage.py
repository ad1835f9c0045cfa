"""What ``PRAGMA quick_check`` finds that the reads do not: random damage to one page of a
recording, then ``probe report`` (``build_report``) with the check and without it.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/quick_check_damage.py \\
        tests/data/chunked_mrv2_k1.probe --trials 300 --seed 2

Each trial overwrites 1, 4 or 16 random bytes of one random page (never page 1: the header
and the schema) of a copy of the recording, and reads it twice: as the probe does, and with
``quick_check`` answered "ok" without running. A read ends ``error`` (a
:class:`RecordingError`: the one line the CLI prints), ``crash`` (any other exception: a
traceback), or its report is the undamaged one's (``same``) or not (``different``). A pair
"error / different" or "error / crash" is damage only ``quick_check`` caught; "ok /
different" is damage that leaves every value in its column's range (a changed number),
which no structural check can see.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from probe.cli.render_report import build_report
from probe.reader.recording import Recording, RecordingError

_VALIDATE = Recording._validate


class _NoQuickCheck:
    """A connection whose ``PRAGMA quick_check`` answers "ok" without running."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        return self._db.execute("SELECT 'ok'" if sql == "PRAGMA quick_check" else sql, *args)


def _skipping(p: Path, db: sqlite3.Connection) -> None:
    _VALIDATE(p, _NoQuickCheck(db))  # type: ignore[arg-type]


def read(p: Path, check: bool) -> tuple[str, str]:
    Recording._validate = staticmethod(_VALIDATE if check else _skipping)  # type: ignore[method-assign]
    try:
        rec = Recording.open(p)
        try:
            return "ok", json.dumps(build_report(rec), default=str, sort_keys=True)
        finally:
            rec.close()
    except RecordingError as exc:
        return "error", str(exc)
    except Exception as exc:  # what the experiment counts: a traceback in the CLI
        return "crash", f"{type(exc).__name__}: {exc}"
    finally:
        Recording._validate = staticmethod(_VALIDATE)  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("recording", type=Path)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--seed", type=int, default=2)
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    good = read(a.recording, True)[1]
    blob = a.recording.read_bytes()
    page = int.from_bytes(blob[16:18], "big")
    page = 65536 if page == 1 else page
    pages = len(blob) // page
    tally: Counter[tuple[str, str]] = Counter()
    crashes = []
    d = Path(tempfile.mkdtemp(prefix="probe-qc-"))
    try:
        for i in range(a.trials):
            b = bytearray(blob)
            at = rnd.randrange(1, pages) * page
            for _ in range(rnd.choice([1, 4, 16])):
                b[at + rnd.randrange(page)] = rnd.randrange(256)
            p = d / f"t{i}.probe.db"
            p.write_bytes(bytes(b))
            with_check = read(p, True)[0]
            kind, out = read(p, False)
            without = kind if kind != "ok" else ("same" if out == good else "different")
            tally[(with_check, without)] += 1
            if kind == "crash":
                crashes.append(out[:120])
            p.unlink()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(f"{a.recording.name}: {pages} pages of {page} B, {a.trials} trials, seed {a.seed}")
    print("with quick_check / without: trials")
    for (w, wo), n in sorted(tally.items()):
        print(f"  {w} / {wo}: {n}")
    for c in crashes:
        print(f"  crash without it: {c}")


if __name__ == "__main__":
    main()
