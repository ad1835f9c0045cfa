"""OpenTelemetry exporter: a span per engine step with phase children, and the metric
set of :mod:`exporters.metrics`, pushed over OTLP (HTTP/protobuf or gRPC).

One tracer and meter provider per vLLM process, each with its own resource (``host.name``,
``process.pid``, ``vllm.rank``, ``vllm.model_name``, ``vllm.version``, ``vllm.runner``...);
nothing is installed as the global OpenTelemetry provider. Step and phase times are
CLOCK_BOOTTIME in the rings and are converted to Unix epoch with the process's clock pair
(its hello record). Spans are sampled per step (``sampling``: 1.0 keeps every step; a
sampled step keeps all its phases). Histograms are base-2 exponential (160 buckets, scale
up to 20): launch overheads are µs to s and their range is not known in advance::

    >>> from exporters.otlp import make_sink
    >>> sink = make_sink("http://127.0.0.1:4318", sampling=0.1)  # doctest: +SKIP
    >>> sink = make_sink("127.0.0.1:4317", protocol="grpc")       # doctest: +SKIP

The OTLP metric names are the Prometheus names without ``_total``; through an OTel
Collector's Prometheus exporter they come back as the same series the dashboards query.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from exporters.base import ExportSink, GpuSample, ProcessInfo
from exporters.metrics import METRICS, Update, process_updates, updates
from probe.records import Flag, Phase
from probe.step import Step

log = logging.getLogger("probe")

Protocol_ = Literal["http/protobuf", "grpc"]
SCOPE = "vllm_graph_probe"
ATTR = "vllm_graph_probe"


def _boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def resource_for(info: ProcessInfo) -> Resource:
    """The OTel resource of one vLLM process."""
    attrs: dict[str, Any] = {
        "service.name": "vllm-graph-probe",
        "host.name": info.host,
        "process.pid": info.pid,
        "vllm.rank": info.rank,
        "vllm.tp_rank": info.tp_rank,
        "vllm.pp_rank": info.pp_rank,
        "vllm.dp_rank": info.dp_rank,
        "vllm.engine": info.engine,
        "vllm.model_name": info.model,
        "vllm.version": info.vllm_version,
        "vllm.runner": info.runner,
        "vllm.platform": info.platform,
        "vllm.role": info.role,
    }
    return Resource.create({k: v for k, v in attrs.items() if v != ""})


def step_attributes(s: Step) -> dict[str, Any]:
    a: dict[str, Any] = {
        f"{ATTR}.step": s.step,
        f"{ATTR}.runner": s.runner,
        f"{ATTR}.graph.mode": s.mode.name.lower() if s.mode is not None else "no_forward",
        f"{ATTR}.graph.reason": s.reason.label if s.reason is not None else "unknown",
        f"{ATTR}.graph.replayed": s.replayed,
        f"{ATTR}.graph.pieces": s.pieces,
        f"{ATTR}.batch.num_tokens": s.num_tokens,
        f"{ATTR}.batch.num_reqs": s.num_reqs,
        f"{ATTR}.batch.padded_tokens": s.padded_tokens,
        f"{ATTR}.batch.padded_reqs": s.padded_reqs,
        f"{ATTR}.batch.max_query_len": s.max_query_len,
        f"{ATTR}.batch.uniform": s.uniform,
        f"{ATTR}.batch.uniform_decode_query_len": s.uniform_decode_query_len,
        f"{ATTR}.host_ns": s.host_ns,
    }
    if s.cpu_launch_overhead_ns is not None:
        a[f"{ATTR}.cpu_launch_overhead_ns"] = s.cpu_launch_overhead_ns
    if s.draft_mode is not None:
        a[f"{ATTR}.draft.mode"] = s.draft_mode.name.lower()
        a[f"{ATTR}.draft.reason"] = s.draft_reason.label if s.draft_reason else "unknown"
        a[f"{ATTR}.draft.replays"] = s.draft_replays
    if s.reorders:
        r = s.reorders[0]
        a[f"{ATTR}.reorder.changed"] = any(o.changed for o in s.reorders)
        a[f"{ATTR}.reorder.moved"] = sum(o.moved for o in s.reorders)
        a[f"{ATTR}.reorder.threshold"] = r.threshold
        a[f"{ATTR}.reorder.num_decodes"] = r.num_decodes
        a[f"{ATTR}.reorder.spec_as_decode"] = r.spec_as_decode
    return a


class CountingSpanExporter(SpanExporter):
    """Wraps a span exporter and counts what it exported and what failed."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.exported = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        if result == SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


