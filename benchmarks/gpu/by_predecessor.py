"""An overhead run's paired ratios to ``absent``, split by the mode that ran just before.

Usage: ``python benchmarks/gpu/by_predecessor.py RESULTS.json``. The order is read from
each repetition's measured window (its start time), not assumed from the plan, so a
mode's after-effects on the next one (the torch profiler's teardown, say) show as a
difference between its successors' splits.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any


def splits(results: dict[str, Any]) -> dict[str, dict[str | None, list[float]]]:
    """``mode -> predecessor -> [paired ratio to absent]`` of the first overhead experiment."""
    exp = next(e for e in results["experiments"] if e.get("kind") == "overhead")
    res = exp["result"]["modes"]
    starts = sorted((w[0], m, i) for m in res for i, w in enumerate(res[m]["windows"]))
    pred = {(m, i): (starts[k - 1][1] if k else None) for k, (_t, m, i) in enumerate(starts)}
    out: dict[str, dict[str | None, list[float]]] = {}
    for m in res:
        if m == "absent":
            continue
        for i, ratio in enumerate(res[m]["paired_ratio_to_absent"]):
            out.setdefault(m, {}).setdefault(pred[(m, i)], []).append(ratio)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: by_predecessor.py RESULTS.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        results = json.load(f)
    for mode, by in splits(results).items():
        cells = ", ".join(
            f"after {p or 'nothing'}: {statistics.median(v):.3f} (n={len(v)})"
            for p, v in by.items()
        )
        print(f"{mode}: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
