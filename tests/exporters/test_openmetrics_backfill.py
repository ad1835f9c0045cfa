"""The bundled recording charted over its own time: OpenMetrics -> promtool -> Prometheus.

``probe export --openmetrics`` writes the recording; the real ``promtool tsdb
create-blocks-from openmetrics`` (Debian prometheus 2.42) turns it into blocks; a real
Prometheus started on those blocks (no scraping) answers every dashboard query over the
recording's time range, as Grafana sends it (a range query per panel, the label-values
API for variables): each returns data. Each ratio, an instant query at the recording's
end over a window that holds it whole, equals ``probe report``'s number.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from calibrated import CALIBRATION, calibrated_copy
from loopback import get_answer
from prometheus_server import LABEL_VALUES, PROMETHEUS, running_prometheus

from dashboards.generate import DASHBOARDS, queries
from dashboards.render_recording import RANK_PANELS
from exporters.metrics import probe_cost_queries, ratio_queries
from exporters.series import timelines
from probe.analysis import views as analysis
from probe.analysis.cost import TIMINGS, cost_per_step_ns
from probe.reader.recording import Recording, default_recording

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(180)]

PROMTOOL = shutil.which("promtool")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float, float]]:
    """(Prometheus URL, first and last sample time in s) of the backfilled recording."""
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip("prometheus/promtool are not installed (apt-get install prometheus)")
    d = tmp_path_factory.mktemp("backfill")
    om = d / "run.om"
    # the bundled recording as an engine that calibrated the probe at attach writes it
    # (the same steps; the probe cost panel has data too)
    cal = calibrated_copy(d / "calibrated.probe.db")
    # the user's first command, as they would type it
    out = subprocess.run(
        [sys.executable, "-m", "probe", "export", str(cal), "--openmetrics", str(om)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert om.read_text().endswith("# EOF\n")
    # the second: promtool's backfill
    data = d / "data"
    out = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert any(p.is_dir() and (p / "meta.json").exists() for p in data.iterdir()), out.stdout
    (d / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    [tl] = timelines(Recording.open(default_recording()))
    with running_prometheus(
        d, f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=100y"
    ) as base:
        yield base, tl.ticks[0] / 1e9, tl.ticks[-1] / 1e9


def _concrete(expr: str, rate_interval: str) -> str:
    """A dashboard query as Grafana sends it with every variable at "All"."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__range", "1h")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def _range(base: str, expr: str, start: float, end: float) -> dict[str, Any]:
    lv = LABEL_VALUES.match(expr)
    if lv:
        q = {"match[]": lv[1], "start": f"{start:.3f}", "end": f"{end:.3f}"}
        return get_answer(f"{base}/api/v1/label/{lv[2]}/values?" + urllib.parse.urlencode(q))  # type: ignore[no-any-return]
    q = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"}
    return get_answer(f"{base}/api/v1/query_range?" + urllib.parse.urlencode(q))  # type: ignore[no-any-return]


# panels of the agent's own series (restarts, processes attached): a replay has none
AGENT_ONLY = ("Engine restarts", "Processes attached")

ALL = [(f, where, expr) for f, build in DASHBOARDS.items() for where, expr in queries(build())]


def test_the_blocks_hold_the_recordings_steps(backfilled: tuple[str, float, float]) -> None:
    base, _, end = backfilled
    q = {"query": "sum(vllm_graph_probe_steps_total)", "time": f"{end:.3f}"}
    r = get_answer(f"{base}/api/v1/query?" + urllib.parse.urlencode(q))
    steps = Recording.open(default_recording()).iter_steps()
    assert float(r["data"]["result"][0]["value"][1]) == sum(1 for s in steps if s.forward)


