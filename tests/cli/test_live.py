"""The live view (probe top / attach) and process discovery (probe ps), without an engine.

The live view is fed real Step objects through the Sink interface and rendered on a
recording rich Console at 80 columns, with rich's Live driven by an injected clock.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.live import Live

from probe.analysis import views as analysis
from probe.cli.render_live import LiveStats, header_line, plain_lines, rank_lines, render, sparkline
from probe.records import Mode, Reason, Reorder
from probe.step import GpuSample, Step

PROBE = str(Path(sys.executable).with_name("probe"))


class FakeProc:
    """The parts of probe.reader.collector.ProcessState a sink reads."""

    def __init__(self, pid: int, snapshot: dict[str, Any] | None = None) -> None:
        self.pid = pid
        self.snapshot = snapshot
        self.dropped = 0
        self.hook_faults = 0

    @property
    def rank_label(self) -> str:
        return f"tp{(self.snapshot or {}).get('tp_rank') or 0}"


def mk_step(pid: int, n: int, mode: Mode, reason: Reason, t1: int, uniform: bool) -> Step:
    return Step(
        pid=pid,
        step=n,
        t0=t1 - 900_000,
        t1=t1,
        host_ns=900_000,
        num_tokens=4,
        num_reqs=4,
        mode=mode,
        reason=reason,
        padded_tokens=4,
        padded_reqs=4,
        max_query_len=1,
        uniform_decode_query_len=1,
        uniform=uniform,
        replayed=mode != Mode.NONE,
        pieces=0,
        captures=0,
        cpu_launch_overhead_ns=300_000 + n * 1000,
        phases={"prepare_inputs": 100_000, "forward_launch": 150_000, "sample": 50_000},
        reorders=(Reorder(n, n % 2 == 0, 0, t1 - 10, t1, 1, 4, 4, 4, 1, False),),
    )


@pytest.fixture
def stats() -> LiveStats:
    now = {"t": 100_000_000_000}
    st = LiveStats(clock_ns=lambda: now["t"], roles={11: "worker", 12: "worker"})
    for pid, rank in ((11, 0), (12, 1)):
        snap = {
            "tp_rank": rank,
            # a builder that set the misspelled attribute: the one trap these facts make
            "groups": [
                {"builder": "Foo", "support": "NEVER", "misspelled": ["Foo.cudagraph_support"]}
            ],
        }
        proc: Any = FakeProc(pid, snap)
        st.on_process(proc)
        steps = [
            mk_step(
                pid,
                i,
                Mode.FULL if i % 4 else Mode.PIECEWISE,
                Reason.HIT if i % 4 else Reason.NOT_UNIFORM,
                now["t"] - (40 - i) * 100_000_000,
                bool(i % 4),
            )
            for i in range(1, 41)
        ]
        st.on_steps(proc, steps)
    return st


def test_late_gpu_timings_join_their_steps() -> None:
    """Device timings arrive a few steps after their steps; the view joins each into its
    step, and the GPU numbers are analysis's own over the steady-state steps the report
    would keep (step 1, the first of its shape but no slower, is steady state)."""
    st = LiveStats(clock_ns=lambda: 10**12, roles={11: "worker"})
    proc: Any = FakeProc(11, {"tp_rank": 0})
    st.on_process(proc)
    steps = [mk_step(11, i, Mode.FULL, Reason.HIT, 10**11 + i * 10**6, True) for i in range(1, 9)]
    st.on_steps(proc, steps[:4], [])
    # steps 1..3 timed, delivered with the next batch (step 4's timing is still on the way)
    gpu = [GpuSample(i, 500_000, 100_000 * i, 800_000) for i in range(1, 4)]
    st.on_steps(proc, steps[4:], gpu)
    v = st.active()[0]
    assert [s.gpu_idle_before_ns for s in v.steps] == [100_000, 200_000, 300_000, *[None] * 5]
    g = st.summary(v)["gpu"]
    assert g["steps_timed"] == 3
    assert g["idle_share"] == pytest.approx(600_000 / (600_000 + 3 * 800_000))
    assert g == analysis.gpu_summary(analysis.split_steady(v.steps)[0])


def test_summary_per_rank_and_aggregate(stats: LiveStats) -> None:
    views = stats.active()
    assert [v.label for v in views] == ["tp0", "tp1"]
    s = stats.summary(views[0])
    assert s["hit_rates"]["steps"] == 40 and s["hit_rates"]["full"] == 30
    assert s["steps_per_s"] == pytest.approx(10.0)  # 40 steps 0.1 s apart
    assert s["miss_reasons"][0][:2] == ("full", "hit")
    assert s["launch"][0][0] == "cpu_launch_overhead"
    assert s["reorder"]["decisions"] == 40 and s["reorder"]["changed"] == 20
    assert s["traps"] == [
        "Foo.cudagraph_support is not read by vLLM; the builder's support is NEVER "
        "(set _cudagraph_support or get_cudagraph_support)"
    ]
    assert s["verdict"]
    agg = stats.aggregate()
    assert agg["ranks"] == 2 and agg["hit_rates"]["steps"] == 80
    assert agg["steps_per_s"] == pytest.approx(20.0)


def test_final_rate_is_the_ranks_last_window_not_zero() -> None:
    """After the session ends (reader drained, sinks closed), the summary printed at exit
    shows the rate of each rank's last 10 s of steps, not 0 because the clock moved on."""
    now = {"t": 100_000_000_000}
    st = LiveStats(clock_ns=lambda: now["t"], roles={11: "worker"})
    proc: Any = FakeProc(11, {"tp_rank": 0})
    st.on_process(proc)
    steps = [
        mk_step(11, i, Mode.FULL, Reason.HIT, now["t"] - (40 - i) * 100_000_000, True)
        for i in range(1, 41)
    ]
    st.on_steps(proc, steps)
    v = st.active()[0]
    assert st.step_rate(v) == pytest.approx(10.0)
    now["t"] += 60_000_000_000  # draining the ring and closing took a minute
    assert st.step_rate(v) == 0.0  # live: nothing in the last 10 s
    st.close()
    assert st.step_rate(v) == pytest.approx(10.0)


