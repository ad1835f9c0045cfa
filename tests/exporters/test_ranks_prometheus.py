"""The ranks panels against a real Prometheus: the H200 TP=2 recording's two workers fed
through the sink (its streaming matcher pairs their steps) twice, a scrape apart, so a
ratio of rates is the ratio of the recording's sums; the panels' queries then give the
figures ``probe report`` gives (``probe.analysis.ranks``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback import wait_for
from prometheus_server import PROMETHEUS, concrete, prometheus_server, query

from dashboards.generate import DASHBOARDS
from dashboards.render_recording import RANK_PANELS
from exporters.base import replay
from exporters.prometheus import ServingSink
from probe.analysis.ranks_columns import ranks_of_recording
from probe.reader.recording import Recording

TP2 = Path(__file__).resolve().parents[2] / "tests/data/serve-tp2.probe"
LAST = "vllm_graph_probe_rank_last_steps_total"


def _total(base: str) -> float:
    res = query(base, f"sum({LAST})")["data"]["result"]
    return float(res[0]["value"][1]) if res else 0.0


@pytest.fixture(scope="module")
def twice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus)")
    sink = ServingSink("127.0.0.1", 0)
    try:
        with prometheus_server(tmp_path_factory.mktemp("prom"), [f"127.0.0.1:{sink.port}"]) as b:
            replay(Recording.open(TP2), sink)
            wait_for(lambda: _total(b) == 1193, 20, "the first export to be scraped")
            replay(Recording.open(TP2), sink)
            wait_for(lambda: _total(b) == 2 * 1193, 20, "the second export to be scraped")
            yield b
    finally:
        sink.close()


def _panel(title: str) -> list[str]:
    for build in DASHBOARDS.values():
        for p in build()["panels"]:
            if p["title"] == title:
                return [t["expr"] for t in p["targets"]]
    raise KeyError(title)


def test_last_rank_share_panel_is_the_reports_share(twice: str) -> None:
    (e,) = ranks_of_recording(Recording.open(TP2)).engines
    named = sum(r.last for r in e.ranks)
    want = {(str(r.rank.tp_rank), phase): n / named for r in e.ranks for phase, n in r.phases}
    (expr,) = _panel(RANK_PANELS[0])
    r = query(twice, concrete(expr).replace("[1m]", "[5m]"))
    assert r["status"] == "success"
    got = {
        (x["metric"]["tp_rank"], x["metric"]["phase"]): float(x["value"][1])
        for x in r["data"]["result"]
    }
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-9), k
    assert sum(got.values()) == pytest.approx(1.0)


def test_skew_panel_has_both_ranks(twice: str) -> None:
    for expr in _panel(RANK_PANELS[1]):
        r = query(twice, concrete(expr).replace("[1m]", "[5m]"))
        assert r["status"] == "success"
        ranks = {x["metric"]["tp_rank"]: float(x["value"][1]) for x in r["data"]["result"]}
        assert set(ranks) == {"0", "1"}, json.dumps(r["data"])
        # the quantiles interpolate within the explicit buckets: a step period's lead
        assert all(5e-3 < v <= 0.05 for v in ranks.values()), ranks
