"""The generated dashboards: fresh, and querying only metrics the exporter defines."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dashboards.generate as gen
from exporters.base import AGENT_METRICS
from exporters.metrics import METRICS

ROOT = Path(__file__).resolve().parents[2]


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
    missing += [name for name, _, _ in AGENT_METRICS if f"`{name}`" not in doc]
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
    """docs/metrics.md shows each ratio's PromQL as probe.analysis.views.RATIOS writes it."""
    from exporters.metrics import ratio_queries

    doc = (ROOT / "docs" / "metrics.md").read_text()
    stale = [name for name, q in ratio_queries().items() if f"`{name}`" not in doc or q not in doc]
    assert not stale


def test_the_recording_render_draws_the_probe_cost_as_the_promql_computes(tmp_path: Path) -> None:
    """``dashboards.render_recording`` draws the probe cost panel from a calibrated
    recording with the PromQL's definition (every forward step's hooked calls at the
    calibration's cost per call, per window): the one figure and the others, the values the same as
    ``probe.analysis.cost``'s over those steps; an uncalibrated recording says it has none."""
    import matplotlib.pyplot as plt
    from calibrated import CALIBRATION, calibrated_copy

    from dashboards.render_recording import Data, draw
    from probe.analysis import views as analysis
    from probe.analysis.cost import cost_per_step_ns
    from probe.reader.recording import Recording, default_recording

    title = "Probe cost per step (calibrated)"
    rec = Recording.open(calibrated_copy(tmp_path / "cal.probe.db"))
    d = Data(rec, 1e6)  # one window: the whole recording
    fig, ax = plt.subplots()
    draw(title, ax, d)
    got = {str(ln.get_label()).rsplit(" ", 1)[0]: list(ln.get_ydata()) for ln in ax.lines}
    plt.close(fig)
    cal = analysis.calibration_of(next(p["snapshot"] for p in rec.processes() if p["snapshot"]))
    assert cal is not None
    flags = (cal["launch_is_replay"], cal["v1_launch_is_replay"], cal["dispatch_in_phase"])
    forward = [s for s in rec.iter_steps() if s.forward]
    calls = [analysis.hooked_calls(s, *flags) for s in forward]
    # the one figure (code evicted: the calibration has it), then the others by name
    for label, timing in (
        ("probe cost", "_cold_code"),
        ("data evicted (a floor)", "_cold"),
        ("hot loop (a lower bound)", ""),
    ):
        want = sum(cost_per_step_ns(dict(CALIBRATION), a, b, timing) for a, b in calls)
        assert label in got and got[label] == pytest.approx([want / len(forward) / 1e9])
    assert len(ax.lines) == 3
    fig, ax = plt.subplots()
    draw(title, ax, Data(Recording.open(default_recording()), 1.0))
    assert not ax.lines and "no calibration" in ax.texts[0].get_text()
    plt.close(fig)


def test_every_panel_renders_from_a_recording(tmp_path: Path) -> None:
    """``python -m dashboards.render_recording`` draws every panel of every dashboard (a
    panel added without a rendering fails here, not in a user's hands); a stat panel shows
    its ratio over the whole recording, the number ``probe report`` computes."""
    import matplotlib.pyplot as plt

    from dashboards.render_recording import STAT_RATIOS, Data, draw, render
    from probe.analysis.views import RATIOS
    from probe.reader.recording import Recording, default_recording

    rec = Recording.open(default_recording())
    written = render(rec, tmp_path)
    assert sorted(p.name for p in written) == sorted(
        p.replace(".json", ".png") for p in gen.DASHBOARDS
    )
    stats = [
        p["title"] for b in gen.DASHBOARDS.values() for p in b()["panels"] if p["type"] == "stat"
    ]
    # every stat panel is a ratio but the counts (steps counted, the agents' own)
    assert stats and set(STAT_RATIOS) == set(stats) - set(gen.COUNT_STATS)
    d = Data(rec, 1.0)
    fig, ax = plt.subplots()
    draw("Graph rate", ax, d)
    want = RATIOS["graph_rate"].of(r.step for r in d.rows)
    assert want is not None and ax.texts[0].get_text() == f"{want:.1%}"
    plt.close(fig)


BLOCK_MATPLOTLIB = (
    "import runpy, sys\n"
    "sys.modules['matplotlib'] = None  # as if the 'plots' extra were not installed\n"
    "sys.argv = ['render_recording']\n"
    "runpy.run_module('dashboards.render_recording', run_name='__main__')\n"
)


def test_the_plots_without_matplotlib_name_the_extra_in_one_line(tmp_path: Path) -> None:
    import os

    r = subprocess.run(
        [sys.executable, "-c", BLOCK_MATPLOTLIB],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "python -m dashboards.render_recording: error: the plots need the 'plots' extra "
        "(matplotlib is not installed): pip install 'vllm-graph-probe[plots]'"
    ]
    assert not list(tmp_path.iterdir())  # nothing written
