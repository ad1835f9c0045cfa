"""``probe whatif`` on each vLLM wheel tree (0.26.0 to 0.34.0): the recordings' batch
shapes through that release's own resolver and dispatcher. 0.26.0 is the release the
H200 recordings were made with; on the later ones the same shapes must still come out
as recorded (the dispatch logic these shapes touch did not change), and the what-if
override must still predict the run recorded under it. A V1 recording on a tree without
the classic runner (0.34 on) is refused by name.
"""

from __future__ import annotations

from typing import Any

import pytest
from whatif_cases import (
    RECORDINGS,
    UB,
    USTD,
    check_prediction,
    check_reproduces_every_step,
    load,
)

from probe.analysis.whatif import (
    Replayer,
    Setting,
    Vllm,
    VllmError,
    WhatIfError,
    has_module,
    has_split_sizes,
    load_vllm,
    whatif,
)
from probe.records import Mode, Reason

pytestmark = pytest.mark.wheels


@pytest.fixture(scope="module")
def tree_vllm(vllm_version: str) -> Vllm:
    got = load_vllm()
    assert got.version == vllm_version
    assert got.manager is not None, got.manager_error  # MRV2's manager imports on CPU
    return got


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_the_recordings_own_settings_reproduce_every_step(name: str, tree_vllm: Vllm) -> None:
    if "_v1_" in name and not has_module("vllm.v1.cudagraph_dispatcher"):
        pytest.skip(f"vLLM {tree_vllm.version} has no classic runner (V1) to replay {name}")
    assert check_reproduces_every_step(RECORDINGS[name], tree_vllm) > 0


def test_a_v1_recording_without_v1_is_refused_by_name(tree_vllm: Vllm) -> None:
    """On a tree without the classic runner, a V1 recording is a clear error that names
    it, and the result of an MRV2 one lists what the tree no longer has."""
    if has_module("vllm.v1.cudagraph_dispatcher"):
        pytest.skip(f"vLLM {tree_vllm.version} has the classic runner (V1)")
    steps, snaps = load(RECORDINGS["groundtruth_v1_k1"])
    with pytest.raises(VllmError, match=r"classic runner \(V1\), which vLLM 0\.34"):
        whatif(steps, snaps, Setting(), vl=tree_vllm)
    steps, snaps = load(RECORDINGS["stock_mrv2_k1"])
    got = whatif(steps, snaps, Setting(), vl=tree_vllm)
    gone = {g["setting"]: g["note"] for g in got["not_in_installed_vllm"]}
    assert (
        "prefill_cudagraph_capture_token_sizes"
        in gone["compilation_config.cudagraph_capture_sizes"]
    )
    rep = got["reproduction"]
    assert rep["mode_and_reason_match"] == rep["steps"] > 0


@pytest.mark.parametrize(
    ("source", "support", "target"),
    [
        ("stock_mrv2_k1", USTD, "default_mrv2_ustd"),
        ("default_mrv2_ustd", UB, "stock_mrv2_k1"),
    ],
)
def test_the_override_predicts_the_run_recorded_under_it(
    source: str, support: Any, target: str, tree_vllm: Vllm
) -> None:
    assert check_prediction(RECORDINGS[source], support, RECORDINGS[target], tree_vllm) == 0.0


@pytest.mark.parametrize(
    ("source", "support", "target"),
    [
        ("stock_mrv2_k1", USTD, "default_mrv2_ustd"),
        ("default_mrv2_ustd", UB, "stock_mrv2_k1"),
    ],
)
def test_costs_from_the_run_recorded_under_it_predict_its_steady_host_time(
    source: str, support: Any, target: str, tree_vllm: Vllm
) -> None:
    from probe.analysis import views as analysis
    from probe.analysis.costmodel import Costs
    from probe.analysis.whatif import Setting, whatif

    steps, snaps = load(RECORDINGS[source])
    other = load(RECORDINGS[target])[0]
    r = whatif(
        steps, snaps, Setting(support=support), vl=tree_vllm, costs_from=Costs.of(other, target)
    )
    (w,) = [c["worth"] for c in r["columns"] if c["column"] == "what-if"]
    steady, _ = analysis.split_steady(other)
    host = [s.host_ns for s in steady if s.num_tokens > 0]
    assert not w["no_cost"]
    assert w["host_ns_per_step"] == pytest.approx(sum(host) / len(host), rel=0.05)


def test_split_size_flags_follow_the_installed_vllm(tree_vllm: Vllm) -> None:
    """``--decode-cudagraph-capture-request-sizes 1,2`` on the stock MRV2 recording: on a
    vLLM with split graph sizes (0.34 on), every uniform decode step the recording ran
    FULL keeps FULL up to 2 requests and misses above (no FULL key for its size, the
    prefill graph PIECEWISE); on one without, the flag is refused by name."""
    steps, snaps = load(RECORDINGS["stock_mrv2_k1"])
    setting = Setting(split=(("decode_cudagraph_capture_request_sizes", (1, 2)),))
    r = Replayer(steps, snaps)
    if not has_split_sizes(tree_vllm):
        with (
            r.session(tree_vllm),
            pytest.raises(WhatIfError, match="--decode-cudagraph-capture-request-sizes: vLLM"),
        ):
            r.graphs(r.applied(setting))
        return
    with r.session(tree_vllm):
        got = r.replay(r.graphs(r.applied(setting)))
    full = [(a, b) for a, b in zip(r.steps, got, strict=True) if a.uniform and a.mode == Mode.FULL]
    above = [(a, b) for a, b in full if a.num_reqs > 2]
    assert full and above
    for a, b in full:
        if a.num_reqs <= 2:
            assert (b.mode, b.reason) == (Mode.FULL, Reason.HIT)
        else:
            assert (b.mode, b.reason) == (Mode.PIECEWISE, Reason.NO_FULL_KEY_FOR_SIZE)
