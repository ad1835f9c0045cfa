"""The interface every live sink shares, and the pieces exporters have in common.

A sink consumes what the reader process assembles: :class:`probe.reader.collector.Sink`
(``on_process(proc)``, ``on_steps(proc, steps, gpu)``, ``close()``), re-exported here as
:class:`Sink`. Exporters (Prometheus, OTLP) build on :class:`ExportSink`, which turns a
live :class:`~probe.reader.collector.ProcessState` into a plain :class:`ProcessInfo`, so the
same sink also takes a finished recording (:func:`replay`, used by ``probe export``:
the recording's Steps, from :meth:`~probe.reader.recording.Recording.iter_steps`)::

    >>> from exporters.base import load_sink, replay              # doctest: +SKIP
    >>> sink = load_sink("prometheus").make_sink("127.0.0.1:9464")  # doctest: +SKIP
    >>> replay(Recording.open("run.probe.db"), sink)               # doctest: +SKIP

Each sink module imports its own library at its top; :func:`load_sink` turns the
``ImportError`` of a missing optional dependency into :class:`MissingExtra`, whose
message is the ``pip install`` line to run.
"""

from __future__ import annotations

import importlib
import itertools
import socket
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, TypeVar

from probe.analysis.cost import calibration_of
from probe.progress import SILENT, Progress
from probe.reader.collector import ProcessState, Sink
from probe.reader.recording import Recording
from probe.step import GpuSample, Step

__all__ = [
    "EXTRAS",
    "ExportSink",
    "GpuSample",
    "MissingExtra",
    "ProcessInfo",
    "ProcessState",
    "Sink",
    "StepConsumer",
    "load_sink",
    "processes_from_recording",
    "replay",
]

# sink module -> the extra that installs its library
EXTRAS: dict[str, str] = {
    "prometheus": "prometheus",
    "otlp": "otlp",
    "perfetto": "perfetto",
    "parquet": "parquet",
}


class MissingExtra(ImportError):
    """An exporter's optional dependency is not installed; the message says what to run."""

    def __init__(self, sink: str, extra: str, missing: str | None) -> None:
        self.sink = sink
        self.extra = extra
        self.missing = missing
        self.pip = f"pip install 'vllm-graph-probe[{extra}]'"
        what = f" ({missing} is not installed)" if missing else ""
        super().__init__(f"the {sink} exporter needs the '{extra}' extra{what}: {self.pip}")


def load_sink(name: str) -> ModuleType:
    """Import ``exporters.<name>``; a missing optional library raises :class:`MissingExtra`."""
    if name not in EXTRAS:
        raise ValueError(f"unknown sink {name!r}; known: {', '.join(sorted(EXTRAS))}")
    try:
        return importlib.import_module(f"exporters.{name}")
    except ImportError as exc:
        if isinstance(exc, MissingExtra):
            raise
        missing = exc.name or None
        if missing is not None and missing.split(".")[0] in ("exporters", "probe"):
            raise  # our own module is broken: not a missing extra
        raise MissingExtra(name, EXTRAS[name], missing) from exc


FIXED = ("model", "engine", "tp_rank", "pp_rank", "dp_rank")
"""The :class:`ProcessInfo` fields behind a process's labels, fixed by the live sinks when
its metrics begin (its first step): a fact that arrives later never splits a series in two
(``pid`` names the process itself: a restarted engine is a new series)."""


AGENT_METRICS = (
    ("vllm_graph_probe_agent_attaches_total", "counter", "Processes the agent attached to."),
    ("vllm_graph_probe_agent_detaches_total", "counter", "Processes the agent detached from."),
    (
        "vllm_graph_probe_agent_restarts_total",
        "counter",
        "Processes that replaced one the agent saw end (same run dir, role and rank).",
    ),
    ("vllm_graph_probe_agent_attached", "gauge", "Processes the agent is attached to now."),
    (
        "vllm_graph_probe_agent_sample_every",
        "gauge",
        "The agent's --sample N: one engine step in N recorded and counted (step and token "
        "counters count recorded steps; ratios and throughput estimate all steps).",
    ),
    (
        "vllm_graph_probe_agent_lag_records",
        "gauge",
        "Records written into a process's ring that the agent has not assembled yet (in "
        "the ring and read but waiting), by pid: what its counters trail the engine by.",
    ),
    (
        "vllm_graph_probe_agent_lag_seconds",
        "gauge",
        "How long the oldest record the agent read from a process's ring and has not "
        "assembled yet has waited, by pid (0: caught up).",
    ),
)
"""``probe agent``'s own series (no process labels: one series per agent; the lag
gauges, :data:`AGENT_BY_PID`, one per ring)."""

