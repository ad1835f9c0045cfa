"""Summarize harness results (and, when present, their recordings) as Markdown tables.

    python benchmarks/gpu/summarize.py benchmarks/results/ab-graph-support-h200/run*-results.json \
        [--recordings DIR ...]

For each A/B: output tok/s per arm (median, min-max over interleaved repetitions), the ratio
B/A, and, from the probe's own recordings restricted to the A/B windows, what the decode
steps did: graph mode, miss reason, host time per step, CPU launch overhead, forward
launch time and GPU idle before the step (medians).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sqlite3
import statistics
from pathlib import Path
from typing import Any


def _rec_stats(db_path: Path, windows: list[list[int]]) -> dict[str, Any] | None:
    if not db_path.exists():
        return None
    db = sqlite3.connect(str(db_path))
    rows: list[tuple[Any, ...]] = []
    for b0, b1 in windows:
        rows += db.execute(
            "SELECT mode, reason, host_ns, cpu_launch_overhead_ns, forward_launch_ns, "
            "gpu_idle_before_ns, draft_ns FROM steps WHERE uniform=1 AND t0_ns BETWEEN ? AND ?",
            (b0, b1),
        ).fetchall()
    if not rows:
        return None
    med = lambda i: statistics.median(r[i] for r in rows if r[i] is not None)  # noqa: E731
    modes: dict[str, int] = {}
    for r in rows:
        modes[f"{r[0]}/{r[1]}"] = modes.get(f"{r[0]}/{r[1]}", 0) + 1
    return {
        "decode_steps": len(rows),
        "modes": modes,
        "host_us": med(2) / 1e3,
        "launch_us": med(3) / 1e3,
        "forward_us": med(4) / 1e3,
        "idle_us": med(5) / 1e3,
        "draft_us": med(6) / 1e3,
    }


def median_ci(xs: list[float], n_boot: int = 10_000, seed: int = 0) -> tuple[float, ...]:
    """Median and its 95% percentile-bootstrap interval (fixed seed: reproducible)."""
    if len(xs) < 2:
        m = xs[0] if xs else float("nan")
        return m, m, m
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n_boot))
    return statistics.median(xs), meds[int(0.025 * n_boot)], meds[int(0.975 * n_boot) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--recordings", nargs="*", default=[])
    a = ap.parse_args()
    rec_dirs = [Path(d) for d in a.recordings]
    print(
        "| A/B | arm | tok/s median | min-max | B/A | decode steps: mode/reason | host µs "
        "| CPU launch µs | forward launch µs | GPU idle µs | draft µs |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    over = []
    steps: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for f in a.results:
        res = load_results(f)
        for e in res["experiments"]:
            r = e.get("result")
            if r is None:
                continue
            if e["kind"] == "overhead":
                over.append((f, r))
                continue
            if e["kind"] == "stepwise":
                steps.append((f, e, r))
                continue
            for arm in ("A", "B"):
                x = r[arm]
                t = x["tok_s"]
                st = None
                for d in rec_dirs:
                    st = st or _rec_stats(d / x["recording"], x["windows"])
                cells = ["-"] * 6
                if st:
                    cells = [
                        ", ".join(f"{k} {v}" for k, v in st["modes"].items()),
                        f"{st['host_us']:.0f}",
                        f"{st['launch_us']:.0f}",
                        f"{st['forward_us']:.0f}",
                        f"{st['idle_us']:.0f}",
                        f"{st['draft_us']:.0f}",
                    ]
                name = f"{e['a']} vs {e['b']}" if arm == "A" else ""
                ratio = f"{r['ratio_B_over_A']:.3f}" if arm == "B" else ""
                print(
                    f"| {name} | {arm}: {x['scenario']['name']} | {t['median']:.0f} | "
                    f"{t['min']:.0f}-{t['max']:.0f} | {ratio} | " + " | ".join(cells) + " |"
                )
    print_stepwise(steps)
    for f, r in over:
        print(
            f"\nOverhead ({Path(f).name}): output tok/s per mode, ratio of medians to "
            "'absent' and the paired per-repetition ratios:\n"
        )
        print(
            "| mode | reps | tok/s median | min-max | ratio of medians | "
            "median paired ratio [95% CI] | paired ratios |"
        )
        print("|---|---:|---:|---:|---:|---:|---|")
        for m, x in r["modes"].items():
            t = x["tok_s"]
            paired = x["paired_ratio_to_absent"]
            pr = ", ".join(f"{v:.2f}" for v in paired) if len(paired) <= 8 else "(see JSON)"
            med, lo, hi = median_ci(paired)
            print(
                f"| {m} | {t['n']} | {t['median']:.0f} | {t['min']:.0f}-{t['max']:.0f} | "
                f"{x['ratio_to_absent']:.3f} | {med:.3f} [{lo:.3f}, {hi:.3f}] | {pr} |"
            )
        print(
            f"\nGreedy tokens identical across modes in every repetition: "
            f"{r['token_identity']}; ring drops: {r.get('dropped')}"
        )
    if len(over) > 1:
        print_pooled_overhead(over)


def load_results(path: str) -> dict[str, Any]:
    """A harness results file, plain or gzipped (``*.json.gz``, as results folders keep it)."""
    raw = Path(path).read_bytes()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    return json.loads(raw)


def pool_overhead(over: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The overhead experiments of several runs pooled, mode by mode: every repetition's
    paired ratio to ``absent`` (each run pairs its own repetitions), their median with a
    bootstrap 95% interval, and whether greedy tokens were identical across modes in every
    run."""
    modes: dict[str, list[float]] = {}
    for _f, r in over:
        for m, x in r["modes"].items():
            modes.setdefault(m, []).extend(x["paired_ratio_to_absent"])
    out: dict[str, dict[str, Any]] = {}
    for m, paired in modes.items():
        med, lo, hi = median_ci(paired)
        out[m] = {"reps": len(paired), "median_paired_ratio": med, "ci95": [lo, hi]}
    tokens = all(bool(r.get("token_identity")) for _f, r in over)
    drops = sum(int(r.get("dropped") or 0) for _f, r in over)
    return {"modes": out, "token_identity": {"all_runs": tokens}, "dropped": {"total": drops}}


