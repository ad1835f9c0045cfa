"""A finished recording as OpenMetrics text with timestamps, for Prometheus's backfill.

``probe export run.probe.db --openmetrics run.om`` writes every series of
:mod:`exporters.metrics` sampled every second of the recording's own time
(:mod:`exporters.series`), each sample stamped with that time, ending in ``# EOF``.
``promtool tsdb create-blocks-from openmetrics run.om DATA_DIR`` turns it into TSDB
blocks; a Prometheus started on ``DATA_DIR`` then charts the recording over the time it
ran, ``rate()`` panels included::

    >>> from exporters.openmetrics import write                    # doctest: +SKIP
    >>> write(Recording.open("run.probe.db"), "run.om")            # doctest: +SKIP

Every series carries ``job`` (``vllm-graph-probe``) and ``instance`` (the process's stable
:func:`exporters.series.instance_id`), the labels a scrape or the Collector's
Prometheus exporter would add, so the dashboards' job and instance variables work on a
backfilled Prometheus too. No ``_created`` series are written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from exporters.metrics import METRICS, Metric
from exporters.series import DEFAULT_INTERVAL_S, Hist, Timeline, instance_id, timelines
from probe.progress import SILENT, Progress
from probe.reader.recording import Recording

__all__ = ["JOB", "lines", "write"]

JOB = "vllm-graph-probe"

# OpenMetrics units are base units spelled out; a family with a UNIT must end in it
_UNITS = {"s": "seconds"}


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v)) if v != int(v) or abs(v) >= 1e15 else str(int(v))


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items()) + "}"


def _family(m: Metric) -> str:
    # the OpenMetrics family of a counter is its name without _total
    return m.name.removesuffix("_total") if m.kind == "counter" else m.name


def lines(tls: list[Timeline], job: str = JOB) -> Iterator[str]:
    """The OpenMetrics exposition of ``tls``, line by line (with newlines), ``# EOF`` last.

    Families are contiguous and every series' samples are in time order, as OpenMetrics
    and promtool require."""
    for m in METRICS.values():
        fam = _family(m)
        yield f"# TYPE {fam} {m.kind}\n"
        if m.unit in _UNITS and fam.endswith("_" + _UNITS[m.unit]):
            yield f"# UNIT {fam} {_UNITS[m.unit]}\n"
        yield f"# HELP {fam} {_escape(m.help)}\n"
        for tl in tls:
            target = {"job": job, "instance": instance_id(tl.info)}
            for (name, pairs), values in tl.series.items():
                if name != m.name:
                    continue
                lab = {**target, **dict(pairs)}
                for t, v in zip(tl.ticks, values, strict=True):
                    ts = f"{t // 1_000_000 / 1000:.3f}"
                    if isinstance(v, Hist):
                        acc = 0
                        for bound, c in zip((*v.bounds, math.inf), v.counts, strict=True):
                            acc += c
                            le = _labels({**lab, "le": _num_le(bound)})
                            yield f"{m.name}_bucket{le} {acc} {ts}\n"
                        yield f"{m.name}_count{_labels(lab)} {v.count} {ts}\n"
                        yield f"{m.name}_sum{_labels(lab)} {_num(v.sum)} {ts}\n"
                    else:
                        yield f"{m.name}{_labels(lab)} {_num(v)} {ts}\n"
    yield "# EOF\n"


def _num_le(bound: float) -> str:
    # the `le` values the live exporter (prometheus_client) writes, so one query matches both
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def write_to(
    rec: Recording,
    out: IO[str],
    interval_s: float = DEFAULT_INTERVAL_S,
    *,
    progress: Progress = SILENT,
) -> int:
    """Write ``rec`` as OpenMetrics to ``out``; returns the number of samples written."""
    n = 0
    for line in lines(timelines(rec, interval_s, progress=progress)):
        out.write(line)
        n += not line.startswith("#")
    return n


def write(
    rec: Recording,
    target: str | os.PathLike[str],
    interval_s: float = DEFAULT_INTERVAL_S,
    *,
    progress: Progress = SILENT,
) -> int:
    """Write ``rec`` as OpenMetrics to the file ``target`` (atomically; ``-``: stdout).
    Returns the number of samples written; ``progress`` counts the steps read."""
    if str(target) == "-":
        import sys

        return write_to(rec, sys.stdout, interval_s, progress=progress)
    p = Path(target)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w") as f:
            n = write_to(rec, f, interval_s, progress=progress)
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
    return n
