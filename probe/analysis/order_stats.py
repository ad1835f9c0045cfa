"""Exact order statistics of many integers in bounded memory: the values of :class:`Values`
are held to a bound and spilled to a temporary file past it; :func:`order_stats` finds the
values at given ranks of their sorted union exactly, by narrowing a value range over a few
passes (each pass a histogram of the values still in range, a chunk at a time), then sorting
the few left. Percentiles read from them are the ones a whole sorted array gives.

    >>> import numpy as np
    >>> v = Values(held=4)
    >>> v.add(np.array([9, 1, 7, 3, 5, 8, 2], np.int64))
    >>> order_stats([v], [0, 3, 6])
    [1, 5, 9]
    >>> percentile([v], 50)
    5.0
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator, Sequence
from typing import IO

import numpy as np

__all__ = ["HELD", "Values", "order_stats", "percentile"]

HELD = 1 << 20
"""Values held in memory by one :class:`Values` before they go to its temporary file."""

#: values read from a file at a time
_READ = 1 << 20
#: buckets of one narrowing pass
_BUCKETS = 1 << 12
#: the sign bit: int64 order as uint64 order
_FLIP = np.uint64(1 << 63)


class Values:
    """int64 values, held to ``held`` and spilled to a temporary file past it."""

    def __init__(self, held: int | None = None) -> None:
        self.held = HELD if held is None else held
        self.parts: list[np.ndarray] = []
        self.n_held = 0
        self.n = 0
        self.file: IO[bytes] | None = None

    def add(self, a: np.ndarray) -> None:
        if not len(a):
            return
        self.parts.append(np.asarray(a, np.int64).copy())
        self.n_held += len(a)
        self.n += len(a)
        if self.n_held > self.held:
            if self.file is None:
                self.file = tempfile.TemporaryFile(prefix="probe-values-")  # noqa: SIM115
            self.file.seek(0, 2)
            np.concatenate(self.parts).tofile(self.file)
            self.parts, self.n_held = [], 0

    def chunks(self) -> Iterator[np.ndarray]:
        """Every value, a chunk at a time (the file's, then those held)."""
        if self.file is not None:
            self.file.flush()
            self.file.seek(0)
            while True:
                a = np.fromfile(self.file, np.int64, _READ)
                if not len(a):
                    break
                yield a
        yield from self.parts

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        self.parts = []


def _u(a: np.ndarray) -> np.ndarray:
    """int64 values as uint64 in the same order."""
    return a.view(np.uint64) ^ _FLIP


def order_stats(sets: Sequence[Values], ranks: Sequence[int]) -> list[int]:
    """The values at each 0-based rank of the sorted union of ``sets``, exactly."""
    n = sum(v.n for v in sets)
    if any(not 0 <= r < n for r in ranks):
        raise IndexError(f"ranks {list(ranks)} out of 0..{n - 1}")
    if all(v.file is None for v in sets):
        parts = [p for v in sets for p in v.parts]
        xs = np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
        return [int(xs[r]) for r in ranks]
    bound = max(v.held for v in sets)
    # per rank: the value range [lo, hi] (as uint64) holding it, and how many lie below lo
    todo: dict[int, tuple[int, int, int]] = {r: (0, (1 << 64) - 1, 0) for r in set(ranks)}
    found: dict[int, int] = {}
    while todo:
        # one pass: each open range's histogram, or its values where they are few
        hists = {r: np.zeros(_BUCKETS, np.int64) for r in todo}
        inside = dict.fromkeys(todo, 0)
        for v in sets:
            for a in v.chunks():
                u = _u(a)
                for r, (lo, hi, _) in todo.items():
                    sel = u[(u >= np.uint64(lo)) & (u <= np.uint64(hi))]
                    inside[r] += len(sel)
                    width = -(-(hi - lo + 1) // _BUCKETS)
                    b = ((sel - np.uint64(lo)) // np.uint64(width)).astype(np.int64)
                    hists[r] += np.bincount(b, minlength=_BUCKETS)
        for r, (lo, hi, below) in list(todo.items()):
            if inside[r] <= bound or hi - lo < _BUCKETS:
                got = _collect(sets, lo, hi)
                x = np.sort(got)[r - below : r - below + 1] ^ _FLIP
                found[r] = int(x.view(np.int64)[0])
                del todo[r]
                continue
            cum = np.cumsum(hists[r])
            k = int(np.searchsorted(cum, r - below, side="right"))
            width = -(-(hi - lo + 1) // _BUCKETS)
            new_lo = lo + k * width
            todo[r] = (new_lo, min(hi, new_lo + width - 1), below + int(cum[k] - hists[r][k]))
    return [found[r] for r in ranks]


def _collect(sets: Sequence[Values], lo: int, hi: int) -> np.ndarray:
    """The values (as uint64) within [lo, hi]."""
    out = []
    for v in sets:
        for a in v.chunks():
            u = _u(a)
            out.append(u[(u >= np.uint64(lo)) & (u <= np.uint64(hi))])
    return np.concatenate(out) if out else np.zeros(0, np.uint64)


def percentile(sets: Sequence[Values], q: float) -> float | None:
    """The ``q``-th percentile of the union of ``sets`` by linear interpolation between the
    two nearest ranks (:func:`probe.analysis.views.percentile`'s arithmetic); None for
    none."""
    n = sum(v.n for v in sets)
    if n == 0:
        return None
    if n == 1:
        return float(order_stats(sets, [0])[0])
    pos = (n - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    a, b = order_stats(sets, [lo, hi])
    return float(a + (b - a) * (pos - lo))
