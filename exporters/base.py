"""The interface every live sink shares, and the pieces exporters have in common.

A sink consumes what the reader process assembles: :class:`probe.collector.Sink`
(``on_process(proc)``, ``on_steps(proc, steps)``, ``close()``), re-exported here as
:class:`Sink`. Exporters (Prometheus, OTLP) build on :class:`ExportSink`, which turns a
live :class:`~probe.collector.ProcessState` into a plain :class:`ProcessInfo` and its
GPU timings into :class:`GpuSample`, so the same sink also takes a finished recording
(:func:`replay`, used by ``probe export``)::

    >>> from exporters.base import load_sink, replay              # doctest: +SKIP
    >>> sink = load_sink("prometheus").make_sink("127.0.0.1:9464")  # doctest: +SKIP
    >>> replay(Recording.open("run.probe.db"), sink)               # doctest: +SKIP

Each sink module imports its own library at its top; :func:`load_sink` turns the
``ImportError`` of a missing optional dependency into :class:`MissingExtra`, whose
message is the ``pip install`` line to run.
"""

from __future__ import annotations

import importlib
import socket
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from probe.assemble import PHASE_COLUMNS, Step
from probe.collector import ProcessState, Sink
from probe.recording import Recording
from probe.records import (
    Build,
    BuildTag,
    Dispatch,
    Mode,
    Phase,
    Reason,
    Reorder,
    Replay,
    ReplayKind,
    Span,
)

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
    "replay",
    "steps_from_recording",
]

# sink module -> the extra that installs its library
EXTRAS: dict[str, str] = {
    "prometheus": "prometheus",
    "otlp": "otlp",
    "perfetto": "perfetto",
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
            model=str(s.get("model") or ""),
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
            **kw,
        )

    @classmethod
    def from_state(cls, proc: ProcessState) -> ProcessInfo:
        hello = proc.hello
        faults = proc.assembler.faults.values() if proc.assembler is not None else ()
        return cls.from_snapshot(
            proc.pid,
            proc.snapshot,
            boottime_ns=hello.boottime_ns if hello else None,
            epoch_ns=hello.epoch_ns if hello else None,
            dropped=proc.dropped,
            hook_faults=sum(f.count for f in faults),
            builder_names=dict(proc.decoder.strings),
        )

    @property
    def rank(self) -> str:
        return f"tp{self.tp_rank}/pp{self.pp_rank}/dp{self.dp_rank}"

    def epoch_ns_of(self, boottime_ns: int) -> int:
        """A CLOCK_BOOTTIME timestamp as Unix epoch ns, through the session's clock pair."""
        if self.boottime_ns is None or self.epoch_ns is None:
            raise ValueError(f"pid {self.pid}: no clock pair (hello record) yet")
        return boottime_ns - self.boottime_ns + self.epoch_ns


@dataclass(frozen=True)
class GpuSample:
    """Device timing of one step's forward (arrives a few steps after the step)."""

    step: int
    busy_ns: int
    idle_before_ns: int | None


class StepConsumer(Protocol):
    """What :func:`replay` and :class:`ExportSink` feed: plain process facts and steps."""

    def process(self, info: ProcessInfo) -> None: ...

    def steps(self, info: ProcessInfo, steps: Sequence[Step], gpu: Sequence[GpuSample]) -> None: ...

    def close(self) -> None: ...