AGENT_BY_PID = frozenset(
    {"vllm_graph_probe_agent_lag_records", "vllm_graph_probe_agent_lag_seconds"}
)
"""The agent's series labelled by ``pid`` alone (the ring they measure)."""


@dataclass(frozen=True)
class ProcessInfo:
    """What an exporter needs to know about one vLLM process (labels, clock pair, health)."""

    pid: int
    host: str = ""
    model: str = ""
    engine: int = 0
    tp_rank: int = 0
    pp_rank: int = 0
    dp_rank: int = 0
    role: str = "worker"
    vllm_version: str = ""
    runner: str = ""
    platform: str = ""
    min_support: str = ""
    cudagraph_mode: str = ""
    boottime_ns: int | None = None
    epoch_ns: int | None = None
    dropped: int = 0
    hook_faults: int = 0
    builder_names: Mapping[int, str] = field(default_factory=dict)
    traps: tuple[tuple[str, str], ...] = ()
    calibration: Mapping[str, Any] | None = None
    """The probe's own cost per call, calibrated at attach in this process
    (:func:`probe.analysis.cost.calibration_of` of its snapshot); None where it has none."""

    @classmethod
    def from_snapshot(
        cls,
        pid: int,
        snapshot: Mapping[str, Any] | None,
        *,
        host: str = "",
        **kw: Any,
    ) -> ProcessInfo:
        s = snapshot or {}
        comp = s.get("compilation") or {}
        return cls(
            pid=pid,
            host=host or socket.gethostname(),
            # vLLM's own model_name label value (the served name), so the series join
            model=str(s.get("served_model_name") or s.get("model") or ""),
            # vLLM's `engine` label is the data-parallel engine index
            engine=int(s.get("dp_rank") or 0),
            tp_rank=int(s.get("tp_rank") or 0),
            pp_rank=int(s.get("pp_rank") or 0),
            dp_rank=int(s.get("dp_rank") or 0),
            role=str(s.get("role") or "worker"),
            vllm_version=str(s.get("vllm_version") or ""),
            runner=str(s.get("runner") or ""),
            platform=str(s.get("platform") or ""),
            min_support=str(s.get("min_support") or ""),
            cudagraph_mode=str(comp.get("cudagraph_mode") or ""),
            traps=tuple(
                (str(t.get("code", "")), str(t.get("message", ""))) for t in s.get("traps") or ()
            ),
            calibration=calibration_of(s),
            **kw,
        )

    @classmethod
    def from_state(cls, proc: ProcessState) -> ProcessInfo:
        hello = proc.hello
        return cls.from_snapshot(
            proc.pid,
            proc.snapshot,
            boottime_ns=hello.boottime_ns if hello else None,
            epoch_ns=hello.epoch_ns if hello else None,
            dropped=proc.dropped,
            hook_faults=proc.hook_faults,
            builder_names=proc.builder_names,
        )

    @property
    def rank(self) -> str:
        return f"tp{self.tp_rank}/pp{self.pp_rank}/dp{self.dp_rank}"

    def epoch_ns_of(self, boottime_ns: int) -> int:
        """A CLOCK_BOOTTIME timestamp as Unix epoch ns, through the session's clock pair."""
        if self.boottime_ns is None or self.epoch_ns is None:
            raise ValueError(f"pid {self.pid}: no clock pair (hello record) yet")
        return boottime_ns - self.boottime_ns + self.epoch_ns


