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

Live, three rules keep the counters whole:

- **Labels fixed from a process's first step.** A process's label set (model, engine,
  ranks) is taken once, when its first steps arrive (the collector hands the snapshot on
  before them), and kept: a fact that arrives later never splits its series in two.
- **A scrape never waits on assembly.** ``/metrics`` serves the last whole exposition;
  it renders a fresh one only when the reader is not applying a batch at that moment
  (a scrape sees every counter of a batch or none), so a busy reader delays no scrape.
- **The last values are scraped.** :meth:`ServingSink.close` renders the final values
  and keeps serving until a scrape has read them (at most ``linger_s``, two of the
  scrape intervals seen, 60 s at most; at once where nobody scraped).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from exporters.base import AGENT_BY_PID, AGENT_METRICS, FIXED, ExportSink, GpuSample, ProcessInfo
from exporters.metrics import (
    METRICS,
    NAMESPACE,
    RankSeries,
    Update,
    process_labels,
    process_updates,
)
from exporters.metrics_columns import step_updates
from probe.analysis.steady import Classes
from probe.progress import SILENT, Progress
from probe.step import Step

if TYPE_CHECKING:
    from exporters.metrics_columns import Updates
    from probe.reader.recording_batches import StepBatch

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


class _Hist:
    """One histogram series: per-bucket counts (the last one +Inf, not cumulative), sum."""

    __slots__ = ("counts", "sum")

    def __init__(self, n: int) -> None:
        self.counts = [0] * (n + 1)
        self.sum = 0.0


class _Values:
    """The metric set's values as plain numbers, one dict of series per metric, exposed
    through prometheus_client's custom-collector interface (its metric families and text
    format). prometheus_client's own metric objects cost about 20 µs an update (a label
    lookup and a lock each); a step makes about 20 updates, which on a busy host was the
    reader's largest cost per step. Series appear in the order of their first update, as
    prometheus_client lists them."""

    def __init__(self) -> None:
        self.series: dict[str, dict[tuple[str, ...], Any]] = {m.name: {} for m in METRICS.values()}
        self._le = {
            m.name: [floatToGoString(b) for b in m.buckets] + ["+Inf"]  # type: ignore[no-untyped-call]
            for m in METRICS.values()
            if m.kind == "histogram"
        }

    def apply(self, u: Update) -> None:
        m = METRICS[u.metric]
        key = tuple([u.labels[k] for k in m.all_labels])
        series = self.series[u.metric]
        if m.kind == "counter":
            if u.value < 0:
                raise ValueError(f"{u.metric}: counters only go up, got {u.value}")
            series[key] = series.get(key, 0.0) + u.value
        elif m.kind == "histogram":
            h = series.get(key)
            if h is None:
                h = series[key] = _Hist(len(m.buckets))
            h.counts[bisect.bisect_left(m.buckets, u.value)] += 1
            h.sum += u.value
        else:
            series[key] = float(u.value)

    def apply_codes(self, base: Mapping[str, str], u: Updates) -> None:
        """Apply one metric's updates of a batch given as columns
        (:class:`exporters.metrics_columns.Updates`), as :meth:`apply` would apply each in
        turn: new series in the order of their first update, each series' sum added to in
        update order (``np.add.at``: the same float additions)."""
        import numpy as np

        if not len(u.codes):
            return
        m = METRICS[u.metric]
        series = self.series[u.metric]
        uniq, first, inv = np.unique(u.codes, return_index=True, return_inverse=True)
        keys: list[tuple[str, ...]] = [()] * len(uniq)
        for i in np.argsort(first, kind="stable").tolist():
            labels = {**base, **u.labels(int(uniq[i]))}
            keys[i] = key = tuple([labels[k] for k in m.all_labels])
            if key not in series:
                series[key] = 0.0 if m.kind == "counter" else _Hist(len(m.buckets))
        if m.kind == "counter":
            if (u.values < 0).any():
                bad = u.values[int(np.argmax(u.values < 0))].item()
                raise ValueError(f"{u.metric}: counters only go up, got {bad}")
            acc = np.array([series[k] for k in keys], dtype=np.float64)
            np.add.at(acc, inv, u.values)
            for k, v in zip(keys, acc.tolist(), strict=True):
                series[k] = v
            return
        hists = [series[k] for k in keys]
        bucket = np.searchsorted(np.asarray(m.buckets, dtype=np.float64), u.values, side="left")
        counts = np.zeros((len(keys), len(m.buckets) + 1), dtype=np.int64)
        np.add.at(counts, (inv, bucket), 1)
        sums = np.array([h.sum for h in hists], dtype=np.float64)
        np.add.at(sums, inv, u.values)
        for h, c, total in zip(hists, counts.tolist(), sums.tolist(), strict=True):
            h.counts = [a + b for a, b in zip(h.counts, c, strict=True)]
            h.sum = total

    def forget(self, pid: str) -> int:
        n = 0
        for name, series in self.series.items():
            i = METRICS[name].all_labels.index("pid")
            for key in [k for k in series if k[i] == pid]:
                del series[key]
                n += 1
        return n

    def collect(self) -> Iterator[Metric]:
        for name, series in self.series.items():
            m = METRICS[name]
            labels = list(m.all_labels)
            fam: Any
            if m.kind == "counter":
                fam = CounterMetricFamily(name, m.help, labels=labels)
                for key, v in series.items():
                    fam.add_metric(key, v)
            elif m.kind == "histogram":
                fam = HistogramMetricFamily(name, m.help, labels=labels)
                le = self._le[name]
                for key, h in series.items():
                    cum = itertools.accumulate(h.counts)
                    fam.add_metric(key, list(zip(le, cum, strict=True)), h.sum)
            else:
                fam = GaugeMetricFamily(name, m.help, labels=labels)
                for key, v in series.items():
                    fam.add_metric(key, v)
            yield fam


