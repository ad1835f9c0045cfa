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

import functools
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from exporters.metrics import METRICS, Metric
from exporters.series import (
    DEFAULT_INTERVAL_S,
    Hist,
    Key,
    Timeline,
    Value,
    instance_id,
    recording_ticks,
)
from probe.progress import SILENT, Progress
from probe.reader.recording import Recording
from probe.reader.recording_set import RecordingSet

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
                    yield from _sample(m.name, lab, t, v)
    yield "# EOF\n"


def _header(m: Metric) -> Iterator[str]:
    fam = _family(m)
    yield f"# TYPE {fam} {m.kind}\n"
    if m.unit in _UNITS and fam.endswith("_" + _UNITS[m.unit]):
        yield f"# UNIT {fam} {_UNITS[m.unit]}\n"
    yield f"# HELP {fam} {_escape(m.help)}\n"


def _sample(name: str, lab: dict[str, str], t: int, v: Value) -> Iterator[str]:
    """The lines of one series' value ``v`` at ``t`` (epoch ns)."""
    ts = f"{t // 1_000_000 / 1000:.3f}"
    text, les = _label_text(tuple(lab.items()), v.bounds if isinstance(v, Hist) else ())
    if isinstance(v, Hist):
        acc = 0
        for le, c in zip(les, v.counts, strict=True):
            acc += c
            yield f"{name}_bucket{le} {acc} {ts}\n"
        yield f"{name}_count{text} {v.count} {ts}\n"
        yield f"{name}_sum{text} {_num(v.sum)} {ts}\n"
    else:
        yield f"{name}{text} {_num(v)} {ts}\n"


@functools.lru_cache(maxsize=1 << 14)
def _label_text(
    items: tuple[tuple[str, str], ...], bounds: tuple[float, ...]
) -> tuple[str, tuple[str, ...]]:
    """A series' label text, and a histogram's per bucket (with ``le``): escaped once per
    series, not once per sample."""
    lab = dict(items)
    les = tuple(_labels({**lab, "le": _num_le(b)}) for b in (*bounds, math.inf)) if bounds else ()
    return _labels(lab), les


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
    """Write ``rec`` as OpenMetrics to ``out``; returns the number of samples written.

    The text is the one :func:`lines` gives for :func:`exporters.series.timelines`, made
    as the steps are read: each process's step events are sorted by time in runs held to
    a bound (spilled to a temporary file past it) and read twice (the series that ever
    appear, then the ticks: :func:`exporters.series.process_ticks`); each series'
    samples are appended to a spool (memory up to a bound, then the same file) and the
    families are written from it in order. Memory
    holds a window of events and of text, not the recording's timelines.
    """
    if interval_s <= 0:
        raise ValueError(f"interval must be above 0 s, got {interval_s}")
    with _Spool() as spool:
        keys = _sample_streams(rec, interval_s, spool, progress)
        n = 0
        for m in METRICS.values():
            for line in _header(m):
                out.write(line)
            for tl, tl_keys in enumerate(keys):
                for i, (name, _) in enumerate(tl_keys):
                    if name == m.name:
                        n += spool.write_stream((tl, i), out)
        out.write("# EOF\n")
    return n


_HOLD_TEXT = 32 << 20
"""Characters of sample text held in memory before they are appended to the file."""


class _Spool:
    """Streams of text, in memory to a bound and in one temporary file past it."""

    def __init__(self) -> None:
        self.file: IO[bytes] | None = None
        self.text: dict[tuple[int, int], list[str]] = {}
        self.chunks: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        self.held_text = 0

    def __enter__(self) -> _Spool:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.file is not None:
            self.file.close()

    def _file(self) -> IO[bytes]:
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="probe-om-")  # noqa: SIM115 (__exit__)
        self.file.seek(0, os.SEEK_END)
        return self.file

    # -- streams of text, appended in order

    def append(self, stream: tuple[int, int], text: str) -> None:
        self.text.setdefault(stream, []).append(text)
        self.held_text += len(text)
        if self.held_text >= _HOLD_TEXT:
            f = self._file()
            for k, parts in self.text.items():
                if parts:
                    data = "".join(parts).encode()
                    self.chunks.setdefault(k, []).append((f.tell(), len(data), len(parts)))
                    f.write(data)
                    parts.clear()
            self.held_text = 0

    def write_stream(self, stream: tuple[int, int], out: IO[str]) -> int:
        """Write one stream's text to ``out``; returns the number of samples (lines)."""
        n = 0
        for offset, size, _ in self.chunks.pop(stream, []):
            assert self.file is not None
            self.file.seek(offset)
            data = self.file.read(size).decode()
            out.write(data)
            n += data.count("\n")
        parts = self.text.pop(stream, [])
        for p in parts:
            out.write(p)
            n += p.count("\n")
        return n


def _sample_streams(
    rec: Recording | RecordingSet, interval_s: float, spool: _Spool, progress: Progress
) -> list[list[Key]]:
    """Every clocked process's samples into ``spool`` (stream (process, series) -> text),
    as :func:`exporters.series.recording_ticks` samples them; returns each process's
    series."""
    out: list[list[Key]] = []
    for tk in recording_ticks(rec, interval_s, progress=progress):
        target = {"job": JOB, "instance": instance_id(tk.info)}
        labels = [{**target, **dict(pairs)} for _, pairs in tk.keys]
        tl = len(out)
        for tick, state in tk:
            for i, k in enumerate(tk.keys):
                spool.append((tl, i), "".join(_sample(k[0], labels[i], tick, state[k])))
        out.append(tk.keys)
    return out


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