@dataclass
class _Proc:
    info: ProcessInfo
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    tracer: trace.Tracer
    instruments: dict[str, Any]
    offset_ns: int  # epoch - boottime


class OtlpSink(ExportSink):
    """Spans and metrics for every process, through the given exporters' factories."""

    def __init__(
        self,
        span_exporter: Callable[[], SpanExporter],
        metric_exporter: Callable[[], MetricExporter],
        *,
        sampling: float = 1.0,
        export_interval_s: float = 10.0,
        boottime_ns: Callable[[], int] = _boottime_ns,
        epoch_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        super().__init__()
        if not 0.0 <= sampling <= 1.0:
            raise ValueError(f"sampling must be within 0..1, got {sampling}")
        self.sampling = sampling
        self.export_interval_s = export_interval_s
        self._span_exporter = span_exporter
        self._metric_exporter = metric_exporter
        self._boottime = boottime_ns
        self._epoch = epoch_ns
        self._procs: dict[int, _Proc] = {}
        self.span_exporters: list[CountingSpanExporter] = []

    def _proc(self, info: ProcessInfo) -> _Proc:
        p = self._procs.get(info.pid)
        if p is not None:
            p.info = info
            return p
        if info.boottime_ns is not None and info.epoch_ns is not None:
            offset = info.epoch_ns - info.boottime_ns
        else:
            # live, same host, no hello yet: this host's clock pair now
            log.warning("probe: pid %d has no clock pair; using the reader's", info.pid)
            offset = self._epoch() - self._boottime()
        resource = resource_for(info)
        tp = TracerProvider(
            resource=resource, sampler=ParentBased(TraceIdRatioBased(self.sampling))
        )
        # a replayed recording arrives all at once: a queue deep enough not to drop spans
        counting = CountingSpanExporter(self._span_exporter())
        self.span_exporters.append(counting)
        tp.add_span_processor(BatchSpanProcessor(counting, max_queue_size=1 << 16))
        reader = PeriodicExportingMetricReader(
            self._metric_exporter(), export_interval_millis=self.export_interval_s * 1000
        )
        mp = MeterProvider(
            resource=resource,
            metric_readers=[reader],
            views=[
                View(
                    instrument_type=Histogram,
                    aggregation=ExponentialBucketHistogramAggregation(max_size=160, max_scale=20),
                )
            ],
        )
        meter = mp.get_meter(SCOPE)
        instruments: dict[str, Any] = {}
        for m in METRICS.values():
            if m.kind == "counter":
                instruments[m.name] = meter.create_counter(m.otel_name, m.unit, m.help)
            elif m.kind == "histogram":
                instruments[m.name] = meter.create_histogram(m.otel_name, m.unit, m.help)
            else:
                instruments[m.name] = meter.create_gauge(m.otel_name, m.unit, m.help)
        p = _Proc(info, tp, mp, tp.get_tracer(SCOPE), instruments, offset)
        self._procs[info.pid] = p
        for u in process_updates(info, None):
            self._apply(p, u)
        return p

    def _apply(self, p: _Proc, u: Update) -> None:
        inst = p.instruments[u.metric]
        kind = METRICS[u.metric].kind
        if kind == "counter":
            inst.add(u.value, dict(u.labels))
        elif kind == "histogram":
            inst.record(u.value, dict(u.labels))
        else:
            inst.set(u.value, dict(u.labels))

    def process(self, info: ProcessInfo) -> None:
        known = self._procs.get(info.pid)
        previous = known.info if known is not None else None
        p = self._proc(info)
        if previous is not None:
            for u in process_updates(info, previous):
                self._apply(p, u)

    def steps(self, info: ProcessInfo, steps: Sequence[Step], gpu: Sequence[GpuSample]) -> None:
        p = self._proc(info)
        for u in updates(info, steps, gpu):
            self._apply(p, u)
        for s in steps:
            self._span(p, s)

    def _span(self, p: _Proc, s: Step) -> None:
        off = p.offset_ns
        root = p.tracer.start_span(
            "engine_step", start_time=s.t0 + off, attributes=step_attributes(s)
        )
        if root.is_recording():
            ctx = trace.set_span_in_context(root)
            for sp in sorted(s.spans, key=lambda x: x.t0):
                child = p.tracer.start_span(
                    sp.phase.name.lower(),
                    context=ctx,
                    start_time=sp.t0 + off,
                    attributes={
                        f"{ATTR}.phase": sp.phase.name.lower(),
                        f"{ATTR}.drafter": bool(sp.flags & Flag.DRAFTER),
                        **(
                            {f"{ATTR}.batch.num_tokens": sp.v0} if sp.phase == Phase.EXECUTE else {}
                        ),
                    },
                )
                child.end(end_time=sp.t1 + off)
        root.end(end_time=s.t1 + off)

    def flush(self, timeout_ms: int = 30_000) -> None:
        for p in self._procs.values():
            p.tracer_provider.force_flush(timeout_ms)
            p.meter_provider.force_flush(timeout_ms)

    @property
    def spans_exported(self) -> int:
        return sum(e.exported for e in self.span_exporters)

    @property
    def spans_failed(self) -> int:
        return sum(e.failed for e in self.span_exporters)

    def close(self) -> None:
        for p in self._procs.values():
            p.tracer_provider.shutdown()
            p.meter_provider.shutdown()
        self._procs.clear()


def _http_url(endpoint: str, signal: str) -> str:
    base = endpoint if "://" in endpoint else f"http://{endpoint}"
    base = base.rstrip("/")
    if base.endswith(("/v1/traces", "/v1/metrics")):
        base = base.rsplit("/v1/", 1)[0]
    return f"{base}/v1/{signal}"


def make_sink(
    endpoint: str,
    protocol: Protocol_ = "http/protobuf",
    *,
    sampling: float = 1.0,
    export_interval_s: float = 10.0,
    headers: dict[str, str] | None = None,
    timeout_s: float = 10.0,
) -> OtlpSink:
    """An OTLP sink. ``endpoint``: ``http://host:4318`` (HTTP; ``/v1/traces`` and
    ``/v1/metrics`` are appended) or ``host:4317`` (gRPC, plaintext unless ``https://``).
    """
    if protocol == "http/protobuf":

        def spans() -> SpanExporter:
            return HttpSpanExporter(
                endpoint=_http_url(endpoint, "traces"), headers=headers, timeout=timeout_s
            )

        def metrics() -> MetricExporter:
            return HttpMetricExporter(
                endpoint=_http_url(endpoint, "metrics"), headers=headers, timeout=timeout_s
            )

    elif protocol == "grpc":
        secure = endpoint.startswith("https://")
        target = endpoint.split("://", 1)[-1].rstrip("/")

        def spans() -> SpanExporter:
            return GrpcSpanExporter(
                endpoint=target, insecure=not secure, headers=headers, timeout=timeout_s
            )

        def metrics() -> MetricExporter:
            return GrpcMetricExporter(
                endpoint=target, insecure=not secure, headers=headers, timeout=timeout_s
            )

    else:
        raise ValueError(f"protocol must be 'http/protobuf' or 'grpc', got {protocol!r}")
    return OtlpSink(spans, metrics, sampling=sampling, export_interval_s=export_interval_s)
