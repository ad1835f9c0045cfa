"""OpenTelemetry exporter: a span per engine step with phase children, and the metric
set of :mod:`exporters.metrics`, pushed over OTLP (HTTP/protobuf or gRPC).

One tracer and meter provider per vLLM process, each with its own resource (``host.name``,
``process.pid``, ``vllm.rank``, ``vllm.model_name``, ``vllm.version``, ``vllm.runner``...);
nothing is installed as the global OpenTelemetry provider. Step and phase times are
CLOCK_BOOTTIME in the rings and are converted to Unix epoch with the process's clock pair
(its hello record). Spans are sampled per step (``sampling``: 1.0 keeps every step; a
sampled step keeps all its phases). Histograms have the explicit buckets of the
Prometheus path (``histograms="exponential"`` for base-2 exponential ones, which the
Collector turns into Prometheus native histograms: no ``_bucket`` series then)::

    >>> from exporters.otlp import make_sink
    >>> sink = make_sink("http://127.0.0.1:4318", sampling=0.1)  # doctest: +SKIP
    >>> sink = make_sink("127.0.0.1:4317", protocol="grpc")       # doctest: +SKIP

A finished recording goes through :func:`write` (``probe export --otlp``): spans as
above, and the metric points of :mod:`exporters.series`, stamped with the recording's
own time (one export per second of the recording), not the export's.

The OTLP metric names are the Prometheus names without ``_total``, with units the
Collector's Prometheus translation adds no suffix for; through its Prometheus exporter
they come back as the series the dashboards query (``job`` = ``service.name``,
``instance`` = ``service.instance.id``, stable per process: :func:`exporters.series.instance_id`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
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
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    HistogramDataPoint,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.metrics.export import Metric as MetricData
from opentelemetry.sdk.metrics.view import (
    Aggregation,
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
    View,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from exporters.base import FIXED, ExportSink, GpuSample, ProcessInfo
from exporters.metrics import METRICS, RankSeries, Update, process_labels, process_updates
from exporters.metrics_columns import step_updates
from exporters.series import (
    DEFAULT_INTERVAL_S,
    Hist,
    Key,
    Timeline,
    instance_id,
    recording_ticks,
)
from probe.analysis.steady import Classes
from probe.progress import SILENT, Progress
from probe.reader.recording import Recording
from probe.reader.recording_batches import StepBatch
from probe.reader.recording_rows import NULL_BITS
from probe.records import Flag, Mode, Phase, Reason
from probe.step import STEP_COLUMNS, Step

log = logging.getLogger("probe")

Protocol_ = Literal["http/protobuf", "grpc"]
Histograms = Literal["explicit", "exponential"]
SERVICE = "vllm-graph-probe"
SCOPE = "vllm_graph_probe"
ATTR = "vllm_graph_probe"


def _boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def resource_for(info: ProcessInfo) -> Resource:
    """The OTel resource of one vLLM process."""
    attrs: dict[str, Any] = {
        "service.name": SERVICE,
        "service.instance.id": instance_id(info),
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


_PHASES = list(Phase.__members__.values())
RUNNERS = next(c.choices for c in STEP_COLUMNS if c.name == "runner")
_MODE_NAMES = {int(m): m.name.lower() for m in Mode}
_REASON_LABELS = {int(r): r.label for r in Reason}


def step_attributes_of_columns(batch: StepBatch) -> Iterator[dict[str, Any]]:
    """:func:`step_attributes` of each step of a column batch (its reorders those of
    ``batch.details["reorders"]``), the same keys, values and types."""
    c = batch.steps
    nulls = c["_nulls"]
    no_launch = ((nulls >> NULL_BITS["cpu_launch_overhead_ns"]) & 1).astype(bool).tolist()
    runners = [RUNNERS[i] if i >= 0 else None for i in c["runner"].tolist()]
    ro = batch.details["reorders"]
    first: dict[int, int] = {}
    for k, r in enumerate(ro["row"].tolist()):
        first.setdefault(r, k)
    changed = np.zeros(len(batch), bool)
    np.logical_or.at(changed, ro["row"], ro["changed"] != 0)
    moved = np.zeros(len(batch), np.int64)
    np.add.at(moved, ro["row"], ro["moved"])
    cols = {k: c[k].tolist() for k in (
        "step", "mode", "reason", "replayed", "pieces", "num_tokens", "num_reqs",
        "padded_tokens", "padded_reqs", "max_query_len", "uniform",
        "uniform_decode_query_len", "host_ns", "cpu_launch_overhead_ns", "draft_mode",
        "draft_reason", "draft_replays",
    )}  # fmt: skip
    thr, nd, spec = ro["threshold"].tolist(), ro["num_decodes"].tolist(), ro["spec_as_decode"]
    spec = (spec != 0).tolist()
    changed_l, moved_l = changed.tolist(), moved.tolist()
    for j in range(len(batch)):
        mode = cols["mode"][j]
        a: dict[str, Any] = {
            f"{ATTR}.step": cols["step"][j],
            f"{ATTR}.runner": runners[j],
            f"{ATTR}.graph.mode": _MODE_NAMES[mode] if mode >= 0 else "no_forward",
            f"{ATTR}.graph.reason": _REASON_LABELS.get(cols["reason"][j], "unknown"),
            f"{ATTR}.graph.replayed": bool(cols["replayed"][j]),
            f"{ATTR}.graph.pieces": cols["pieces"][j],
            f"{ATTR}.batch.num_tokens": cols["num_tokens"][j],
            f"{ATTR}.batch.num_reqs": cols["num_reqs"][j],
            f"{ATTR}.batch.padded_tokens": cols["padded_tokens"][j],
            f"{ATTR}.batch.padded_reqs": cols["padded_reqs"][j],
            f"{ATTR}.batch.max_query_len": cols["max_query_len"][j],
            f"{ATTR}.batch.uniform": bool(cols["uniform"][j]),
            f"{ATTR}.batch.uniform_decode_query_len": cols["uniform_decode_query_len"][j],
            f"{ATTR}.host_ns": cols["host_ns"][j],
        }
        if not no_launch[j]:
            a[f"{ATTR}.cpu_launch_overhead_ns"] = cols["cpu_launch_overhead_ns"][j]
        dm = cols["draft_mode"][j]
        if dm >= 0:
            a[f"{ATTR}.draft.mode"] = _MODE_NAMES[dm]
            a[f"{ATTR}.draft.reason"] = _REASON_LABELS.get(cols["draft_reason"][j], "unknown")
            a[f"{ATTR}.draft.replays"] = cols["draft_replays"][j]
        r = first.get(j)
        if r is not None:
            a[f"{ATTR}.reorder.changed"] = changed_l[j]
            a[f"{ATTR}.reorder.moved"] = moved_l[j]
            a[f"{ATTR}.reorder.threshold"] = thr[r]
            a[f"{ATTR}.reorder.num_decodes"] = nd[r]
            a[f"{ATTR}.reorder.spec_as_decode"] = spec[r]
        yield a


class Deadline:
    """The ``--timeout`` of one export, on every network call: a call (connect, send,
    the SDK's retries) that has not returned within ``timeout_s`` counts as failed and
    the endpoint as gone, and nothing more is sent to it. A server that trickles its
    answer a byte at a time defeats a socket's read timeout; this bound it does not:
    the call runs in a daemon thread and is waited for, at most, ``timeout_s``. The
    time spent waiting on an endpoint that does not answer is so at most ``timeout_s``.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.gone = False

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        """``(True, fn(...))``; ``(False, None)`` when it raised, overran, or the
        endpoint is gone already."""
        if self.gone:
            return False, None
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = fn(*args, **kwargs)
            except Exception as exc:  # the SDK's own failure: counted, not raised
                box["error"] = exc

        t = threading.Thread(target=run, name="probe-otlp-call", daemon=True)
        t.start()
        t.join(self.timeout_s)
        if t.is_alive():
            self.gone = True
            return False, None
        return ("result" in box), box.get("result")


class CountingSpanExporter(SpanExporter):
    """Wraps a span exporter and counts what it exported and what failed; with a
    :class:`Deadline`, no call waits past it."""

    def __init__(self, inner: SpanExporter, deadline: Deadline | None = None) -> None:
        self.inner = inner
        self.deadline = deadline
        self.exported = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.deadline is None:
            result = self.inner.export(spans)
        else:
            ok, result = self.deadline.call(self.inner.export, spans)
            result = result if ok else SpanExportResult.FAILURE
        if result == SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        if self.deadline is None:
            self.inner.shutdown()
        else:
            self.deadline.call(self.inner.shutdown)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self.deadline is None:
            return self.inner.force_flush(timeout_millis)
        ok, result = self.deadline.call(self.inner.force_flush, timeout_millis)
        return bool(ok and result)


@dataclass
class _Proc:
    info: ProcessInfo
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    tracer: trace.Tracer
    instruments: dict[str, Any]
    offset_ns: int  # epoch - boottime
    first: ProcessInfo  # the facts its labels were made from


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
        histograms: Histograms = "explicit",
        metrics: bool = True,
        deadline: Deadline | None = None,
    ) -> None:
        super().__init__()
        #: every span export waits at most this (None: the SDK's own timeouts only)
        self.deadline = deadline
        if not 0.0 <= sampling <= 1.0:
            raise ValueError(f"sampling must be within 0..1, got {sampling}")
        if histograms not in ("explicit", "exponential"):
            raise ValueError(f"histograms must be 'explicit' or 'exponential', got {histograms!r}")
        self.histograms = histograms
        #: False: spans only (a replay sends its metric points itself, see :func:`write`)
        self.metrics = metrics
        self.sampling = sampling
        self.export_interval_s = export_interval_s
        self._span_exporter = span_exporter
        self._metric_exporter = metric_exporter
        self._boottime = boottime_ns
        self._epoch = epoch_ns
        self._procs: dict[int, _Proc] = {}
        self._ranks = RankSeries()
        self._pending: dict[int, ProcessInfo] = {}
        self._classes = Classes()  # the steady/warm-up split and engine idle, per rank
        self.span_exporters: list[CountingSpanExporter] = []

    def sampled(self, every: int) -> None:
        """As :meth:`exporters.prometheus.PrometheusSink.sampled`."""
        self._classes.sample_every = every

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
        counting = CountingSpanExporter(self._span_exporter(), self.deadline)
        self.span_exporters.append(counting)
        tp.add_span_processor(BatchSpanProcessor(counting, max_queue_size=1 << 16))
        readers = (
            [
                PeriodicExportingMetricReader(
                    self._metric_exporter(), export_interval_millis=self.export_interval_s * 1000
                )
            ]
            if self.metrics
            else []
        )
        mp = MeterProvider(resource=resource, metric_readers=readers, views=self._views())
        meter = mp.get_meter(SCOPE)
        instruments: dict[str, Any] = {}
        for m in METRICS.values():
            if m.kind == "counter":
                instruments[m.name] = meter.create_counter(m.otel_name, m.unit, m.help)
            elif m.kind == "histogram":
                instruments[m.name] = meter.create_histogram(m.otel_name, m.unit, m.help)
            else:
                instruments[m.name] = meter.create_gauge(m.otel_name, m.unit, m.help)
        p = _Proc(info, tp, mp, tp.get_tracer(SCOPE), instruments, offset, info)
        self._procs[info.pid] = p
        if self.metrics:
            for u in process_updates(info, None):
                self._apply(p, u)
        return p

    def _views(self) -> list[View]:
        views = []
        for m in METRICS.values():
            if m.kind != "histogram":
                continue
            agg: Aggregation = (
                ExplicitBucketHistogramAggregation(boundaries=m.buckets)
                if self.histograms == "explicit"
                else ExponentialBucketHistogramAggregation(max_size=160, max_scale=20)
            )
            views.append(
                View(instrument_type=Histogram, instrument_name=m.otel_name, aggregation=agg)
            )
        return views

    def _apply(self, p: _Proc, u: Update) -> None:
        inst = p.instruments[u.metric]
        kind = METRICS[u.metric].kind
        if kind == "counter":
            inst.add(u.value, dict(u.labels))
        elif kind == "histogram":
            inst.record(u.value, dict(u.labels))
        else:
            inst.set(u.value, dict(u.labels))

    def _fixed(self, info: ProcessInfo) -> ProcessInfo:
        """``info`` with the label facts its process had when its metrics began (a fact
        that arrives later never splits a series: exporters.base.FIXED)."""
        p = self._procs.get(info.pid)
        if p is None:
            return info
        return dataclasses.replace(info, **{k: getattr(p.first, k) for k in FIXED})

    def finished(self, pid: int) -> None:
        """Push ``pid``'s last values and drop everything of it (a process that ended:
        a reader that runs for days keeps no providers of processes long gone)."""
        p = self._procs.pop(pid, None)
        self._pending.pop(pid, None)
        if p is not None:
            p.tracer_provider.shutdown()
            p.meter_provider.shutdown()

    def process(self, info: ProcessInfo) -> None:
        known = self._procs.get(info.pid)
        if known is None and not info.vllm_version and not info.model:
            # live, before the snapshot: its facts (the labels) come with the first step
            self._pending[info.pid] = info
            return
        previous = known.info if known is not None else None
        info = self._fixed(info)
        p = self._proc(info)
        if previous is not None and self.metrics:
            for u in process_updates(info, previous):
                self._apply(p, u)

    def steps(self, info: ProcessInfo, steps: Sequence[Step], gpu: Sequence[GpuSample]) -> None:
        self._pending.pop(info.pid, None)
        info = self._fixed(info)
        p = self._proc(info)
        if self.metrics:
            # the updates a metric at a time (the arrays exporters.metrics.updates makes
            # its Updates of), each value to its instrument in turn
            base = process_labels(info)
            for c in step_updates(info, steps, gpu, self._classes):
                inst = p.instruments[c.metric]
                add = inst.add if METRICS[c.metric].kind == "counter" else inst.record
                labels: dict[int, dict[str, str]] = {}
                for code, v in zip(c.codes.tolist(), c.values.tolist(), strict=True):
                    attrs = labels.get(code)
                    if attrs is None:
                        attrs = labels[code] = {**base, **c.labels(code)}
                    add(v, dict(attrs))
            # on the last rank's resource
            for u in self._ranks.updates(info, steps, lambda pid: self._procs[pid].info):
                self._apply(self._procs[int(u.labels["pid"])], u)
        for s in steps:
            self._span(p, s)

    def step_columns(self, info: ProcessInfo, batch: StepBatch) -> None:
        """:meth:`steps` of a batch of ``info``'s steps given as columns, spans only (a
        sink made with ``metrics=False``, as :func:`write` makes it): the same spans, the
        same attributes (:func:`step_attributes_of_columns`)."""
        if self.metrics:
            raise TypeError("step_columns: a sink of spans only (metrics=False)")
        self._pending.pop(info.pid, None)
        p = self._proc(self._fixed(info))
        off = p.offset_ns
        sp = batch.details["spans"]
        # each step's spans in start order (a stable sort: as sorted() sorts a step's)
        order = np.lexsort((sp["t0_ns"], sp["row"]))
        rows, t0s, t1s = sp["row"][order], sp["t0_ns"][order], sp["t1_ns"][order]
        phases, drafter = sp["phase"][order].tolist(), (sp["drafter"][order] != 0).tolist()
        at = np.searchsorted(rows, np.arange(len(batch) + 1)).tolist()
        t0s, t1s = t0s.tolist(), t1s.tolist()
        cols = batch.steps
        starts, ends = cols["t0_ns"].tolist(), cols["t1_ns"].tolist()
        for j, attrs in enumerate(step_attributes_of_columns(batch)):
            root = p.tracer.start_span("engine_step", start_time=starts[j] + off, attributes=attrs)
            if root.is_recording():
                ctx = trace.set_span_in_context(root)
                for k in range(at[j], at[j + 1]):
                    ph = _PHASES[phases[k]]
                    name = ph.name.lower()
                    child = p.tracer.start_span(
                        name,
                        context=ctx,
                        start_time=t0s[k] + off,
                        attributes={
                            f"{ATTR}.phase": name,
                            f"{ATTR}.drafter": drafter[k],
                            # not stored: a recording's EXECUTE span reads 0 tokens
                            **({f"{ATTR}.batch.num_tokens": 0} if ph == Phase.EXECUTE else {}),
                        },
                    )
                    child.end(end_time=t1s[k] + off)
            root.end(end_time=ends[j] + off)

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
    histograms: Histograms = "explicit",
    metrics: bool = True,
) -> OtlpSink:
    """An OTLP sink. ``endpoint``: ``http://host:4318`` (HTTP; ``/v1/traces`` and
    ``/v1/metrics`` are appended) or ``host:4317`` (gRPC, plaintext unless ``https://``).
    ``metrics=False``: spans only.
    """
    if protocol == "http/protobuf":

        def spans() -> SpanExporter:
            return HttpSpanExporter(
                endpoint=_http_url(endpoint, "traces"), headers=headers, timeout=timeout_s
            )

        def metric_exporter() -> MetricExporter:
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

        def metric_exporter() -> MetricExporter:
            return GrpcMetricExporter(
                endpoint=target, insecure=not secure, headers=headers, timeout=timeout_s
            )

    else:
        raise ValueError(f"protocol must be 'http/protobuf' or 'grpc', got {protocol!r}")
    return OtlpSink(
        spans,
        metric_exporter,
        sampling=sampling,
        export_interval_s=export_interval_s,
        histograms=histograms,
        metrics=metrics,
        deadline=Deadline(timeout_s),
    )


