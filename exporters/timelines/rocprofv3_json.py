"""``rocprofv3 --output-format json`` output (``.json`` or ``.json.gz``) into a profile.

from exporters.timelines.rocprofv3_json import read_rocprofv3_json

profile = read_rocprofv3_json("908_results.json.gz")
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from exporters.timelines.inputs import read_json_document, timestamp_ns
from exporters.timelines.model import (
    CLOCK_BOOTTIME,
    GpuKernel,
    HostCall,
    Marker,
    Profile,
    ProfileError,
)

__all__ = ["read_rocprofv3_json"]

PathLike = str | os.PathLike[str]


def _dig(path: Path, where: str, obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...`` or a ProfileError that names the record and the missing key."""
    cur = obj
    for i, key in enumerate(keys):
        if not isinstance(cur, dict) or key not in cur:
            dotted = ".".join(keys[: i + 1])
            raise ProfileError(path, f"missing field {dotted!r}", where)
        cur = cur[key]
    return cur


def _dig_int(path: Path, where: str, obj: Any, *keys: str) -> int:
    value = _dig(path, where, obj, *keys)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(path, f"field {'.'.join(keys)!r} is not an integer", where)
    return value


def _key_value_map(raw: Any) -> dict[int, str]:
    """cereal writes ``std::map`` as ``[{"key": k, "value": v}, ...]``; accept a dict too."""
    out: dict[int, str] = {}
    if isinstance(raw, dict):
        for k, v in raw.items():
            with contextlib.suppress(ValueError):
                out[int(k)] = str(v)
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict) and "key" in item and "value" in item:
                with contextlib.suppress(TypeError, ValueError):
                    out[int(item["key"])] = str(item["value"])
    return out


def _external(value: Any) -> int | None:
    if isinstance(value, dict):  # some versions nest {"value": n}
        value = value.get("value")
    if isinstance(value, int) and not isinstance(value, bool) and value != 0:
        return value
    return None


def _op_names(kinds: Sequence[Any], kind: int, operation: int) -> tuple[str, str]:
    """Domain and operation names from ``strings.buffer_records`` (indexed by enum value)."""
    if 0 <= kind < len(kinds) and isinstance(kinds[kind], dict):
        domain = str(kinds[kind].get("kind", kind))[:200]
        ops = kinds[kind].get("operations") or []
        ops = ops if isinstance(ops, list) else []
        op = str(ops[operation])[:200] if 0 <= operation < len(ops) else str(operation)
        return domain, op
    return str(kind), str(operation)


