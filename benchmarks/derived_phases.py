"""What a phase would read if the reader derived it from its neighbours instead of hooking it.

    python benchmarks/derived_phases.py RECORDING.probe.db [RECORDING.probe.db ...]

The last lever on the cost is fewer hooked calls per step, and "nothing the reader can derive
is computed in vLLM". Two of a step's hooked calls time phases that sit between other
recorded spans, so the reader could take them from those spans' edges:

- ``sample`` from the start of ``sample_tokens`` to the start of ``draft`` (in V1,
  ``sample_tokens`` runs ``_sample`` and then the drafter's ``propose``);
- ``logits`` from the end of ``forward_launch`` to the end of ``execute`` (in V1,
  ``execute_model`` ends with ``compute_logits``; in MRV2 ``logits`` runs inside
  ``sample``, so its edges are not another span's).

A derived phase takes in vLLM's own code between the hooked calls. For every FULL target
step with all of these spans (the recording's ``spans`` table, drafter 0), this prints the
median of the hooked phase, of the derived one and of the two gaps, in µs, one row per
recording: how much a derived phase would differ from what the hooked phase measures today.
"""

from __future__ import annotations

import sys
from pathlib import Path

from probe.analysis.views import percentile
from probe.reader.recording import Recording

NEEDED = ("execute", "forward_launch", "logits", "sample_tokens", "sample", "draft")
COLUMNS = (
    "sample (hooked)",
    "sample from sample_tokens to draft",
    "gap before sample",
    "gap after sample",
    "logits (hooked)",
    "logits from forward_launch to the end of execute",
)


def medians(path: Path) -> tuple[str, int, list[float]]:
    """The runner, the number of steps measured and the median of each column (µs; none
    where no FULL step has all the spans)."""
    from probe.records import Flag, Mode

    rec = Recording.open(path)  # either format: read through its steps
    try:
        spans: dict[tuple[int, int], dict[str, tuple[int, int]]] = {}
        full: set[tuple[int, int]] = set()
        runner_set: set[str] = set()
        for st in rec.iter_steps():
            runner_set.add(st.runner)
            if st.mode == Mode.FULL:
                full.add((st.pid, st.step))
            d = spans.setdefault((st.pid, st.step), {})
            for sp in st.spans:
                if not sp.flags & Flag.DRAFTER:
                    d[sp.phase.name.lower()] = (sp.t0, sp.t1)
        runners = sorted(runner_set)
    finally:
        rec.close()
    cols: list[list[float]] = [[] for _ in COLUMNS]
    for key, d in spans.items():
        if key not in full or not all(n in d for n in NEEDED):
            continue
        values = (
            d["sample"][1] - d["sample"][0],
            d["draft"][0] - d["sample_tokens"][0],
            d["sample"][0] - d["sample_tokens"][0],
            d["draft"][0] - d["sample"][1],
            d["logits"][1] - d["logits"][0],
            d["execute"][1] - d["forward_launch"][1],
        )
        for col, v in zip(cols, values, strict=True):
            col.append(v / 1e3)
    n = len(cols[0])
    meds = [float(percentile(c, 50) or 0.0) for c in cols] if n else []
    return "/".join(str(r) for r in runners), n, meds


def main() -> None:
    print("| recording | runner | FULL steps | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---:|" + "---:|" * len(COLUMNS))
    for arg in sys.argv[1:]:
        runner, n, meds = medians(Path(arg))
        cells = [f"{m:.1f}" for m in meds] if meds else ["-"] * len(COLUMNS)
        print(f"| {arg} | {runner} | {n:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
