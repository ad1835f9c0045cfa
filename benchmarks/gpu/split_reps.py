"""Cut a harness recording into one recording per repetition.

The harness keeps one engine (and one ``probe collect`` reader) for all the repetitions of
an arm, and records each repetition's window on CLOCK_BOOTTIME (``windows`` in an ``ab``
result). ``probe ab`` compares recordings, so a comparison of one repetition per arm needs
each repetition as a recording of its own: this copies the recording once per window and
keeps the steps whose start lies inside it, with every detail row of those steps (any
table with ``pid`` and ``step`` columns). The process rows, the static snapshot, the
calibration and the session's metadata are kept whole.

    python benchmarks/gpu/split_reps.py RECORDING.probe.db --windows '[[b0, b1], ...]' \\
        --out-prefix DIR/stock-rep

writes ``DIR/stock-rep0.probe.db``, ``DIR/stock-rep1.probe.db``, ... and prints their
step counts. Works on SQLite recordings (the format the harness's reader writes).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path


def step_tables(con: sqlite3.Connection) -> list[str]:
    """The tables holding rows of one step each (a ``pid`` and a ``step`` column)."""
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    out = []
    for name in names:
        cols = {r[1] for r in con.execute(f'PRAGMA table_info("{name}")')}
        if {"pid", "step"} <= cols:
            out.append(name)
    return out


def split(recording: Path, windows: list[tuple[int, int]], prefix: str) -> list[tuple[Path, int]]:
    """One recording per window: ``{prefix}{i}.probe.db`` with the steps that start in
    window ``i`` (and their detail rows). Returns each file with its step count."""
    src = sqlite3.connect(f"file:{recording}?mode=ro", uri=True)
    made = []
    try:
        for i, (b0, b1) in enumerate(windows):
            out = Path(f"{prefix}{i}.probe.db")
            out.unlink(missing_ok=True)
            dst = sqlite3.connect(out)
            src.backup(dst)
            dst.execute(
                "CREATE TEMP TABLE keep AS SELECT pid, step FROM steps WHERE t0_ns BETWEEN ? AND ?",
                (int(b0), int(b1)),
            )
            for table in step_tables(dst):
                dst.execute(
                    f'DELETE FROM "{table}" WHERE (pid, step) NOT IN (SELECT pid, step FROM keep)'
                )
            (n,) = dst.execute("SELECT count(*) FROM steps").fetchone()
            dst.commit()
            dst.execute("VACUUM")
            dst.close()
            made.append((out, int(n)))
    finally:
        src.close()
    return made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording", type=Path)
    ap.add_argument("--windows", required=True, help="JSON list of [b0, b1] BOOTTIME ns pairs")
    ap.add_argument("--out-prefix", required=True, help="each output is PREFIX<i>.probe.db")
    args = ap.parse_args()
    windows = [(int(a), int(b)) for a, b in json.loads(args.windows)]
    for path, n in split(args.recording, windows, args.out_prefix):
        print(f"{path}: {n} steps")


if __name__ == "__main__":
    main()
