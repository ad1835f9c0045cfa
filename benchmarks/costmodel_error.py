"""The host-time cost model's interpolation error, by leaving each measured shape out.

    PYTHONPATH=$PWD python benchmarks/costmodel_error.py [RECORDING.probe.db ...]

(default: every committed recording, ``git ls-files '*.probe.db'``). For each curve of a
recording (graph mode, uniform decode or not) with at least three measured shapes, each
shape (scheduled tokens, requests) is left out in turn and priced by
:func:`probe.analysis.costmodel.leave_one_shape_out` from the others, inside their measured ranges;
the row gives the absolute relative error of the mean host time per step: median, 90th
percentile, largest, and weighted by the shape's steady step count. Rows are printed
twice: every shape, and shapes of at least 5 steady steps (a mean of fewer steps is itself
a noisy target). Deterministic: no timing is taken here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from probe.analysis.costmodel import Costs, leave_one_shape_out
from probe.reader.recording import Recording


def main(paths: list[str]) -> int:
    if not paths:
        out = subprocess.run(
            ["git", "ls-files", "*.probe.db"], capture_output=True, text=True, check=True
        )
        paths = out.stdout.split()
    print(
        "| recording | curve | shapes | min steps | interpolated | median | p90 | max | weighted |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for path in paths:
        rec = Recording.open(Path(path))
        try:
            costs = Costs.of(list(rec.iter_steps()), path)
        finally:
            rec.close()
        for least in (1, 5):
            for row in leave_one_shape_out(costs, min_steps=least):
                kind = "uniform decode" if row["uniform"] else "mixed/prefill"
                print(
                    f"| {Path(path).name} | {row['mode']} {kind} | {row['shapes']} | {least} | "
                    f"{row['interpolated']} | {row['median']:.1%} | {row['p90']:.1%} | "
                    f"{row['max']:.1%} | {row['weighted']:.1%} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
