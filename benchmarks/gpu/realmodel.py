"""The probe's verdicts against the harness's own counts, on the recordings of ``ab``
experiments (``plan_realmodel_*.json``), run here on CPU after the device run.

For each ``ab`` experiment of a harness ``results.json``:

- each arm's recording is cut into one recording per repetition (``split_reps.py``);
- ``probe ab`` with one repetition per arm (rep i of A against rep i of B, for every i)
  and with every repetition, beside the harness's throughput ratio (output tokens per
  second of ``generate()``, the same seeds in both arms);
- ``probe whatif --costs-from``: each arm's first repetition priced with the other arm's
  second repetition, beside that repetition's measured throughput;
- ``probe report --json`` of each arm's whole recording: the engine-idle seconds beside the
  harness's idle time between repetitions (the engine had nothing submitted).

    python benchmarks/gpu/realmodel.py RESULTS_DIR [--out FILE.json]

RESULTS_DIR holds ``results.json`` and the arms' recordings (an unpacked
``run_device.sh`` archive). Every probe command's whole JSON is kept in the output next
to the figures drawn from it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from split_reps import split  # noqa: E402

USTD = "FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE"
STOCK = "FlashMLASparseMetadataBuilder=UNIFORM_BATCH"


def probe_json(*args: str) -> dict[str, Any]:
    """``probe ARGS --json``, parsed; on failure the error line instead."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-m", "probe", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:], "rc": r.returncode}
    try:
        return dict(json.loads(r.stdout))
    except json.JSONDecodeError:
        return {"error": ["not JSON"], "stdout": r.stdout[-2000:]}


def find(obj: Any, key: str) -> list[Any]:
    """Every value under ``key`` anywhere in a JSON document, in document order."""
    out: list[Any] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                out.append(v)
            out += find(v, key)
    elif isinstance(obj, list):
        for v in obj:
            out += find(v, key)
    return out


def throughput_row(ab: dict[str, Any]) -> dict[str, Any]:
    """The steady-throughput row of a ``probe ab --json`` comparison."""
    for m in [*find(ab, "metrics"), ab.get("figures")]:
        rows = m if isinstance(m, list) else list((m or {}).values()) if isinstance(m, dict) else []
        for row in rows:
            if isinstance(row, dict) and row.get("key") == "steady_tokens_per_s":
                return row
    hit = find(ab, "steady_tokens_per_s")
    return {"found": hit[:2]} if hit else {}


def harness_idle_s(windows: list[list[int]]) -> float:
    """Seconds between the repetitions (one ends, the next not yet submitted)."""
    return sum(max(0, b[0] - a[1]) for a, b in itertools.pairwise(windows)) / 1e9


def analyse(results_dir: Path) -> list[dict[str, Any]]:
    res = json.loads((results_dir / "results.json").read_text())
    out = []
    for n, exp in enumerate(res["experiments"]):
        if exp.get("kind") != "ab" or "result" not in exp:
            continue
        r = exp["result"]
        arms: dict[str, list[Path]] = {}
        row: dict[str, Any] = {
            "a": exp["a"],
            "b": exp["b"],
            "sequential": bool(exp.get("sequential")),
        }
        for arm in ("A", "B"):
            rec = results_dir / r[arm]["recording"]
            windows = r[arm]["windows"]
            cut = split(rec, [tuple(w) for w in windows], str(results_dir / f"x{n}-{arm}-rep"))
            arms[arm] = [p for p, _ in cut]
            report = probe_json("report", str(rec))
            row[f"{arm}_steps_per_rep"] = [k for _, k in cut]
            row[f"{arm}_harness_tok_s"] = r[arm]["tok_s"]["values"]
            row[f"{arm}_idle"] = {
                "harness_between_reps_s": harness_idle_s(windows),
                "probe_engine_idle_s": (find(report, "engine_idle_s") or [None])[0],
                "probe_engine_idle_ns": (find(report, "engine_idle_ns") or [None])[0],
                "probe_engine_idle_gaps": (find(report, "engine_idle_gaps") or [None])[0],
            }
            row[f"{arm}_report"] = report
        ta, tb = row["A_harness_tok_s"], row["B_harness_tok_s"]
        row["harness_ratio_per_rep"] = [y / x for x, y in zip(ta, tb, strict=False)]
        row["harness_ratio_median"] = statistics.median(tb) / statistics.median(ta)
        singles = []
        for i, (pa, pb) in enumerate(zip(arms["A"], arms["B"], strict=False)):
            ab = probe_json("ab", "--a", str(pa), "--b", str(pb))
            singles.append({"rep": i, "throughput": throughput_row(ab), "ab": ab})
        row["ab_one_rep_each"] = singles
        allreps = probe_json("ab", "--a", *map(str, arms["A"]), "--b", *map(str, arms["B"]))
        row["ab_all_reps"] = {"throughput": throughput_row(allreps), "ab": allreps}
        whatifs = []
        if len(arms["A"]) > 1 and len(arms["B"]) > 1:
            for src, other, support, other_arm in (
                (arms["A"][0], arms["B"][1], USTD, "B"),
                (arms["B"][0], arms["A"][1], STOCK, "A"),
            ):
                w = probe_json("whatif", str(src), "--support", support, "--costs-from", str(other))
                whatifs.append(
                    {
                        "recording": src.name,
                        "costs_from": other.name,
                        "measured_tok_s_of_costs_from": row[f"{other_arm}_harness_tok_s"][1],
                        "whatif": w,
                    }
                )
        row["whatif"] = whatifs
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dir", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = analyse(args.results_dir)
    text = json.dumps(rows, indent=1, default=str)
    if args.out:
        args.out.write_text(text)
    for row in rows:
        print(
            f"{row['a']} vs {row['b']}: harness B/A {row['harness_ratio_median']:.3f} "
            f"(per rep {', '.join(f'{x:.3f}' for x in row['harness_ratio_per_rep'])}); "
            f"probe ab all reps {row['ab_all_reps']['throughput']}"
        )
        for s in row["ab_one_rep_each"]:
            print(f"  one rep each ({s['rep']}): {s['throughput']}")
        for arm in ("A", "B"):
            print(f"  {arm} idle: {row[f'{arm}_idle']}")


if __name__ == "__main__":
    main()
