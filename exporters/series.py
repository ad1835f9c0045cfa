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
import heapq
import operator
import os
import pickle
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from exporters.base import ProcessInfo, processes_from_recording
from exporters.metrics import METRICS, Update, process_updates, updates
from exporters.metrics_columns import TABLES, builder_label, column_events, columns_read
from probe.analysis.steady import Classes, iter_chunks
from probe.analysis.summary_read import summarize_recordings
from probe.progress import SILENT, Progress
from probe.reader.recording import Recording
from probe.reader.recording_batches import step_batches
from probe.step import Step

__all__ = [
    "DEFAULT_INTERVAL_S",
    "EventRuns",
    "Hist",
    "Key",
    "Ticks",
    "Timeline",
    "instance_id",
    "process_ticks",
    "recording_classes",
    "recording_ticks",
    "step_events",
    "timelines",
]

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


#: one step's updates at its end (epoch ns): (metric, sorted label pairs, value) each
Event = tuple[int, list[tuple[str, tuple[tuple[str, str], ...], float]]]

#: steps read as column batches at a time (the chunks the Steps are classified in)
EVENT_BATCH = 4096

HOLD = 1 << 14
"""Events held in memory before a sorted run is written to the temporary file."""


class EventRuns:
    """Events sorted by (time, order read), in runs held to :data:`HOLD` and spilled to
    one temporary file past it (a context manager: the file goes at its end)."""

    def __init__(self) -> None:
        self.file: IO[bytes] | None = None

    def __enter__(self) -> EventRuns:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.file is not None:
            self.file.close()

    def _file(self) -> IO[bytes]:
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="probe-events-")  # noqa: SIM115 (__exit__)
        self.file.seek(0, os.SEEK_END)
        return self.file

    def sorted(self, events: Iterable[Event]) -> Callable[[], Iterator[Event]]:
        """``events`` held in sorted runs; returns what iterates them in time order (again
        each time it is called), ties in the order read."""
        runs: list[tuple[int, int]] = []
        held: list[tuple[tuple[int, int], Event]] = []
        for seq, e in enumerate(events):
            held.append(((e[0], seq), e))
            if len(held) >= HOLD:
                runs.append(self._run(held))
                held = []
        held.sort(key=operator.itemgetter(0))

        def read(offset: int, count: int) -> Iterator[tuple[tuple[int, int], Event]]:
            f = self.file
            assert f is not None
            pos = offset
            for _ in range(count):
                f.seek(pos)
                items: list[tuple[tuple[int, int], Event]] = pickle.load(f)
                pos = f.tell()
                yield from items

        def ordered() -> Iterator[Event]:
            merged = heapq.merge(
                *(read(o, c) for o, c in runs), iter(held), key=operator.itemgetter(0)
            )
            for _, e in merged:
                yield e

        return ordered

    def _run(self, held: list[tuple[tuple[int, int], Event]]) -> tuple[int, int]:
        held.sort(key=operator.itemgetter(0))
        f = self._file()
        start, count = f.tell(), 0
        for i in range(0, len(held), 512):  # the merge holds one chunk of each run
            pickle.dump(held[i : i + 512], f, protocol=pickle.HIGHEST_PROTOCOL)
            count += 1
        return start, count


def step_events(
    info: ProcessInfo, steps: Iterable[Step], classes: Classes, progress: Progress = SILENT
) -> Iterator[Event]:
    """Each of one process's steps as its :func:`exporters.metrics.updates`, at its end
    (epoch ns); ``classes`` splits them (its decisions; this process's state starts from
    none); ``progress`` advanced a batch of steps at a time."""
    same: dict[Any, Any] = {}  # one tuple per distinct label set: held events share them
    cl = classes.for_process()
    done = 0
    for chunk in iter_chunks(steps):
        cl.classify(chunk)
        for s in chunk:
            gpu = [s.gpu] if s.gpu is not None else []
            us = []
            for u in updates(info, [s], gpu, cl):
                pairs = tuple(sorted(u.labels.items()))
                us.append((u.metric, same.setdefault(pairs, pairs), u.value))
            yield info.epoch_ns_of(s.t1), us
            done += 1
            if done == 256:
                progress.advance(done)
                done = 0
    progress.advance(done)


@dataclass
class Ticks:
    """One process's series sampled every ``step_ns`` from ``t0`` (epoch ns), as they are
    computed: iterating gives ``(tick, state)`` for each of the ``n + 1`` ticks, ``state``
    every series' value then (a dict updated in place: copy what is kept). ``keys``: every
    series, in the order the state holds them."""

    info: ProcessInfo
    keys: list[Key]
    t0: int
    step_ns: int
    n: int
    _state: dict[Key, Value]
    _ordered: Callable[[], Iterator[Event]]
    _totals: list[Update]

    @property
    def start_ns(self) -> int:
        return self.t0

    def __iter__(self) -> Iterator[tuple[int, dict[Key, Value]]]:
        state = {k: (v.copy() if isinstance(v, Hist) else v) for k, v in self._state.items()}
        pending = self._ordered()
        nxt = next(pending, None)
        for ti in range(self.n + 1):
            tick = self.t0 + ti * self.step_ns
            while nxt is not None and nxt[0] <= tick:
                for metric, pairs, value in nxt[1]:
                    bump(state, (metric, pairs), metric, value)
                nxt = next(pending, None)
            if ti == self.n:
                for u in self._totals:
                    apply(state, u)
            yield tick, state


