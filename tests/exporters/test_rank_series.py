"""The ranks-side-by-side series both live sinks (Prometheus, OTLP) send, computed by one
:class:`exporters.metrics.RankSeries`: fed the H200 TP=2 recording's two workers in turns,
as a live sink meets them, its updates count the report's last rank per rank
(:func:`probe.analysis.ranks_columns.ranks_of_recording`)."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

from exporters.base import ProcessInfo, processes_from_recording
from exporters.metrics import NAMESPACE, RankSeries, Update
from probe.analysis.ranks_columns import ranks_of_recording
from probe.reader.recording import Recording

TP2 = Path(__file__).resolve().parents[2] / "tests/data/serve-tp2.probe"


def _fed(rec: Recording, series: RankSeries, batch: int = 256) -> list[Update]:
    infos = {i.pid: i for i in processes_from_recording(rec)}
    out: list[Update] = []
    its = {pid: rec.iter_steps(pid) for pid in infos}
    while its:
        for pid, it in list(its.items()):
            chunk = list(itertools.islice(it, batch))
            out += series.updates(infos[pid], chunk, infos.__getitem__)
            if len(chunk) < batch:
                del its[pid]
    return out


def test_the_rank_series_count_the_reports_last_rank() -> None:
    rec = Recording.open(TP2)
    got = _fed(rec, RankSeries())
    [engine] = ranks_of_recording(rec).engines
    last: Counter[int] = Counter()
    skews = []
    for u in got:
        if u.metric == f"{NAMESPACE}_rank_last_steps_total":
            last[int(u.labels["pid"])] += int(u.value)
        else:
            assert u.metric == f"{NAMESPACE}_rank_skew_seconds"
            skews.append(u.value)
    assert {r.rank.pid: r.last for r in engine.ranks if r.last} == dict(last)
    assert sum(last.values()) == len(skews) == engine.matched - engine.within_uncertainty > 0
    assert max(skews) * 1e9 == engine.skew_max_ns


def test_a_process_that_is_no_worker_has_no_rank_series() -> None:
    rec = Recording.open(TP2)
    series = RankSeries()
    info = processes_from_recording(rec)[0]
    api = ProcessInfo(pid=info.pid, role="api_server")
    assert list(series.updates(api, list(rec.iter_steps(info.pid)), lambda p: api)) == []
    assert series.matcher is None
