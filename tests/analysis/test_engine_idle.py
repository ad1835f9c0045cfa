"""Engine idle from the engine's state: a recording, built from the declared fields, of a
large model whose host waits 465-494 ms for the GPU after each 16,384-token prefill while
its requests run, with one real idle gap (the engine emptied, then new requests came).
Only that gap is engine idle; the waits are serving time (steady throughput counts them)
and GPU time (the steps after them count in the host-bound verdict, GPU-bound). The same
steps without the engine's state (schema version 1 recordings) fall back to the 100 ms
host-gap rule, and the report says so. Every surface applies the one rule: the report,
the live view's summary and the per-step split the metrics take."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from probe.analysis import rules
from probe.analysis.steady import Classes, summarize_steps
from probe.cli.render_report import build_report
from probe.reader.recording import Recording, RecordingWriter
from probe.records import Mode, Reason
from probe.step import PHASES, Step, new_step

PID = 4242
MS = 1_000_000
#: the host's waits for the GPU after each large prefill, and the real idle gap
WAITS = (465 * MS, 494 * MS, 480 * MS)
IDLE = 2_000 * MS
DECODES = 30  # decode steps after each prefill, 6 ms apart
PREFILL = 16_384


def _step(n: int, t0: int, host: int, *, tokens: int, reqs: int, carried: int | None,
          prefill: bool, gpu: tuple[int, int] | None = None) -> Step:  # fmt: skip
    mode = Mode.PIECEWISE if prefill else Mode.FULL
    return new_step(
        pid=PID, step=n, t0=t0, t1=t0 + host, host_ns=host, num_tokens=tokens, num_reqs=reqs,
        carried_reqs=carried, mode=mode,
        reason=Reason.PIECEWISE_ONLY if prefill else Reason.HIT,
        padded_tokens=tokens if prefill else 64, padded_reqs=reqs, max_query_len=256,
        uniform_decode_query_len=2, uniform=not prefill, replayed=True,
        pieces=8 if prefill else 0, captures=0, cpu_launch_overhead_ns=host // 2,
        phases=dict.fromkeys(PHASES, 0), gpu_idle_before_ns=None if gpu is None else gpu[0],
        gpu_step_ns=None if gpu is None else gpu[1],
        gpu_busy_ns=None if gpu is None else gpu[1], runner="mrv2",
    )  # fmt: skip


def _steps() -> tuple[list[Step], list[tuple[int, int]]]:
    """Three waves of 64 requests; the first two run back to back (the second wave's
    prefill carries the first's last requests over), the third starts after the engine
    emptied. Returns the steps and each gap before a step: (step, gap ns)."""
    out: list[Step] = []
    t = 10**12
    n = 0
    gaps = []
    carried_in = (0, 16, 0)  # requests running into each wave's prefill
    for wave in range(3):
        if wave == 2:
            t += IDLE  # nothing to run: the engine waits for requests
        elif out:
            t += 5 * MS
        n += 1
        # the prefill: 16,384 tokens, the host's part 40 ms, the GPU's ~500 ms
        out.append(_step(n, t, 40 * MS, tokens=PREFILL, reqs=64 + carried_in[wave],
                         carried=carried_in[wave], prefill=True))  # fmt: skip
        t += 40 * MS
        t += WAITS[wave]  # the host waits for the prefill on the GPU, requests running
        for k in range(DECODES):
            n += 1
            # the step after the wait: the GPU was busy the whole gap (idle 0.2 ms before it)
            gpu = (200_000, 9 * MS) if k == 0 else (50_000, 4 * MS) if k % 8 == 0 else None
            out.append(_step(n, t, 4 * MS, tokens=128, reqs=64, carried=64, prefill=False,
                             gpu=gpu))  # fmt: skip
            t += 4 * MS + (2 * MS if k < DECODES - 1 else 0)
    prev = None
    for s in out:
        if prev is not None:
            gaps.append((s.step, s.t0 - prev.t1))
        prev = s
    return out, gaps


def _write(path: Path, steps: list[Step]) -> Path:
    w = RecordingWriter(path)
    w.add_process(PID, None)
    w.set_snapshot(PID, {"role": "worker", "tp_rank": 0, "runner": "mrv2", "platform": "cuda"})
    w.add_steps(steps)
    w.close()
    return path


def _report(path: Path) -> dict[str, Any]:
    rec = Recording.open(path)
    try:
        return build_report(rec)
    finally:
        rec.close()


def test_a_wait_for_the_gpu_while_requests_run_is_serving_time(tmp_path: Path) -> None:
    steps, gaps = _steps()
    rep = _report(_write(tmp_path / "large.probe.db", steps))
    g = rep["gpu"]
    # the one real idle gap, nothing else: the three waits after large prefills are not idle
    assert g["engine_idle_gaps"] == 1 and g["engine_idle_ns"] == IDLE
    assert g["engine_idle_rule"] == "engine_state"
    assert [gap for _, gap in gaps if gap >= rules.ENGINE_IDLE_GAP_NS] == [*WAITS[:2], IDLE,
                                                                           WAITS[2]]  # fmt: skip
    # steady throughput over serving time that includes the waits: every step's period
    # (the end of the step before it to its own end), the step after the idle gap alone
    tp = rep["throughput"]
    assert rep["hit_rates"]["steps"] == len(steps)  # all steady
    first, after_idle = steps[0], next(s for s in steps if s.carried_reqs == 0 and s.step > 1)
    serving = (steps[-1].t1 - first.t0) - (after_idle.t0 - steps[after_idle.step - 2].t1)
    assert tp["serving_ns"] == serving
    assert tp["serving_ns"] > sum(WAITS)
    assert tp["tokens"] == sum(s.num_tokens for s in steps)
    assert tp["tokens_per_s"] == pytest.approx(tp["tokens"] / (serving / 1e9))
    # the steps after the waits count in the host-bound verdict, on the GPU-bound side
    timed = [s for s in steps if s.gpu_step_ns is not None]
    assert g["idle_before_ns"]["n"] == len(timed)
    assert g["host_bound_steps"] == 0 and g["host_bound_share"] == 0.0
    # the report says which rule judged the gaps, text and JSON
    assert any("with no request in flight (the engine's state)" in v for v in rep["verdict"])


def test_the_same_steps_without_the_engines_state_fall_back_to_the_host_gap(
    tmp_path: Path,
) -> None:
    """Recordings from before the field: the 100 ms rule, which reads the waits as idle
    (what the engine's state corrects), named as the fallback."""
    steps, _ = _steps()
    old = [replace(s, carried_reqs=None) for s in steps]
    rep = _report(_write(tmp_path / "old.probe.db", old))
    g = rep["gpu"]
    assert g["engine_idle_rule"] == "host_gap"
    assert g["engine_idle_gaps"] == 4 and g["engine_idle_ns"] == IDLE + sum(WAITS)
    state = _report(_write(tmp_path / "new.probe.db", steps))
    assert rep["throughput"]["serving_ns"] == state["throughput"]["serving_ns"] - sum(WAITS)
    assert any("fallback rule: recorded without the engine's state" in v for v in rep["verdict"])


def test_a_schema_version_1_file_reads_with_the_fallback(tmp_path: Path) -> None:
    """A file of schema version 1 has no ``carried_reqs`` column: it reads, every step
    without the engine's state."""
    import sqlite3

    steps, _ = _steps()
    path = _write(tmp_path / "v1.probe.db", steps)
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE steps DROP COLUMN carried_reqs")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    rec = Recording.open(path)
    try:
        assert {s.carried_reqs for s in rec.iter_steps()} == {None}
        rep = build_report(rec)
    finally:
        rec.close()
    assert rep["gpu"]["engine_idle_rule"] == "host_gap" and rep["gpu"]["engine_idle_gaps"] == 4
    json.dumps(rep)


def test_the_live_view_and_the_metrics_split_apply_the_same_rule(tmp_path: Path) -> None:
    steps, _ = _steps()
    rep = _report(_write(tmp_path / "large.probe.db", steps))
    # the live view's summary of the same steps, fed in batches as a reader gets them
    live = summarize_steps(steps).figures()
    assert live["gpu"]["engine_idle_ns"] == rep["gpu"]["engine_idle_ns"] == IDLE
    assert live["throughput"] == rep["throughput"]
    # the per-step split the metric updates read (steady, engine idle, period, gap)
    cl = Classes()
    for i in range(0, len(steps), 7):
        cl.classify(steps[i : i + 7])
    got = [cl.get(PID, s.step) for s in steps]
    assert all(x is not None for x in got)
    idle = [s.step for s, x in zip(steps, got, strict=True) if x is not None and x[1]]
    assert idle == [steps[2 * (DECODES + 1)].step]
    assert sum(x[2] for x in got if x is not None) == rep["throughput"]["serving_ns"]
