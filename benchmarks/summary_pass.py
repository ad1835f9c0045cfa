"""CPU per step of the summary's column pass (``Summary.add_columns``) over a recording.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/summary_pass.py RECORDING [--rounds 3]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/summary_pass.py RECORDING \\
        --trees /path/to/tree-before .

Two ways each round, each the least CPU of ``--rounds``:

- ``in report``: ``summarize_recording`` as ``probe report`` runs it (each chunk read,
  checked, given its hooked-call counts where the processes have calibrations, then
  added), with ``add_columns`` timed in place;
- ``read first``: every chunk of ``iter_step_columns`` read first, then all added in one
  timed loop (the chunks cold by then: what a pass over columns already in memory costs).

``--trees`` runs the same in a child process per tree (``PYTHONPATH`` that tree),
alternating, so two versions of the code are measured under the same load.

On the 2-core development VM, shared with other jobs (load average 2 to 3), over a
recording of 1,000,000 steps of 8 ranks made by ``benchmarks/scale.py`` from the real
recorded steps, least of 3 alternating rounds
(``benchmarks/results/summary-pass/summary_pass.json``):

| tree | in report µs/step | read first µs/step |
|---|---:|---:|
| before (``771e79a``) | 1.395 | 1.394 |
| after (``d037361``) | 0.638 | 0.524 |

benchmarks/README.md ("The summary's column pass") says what changed and why.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any


def measure(path: str, rounds: int) -> dict[str, Any]:
    """Least CPU seconds of the column pass over ``rounds``, both ways, in this process."""
    from probe.analysis import summary as sm
    from probe.analysis.summary_read import summarize_recording
    from probe.reader.recording import Recording
    from probe.reader.recording_columns import iter_step_columns

    rec = Recording.open(path)
    spent = [0.0]
    original = sm.Summary.add_columns

    def timed(self: Any, *a: Any, **k: Any) -> Any:
        c = time.process_time()
        try:
            return original(self, *a, **k)
        finally:
            spent[0] += time.process_time() - c

    in_report, read_first = [], []
    steps = 0
    for _ in range(rounds):
        spent[0] = 0.0
        sm.Summary.add_columns = timed  # type: ignore[method-assign]
        try:
            summarize_recording(rec)
        finally:
            sm.Summary.add_columns = original  # type: ignore[method-assign]
        in_report.append(spent[0])
        chunks = list(iter_step_columns(rec))
        steps = sum(len(c["pid"]) for c in chunks)
        s = sm.Summary(sample_every=int(rec.meta().get("sample_every") or 1))
        c0 = time.process_time()
        for cols in chunks:
            s.add_columns(cols)
        read_first.append(time.process_time() - c0)
        del chunks
    return {"steps": steps, "in_report_s": min(in_report), "read_first_s": min(read_first)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trees", nargs="+", help="measure each tree in a child, alternating")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.recording, args.rounds)))
        return
    if not args.trees:
        results = {".": measure(args.recording, args.rounds)}
    else:
        runs: dict[str, list[dict[str, Any]]] = {t: [] for t in args.trees}
        for _ in range(args.rounds):
            for tree in args.trees:
                env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
                out = subprocess.run(
                    [sys.executable, __file__, args.recording, "--rounds", "1", "--child"],
                    env=env, check=True, capture_output=True, text=True,
                )  # fmt: skip
                runs[tree].append(json.loads(out.stdout.splitlines()[-1]))
        results = {
            t: {
                "steps": r[0]["steps"],
                "in_report_s": min(x["in_report_s"] for x in r),
                "read_first_s": min(x["read_first_s"] for x in r),
            }
            for t, r in runs.items()
        }
    print(f"{'tree':<40} {'steps':>10} {'in report µs/step':>18} {'read first µs/step':>19}")
    for tree, r in results.items():
        n = max(1, r["steps"])
        print(
            f"{tree:<40} {r['steps']:>10} {r['in_report_s'] / n * 1e6:>18.3f} "
            f"{r['read_first_s'] / n * 1e6:>19.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"recording": args.recording, "rounds": args.rounds, **results}, f, indent=1)


if __name__ == "__main__":
    main()
