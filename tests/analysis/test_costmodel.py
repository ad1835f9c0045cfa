"""The host-time cost model (probe.analysis.costmodel) on the committed real recordings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from statistics import fmean

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.analysis import views as analysis
from probe.analysis.costmodel import Costs, Point, leave_one_shape_out, predict, steady_keys
from probe.reader.recording import Recording
from probe.records import Mode
from probe.step import Step

ROOT = Path(__file__).resolve().parents[2]
CHUNKED = ROOT / "tests/data/chunked_mrv2_k1.probe.db"
SERVE = ROOT / "tests/data/serve-tp2.probe.db"


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