# -- a finished recording, at its own time ----------------------------------------------------


def _point(m_name: str, attrs: dict[str, str], start: int, t: int, v: float | Hist) -> Any:
    if isinstance(v, Hist):
        return HistogramDataPoint(
            attributes=attrs,
            start_time_unix_nano=start,
            time_unix_nano=t,
            count=v.count,
            sum=v.sum,
            bucket_counts=list(v.counts),
            explicit_bounds=list(v.bounds),
            # an empty histogram has neither (proto3 optional: left unset)
            min=v.min,  # type: ignore[arg-type]
            max=v.max,  # type: ignore[arg-type]
            exemplars=[],
        )
    return NumberDataPoint(
        attributes=attrs, start_time_unix_nano=start, time_unix_nano=t, value=v, exemplars=[]
    )


def metrics_data(tl: Timeline, i: int) -> MetricsData:
    """The cumulative metric points of one process at its ``i``-th sample time, as the
    SDK's OTLP exporters take them: every point stamped ``tl.ticks[i]``, counting from
    ``tl.start_ns``."""
    state = {k: values[i] for k, values in tl.series.items()}
    return metrics_at(tl.info, tl.start_ns, tl.ticks[i], state)


def metrics_at(
    info: ProcessInfo, start: int, t: int, state: Mapping[Key, float | Hist]
) -> MetricsData:
    """The cumulative metric points of one process's series ``state`` at time ``t``
    (epoch ns), counting from ``start``."""
    points: dict[str, list[Any]] = {}
    for (name, pairs), v in state.items():
        points.setdefault(name, []).append(_point(name, dict(pairs), start, t, v))
    out = []
    for name, pts in points.items():
        m = METRICS[name]
        data: Any
        if m.kind == "counter":
            data = Sum(pts, AggregationTemporality.CUMULATIVE, is_monotonic=True)
        elif m.kind == "histogram":
            data = HistogramData(pts, AggregationTemporality.CUMULATIVE)
        else:
            data = Gauge(pts)
        out.append(MetricData(name=m.otel_name, description=m.help, unit=m.unit, data=data))
    scope = InstrumentationScope(SCOPE)
    return MetricsData([ResourceMetrics(resource_for(info), [ScopeMetrics(scope, out, "")], "")])