def process_ticks(
    info: ProcessInfo, events: Iterable[Event], interval_s: float, runs: EventRuns
) -> Ticks | None:
    """One process's :class:`Ticks` of its ``events`` (held sorted in ``runs``); None
    without events. Every series that ever appears is present from the first tick (at 0,
    or an info gauge's value); the health totals step up at the last tick."""
    if interval_s <= 0:
        raise ValueError(f"interval must be above 0 s, got {interval_s}")
    ordered = runs.sorted(events)
    health = list(process_updates(info, None))
    totals = [u for u in health if METRICS[u.metric].kind != "gauge"]
    state: dict[Key, Value] = {}
    for u in health:
        if METRICS[u.metric].kind == "gauge":
            apply(state, u)
    first: int | None = None
    last = 0
    for t, us in ordered():
        if first is None:
            first = t
        last = t
        for metric, pairs, _ in us:
            if (metric, pairs) not in state:
                state[(metric, pairs)] = zero(metric)
    if first is None:
        return None
    for u in totals:
        state.setdefault(series_key(u), zero(u.metric))
    step_ns = round(interval_s * 1e9)
    # the first tick sits just before the first step ended: every counter reads 0 there
    t0 = first - 1_000_000
    t0 -= t0 % 1_000_000  # whole milliseconds, as OpenMetrics and Prometheus keep them
    n = -(-(last - t0) // step_ns)  # ticks after the first, the last at or after `last`
    return Ticks(info, list(state), t0, step_ns, n, state, ordered, totals)


def bump(state: dict[Key, Value], k: Key, metric: str, value: float) -> None:
    """:func:`apply` of an update given as its key and value."""
    cur = state.get(k)
    if cur is None:
        cur = state[k] = zero(metric)
    if isinstance(cur, Hist):
        cur.observe(value)
    elif METRICS[metric].kind == "counter":
        state[k] = cur + value
    else:
        state[k] = float(value)


def recording_classes(rec: Any) -> Classes:
    """The steady/warm-up split of ``rec``'s summary (one recording or several read as
    one): the report's split, exactly (one streaming summary pass)."""
    recs = getattr(rec, "recordings", None) or [rec]
    return Classes.of(summarize_recordings(recs))


def clocked(rec: Any) -> list[ProcessInfo]:
    """The processes of ``rec`` with a clock pair (the ones with a time line)."""
    return [
        i
        for i in processes_from_recording(rec)
        if i.boottime_ns is not None and i.epoch_ns is not None
    ]


def recording_ticks(
    rec: Any,
    interval_s: float,
    *,
    progress: Progress = SILENT,
    stage: str = "building timelines",
) -> Iterator[Ticks]:
    """Each clocked process of ``rec`` with steps as its :class:`Ticks`, one after the
    other (iterate each before the next), by the split of the recording's summary;
    ``progress`` gets ``stage``, counting those processes' steps as they are read."""
    per_pid = rec.step_counts()
    infos = clocked(rec)
    progress.stage(stage, sum(per_pid.get(i.pid, 0) for i in infos), "steps")
    classes = recording_classes(rec)  # one split across the processes
    columns = columns_read(rec, infos)
    with EventRuns() as runs:
        for info in infos:
            events = (
                column_events(
                    info,
                    step_batches(rec, info.pid, EVENT_BATCH, TABLES, counts=columns == "counts"),
                    classes,
                    builder_label(info),
                    progress,
                )
                if columns
                else step_events(info, rec.iter_steps(info.pid), classes, progress)
            )
            tk = process_ticks(info, events, interval_s, runs)
            if tk is not None:
                yield tk


def _held(tk: Ticks) -> Timeline:
    """``tk``'s samples held whole."""
    ticks: list[int] = []
    series: dict[Key, list[Value]] = {k: [] for k in tk.keys}
    for tick, state in tk:
        ticks.append(tick)
        for k, v in state.items():
            series[k].append(_snapshot(v))
    return Timeline(tk.info, ticks, series)


def timeline(
    info: ProcessInfo, steps: Iterable[Step], interval_s: float, classes: Classes | None = None
) -> Timeline | None:
    """One process's :class:`Timeline`, held whole; None when it has no steps or no clock
    pair. ``classes``: the steady/warm-up split of the recording's summary (:func:`timelines`
    passes it; without it, as a live sink splits them)."""
    if interval_s <= 0:
        raise ValueError(f"interval must be above 0 s, got {interval_s}")
    if info.boottime_ns is None or info.epoch_ns is None:
        return None
    cl = classes if classes is not None else Classes()
    with EventRuns() as runs:
        tk = process_ticks(info, step_events(info, steps, cl), interval_s, runs)
        return None if tk is None else _held(tk)


def timelines(
    rec: Recording, interval_s: float = DEFAULT_INTERVAL_S, *, progress: Progress = SILENT
) -> list[Timeline]:
    """Every process of ``rec`` with steps and a clock pair, as a :class:`Timeline` (held
    whole: :func:`recording_ticks` streams them); ``progress`` counts the steps of those
    processes as they are read."""
    return [_held(tk) for tk in recording_ticks(rec, interval_s, progress=progress)]