def print_pooled_overhead(over: list[tuple[str, dict[str, Any]]]) -> None:
    p = pool_overhead(over)
    print(f"\nOverhead pooled over {len(over)} runs: the paired ratios to 'absent'\n")
    print("| mode | reps | median paired ratio [95% CI] |")
    print("|---|---:|---:|")
    for m, x in p["modes"].items():
        lo, hi = x["ci95"]
        print(f"| {m} | {x['reps']} | {x['median_paired_ratio']:.4f} [{lo:.4f}, {hi:.4f}] |")
    print(
        f"\nGreedy tokens identical across modes in every repetition of every run: "
        f"{p['token_identity']['all_runs']}; ring drops: {p['dropped']['total']}"
    )


def clean_pairs(x: dict[str, Any], generates: int | None, key: str) -> list[float]:
    """A stepwise run's block-pair costs without the pairs that touch a workload's prefill.

    Runs that recorded ``excluded_blocks`` were already cleaned by the harness. For older
    runs the pairs are dropped here: pair j is on-block 2(j + 1) between its two off blocks
    (``harness.block_costs`` keeps whole blocks from block 1 on), and the workloads started
    every ``steps / generates`` steps (the same workload each time)."""
    diffs = [float(v) for v in x.get(key) or []]
    if "excluded_blocks" in x or not generates or x["steps"] % generates:
        return diffs
    from harness import prefill_blocks  # this folder: on the path as script and in tests

    per = x["steps"] // generates
    block = int(x.get("block", 16))
    skip = prefill_blocks([g * per for g in range(generates)], block)
    return [
        d for j, d in enumerate(diffs) if not skip.intersection((2 * j + 1, 2 * j + 2, 2 * j + 3))
    ]


def print_stepwise(steps: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> None:
    for f, e, r in steps:
        print(
            f"\nStepwise ({Path(f).name}, {e['scenario']}, probe from {r.get('probe_path')}): "
            "hooks on vs off in alternating blocks of engine steps; cost = median over the "
            "'on' blocks of (block median - mean of the neighbouring 'off' blocks' medians), "
            "pairs touching a workload's prefill steps left out; "
            "'by means': the same with block means (what throughput sees when only one step "
            "in N is recorded)\n"
        )
        print(
            "| hook families | device timing | steps | block pairs | cost per step µs "
            "[95% CI] | by means µs [95% CI] | step median µs (off) | cost / step |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        variants = e.get("variants") or []
        for i, x in enumerate(r["runs"]):
            gen = variants[i].get("generates", 10) if i < len(variants) else None
            d = [v / 1e3 for v in clean_pairs(x, gen, "pair_diffs_ns")]
            med, lo, hi = median_ci(d)
            dm = [v / 1e3 for v in clean_pairs(x, gen, "pair_diffs_mean_ns")]
            mm, mlo, mhi = median_ci(dm) if dm else (float("nan"),) * 3
            by_means = f"{mm:.0f} [{mlo:.0f}, {mhi:.0f}]" if dm else "n/a"
            # the share of the step: by means when only some steps are recorded
            share = mm if x.get("sample_every", 1) > 1 else med
            fam = x["families"] if isinstance(x["families"], str) else ", ".join(x["families"])
            if x.get("sample_every", 1) > 1:
                fam += f", 1 step in {x['sample_every']}"
            if x.get("requests"):
                fam += f", {x['requests']} requests"
            gt = x["gpu_timing"]
            gts = "off" if gt is False else f"1 step in {8 if gt is True else gt}"
            off = x["median_off_ns"] / 1e3
            print(
                f"| {fam} | {gts} | {x['steps']} | {len(d)} | "
                f"{med:.0f} [{lo:.0f}, {hi:.0f}] | {by_means} | "
                f"{off:.0f} | {share / off:.1%} |"
            )
            st = x.get("selftime")
            if st:
                print_selftime(st)


def print_selftime(st: dict[str, Any]) -> None:
    """One stepwise run's self-time table (``selftime.py``), as an indented block."""
    ring = st.get("ring_ns_per_write")
    print(
        f"\n    self time inside the engine: {st['self_us_per_step']:.1f} µs per step over "
        f"{st['calls_per_step']:.1f} hooked calls ({st['timer_floor_ns_per_call']:.0f} ns per "
        f"call is the timers' own floor); ring: {st['ring_writes_per_step']:.1f} writes per "
        f"step at {(ring or 0):.0f} ns\n"
    )
    print("    | hook | calls / step | self µs / step | self ns / call |")
    print("    |---|---:|---:|---:|")
    for hid, h in sorted(st["hooks"].items(), key=lambda kv: -kv[1]["self_us_per_step"]):
        print(
            f"    | {hid} | {h['calls_per_step']:.2f} | {h['self_us_per_step']:.1f} | "
            f"{h['self_ns_per_call']:.0f} |"
        )
    print()


if __name__ == "__main__":
    main()