def test_a_reader_behind_the_engine_shows_the_engines_rate_not_zero() -> None:
    """On a saturated host the reader assembles steps long after the engine ran them:
    while records wait to be assembled, the window ends at the newest step read (the
    engine's time), so the rate is the engine's, not 0 (the count rose, the rate read
    0.0). Over a full window the rate is the window's steps over its length."""
    now = {"t": 100_000_000_000}
    st = LiveStats(clock_ns=lambda: now["t"], roles={11: "worker"})
    proc: Any = FakeProc(11, {"tp_rank": 0})
    st.on_process(proc)
    t_end = now["t"] - 30_000_000_000  # the newest step read ran 30 s ago
    steps = [
        mk_step(11, i, Mode.FULL, Reason.HIT, t_end - (300 - i) * 50_000_000, True)
        for i in range(1, 301)
    ]
    st.on_steps(proc, steps)
    v = st.active()[0]
    assert st.step_rate(v) == 0.0  # caught up: nothing in the last 10 s of the clock
    st.behind = 5_000
    assert st.step_rate(v) == pytest.approx(20.0)  # 200 steps in the engine's last 10 s
    assert "5,000 records behind" in header_line(st, "probe top")


def test_the_view_says_what_it_waits_for() -> None:
    st = LiveStats(roles={11: "worker"})
    st.attached = 0
    assert "attaching" in plain_lines(st)[-1]
    st.attached = 3
    assert "3 process(es) attached; waiting for the first engine step" in plain_lines(st)[-1]
    st.behind = 1200
    assert "catching up: 1,200 records read" in plain_lines(st)[-1]


def test_sampled_view_shows_engine_step_rates() -> None:
    """With one step in 4 recorded the rate shown is of engine steps (recorded x 4), and
    the header says the view is sampled."""
    now = {"t": 100_000_000_000}
    st = LiveStats(clock_ns=lambda: now["t"], roles={11: "worker"}, sample_every=4)
    proc: Any = FakeProc(11, {"tp_rank": 0})
    st.on_process(proc)
    st.on_steps(
        proc,
        [
            mk_step(11, i, Mode.FULL, Reason.HIT, now["t"] - (40 - i) * 100_000_000, True)
            for i in range(1, 41)
        ],
    )
    assert st.step_rate(st.active()[0]) == pytest.approx(40.0)
    assert "1 step in 4 recorded" in header_line(st, "probe top")


