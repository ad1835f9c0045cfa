"""Capture sizes for a set of batch sizes: the padding they cost, and the sizes that cost least.

A batch of ``t`` tokens replays the smallest captured graph of at least ``t`` tokens and
pads the rest; a batch above the largest size runs without a graph. :func:`padding_of`
counts the padded tokens of a mix of batches (token count -> steps) under some sizes;
:func:`suggest_capture_sizes` finds, exactly, at most N sizes that minimise it, keeping the
largest size so that no batch that fits a graph now stops fitting.

    >>> from probe.analysis.capture_sizes import padding_of, suggest_capture_sizes
    >>> padding_of({3: 5, 7: 2, 100: 1}, [4, 8, 128])
    35
    >>> suggest_capture_sizes({3: 5, 7: 2, 100: 1}, largest=128, limit=3)
    (7, 100, 128)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["SPLIT_SIZE_FIELDS", "padding_of", "suggest_capture_sizes"]

from probe.calls import SPLIT_SIZE_FIELDS  # vLLM's own names, declared once


def padding_of(tokens: Mapping[int, int], sizes: Sequence[int]) -> int:
    """Padded minus real tokens when each batch (token count -> steps) pads to the next
    size up; batches above the largest size are not counted (they run eager)."""
    ordered = sorted(sizes)
    total = 0
    for t, n in tokens.items():
        up = next((x for x in ordered if x >= t), None)
        if up is not None:
            total += n * (up - t)
    return total


def suggest_capture_sizes(
    tokens: Mapping[int, int], largest: int, limit: int, multiple_of: int = 1
) -> tuple[int, ...]:
    """At most ``limit`` capture sizes, ``largest`` among them (nothing that fits a graph
    now stops fitting), that minimise :func:`padding_of` for batches of these token counts
    (token count -> steps); with ties, the fewest sizes. ``multiple_of``: sizes vLLM
    rounds to (V1 with FULL decode graphs and MTP: 1 + k). Exact: a dynamic programme
    over the candidate sizes (each batch's count, rounded up), O(limit × n²)."""
    import numpy as np

    def up(t: int) -> int:
        return -(-t // multiple_of) * multiple_of

    pts = sorted((t, n) for t, n in tokens.items() if 0 < t <= largest and n > 0)
    cands = sorted({up(t) for t, _ in pts if up(t) < largest})
    t_arr = np.array([t for t, _ in pts], dtype=np.float64)
    n_arr = np.array([n for _, n in pts], dtype=np.float64)
    cw = np.concatenate(([0.0], np.cumsum(n_arr)))
    ct = np.concatenate(([0.0], np.cumsum(n_arr * t_arr)))
    alone = float(largest * cw[-1] - ct[-1])  # every batch padded to ``largest``
    if limit < 2 or not cands:
        return (largest,)
    c = np.array(cands, dtype=np.float64)
    # wj[j], tj[j]: steps and tokens of the batches at or below candidate j
    idx = np.searchsorted(t_arr, c, side="right")
    wj, tj = cw[idx], ct[idx]
    rest = largest * (cw[-1] - wj) - (ct[-1] - tj)  # the batches above j, padded to largest
    n = len(cands)
    # f[j]: the least padding of the batches up to candidate j, with a size at j
    f = c * wj - tj
    totals, back = [f + rest], []
    for _ in range(1, min(limit - 1, n)):  # one more size below ``largest`` per round
        g, arg = np.full(n, np.inf), np.zeros(n, dtype=np.int64)
        for j in range(1, n):
            cost = f[:j] + c[j] * (wj[j] - wj[:j]) - (tj[j] - tj[:j])
            arg[j] = int(np.argmin(cost))
            g[j] = cost[arg[j]]
        f = g
        totals.append(f + rest)
        back.append(arg)
    least = min(float(np.min(x)) for x in totals)
    if alone <= least:
        return (largest,)
    k = next(i for i, x in enumerate(totals) if float(np.min(x)) <= least)
    j = int(np.argmin(totals[k]))
    chosen = [j]
    for level in range(k, 0, -1):
        j = int(back[level - 1][j])
        chosen.append(j)
    return (*sorted(cands[i] for i in chosen), largest)