@pytest.mark.parametrize(("dash", "where", "expr"), ALL, ids=[f"{f}:{w}" for f, w, _ in ALL])
def test_every_dashboard_query_has_data_over_the_recording(
    backfilled: tuple[str, float, float], dash: str, where: str, expr: str
) -> None:
    base, start, end = backfilled
    r = _range(base, _concrete(expr, "5s"), start, end)
    assert r["status"] == "success", r
    data = r["data"]
    if isinstance(data, list):  # label values
        assert data, (where, expr)
        return
    points = [v for series in data["result"] for _, v in series["values"]]
    if any(where.startswith(f"panel {t!r}") for t in RANK_PANELS):
        assert not points, (where, expr)  # one worker: no rank is ever last
        return
    if any(where.startswith(f"panel {t!r}") for t in AGENT_ONLY):
        assert not points, (where, expr)  # a recording has no agent: its own series only
        return
    assert points, (where, expr)


def _report() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "probe", "report", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _reported(rep: dict[str, Any], name: str) -> float:
    """``probe report --json``'s value of one ratio of probe.analysis.views.RATIOS, over every
    forward step (its ``ratios`` block: what the dashboards compute; the report's own
    timings and verdict are over steady-state steps only)."""
    if name not in rep["ratios"]:
        raise AssertionError(f"probe report --json has no ratio {name}")
    return float(rep["ratios"][name])


def test_every_ratio_equals_the_reports(backfilled: tuple[str, float, float]) -> None:
    """Each ratio's PromQL (the dashboards' text), at the recording's end over a window
    that holds the whole recording, against ``probe report --json``."""
    base, start, end = backfilled
    window = f"{int(end - start) + 2}s"
    rep = _report()
    steps = list(Recording.open(default_recording()).iter_steps())
    checked = []
    for name, expr in ratio_queries(window).items():
        q = {"query": expr, "time": f"{end:.3f}"}
        r = get_answer(f"{base}/api/v1/query?" + urllib.parse.urlencode(q))
        assert r["status"] == "success", r
        [res] = r["data"]["result"]
        got = float(res["value"][1]) / analysis.RATIOS[name].promql_scale
        want = _reported(rep, name)
        assert want == pytest.approx(analysis.ratio(name, steps), rel=1e-9)
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12), (name, got, want)
        checked.append(name)
    assert sorted(checked) == sorted(analysis.RATIOS)


def test_the_probe_cost_over_the_recording(backfilled: tuple[str, float, float]) -> None:
    """The probe cost per step by each timing, its PromQL at the recording's end over a
    window that holds it whole: every forward step's hooked calls at the calibration's
    cost per call, as ``probe.analysis.cost`` counts them."""
    base, start, end = backfilled
    window = f"{int(end - start) + 2}s"
    rec = Recording.open(default_recording())
    # the steady-state steps, as the report and the PromQL (steady="true") take them
    steps = [s for s in rec.iter_steps() if s.forward]
    steady = analysis.is_steady(steps)
    steps = [s for s, ok in zip(steps, steady, strict=True) if ok]
    [snap] = [p["snapshot"] for p in rec.processes() if p["snapshot"]]
    cal = analysis.calibration_of({**snap, "probe": {"calibration": dict(CALIBRATION)}})
    assert cal is not None
    flags = (cal["launch_is_replay"], cal["v1_launch_is_replay"], cal["dispatch_in_phase"])
    calls = [analysis.hooked_calls(s, *flags) for s in steps]
    for name, expr in probe_cost_queries(window).items():
        # the headline: code evicted, which this calibration has (the report's one figure)
        timing = "cold_code" if name == "headline" else name
        q = {"query": expr, "time": f"{end:.3f}"}
        r = get_answer(f"{base}/api/v1/query?" + urllib.parse.urlencode(q))
        assert r["status"] == "success", r
        [res] = r["data"]["result"]
        want = sum(
            cost_per_step_ns(dict(CALIBRATION), a, b, TIMINGS[timing]) for a, b in calls
        ) / len(steps)
        assert float(res["value"][1]) * 1e9 == pytest.approx(want, rel=1e-6), timing
