"""Step speed within and across repetitions, from a recording: does a host-bound engine run
at one speed, or switch between several?

    python benchmarks/gpu/regimes.py RECORDING.probe.db [--results RESULTS.json] [--window 32]
        [--json OUT]

The repetitions are the ``windows`` (boottime) of the results' overhead experiment's
attached mode when given, else the recording's steps split where more than 0.2 s passes
between two steps (one ``llm.generate`` each). Per repetition: the number of steps, the
median step wall time, and the medians of consecutive ``--window`` steps (prefill steps,
those over 4x the repetition's median, left out); over all repetitions, the window medians
in 0.25 ms bins. One speed shows as one narrow bin group, two as two groups apart and
repetitions whose window medians jump between them (some H200 runs: about 2.4
and 3.8 ms). With ``--results``, the engine main thread's CPU migrations per repetition
(``benchmarks._proc``) go beside each, and where the harness recorded them its CPU time as a
share of the repetition's wall time, its run-queue wait and the steal time of its CPUs (a
thread that runs all the time while its steps slow down, with no steal, points below what
the guest can see).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
from pathlib import Path
from typing import Any

GAP_NS = 200_000_000


def steps(db: Path) -> list[tuple[int, int]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [(int(a), int(b)) for a, b in con.execute(
            "SELECT t0_ns, t1_ns FROM steps WHERE t0_ns > 0 AND t1_ns >= t0_ns ORDER BY t0_ns"
        )]  # fmt: skip
    finally:
        con.close()


def split(rows: list[tuple[int, int]], windows: list[list[int]] | None) -> list[list[int]]:
    """Step wall times (ns) per repetition."""
    if windows:
        return [[b - a for a, b in rows if w[0] <= a <= w[1]] for w in windows if w]
    reps: list[list[int]] = []
    last = None
    for a, b in rows:
        if last is None or a - last > GAP_NS:
            reps.append([])
        reps[-1].append(b - a)
        last = b
    return reps


def analyse(reps: list[list[int]], window: int = 32) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    bins: dict[float, int] = {}
    for i, d in enumerate(reps):
        if len(d) < window:
            continue
        med = statistics.median(d)
        d = [x for x in d if x <= 4 * med]  # prefill and other outliers
        wins = [
            statistics.median(d[j : j + window]) / 1e3
            for j in range(0, len(d) - window + 1, window)
        ]
        for w in wins:
            b = round(w / 250) * 0.25
            bins[b] = bins.get(b, 0) + 1
        out.append({
            "rep": i, "steps": len(d), "median_us": round(med / 1e3, 1),
            "window_medians_us": [round(w) for w in wins],
            "spread": round(max(wins) / min(wins), 3) if wins else None,
        })  # fmt: skip
    return {"window": window, "reps": out, "window_median_bins_ms": dict(sorted(bins.items()))}


def _times(t: dict[str, float | None]) -> str:
    """`` cpu 0.97 of wall, runq 0.010 s, steal 0.000 s`` from a repetition's main-thread
    times (older results have none)."""
    wall, cpu = t.get("wall_s"), t.get("cpu_s")
    if not wall or cpu is None:
        return ""
    return f"  cpu {cpu / wall:.2f} of wall, runq {t.get('runq_s') or 0:.3f} s, " + (
        f"steal {t['steal_s']:.3f} s" if t.get("steal_s") is not None else "steal -"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recording", type=Path)
    ap.add_argument("--results", type=Path, help="the run's results.json (overhead experiment)")
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    windows = migrations = times = None
    if a.results:
        for e in json.loads(a.results.read_text()).get("experiments", []):
            att = ((e.get("result") or {}).get("modes") or {}).get("attached")
            if att:
                windows, migrations = att.get("windows"), att.get("main_thread_migrations")
                times = att.get("main_thread_times")
    res = analyse(split(steps(a.recording), windows), a.window)
    for r in res["reps"]:
        mig = (
            f"  migrations {migrations[r['rep']]}"
            if migrations and r["rep"] < len(migrations)
            else ""
        )
        if times and r["rep"] < len(times):
            mig += _times(times[r["rep"]])
            r["main_thread"] = times[r["rep"]]
        print(f"rep {r['rep']:2d}: {r['steps']} steps, median {r['median_us']:.0f} us, "
              f"per {a.window}: {r['window_medians_us']} (max/min {r['spread']}){mig}")  # fmt: skip
    print(
        "window medians, 0.25 ms bins:",
        {f"{k:.2f}": v for k, v in res["window_median_bins_ms"].items()},
    )
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
