"""OTLP export of the real H200 recording, decoded from the real wire format.

Two in-test receivers on loopback decode what the SDK's exporters send: an HTTP server
(``POST /v1/traces`` and ``/v1/metrics``, protobuf bodies) and a gRPC server implementing
``TraceService``/``MetricsService`` from opentelemetry-proto. Both parse
``ExportTraceServiceRequest``/``ExportMetricsServiceRequest`` as an OTel Collector would.
"""

from __future__ import annotations

import gzip
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from exporters.base import MissingExtra, load_sink, replay
from exporters.otlp import make_sink
from probe.cli import default_recording
from probe.recording import Recording

pytestmark = pytest.mark.timeout(120)


class Received:
    def __init__(self) -> None:
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.lock = threading.Lock()

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) for every span received."""
        out = []
        for req in self.traces:
            for rs in req.resource_spans:
                res = _attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    out += [(res, s) for s in ss.spans]
        return out

    def metric_points(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for req in self.metrics:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        out.setdefault(m.name, []).append(m)
        return out


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Received]]:
    got = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            assert self.headers["Content-Type"] == "application/x-protobuf"
            with got.lock:
                if self.path == "/v1/traces":
                    got.traces.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                    reply = trace_service_pb2.ExportTraceServiceResponse()
                elif self.path == "/v1/metrics":
                    got.metrics.append(
                        metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                    )
                    reply = metrics_service_pb2.ExportMetricsServiceResponse()
                else:
                    self.send_error(404)
                    return
            data = reply.SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", got
    server.shutdown()
    server.server_close()


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    got = Received()

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            with got.lock:
                got.traces.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            with got.lock:
                got.metrics.append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", got
    server.stop(grace=None)


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
    first = min(rec.steps(), key=lambda r: r["t0_ns"])
    expected_t0 = first["t0_ns"] - proc["boottime_ns"] + proc["epoch_ns"]
    assert min(s.start_time_unix_nano for s in roots) == expected_t0
    a = _attrs(
        next(s for s in roots if _attrs(s.attributes)["vllm_graph_probe.step"] == 101).attributes
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
    counts = {
        (_attrs(p.attributes)["mode"], _attrs(p.attributes)["reason"]): _value(p)
        for p in steps.sum.data_points
    }
    assert counts[("piecewise", "backend_support_too_low")] == 1291
    launch = points["vllm_graph_probe_cpu_launch_overhead_seconds"][-1]
    assert launch.WhichOneof("data") == "exponential_histogram"
    assert launch.unit == "s"
    dp = next(
        p
        for p in launch.exponential_histogram.data_points
        if _attrs(p.attributes)["mode"] == "piecewise"
    )
    assert dp.count == 1292
    assert sum(dp.positive.bucket_counts) + dp.zero_count == dp.count
    assert 1e-3 < dp.min < dp.max
    phases = points["vllm_graph_probe_phase_host_seconds"][-1]
    assert phases.WhichOneof("data") == "exponential_histogram"
    assert {_attrs(p.attributes)["phase"] for p in phases.exponential_histogram.data_points} >= {
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
    from probe.cli import main

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    monkeypatch.delitem(sys.modules, "exporters.otlp", raising=False)
    assert main(["export", "--otlp", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'vllm-graph-probe[otlp]'" in err