class ExportSink:
    """Base of the exporters: a :class:`Sink` for the collector, a :class:`StepConsumer`
    for recordings. Subclasses implement :meth:`process`, :meth:`steps` and :meth:`close`.
    """

    def __init__(self) -> None:
        self._gpu_done: dict[int, int] = {}

    def on_process(self, proc: ProcessState) -> None:
        self.process(ProcessInfo.from_state(proc))

    def on_steps(self, proc: ProcessState, steps: Sequence[Step]) -> None:
        gpu: list[GpuSample] = []
        if proc.assembler is not None:
            done = self._gpu_done.get(proc.pid, 0)
            gpu = [
                GpuSample(g.step, g.busy_ns, g.idle_before_ns if g.idle_before_ns >= 0 else None)
                for g in proc.assembler.gpu[done:]
            ]
            self._gpu_done[proc.pid] = len(proc.assembler.gpu)
        self.steps(ProcessInfo.from_state(proc), steps, gpu)

    def process(self, info: ProcessInfo) -> None:
        raise NotImplementedError

    def steps(self, info: ProcessInfo, steps: Sequence[Step], gpu: Sequence[GpuSample]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


# -- recordings -> steps ---------------------------------------------------------------------


def _enum(cls: Any, name: str | None, default: Any = None) -> Any:
    if name is None:
        return default
    return cls[name.upper()]


def _group(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[int, int], list[Mapping[str, Any]]]:
    out: dict[tuple[int, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        out[(r["pid"], r["step"])].append(r)
    return out


def steps_from_recording(
    rec: Recording,
) -> tuple[list[ProcessInfo], dict[int, list[Step]], dict[int, list[GpuSample]]]:
    """A recording as the collector would have delivered it: process facts, steps, GPU.

    Builder names are given small ids (``ProcessInfo.builder_names``) as the ring's string
    table does; everything else is the recorded value.
    """
    meta = rec.meta()
    host = str(meta.get("host") or "")
    faults: dict[int, int] = defaultdict(int)
    for f in rec.rows("faults"):
        faults[f["pid"]] += f["count"] or 0
    spans = _group(rec.rows("spans"))
    dispatches = _group(rec.rows("dispatches"))
    replays = _group(rec.rows("replays"))
    builds = _group(rec.rows("builds"))
    reorders = _group(rec.rows("reorders"))
    names: dict[int, dict[str, int]] = defaultdict(dict)
    for (pid, _), rows in builds.items():
        for b in rows:
            names[pid].setdefault(b["builder"] or "?", len(names[pid]) + 1)
    procs = [
        ProcessInfo.from_snapshot(
            p["pid"],
            p["snapshot"],
            host=host,
            boottime_ns=p["boottime_ns"],
            epoch_ns=p["epoch_ns"],
            dropped=p["dropped"] or 0,
            hook_faults=faults[p["pid"]],
            builder_names={v: k for k, v in names[p["pid"]].items()},
        )
        for p in rec.processes()
    ]
    steps: dict[int, list[Step]] = defaultdict(list)
    gpu: dict[int, list[GpuSample]] = defaultdict(list)
    for r in rec.steps():
        key = (r["pid"], r["step"])
        phases = {p.name.lower(): r.get(f"{p.name.lower()}_ns") or 0 for p in PHASE_COLUMNS}
        steps[r["pid"]].append(
            Step(
                pid=r["pid"],
                step=r["step"],
                t0=r["t0_ns"],
                t1=r["t1_ns"],
                host_ns=r["host_ns"] or 0,
                num_tokens=r["num_tokens"] or 0,
                num_reqs=r["num_reqs"] or 0,
                mode=_enum(Mode, r["mode"]),
                reason=_enum(Reason, r["reason"]),
                padded_tokens=r["padded_tokens"] or 0,
                padded_reqs=r["padded_reqs"] or 0,
                max_query_len=r["max_query_len"] or 0,
                uniform_decode_query_len=r["uniform_decode_query_len"] or 0,
                uniform=bool(r["uniform"]),
                replayed=bool(r["replayed"]),
                pieces=r["pieces"] or 0,
                captures=r["captures"] or 0,
                cpu_launch_overhead_ns=r["cpu_launch_overhead_ns"],
                phases=phases,
                draft_mode=_enum(Mode, r["draft_mode"]),
                draft_reason=_enum(Reason, r["draft_reason"]),
                draft_replays=r["draft_replays"] or 0,
                draft_dispatches=r["draft_dispatches"] or 0,
                runner=r["runner"] or "v1",
                spans=tuple(
                    Span(s["step"], Phase[s["phase"].upper()], s["t0_ns"], s["t1_ns"], s["drafter"])
                    for s in spans.get(key, ())
                ),
                dispatches=tuple(
                    Dispatch(
                        d["step"],
                        Mode[d["mode"].upper()],
                        _enum(Reason, d["reason"], Reason.UNKNOWN),
                        d["drafter"] | (4 if d["uniform"] else 0),
                        d["t0_ns"],
                        d["t1_ns"],
                        d["num_tokens"],
                        d["padded_tokens"],
                        d["num_reqs"],
                        d["padded_reqs"],
                        d["max_query_len"],
                        d["uniform_decode_query_len"],
                    )
                    for d in dispatches.get(key, ())
                ),
                replays=tuple(
                    Replay(
                        x["step"],
                        Mode[x["mode"].upper()],
                        ReplayKind[x["kind"].upper()],
                        x["drafter"] | (16 if x["breakable"] else 0),
                        x["t0_ns"],
                        x["t1_ns"],
                        x["num_tokens"],
                    )
                    for x in replays.get(key, ())
                ),
                builds=tuple(
                    Build(
                        b["step"],
                        _enum(BuildTag, b["tag"], BuildTag.STEP),
                        names[b["pid"]][b["builder"] or "?"],
                        b["drafter"],
                        b["t0_ns"],
                        b["t1_ns"],
                        b["padded_tokens"],
                        b["real_tokens"],
                        b["padded_reqs"],
                        b["real_reqs"],
                        b["max_query_len"],
                        b["reorder_batch_threshold"],
                        b["num_decodes"],
                        b["num_prefills"],
                        b["num_decode_tokens"],
                        b["num_prefill_tokens"],
                    )
                    for b in builds.get(key, ())
                ),
                reorders=tuple(
                    Reorder(
                        o["step"],
                        bool(o["changed"]),
                        0,
                        o["t0_ns"],
                        o["t1_ns"],
                        o["threshold"],
                        o["num_reqs"],
                        o["num_decodes"],
                        o["num_decode_tokens"],
                        o["moved"],
                        bool(o["spec_as_decode"]),
                    )
                    for o in reorders.get(key, ())
                ),
            )
        )
        if r["gpu_busy_ns"] is not None:
            gpu[r["pid"]].append(GpuSample(r["step"], r["gpu_busy_ns"], r["gpu_idle_before_ns"]))
    return procs, dict(steps), dict(gpu)


def replay(rec: Recording, sink: StepConsumer, *, batch: int = 256) -> int:
    """Feed a recording into ``sink`` in step order, ``batch`` steps at a time.

    Returns the number of steps fed. The sink is not closed.
    """
    procs, steps, gpu = steps_from_recording(rec)
    n = 0
    for info in procs:
        sink.process(info)
        mine = steps.get(info.pid, [])
        timings = {g.step: g for g in gpu.get(info.pid, [])}
        for i in range(0, len(mine), batch):
            chunk = mine[i : i + batch]
            sink.steps(info, chunk, [timings[s.step] for s in chunk if s.step in timings])
            n += len(chunk)
    return n
