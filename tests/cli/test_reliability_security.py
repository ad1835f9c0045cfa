"""Security defaults that are not about the control socket (``docs/threat-model.md``).

Exporters that listen bind to loopback unless told otherwise; nothing in ``exporters/``
defaults to all interfaces. Secrets in the environment never reach a recording (the real
engine run in ``test_reliability_engine.py`` checks the file bytes).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_prometheus_exporter_defaults_to_loopback() -> None:
    prometheus = pytest.importorskip("exporters.prometheus")
    host, _ = prometheus.parse_addr(prometheus.DEFAULT_ADDR)
    assert host == "127.0.0.1"
    assert prometheus.parse_addr(":0")[0] == "127.0.0.1"  # a bare port is loopback too
    sink = prometheus.make_sink(":0")
    try:
        assert sink._server.server_address[0] == "127.0.0.1"
    finally:
        sink.close()


def test_no_exporter_defaults_to_all_interfaces() -> None:
    offenders = []
    for path in sorted((ROOT / "exporters").glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"""["'](0\.0\.0\.0|::)["']|INADDR_ANY""", line):
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert not offenders, offenders


def test_ring_and_its_directory_are_owner_only(tmp_path: Path) -> None:
    from probe.engine.ring_writer import RingWriter
    from probe.ring_dir import default_ring_dir

    run_dir = default_ring_dir(environ={}, shm_root=tmp_path / "shm-missing", tmp_root=tmp_path)
    assert run_dir.stat().st_mode & 0o777 == 0o700
    with RingWriter.create(run_dir / "ring-1.shm", capacity=64) as ring:
        assert ring.path.stat().st_mode & 0o777 == 0o600
