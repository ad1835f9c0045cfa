"""``probe ab``: compare mode on the real H200 recordings; run mode on the real CPU engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "tests/data"
sys.path.insert(0, str(REPO / "tests"))
import ab_workload as W  # noqa: E402

from probe.records import Mode, Reason  # noqa: E402


def _probe(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probe", *args], capture_output=True, text=True, **kw
    )  # type: ignore[call-overload]


def test_compare_mode_on_real_h200_recordings() -> None:
    out = _probe(
        "ab",
        "--a",
        str(H200 / "stock_mrv2_k1.probe"),
        "--b",
        str(REPO / "probe/data/default.probe"),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    cmp = json.loads(out.stdout)
    m = cmp["metrics"]
    assert m["decode_full_share"]["A"] == 1.0
    assert m["decode_full_share"]["B"] == 0.0
    # the override's cost sits in the forward launch: PIECEWISE pieces vs one FULL replay
    assert m["forward_launch_ns"]["ratio_B_over_A"] > 10
    # the harness measured throughput B/A 0.652 on these runs
    # (benchmarks/evidence/graph-support-ab.md): both arms ran the same 1,296 steady steps
    # of two shapes, so the steps pair and the ratio is the whole runs' (0.650, as before
    # the pairing); the verdict names the stock arm (A) faster, its interval excluding 1
    tp = m["steady_tokens_per_s"]
    assert f"{tp['ratio_B_over_A']:.3f}" == "0.650"
    assert tp["high"] < 1 and cmp["verdict"].startswith("A is faster: steady throughput B/A 0.650")
    assert cmp["pairing"]["matched"] and cmp["pairing"]["mix_difference"] == 0
    assert cmp["pairing"]["shapes"] == {"A": 2, "B": 2, "both": 2}
    assert cmp["interval_over"].startswith("10 runs of consecutive steps")
    # the steady host time per step doubles (2.6 ms -> 5.0 ms)
    assert 1.7 < m["steady_host_ns"]["ratio_B_over_A"] < 2.2
    assert "piecewise/backend_support_too_low" in cmp["reasons"]["B"]
    assert "full/hit" in cmp["reasons"]["A"]
    # the commonest in steady state: none listed that no steady step had
    for arm in ("A", "B"):
        counts = list(cmp["reasons"][arm].values())
        assert counts and all(n > 0 for n in counts) and counts == sorted(counts, reverse=True)


@pytest.fixture(scope="module")
def varied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Recordings of one varied-length workload (tests/ab_workload.py): A-0..A-2 stock,
    S-0 stock again, B-0 with 20% more host time per shape under the override's
    PIECEWISE decode."""
    d = tmp_path_factory.mktemp("varied")
    batches = W.shapes(seed=0)
    for i in range(3):
        W.write(d / f"A-{i}.probe.db", W.steps(batches, seed=1 + i))
    W.write(d / "S-0.probe.db", W.steps(batches, seed=7))
    W.write(
        d / "B-0.probe.db",
        W.steps(batches, seed=2, scale=1.2, mode=Mode.PIECEWISE,
                reason=Reason.BACKEND_SUPPORT_TOO_LOW),
    )  # fmt: skip
    return d


def test_one_run_per_arm_sees_a_20_percent_difference(varied: Path) -> None:
    out = _probe("ab", "--a", str(varied / "A-0.probe.db"), "--b", str(varied / "B-0.probe.db"),
                 "--width", "200")  # fmt: skip
    assert out.returncode == 0, out.stderr
    verdict = next(x for x in out.stdout.splitlines() if x.startswith("verdict: "))
    assert verdict.startswith("verdict: A is faster: steady throughput B/A 0.8")
    lo, hi = (float(x) for x in verdict.split("[")[1].split("]")[0].split(", "))
    assert lo < hi < 1
    assert "1 recording of A, 1 of B" in out.stdout and "one recording per arm" in out.stdout
    assert "steps paired by batch shape" in out.stdout
    assert "wall time" not in out.stdout


def test_two_runs_of_one_setting_show_no_difference(varied: Path) -> None:
    out = _probe("ab", "--a", str(varied / "A-0.probe.db"), "--b", str(varied / "S-0.probe.db"),
                 "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    cmp = json.loads(out.stdout)
    assert cmp["verdict"].startswith("no difference shown")
    assert cmp["pairing"]["matched"]


def test_quoted_globs_and_unequal_arms(varied: Path) -> None:
    out = _probe("ab", "--a", str(varied / "B-*.probe.db"), "--b", str(varied / "A-?.probe.db"),
                 "--width", "200")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "1 recording of A, 3 of B" in out.stdout
    assert "one recording per arm" not in out.stdout and "per arm: " not in out.stdout
    assert "1 recording of A and 3 of B: the intervals are over the repetitions" in out.stdout
    # the override arm's reasons, and stock's counted over all three recordings
    decode = sum(1 for x in W.shapes(seed=0) if x[0])
    assert (
        f"A: top mode/reason (steady, every recording): piecewise/backend_support_too_low x{decode}"
        in out.stdout
    )
    assert f"B: top mode/reason (steady, every recording): full/hit x{3 * decode}" in out.stdout
    assert "verdict: B is faster" in out.stdout


def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    for args in (
        ["ab", "--a", str(tmp_path / "missing.db")],
        ["ab", "--a", str(tmp_path / "none-*.probe.db"), "--b", str(tmp_path / "x.db")],
        ["ab", "--b-override", "Nope=FULL", "--", "true"],
        ["ab", "--", "true"],
    ):
        out = _probe(*args)
        assert out.returncode == 2, args
        assert out.stderr.startswith("probe: error: ") and "Traceback" not in out.stderr


@pytest.mark.engine
def test_run_mode_on_real_engine(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    script = REPO / "tests/real_engine/run_llm.py"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    out = _probe(
        "ab",
        "--b-override",
        "vllm.v1.attention.backends.cpu_attn:CPUAttentionMetadataBuilder=NEVER",
        "--reps",
        "1",
        "--out",
        str(tmp_path),
        "--json",
        "--",
        sys.executable,
        str(script),
        "--out",
        str(tmp_path / "tok.json"),
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    cmp = json.loads(out.stdout[out.stdout.index("{") :])
    assert cmp["reps"] == {"A": 1, "B": 1}
    assert cmp["metrics"]["steady_host_ns"]["A"] > 0
    assert "wall_s" not in cmp["metrics"]  # the `probe record` lifetime is no workload figure
    assert sorted(p.name for p in tmp_path.glob("*.probe")) == ["A-0.probe", "B-0.probe"]
