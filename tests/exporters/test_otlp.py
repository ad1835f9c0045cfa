"""OTLP export of the real H200 recording, decoded from the real wire format.

Two in-test receivers on loopback decode what the SDK's exporters send: an HTTP server
(``POST /v1/traces`` and ``/v1/metrics``, protobuf bodies) and a gRPC server implementing
``TraceService``/``MetricsService`` from opentelemetry-proto. Both parse
``ExportTraceServiceRequest``/``ExportMetricsServiceRequest`` as an OTel Collector would.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import otlp_receiver
import pytest
from calibrated import calibrated_copy
from otlp_receiver import Received, attrs, value

from exporters.base import AGENT_METRICS, MissingExtra, load_sink, replay
from exporters.metrics import LAUNCH_BUCKETS, NAMESPACE
from exporters.otlp import make_sink
from probe.cli.main import default_recording
from probe.reader.recording import Recording

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Received]]:
    with otlp_receiver.http_receiver() as r:
        yield r


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    with otlp_receiver.grpc_receiver() as r:
        yield r


def _export(endpoint: str, protocol: Any, sampling: float = 1.0) -> int:
    sink = make_sink(endpoint, protocol, sampling=sampling, export_interval_s=60)
    n = replay(Recording.open(default_recording()), sink)
    sink.flush()
    assert sink.spans_failed == 0
    sink.close()
    return n


def _check(got: Received, n_steps: int) -> None:
    spans = got.spans()
    roots = [s for _, s in spans if s.name == "engine_step"]
    assert len(roots) == n_steps == 1305
    root_ids = {s.span_id for s in roots}
    children = [s for _, s in spans if s.name != "engine_step"]
    assert children and all(c.parent_span_id in root_ids for c in children)
    assert {c.name for c in children} >= {
        "execute",
        "prepare_inputs",
        "dispatch",
        "metadata_build",
        "forward_launch",
        "sample",
        "draft",
    }
    # phase children sit inside their step, in epoch time (the clock pair was applied)
    by_id = {s.span_id: s for s in roots}
    for c in children[:500]:
        parent = by_id[c.parent_span_id]
        assert c.trace_id == parent.trace_id
        assert parent.start_time_unix_nano <= c.start_time_unix_nano <= c.end_time_unix_nano
        assert c.end_time_unix_nano <= parent.end_time_unix_nano
    rec = Recording.open(default_recording())
    proc = rec.processes()[0]
    first = min(rec.iter_steps(), key=lambda s: s.t0)
    expected_t0 = first.t0 - proc["boottime_ns"] + proc["epoch_ns"]
    assert min(s.start_time_unix_nano for s in roots) == expected_t0
    a = attrs(
        next(s for s in roots if attrs(s.attributes)["vllm_graph_probe.step"] == 101).attributes
    )
    assert a["vllm_graph_probe.graph.mode"] == "piecewise"
    assert a["vllm_graph_probe.graph.reason"] == "backend_support_too_low"
    assert a["vllm_graph_probe.graph.replayed"] is True
    assert a["vllm_graph_probe.batch.uniform_decode_query_len"] == 2
    assert a["vllm_graph_probe.reorder.changed"] is False
    assert a["vllm_graph_probe.draft.mode"] == "piecewise"
    assert a["vllm_graph_probe.cpu_launch_overhead_ns"] > 0
    res = spans[0][0]
    assert res["process.pid"] == 2947
    assert res["vllm.rank"] == "tp0/pp0/dp0"
    assert res["vllm.version"] == "0.26.0"
    assert res["vllm.runner"] == "mrv2"
    assert res["vllm.model_name"].endswith("tinyv32")
    assert res["host.name"] == "vm"

    points = got.metric_points()
    assert {
        "vllm_graph_probe_steps",
        "vllm_graph_probe_decode_steps",
        "vllm_graph_probe_cpu_launch_overhead_seconds",
        "vllm_graph_probe_phase_host_seconds",
        "vllm_graph_probe_gpu_idle_before_step_seconds",
        "vllm_graph_probe_engine_info",
    } <= set(points)
    steps = points["vllm_graph_probe_steps"][-1]
    assert steps.WhichOneof("data") == "sum" and steps.sum.is_monotonic
    counts: dict[tuple[str, str], int] = {}
    for p in steps.sum.data_points:  # steady and warm-up series (the `steady` label)
        key = (attrs(p.attributes)["mode"], attrs(p.attributes)["reason"])
        counts[key] = counts.get(key, 0) + value(p)
    assert counts[("piecewise", "backend_support_too_low")] == 1291
    launch = points["vllm_graph_probe_cpu_launch_overhead_seconds"][-1]
    # explicit buckets, the Prometheus path's bounds (the Collector keeps `_bucket{le}`)
    assert launch.WhichOneof("data") == "histogram"
    assert launch.unit == "s"
    dps = [p for p in launch.histogram.data_points if attrs(p.attributes)["mode"] == "piecewise"]
    assert sum(p.count for p in dps) == 1292
    dp = next(p for p in dps if attrs(p.attributes)["steady"] == "true")
    assert dp.count == 1290
    assert list(dp.explicit_bounds) == list(LAUNCH_BUCKETS)
    assert sum(dp.bucket_counts) == dp.count
    assert 1e-3 < dp.min < dp.max
    phases = points["vllm_graph_probe_phase_host_seconds"][-1]
    assert phases.WhichOneof("data") == "histogram"
    assert {attrs(p.attributes)["phase"] for p in phases.histogram.data_points} >= {
        "prepare_inputs",
        "forward_launch",
        "sync_stall",
    }


def test_otlp_http_real_wire_format(http_receiver: tuple[str, Received]) -> None:
    url, got = http_receiver
    _check(got, _export(url, "http/protobuf"))


def test_otlp_grpc_real_wire_format(grpc_receiver: tuple[str, Received]) -> None:
    target, got = grpc_receiver
    _check(got, _export(target, "grpc"))


def test_sampling_keeps_whole_steps(http_receiver: tuple[str, Received]) -> None:
    url, got = http_receiver
    _export(url, "http/protobuf", sampling=0.25)
    spans = got.spans()
    roots = {s.span_id for _, s in spans if s.name == "engine_step"}
    assert 150 < len(roots) < 500  # 1305 x 0.25, trace-id ratio sampling
    assert all(s.parent_span_id in roots for _, s in spans if s.name != "engine_step")


def test_missing_extra_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import -> ImportError
    monkeypatch.delitem(sys.modules, "exporters.prometheus", raising=False)
    with pytest.raises(MissingExtra) as exc:
        load_sink("prometheus")
    assert "pip install 'vllm-graph-probe[prometheus]'" in str(exc.value)
    assert exc.value.missing == "prometheus_client"
    assert isinstance(exc.value, ImportError)


def test_missing_extra_through_the_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from probe.cli.main import main

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    monkeypatch.delitem(sys.modules, "exporters.otlp", raising=False)
    assert main(["export", "--otlp", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'vllm-graph-probe[otlp]'" in err


def test_exponential_histograms_on_request(http_receiver: tuple[str, Received]) -> None:
    url, got = http_receiver
    sink = make_sink(url, export_interval_s=60, histograms="exponential")
    replay(Recording.open(default_recording()), sink)
    sink.flush()
    sink.close()
    launch = got.metric_points()["vllm_graph_probe_cpu_launch_overhead_seconds"][-1]
    assert launch.WhichOneof("data") == "exponential_histogram"


# -- through a Collector: the Prometheus translation ---------------------------------------
#
# The OpenTelemetry Collector's Prometheus exporters name series with
# pkg/translator/prometheus (opentelemetry-collector-contrib, normalize_name.go,
# BuildCompliantName with suffixes on, the default): split the name on non-alphanumerics;
# append the unit's Prometheus word (unitMap: s -> seconds, By -> bytes, 1 -> nothing ...)
# unless it is blank, in {braces}, or already a token; append "total" to monotonic sums
# (moving an existing "total" last); append "ratio" to gauges of unit "1"; join with "_".
# A histogram is exposed as <name>_bucket{le}, _sum, _count (explicit buckets only; an
# exponential one becomes a native histogram without them). Data-point attributes become
# labels (non-alphanumerics -> "_"); resource service.name -> job and service.instance.id
# -> instance.

_UNIT_WORDS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "m": "meters", "1": "",
    "%": "percent",
}  # fmt: skip


def _tokens(s: str) -> list[str]:
    return [t for t in re.split(r"[^0-9A-Za-z]+", s) if t]


def collector_name(metric: Any) -> str:
    """The Prometheus name the Collector's exporter gives one OTLP metric (see above)."""
    kind = metric.WhichOneof("data")
    tokens = _tokens(metric.name)
    main, _, per = metric.unit.partition("/")
    main = main.strip()
    if main and "{" not in main and "}" not in main:
        word = "_".join(_tokens(_UNIT_WORDS.get(main, main)))
        if word and word not in tokens:
            tokens.append(word)
    if per.strip() and "{" not in per:
        tokens += ["per", per.strip()]
    if kind == "sum" and metric.sum.is_monotonic:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if metric.unit == "1" and kind == "gauge":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    return "_".join(tokens)


