"""The layers by process: code that runs inside vLLM imports nothing of the reader side.

The engine side (plugin, runtime, hooks, ring writer, control server, the live markers)
runs in every vLLM process; the reader side (collector, assembler, recording, analysis,
report, live view, CLI) and ``exporters/`` run in ``probe``'s own process. A fresh
interpreter arms the probe the way vLLM does, enables the hooks on a real ring with the
live markers asked for, and lists what got imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

READER_SIDE = (
    "probe.analysis.views",
    "probe.reader.assemble",
    "probe.cli.main",
    "probe.reader.collector",
    "probe.cli.commands",
    "probe.reader.control",
    "probe.reader.discover",
    "probe.cli.render_live",
    "probe.reader.recording",
    "probe.reader.recording_schema",
    "probe.cli.render_report",
    "probe.reader.sqlite_errors",
    "probe.reader.sqlite_read",
    "probe.step",
)

ENGINE = """
import json, os, sys, tempfile
from probe.engine import plugin, hooks, control_server, runtime
ring = plugin.ring_path_for(os.getpid(), {"PROBE_RUN_DIR": tempfile.mkdtemp()})
from probe.engine.ring_writer import RingWriter
writer = RingWriter.create(ring, 1 << 16)
hooks.attach(writer, gpu_timing=False)
hooks.disable()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("probe", "exporters"))))
"""


def _engine_modules(tmp_path: Path) -> list[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PROBE_ROCTX": "1",
        "PROBE_NVTX": "1",
        "PROBE_RUN_DIR": str(tmp_path),
    }
    out = subprocess.run(
        [sys.executable, "-c", ENGINE],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=True,
    )
    mods: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return mods


def test_the_engine_side_imports_hooks_and_records(tmp_path: Path) -> None:
    mods = _engine_modules(tmp_path)
    assert {
        "probe.engine.hooks",
        "probe.records",
        "probe.engine.runtime",
        "probe.ring",
        "probe.engine.control_server",
    } <= set(mods)


def test_the_engine_side_imports_no_exporter(tmp_path: Path) -> None:
    mods = _engine_modules(tmp_path)
    assert [m for m in mods if m.split(".")[0] == "exporters"] == []


def test_the_engine_side_imports_nothing_of_the_reader_side(tmp_path: Path) -> None:
    mods = _engine_modules(tmp_path)
    # "probe.reader.control" (the client) must not match "probe.engine.control_server" (the server)
    reader = [
        m for m in mods if m in READER_SIDE or m.startswith(tuple(f"{r}." for r in READER_SIDE))
    ]
    assert reader == []


def test_no_source_file_is_over_800_lines() -> None:
    """Rooms stay small: every source file (Python, and the C of the accelerator) of the
    package, the exporters and the dashboards is at most 800 lines."""
    root = Path(__file__).resolve().parents[2]
    long = {
        str(p.relative_to(root)): n
        for d in ("probe", "exporters", "dashboards")
        for p in (root / d).rglob("*")
        if p.suffix in (".py", ".c", ".h", ".pyi")
        and (n := len(p.read_text(encoding="utf-8").splitlines())) > 800
    }
    assert not long, long