def test_plain_lines_fit_80_columns(stats: LiveStats) -> None:
    lines = plain_lines(stats, "probe top")
    text = "\n".join(lines)
    assert "tp0 pid 11 worker" in text and "tp1 pid 12 worker" in text
    assert "FULL 75%" in text and "PIECEWISE not_uniform" in text
    assert "phase p50/p99 µs: forward_launch 150/150, prepare_inputs 100/100" in text
    assert (
        "CPU launch overhead p50" in text and "warning: Foo.cudagraph_support is not read" in text
    )
    assert "verdict:" in text and "reorder: 40 decisions" in text
    long = [ln for ln in lines if len(ln) > 80 and "verdict" not in ln]
    assert not long, long


def test_rich_view_at_80_columns_with_an_injected_clock(stats: LiveStats) -> None:
    # this rich's Live takes its clock from the Console (Console(get_time=...))
    buf = io.StringIO()
    ticks = iter(float(i) for i in range(1000))
    console = Console(
        file=buf, width=80, force_terminal=True, color_system=None, get_time=lambda: next(ticks)
    )
    with Live(render(stats, "probe top"), console=console, auto_refresh=False) as live:
        live.update(render(stats, "probe top"), refresh=True)
    out = buf.getvalue()
    assert "tp0 pid 11 worker" in out and "tp1 pid 12 worker" in out
    assert "decode FULL" in out and "processes: 2 worker" in out
    for line in out.splitlines():
        assert len(line.rstrip()) <= 80 or "\x1b" in line, line


def test_an_empty_view_says_it_waits() -> None:
    st = LiveStats()
    assert any("waiting for engine steps" in ln for ln in plain_lines(st))


# -- discovery ---------------------------------------------------------------------------------


def test_port_and_listening_pid_and_tree() -> None:
    from probe.reader.discover import descendants, listening_pids, port_of, tree_of_url

    assert port_of("http://127.0.0.1:8123/v1") == 8123
    assert port_of("127.0.0.1:9000") == 9000
    assert port_of("https://example") == 443
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert os.getpid() in listening_pids(port)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert child.pid in descendants(os.getpid())
            assert {os.getpid(), child.pid} <= tree_of_url(f"http://127.0.0.1:{port}")
        finally:
            child.kill()
            child.wait()


def test_unknown_url_and_pid_are_clear_errors() -> None:
    from probe.reader.discover import DiscoveryError, tree_of_pid, tree_of_url

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening
    with pytest.raises(DiscoveryError, match=f"listens on port {port}"):
        tree_of_url(f"http://127.0.0.1:{port}")
    with pytest.raises(DiscoveryError, match="no process with pid"):
        tree_of_pid(2**22 + 12345)


