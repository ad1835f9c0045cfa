"""One number on every surface: each headline figure of every committed recording, as
``probe report`` prints it (text and ``--json``), as ``probe ab`` of the recording against
itself reads it, as a real Prometheus computes it from the OpenMetrics export after
``promtool tsdb create-blocks-from openmetrics`` (the dashboards' PromQL), and from the
OTLP export decoded with the official protobufs: equal (percentiles within one bucket of
the exported histogram). The probe cost is one figure on every surface: the report's
headline (code evicted where calibrated), the text's, the metrics' PromQL and the
dashboard's first series.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import otlp_receiver
import pytest
from loopback import get_answer
from otlp_receiver import Received, attrs
from prometheus_server import running_prometheus
from recordings import committed

from exporters.base import processes_from_recording
from exporters.metrics import LAUNCH_BUCKETS, METRICS, NAMESPACE, probe_cost_queries, ratio_queries
from exporters.series import instance_id, timelines
from probe.analysis import views as analysis
from probe.reader.recording import Recording

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(600)]


ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = committed()
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
RATIO_OF = {
    "full_hit_rate": "full_hit_rate",
    "decode_full_hit_rate": "decode_full_hit_rate",
    "graph_rate": "graph_rate",
    "cpu_launch_overhead_mean_ns": "cpu_launch_overhead_mean",
    "gpu_idle_share": "gpu_idle_share",
    "host_bound_share": "host_bound_share",
}


def _probe(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "probe", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


class _Reports(dict[str, dict[str, Any]]):
    """Each recording's ``probe report --json``, run when first asked for (a recording that
    fails fails only the tests that ask for it)."""

    def __missing__(self, path: str) -> dict[str, Any]:
        self[path] = rep = json.loads(_probe("report", "--json", path))
        return rep


@pytest.fixture(scope="module")
def reports() -> dict[str, dict[str, Any]]:
    return _Reports()


def _bucket_width(v: float, bounds: tuple[float, ...]) -> float:
    """The width of the exported bucket that holds ``v`` (seconds)."""
    lo = 0.0
    for b in bounds:
        if v <= b:
            return b - lo
        lo = b
    return float("inf")


def test_every_committed_recording_is_covered() -> None:
    assert len(RECORDINGS) >= 5 and "probe/data/default.probe" in RECORDINGS


@pytest.mark.parametrize("path", RECORDINGS)
def test_text_json_and_ab_agree(path: str, reports: dict[str, dict[str, Any]]) -> None:
    rep = reports[path]
    h = rep["headline"]
    # --json: the headline is the report's own figures
    assert h["full_hit_rate"] == rep["hit_rates"]["full_hit_rate"]
    assert h["cpu_launch_overhead_p50_ns"] == rep["phases"]["all"]["cpu_launch_overhead_ns"]["p50"]
    assert h["gpu_idle_share"] == rep["gpu"]["idle_share"] == rep["ratios"]["gpu_idle_share"]
    assert h["cpu_launch_overhead_mean_ns"] == rep["ratios"]["cpu_launch_overhead_mean"]
    # the text prints the same numbers, as it rounds them
    text = _probe("report", path, "--width", "250")
    pct = lambda x: f"{x:.1%}"  # noqa: E731

    def shown(x: float | None, fmt: Any) -> None:
        if x is not None:
            assert fmt(x) in text, (fmt(x), path)

    shown(h["full_hit_rate"], lambda x: f"full hit rate         {pct(x)}")
    shown(h["graph_rate"], lambda x: f"graph rate            {pct(x)}")
    shown(h["decode_full_hit_rate"], lambda x: f"decode FULL hit rate  {pct(x)}")
    shown(h["gpu_idle_share"], lambda x: f"idle share {pct(x)}")
    shown(h["host_bound_share"], lambda x: f"host-bound {pct(x)}")
    shown(h["engine_idle_s"], lambda x: f"{x:,.2f} s in")
    lo = rep["phases"]["all"]["cpu_launch_overhead_ns"]
    assert re.search(
        rf"cpu_launch_overhead\s*│\s*{lo['mean'] / 1e3:,.1f}\s*│\s*{lo['p50'] / 1e3:,.1f}", text
    ), path
    # the probe cost: one figure, the report's headline, the text's and the JSON's
    cost = h["probe_cost_per_step_ns"]
    pc = rep["probe_cost"]
    if cost is None:
        assert pc is None and "probe cost" not in text
    else:
        assert cost == pc["per_step_ns"]
        # the figure that matches the end-to-end cost: code evicted where calibrated
        want = pc["per_step_cold_code_ns"] or pc["per_step_cold_ns"] or pc["per_step_warm_ns"]
        assert cost == want
        bound = "" if pc["per_step_timing"] == "cold_code" else "≥ "
        shown_cost = re.findall(r"probe cost (≥ )?([\d.,]+) µs", text)
        assert shown_cost and {b + v for b, v in shown_cost} == {f"{bound}{cost / 1e3:.1f}"}
    # probe ab of the recording against itself: the same headline per arm, B/A 1
    cmp = json.loads(_probe("ab", "--a", path, "--b", path, "--json"))
    assert cmp["headline"]["A"] == cmp["headline"]["B"] == h
    m = cmp["metrics"]
    assert m["cpu_launch_overhead_ns"]["A"] == h["cpu_launch_overhead_mean_ns"]
    assert m["steady_tokens_per_s"]["A"] == h["steady_tokens_per_s"]
    if h["decode_full_hit_rate"] is not None:
        assert m["decode_full_share"]["A"] == h["decode_full_hit_rate"]
    assert m["steady_tokens_per_s"]["ratio_B_over_A"] == 1.0
    assert cmp["verdict"].startswith("no difference shown")


def test_the_probe_cost_is_one_figure_on_every_surface(tmp_path: Path) -> None:
    """A recording whose calibration has every timing (the current one): the report's
    headline, its JSON figure and its text are the code-evicted figure (the one the
    end-to-end crossover measured), the others named for what they are; the metrics'
    headline PromQL takes the same timing first, and the dashboard's probe cost panel
    draws that query as its first series (test_prometheus_real.py runs it against a real
    Prometheus; the committed recordings' figures are checked below)."""
    from calibrated import calibrated_copy

    from dashboards.generate import COST, DASHBOARDS

    path = str(calibrated_copy(tmp_path / "cal.probe.db"))
    rep = json.loads(_probe("report", "--json", path))
    pc, h = rep["probe_cost"], rep["headline"]
    assert pc["per_step_timing"] == "cold_code"
    assert h["probe_cost_per_step_ns"] == pc["per_step_ns"] == pc["per_step_cold_code_ns"]
    assert pc["per_step_warm_ns"] < pc["per_step_cold_ns"] < pc["per_step_ns"]
    text = " ".join(_probe("report", path, "--width", "250").replace("│", " ").split())
    head = pc["per_step_ns"] / 1e3
    assert re.findall(r"probe cost ([\d.,]+) µs per step", text) == [f"{head:.1f}"] * 2
    assert f"data evicted {pc['per_step_cold_ns'] / 1e3:.1f} µs" in text
    assert f"hot loop {pc['per_step_warm_ns'] / 1e3:.1f} µs" in text
    assert "µs warm" not in text and not re.search(r"probe cost [\d.]+-[\d.]+", text)
    q = probe_cost_queries()["headline"]
    assert q.index('timing="cold_code"') < q.index('timing="cold"') < q.index('timing="warm"')
    panel = next(
        p for b in DASHBOARDS.values() for p in b()["panels"]
        if p["title"] == "Probe cost per step (calibrated)"
    )  # fmt: skip
    assert panel["targets"][0]["expr"] == COST["headline"]
    assert panel["targets"][0]["legendFormat"].startswith("probe cost ")


# -- OpenMetrics -> promtool -> Prometheus ------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus on the blocks of every committed recording's OpenMetrics export."""
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip("prometheus/promtool are not installed (apt-get install prometheus)")
    d = tmp_path_factory.mktemp("one-number")
    data = d / "data"
    for i, path in enumerate(RECORDINGS):
        om = d / f"{i}.om"
        _probe("export", path, "--openmetrics", str(om))
        out = subprocess.run(
            [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
    (d / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    with running_prometheus(
        d, f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=100y"
    ) as base:
        yield base


def _span(path: str) -> tuple[str, float, float]:
    """The recording's instances as a label matcher, and its first and last sample time."""
    rec = Recording.open(ROOT / path)
    tls = timelines(rec)
    ids = "|".join(instance_id(tl.info) for tl in tls)
    return (
        f'instance=~"{ids}"',
        min(tl.ticks[0] for tl in tls) / 1e9,
        max(tl.ticks[-1] for tl in tls) / 1e9,
    )


def _query(base: str, expr: str, t: float) -> list[Any]:
    r = get_answer(
        f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{t:.3f}"})
    )
    assert r["status"] == "success", r
    return r["data"]["result"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", RECORDINGS)
def test_prometheus_from_the_openmetrics_export_agrees(
    path: str, prometheus: str, reports: dict[str, dict[str, Any]]
) -> None:
    h = reports[path]["headline"]
    sel, start, end = _span(path)
    window = f"{int(end - start) + 2}s"
    # each ratio's PromQL, its rates over the recording read as the counters' totals at
    # its end (every series starts at 0 on the first tick): rate() extrapolates each
    # instance's series over its own sample range, which differ by a tick between ranks
    queries = {
        n: re.sub(r"rate\(([^\[]+)\[\d+s\]\)", r"(\1)", q)
        for n, q in ratio_queries(window, selector=sel).items()
    }
    for key, name in RATIO_OF.items():
        res = _query(prometheus, queries[name], end)
        if h[key] is None:
            assert not res or res[0]["value"][1] in ("NaN",), (key, res)
            continue
        [r] = res
        got = float(r["value"][1]) / analysis.RATIOS[name].promql_scale
        assert got == pytest.approx(h[key], rel=1e-6, abs=1e-12), (path, key, got, h[key])
    # the median CPU launch overhead: within one bucket of the exported histogram
    q = (
        f"histogram_quantile(0.5, sum by (le) (increase({NAMESPACE}_cpu_launch_overhead_"
        f'seconds_bucket{{steady="true", {sel}}}[{window}])))'
    )
    [r] = _query(prometheus, q, end)
    p50 = h["cpu_launch_overhead_p50_ns"] / 1e9
    assert abs(float(r["value"][1]) - p50) <= _bucket_width(p50, LAUNCH_BUCKETS), (path, r, p50)
    # engine idle: the counter at the end
    res = _query(prometheus, f"sum({NAMESPACE}_engine_idle_seconds_total{{{sel}}})", end)
    got = float(res[0]["value"][1]) if res else 0.0
    assert got == pytest.approx(h["engine_idle_s"], rel=1e-6, abs=1e-9), path
    # the probe cost per steady step, where the recording has a calibration: the one figure
    cost_q = probe_cost_queries(window, by="job", selector=sel)["headline"]
    res = _query(prometheus, re.sub(r"rate\(([^\[]+)\[\d+s\]\)", r"(\1)", cost_q), end)
    if h["probe_cost_per_step_ns"] is None:
        assert not res
    else:
        assert float(res[0]["value"][1]) * 1e9 == pytest.approx(
            h["probe_cost_per_step_ns"], rel=1e-6
        )


# -- OTLP, decoded with the official protobufs ------------------------------------------------


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Received]]:
    with otlp_receiver.http_receiver() as r:
        yield r


def _last_points(got: Received, instances: set[str]) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Per metric name, the points of the last export of each of ``instances``."""
    last: dict[str, tuple[int, Any]] = {}
    for req in got.metrics:
        for rm in req.resource_metrics:
            inst = attrs(rm.resource.attributes).get("service.instance.id")
            if inst not in instances:
                continue
            t = max(
                (p.time_unix_nano for sm in rm.scope_metrics for m in sm.metrics
                 for p in getattr(m, m.WhichOneof("data")).data_points),
                default=0,
            )  # fmt: skip
            if inst not in last or t >= last[inst][0]:
                last[inst] = (t, rm)
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    for _, rm in last.values():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in getattr(m, m.WhichOneof("data")).data_points:
                    out.setdefault(m.name, []).append((attrs(p.attributes), p))
    return out


def _matches(labels: dict[str, Any], matcher: str) -> bool:
    for part in filter(None, (x.strip() for x in matcher.split(","))):
        k, op, v = re.match(r'(\w+)(=~|=)"(.*)"', part).groups()  # type: ignore[union-attr]
        have = str(labels.get(k, ""))
        if (op == "=" and have != v) or (op == "=~" and not re.fullmatch(v, have)):
            return False
    return True


def _term(points: dict[str, list[tuple[dict[str, Any], Any]]], t: Any) -> float:
    name = f"{NAMESPACE}_{t.series}"
    field = None
    for suffix in ("_sum", "_count"):
        if name.endswith(suffix) and name.removesuffix(suffix) in METRICS:
            name, field = name.removesuffix(suffix), suffix[1:]
    otel = METRICS[name].otel_name
    matcher = ", ".join(x for x in (t.matcher, 'steady="true"' if t.steady else "") if x)
    total = 0.0
    for labels, p in points.get(otel, []):
        if _matches(labels, matcher):
            total += float(getattr(p, field) if field else p.as_double or p.as_int)
    return t.sign * total


def _otlp_quantile(points: dict[str, list[tuple[dict[str, Any], Any]]], q: float) -> float:
    """histogram_quantile over the steady CPU launch overhead histograms' buckets."""
    otel = METRICS[f"{NAMESPACE}_cpu_launch_overhead_seconds"].otel_name
    counts = [0] * (len(LAUNCH_BUCKETS) + 1)
    for labels, p in points[otel]:
        if labels.get("steady") == "true":
            assert tuple(p.explicit_bounds) == LAUNCH_BUCKETS
            counts = [a + b for a, b in zip(counts, p.bucket_counts, strict=True)]
    rank = q * sum(counts)
    cum = 0
    lo = 0.0
    for b, c in zip(LAUNCH_BUCKETS, counts, strict=False):
        if cum + c >= rank:
            return lo + (b - lo) * (rank - cum) / c
        cum += c
        lo = b
    return LAUNCH_BUCKETS[-1]


def test_otlp_export_decoded_agrees(
    http_receiver: tuple[str, Received],
    reports: dict[str, dict[str, Any]],
) -> None:
    from exporters.otlp import write

    url, got = http_receiver
    for path in RECORDINGS:
        rec = Recording.open(ROOT / path)
        w = write(rec, url)
        assert w.spans_failed == 0 and w.metric_exports_failed == 0
        h = reports[path]["headline"]
        ids = {instance_id(i) for i in processes_from_recording(rec)}
        points = _last_points(got, ids)
        for key, name in RATIO_OF.items():
            r = analysis.RATIOS[name]
            num = sum(_term(points, t) for t in r.numerator)
            den = sum(_term(points, t) for t in r.denominator)
            if h[key] is None:
                assert den == 0, (path, key)
                continue
            got_v = num / den / r.promql_scale
            assert got_v == pytest.approx(h[key], rel=1e-6, abs=1e-12), (path, key, got_v, h[key])
        p50 = h["cpu_launch_overhead_p50_ns"] / 1e9
        assert abs(_otlp_quantile(points, 0.5) - p50) <= _bucket_width(p50, LAUNCH_BUCKETS)
        idle = sum(float(p.as_double) for _, p in points.get(
            METRICS[f"{NAMESPACE}_engine_idle_seconds_total"].otel_name, []))  # fmt: skip
        assert idle == pytest.approx(h["engine_idle_s"], rel=1e-6, abs=1e-9), path
        got.metrics.clear()
        got.traces.clear()
