"""The A/B comparison (:mod:`probe.analysis.ab`) on a varied-length workload built from the
declared Step fields (``tests/ab_workload.py``): steps paired by batch shape see a 20%
difference in one run per arm, and two runs of one setting show none."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from probe.analysis import ab
from probe.analysis.steady import summarize_steps
from probe.analysis.summary import columns_of_steps
from probe.records import Mode, Reason
from probe.step import Step

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ab_workload as W


def _ustd(batches: list[tuple[bool, int, int]], seed: int, scale: float = 1.2) -> list[Step]:
    """The override's arm: decode PIECEWISE (backend support too low), ``scale`` x host."""
    return W.steps(
        batches, seed=seed, scale=scale, mode=Mode.PIECEWISE, reason=Reason.BACKEND_SUPPORT_TOO_LOW
    )


def _run(steps: list[Step], name: str = "run") -> ab.Run:
    steps = sorted(steps, key=lambda s: (s.pid, s.step))
    cols = columns_of_steps(steps)
    return ab.run_of(summarize_steps(steps), ab.steps_of_columns([cols]), name)


def _tp(cmp: dict[str, object]) -> dict[str, float]:
    return cmp["metrics"]["steady_tokens_per_s"]  # type: ignore[index,no-any-return]


def test_a_20_percent_slower_arm_is_seen_in_one_run_per_arm() -> None:
    batches = W.shapes(seed=0)
    assert len({b for b in batches}) > 40  # the batch shrinks over the run: many shapes
    a = _run(W.steps(batches, seed=1))
    b = _run(_ustd(batches, 2))
    cmp = ab.compare([a], [b])
    tp = _tp(cmp)
    assert cmp["pairing"]["matched"] and cmp["pairing"]["mix_difference"] == 0
    assert cmp["verdict"].startswith("A is faster")
    assert tp["high"] < 1 and tp["low"] < tp["ratio_B_over_A"] < tp["high"]
    # host time per shape is 1.2x; the period adds the scheduler's pass between steps
    host = cmp["metrics"]["steady_host_ns"]
    assert host["ratio_B_over_A"] == pytest.approx(1.2, rel=0.05) and host["low"] > 1
    assert 0.8 < tp["ratio_B_over_A"] < 0.87
    assert cmp["metrics"]["decode_full_share"]["B"] == 0


def test_the_runs_of_steps_alone_cannot_see_it() -> None:
    """The same data through the method of the whole runs and their ten runs of
    consecutive steps (what ``ab`` falls back to when the workloads do not match): the
    batch shrinks over each run, so the runs of steps differ by design and the interval
    includes 1. "No difference shown" there is the method's, not the data's."""
    batches = W.shapes(seed=0)
    a = _run(W.steps(batches, seed=1))
    b = _run(_ustd(batches, 2))
    unpaired = ab.compare([a], [b], tolerance=-1)
    assert not unpaired["pairing"]["matched"]
    assert unpaired["verdict"].startswith("no difference shown")
    lo, hi = _tp(unpaired)["low"], _tp(unpaired)["high"]
    assert hi / lo > 2  # the design's spread, not the noise's
    assert ab.compare([a], [b])["verdict"].startswith("A is faster")


def test_workloads_that_differ_are_said_to() -> None:
    a = _run(W.steps(W.shapes(seed=0), seed=1))
    b = _run(W.steps(W.shapes(seed=0, max_out=64), seed=2))
    cmp = ab.compare([a], [b])
    p = cmp["pairing"]
    assert not p["matched"] and p["mix_difference"] > ab.MIX_TOLERANCE
    assert cmp["notes"][0].startswith("the workloads differ: the arms' batch-shape mixes")
    assert f"differ by {p['mix_difference']:.1%} of steps" in cmp["notes"][0]
    assert "steps paired" not in cmp["interval_over"]
    # the figures are each arm's own
    m = cmp["metrics"]["steady_tokens_per_s"]
    assert m["A"] == a.figures["steady_tokens_per_s"]


def test_two_runs_of_one_setting_show_no_difference() -> None:
    batches = W.shapes(seed=0)
    cmp = ab.compare([_run(W.steps(batches, seed=1))], [_run(W.steps(batches, seed=3))])
    assert cmp["verdict"].startswith("no difference shown")
    for key in ("steady_tokens_per_s", "steady_host_ns", "cpu_launch_overhead_ns"):
        m = cmp["metrics"][key]
        assert m["low"] < 1 < m["high"], key