def collector_series(got: Received) -> dict[str, list[dict[str, Any]]]:
    """Every Prometheus series name the Collector would expose, with its label sets."""
    out: dict[str, list[dict[str, Any]]] = {}
    for req in got.metrics:
        for rm in req.resource_metrics:
            res = attrs(rm.resource.attributes)
            target = {"job": res["service.name"], "instance": res["service.instance.id"]}
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    name = collector_name(m)
                    kind = m.WhichOneof("data")
                    pts = getattr(m, kind).data_points
                    names = (
                        [f"{name}_bucket", f"{name}_sum", f"{name}_count"]
                        if kind == "histogram"
                        else [name]
                    )
                    for p in pts:
                        labels = {
                            re.sub(r"[^0-9A-Za-z_]", "_", k): v
                            for k, v in attrs(p.attributes).items()
                        }
                        for n in names:
                            out.setdefault(n, []).append({**target, **labels})
    return out


def test_collector_translation_rules_on_known_cases() -> None:
    """The rules above reproduce the translator's documented examples (its README)."""
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    def metric(name: str, unit: str, kind: str, monotonic: bool = False) -> Any:
        m = metrics_pb2.Metric(name=name, unit=unit)
        getattr(m, kind).data_points.add()
        if kind == "sum":
            m.sum.is_monotonic = monotonic
        return m

    assert collector_name(metric("system.filesystem.usage", "By", "gauge")) == (
        "system_filesystem_usage_bytes"
    )
    assert collector_name(metric("system.network.dropped", "{packets}", "gauge")) == (
        "system_network_dropped"
    )
    assert collector_name(metric("system.memory.utilization", "1", "gauge")) == (
        "system_memory_utilization_ratio"
    )
    assert collector_name(metric("system.processes.created", "", "sum", True)) == (
        "system_processes_created_total"
    )
    assert collector_name(metric("http.server.duration", "s", "histogram")) == (
        "http_server_duration_seconds"
    )


