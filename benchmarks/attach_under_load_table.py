"""The table of docs/reliability.md from ``attach_under_load.py`` results.

    python benchmarks/attach_under_load_table.py RESULT.json [RESULT.json ...]

One row per setting (the attach's session, ``--session-nice``, nice and autogroup nice, the
tree) and duration: the walls in run order, how many within D + 2 s, the medians of the
wall, the start and the finish, the start and finish ranges, the server's completions per
second while attached, the hooks' lateness at the deadline, the recorded spans and the
engine's CPU launch overhead meanwhile (its median and 99th percentile per run, where
recorded).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from probe.analysis.views import percentile


def setting(run: dict[str, Any]) -> str:
    pl = run.get("placement", {})
    sn = run.get("session_nice")
    parts = [
        f"session {pl.get('session', '?')}",
        f"--session-nice {sn}" if sn is not None else "no flag",
        f"group nice {pl.get('autogroup_nice')}",
        f"nice {pl.get('nice')}",
    ]
    if run.get("group_nice_before_start") is not None:  # written by a shell before the start
        parts.append(f"group nice {run['group_nice_before_start']} before the start")
    if run.get("tree"):
        parts.append(f"tree {run['tree']}")
    if run.get("probe"):
        parts.append(f"probe {run['probe']}")
    if run.get("rt"):
        parts.append(f"SCHED_{run['rt'].upper()} 1")
    return ", ".join(parts)


def span(values: list[float], digits: int = 2) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}" if values else "-"


def medians(runs: list[dict[str, Any]]) -> str:
    """The median wall, start and finish of ``runs`` (seconds), ``-`` without runs."""
    if not runs:
        return "-"
    keys = ("wall_s", "startup_s", "finish_s")
    return " / ".join(f"{percentile([r[k] for r in runs], 50):.2f}" for k in keys)


def table(runs: list[dict[str, Any]]) -> list[str]:
    rows: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        rows[(setting(r), float(r["duration_s"]))].append(r)
    out = [
        "| setting (as measured) | D | walls s | ≤ D + 2 | median wall / start / finish s | "
        "start s | finish s | req/s | hooks off late ms | span s | engine launch p50 / p99 µs |",
        "|---|---:|---|---:|---|---|---|---|---|---|---|",
    ]
    for (name, d), rs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ok = [r for r in rs if r.get("rc") == 0 and "startup_s" in r]
        walls = " / ".join(f"{r['wall_s']:.2f}" for r in rs)
        within = sum(1 for r in ok if r["wall_s"] <= d + 2)
        late = [v * 1000 for r in ok for v in r.get("hooks_off_late_s", {}).values()]
        out.append(
            f"| {name} | {d:g} | {walls} | {within} of {len(rs)} | {medians(ok)} | "
            f"{span([r['startup_s'] for r in ok])} | {span([r['finish_s'] for r in ok])} | "
            f"{span([r['requests_per_s_attached'] for r in ok], 1)} | "
            f"{span(late, 0)} | {span([r['recorded_span_s'] for r in ok])} | "
            f"{span([r['launch_p50_us'] for r in ok if 'launch_p50_us' in r], 0)} / "
            f"{span([r['launch_p99_us'] for r in ok if 'launch_p99_us' in r], 0)} |"
        )
    return out


def main() -> None:
    runs: list[dict[str, Any]] = []
    for p in sys.argv[1:]:
        runs += json.loads(Path(p).read_text())["runs"]
    print("\n".join(table(runs)))


if __name__ == "__main__":
    main()
