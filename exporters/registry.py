"""The exporter registry: every exporter by name, built in or installed by a plugin.

Every exporter is an :class:`Exporter`: a name, a line of help, what its target is, and
the module that implements the contract of :mod:`exporters.base`: offline, a
module-level ``write(recording, target)`` (``write(recording, target, progress=...)``
when ``reports_progress``: a :class:`probe.progress.Progress` it reports its stages to);
live (``live=True``), a ``make_sink(target)``
giving an :class:`~exporters.base.ExportSink` (``on_process``, ``on_steps(proc, steps,
gpu)``, ``close``). ``probe export --to NAME --out TARGET`` runs one through the same
guarded write path as the named flags (:mod:`probe.reader.output`: the target checked first,
a private temporary, ``--force`` to replace); ``probe export --to list`` lists them.

Other packages add exporters the way vLLM's stat-logger plugins are found: an entry point
in the ``vllm_graph_probe.exporters`` group naming an :class:`Exporter`::

    # the plugin's pyproject.toml
    [project.entry-points."vllm_graph_probe.exporters"]
    influx = "probe_influx:EXPORTER"   # Exporter("influx", ..., module="probe_influx")

Describing an exporter imports nothing of its library; :meth:`Exporter.load` does, and a
missing optional library raises :class:`~exporters.base.MissingExtra` naming the extra.
The project's own exporters are registered in this group too (pyproject.toml) and are
also built in, so a checkout whose installed metadata predates one still finds it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from exporters.base import MissingExtra
from probe.progress import Progress

__all__ = ["BUILTIN", "GROUP", "Exporter", "UnknownExporter", "exporters", "get", "listing"]

GROUP = "vllm_graph_probe.exporters"

log = logging.getLogger("probe")


class UnknownExporter(ValueError):
    """No exporter of that name is registered; the message lists the known ones."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"no exporter named {name!r}; known: {', '.join(known)}")


@dataclass(frozen=True)
class Exporter:
    """One exporter: ``module`` implements ``write(recording, target)`` (and ``make_sink``
    when ``live``); ``extra`` is the pip extra its library comes with (None: none needed);
    ``reports_progress``: its ``write`` takes ``progress=``; ``streams``: its file can be
    standard output (``--out -``; a database cannot)."""

    name: str
    help: str
    target: str
    module: str
    extra: str | None = None
    live: bool = False
    reports_progress: bool = False
    streams: bool = True

    def load(self) -> ModuleType:
        """Import the module; a missing optional library raises :class:`MissingExtra`."""
        try:
            mod = importlib.import_module(self.module)
        except ImportError as exc:
            if isinstance(exc, MissingExtra):
                raise
            missing = exc.name or None
            if self.extra is None or (
                missing is not None and missing.split(".")[0] in ("exporters", "probe")
            ):
                raise  # our own module is broken, or nothing optional is involved
            raise MissingExtra(self.name, self.extra, missing) from exc
        if not callable(getattr(mod, "write", None)):
            raise TypeError(
                f"exporter {self.name!r}: {self.module} has no write(recording, target)"
            )
        return mod

    def write(self, recording: Any, target: str, progress: Progress | None = None) -> Any:
        """Run the offline half: ``recording`` (an open Recording) into ``target``;
        ``progress`` is handed on when the exporter ``reports_progress``."""
        if progress is not None and self.reports_progress:
            return self.load().write(recording, target, progress=progress)
        return self.load().write(recording, target)

    def make_sink(self, target: str) -> Any:
        """The live half: a sink for the collector."""
        if not self.live:
            raise TypeError(f"exporter {self.name!r} has no live sink")
        return self.load().make_sink(target)


PROMETHEUS = Exporter(
    "prometheus",
    "a Prometheus textfile of the recording's totals (node_exporter); live: /metrics",
    "FILE",
    "exporters.prometheus",
    "prometheus",
    live=True,
    reports_progress=True,
)
OPENMETRICS = Exporter(
    "openmetrics",
    "OpenMetrics with the recording's own timestamps, for promtool's backfill",
    "FILE",
    "exporters.openmetrics",
    reports_progress=True,
)
OTLP = Exporter(
    "otlp",
    "spans and metrics over OTLP/HTTP at the recording's time; live: pushed as it runs",
    "ENDPOINT",
    "exporters.otlp",
    "otlp",
    live=True,
    reports_progress=True,
)
PERFETTO = Exporter(
    "perfetto",
    "a Perfetto trace (steps, phases, graph decisions, reorder marks on BOOTTIME)",
    "FILE",
    "exporters.perfetto",
    "perfetto",
    reports_progress=True,
)
ROCPD = Exporter(
    "rocpd",
    "a rocpd side-car database (ROCm's rocpd merge / convert put it beside rocprofv3's)",
    "FILE",
    "exporters.rocpd",
    reports_progress=True,
    streams=False,
)

PARQUET = Exporter(
    "parquet",
    "the recording's tables as Parquet, partitioned by host and day (DuckDB, Spark, Trino)",
    "DIR",
    "exporters.parquet",
    "parquet",
    reports_progress=True,
)

BUILTIN: Mapping[str, Exporter] = {
    e.name: e for e in (PROMETHEUS, OPENMETRICS, OTLP, PERFETTO, ROCPD, PARQUET)
}


def exporters() -> dict[str, Exporter]:
    """Every registered exporter by name: the built-in ones and the entry points of
    :data:`GROUP` (a plugin's entry that does not load is logged and left out)."""
    found = dict(BUILTIN)
    for ep in entry_points(group=GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin must not take `probe export` down
            log.warning("probe: exporter plugin %s (%s) did not load: %s", ep.name, ep.value, exc)
            continue
        if not isinstance(obj, Exporter):
            log.warning("probe: exporter plugin %s (%s) is not an Exporter", ep.name, ep.value)
            continue
        found.setdefault(ep.name, obj)
    return dict(sorted(found.items()))


def get(name: str) -> Exporter:
    """The exporter called ``name``; :class:`UnknownExporter` when there is none."""
    known = exporters()
    if name not in known:
        raise UnknownExporter(name, list(known))
    return known[name]


def listing() -> str:
    """The registered exporters, one a line: name, target, live or offline, help."""
    rows = exporters().values()
    width = max(len(e.name) for e in rows)
    return "\n".join(
        f"{e.name:<{width}}  {e.target:<8}  {'live+file' if e.live else 'file':<9}  {e.help}"
        for e in rows
    )
