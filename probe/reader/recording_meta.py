"""What a recording's small tables must hold, for both formats: the ``meta`` keys the
readers use and the shape of a process's static snapshot."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from probe.reader.recording_open import RecordingError

META_TYPES: Mapping[str, str] = {
    "schema_version": "an integer",
    "created_epoch_ns": "an integer",
    "started_epoch_ns": "an integer",
    "ended_epoch_ns": "an integer",
    "sample_every": "an integer",
    "exit_code": "an integer",
    "command": "a list of strings",
    "probe_command": "a list of strings",
    "host": "a string",
    "probe_version": "a string",
    "override": "a string",
}
"""The ``meta`` keys the readers use, and what each must hold (``null`` passes)."""


def meta_ok(value: Any, want: str) -> bool:
    if want == "an integer":
        return type(value) is int and -(2**63) <= value < 2**63
    if want == "a string":
        return isinstance(value, str)
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def snapshot_of(p: Path, row: Mapping[str, Any]) -> dict[str, Any]:
    """A process's static snapshot: a JSON object, or the recording is damaged."""
    where = f"{p}: table processes, pid {row.get('pid')}, column snapshot"
    try:
        snap = json.loads(row["snapshot"])
    except (TypeError, ValueError, RecursionError) as exc:
        raise RecordingError(f"{where}: not JSON ({' '.join(str(exc).split())})") from None
    if not isinstance(snap, dict):
        raise RecordingError(f"{where}: not a JSON object")
    bad = snapshot_mismatch(snap)
    if bad is not None:
        raise RecordingError(f"{where}: {bad}")
    return snap


_STR_LIST = [str]
SNAPSHOT_SHAPE: dict[str, Any] = {
    "speculative": {"k": int},
    "compilation": {"cudagraph_capture_sizes": [int], "max_cudagraph_capture_size": int},
    "resolve": {"min_cg_support_value": int, "uniform_decode_query_len": int},
    "override": [{"builder": str, "support": str}],
    "groups": [
        {
            "role": str,
            "backend": str,
            "builder": str,
            "declared_support": str,
            "support": str,
            "layers": int,
            "support_value": int,
            "misspelled": _STR_LIST,
        }
    ],
    "limiting_group": {"backend": str, "builder": str},
    "traps": [{"code": str, "message": str}],
    # each missing hook is (target, why)
    "hooks": {"installed": _STR_LIST, "missing": [_STR_LIST]},
    "uniform_decode_query_len": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "min_support_value": int,
    "vllm_version": str,
    "runner": str,
    "platform": str,
    "model": str,
    "min_support": str,
}
"""The containers and numbers of a static snapshot that readers (report, doctor, traps)
walk into: a dict is an object with those keys, a one-item list a list of such items,
a type that type; ``null`` passes everywhere, other keys are not checked."""


def snapshot_mismatch(snap: Any, shape: Any = None, at: str = "") -> str | None:
    """Where ``snap`` does not have :data:`SNAPSHOT_SHAPE` (``"groups[0]: not an object"``),
    or ``None``."""
    shape = SNAPSHOT_SHAPE if shape is None else shape
    if snap is None:
        return None
    if isinstance(shape, dict):
        if not isinstance(snap, dict):
            return f"{at or 'snapshot'}: not an object"
        for k, sub in shape.items():
            bad = snapshot_mismatch(snap.get(k), sub, f"{at}.{k}" if at else k)
            if bad is not None:
                return bad
        return None
    if isinstance(shape, list):
        if not isinstance(snap, list):
            return f"{at}: not a list"
        for i, item in enumerate(snap):
            bad = snapshot_mismatch(item, shape[0], f"{at}[{i}]")
            if bad is not None:
                return bad
        return None
    ok = type(snap) is int if shape is int else isinstance(snap, shape)
    return None if ok else f"{at}: {type(snap).__name__}, not {shape.__name__}"
