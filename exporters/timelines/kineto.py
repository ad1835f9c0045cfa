"""Kineto (torch profiler) chrome traces: import, graph-launch accounting, HTA-style analyses.

:func:`read_kineto` turns a ``torch.profiler`` trace (``.json`` or ``.json.gz``, CUDA/CUPTI
or ROCm/roctracer) into a :class:`~exporters.timelines.model.Profile`:

- ``cat: "kernel"`` slices -> :class:`GpuKernel` (``args.device``, ``args.stream``,
  ``args.correlation``); the launching pid/tid come from the runtime call with the same
  correlation id;
- ``cuda_runtime`` / ``cuda_driver`` slices -> :class:`HostCall` (``cudaLaunchKernel``,
  ``cudaGraphLaunch``, ``hipLaunchKernel``, ``hipExtModuleLaunchKernel``,
  ``hipGraphLaunch``...); ``domain`` is the category;
- ``user_annotation`` and ``python_function`` slices -> :class:`Marker` (choose others,
  e.g. ``gpu_user_annotation`` or ``cpu_op``, with ``marker_categories``);
- flow events (``ac2g``, and ``async_cpu_to_gpu`` in older traces) give a kernel its
  correlation id when ``args.correlation`` is absent.

Timestamps: Kineto writes ``ts``/``dur`` in microseconds with three decimals, relative to
``baseTimeNanoseconds`` when present (absolute epoch microseconds in older traces). They are
parsed as decimals, so the nanoseconds are exact, not rounded through a float.

A graph replay is one ``cudaGraphLaunch``/``hipGraphLaunch`` whose correlation id every
replayed kernel shares::

    >>> profile = read_kineto("graph_execution.json.gz")  # doctest: +SKIP
    >>> count_graph_launches(profile), len(kernels_by_launch(profile)[505113])  # doctest: +SKIP
    (1, 421)
    >>> [d.start_to_start_ns for d in launch_delays(profile) if d.is_graph_launch]  # doctest: +SKIP
    [6885076]

The analyses (``count_graph_launches``, ``kernels_by_launch``, ``launch_delays``,
``gpu_busy_idle``) live in :mod:`exporters.timelines.analyses` and work on any profile.
"""

from __future__ import annotations

import math
import os
import reprlib
from collections.abc import Iterable
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from exporters.timelines.inputs import MAX_TIMESTAMP_NS, read_json_document, timestamp_ns
from exporters.timelines.model import (
    CLOCK_UNIX_EPOCH,
    GpuKernel,
    HostCall,
    Marker,
    Profile,
    ProfileError,
)

__all__ = ["DEFAULT_MARKER_CATEGORIES", "FLOW_CATEGORIES", "RUNTIME_CATEGORIES", "read_kineto"]

RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
"""Kineto categories of host API calls (HIP calls use the same ``cuda_runtime`` category)."""

DEFAULT_MARKER_CATEGORIES = frozenset({"user_annotation", "python_function"})
"""Slice categories :func:`read_kineto` imports as markers by default."""

FLOW_CATEGORIES = frozenset({"ac2g", "async_cpu_to_gpu"})
"""Runtime-to-GPU flow categories: ``ac2g`` (current Kineto), ``async_cpu_to_gpu`` (older)."""

_KERNEL_CATEGORY = "kernel"
_THOUSAND = Decimal(1000)
_LIMIT = MAX_TIMESTAMP_NS
_LIMIT_US = MAX_TIMESTAMP_NS // 1000 + 1
_MAX_META_DEPTH = 32


