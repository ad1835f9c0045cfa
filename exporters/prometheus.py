"""Prometheus exporter: the metric set of :mod:`exporters.metrics` on its own ``/metrics``.

The sink keeps its own :class:`~prometheus_client.CollectorRegistry` (never the global
default one), so it runs beside vLLM's own ``/metrics`` (which lives in the API server
process, on vLLM's port) without a name clash: the probe's endpoint is a second scrape
target, on loopback unless configured otherwise::

    >>> from exporters.prometheus import make_sink
    >>> sink = make_sink("127.0.0.1:0")                 # port 0: any free port
    >>> sink.url.startswith("http://127.0.0.1:")
    True
    >>> sink.close()

With ``probe``'s collector: ``Collector(run_dir, [RecordingSink(w), make_sink(addr)])``.
For a node-exporter textfile instead of a server, :func:`write_textfile`. No
``_created`` series are exposed: prometheus_client stamps them with the time a series
was first touched, which for a replayed recording is the export's time, not the run's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

from exporters.base import ExportSink, GpuSample, ProcessInfo
from exporters.metrics import METRICS, Update, process_updates, updates
from probe.progress import SILENT, Progress
from probe.step import Step
from probe.summary import Classes

DEFAULT_ADDR = "127.0.0.1:9464"


class _WithoutCreated:
    """The metrics of ``inner`` less their ``_created`` samples (prometheus_client's
    switch for that, ``disable_created_metrics()``, is process-global), read under
    ``lock``: the sink applies a batch of steps under it, so a scrape sees every counter of
    a batch or none (a scrape between two of them made a ratio panel read above 1)."""

    def __init__(self, inner: CollectorRegistry, lock: threading.Lock) -> None:
        self.inner = inner
        self.lock = lock

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            fams = list(self.inner.collect())
        for fam in fams:
            fam.samples = [s for s in fam.samples if not s.name.endswith("_created")]
            yield fam


class PrometheusSink(ExportSink):
    """Applies :func:`exporters.metrics.updates` to prometheus_client metrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__()
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        #: what is exposed: ``registry`` without ``_created`` series
        self._lock = threading.Lock()
        self.exposed = CollectorRegistry(auto_describe=False)
        self.exposed.register(_WithoutCreated(self.registry, self._lock))  # type: ignore[arg-type]
        self._known: dict[int, ProcessInfo] = {}
        self._classes = Classes()  # the steady/warm-up split and engine idle, per rank
        self.metrics: dict[str, Any] = {}
        for m in METRICS.values():
            if m.kind == "counter":
                self.metrics[m.name] = Counter(m.name, m.help, m.all_labels, registry=self.registry)
            elif m.kind == "histogram":
                self.metrics[m.name] = Histogram(
                    m.name, m.help, m.all_labels, registry=self.registry, buckets=m.buckets
                )
            else:
                self.metrics[m.name] = Gauge(m.name, m.help, m.all_labels, registry=self.registry)

    def apply(self, u: Update) -> None:
        m = METRICS[u.metric]
        child = self.metrics[u.metric].labels(*(u.labels[k] for k in m.all_labels))
        if m.kind == "counter":
            child.inc(u.value)
        elif m.kind == "histogram":
            child.observe(u.value)
        else:
            child.set(u.value)

    def process(self, info: ProcessInfo) -> None:
        with self._lock:
            for u in process_updates(info, self._known.get(info.pid)):
                self.apply(u)
            self._known[info.pid] = info

    def steps(self, info: ProcessInfo, steps: Sequence[Step], gpu: Sequence[GpuSample]) -> None:
        with self._lock:
            if info.pid not in self._known:
                for u in process_updates(info, None):
                    self.apply(u)
                self._known[info.pid] = info
            for u in updates(info, steps, gpu, self._classes):
                self.apply(u)

    def exposition(self) -> bytes:
        """The current text exposition (what ``/metrics`` serves)."""
        return generate_latest(self.exposed)

    def close(self) -> None:
        pass


class ServingSink(PrometheusSink):
    """A :class:`PrometheusSink` that serves ``/metrics`` on ``host:port`` until closed."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        server, thread = start_http_server(port, addr=host, registry=self.exposed)
        self._server: WSGIServer = server
        self._thread = thread
        self.host = host
        self.port = int(server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (loopback) or ``[v6]:port`` -> (host, port)."""
    text = addr.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def make_sink(addr: str = DEFAULT_ADDR) -> ServingSink:
    """A sink serving ``/metrics`` on ``addr`` (default loopback ``127.0.0.1:9464``)."""
    host, port = parse_addr(addr)
    return ServingSink(host, port)


def write_textfile(sink: PrometheusSink, path: str | os.PathLike[str]) -> None:
    """Write the exposition atomically (node-exporter textfile collector format)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_bytes(sink.exposition())
    os.replace(tmp, p)


def write(recording: Any, target: str | os.PathLike[str], *, progress: Progress = SILENT) -> int:
    """The exporter contract's offline half (:mod:`exporters.registry`): the recording's
    totals as a textfile at ``target``; returns the number of steps. For charts over the
    recording's own time, :mod:`exporters.openmetrics` instead."""
    from exporters.base import replay

    sink = PrometheusSink()
    n = replay(recording, sink, progress=progress)
    write_textfile(sink, target)
    return n
