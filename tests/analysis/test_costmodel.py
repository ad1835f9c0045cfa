"""The host-time cost model (probe.analysis.costmodel) on the committed real recordings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.analysis import views as analysis
from probe.analysis.costmodel import (
    Costs,
    Point,
    leave_one_shape_out,
    measured,
    predict,
    steady_keys,
    timeline,
)
from probe.reader.recording import Recording
from probe.records import Mode, Reason
from probe.step import PHASES, Step, new_step

ROOT = Path(__file__).resolve().parents[2]
CHUNKED = ROOT / "tests/data/chunked_mrv2_k1.probe"
SERVE = ROOT / "tests/data/serve-tp2.probe"


def _steps(path: Path) -> list[Step]:
    rec = Recording.open(path)
    try:
        return list(rec.iter_steps())
    finally:
        rec.close()


@pytest.fixture(scope="module")
def chunked() -> list[Step]:
    return _steps(CHUNKED)


def test_a_measured_shape_costs_its_own_steady_mean(chunked: list[Step]) -> None:
    steady, _ = analysis.split_steady(chunked)
    rows = [s for s in steady if s.mode == Mode.FULL and s.uniform and s.num_tokens == 20]
    assert rows
    got = Costs.of(chunked, "c").price("FULL", True, 20, rows[0].num_reqs)
    assert got is not None and got.how == "measured"
    assert got.host_ns == pytest.approx(fmean(s.host_ns for s in rows))
    assert got.launch_ns == pytest.approx(
        fmean(s.cpu_launch_overhead_ns or 0 for s in rows if s.cpu_launch_overhead_ns is not None)
    )


def test_an_unmeasured_shape_between_measured_ones_is_interpolated(chunked: list[Step]) -> None:
    costs = Costs.of(chunked, "c")
    full = costs.points[("FULL", True)]
    left_out = {k: v for k, v in full.items() if k != (20, 10)}
    without = Costs({("FULL", True): left_out}, "c")
    got = without.price("FULL", True, 20, 10)
    assert got is not None and got.how == "interpolated"
    lo, hi = sorted((full[(18, 9)].host_ns, full[(22, 11)].host_ns))
    assert lo <= got.host_ns <= hi  # the two nearest, equally far: their mean
    assert got.host_ns == pytest.approx((lo + hi) / 2)


def test_no_cost_outside_the_measured_shapes_or_modes(chunked: list[Step]) -> None:
    costs = Costs.of(chunked, "c")
    top = max(t for t, _ in costs.points[("FULL", True)])
    assert costs.price("FULL", True, top + 2, top // 2 + 1) is None  # above every measured
    assert costs.price("NONE", True, 20, 10) is None  # a mode this run never ran eagerly
    assert costs.price("PIECEWISE", True, 20, 10) is None


def test_predict_lists_the_gaps_and_gives_no_partial_figure(chunked: list[Step]) -> None:
    keys = steady_keys(chunked)
    costs = Costs.of(chunked, "c")
    fw = [s for s in chunked if s.forward and s.num_tokens > 0]
    own = predict(fw, keys, [costs])
    assert not own["no_cost"] and own["steady_steps"] == len(keys)
    assert own["host_ns_per_step"] == pytest.approx(
        fmean(s.host_ns for s in fw if (s.pid, s.step) in keys)
    )

    eager = [replace(s, mode=Mode.NONE) if s.uniform else s for s in fw]
    got = predict(eager, keys, [costs])
    assert got["host_ns_per_step"] is None and got["cpu_launch_overhead_ns"] is None
    assert {(g["mode"], g["uniform"]) for g in got["no_cost"]} == {("NONE", True)}
    assert sum(g["steps"] for g in got["no_cost"]) == sum(
        1 for s in fw if s.uniform and (s.pid, s.step) in keys
    )


@pytest.mark.parametrize("path", [CHUNKED, SERVE], ids=["chunked", "serve-tp2"])
def test_leave_one_shape_out_measures_every_curve_of_three_shapes(path: Path) -> None:
    costs = Costs.of(_steps(path), path.name)
    rows = leave_one_shape_out(costs)
    curves = {k for k, v in costs.points.items() if len(v) >= 3}
    assert {(r["mode"], r["uniform"]) for r in rows} == curves
    for r in rows:
        assert 0 < r["interpolated"] < r["shapes"]  # the ends are outside the others' range
        assert 0 <= r["median"] <= r["p90"] <= r["max"]


@settings(max_examples=80, deadline=None)
@given(
    st.dictionaries(
        st.tuples(st.integers(1, 64), st.integers(1, 32)),
        st.floats(1e3, 1e8),
        min_size=2,
        max_size=12,
    ),
    st.integers(1, 64),
    st.integers(1, 32),
)
def test_interpolation_stays_between_the_measured_costs(
    costs: dict[tuple[int, int], float], tokens: int, reqs: int
) -> None:
    model = Costs({("FULL", True): {k: Point(1, v, v / 2) for k, v in costs.items()}}, "h")
    got = model.price("FULL", True, tokens, reqs)
    ts = [t for t, _ in costs]
    rs = [r for _, r in costs]
    inside = min(ts) <= tokens <= max(ts) and min(rs) <= reqs <= max(rs)
    if (tokens, reqs) in costs:
        assert got is not None and got.how == "measured" and got.host_ns == costs[tokens, reqs]
    elif not inside:
        assert got is None
    else:
        assert got is not None and got.how == "interpolated"
        assert min(costs.values()) * (1 - 1e-9) <= got.host_ns <= max(costs.values()) * (1 + 1e-9)
        assert got.launch_ns == pytest.approx(got.host_ns / 2)


# -- what a change is worth in throughput -------------------------------------------------------


def _run(
    mode: Mode,
    host_ns: int,
    span_ns: int | None,
    idle_ns: int,
    between_ns: int,
    n: int = 40,
) -> list[Step]:
    """One rank's uniform decode steps of 64 tokens x 64 requests, built from the declared
    fields: ``host_ns`` in each step, the host's own ``between_ns`` before it, and on the
    device (``span_ns`` None: no device timing) the step's span and the GPU idle before
    it. The period is the slower side: the GPU's idle and span, or the host's time."""
    period = max(host_ns + between_ns, (span_ns or 0) + idle_ns)
    t1 = 1_000_000_000
    # a step that ran no forward first: every forward step has one before it
    out = [
        new_step(
            pid=7, step=0, t0=t1 - 100_000, t1=t1, host_ns=100_000, num_tokens=0, num_reqs=0,
            mode=None, reason=None, padded_tokens=0, padded_reqs=0, max_query_len=0,
            uniform_decode_query_len=1, uniform=False, replayed=False, pieces=0, captures=0,
            cpu_launch_overhead_ns=None, phases=dict.fromkeys(PHASES, 0),
        )
    ]  # fmt: skip
    for i in range(1, n + 1):
        t0 = t1 + period - host_ns
        t1 = t0 + host_ns
        out.append(
            new_step(
                pid=7, step=i, t0=t0, t1=t1, host_ns=host_ns, num_tokens=64, num_reqs=64,
                mode=mode, reason=Reason.HIT if mode == Mode.FULL else Reason.PIECEWISE_ONLY,
                padded_tokens=64, padded_reqs=64, max_query_len=1, uniform_decode_query_len=1,
                uniform=True, replayed=True, pieces=0, captures=0,
                cpu_launch_overhead_ns=host_ns // 2, phases=dict.fromkeys(PHASES, 0),
                gpu_busy_ns=span_ns, gpu_step_ns=span_ns,
                gpu_idle_before_ns=None if span_ns is None else idle_ns,
            )
        )  # fmt: skip
    return out


def _worth(a: list[Step], b: list[Step]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(A measured, A's steps under B's mode priced by A's then B's costs)."""
    keys, line = steady_keys(a), timeline(a)
    own = Costs.of(a, "a", keys, line)
    moved = [replace(s, mode=b[-1].mode, reason=b[-1].reason) if s.forward else s for s in a]
    return measured(a, keys, line, own), predict(moved, keys, [own, Costs.of(b, "b")], a, line)