def test_the_error_rates_over_many_workloads() -> None:
    """Over 25 workloads (output lengths drawn anew) and noise draws, one run per arm: two
    runs of one setting read "no difference shown" in at least 88% (a 95% interval), and
    a 20% host-time difference is seen in at least 70% (the run-to-run allowance costs
    some; benchmarks/ab_method.py measures both on more)."""
    false, seen = 0, 0
    for i in range(25):
        batches = W.shapes(seed=100 + i)
        a = _run(W.steps(batches, seed=1000 + i))
        same = ab.compare([a], [_run(W.steps(batches, seed=2000 + i))])
        slower = ab.compare([a], [_run(W.steps(batches, seed=3000 + i, scale=1.2))])
        false += not same["verdict"].startswith("no difference")
        seen += slower["verdict"].startswith("A is faster")
    assert false <= 3
    assert seen >= 18


def test_repetitions_give_the_interval_and_two_say_no_less_than_one() -> None:
    batches = W.shapes(seed=0)
    a = [_run(W.steps(batches, seed=10 + i)) for i in range(3)]
    b = [_run(W.steps(batches, seed=20 + i, scale=1.2)) for i in range(3)]
    cmp = ab.compare(a, b)
    assert cmp["interval_over"].startswith("repetitions")
    assert cmp["verdict"].startswith("A is faster")
    two = ab.compare(a[:2], b[:2])
    one = ab.compare(a[:1], b[:1])
    width = {n: _tp(c)["high"] / _tp(c)["low"] for n, c in (("two", two), ("one", one))}
    assert width["two"] < 1.5 * width["one"]
    # unequal arms: said as they are, never "one repetition per arm"
    uneq = ab.compare(a[:1], b)
    assert uneq["reps"] == {"A": 1, "B": 3}
    assert any(n.startswith("1 recording of A and 3 of B") for n in uneq["notes"])
    assert not any("one recording per arm" in n for n in uneq["notes"])


def test_tp_ranks_are_one_engine_step() -> None:
    """Two ranks running the same batches at once are one engine step each: the same
    ratio and interval as one rank."""
    batches = W.shapes(seed=0)
    a1, b1 = W.steps(batches, seed=1), W.steps(batches, seed=2, scale=1.2)

    def twice(steps: list[Step]) -> list[Step]:
        return steps + [replace(s, pid=s.pid + 1) for s in steps]

    one = _tp(ab.compare([_run(a1)], [_run(b1)]))
    two = _tp(ab.compare([_run(twice(a1))], [_run(twice(b1))]))
    for k in ("ratio_B_over_A", "low", "high"):
        assert two[k] == pytest.approx(one[k], rel=1e-9)


def test_the_figures_under_one_mix_are_the_arms_own_when_the_mixes_match() -> None:
    batches = W.shapes(seed=0)
    a = _run(W.steps(batches, seed=1))
    b = _run(W.steps(batches, seed=2, scale=1.2))
    cmp = ab.compare([a], [b])
    for key in ("steady_tokens_per_s", "steady_host_ns", "cpu_launch_overhead_ns"):
        m = cmp["metrics"][key]
        assert m["A"] == pytest.approx(a.figures[key], rel=1e-9)
        assert m["B"] == pytest.approx(b.figures[key], rel=1e-9)
        assert m["ratio_B_over_A"] == pytest.approx(m["B"] / m["A"], rel=1e-12)


def test_a_mix_off_by_a_little_is_not_read_as_speed() -> None:
    """B ran 4% more small-batch steps (its tail longer): paired by shape, the same
    speed per shape reads B/A 1 within noise, where the whole runs' ratio reads B slower
    per step (more small, cheap steps: lower throughput) by the mix alone."""
    batches = W.shapes(seed=0)
    tail = [x for x in batches if x[0] and x[1] <= 3]
    longer = batches + tail[: max(1, len(batches) // 25)]
    a = _run(W.steps(batches, seed=5))
    b = _run(W.steps(longer, seed=5))
    cmp = ab.compare([a], [b])
    assert cmp["pairing"]["matched"] and 0 < cmp["pairing"]["mix_difference"] <= 0.1
    r = _tp(cmp)["ratio_B_over_A"]
    whole = b.figures["steady_tokens_per_s"] / a.figures["steady_tokens_per_s"]  # type: ignore[operator]
    assert abs(math.log(r)) < abs(math.log(whole))


def test_top_reasons_count_every_recording() -> None:
    batches = W.shapes(seed=0)
    a = [_run(W.steps(batches, seed=i)) for i in (1, 2)]
    b = [_run(_ustd(batches, i, 1.0)) for i in (3, 4, 5)]
    cmp = ab.compare(a, b)
    decode = sum(1 for x in batches if x[0])
    assert cmp["reasons"]["A"]["full/hit"] == 2 * decode
    assert cmp["reasons"]["B"]["piecewise/backend_support_too_low"] == 3 * decode


def test_t_quantiles() -> None:
    assert ab.t95(1) == 12.706 and ab.t95(9.7) == 2.262 and ab.t95(math.inf) == 1.96
    with pytest.raises(ValueError):
        ab.t95(0.5)
    assert np.isclose(ab.mix_difference({1: 0.5, 2: 0.5}, {1: 0.25, 3: 0.75}), 0.75)
