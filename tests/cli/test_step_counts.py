"""One step count: what ``probe record``'s last line and ``probe attach``'s summary count
(the collector's ``forward_seen`` and ``steps_seen``) is what the report counts
(``forward steps`` and the steps that ran no forward), and the attach summary's rate is
the forward steps over the attachment, not over the span of the steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from probe.cli.render_live import LiveStats, header_line
from probe.cli.render_report import build_report, render_report
from probe.engine.ring_writer import RingWriter
from probe.reader.collector import Collector, RecordingSink
from probe.reader.recording import Recording, RecordingWriter
from probe.records import Dispatch, Flag, Forward, Hello, Mode, Phase, Reason, Span, pack


def _ring_records(steps: int, no_forward: set[int]) -> list[bytes]:
    out = [pack(Hello(4242, 10**12, 1_700_000_000 * 10**9, 5 * 10**9, 1))]
    t = 10**12
    for n in range(1, steps + 1):
        t += 1_000_000
        recs: list[Any] = [Span(n, Phase.EXECUTE, t, t + 800_000, 0, 8, 2, 2)]
        if n not in no_forward:  # a step that ran the model: its dispatch and launch
            recs += [
                Dispatch(
                    n,
                    Mode.FULL,
                    Reason.HIT,
                    Flag.UNIFORM | Flag.SPAN,
                    t + 10,
                    t + 20,
                    8,
                    8,
                    2,
                    2,
                    1,
                    1,
                ),
                Forward(n, Mode.FULL, 0, t + 30, t + 500_000, 1, 0, 0, 0, 8, t + 40, t + 90),
            ]
        recs.append(Span(n, Phase.SAMPLE_TOKENS, t + 810_000, t + 880_000, 0, 0, 0, 0))
        out += [pack(r) for r in recs]
    return out


def test_the_collectors_counts_are_the_reports(tmp_path: Path) -> None:
    ring_path = tmp_path / "ring-4242.shm"
    ring = RingWriter.create(ring_path, capacity=4096)
    out = tmp_path / "run.probe.db"
    col = Collector(rings=[ring_path], sinks=[RecordingSink(RecordingWriter(out))])
    for r in _ring_records(60, no_forward={7, 30, 31}):
        assert ring.write_raw(r)
    col.poll()
    ring.close(unlink=False)
    col.close()
    [proc] = col.procs.values()
    assert proc.forward_seen == 57 and proc.steps_seen == 60  # the record line's counts
    rec = Recording.open(out)
    try:
        rep = build_report(rec)
    finally:
        rec.close()
    assert rep["hit_rates_all"]["steps"] == proc.forward_seen
    assert rep["nonforward_steps"] == proc.steps_seen - proc.forward_seen == 3
    from rich.console import Console

    console = Console(width=250, record=True)
    render_report(rep, console)
    text = console.export_text()
    assert "forward steps         57 " in text and "3 more steps ran no forward" in text


class _Proc:
    def __init__(self) -> None:
        self.pid, self.dropped, self.hook_faults = 11, 0, 0
        self.snapshot: dict[str, Any] = {"tp_rank": 0}
        self.rank_label = "tp0"


def test_the_attach_summarys_rate_is_over_the_attachment() -> None:
    """40 forward steps 0.1 s apart (4 s of steps) in a 10 s attachment: 4.0 steps/s at the
    end, said to be over the attachment; before the end, the live window's rate."""
    from probe.step import PHASES, new_step

    now = {"t": 100_000_000_000}
    st = LiveStats(clock_ns=lambda: now["t"], roles={11: "worker"})
    proc: Any = _Proc()
    st.on_process(proc)
    steps = [
        new_step(
            pid=11, step=i, t0=now["t"] - (40 - i) * 10**8, t1=now["t"] - (40 - i) * 10**8 + 10**6,
            host_ns=10**6, num_tokens=4, num_reqs=2, mode=Mode.FULL, reason=Reason.HIT,
            padded_tokens=4, padded_reqs=2, max_query_len=2, uniform_decode_query_len=2,
            uniform=True, replayed=True, pieces=0, captures=0, cpu_launch_overhead_ns=500,
            phases=dict.fromkeys(PHASES, 0),
        )
        for i in range(1, 41)
    ]  # fmt: skip
    st.on_steps(proc, steps)
    v = st.active()[0]
    assert st.step_rate(v) == pytest.approx(10.0)  # live: over the steps' own intervals
    st.attached_s = 10.0
    st.close()
    assert st.step_rate(v) == pytest.approx(4.0)
    assert "4.0 steps/s over the 10.0 s attached" in header_line(st, "probe attach")