def _ns(value: Any, base_ns: int) -> int | None:
    """Kineto microseconds (int, float or decimal) -> integer nanoseconds since the base.

    None for anything else: text, NaN, infinities and magnitudes no 64-bit clock reaches
    (checked before converting, so ``1e999999999`` costs nothing).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return base_ns + value * 1000 if abs(value) < _LIMIT_US else None
    if isinstance(value, Decimal):
        if not value.is_finite() or abs(value) >= _LIMIT_US:
            return None
        return base_ns + int((value * _THOUSAND).to_integral_value(rounding=ROUND_HALF_EVEN))
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) >= _LIMIT_US:
            return None
        return base_ns + round(value * 1000)
    return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) <= _LIMIT else None
    if isinstance(value, Decimal):
        if value.is_finite() and abs(value) <= _LIMIT and value == value.to_integral_value():
            return int(value)
        return None
    if isinstance(value, str) and len(value) <= 24:
        try:
            n = int(value, 0)
        except ValueError:
            return None
        return n if abs(n) <= _LIMIT else None
    return None


def _text(value: Any) -> str:
    """A name: text as written, anything else (a number, a list) shortened to 200 characters."""
    if isinstance(value, str):
        return value
    return "" if value is None else reprlib.repr(value)[:200]


def _args(e: dict[str, Any]) -> dict[str, Any]:
    a = e.get("args")
    return a if isinstance(a, dict) else {}


def _plain(path: Path, key: str, value: Any, depth: int = 0) -> Any:
    """JSON data with decimals turned back into ints/floats (for ``Profile.meta``)."""
    if depth > _MAX_META_DEPTH:
        raise ProfileError(
            path, f"nested deeper than {_MAX_META_DEPTH} levels", f"top-level field {key!r}"
        )
    if isinstance(value, Decimal):
        if value.is_finite() and abs(value) <= _LIMIT and value == value.to_integral_value():
            return int(value)
        return float(value)
    if isinstance(value, dict):
        return {k: _plain(path, key, v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(path, key, v, depth + 1) for v in value]
    return value


def _parse_decimal(text: str) -> Decimal | float:
    try:
        d = Decimal(text)
    except InvalidOperation:  # pragma: no cover - json only hands over valid numbers
        raise ValueError(text) from None
    if d.adjusted() > 40:  # far past any clock; arithmetic on it would overflow the context
        return float("-inf") if d.is_signed() else float("inf")
    return d


def read_kineto(
    path: str | os.PathLike[str],
    *,
    marker_categories: Iterable[str] = DEFAULT_MARKER_CATEGORIES,
) -> Profile:
    """Read a Kineto chrome trace (``.json`` or ``.json.gz``) into a profile (epoch ns).

    ``marker_categories`` picks the slice categories imported as markers (their pid/tid
    are as written: for ``gpu_user_annotation`` that is the device and stream).
    ``meta`` keeps the trace's top-level fields (``schemaVersion``, ``deviceProperties``,
    ``distributedInfo``, ``baseTimeNanoseconds``...), ``process_names`` from metadata
    events, per-category flow event counts (``flow_events``) and how many kernels got
    their correlation id from a flow (``kernels_correlated_by_flow``).

    Raises :class:`ProfileError` naming the file for a missing file, a truncated gzip
    stream, text that is not JSON, JSON without a ``traceEvents`` list, and kernel,
    runtime or marker slices without a numeric ``ts`` or integer ``pid``/``tid``.
    """
    p = Path(path)
    doc = read_json_document(p, parse_float=_parse_decimal)
    if not isinstance(doc, dict):
        raise ProfileError(
            p, f"not a Kineto trace: the top level is a JSON {type(doc).__name__}, not an object"
        )
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise ProfileError(
            p,
            "not a Kineto trace: no 'traceEvents' list"
            + (f" (top-level keys: {', '.join(sorted(doc))})" if doc else " (empty object)"),
        )
    base_raw = doc.get("baseTimeNanoseconds", 0)
    base_ns = _as_int(base_raw)
    if base_ns is None:
        raise ProfileError(
            p, f"baseTimeNanoseconds {reprlib.repr(base_raw)} is not an integer in range"
        )
    wanted_markers = frozenset(marker_categories)

    kernels_raw: list[tuple[dict[str, Any], int, int]] = []
    host_calls: list[HostCall] = []
    markers: list[Marker] = []
    flow_ends: dict[tuple[Any, Any, int], int] = {}
    flow_counts: dict[str, dict[str, int]] = {}
    process_names: dict[str, str] = {}
    thread_names: dict[str, str] = {}
    skipped = 0

    def where(i: int, e: dict[str, Any]) -> str:
        return f"traceEvents[{i}] ({e.get('cat')} {_text(e.get('name'))[:60]!r})"

    def times(i: int, e: dict[str, Any]) -> tuple[int, int]:
        ts = e.get("ts")
        start = _ns(ts, base_ns)
        if start is None:
            shown = "missing" if ts is None else f"{reprlib.repr(ts)}, not a finite number"
            raise ProfileError(p, f"'ts' is {shown}", where(i, e))
        dur = e.get("dur", 0)
        dur_ns = _ns(dur, 0) if dur is not None else 0
        if dur_ns is None or dur_ns < 0:
            raise ProfileError(
                p, f"'dur' {reprlib.repr(dur)} is not a finite number >= 0", where(i, e)
            )
        start = timestamp_ns(p, where(i, e), start, "'ts' (with baseTimeNanoseconds)")
        end = timestamp_ns(p, where(i, e), start + dur_ns, "'ts' + 'dur'")
        return start, end

    def host_ids(i: int, e: dict[str, Any]) -> tuple[int, int]:
        pid, tid = _as_int(e.get("pid")), _as_int(e.get("tid"))
        if pid is None or tid is None:
            raise ProfileError(
                p,
                f"pid {reprlib.repr(e.get('pid'))} / tid {reprlib.repr(e.get('tid'))} not integers",
                where(i, e),
            )
        return pid, tid

    for i, e in enumerate(events):
        if not isinstance(e, dict):
            skipped += 1
            continue
        ph = e.get("ph")
        cat = e.get("cat")
        if cat is not None and not isinstance(cat, str):
            raise ProfileError(p, f"'cat' is {type(cat).__name__}, not text", f"traceEvents[{i}]")
        if ph == "X":
            if cat == _KERNEL_CATEGORY:
                start, end = times(i, e)
                kernels_raw.append((e, start, end))
            elif cat in RUNTIME_CATEGORIES:
                start, end = times(i, e)
                pid, tid = host_ids(i, e)
                args = _args(e)
                host_calls.append(
                    HostCall(
                        name=_text(e.get("name", "")),
                        domain=str(cat),
                        start_ns=start,
                        end_ns=end,
                        pid=pid,
                        tid=tid,
                        correlation_id=_as_int(args.get("correlation")),
                        external_id=_as_int(args.get("External id")),
                    )
                )
            elif cat in wanted_markers:
                start, end = times(i, e)
                pid, tid = host_ids(i, e)
                markers.append(Marker(_text(e.get("name", "")), start, end, pid, tid, str(cat)))
        elif ph in ("s", "f") and cat in FLOW_CATEGORIES:
            counts = flow_counts.setdefault(str(cat), {"s": 0, "f": 0})
            counts[str(ph)] += 1
            fid = _as_int(e.get("id"))
            ts = _ns(e.get("ts"), base_ns)
            if ph == "f" and fid is not None and ts is not None:
                flow_ends[(_as_int(e.get("pid")), _as_int(e.get("tid")), ts)] = fid
        elif ph == "M" and e.get("name") in ("process_name", "thread_name"):
            name = _args(e).get("name")
            if isinstance(name, str) and e.get("name") == "process_name":
                process_names[str(_as_int(e.get("pid")))] = name
            elif isinstance(name, str):
                thread_names[f"{_as_int(e.get('pid'))} {_as_int(e.get('tid'))}"] = name

    calls_by_corr: dict[int, HostCall] = {}
    for c in host_calls:
        if c.correlation_id is not None:
            calls_by_corr.setdefault(c.correlation_id, c)
    by_flow = 0
    kernels: list[GpuKernel] = []
    for e, start, end in kernels_raw:
        args = _args(e)
        corr = _as_int(args.get("correlation"))
        if corr is None:
            corr = flow_ends.get((_as_int(e.get("pid")), _as_int(e.get("tid")), start))
            by_flow += corr is not None
        device = _as_int(args.get("device"))
        stream = _as_int(args.get("stream"))
        call = calls_by_corr.get(corr) if corr is not None else None
        kernels.append(
            GpuKernel(
                name=_text(e.get("name", "")),
                start_ns=start,
                end_ns=end,
                device=device if device is not None else _as_int(e.get("pid")),
                stream=stream if stream is not None else _as_int(e.get("tid")),
                correlation_id=corr,
                pid=call.pid if call else None,
                tid=call.tid if call else None,
                external_id=_as_int(args.get("External id")),
            )
        )

    meta: dict[str, Any] = {k: _plain(p, k, v) for k, v in doc.items() if k != "traceEvents"}
    meta.update(
        {
            "path": str(p),
            "event_count": len(events),
            "flow_events": flow_counts,
            "kernels_correlated_by_flow": by_flow,
            "process_names": process_names,
            "thread_names": thread_names,
            "skipped_events": skipped,
        }
    )
    return Profile.build("kineto", CLOCK_UNIX_EPOCH, kernels, host_calls, markers, meta)
