"""Sustained maximum record rate: bounded memory on both sides, exact drop accounting.

``$PROBE_LOAD_SECONDS`` (default 30) bounds the run; ``docs/reliability.md`` has a longer
manual run (``python tests/reliability_load.py --seconds 600``) and its numbers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reliability_load import LoadResult, run_load

SECONDS = float(os.environ.get("PROBE_LOAD_SECONDS", "30"))
GROWTH_LIMIT_KIB = 16 * 1024


@pytest.fixture(scope="module")
def load() -> LoadResult:
    return run_load(SECONDS)


def test_every_record_is_read_or_counted_as_dropped(load: LoadResult) -> None:
    assert load.calls == load.read + load.dropped
    assert load.written == load.read
    assert load.calls > 100_000 * SECONDS / 10  # it really was a high rate


def test_steps_assembled_match_what_got_through(load: LoadResult) -> None:
    assert load.steps_assembled <= load.steps_written
    if load.dropped == 0:
        assert load.steps_assembled == load.steps_written


def test_writer_memory_is_bounded(load: LoadResult) -> None:
    assert len(load.writer_rss_kib) >= SECONDS // 2
    assert LoadResult.growth(load.writer_rss_kib) < GROWTH_LIMIT_KIB, load.writer_rss_kib


def test_reader_memory_is_bounded_and_polls_return(load: LoadResult) -> None:
    assert len(load.reader_rss_kib) >= SECONDS // 2
    assert load.polls >= SECONDS  # at least one poll per second returns
    assert LoadResult.growth(load.reader_rss_kib) < GROWTH_LIMIT_KIB, load.reader_rss_kib
