"""Ranks side by side live only within one engine generation: a restarted single-worker
engine makes no rank series (its new worker is not the old one's peer), and a restarted
TP=2 engine's new workers are matched with each other only."""

from __future__ import annotations

from exporters.base import ProcessInfo
from exporters.prometheus import PrometheusSink
from probe.records import Mode, Reason
from probe.step import PHASES, Step, new_step

LAST = "vllm_graph_probe_rank_last_steps_total"


def _steps(pid: int, n: int, t0: int, late: int = 0) -> list[Step]:
    return [
        new_step(
            pid=pid, step=k, t0=t0 + k * 10_000_000, t1=t0 + k * 10_000_000 + 5_000_000,
            host_ns=5_000_000, num_tokens=8, num_reqs=2, mode=Mode.FULL, reason=Reason.HIT,
            padded_tokens=8, padded_reqs=2, max_query_len=1, uniform_decode_query_len=1,
            uniform=True, replayed=True, pieces=0, captures=0,
            cpu_launch_overhead_ns=1000 + (late if k % 2 else 0),
            phases=dict.fromkeys(PHASES, 0) | {"metadata_build": late if k % 2 else 0},
        )
        for k in range(1, n + 1)
    ]  # fmt: skip


def _feed(sink: PrometheusSink, pid: int, tp: int, t0: int, late: int = 0) -> None:
    info = ProcessInfo(pid, host="h", model="m", tp_rank=tp, role="worker", platform="cuda")
    steps = _steps(pid, 400, t0, late)
    for i in range(0, len(steps), 50):
        sink.steps(info, steps[i : i + 50], [])


def _rank_series(sink: PrometheusSink) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in sink.registry.collect():
        for smp in fam.samples:
            if smp.name == LAST:
                out[smp.labels["pid"]] = out.get(smp.labels["pid"], 0) + smp.value
    return out


def test_a_restarted_single_worker_engine_has_no_rank_series() -> None:
    sink = PrometheusSink()
    _feed(sink, 101, 0, 10**12)
    _feed(sink, 202, 0, 2 * 10**12)  # the engine restarted: a new worker at tp0
    assert _rank_series(sink) == {}
    assert LAST.encode() + b"{" not in sink.exposition()


def test_a_restarted_tp2_engine_matches_each_generation_apart() -> None:
    sink = PrometheusSink()
    _feed(sink, 101, 0, 10**12)
    _feed(sink, 102, 1, 10**12, late=2_000_000)  # tp1 late on every odd step
    first = _rank_series(sink)
    assert set(first) == {"102"} and first["102"] > 150
    _feed(sink, 201, 0, 2 * 10**12)  # restarted: a new tp0, then a new tp1
    _feed(sink, 202, 1, 2 * 10**12, late=2_000_000)
    second = _rank_series(sink)
    assert set(second) == {"102", "202"}
    assert second["102"] == first["102"] and second["202"] == first["102"]