@dataclass(frozen=True)
class Written:
    """What :func:`write` sent: steps replayed, spans exported and failed, metric
    exports (one per sample time per process) sent and failed."""

    steps: int
    spans_exported: int
    spans_failed: int
    metric_exports: int
    metric_exports_failed: int


def write(
    recording: Recording,
    target: str,
    protocol: Protocol_ = "http/protobuf",
    *,
    sampling: float = 1.0,
    timeout_s: float = 10.0,
    interval_s: float = DEFAULT_INTERVAL_S,
    headers: dict[str, str] | None = None,
    progress: Progress = SILENT,
) -> Written:
    """Send a finished recording to the OTLP endpoint ``target``: its steps as spans
    (at their own times), and its metrics as cumulative points every ``interval_s`` of
    the recording's own time (:mod:`exporters.series`), with explicit buckets.
    ``progress`` gets two stages: the spans' steps, then the steps of the metric samples
    (each process's samples sent as they are computed)."""
    from exporters.metrics_columns import replay_columns

    sink = make_sink(
        target, protocol, sampling=sampling, timeout_s=timeout_s, headers=headers, metrics=False
    )
    # spans read from column batches: each step's spans and reorders
    n = replay_columns(recording, sink, progress=progress, tables=("spans", "reorders"))
    sink.flush(int(timeout_s * 1000))
    sent = failed = 0
    deadline = sink.deadline or Deadline(timeout_s)
    exporter = sink._metric_exporter()
    try:
        # each process's samples as they are computed (exporters.series.recording_ticks):
        # memory holds a window of events, not the recording's timelines
        ticks = recording_ticks(
            recording, interval_s, progress=progress, stage="sending metric samples"
        )
        for tk in ticks:
            for tick, state in tk:
                sent += 1
                if failed:  # the endpoint is gone: do not wait out a timeout per sample
                    failed += 1
                    continue
                done, ok = deadline.call(
                    exporter.export,
                    metrics_at(tk.info, tk.start_ns, tick, state),
                    timeout_millis=timeout_s * 1000,
                )
                failed += not done or ok != MetricExportResult.SUCCESS
    finally:
        deadline.call(exporter.shutdown)
        sink.close()
    return Written(n, sink.spans_exported, sink.spans_failed, sent, failed)
