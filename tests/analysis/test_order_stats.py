"""Exact order statistics in bounded memory: the same values a whole sorted array gives,
whether the values stay in memory or go to a temporary file."""

from __future__ import annotations

import numpy as np
import pytest

from probe.analysis.order_stats import Values, order_stats, percentile


def _whole(parts: list[np.ndarray], q: float) -> float | None:
    xs = np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    if len(xs) == 0:
        return None
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = int(np.floor(pos)), int(np.ceil(pos))
    a, b = int(xs[lo]), int(xs[hi])
    return float(a + (b - a) * (pos - lo))


CASES = {
    "uniform": lambda g, n: g.integers(0, 10**9, n),
    "wide, both signs": lambda g, n: g.integers(-(2**62), 2**62, n),
    "few distinct": lambda g, n: g.integers(0, 3, n),
    "one value": lambda g, n: np.full(n, 123_456, np.int64),
    "heavy tail": lambda g, n: (g.pareto(1.1, n) * 1e4).astype(np.int64),
    "extremes": lambda g, n: g.choice(np.array([-(2**63), 2**63 - 1, 0, -1, 1], np.int64), n),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("held", [5, 64, 10_000_000])  # spilled often, spilled, held
def test_percentiles_are_those_of_the_sorted_whole(case: str, held: int) -> None:
    g = np.random.default_rng(len(case) * 7 + held)
    parts = [np.asarray(CASES[case](g, int(g.integers(0, 300))), np.int64) for _ in range(7)]
    sets = [Values(held=held) for _ in range(3)]
    for i, p in enumerate(parts):
        sets[i % 3].add(p)
    assert (held < 100) == any(v.file is not None for v in sets)
    for q in (0, 1, 50, 90, 99, 99.9, 100):
        assert percentile(sets, q) == _whole(parts, q), q
    whole = np.sort(np.concatenate(parts))
    ranks = [0, len(whole) // 3, len(whole) - 1]
    assert order_stats(sets, ranks) == [int(whole[r]) for r in ranks]
    assert percentile([sets[0]], 50) == _whole(parts[0::3], 50)
    for v in sets:
        v.close()


def test_none_and_a_rank_out_of_range() -> None:
    v = Values(held=2)
    assert percentile([v], 50) is None
    v.add(np.array([4, 1, 3], np.int64))
    with pytest.raises(IndexError):
        order_stats([v], [3])