class StepConsumer(Protocol):
    """What :func:`replay` and :class:`ExportSink` feed: plain process facts and steps."""

    def process(self, info: ProcessInfo) -> None: ...

    def steps(self, info: ProcessInfo, steps: Sequence[Step], gpu: Sequence[GpuSample]) -> None: ...

    def close(self) -> None: ...


class ExportSink:
    """Base of the exporters: a :class:`Sink` for the collector, a :class:`StepConsumer`
    for recordings. Subclasses implement :meth:`process`, :meth:`steps` and :meth:`close`.
    """

    def on_process(self, proc: ProcessState) -> None:
        self.process(ProcessInfo.from_state(proc))

    def on_steps(self, proc: ProcessState, steps: Sequence[Step], gpu: Sequence[GpuSample]) -> None:
        self.steps(ProcessInfo.from_state(proc), steps, gpu)

    def process(self, info: ProcessInfo) -> None:
        raise NotImplementedError

    def steps(self, info: ProcessInfo, steps: Sequence[Step], gpu: Sequence[GpuSample]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


#: the prefix of every metric name
NAMESPACE = "vllm_graph_probe"


def process_labels(info: ProcessInfo) -> dict[str, str]:
    """The labels every series of a process carries."""
    return {
        "model_name": info.model,
        "engine": str(info.engine),
        "pid": str(info.pid),
        "tp_rank": str(info.tp_rank),
        "pp_rank": str(info.pp_rank),
        "dp_rank": str(info.dp_rank),
        "host": info.host,
    }


# -- recordings -> sinks ---------------------------------------------------------------------


def processes_from_recording(rec: Recording) -> list[ProcessInfo]:
    """A recording's processes as the collector would have announced them."""
    host = str(rec.meta().get("host") or "")
    faults: dict[int, int] = defaultdict(int)
    for f in rec.faults():
        faults[f["pid"]] += f["count"] or 0
    names = rec.builder_names()
    return [
        ProcessInfo.from_snapshot(
            p["pid"],
            p["snapshot"],
            host=host,
            boottime_ns=p["boottime_ns"],
            epoch_ns=p["epoch_ns"],
            dropped=p["dropped"] or 0,
            hook_faults=faults[p["pid"]],
            builder_names=names.get(p["pid"], {}),
        )
        for p in rec.processes()
    ]


def replay(
    rec: Recording, sink: StepConsumer, *, batch: int = 256, progress: Progress = SILENT
) -> int:
    """Feed a recording into ``sink`` in step order, ``batch`` steps at a time, each
    chunk with the device timings of its steps; ``progress`` gets a stage of the
    recording's steps, advanced a chunk at a time.

    The processes take turns, a batch each, as a live sink meets them: the ranks of an
    engine arrive side by side, so a sink matching them (ranks side by side) holds a few
    batches per rank, not a whole rank's steps.

    Returns the number of steps fed. The sink is not closed.
    """
    n = 0
    progress.stage("replaying steps", sum(rec.step_counts().values()), "steps")
    infos = processes_from_recording(rec)
    for info in infos:
        sink.process(info)
    chunks = [(info, _chunks(rec.iter_steps(info.pid), batch)) for info in infos]
    for info, chunk in in_turns(chunks):
        n += _feed(sink, info, chunk, progress)
    return n


T = TypeVar("T")


def in_turns(sources: Sequence[tuple[ProcessInfo, Iterator[T]]]) -> Iterator[tuple[ProcessInfo, T]]:
    """Each process's next item in turn, the processes in their order, until each has
    none left (how :func:`replay` feeds a sink: the ranks of an engine side by side)."""
    turns = list(sources)
    while turns:
        still = []
        for info, items in turns:
            item = next(items, None)
            if item is not None:
                yield info, item
                still.append((info, items))
        turns = still


def _chunks(steps: Iterator[Step], size: int) -> Iterator[list[Step]]:
    while chunk := list(itertools.islice(steps, size)):
        yield chunk


def _feed(sink: StepConsumer, info: ProcessInfo, chunk: list[Step], progress: Progress) -> int:
    sink.steps(info, chunk, [g for s in chunk if (g := s.gpu) is not None])
    progress.advance(len(chunk))
    return len(chunk)
