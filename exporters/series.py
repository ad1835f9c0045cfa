"""A finished recording as metric time series on its own clock.

The live sinks stamp their samples when they are scraped or pushed; a recording replayed
later needs its samples stamped with the time the steps ran. :func:`timelines` walks
each process's Steps in order, applies :func:`exporters.metrics.updates` to cumulative
state, and samples every series every ``interval_s`` of the recording's epoch time (the
clock pair of the process's hello record), as a Prometheus scraping the live endpoint
every ``interval_s`` would have seen it::

    >>> from exporters.series import timelines                     # doctest: +SKIP
    >>> [tl] = timelines(Recording.open("run.probe.db"), 1.0)      # doctest: +SKIP
    >>> tl.ticks[0], tl.ticks[-1]       # epoch ns of the first and last sample  # doctest: +SKIP

Every series that ever appears is present from the first sample on, at 0 (a counter or
histogram) or at its value (an info gauge): a series born mid-recording would otherwise
lose its first increase to ``rate()``. Health counters (records dropped, hook faults) are
the recording's totals at its end, so they step up at the last sample.

The OpenMetrics writer (:mod:`exporters.openmetrics`) and the OTLP replay
(:func:`exporters.otlp.write`) both read these timelines, so a backfilled Prometheus and
a Collector-fed one hold the same samples at the same times.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from exporters.base import ProcessInfo, processes_from_recording
from exporters.metrics import METRICS, Update, process_updates, updates
from probe.analysis.steady import Classes, iter_chunks
from probe.analysis.summary_read import summarize_recording
from probe.progress import SILENT, Progress, counted
from probe.reader.recording import Recording
from probe.step import Step

__all__ = ["DEFAULT_INTERVAL_S", "Hist", "Key", "Timeline", "instance_id", "timelines"]

#: one sample per second of the recording: the live Prometheus test's scrape interval
DEFAULT_INTERVAL_S = 1.0

#: (metric name, sorted label pairs)
Key = tuple[str, tuple[tuple[str, str], ...]]


def instance_id(info: ProcessInfo) -> str:
    """A stable ``service.instance.id`` for one vLLM process: a UUID v5 of the host, the
    pid and the boot (the process's BOOTTIME-to-epoch offset, to the second), so every
    export of one recording names the process alike and two boots reusing a pid do not
    collide. A process without a clock pair gets one from host and pid alone."""
    boot = ""
    if info.boottime_ns is not None and info.epoch_ns is not None:
        boot = str(round((info.epoch_ns - info.boottime_ns) / 1e9))
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"vllm-graph-probe:{info.host}:{info.pid}:{boot}"))


@dataclass
class Hist:
    """Cumulative state of one histogram series: per-bucket counts (the last one is
    +Inf), sum and count, as OTLP carries them (not cumulative over buckets)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0
    min: float | None = None
    max: float | None = None

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, v: float) -> None:
        # Prometheus buckets are `le`: a value equal to a bound falls in that bound's bucket
        i = bisect.bisect_left(self.bounds, v)  # the first bound at or above v
        self.counts[i] += 1
        self.sum += v
        self.count += 1
        self.min = v if self.min is None else min(self.min, v)
        self.max = v if self.max is None else max(self.max, v)

    def copy(self) -> Hist:
        return Hist(self.bounds, list(self.counts), self.sum, self.count, self.min, self.max)


Value = float | Hist


@dataclass
class Timeline:
    """One process's series sampled on the recording's clock.

    ``ticks``: the sample times (epoch ns, increasing); ``series[key][i]``: the value of
    that series at ``ticks[i]`` (a float for counters and gauges, a :class:`Hist`).
    ``start_ns``: the start of the cumulative counts (the first tick).
    """

    info: ProcessInfo
    ticks: list[int]
    series: dict[Key, list[Value]]

    @property
    def start_ns(self) -> int:
        return self.ticks[0]


