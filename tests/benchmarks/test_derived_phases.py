"""``benchmarks/derived_phases.py``: a phase from its neighbours' edges, on real recordings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.derived_phases import COLUMNS, medians

ROOT = Path(__file__).resolve().parents[2]
H200_MRV2 = ROOT / "tests/data/stock_mrv2_k1.probe"


def test_a_derived_sample_takes_in_the_gaps_around_the_hooked_one() -> None:
    runner, n, meds = medians(H200_MRV2)
    assert runner == "mrv2" and n > 1000  # the FULL decode steps of a real H200 run
    col = dict(zip(COLUMNS, meds, strict=True))
    hooked, derived = col["sample (hooked)"], col["sample from sample_tokens to draft"]
    assert col["gap before sample"] > 0 and col["gap after sample"] > 0
    assert derived > hooked  # the edges of sample_tokens and draft hold vLLM's own code too


def test_a_recording_without_the_spans_prints_dashes() -> None:
    bundled = ROOT / "probe/data/default.probe"
    assert medians(bundled)[1:] == (0, [])
    p = subprocess.run(
        [sys.executable, "benchmarks/derived_phases.py", str(bundled)],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    assert p.stdout.splitlines()[-1].endswith("| 0 | " + " | ".join(["-"] * len(COLUMNS)) + " |")
