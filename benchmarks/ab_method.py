"""The error of ``probe ab``'s method (:mod:`probe.analysis.ab`), measured on the committed
recordings and on the synthetic varied-length workload of the tests.

    PYTHONPATH=$PWD python benchmarks/ab_method.py --out benchmarks/results/ab-method/results.json

1. The committed H200 pair (``tests/data/stock_mrv2_k1.probe``, stock, against
   ``probe/data/default.probe``, the UNIFORM_SINGLE_TOKEN_DECODE override) holds five
   repetitions of one workload per arm (a 64-request prefill, then 255 decode steps).
   Each repetition is taken as a run of its own: every pair of repetitions of one arm is
   two runs of one setting (no difference to find), every stock repetition against every
   override repetition is a one-run-per-arm A/B whose answer the whole pair gives (B/A
   0.650; the GPU harness measured 0.652). The spread of the repetitions' mean figures is
   where :data:`probe.analysis.ab.RUN_SPREAD` comes from.
2. The other committed recordings, first half against second half: whether the shape
   mixes pair (a served load's mix drifts; a fixed workload's does not).
3. ``tests/ab_workload.py``'s workload over many draws, one run per arm: two runs of one
   setting, and a 20% host-time difference; paired, and through the whole runs with their
   ten runs of consecutive steps (the method before the pairing, still the fallback).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from probe.analysis import ab  # noqa: E402
from probe.reader.recording import Recording  # noqa: E402

STOCK = REPO / "tests/data/stock_mrv2_k1.probe"
USTD = REPO / "probe/data/default.probe"
OTHERS = [
    REPO / "tests/data/chunked_mrv2_k1.probe",
    REPO / "tests/data/serve-tp2.probe",
    REPO / "tests/data/groundtruth-window.probe",
]


def _bare(steps: ab.RunSteps) -> ab.Run:
    """A part of a recording as a run: its steps, and its own figures over them."""
    v = steps.values
    fig: dict[str, float | None] = {
        "steady_tokens_per_s": float(steps.tokens.sum() / v["period_ns"].sum() * 1e9),
        "steady_host_ns": float(np.nanmean(v["host_ns"])),
    }
    return ab.Run("part", len(steps.step), len(steps.step), fig, Counter(), {}, steps)


def repetitions(path: Path) -> list[ab.RunSteps]:
    """A recording's workload repetitions: from each prefill (a batch that is not a
    uniform decode) to the next, those of 100 steps or more."""
    r = ab.run_steps(Recording.open(path))
    starts = [*np.flatnonzero(((r.shape >> 56) & 1) == 0).tolist(), len(r.shape)]
    return [r.take(np.arange(a, b)) for a, b in itertools.pairwise(starts) if b - a >= 100]


def _tp(cmp: dict[str, Any]) -> dict[str, Any]:
    m = cmp["metrics"]["steady_tokens_per_s"]
    return {
        "ratio": round(m["ratio_B_over_A"], 4),
        "low": round(m["low"], 4),
        "high": round(m["high"], 4),
        "verdict": cmp["verdict"].split(":")[0],
    }


def committed() -> dict[str, Any]:
    reps = {"stock": repetitions(STOCK), "ustd": repetitions(USTD)}
    out: dict[str, Any] = {"repetitions": {k: len(v) for k, v in reps.items()}}
    spread = {}
    for arm, parts in reps.items():
        for v in ("period_ns", "host_ns"):
            means = [float(p.values[v].mean()) for p in parts]
            spread[f"{arm} {v}"] = round(statistics.stdev(map(math.log, means)), 4)
    out["spread_between_repetitions_sd_log"] = spread
    same = []
    for arm, parts in reps.items():
        for i, j in itertools.combinations(range(len(parts)), 2):
            same.append(
                {"arm": arm, "pair": [i, j]} | _tp(ab.compare([_bare(parts[i])], [_bare(parts[j])]))
            )
    out["same_setting"] = {
        "pairs": len(same),
        "verdicts": dict(Counter(x["verdict"] for x in same)),
        "runs": same,
    }
    whole = ab.compare([ab.read_run(Recording.open(STOCK))], [ab.read_run(Recording.open(USTD))])
    truth = whole["metrics"]["steady_tokens_per_s"]["ratio_B_over_A"]
    cross = []
    for i, j in itertools.product(range(len(reps["stock"])), range(len(reps["ustd"]))):
        c = ab.compare([_bare(reps["stock"][i])], [_bare(reps["ustd"][j])])
        cross.append({"pair": [i, j]} | _tp(c))
    out["stock_vs_ustd"] = {
        "whole_pair": _tp(whole),
        "whole_pair_old_method": _tp(
            ab.compare(
                [ab.read_run(Recording.open(STOCK))],
                [ab.read_run(Recording.open(USTD))],
                tolerance=-1,
            )
        ),
        "pairs": len(cross),
        "verdicts": dict(Counter(x["verdict"] for x in cross)),
        "ratio_range": [min(x["ratio"] for x in cross), max(x["ratio"] for x in cross)],
        "sd_log_ratio": round(statistics.stdev(math.log(x["ratio"]) for x in cross), 4),
        "intervals_covering_whole_pair": sum(x["low"] <= truth <= x["high"] for x in cross),
        "runs": cross,
    }
    halves = {}
    for p in [STOCK, USTD, *OTHERS]:
        r = ab.run_steps(Recording.open(p))
        first = r.step <= np.median(r.step)  # by step number: the ranks of a step together
        c = ab.compare([_bare(r.take(first))], [_bare(r.take(~first))])
        halves[p.name] = {
            "mix_difference": round(c["pairing"]["mix_difference"], 4),
            "matched": c["pairing"]["matched"],
        } | _tp(c)
    out["first_half_vs_second"] = halves
    return out


def synthetic(n: int) -> dict[str, Any]:
    import ab_workload as W

    from probe.analysis.steady import summarize_steps
    from probe.analysis.summary import columns_of_steps

    def run(steps: list[Any]) -> ab.Run:
        return ab.run_of(
            summarize_steps(steps), ab.steps_of_columns([columns_of_steps(steps)]), "synthetic"
        )

    out: dict[str, Any] = {"workloads": n}
    for reps in (1, 2):
        tally: Counter[str] = Counter()
        logs: dict[str, list[float]] = {"same": [], "slower": []}
        for i in range(n):
            batches = W.shapes(seed=10_000 + i, reps=reps)
            a = run(W.steps(batches, seed=20_000 + i))
            same = run(W.steps(batches, seed=30_000 + i))
            slower = run(W.steps(batches, seed=40_000 + i, scale=1.2))
            for name, b in (("same", same), ("slower", slower)):
                for method, tol in (("paired", ab.MIX_TOLERANCE), ("old", -1.0)):
                    c = ab.compare([a], [b], tolerance=tol)
                    v = c["verdict"]
                    tally[f"{name} {method} " + v.split(":")[0]] += 1
                    if method == "paired":
                        logs[name].append(
                            math.log(c["metrics"]["steady_tokens_per_s"]["ratio_B_over_A"])
                        )
        out[f"{reps} repetition(s) per recording"] = {
            "verdicts": dict(sorted(tally.items())),
            "sd_log_ratio_same": round(statistics.stdev(logs["same"]), 4),
            "mean_ratio_slower": round(math.exp(statistics.fmean(logs["slower"])), 4),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--workloads", type=int, default=100)
    args = p.parse_args()
    res = {"committed": committed(), "synthetic": synthetic(args.workloads)}
    text = json.dumps(res, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    summary = {
        k: v for k, v in res["committed"].items() if k not in ("same_setting", "stock_vs_ustd")
    }
    print(json.dumps(summary, indent=1))
    for k in ("same_setting", "stock_vs_ustd"):
        print(k, json.dumps({x: y for x, y in res["committed"][k].items() if x != "runs"}))
    print(json.dumps(res["synthetic"], indent=1))


if __name__ == "__main__":
    main()
