"""Where ``probe report --json`` spends its CPU on one recording: each stage's CPU seconds
inside one run (the functions timed in place, so the run is the command's own).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/report_stages.py RECORDING

Stages: the open (``PRAGMA quick_check`` apart from the schema and pid checks), the detail
tables' value checks, the ``steps`` columns read and checked for the summary and for the
ranks, the summary's numpy accumulation, the SQL aggregates and small reads
(``Recording._rows``), the ranks section whole. The total is the process's CPU from the
open to the JSON text.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from probe.analysis import ranks_columns as rk
from probe.analysis import summary_read as sr
from probe.reader import recording as rc
from probe.reader import recording_columns as cols

T: dict[str, float] = {}


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*a: Any, **k: Any) -> Any:
        c = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            T[name] = T.get(name, 0.0) + time.process_time() - c

    return run


class _QuickCheckTimed:
    """A connection whose ``PRAGMA quick_check`` is timed apart."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def execute(self, sql: str, *a: Any) -> Any:
        if sql != "PRAGMA quick_check":
            return self._db.execute(sql, *a)
        c = time.process_time()
        rows = self._db.execute(sql, *a).fetchall()
        T["open: PRAGMA quick_check"] = time.process_time() - c
        return _Rows(rows)


class _Rows:
    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def fetchone(self) -> Any:
        return self.rows[0]


_VALIDATE = rc.Recording._validate
_ITER = cols.iter_step_columns


def _validate(p: Any, db: Any) -> None:
    _VALIDATE(p, _QuickCheckTimed(db))


def _columns(*a: Any, **k: Any) -> Iterator[dict[str, Any]]:
    name = "ranks: step columns read and checked" if k.get("only") else (
        "summary: step columns read and checked")  # fmt: skip
    it = _ITER(*a, **k)
    while True:
        c = time.process_time()
        try:
            chunk = next(it)
        except StopIteration:
            return
        finally:
            T[name] = T.get(name, 0.0) + time.process_time() - c
        yield chunk


def main() -> None:
    rc.Recording._validate = staticmethod(timed("open: whole", _validate))  # type: ignore[method-assign]
    cols.check_detail_tables = timed(
        "summary: detail tables' value checks", cols.check_detail_tables
    )
    cols.iter_step_columns = _columns
    sr.Summary.add_columns = timed("summary: numpy accumulation", sr.Summary.add_columns)  # type: ignore[method-assign]
    rc.Recording._rows = timed("SQL aggregates and small reads", rc.Recording._rows)  # type: ignore[method-assign]
    import probe.cli.render_report as rr

    rr.ranks_of_recording = rk.ranks_of_recording = timed("ranks: whole", rk.ranks_of_recording)
    c0 = time.process_time()
    rec = rc.Recording.open(sys.argv[1])
    json.dumps(rr.build_report(rec), indent=2, default=str)
    total = time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{sys.argv[1]}: total {total:.1f} CPU s, peak {peak} MB, load {load}")
    for k, v in sorted(T.items()):
        print(f"  {v:7.1f} s  {k}")


if __name__ == "__main__":
    main()
