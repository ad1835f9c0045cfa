"""The bundled recording as an engine that calibrated the probe at attach would have
written it: a copy with a calibration in its process's snapshot (the bundled recording
predates the calibration)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recordings import copy_recording, sqlite_of

from probe.reader.recording import default_recording

CALIBRATION: Mapping[str, Any] = {
    "hot_path": "compiled",
    "span_ns": 80.0,
    "hook_ns": 120.0,
    "dormant_ns": 20.0,
    "span_cold_ns": 900.0,
    "hook_cold_ns": 2800.0,
    "span_cold_code_ns": 2000.0,
    "hook_cold_code_ns": 6000.0,
}
"""Per-call figures of every timing (warm, data evicted, code evicted too)."""


def calibrated_copy(dst: Path, cal: Mapping[str, Any] | None = CALIBRATION) -> Path:
    """Copy the bundled recording to ``dst`` (a SQLite file, ``*.db``) with ``cal`` as its
    process's calibration (``snapshot["probe"]["calibration"]``; None or any value, as a
    damaged one)."""
    copy_recording(sqlite_of(default_recording()), dst)
    con = sqlite3.connect(dst)
    pid, raw = con.execute(
        "SELECT pid, snapshot FROM processes WHERE snapshot IS NOT NULL"
    ).fetchone()
    snap = json.loads(raw)
    snap["probe"] = {"hot_path": "compiled", "calibration": cal}
    con.execute("UPDATE processes SET snapshot=? WHERE pid=?", (json.dumps(snap), pid))
    con.commit()
    con.close()
    return dst