def series_key(u: Update) -> Key:
    return u.metric, tuple(sorted(u.labels.items()))


def zero(metric: str) -> Value:
    m = METRICS[metric]
    return Hist(m.buckets) if m.kind == "histogram" else 0.0


def apply(state: dict[Key, Value], u: Update) -> None:
    k = series_key(u)
    cur = state.setdefault(k, zero(u.metric))
    if isinstance(cur, Hist):
        cur.observe(u.value)
    elif METRICS[u.metric].kind == "counter":
        state[k] = cur + u.value
    else:
        state[k] = float(u.value)


def _snapshot(v: Value) -> Value:
    return v.copy() if isinstance(v, Hist) else v


def timeline(
    info: ProcessInfo, steps: Iterable[Step], interval_s: float, classes: Classes | None = None
) -> Timeline | None:
    """One process's :class:`Timeline`; None when it has no steps or no clock pair.
    ``classes``: the steady/warm-up split of the recording's summary (:func:`timelines`
    passes it; without it, as a live sink splits them)."""
    if interval_s <= 0:
        raise ValueError(f"interval must be above 0 s, got {interval_s}")
    if info.boottime_ns is None or info.epoch_ns is None:
        return None
    events: list[tuple[int, list[Update]]] = []
    cl = classes if classes is not None else Classes()
    for chunk in iter_chunks(steps):
        cl.classify(chunk)
        for s in chunk:
            gpu = [s.gpu] if s.gpu is not None else []
            events.append((info.epoch_ns_of(s.t1), list(updates(info, [s], gpu, cl))))
    if not events:
        return None
    events.sort(key=lambda e: e[0])
    step_ns = round(interval_s * 1e9)
    # the first tick sits just before the first step ended: every counter reads 0 there
    t0 = events[0][0] - 1_000_000
    t0 -= t0 % 1_000_000  # whole milliseconds, as OpenMetrics and Prometheus keep them
    last = events[-1][0]
    n = -(-(last - t0) // step_ns)  # ticks after the first, the last at or after `last`
    ticks = [t0 + i * step_ns for i in range(n + 1)]

    health = list(process_updates(info, None))
    info_gauges = [u for u in health if METRICS[u.metric].kind == "gauge"]
    totals = [u for u in health if METRICS[u.metric].kind != "gauge"]
    state: dict[Key, Value] = {}
    for u in info_gauges:
        apply(state, u)
    # every series that ever appears, present (at 0) from the first tick
    for _, us in events:
        for u in us:
            state.setdefault(series_key(u), zero(u.metric))
    for u in totals:
        state.setdefault(series_key(u), zero(u.metric))
    series: dict[Key, list[Value]] = {k: [] for k in state}
    i = 0
    for ti, tick in enumerate(ticks):
        while i < len(events) and events[i][0] <= tick:
            for u in events[i][1]:
                apply(state, u)
            i += 1
        if ti == len(ticks) - 1:
            for u in totals:
                apply(state, u)
        for k, v in state.items():
            series[k].append(_snapshot(v))
    return Timeline(info, ticks, series)


def timelines(
    rec: Recording, interval_s: float = DEFAULT_INTERVAL_S, *, progress: Progress = SILENT
) -> list[Timeline]:
    """Every process of ``rec`` with steps and a clock pair, as a :class:`Timeline`;
    ``progress`` counts the steps of those processes as they are read."""
    infos = processes_from_recording(rec)
    per_pid = rec.step_counts()
    clocked = [i.pid for i in infos if i.boottime_ns is not None and i.epoch_ns is not None]
    progress.stage("building timelines", sum(per_pid.get(p, 0) for p in clocked), "steps")
    classes = Classes.of(summarize_recording(rec))  # the report's split, exactly
    out = []
    for info in infos:
        steps = counted(rec.iter_steps(info.pid), progress)
        tl = timeline(info, steps, interval_s, classes)
        if tl is not None:
            out.append(tl)
    return out