class PrometheusSink(ExportSink):
    """Applies :func:`exporters.metrics.updates` to the metric set's values, exposed
    through a prometheus_client registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__()
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        #: what is exposed: ``registry`` without ``_created`` series
        self._lock = threading.Lock()
        self.exposed = CollectorRegistry(auto_describe=False)
        self.exposed.register(_WithoutCreated(self.registry, self._lock))  # type: ignore[arg-type]
        self.values = _Values()
        self.registry.register(self.values)  # type: ignore[arg-type]
        self._known: dict[int, ProcessInfo] = {}
        self._ranks = RankSeries()
        #: each process's label facts as of its first step (FIXED)
        self._fixed: dict[int, dict[str, Any]] = {}
        self._pending: dict[int, ProcessInfo] = {}  # facts of a process before its first step
        self._cache = b""
        self._dirty = True
        self._classes = Classes()  # the steady/warm-up split and engine idle, per rank
        self.agent: dict[str, Any] = {}

    def sampled(self, every: int) -> None:
        """The engines record one step in ``every`` (``--sample``): each step's serving
        time is its share of the gap since the last recorded one, so the throughput
        ratio estimates all steps (:attr:`probe.analysis.summary.Summary.sample_every`)."""
        self._classes.sample_every = every

    def add_agent_metrics(self) -> None:
        """``probe agent``'s own counters (:data:`AGENT_METRICS`), at 0."""
        for name, kind, text in AGENT_METRICS:
            cls = Counter if kind == "counter" else Gauge
            labels = ("pid",) if name in AGENT_BY_PID else ()
            self.agent[name] = cls(name, text, labels, registry=self.registry)

    def agent_lag(self, lags: Mapping[int, tuple[int, float]]) -> None:
        """Set the lag gauges to ``lags`` (pid -> records, seconds behind its ring); the
        series of rings not in it (finished) are removed."""
        recs = self.agent.get("vllm_graph_probe_agent_lag_records")
        secs = self.agent.get("vllm_graph_probe_agent_lag_seconds")
        if recs is None or secs is None:
            return
        with self._lock:
            for g in (recs, secs):
                for (pid,) in list(g._metrics):
                    if int(pid) not in lags:
                        g.remove(pid)
            for pid, (n, s) in lags.items():
                recs.labels(str(pid)).set(n)
                secs.labels(str(pid)).set(round(s, 3))
            self._dirty = True

    def agent_event(self, name: str, value: float = 1.0) -> None:
        """Add ``value`` to an agent counter (set a gauge)."""
        full = f"vllm_graph_probe_agent_{name}"
        m = self.agent.get(full) or self.agent.get(f"{full}_total")
        if m is None:
            return
        with self._lock:
            if isinstance(m, Counter):
                m.inc(value)
            else:
                m.set(value)
            self._dirty = True

    def apply(self, u: Update) -> None:
        self.values.apply(u)

    def _labelled(self, info: ProcessInfo) -> ProcessInfo:
        fixed = self._fixed.get(info.pid)
        if fixed is None:
            return info
        return dataclasses.replace(info, **fixed)

    def process(self, info: ProcessInfo) -> None:
        with self._lock:
            if info.pid not in self._fixed:
                # before its first step: remembered, exported with the labels it will have
                self._pending[info.pid] = info
                return
            info = self._labelled(info)
            for u in process_updates(info, self._known.get(info.pid)):
                self.apply(u)
            self._known[info.pid] = info
            self._dirty = True

    def steps(self, info: ProcessInfo, steps: Sequence[Step], gpu: Sequence[GpuSample]) -> None:
        # the updates a metric at a time (exporters.metrics.updates' arrays, before they
        # become one Update each)
        self._add(info, lambda i: step_updates(i, steps, gpu, self._classes), lambda: steps)

    def step_columns(self, info: ProcessInfo, batch: StepBatch) -> None:
        """:meth:`steps` of a batch of ``info``'s steps given as columns, their device
        timings those the steps hold (:func:`exporters.metrics_columns.column_updates`): the
        same series, the same values."""
        from exporters.metrics_columns import builder_label, column_updates, rank_steps

        self._add(
            info,
            lambda i: column_updates(i, batch, self._classes, builder_label(i)),
            lambda: rank_steps(batch),
        )

    def _add(
        self,
        info: ProcessInfo,
        ups: Callable[[ProcessInfo], Iterable[Updates]],
        steps: Callable[[], Sequence[Step]],
    ) -> None:
        """A batch's updates (``ups`` of the process's labelled facts) and, of a worker,
        its ranks side by side (``steps``: the batch as Steps)."""
        with self._lock:
            self._first_step(info)
            info = self._labelled(info)
            base = process_labels(info)
            for c in ups(info):
                self.values.apply_codes(base, c)
            if info.role == "worker":  # RankSeries: nothing of another process
                for u in self._ranks.updates(info, steps(), self._known.__getitem__):
                    self.apply(u)
            self._dirty = True

    def _first_step(self, info: ProcessInfo) -> None:
        """At ``info``'s first step: its label facts fixed, its process series made."""
        if info.pid not in self._fixed:
            self._fixed[info.pid] = {k: getattr(info, k) for k in FIXED}
            self._pending.pop(info.pid, None)
            first = self._labelled(info)
            for u in process_updates(first, None):
                self.apply(u)
            self._known[info.pid] = first

    def finished(self, pid: int, at: float | None = None) -> None:
        """``pid`` ended and was read to its end: its end time (Unix s, default now) as
        ``process_ended_timestamp_seconds``, with its labels."""
        with self._lock:
            info = self._known.get(pid)
            if info is None:
                return
            self.apply(
                Update(
                    f"{NAMESPACE}_process_ended_timestamp_seconds",
                    process_labels(info),
                    time.time() if at is None else at,
                )
            )
            self._dirty = True

    def forget(self, pid: int) -> int:
        """Remove every series of ``pid`` (a process that ended a while ago: a reader that
        runs for days keeps no series of processes long gone); returns how many."""
        with self._lock:
            n = self.values.forget(str(pid))
            self._known.pop(pid, None)
            self._ranks.forget(pid)
            self._fixed.pop(pid, None)
            self._pending.pop(pid, None)
            self._dirty = True
        return n

    def exposition(self) -> bytes:
        """The current text exposition, whole (waits for a batch being applied)."""
        with self._lock:
            return self._render()

    def _render(self) -> bytes:
        if self._dirty or not self._cache:
            # the registry's collect below takes the lock again: read it directly
            self._dirty = False
            self._cache = generate_latest(_Unlocked(self.registry))  # type: ignore[arg-type]
        return self._cache

    def served(self) -> bytes:
        """What ``/metrics`` serves: a fresh exposition when no batch is being applied,
        else the last whole one (a scrape never waits on the reader's assembly)."""
        if self._lock.acquire(blocking=False):
            try:
                return self._render()
            finally:
                self._lock.release()
        return self._cache

    def close(self) -> None:
        pass