def test_a_gpu_bound_run_loses_only_what_the_gpu_side_loses_when_host_time_doubles() -> None:
    # the GPU takes 6 ms a step, the host 2 ms: the GPU bounds every step; the other mode
    # doubles the host time (4 ms) and adds 0.2 ms on the GPU
    a = _run(Mode.FULL, 2_000_000, 6_000_000, 100_000, 500_000)
    b = _run(Mode.PIECEWISE, 4_000_000, 6_200_000, 100_000, 500_000)
    rec, got = _worth(a, b)
    assert rec["bound"] == {"host": 0, "gpu": len(a) - 1, "none": 0}
    assert got["host_ns_per_step"] / rec["host_ns_per_step"] == pytest.approx(2.0)
    # the throughput follows the GPU side (6.1 -> 6.3 ms), not the host time (x2)
    assert got["tokens_per_s"] / rec["tokens_per_s"] == pytest.approx(6.1 / 6.3, rel=1e-3)
    assert got["bound"]["gpu"] == len(a) - 1 and not got["no_gpu_timing"]


def test_a_host_time_past_the_gpu_side_bounds_the_step() -> None:
    # 8.5 ms of host time a step (with the 0.5 ms between steps) against 6.3 on the GPU
    a = _run(Mode.FULL, 2_000_000, 6_000_000, 100_000, 500_000)
    b = _run(Mode.PIECEWISE, 8_000_000, 6_200_000, 2_300_000, 500_000)
    rec, got = _worth(a, b)
    assert got["bound"]["host"] == len(a) - 1
    # the host's own time between steps is unknown on A (no step waited on the host):
    # taken as none, the period is the host time alone
    assert rec["between_steps_ns"] is None
    assert got["tokens_per_s"] / rec["tokens_per_s"] == pytest.approx(6.1 / 8.0, rel=1e-3)