def _obj(path: Path, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProfileError(path, f"is a JSON {type(value).__name__}, expected an object", where)
    return value


def _seq(path: Path, where: str, field: str, value: Any) -> Sequence[Any]:
    if isinstance(value, dict):
        return list(value.values())
    if not isinstance(value, list):
        raise ProfileError(
            path, f"is a JSON {type(value).__name__}, expected a list", f"{where} field {field!r}"
        )
    return value


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _plain_value(value: Any) -> Any:
    """A scalar for ``Profile.meta`` (nested values are not kept)."""
    return value if isinstance(value, str | int | float | bool) or value is None else None


def _times(path: Path, where: str, rec: Mapping[str, Any]) -> tuple[int, int]:
    start = timestamp_ns(
        path, where, _dig(path, where, rec, "start_timestamp"), "field 'start_timestamp'"
    )
    end = timestamp_ns(
        path, where, _dig(path, where, rec, "end_timestamp"), "field 'end_timestamp'"
    )
    if end < start:
        raise ProfileError(path, f"ends ({end}) before it starts ({start})", where)
    return start, end


def read_rocprofv3_json(path: PathLike) -> Profile:
    """Read ``rocprofv3 --output-format json`` output (``.json`` or ``.json.gz``).

    Kernel dispatches (``buffer_records.kernel_dispatch``) are named through
    ``kernel_symbols`` (``formatted_kernel_name``, the name rocprofv3 writes to CSV);
    ``device`` is the agent's ``logical_node_id`` (the ``Agent N`` of rocprofv3's default
    CSV), ``queue``/``stream`` are the queue and stream handles, and ``correlation_id`` the
    internal correlation id. HIP/HSA/RCCL API records become host calls and marker
    records become markers (named by ``strings.marker_api``) when the capture has them;
    operation and domain names come from ``strings.buffer_records``. One file may hold
    several processes; all are merged.

    Raises :class:`ProfileError` for a file that is not JSON, not rocprofv3 output (no
    ``rocprofiler-sdk-tool`` key) or has a record without a required field.
    """
    p = Path(path)
    doc = read_json_document(p)
    if not isinstance(doc, dict) or "rocprofiler-sdk-tool" not in doc:
        raise ProfileError(p, "not rocprofv3 JSON output: no top-level 'rocprofiler-sdk-tool' key")
    entries = doc["rocprofiler-sdk-tool"]
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        raise ProfileError(p, "'rocprofiler-sdk-tool' holds no process records")

    kernels: list[GpuKernel] = []
    host_calls: list[HostCall] = []
    markers: list[Marker] = []
    processes: list[dict[str, Any]] = []
    unresolved = 0
    skipped_markers = 0

    for n, raw_entry in enumerate(entries):
        where = f"rocprofiler-sdk-tool[{n}]"
        entry = _obj(p, where, raw_entry)
        pid = _dig_int(p, where, entry, "metadata", "pid")
        agents: dict[int, dict[str, Any]] = {}
        for i, a in enumerate(_seq(p, where, "agents", _dig(p, where, entry, "agents"))):
            handle = _dig_int(p, f"{where}.agents[{i}]", a, "id", "handle")
            agents[handle] = a
        symbols_raw = entry.get("kernel_symbols") or []
        symbols = symbols_raw.values() if isinstance(symbols_raw, dict) else symbols_raw
        names: dict[int, str] = {}
        for s in _seq(p, where, "kernel_symbols", symbols):
            if isinstance(s, dict) and _int_or_none(s.get("kernel_id")) is not None:
                name = (
                    s.get("formatted_kernel_name")
                    or s.get("demangled_kernel_name")
                    or s.get("kernel_name")
                    or ""
                )
                names[s["kernel_id"]] = name if isinstance(name, str) else str(name)[:200]
        strings = _obj(p, f"{where}.strings", entry.get("strings") or {})
        kinds = _seq(p, where, "strings.buffer_records", strings.get("buffer_records") or [])
        messages = _key_value_map(strings.get("marker_api"))
        records = _obj(p, f"{where}.buffer_records", _dig(p, where, entry, "buffer_records"))

        section_where = f"{where}.buffer_records"
        for i, raw in enumerate(
            _seq(p, section_where, "kernel_dispatch", records.get("kernel_dispatch") or [])
        ):
            rw = f"{section_where}.kernel_dispatch[{i}]"
            rec = _obj(p, rw, raw)
            kernel_id = _dig_int(p, rw, rec, "dispatch_info", "kernel_id")
            name = names.get(kernel_id)
            if not name:
                unresolved += 1
                name = "unknown_kernel"
            agent = agents.get(_dig_int(p, rw, rec, "dispatch_info", "agent_id", "handle"), {})
            device = agent.get("logical_node_id", agent.get("node_id"))
            stream = rec.get("stream_id")
            start, end = _times(p, rw, rec)
            kernels.append(
                GpuKernel(
                    name=name,
                    start_ns=start,
                    end_ns=end,
                    device=_int_or_none(device),
                    stream=_int_or_none(stream.get("handle")) if isinstance(stream, dict) else None,
                    correlation_id=_dig_int(p, rw, rec, "correlation_id", "internal"),
                    pid=pid,
                    tid=_dig_int(p, rw, rec, "thread_id"),
                    queue=_dig_int(p, rw, rec, "dispatch_info", "queue_id", "handle"),
                    external_id=_external(rec["correlation_id"].get("external")),
                )
            )

        for section in ("hip_api", "hsa_api", "rccl_api", "marker_api"):
            for i, raw in enumerate(_seq(p, section_where, section, records.get(section) or [])):
                rw = f"{section_where}.{section}[{i}]"
                rec = _obj(p, rw, raw)
                domain, op = _op_names(
                    kinds, _dig_int(p, rw, rec, "kind"), _dig_int(p, rw, rec, "operation")
                )
                corr = _dig_int(p, rw, rec, "correlation_id", "internal")
                start, end = _times(p, rw, rec)
                tid = _dig_int(p, rw, rec, "thread_id")
                if section == "marker_api":
                    message = messages.get(corr)
                    if message is None:  # pops and thread-id queries carry no message
                        skipped_markers += 1
                        continue
                    markers.append(Marker(message, start, end, pid, tid, domain))
                    continue
                host_calls.append(
                    HostCall(
                        op,
                        domain,
                        start,
                        end,
                        pid,
                        tid,
                        corr,
                        _external(rec["correlation_id"].get("external")),
                    )
                )

        meta_entry = _obj(p, f"{where}.metadata", entry.get("metadata") or {})
        node = meta_entry.get("node")
        processes.append(
            {
                "pid": pid,
                "command": _plain_value(meta_entry.get("command")),
                "hostname": _plain_value(node.get("hostname")) if isinstance(node, dict) else None,
                "agents": [
                    {
                        k: _plain_value(a.get(k))
                        for k in ("type", "node_id", "logical_node_id", "name", "product_name")
                    }
                    | {"handle": h}
                    for h, a in sorted(agents.items())
                ],
            }
        )

    meta = {
        "path": str(p),
        "processes": processes,
        "unresolved_kernel_ids": unresolved,
        "marker_records_without_message": skipped_markers,
    }
    return Profile.build("rocprofv3-json", CLOCK_BOOTTIME, kernels, host_calls, markers, meta)