def test_ps_lists_servers_and_cleans_stale_sockets(run_dir: Path, clean_probe: None) -> None:
    from probe.engine.control_server import ControlServer
    from probe.reader.discover import find_processes

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = run_dir / f"ctl-{dead.pid}.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))
    srv = ControlServer(run_dir, environ={}, role_hint="worker")
    srv.open()
    try:
        found = find_processes(run_dir)
        assert [a.pid for a in found] == [os.getpid()]
        assert found[0].status["enabled"] is False and found[0].error is None
        assert not stale.exists()
        assert find_processes(run_dir, pids=[os.getpid()])
        out = subprocess.run(
            [PROBE, "ps", "--run-dir", str(run_dir), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert f'"pid": {os.getpid()}' in out.stdout
    finally:
        srv.close()


def test_attach_with_nothing_to_attach_is_a_usage_error(run_dir: Path) -> None:
    out = subprocess.run(
        [PROBE, "attach", "--run-dir", str(run_dir), "--no-live"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "no armed vLLM process found" in out.stderr


def test_missing_exporter_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from probe.cli.live_options import exporter_sink
    from probe.cli.main import UsageError

    monkeypatch.setitem(sys.modules, "exporters.nothere", None)
    with pytest.raises(UsageError, match=r"exporters.nothere is not available.*\[nothere\]"):
        exporter_sink("nothere", "--nothere", "x")


def test_history_per_rank_as_sparklines() -> None:
    """``probe top`` draws each rank's recent FULL share and steady-state CPU launch
    overhead, one bar per time slot; a slot without steps is a gap, and steps found to be
    warm-up later (before the first replay) leave the launch history."""
    st = LiveStats(clock_ns=lambda: 100_200_000_000, history=5, history_s=1.0)
    proc: Any = FakeProc(11, {"tp_rank": 0})
    st.on_process(proc)
    slot = {96: range(1, 5), 98: range(5, 9), 99: range(9, 13), 100: range(13, 17)}
    for sec, ns in slot.items():
        st.on_steps(
            proc,
            [
                mk_step(
                    11,
                    n,
                    Mode.FULL if n >= 5 and n not in (11, 12) else Mode.NONE,
                    Reason.HIT,
                    sec * 1_000_000_000 + 500_000_000,
                    True,
                )
                for n in ns
            ],
        )
    v = st.active()[0]
    assert sorted(v.warm) == [1, 2, 3, 4]  # before the first replay (5)
    tr = st.trend(v)
    assert tr["full_share"] == [0.0, None, 1.0, 0.5, 1.0]
    # launch overhead is 300 µs + n µs: slot 98 keeps steps 5-8 (5, the first FULL, is
    # no slower than the rest: steady)
    assert tr["cpu_launch_overhead_ns"] == [None, None, 306_500, 310_500, 314_500]
    lines = rank_lines(st.summary(v))
    assert any(ln.startswith("  FULL ") and "▁ █▅█" in ln for ln in lines), lines
    assert any(ln.startswith("  launch ") and "  ▁▅█" in ln for ln in lines), lines
    assert sparkline([None, 1.0, 1.0]) == " ▅▅"  # a flat line sits mid-height


@pytest.mark.parametrize("timings", ["code", "cold", "warm"])
def test_the_live_view_prints_the_probe_cost_the_report_computes(timings: str) -> None:
    """With the engine's calibration in its snapshot, each rank's view shows the probe's
    cost per step: the same figures as ``analysis.probe_cost`` over the same steady steps
    (the report's function), within 80 columns; the one headline figure, code-evicted
    where the calibration has it (the data-evicted and hot-loop figures named beside it),
    the cold floor where it has only data-evicted timings, else the warm lower bound."""
    cal: dict[str, Any] = {"hot_path": "compiled", "span_ns": 80.0, "hook_ns": 120.0}
    cold = timings in ("code", "cold")
    if cold:
        cal |= {"span_cold_ns": 900.0, "hook_cold_ns": 2800.0}
    if timings == "code":
        cal |= {"span_cold_code_ns": 2000.0, "hook_cold_code_ns": 6000.0}
    now = {"t": 100_000_000_000}
    st = LiveStats(clock_ns=lambda: now["t"], roles={11: "worker"})
    proc: Any = FakeProc(11, {"tp_rank": 0, "probe": {"calibration": cal}})
    st.on_process(proc)
    t = now["t"]
    steps = [
        mk_step(11, i, Mode.FULL, Reason.HIT, t - (40 - i) * 10**8, True) for i in range(1, 41)
    ]
    st.on_steps(proc, steps)
    v = st.active()[0]
    s = st.summary(v)
    want = analysis.probe_cost(
        analysis.split_steady(analysis.forward_steps(v.steps))[0],
        {11: analysis.calibration_of(proc.snapshot)},
    )
    assert want is not None and s["probe_cost"] == want
    lines = [ln for ln in plain_lines(st, "probe top") if "probe cost" in ln]
    assert len(lines) == 1 and len(lines[0]) <= 80, lines
    warm = want["per_step_warm_ns"]
    if timings == "code":
        lo, hi = want["per_step_cold_ns"], want["per_step_cold_code_ns"]
        assert lo is not None and hi is not None and lo < hi and want["per_step_ns"] == hi
        assert f"probe cost {hi / 1e3:.1f} µs/step" in lines[0]
        assert f"(data evicted {lo / 1e3:.1f}, hot loop {warm / 1e3:.1f})" in lines[0]
    elif cold:
        assert want["per_step_cold_ns"] is not None
        assert want["per_step_cold_code_ns"] is None
        assert f"≥ {want['per_step_cold_ns'] / 1e3:.1f} µs/step" in lines[0]
        assert f"(cold floor; hot loop {warm / 1e3:.1f})" in lines[0]
    else:
        assert want["per_step_cold_ns"] is None and want["per_step_ns"] == warm
        assert f"≥ {want['per_step_ns'] / 1e3:.1f} µs/step" in lines[0]
        assert "warm calibration: a lower bound" in lines[0]
