"""The generated dashboards: fresh, and querying only metrics the exporter defines."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import dashboards.generate as gen
from exporters.metrics import METRICS

ROOT = Path(__file__).resolve().parents[1]


def test_check_passes_on_the_committed_json() -> None:
    assert gen.check() == []
    out = subprocess.run(
        [sys.executable, "-m", "dashboards.generate", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_a_panel_querying_an_unknown_metric_fails() -> None:
    d = gen.graph_path()
    d["panels"].append(gen.panel("typo", "", [gen.target(gen.rate("steps_totl"), "x")]))
    problems = gen.check_metrics("x.json", d)
    assert len(problems) == 1 and "vllm_graph_probe_steps_totl" in problems[0]


def test_histogram_suffixes_only_on_histograms() -> None:
    assert gen.known("vllm_graph_probe_cpu_launch_overhead_seconds_bucket")
    assert not gen.known("vllm_graph_probe_steps_total_bucket")
    assert all(gen.known(name) for name in METRICS)


def test_every_metric_is_documented() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    missing = [name for name in METRICS if f"`{name}`" not in doc]
    assert not missing


def test_editing_the_generator_without_regenerating_fails(tmp_path: Path) -> None:
    for f in gen.DASHBOARDS:
        shutil.copy(ROOT / "dashboards" / f, tmp_path / f)
    src = (ROOT / "dashboards" / "generate.py").read_text()
    edited = src.replace('"Padding waste",', '"Padding waste (edited)",', 1)
    assert edited != src
    script = tmp_path / "generate_edited.py"
    script.write_text(edited)
    out = subprocess.run(
        [sys.executable, str(script), "--check", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "vllm_graph_probe_graphs.json: stale" in out.stderr
    assert "vllm_graph_probe_overhead.json" not in out.stderr
    # regenerating fixes it
    subprocess.run(
        [sys.executable, str(script), "--dir", str(tmp_path)],
        cwd=ROOT,
        check=True,
        timeout=60,
        capture_output=True,
    )
    again = subprocess.run(
        [sys.executable, str(script), "--check", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0, again.stderr


def test_every_ratio_is_documented_as_defined() -> None:
    """docs/metrics.md shows each ratio's PromQL as probe.analysis.RATIOS writes it."""
    from exporters.metrics import ratio_queries

    doc = (ROOT / "docs" / "metrics.md").read_text()
    stale = [name for name, q in ratio_queries().items() if f"`{name}`" not in doc or q not in doc]
    assert not stale
