"""``probe whatif`` on each vLLM wheel tree (0.26.0 to 0.33.0): the recordings' batch
shapes through that release's own resolver and dispatcher. 0.26.0 is the release the
H200 recordings were made with; on the later ones the same shapes must still come out
as recorded (the dispatch logic these shapes touch did not change), and the what-if
override must still predict the run recorded under it.
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

from probe.analysis.whatif import Vllm, load_vllm

pytestmark = pytest.mark.wheels


@pytest.fixture(scope="module")
def tree_vllm(vllm_version: str) -> Vllm:
    got = load_vllm()
    assert got.version == vllm_version
    assert got.manager is not None, got.manager_error  # MRV2's manager imports on CPU
    return got


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_the_recordings_own_settings_reproduce_every_step(name: str, tree_vllm: Vllm) -> None:
    assert check_reproduces_every_step(RECORDINGS[name], tree_vllm) > 0


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
    from probe.analysis import summary as analysis
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
