"""Ranks side by side over a recording's ``steps`` columns: the figures
:func:`probe.analysis.ranks.engine_ranks` computes from Steps, read from each rank's
validated columns (:func:`probe.reader.recording_columns.iter_step_columns`) instead, a
window of matched steps at a time. The matching is the one
:mod:`probe.analysis.ranks_match` does for both (:func:`probe.analysis.ranks.engine_figures`):
this module only supplies the columns.

    >>> from probe.reader.recording import Recording, default_recording
    >>> ranks_of_recording(Recording.open(default_recording())).engines  # one worker: none
    ()

Memory: per rank, at most two chunks of the dozen columns matching reads; per matched
step that names a last rank, one skew figure (8 bytes, for exact percentiles).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from probe.analysis import ranks_match
from probe.analysis.ranks import (
    ALIGN_WINDOW,
    DEFAULT_EPOCH_SYNC_NS,
    RANKS_CHUNK_ROWS,
    DpRank,
    EngineRanks,
    RankInput,
    RanksSummary,
    StepRanks,
    dp_costs,
    engine_figures,
    matching,
    per_step,
    recording_ranks,
)

__all__ = [
    "RANKS_CHUNK_ROWS",
    "engine_ranks_of_columns",
    "per_step_of_columns",
    "ranks_of_recording",
]


def recording_chunks(rec: Any, pid: int, chunk: int) -> Iterator[dict[str, np.ndarray]]:
    """The columns matching reads (:data:`probe.analysis.ranks_match.READ`, and where a
    launch time or device timing is missing) of one rank of a recording, ``chunk`` rows
    at a time."""
    from probe.reader.recording_columns import iter_step_columns
    from probe.reader.recording_rows import NULL_BITS

    launch, idle = NULL_BITS["cpu_launch_overhead_ns"], NULL_BITS["gpu_idle_before_ns"]
    for cols in iter_step_columns(rec, pid, chunk, only=ranks_match.READ):
        out = {k: cols[k] for k in ranks_match.READ}
        nulls = cols["_nulls"]
        # 1 where NULL, as int64 (the matrix matching holds)
        out[ranks_match.NO_LAUNCH] = (nulls >> launch) & 1
        out[ranks_match.NO_IDLE] = (nulls >> idle) & 1
        yield out


def engine_ranks_of_columns(
    rec: Any,
    ranks: Sequence[RankInput],
    *,
    epoch_sync_ns: int = DEFAULT_EPOCH_SYNC_NS,
    sync_launch: bool = False,
    chunk: int = RANKS_CHUNK_ROWS,
) -> EngineRanks:
    """:func:`probe.analysis.ranks.engine_ranks` of ``ranks`` (their ``steps`` unused: each
    rank's are read from ``rec``'s columns by pid), equal to it field for field."""
    read = max(chunk, ALIGN_WINDOW)
    mt = matching(
        ranks,
        [recording_chunks(rec, r.rank.pid, read) for r in ranks],
        epoch_sync_ns=epoch_sync_ns,
        sync_launch=sync_launch,
    )
    return engine_figures(ranks, mt, chunk)


def per_step_of_columns(
    rec: Any,
    ranks: Sequence[RankInput],
    *,
    epoch_sync_ns: int = DEFAULT_EPOCH_SYNC_NS,
    sync_launch: bool = False,
    chunk: int = RANKS_CHUNK_ROWS,
) -> tuple[Iterator[StepRanks], dict[str, Any]]:
    """:func:`probe.analysis.ranks.per_step` of ``ranks`` (their ``steps`` unused: each
    rank's are read from ``rec``'s columns by pid), equal to it step for step."""
    read = max(chunk, ALIGN_WINDOW)
    return per_step(
        ranks,
        epoch_sync_ns=epoch_sync_ns,
        sync_launch=sync_launch,
        chunk=chunk,
        chunks=[recording_chunks(rec, r.rank.pid, read) for r in ranks],
    )


def dp_rank_of_columns(rec: Any, r: RankInput) -> DpRank:
    """:func:`probe.analysis.ranks.dp_rank` of ``r``, from ``rec``'s columns of its pid."""
    from probe.reader.recording_columns import iter_step_columns, null_mask

    def chunks() -> Iterator[dict[str, np.ndarray]]:
        for cols in iter_step_columns(rec, r.rank.pid):
            gpu = np.where(null_mask(cols, "gpu_busy_ns"), 0, cols["gpu_busy_ns"])
            yield {**cols, "gpu_busy_ns": gpu}

    return dp_costs(r, chunks())


def ranks_of_recording(rec: Any, *, epoch_sync_ns: int = DEFAULT_EPOCH_SYNC_NS) -> RanksSummary:
    """A :class:`probe.reader.recording.Recording`'s workers side by side: one engine per
    data-parallel rank, ranks in (pp, tp) order, all on the recording's host;
    ``sync_launch`` where the workers run on the CPU platform. With several data-parallel
    ranks, each rank's data-parallel costs too. Equal to
    :func:`probe.analysis.ranks.ranks_summary` over the recording's Steps."""
    rr = recording_ranks(rec)
    engines = tuple(
        engine_ranks_of_columns(rec, e, epoch_sync_ns=epoch_sync_ns, sync_launch=rr.sync_launch)
        for e in rr.engines
    )
    dp = (
        tuple(dp_rank_of_columns(rec, r) for e in rr.by_dp.values() for r in e)
        if len(rr.by_dp) > 1
        else ()
    )
    return RanksSummary(engines, dp)