class _Unlocked:
    """``registry`` less its ``_created`` samples, read by a caller that holds the lock."""

    def __init__(self, inner: CollectorRegistry) -> None:
        self.inner = inner

    def collect(self) -> Iterator[Metric]:
        for fam in self.inner.collect():
            fam.samples = [s for s in fam.samples if not s.name.endswith("_created")]
            yield fam


class _Handler(BaseHTTPRequestHandler):
    sink: ServingSink

    def do_GET(self) -> None:
        sink: ServingSink = self.server.sink  # type: ignore[attr-defined]
        try:
            if self.path.split("?", 1)[0] not in ("/", "/metrics"):
                self.send_error(404)
                return
            body = sink.served()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            sink.hung_up(self.client_address)
            self.close_connection = True
            return
        sink._scraped()

    def log_message(self, *_args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    sink: ServingSink

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up mid-request: one line (socketserver prints a traceback)."""
        self.sink.hung_up(client_address)


LINGER_MAX_S = 60.0
RENDER_EVERY_S = 0.5
"""How often a live endpoint's exposition is made afresh while values change: a scrape
sees values at most this old, beyond the reader's own lag."""


def _note(line: str) -> None:
    import sys

    with contextlib.suppress(OSError, ValueError):
        print(f"probe: note: {line}", file=sys.stderr, flush=True)


class ServingSink(PrometheusSink):
    """A :class:`PrometheusSink` that serves ``/metrics`` on ``host:port`` until closed;
    its close keeps serving until the final values were scraped (``linger_s``: at most
    that long; None: two of the scrape intervals seen, :data:`LINGER_MAX_S` at most, none
    where nobody scraped)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry | None = None,
        *,
        linger_s: float | None = None,
    ) -> None:
        super().__init__(registry)
        family = _Server.address_family
        if ":" in host:
            import socket

            family = socket.AF_INET6

        class Server(_Server):
            address_family = family

        server = Server((host, port), _Handler)
        server.sink = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="probe-prometheus", daemon=True
        )
        self._thread.start()
        self.host = host
        self.port = int(server.server_address[1])
        self.linger_s = linger_s
        self.scrapes = 0
        self.hangups = 0
        #: where a client that hung up is told (one line each): the agent's log
        self.note: Callable[[str], None] = _note
        self._scrape_times: deque[float] = deque(maxlen=8)
        self._closed = False
        self._ticked = False
        self._rendered_at = 0.0

    def tick(self) -> None:
        """Between two of the reader's batches (:class:`probe.reader.collector.Collector`
        calls it once per poll): a fresh exposition when values changed, at most every
        :data:`RENDER_EVERY_S`. A sink fed by a reader renders here, so a scrape only
        sends bytes already made, however busy the host."""
        self._ticked = True
        now = time.monotonic()
        if self._dirty and now - self._rendered_at >= RENDER_EVERY_S:
            with self._lock:
                self._render()
            self._rendered_at = now

    def served(self) -> bytes:
        """The last exposition made between two batches (:meth:`tick`); without a
        reader's ticks (an export fed by :func:`exporters.base.replay`), as the base's."""
        if self._ticked and self._cache:
            return self._cache
        return super().served()

    def hung_up(self, client: Any) -> None:
        """A scrape whose client left before its answer was sent: counted, one line."""
        self.hangups += 1
        who = f"{client[0]}:{client[1]}" if isinstance(client, tuple) else str(client)
        self.note(f"a scrape from {who} hung up before its answer was sent (its timeout?)")

    def _scraped(self) -> None:
        self.scrapes += 1
        self._scrape_times.append(time.monotonic())

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def scrape_interval_s(self) -> float | None:
        """The median gap between the last scrapes seen (None: fewer than two)."""
        t = list(self._scrape_times)
        gaps = sorted(b - a for a, b in itertools.pairwise(t))
        return gaps[len(gaps) // 2] if gaps else None

    def linger(self) -> float:
        """Keep serving until a scrape has read the values as they are now (the reader
        drained: the last steps are in them); returns the seconds waited."""
        with self._lock:
            self._render()
        limit = self.linger_s
        if limit is None:
            every = self.scrape_interval_s()
            limit = 0.0 if every is None else min(2 * every + 0.5, LINGER_MAX_S)
        t0 = time.monotonic()
        seen = self.scrapes
        while self.scrapes == seen and time.monotonic() - t0 < limit:
            time.sleep(0.05)
        return time.monotonic() - t0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.linger()
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


def make_sink(addr: str = DEFAULT_ADDR, *, linger_s: float | None = None) -> ServingSink:
    """A sink serving ``/metrics`` on ``addr`` (default loopback ``127.0.0.1:9464``)."""
    host, port = parse_addr(addr)
    return ServingSink(host, port, linger_s=linger_s)


def write_textfile(sink: PrometheusSink, path: str | os.PathLike[str]) -> None:
    """Write the exposition atomically (node-exporter textfile collector format)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_bytes(sink.exposition())
    os.replace(tmp, p)


def replayed(recording: Any, *, progress: Progress = SILENT) -> tuple[PrometheusSink, int]:
    """A sink holding the recording's totals, as a live one fed its steps would (the
    processes in turns, a batch each), and the number of steps: fed column batches
    (:func:`exporters.base.replay_columns`), or Steps where the recording does not store
    what the column batches need (:func:`exporters.base.replay`)."""
    from exporters.base import replay
    from exporters.metrics_columns import NeedsSteps, replay_columns

    sink = PrometheusSink()
    try:
        n = replay_columns(recording, sink, progress=progress)
    except NeedsSteps:
        n = replay(recording, sink, progress=progress)
    return sink, n


def write(recording: Any, target: str | os.PathLike[str], *, progress: Progress = SILENT) -> int:
    """The exporter contract's offline half (:mod:`exporters.registry`): the recording's
    totals as a textfile at ``target``; returns the number of steps. For charts over the
    recording's own time, :mod:`exporters.openmetrics` instead."""
    sink, n = replayed(recording, progress=progress)
    write_textfile(sink, target)
    return n