def test_a_host_bound_run_moves_with_the_host_time() -> None:
    a = _run(Mode.FULL, 2_000_000, 900_000, 1_500_000, 500_000)
    b = _run(Mode.PIECEWISE, 4_000_000, 1_800_000, 2_600_000, 500_000)
    rec, got = _worth(a, b)
    assert rec["between_steps_ns"] == 500_000 and rec["bound"]["host"] == len(a) - 1
    assert got["tokens_per_s"] / rec["tokens_per_s"] == pytest.approx(2.5 / 4.5, rel=1e-3)


def test_without_device_timing_it_says_so_and_prices_by_the_host() -> None:
    a = _run(Mode.FULL, 2_000_000, 6_000_000, 100_000, 500_000)
    b = _run(Mode.PIECEWISE, 4_000_000, None, 0, 500_000)
    rec, got = _worth(a, b)
    assert got["bound"] == {"host": 0, "gpu": 0, "none": len(a) - 1}
    (row,) = got["no_gpu_timing"]
    assert (row["mode"], row["tokens"], row["steps"]) == ("PIECEWISE", 64, len(a) - 1)
    assert got["period_ns_per_step"] - rec["period_ns_per_step"] == pytest.approx(2_000_000)


def test_the_recorded_throughput_is_the_summarys(chunked: list[Step]) -> None:
    keys, line = steady_keys(chunked), timeline(chunked)
    got = measured([s for s in chunked if s.forward], keys, line, Costs.of(chunked, "c"))
    assert got["tokens_per_s"] == pytest.approx(
        analysis.ratio("steady_tokens_per_second", chunked), rel=1e-12
    )
