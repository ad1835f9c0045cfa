"""Shared by the microbenchmarks (run as scripts from the repo root)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def per_call(fn: Callable[[], Any], n: int, rounds: int = 15) -> float:
    """Median over ``rounds`` of the mean ns per call of ``n`` back-to-back calls."""
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(samples)
