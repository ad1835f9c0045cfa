"""Ground truth: the torch profiler (Kineto, with Python stacks) against the probe.

    python benchmarks/gpu/groundtruth.py --trace T.json --recording R.probe.db \
        --window B0 B1 --out groundtruth.json [--trimmed T.trimmed.json.gz]

Both saw the same steps: the probe's steps whose start lies in the profiler's window
(BOOTTIME ns, taken by the harness right around ``llm.generate``). Compared:

- graph launches: Kineto ``cudaGraphLaunch`` runtime calls inside each ``_model_forward``
  Python event, against the probe's target replays (one per FULL step, one per
  piecewise piece);
- FULL steps: Kineto forwards with exactly one graph launch, against probe steps that
  dispatched FULL and confirmed a replay;
- host time: the sum of ``_model_forward`` durations against the probe's forward_launch
  spans, and the sum of the sparse builders' ``build`` events against the probe's builds.

Kineto pairs are matched by order within the window (the k-th forward with the k-th
forward span), which needs no clock translation.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sqlite3
from pathlib import Path
from typing import Any

GRAPH_LAUNCH = ("cudaGraphLaunch", "cudaGraphLaunch_v10000", "hipGraphLaunch")
BUILDER_FILES = {
    "flashmla_sparse.py": "FlashMLASparseMetadataBuilder",
    "indexer.py": "DeepseekV32IndexerMetadataBuilder",
}


def analyze(trace: Path, recording: Path, window: tuple[int, int]) -> dict[str, Any]:
    ev = json.loads(Path(trace).read_text())["traceEvents"]
    py = [e for e in ev if e.get("cat") == "python_function" and "dur" in e]
    fwd = sorted((e for e in py if e["name"].endswith(": _model_forward")), key=lambda e: e["ts"])
    runner = "v1"
    if not fwd:  # Model Runner V2: the target's FULL forwards are ModelCudaGraphManager's
        fwd, runner = mrv2_forwards(py), "mrv2"
    launches = sorted((e for e in ev if e.get("name") in GRAPH_LAUNCH), key=lambda e: e["ts"])
    per_fwd = []
    for f in fwd:
        a, b = f["ts"], f["ts"] + f["dur"]
        per_fwd.append(sum(1 for x in launches if a <= x["ts"] <= b))
    builds: dict[str, float] = {}
    for e in py:
        if not e["name"].endswith(": build"):
            continue
        for fname, cls in BUILDER_FILES.items():
            if f"/{fname}(" in e["name"] or e["name"].startswith(f"{fname}("):
                builds[cls] = builds.get(cls, 0.0) + e["dur"] * 1e3
    db = sqlite3.connect(str(recording))
    db.row_factory = sqlite3.Row
    b0, b1 = window
    steps = [
        dict(r)
        for r in db.execute(
            "SELECT * FROM steps WHERE t0_ns >= ? AND t0_ns <= ? ORDER BY step", (b0, b1)
        )
    ]
    ids = [s["step"] for s in steps]
    pid = steps[0]["pid"] if steps else None
    q = ",".join("?" * len(ids))
    if runner == "mrv2":  # only FULL forwards go through run_fullgraph: compare those
        ids = [s["step"] for s in steps if s["mode"] == "full"]
        q = ",".join("?" * len(ids))
    spans = (
        [
            dict(r)
            for r in db.execute(
                f"SELECT * FROM spans WHERE pid=? AND step IN ({q}) AND phase='forward_launch' "
                "AND drafter=0 ORDER BY t0_ns",
                (pid, *ids),
            )
        ]
        if ids
        else []
    )
    replays = (
        [
            dict(r)
            for r in db.execute(
                f"SELECT * FROM replays WHERE pid=? AND step IN ({q}) AND drafter=0 "
                "AND kind='replay'",
                (pid, *ids),
            )
        ]
        if ids
        else []
    )
    pbuilds = (
        [
            dict(r)
            for r in db.execute(f"SELECT * FROM builds WHERE pid=? AND step IN ({q})", (pid, *ids))
        ]
        if ids
        else []
    )
    probe_build_ns: dict[str, int] = {}
    for b in pbuilds:
        if b["builder"] in BUILDER_FILES.values():
            probe_build_ns[b["builder"]] = probe_build_ns.get(b["builder"], 0) + (
                b["t1_ns"] - b["t0_ns"]
            )
    full_steps = sum(1 for s in steps if s["mode"] == "full" and s["replayed"])
    kineto_full = sum(1 for n in per_fwd if n == 1)
    k_fwd_ns = sum(f["dur"] * 1e3 for f in fwd)
    p_fwd_ns = sum(s["t1_ns"] - s["t0_ns"] for s in spans)
    n = min(len(fwd), len(spans))
    paired = [(fwd[i]["dur"] * 1e3, spans[i]["t1_ns"] - spans[i]["t0_ns"]) for i in range(n)]
    return {
        "runner": runner,
        "probe_steps_in_window": len(steps),
        "kineto_forwards": len(fwd),
        "probe_forward_spans": len(spans),
        "kineto_graph_launches_in_forwards": sum(per_fwd),
        "kineto_graph_launches_total": len(launches),
        "probe_target_replays": len(replays),
        "probe_full_replays": sum(1 for r in replays if r["mode"] == "full"),
        "probe_piecewise_pieces": sum(1 for r in replays if r["mode"] == "piecewise"),
        "probe_full_steps_confirmed": full_steps,
        "kineto_forwards_with_one_launch": kineto_full,
        "launch_counts_equal": sum(per_fwd) == len(replays),
        "forward_host_ns": {
            "kineto": k_fwd_ns,
            "probe": p_fwd_ns,
            "ratio": p_fwd_ns / k_fwd_ns if k_fwd_ns else None,
        },
        "forward_paired_max_rel_diff": max((abs(p - k) / k for k, p in paired if k), default=None),
        "build_host_ns": {
            cls: {
                "kineto": builds.get(cls),
                "probe": probe_build_ns.get(cls),
                "ratio": (probe_build_ns.get(cls, 0) / builds[cls]) if builds.get(cls) else None,
            }
            for cls in BUILDER_FILES.values()
        },
    }


def mrv2_forwards(py: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """MRV2's target FULL forwards: the outermost ``run_fullgraph`` events that are not
    inside the speculator's ``propose`` (its own managers call the same base method)."""
    runs = [e for e in py if e["name"].endswith(": run_fullgraph")]
    props = [e for e in py if e["name"].endswith(": propose")]

    def inside(e: dict[str, Any], outer: list[dict[str, Any]]) -> bool:
        return any(
            o is not e
            and o.get("tid") == e.get("tid")
            and o["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= o["ts"] + o["dur"]
            for o in outer
        )

    return sorted(
        (e for e in runs if not inside(e, props) and not inside(e, runs)),
        key=lambda e: e["ts"],
    )


def trim(trace: Path, dest: Path) -> None:
    """Keep what the merge needs: kernels, runtime calls, and the probe-relevant Python."""
    data = json.loads(Path(trace).read_text())
    keep = []
    for e in data["traceEvents"]:
        cat = e.get("cat")
        name = e.get("name", "")
        wanted = (
            ": _model_forward",
            ": run_fullgraph",
            ": build",
            ": execute_model",
            ": sample_tokens",
            ": propose",
        )
        if (
            cat in ("kernel", "cuda_runtime", "cuda_driver", "gpu_memcpy", "ac2g")
            or e.get("ph") == "M"
            or (cat == "python_function" and name.endswith(wanted))
        ):
            keep.append(e)
    data["traceEvents"] = keep
    with gzip.open(dest, "wt") as fh:
        json.dump(data, fh)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--recording", required=True)
    ap.add_argument("--window", nargs=2, type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--trimmed")
    a = ap.parse_args()
    res = analyze(Path(a.trace), Path(a.recording), (a.window[0], a.window[1]))
    Path(a.out).write_text(json.dumps(res, indent=1))
    if a.trimmed:
        trim(Path(a.trace), Path(a.trimmed))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
