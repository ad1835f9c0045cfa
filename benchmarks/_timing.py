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


def evictor(mb: int = 64) -> Callable[[], None]:
    """A call that evicts the caches the way an engine's own host work does between two
    hooked calls: ``mb`` MB of memory touched and some torch code run (in-engine each
    hooked call runs cold; a back-to-back loop keeps everything hot). Without torch (an
    interpreter it is not installed for) the memory alone, and a little Python."""
    import numpy as np

    big = np.ones(mb * 1024 * 1024 // 8)
    try:
        import torch
    except ImportError:
        torch = None

    def evict() -> None:
        big.sum()
        if torch is None:
            sum(range(2000))
            return
        for _ in range(50):
            torch.ones(8) + 1

    return evict


def median_ns(
    fn: Callable[[], Any],
    n: int,
    evict: Callable[[], None] | None = None,
    every: int = 0,
    between: Callable[[], Any] | None = None,
) -> float:
    """Median ns of ``n`` single calls of ``fn`` on CLOCK_BOOTTIME, each after
    ``evict()`` when given (:func:`evictor`); ``between()`` after every ``every`` calls,
    untimed (to keep a ring from filling, say)."""
    clk = time.clock_gettime_ns
    boot = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
    ts = []
    for i in range(n):
        if evict is not None:
            evict()
        t0 = clk(boot)
        fn()
        ts.append(clk(boot) - t0)
        if between is not None and every and i % every == every - 1:
            between()
    return statistics.median(ts)
