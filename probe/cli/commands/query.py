"""``probe query``: SQL (DuckDB, embedded) over a recording set as one dataset.

probe query "SELECT host, mode, count(*) FROM steps GROUP BY ALL" fleet/
probe query "SELECT * FROM reasons ORDER BY steps DESC" 'fleet/host=web-*' --csv
probe query --explain-views

Views: every table of the recordings (steps, spans, dispatches, replays, builds, reorders,
processes) with host, day and recording columns, and the convenience views reasons,
ranks and recordings (:mod:`probe.reader.dataset`; docs/fleet.md).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import decimal
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from probe.cli.commands import console, width
from probe.errors import RuntimeFailure, UsageError

#: rows the table output shows at most (--csv and --json write every row)
TABLE_ROWS = 1000


def cmd_query(args: argparse.Namespace) -> int:
    import duckdb

    from probe.reader.dataset import open_dataset
    from probe.reader.recording import RecordingError, default_recording
    from probe.reader.recording_open import first_line

    names = list(args.recording)
    if args.explain_views:
        names = [args.sql, *names] if args.sql is not None else names
    elif args.sql is None or not args.sql.strip():
        raise UsageError("query: give the SQL to run (probe query --explain-views: the views)")
    try:
        with open_dataset(names or [default_recording()]) as ds:
            if args.explain_views:
                _explain(ds.describe(), args)
                return 0
            try:
                result = ds.connection.execute(args.sql)
                cols = [str(d[0]) for d in result.description or []]
                rows = result.fetchall() if cols else []
            except (duckdb.IOException, duckdb.OutOfMemoryException) as exc:
                raise RuntimeFailure(f"query: {first_line(exc)}") from None
            except duckdb.Error as exc:
                raise UsageError(f"query: {first_line(exc)}") from None
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    if not cols:
        return 0
    if args.json:
        _json(cols, rows)
    elif args.csv:
        _csv(cols, rows)
    else:
        _table(cols, rows, args)
    return 0


def plain(v: Any) -> Any:
    """A DuckDB value as JSON holds it: a date ISO, a decimal a number, a non-finite
    number null, a list or struct element by element."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    return str(v)


def _json(cols: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> None:
    out = [dict(zip(cols, (plain(v) for v in row), strict=True)) for row in rows]
    print(json.dumps(out, indent=2, allow_nan=False))


def _csv(cols: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> None:
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(cols)
    for row in rows:
        w.writerow(["" if v is None else _cell(plain(v)) for v in row])


def _cell(v: Any) -> str:
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def _table(cols: Sequence[str], rows: Sequence[tuple[Any, ...]], args: argparse.Namespace) -> None:
    from rich.table import Table

    t = Table(title_justify="left")
    for c in cols:
        t.add_column(c, overflow="fold")
    for row in rows[:TABLE_ROWS]:
        t.add_row(*("NULL" if v is None else _cell(plain(v)) for v in row))
    out = console(args.width)
    out.print(t)
    if len(rows) > TABLE_ROWS:
        out.print(f"{TABLE_ROWS:,} of {len(rows):,} rows shown; --csv or --json write every row")
    else:
        out.print(f"{len(rows):,} row{'s' if len(rows) != 1 else ''}")


def _explain(views: Sequence[tuple[str, str, Sequence[tuple[str, str]]]], args: Any) -> None:
    if args.json:
        print(
            json.dumps(
                [{"view": n, "holds": d, "columns": [{"name": c, "type": t} for c, t in cs]}
                 for n, d, cs in views],
                indent=2,
            )
        )  # fmt: skip
        return
    out = console(args.width)
    for name, doc, cols in views:
        out.print(f"[bold]{name}[/bold]: {doc}", highlight=False)
        out.print("  " + ", ".join(f"{c} {t}" for c, t in cols), highlight=False)


def add_parser(sub: Any) -> None:
    import textwrap

    from probe.reader.dataset import ADDED_COLUMNS, TABLE_VIEWS, VIEWS

    def item(name: str, text: str) -> str:
        return textwrap.fill(f"{name}: {text}", 88, initial_indent="  ", subsequent_indent="    ")

    description = (
        "Run SQL (DuckDB, embedded) over the recordings given (a folder such as an agent's "
        "--record-dir, a quoted glob, files; with none, the bundled recording) as one "
        "dataset. A SQLite recording is read through a temporary columnar copy, removed "
        "afterwards (`probe convert` it once to skip that). docs/fleet.md has the queries "
        "that reproduce `probe report`'s figures, in DuckDB and Spark."
    )
    epilog = "\n".join(
        [
            textwrap.fill(f"views of every table ({', '.join(TABLE_VIEWS)}), with:", 88),
            *(item(k, v) for k, v in ADDED_COLUMNS.items()),
            "convenience views:",
            *(item(v.name, v.doc) for v in VIEWS),
            "--explain-views lists every view's columns.",
        ]
    )
    q = sub.add_parser(
        "query",
        help="SQL (DuckDB) over a recording set as one dataset",
        description=textwrap.fill(description, 88),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("sql", nargs="?", help="the SQL to run (DuckDB's dialect)")
    q.add_argument(
        "recording",
        nargs="*",
        help="recording(s), a quoted glob or a folder of recordings, read as one dataset "
        "(default: the bundled one)",
    )
    form = q.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="the rows as a JSON list of objects")
    form.add_argument("--csv", action="store_true", help="the rows as CSV with a header")
    q.add_argument(
        "--explain-views",
        action="store_true",
        help="list the views and their columns (the arguments are recordings, no SQL)",
    )
    q.add_argument("--width", type=width, help="terminal width in columns (20..1000)")
    q.set_defaults(func=cmd_query)