def _written(url: str, path: Path | None = None) -> Any:
    from exporters.otlp import write

    w = write(Recording.open(path or default_recording()), url)
    assert w.spans_failed == 0 and w.metric_exports_failed == 0
    return w


def test_every_dashboard_metric_survives_the_collector(
    http_receiver: tuple[str, Received], tmp_path: Path
) -> None:
    """A recording written over OTLP, decoded with the official protobufs and named as
    the Collector's Prometheus exporter names it: exactly the Prometheus path's series,
    and every metric any dashboard queries among them, with the dashboards' labels."""
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    import dashboards.generate as gen
    from exporters.metrics import LIVE_ONLY, METRICS

    url, got = http_receiver
    # calibrated, so the probe's own cost (two metrics) goes through the Collector too
    _written(url, calibrated_copy(tmp_path / "calibrated.probe.db"))
    series = collector_series(got)

    def exposed(m: Any) -> set[str]:
        return (
            {f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count"}
            if m.kind == "histogram"
            else {m.name}
        )

    # what was sent: exactly the Prometheus path's names (no `_ratio`, no missing `_total`)
    sent = {m.name for req in got.metrics for rm in req.resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics}  # fmt: skip
    by_otel = {m.otel_name: m for m in METRICS.values()}
    assert set(series) == set().union(*(exposed(by_otel[n]) for n in sent))
    # a metric this recording has no point for (no FULL decode step: decode_full_steps)
    # is named by the same rules from its definition, as the sink would send it
    translated = set()
    for m in METRICS.values():
        kind = {"counter": "sum", "histogram": "histogram", "gauge": "gauge"}[m.kind]
        pm = metrics_pb2.Metric(name=m.otel_name, unit=m.unit)
        getattr(pm, kind).data_points.add()
        if kind == "sum":
            pm.sum.is_monotonic = True
        assert collector_name(pm) == m.name, (m.otel_name, m.unit)
        translated |= exposed(m)
    # one worker: no rank is ever last, so the rank series are not sent
    ranks = {m.otel_name for m in METRICS.values() if m.name.startswith(f"{NAMESPACE}_rank_")}
    assert not sent & ranks
    assert len(sent) >= len(METRICS) - 1 - len(ranks) - len(LIVE_ONLY)
    queried = {
        name
        for build in gen.DASHBOARDS.values()
        for _, expr in gen.queries(build())
        for name in gen.metric_names(expr)
    } - {a[0] for a in AGENT_METRICS}  # probe agent's own /metrics: "No probe agent" here
    assert queried and queried <= translated, sorted(queried - translated)
    unsent = {"vllm_graph_probe_decode_full_steps_total"} | {
        f"{n}_bucket" if METRICS[n].kind == "histogram" else n
        for n in METRICS
        if n.startswith(f"{NAMESPACE}_rank_")
    }
    assert queried - unsent <= set(series)
    for name, label_sets in series.items():
        base = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
        m = METRICS[base if base in METRICS else name]
        for labels in label_sets:
            assert set(m.all_labels) <= set(labels), (name, labels)
            assert labels["job"] == "vllm-graph-probe"
    # explicit buckets with the Prometheus path's bounds
    for req in got.metrics:
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for om in sm.metrics:
                    if om.WhichOneof("data") == "histogram":
                        m = METRICS[om.name]
                        for p in om.histogram.data_points:
                            assert tuple(p.explicit_bounds) == m.buckets


def test_replayed_points_carry_the_recordings_time(http_receiver: tuple[str, Received]) -> None:
    from exporters.series import timelines

    url, got = http_receiver
    w = _written(url)
    [tl] = timelines(Recording.open(default_recording()))
    assert w.metric_exports == len(tl.ticks)
    times = set()
    steps_at_end = 0.0
    for req in got.metrics:
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in getattr(m, m.WhichOneof("data")).data_points:
                        times.add(p.time_unix_nano)
                        if m.name == "vllm_graph_probe_steps" and p.time_unix_nano == tl.ticks[-1]:
                            steps_at_end += p.as_int or p.as_double
    assert times == set(tl.ticks)
    # the spans are at the recording's time too: points and spans overlap
    roots = [s for _, s in got.spans() if s.name == "engine_step"]
    assert min(tl.ticks) <= max(s.end_time_unix_nano for s in roots) <= max(tl.ticks)
    n = sum(1 for s in Recording.open(default_recording()).iter_steps() if s.forward)
    assert steps_at_end == n


def test_service_instance_id_is_stable_per_process(http_receiver: tuple[str, Received]) -> None:
    from exporters.base import processes_from_recording
    from exporters.series import instance_id

    url, got = http_receiver
    _written(url)
    _written(url)
    ids = {
        attrs(rm.resource.attributes)["service.instance.id"]
        for req in got.metrics
        for rm in req.resource_metrics
    }
    ids |= {res["service.instance.id"] for res, _ in got.spans()}
    [info] = processes_from_recording(Recording.open(default_recording()))
    assert ids == {instance_id(info)}


def test_live_labels_fixed_at_the_first_step_and_last_values_pushed_when_a_process_ends(
    http_receiver: tuple[str, Received],
) -> None:
    """``probe agent`` over OTLP: facts known before a process's first step (no snapshot
    yet: no model) make no series; the first step's facts label every point, a model name
    arriving later splits nothing; ``finished(pid)`` pushes the process's last values
    (the periodic export is a minute away here) and drops it."""
    import dataclasses

    from exporters.base import processes_from_recording

    url, got = http_receiver
    rec = Recording.open(default_recording())
    [info] = processes_from_recording(rec)
    steps = list(rec.iter_steps(info.pid))[:120]
    sink = make_sink(url, export_interval_s=60)
    sink.process(dataclasses.replace(info, model="", vllm_version=""))
    sink.steps(info, steps[:60], [])
    sink.steps(dataclasses.replace(info, model="renamed-later"), steps[60:], [])
    sink.finished(info.pid)
    assert not sink._procs
    sink.flush()
    points = got.metric_points()["vllm_graph_probe_steps"]
    last: dict[tuple[tuple[str, Any], ...], float] = {}
    for m in points:
        for p in m.sum.data_points:
            last[tuple(sorted(attrs(p.attributes).items()))] = p.as_double or p.as_int
    assert last and all(dict(k)["model_name"] == info.model for k in last)
    assert sum(last.values()) == sum(1 for s in steps if s.forward)
    sink.close()
