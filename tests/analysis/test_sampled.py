"""Under ``--sample N`` the recorded steps are one in N: each one's serving time is its
share of the gap since the last recorded step, so the throughput (tokens over serving
time) estimates all steps, in the report and in the live counters alike, not N times
too low."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.base import ProcessInfo
from exporters.prometheus import PrometheusSink
from probe.analysis.summary_read import summarize_recording
from probe.reader.recording import Recording, RecordingWriter
from probe.records import Mode, Reason
from probe.step import PHASES, Step, new_step

EVERY = 8
PERIOD_NS = 10_000_000  # the engine's step period: 8 tokens each, 800 tokens/s


def _recorded(n: int = 400) -> list[Step]:
    """One step in EVERY of an engine stepping every PERIOD_NS, 5 ms of host work each."""
    t = 10**12
    return [
        new_step(
            pid=7, step=k, t0=t + k * EVERY * PERIOD_NS, t1=t + k * EVERY * PERIOD_NS + 5_000_000,
            host_ns=5_000_000, num_tokens=8, num_reqs=2, mode=Mode.FULL, reason=Reason.HIT,
            padded_tokens=8, padded_reqs=2, max_query_len=1, uniform_decode_query_len=1,
            uniform=True, replayed=True, pieces=0, captures=0, cpu_launch_overhead_ns=1000,
            phases=dict.fromkeys(PHASES, 0),
        )
        for k in range(1, n + 1)
    ]  # fmt: skip


def test_the_reports_throughput_estimates_all_steps(tmp_path: Path) -> None:
    w = RecordingWriter(tmp_path / "s.probe.db")
    w.set_meta(sample_every=EVERY)
    w.add_process(7, None)
    w.set_snapshot(7, {"role": "worker", "tp_rank": 0, "platform": "cpu"})
    w.add_steps(_recorded())
    w.close()
    tp = summarize_recording(Recording.open(tmp_path / "s.probe.db")).figures()["throughput"]
    assert tp["tokens_per_s"] == pytest.approx(800, rel=0.01)


def _live_ratio(sink: PrometheusSink) -> tuple[float, float]:
    """The recorded steps fed to ``sink`` live: its scheduled tokens and their ratio to its
    serving seconds (the dashboards' throughput)."""
    steps = _recorded()
    info = ProcessInfo(7, host="h", model="m", role="worker", platform="cpu")
    for i in range(0, len(steps), 64):
        sink.steps(info, steps[i : i + 64], [])
    tokens = serving = 0.0
    for fam in sink.registry.collect():
        for s in fam.samples:
            if s.name == "vllm_graph_probe_scheduled_tokens_total":
                tokens += s.value
            elif s.name == "vllm_graph_probe_serving_seconds_total":
                serving += s.value
    return tokens, tokens / serving


def test_the_live_counters_ratio_estimates_all_steps() -> None:
    sink = PrometheusSink()
    sink.sampled(EVERY)
    tokens, rate = _live_ratio(sink)
    assert tokens == 8 * len(_recorded())  # counts stay of recorded steps
    assert rate == pytest.approx(800, rel=0.01)


def test_the_exporters_of_attach_record_and_top_are_told_the_rate() -> None:
    """``--prometheus``/``--otlp`` beside ``--sample N`` in attach, record and top: the sink
    is made told the rate, so its ratio estimates every step as the agent's does."""
    from probe.cli.live_options import exporter_sink

    sink = exporter_sink("prometheus", "--prometheus", "127.0.0.1:0", EVERY)
    try:
        assert _live_ratio(sink)[1] == pytest.approx(800, rel=0.01)
    finally:
        sink.close()
    unsampled = exporter_sink("prometheus", "--prometheus", "127.0.0.1:0")
    try:
        assert _live_ratio(unsampled)[1] == pytest.approx(100, rel=0.01)  # 1 in 8 seen
    finally:
        unsampled.close()
