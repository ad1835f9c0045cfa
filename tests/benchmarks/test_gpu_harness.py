"""The GPU harness's own arithmetic, which the overhead figures of
benchmarks/evidence/overhead.md rest on: the stepwise cost per step (on/off blocks), the
bootstrap interval, CPU pinning specs, the per-repetition deadline; and a TP=2 recording
from the H200 read per rank."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from benchmarks import _proc

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks/gpu" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


harness = _load("harness")
summarize = _load("summarize")


def _rows(cost_ns: int, trend_ns: float, block: int, blocks: int, seed: int = 0) -> list:
    """Steps of 3 ms with noise and a linear trend; 'on' blocks (even) cost ``cost_ns``."""
    rng = random.Random(seed)
    rows = []
    for i in range(block * blocks):
        b = i // block
        on = b % 2 == 0
        ns = 3_000_000 + trend_ns * i + rng.gauss(0, 50_000) + (cost_ns if on else 0)
        rows.append((b, int(on), int(ns)))
    return rows


@pytest.mark.parametrize("trend", [0.0, 2_000.0, -2_000.0])
def test_stepwise_recovers_the_cost_per_step_under_a_trend(trend: float) -> None:
    rows = _rows(150_000, trend, block=16, blocks=101)
    diffs = harness.block_costs(rows, 16)
    assert len(diffs) == 49  # on-blocks 2..98 with an off block on both sides
    med, lo, hi = summarize.median_ci(diffs)
    assert lo <= 150_000 <= hi and abs(med - 150_000) < 20_000
    # comparing each on block with the following off block alone would be biased by the
    # trend (16 steps x 2 us = 32 us here): the two-sided mean is not
    one_sided = [
        sorted(v for b2, _o, v in rows if b2 == b)[8]
        - sorted(v for b2, _o, v in rows if b2 == b + 1)[8]
        for b in range(0, 100, 2)
    ]
    if trend:
        assert abs(sorted(one_sided)[25] - 150_000) > abs(med - 150_000)


def test_stepwise_without_a_cost_reads_zero_and_skips_partial_blocks() -> None:
    rows = _rows(0, 0.0, block=8, blocks=41)[:-3]  # the last block is cut short
    diffs = harness.block_costs(rows, 8)
    assert len(diffs) == 19
    med, _lo, _hi = summarize.median_ci(diffs)
    assert abs(med) < 15_000  # noise: 50 us per step, medians of 8; a real cost was 150 us


def test_stepwise_by_means_sees_a_cost_paid_by_one_step_in_eight() -> None:
    """Sampling: one step in 8 pays 8x; block medians read the unrecorded majority (about
    zero), block means the cost throughput sees (the per-step average)."""
    rng = random.Random(1)
    rows = []
    for i in range(16 * 61):
        b = i // 16
        on = b % 2 == 0
        paid = on and i % 8 == 0
        rows.append((b, int(on), int(3_000_000 + rng.gauss(0, 20_000) + (800_000 if paid else 0))))
    by_median = summarize.median_ci(harness.block_costs(rows, 16))[0]
    by_mean = summarize.median_ci(harness.block_costs(rows, 16, statistics.fmean))[0]
    assert abs(by_median) < 30_000
    assert abs(by_mean - 100_000) < 20_000


def test_prefill_steps_on_one_parity_are_left_out() -> None:
    """A fixed workload of 257 steps starts every time in an "on" block; its prefill steps
    (3 ms longer here) would read as a probe cost that is not there. The harness leaves
    those pairs out, and summarize does the same for runs stored without the exclusion."""
    rng = random.Random(2)
    per, gens, block = 257, 10, 16
    starts = [g * per for g in range(gens)]
    rows = []
    for i in range(per * gens):
        b = i // block
        prefill = (i % per) < 3
        ns = 3_000_000 + rng.gauss(0, 20_000) + (3_000_000 if prefill else 0)
        rows.append((b, int(b % 2 == 0), int(ns)))
    biased = harness.block_costs(rows, block, statistics.fmean)
    assert statistics.fmean(biased) > 40_000 and max(biased) > 100_000
    skip = harness.prefill_blocks(starts, block)
    clean = harness.block_costs(rows, block, statistics.fmean, exclude=skip)
    assert abs(statistics.fmean(clean)) < 15_000 and max(clean) < 100_000
    stored = {"steps": per * gens, "block": block, "pair_diffs_mean_ns": biased}
    assert summarize.clean_pairs(stored, gens, "pair_diffs_mean_ns") == clean


def test_median_ci_is_reproducible_and_degenerate_cases() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 100.0]
    assert summarize.median_ci(xs) == summarize.median_ci(xs)
    assert summarize.median_ci([0.5]) == (0.5, 0.5, 0.5)


def test_cpu_specs_and_deadline() -> None:
    assert harness.parse_cpus("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert harness.parse_cpus("") is None and harness.parse_cpus(None) is None
    assert harness.pin(None) is None

    now = time.time()
    assert not harness.out_of_time(now + 5, now, 0)  # nothing done yet: always try one
    assert harness.out_of_time(now + 25, now - 10, 1)  # a 10 s repetition + 20 s margin
    assert not harness.out_of_time(now + 100, now - 10, 1)


def test_tp2_recording_from_the_h200_reads_per_rank() -> None:
    from probe.reader.recording import Recording
    from probe.records import Mode

    rec = Recording.open(ROOT / "tests/data/serve-tp2.probe")
    procs = {p["pid"]: p for p in rec.processes() if p["tp_rank"] is not None}
    assert sorted(p["tp_rank"] for p in procs.values()) == [0, 1]
    steps = [s for s in rec.iter_steps() if s.forward]
    per_rank = {pid: [s for s in steps if s.pid == pid] for pid in procs}
    for rows in per_rank.values():
        decode = [s for s in rows if s.uniform]
        assert len(decode) > 900 and all(s.mode == Mode.FULL for s in decode)


def test_reshape_leaves_out_and_plains_hooks_by_id() -> None:
    """The leave-one-out and wrap-only variants: excluded ids (or prefixes ending in
    ".") are not installed; with wrap_only every other hook but the step bracket is the
    plain phase span, and the originals come back by identity afterwards."""
    import types

    from probe.engine.hooks import step
    from probe.engine.hooks._base import Installer, Target
    from probe.records import Phase

    sys.path.insert(0, str(ROOT / "benchmarks/gpu"))
    reshape = _load("reshape")

    def marker(orig: object, hook: object) -> object:
        def wrapped(*a: object) -> str:
            return "body"

        return wrapped

    owner = types.SimpleNamespace(a=lambda: "a", b=lambda: "b", c=lambda: "c")
    originals = dict(vars(owner))
    ids = {"a": "sync.stream", "b": "reorder.mrv2", "c": "step.mrv2.execute_model"}
    r = reshape.Reshape(exclude=["sync."], wrap_only=True)
    unpatched = Installer.install_on
    r.patch()
    assert Installer.install_on is not unpatched
    try:
        inst = Installer()
        for name, hid in ids.items():
            inst.install_on(Target(hid, __name__, "", name, marker), owner)
    finally:
        r.unpatch()
    assert vars(owner)["a"] is originals["a"]  # left out
    assert vars(owner)["c"]() == "body"  # the bracket keeps its own body
    plain = step.span(Phase.SYNC_STALL)(originals["b"], None)  # type: ignore[arg-type]
    assert type(vars(owner)["b"]) is type(plain) and vars(owner)["b"]() == "b"
    assert r.summary()["skipped"] == ["sync.stream"] and r.summary()["plain"] == ["reorder.mrv2"]
    assert Installer.install_on is unpatched
    inst.uninstall()
    assert dict(vars(owner)) == originals


def test_crossover_pools_the_runs_of_a_variant() -> None:
    """``crossover.py --pool``: the block pairs of every run of one variant in one median
    and interval; other variants stay apart."""
    crossover = _crossover()

    def row(variant: str, xs: list[int]) -> dict:
        return {"scenario": "s", "variant": variant, "families": "all", "hot_path": "compiled",
                "gpu_timing": 8, "steps": 10, "step_median_us": 4000.0,
                "launch_off_median_us": 1000.0, "_parts": {"step": xs}}  # fmt: skip

    rows = [row("all", [1000] * 5), row("all", [3000] * 6), row("null", [0] * 4)]
    out = {r["variant"]: r for r in crossover.pooled(rows)}
    assert out["all"]["runs"] == 2 and out["all"]["step"]["pairs"] == 11
    assert out["all"]["step"]["median_us"] == 3.0  # 6 of the 11 pairs read 3 µs
    assert out["null"]["step"]["median_us"] == 0.0 and out["null"]["runs"] == 1


class _Hooks:
    """Stands in for probe.engine.hooks in the engine process: installed or not, on or off."""

    def __init__(self, rt: object) -> None:
        self.installed, self.rt = False, rt

    def install(self, lazy: bool = True) -> None:
        self.installed = True

    def uninstall(self) -> None:
        self.installed = False
        self.rt.enabled = False  # type: ignore[attr-defined]

    def enable(self, writer: object, gpu_timing: bool = True) -> None:
        self.rt.enabled = True  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "modes",
    [["attached", "absent", "profiler"], ["attached", "detached", "absent", "profiler"]],
)
def test_each_repetition_runs_its_mode_whatever_ran_before(modes: list[str]) -> None:
    # the overhead experiment's rotation: the profiler alone never has the probe on (it
    # did before: after an absent repetition it installed and enabled the hooks, after an
    # attached one it kept them on), detached is installed and dormant, attached is on
    import types

    rt = types.SimpleNamespace(enabled=False, sampling=False, sample_every=1, sample_n=0)
    hooks = _Hooks(rt)
    installed, seen = True, []
    hooks.installed = rt.enabled = True  # the engine starts attached (the warm-up)
    for i in range(3 * len(modes)):
        for m in modes[i % len(modes) :] + modes[: i % len(modes)]:
            installed = harness.apply_mode(m, installed, False, hooks, rt, None)
            assert installed == hooks.installed
            seen.append((m, hooks.installed, rt.enabled))
    want = {
        "attached": (True, True),
        "detached": (True, False),
        "absent": (False, False),
        "profiler": (False, False),
    }
    assert {(m, inst, on) for m, inst, on in seen} == {(m, *want[m]) for m in modes}
    installed = harness.apply_mode("groundtruth", installed, True, hooks, rt, None)
    assert installed and rt.enabled  # the ground truth: the profiler and the probe together
    installed = harness.apply_mode("attached_s8", installed, False, hooks, rt, None)
    assert rt.enabled and rt.sampling and rt.sample_every == 8
    with pytest.raises(ValueError, match="unknown probe mode"):
        harness.hooks_for("attahced")


def test_every_committed_plan_checks_and_a_typo_does_not() -> None:
    plans = sorted((ROOT / "benchmarks/gpu").glob("plan*.json"))
    assert len(plans) > 20
    import json

    for p in plans:
        assert harness.check_plan(json.loads(p.read_text())) == [], p.name
    plan = json.loads((ROOT / "benchmarks/gpu/plan_cost_crossover_ten_arms_mrv2.json").read_text())
    plan["experiments"][0]["variants"][1]["gpu_timng"] = 8
    plan["experiments"].append({"kind": "overhead", "scenario": "stock_v3", "modes": ["absnt"]})
    plan["experiments"].append({"kind": "stepwize", "scenario": "stock_mrv2_k1"})
    assert harness.check_plan(plan) == [
        "experiment 0 variant 1: unknown key 'gpu_timng'",
        "experiment 1: no scenario 'stock_v3' in benchmarks/gpu/scenarios",
        "experiment 1: unknown probe mode 'absnt'",
        "experiment 2: unknown kind 'stepwize'",
    ]
    assert harness.check_plan([]) == ['a plan is {"experiments": [...]}']


# -- where the engine's main thread ran (benchmarks/_proc.py) and the step speeds ------------

regimes = _load("regimes")


def test_siblings_read_the_smt_topology_and_a_cpu_without_it_is_its_own_core(tmp_path) -> None:
    for cpu, text in ((0, "0,8\n"), (8, "0,8\n"), (1, "1-2\n"), (2, "1-2\n")):
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(text)
    (tmp_path / "cpu3").mkdir()
    (tmp_path / "cpufreq").mkdir()  # not a CPU
    assert _proc.siblings(tmp_path) == {0: [0, 8], 1: [1, 2], 2: [1, 2], 3: [3], 8: [0, 8]}


def test_the_tracer_sees_a_busy_thread_run_and_where() -> None:
    import subprocess

    p = subprocess.Popen(
        [sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<5: pass"]
    )
    try:
        tr = _proc.Tracer(p.pid, every=0.005)
        import time

        time.sleep(0.4)
        samples = tr.stop()
    finally:
        p.kill()
        p.wait()
    row = _proc.placement(samples)
    assert row["samples"] == len(samples) >= 10
    seen = {int(c) for c in row["cpus"]}  # type: ignore[union-attr]
    assert seen and seen <= set(range(os.cpu_count() or 1))
    assert 0 <= int(row["migrations"]) < len(samples)  # type: ignore[call-overload]
    assert float(row["cpu_s"]) > 0.05  # type: ignore[arg-type]


def test_placement_counts_moves_between_cpus() -> None:
    s = [(float(i), "R", "", i * 10, 0, cpu) for i, cpu in enumerate([0, 0, 1, 1, 0, 3])]
    row = _proc.placement(s)
    assert row["cpus"] == {"0": 3, "1": 2, "3": 1} and row["migrations"] == 3
    assert row["cpu_s"] == 0.0 and row["wall_s"] == 5.0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_pin_main_thread_puts_the_caller_alone_and_the_others_off_its_core() -> None:
    code = (
        "import json, os, threading, time\n"
        "from benchmarks import _proc\n"
        "ev = threading.Event()\n"
        "t = threading.Thread(target=ev.wait); t.start()\n"
        "cpus = sorted(os.sched_getaffinity(0))\n"
        "sib = {c: [c] for c in cpus}\n"
        "done = _proc.pin_main_thread(cpus[0], sib)\n"
        "tids = os.listdir('/proc/self/task')\n"
        "aff = {tid: sorted(os.sched_getaffinity(int(tid))) for tid in tids}\n"
        "try:\n"
        "    _proc.pin_main_thread(10**4, sib)\n"
        "except ValueError as exc:\n"
        "    err = str(exc)\n"
        "ev.set(); t.join()\n"
        "print(json.dumps([cpus, done, aff, threading.get_native_id(), err]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout  # fmt: skip
    cpus, done, aff, me, err = json.loads(out)
    assert done["main_cpu"] == cpus[0] and done["threads_moved"] >= 1
    assert aff[str(me)] == [cpus[0]]
    others = [v for k, v in aff.items() if k != str(me)]
    assert others and all(v == cpus[1:] for v in others)
    assert "not among this process's CPUs" in err


def test_regimes_split_repetitions_and_show_two_step_speeds() -> None:
    rng = random.Random(1)
    rows, t = [], 10**9
    for rep in range(4):
        for i in range(128):
            fast = rep % 2 == 0 or i < 64  # reps 1 and 3 switch to slow half-way
            d = int((2.4e6 if fast else 3.8e6) * rng.uniform(0.98, 1.02))
            rows.append((t, t + d))
            t += d + 10_000
        t += 10**9  # the gap between two generates
    reps = regimes.split(rows, None)
    assert [len(r) for r in reps] == [128] * 4
    res = regimes.analyse(reps, 32)
    assert [r["spread"] > 1.4 for r in res["reps"]] == [False, True, False, True]
    bins = res["window_median_bins_ms"]
    assert set(bins) == {2.5, 3.75} and bins[2.5] == 12 and bins[3.75] == 4
    # windows given: the same split
    w = [[r[0][0], r[-1][0]] for r in (rows[:128], rows[128:256])]
    assert [len(r) for r in regimes.split(rows, w)] == [128, 128]


def test_overhead_keeps_each_repetitions_window_and_main_thread_moves() -> None:
    class _Eng:
        def __init__(self) -> None:
            self.n = 0

        def run(self, rep: int, probe: str, seed: int) -> dict:
            self.n += 1
            return {
                "rep": rep, "probe": probe, "tok_s": 100.0 + self.n, "tokens_sha": "x",
                "boottime": [self.n * 10, self.n * 10 + 5], "main_thread": {"migrations": self.n},
            }  # fmt: skip

    res = harness.run_overhead(_Eng(), 2, Path("."), ["attached", "absent"])  # type: ignore[arg-type]
    att = res["modes"]["attached"]
    assert att["windows"] == [[10, 15], [40, 45]]  # rep 0 runs attached first, rep 1 second
    assert att["main_thread_migrations"] == [1, 4]
    assert res["modes"]["absent"]["main_thread_migrations"] == [2, 3]


def test_steal_reads_each_cpus_steal_ticks_and_sums_them_between_two_reads(tmp_path) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  10 0 10 100 0 0 0 30 0 0\n"
        f"cpu0 5 0 5 50 0 0 0 {tick} 0 0\n"
        f"cpu1 5 0 5 50 0 0 0 {2 * tick} 0 0\n"
        "cpu2 5 0 5 50\n"  # an old kernel: no steal column
        "intr 12345\n"
    )
    a = _proc.steal(stat)
    assert a == {0: 1.0, 1: 2.0, 2: 0.0}
    stat.write_text(f"cpu0 5 0 5 50 0 0 0 {3 * tick} 0 0\ncpu1 5 0 5 50 0 0 0 {2 * tick} 0 0\n")
    b = _proc.steal(stat)
    assert _proc.steal_between(a, b, [0]) == 2.0
    assert _proc.steal_between(a, b, [0, 1]) == 2.0
    assert _proc.steal_between(a, b, []) == 0.0
    assert _proc.steal(tmp_path / "missing") == {}
    assert set(_proc.steal()) <= set(range(os.cpu_count() or 1))  # this machine's own


def test_regimes_prints_the_main_threads_times_where_the_harness_recorded_them() -> None:
    line = regimes._times({"wall_s": 2.0, "cpu_s": 1.9, "runq_s": 0.01, "steal_s": 0.25})
    assert line == "  cpu 0.95 of wall, runq 0.010 s, steal 0.250 s"
    assert regimes._times({"wall_s": 2.0, "cpu_s": 1.0, "runq_s": None, "steal_s": None}) == (
        "  cpu 0.50 of wall, runq 0.000 s, steal -"
    )
    assert regimes._times({}) == ""


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_overhead_order_puts_each_mode_after_every_other_equally_often(n: int) -> None:
    """A mode's after-effects (the profiler's teardown) must not land on one mode: over a
    full square each ordered pair of neighbours inside a repetition occurs equally often,
    and each repetition runs every mode once."""
    import itertools
    from collections import Counter

    modes = [f"m{k}" for k in range(n)]
    reps = n if n % 2 == 0 else 2 * n
    pairs: Counter[tuple[str, str]] = Counter()
    for i in range(reps):
        order = harness.williams_order(modes, i)
        assert sorted(order) == modes
        pairs.update(itertools.pairwise(order))
    assert len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1, pairs


def _crossover() -> ModuleType:
    """benchmarks/gpu/crossover.py (its own imports are its folder's modules)."""
    sys.path.insert(0, str(ROOT / "benchmarks/gpu"))
    return _load("crossover")


def _crossover_rows(block: int, workloads: int, blocks: int, step_ns: Any) -> list:
    """Crossover step rows (workload, block, on, ns): on blocks where (block + workload)
    is even, as the harness switches them; ``step_ns(workload, step, on)``."""
    rows = []
    for g in range(workloads):
        for i in range(block * blocks):
            b = i // block
            on = (b + g) % 2 == 0
            rows.append((g, b, int(on), int(step_ns(g, i, on))))
    return rows


def test_crossover_throughput_is_the_block_pairs_wall_ratio() -> None:
    """``crossover.py``'s throughput: per block pair (the on block of workload 2j facing
    the off block at the same place of workload 2j+1, and the reverse), the off block's
    total wall over the on block's; ``throughput_steady`` leaves each block's first step
    out, where an attach's one-off work lands."""
    crossover = _crossover()
    rng = random.Random(3)

    def step_ns(g: int, i: int, on: bool) -> float:
        ns = 3_000_000 * (1 + 0.002 * g) + rng.gauss(0, 20_000)  # a slow drift
        if on:
            ns *= 1.01  # the probe: 1% per step
            if i % block == 0:
                ns += 1_500_000  # the attach's first step
        return ns

    block = 16
    rows = _crossover_rows(block, 8, 6, step_ns)
    ratios = crossover.pair_throughput(rows, block)
    steady = crossover.pair_throughput(rows, block, skip_first=True)
    assert len(ratios) == len(steady) == 4 * 5  # 4 workload pairs x blocks 1-5
    med = sorted(steady)[len(steady) // 2]
    assert abs(med - 1 / 1.01) < 0.004
    assert max(ratios) < min(steady)  # the first step's one-off cost is in the plain ratio
    # the per-step costs read the same block pairs
    assert crossover.pair_costs(rows, block) == [
        statistics.median(on) - statistics.median(off)
        for on, off in crossover.block_pairs(rows, block)
    ]


def test_crossover_steady_cost_and_cost_by_place_in_the_block() -> None:
    """``step_steady`` leaves each block's first step out (an attach's one-off work), and
    ``position_diffs``/``position_costs`` show where in the block a cost sits: here 1.5 ms
    on the first step of each on block and 30 µs on every step."""
    crossover = _crossover()
    rng = random.Random(5)
    block = 8
    rows = _crossover_rows(
        block,
        6,
        5,
        lambda g, i, on: (
            3_000_000 + rng.gauss(0, 5_000) + (30_000 + (1_500_000 if i % block == 0 else 0)) * on
        ),
    )
    plain = statistics.median(crossover.pair_costs(rows, block))
    steady = statistics.median(crossover.pair_costs(rows, block, skip_first=True))
    assert abs(steady - 30_000) < 5_000 and abs(plain - 30_000) < 10_000
    places = crossover.position_costs(crossover.position_diffs(rows, block))
    assert len(places) == block
    assert abs(places[0] - 1530.0) < 15 and all(abs(p - 30.0) < 8 for p in places[1:])


class _Engine:
    """An LLM whose generate() runs ``n`` engine steps and notes, per step, what the
    probe's switches were (RT.enabled, whether the hooks were attached)."""

    def __init__(self, n: int, seen: list, attached: list) -> None:
        self.n, self.seen, self.attached = n, seen, attached
        self.llm_engine = self

    def step(self) -> None:
        from probe.engine.runtime import RT

        self.seen.append((bool(RT.enabled), self.attached[0]))

    def generate(self, work: object, sp: object, use_tqdm: bool = False) -> None:
        for _ in range(self.n):
            self.llm_engine.step()


@pytest.mark.parametrize("variant", ["enabled_absent", "dormant_absent", "touch", "reattach"])
def test_crossover_switches_what_the_variant_names(variant: str, monkeypatch) -> None:
    """``"off": "absent"`` detaches for the off blocks and attaches for the on blocks;
    with ``"on": "dormant"`` the on blocks attach but never record (dormant hooks against
    none); ``"touch"`` leaves the hooks installed and modifies every hooked class at each
    switch, as an attach or detach does; ``"off": "reattach"`` keeps them in place in the
    off blocks and detaches and attaches afresh at the start of each on block."""
    from probe.engine import hooks
    from probe.engine.runtime import RT

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks/gpu"))  # the harness's own modules
    attached = [True]
    calls: list[str] = []

    parked: set = set()
    monkeypatch.setattr(hooks, "PARKED", parked)

    def switch(name: str, now: bool) -> None:
        calls.append(name)
        attached[0] = now
        if name == "detach" and variant == "dormant_absent":  # as a 3.13 detach past budget
            parked.add((1, "m"))
        elif name == "attach":
            parked.clear()

    monkeypatch.setattr(hooks, "attach", lambda *a, **k: switch("attach", True))
    monkeypatch.setattr(hooks, "detach", lambda: switch("detach", False))
    monkeypatch.setattr(hooks, "install", lambda *a, **k: None)
    monkeypatch.setattr(hooks, "enable", lambda *a, **k: None)
    monkeypatch.setattr(hooks, "uninstall", lambda: [])

    class Owner:
        pass

    class Hook:
        owner = Owner

    monkeypatch.setattr(hooks.INSTALLER, "hooks", {"x": Hook()})
    cmd: dict = {"design": "crossover", "block": 4, "generates": 2, "gpu_timing": False}
    if variant in ("enabled_absent", "dormant_absent"):
        cmd["off"] = "absent"
    if variant == "reattach":
        cmd["off"] = "reattach"
    if variant == "dormant_absent":
        cmd["on"] = "dormant"
    if variant == "touch":
        cmd["touch"] = True
    seen: list = []
    res = harness.stepwise(_Engine(16, seen, attached), cmd, lambda *a: [], lambda n: None,
                           object())  # fmt: skip
    RT.enabled = False
    on_steps = [i % 16 // 4 % 2 == 0 if i < 16 else i % 16 // 4 % 2 == 1 for i in range(32)]
    if variant == "reattach":
        assert all(a for _e, a in seen) and [e for e, _a in seen] == on_steps
        assert calls == ["detach", "attach"] * 3  # blocks 2, 5 and 7 start on after off
        assert res["off"] == "reattach" and len(res["switches"]) == 3
    elif variant == "touch":
        assert calls == [] and [e for e, _a in seen] == on_steps
        assert Owner.__dict__.get("_probe_touch") is not None  # the class was modified
        assert res["off"] == "dormant" and res["touch"] is True
    else:
        assert [a for _e, a in seen] == on_steps  # attached exactly in the on blocks
        want = [False] * 32 if variant == "dormant_absent" else on_steps
        assert [e for e, _a in seen] == want
        assert res["on"] == ("dormant" if variant == "dormant_absent" else "enabled")
        assert calls[-1] == "attach"  # left attached (dormant), as the other designs
        assert res["parked_hooks"] == (1 if variant == "dormant_absent" else 0)


@pytest.mark.parametrize("off", ["absent", "dormant"])
def test_a_clock_variant_records_the_clock_its_attaches_read(off: str, monkeypatch) -> None:
    """A variant with ``"clock"`` sets ``PROBE_CLOCK`` for its attaches and records the
    clock they read, also where the end of an absent variant attaches once more on the
    process's own setting (older runs labelled their absent/tsc variants boottime); the
    process's setting is back afterwards."""
    from probe.engine import hooks
    from probe.engine.runtime import RT

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks/gpu"))
    monkeypatch.delenv("PROBE_CLOCK", raising=False)
    attached = [True]

    def attach(*a: Any, **k: Any) -> None:  # as RT.attach reads the setting
        attached[0] = True
        RT.clock = os.environ.get("PROBE_CLOCK", "boottime")

    def detach() -> None:
        attached[0] = False

    monkeypatch.setattr(RT, "clock", "boottime", raising=False)
    monkeypatch.setattr(hooks, "attach", attach)
    monkeypatch.setattr(hooks, "detach", detach)
    monkeypatch.setattr(hooks, "install", lambda *a, **k: None)
    monkeypatch.setattr(hooks, "enable", lambda *a, **k: attach())
    monkeypatch.setattr(hooks, "uninstall", lambda: [])
    monkeypatch.setattr(hooks.INSTALLER, "hooks", {})
    # one workload: its last block is off, so an absent variant ends detached
    cmd = {"design": "crossover", "block": 4, "generates": 1, "gpu_timing": False,
           "clock": "tsc", "off": off}  # fmt: skip
    res = harness.stepwise(_Engine(16, [], attached), cmd, lambda *a: [], lambda n: None,
                           object())  # fmt: skip
    RT.enabled = False
    assert res["clock"] == "tsc"
    assert "PROBE_CLOCK" not in os.environ


def test_crossover_balanced_cancels_a_difference_between_the_two_workloads() -> None:
    """Workload 2j+1 of every pair 300 µs a step slower than 2j (V1 moves that much), a
    cost of 40 µs: on blocks 1-11 six pairs have the on block in 2j+1 and five in 2j, so
    the one median over all pairs reads the slow workload; ``balanced`` (the mean of the two
    parities' medians) reads the cost."""
    crossover = _crossover()
    rng = random.Random(11)
    block = 8
    rows = _crossover_rows(
        block,
        8,
        12,
        lambda g, i, on: 3_000_000 + 300_000 * (g % 2) + 40_000 * on + rng.gauss(0, 3_000),
    )
    even, odd = crossover.parity_costs(rows, block)
    assert (len(even), len(odd)) == (4 * 5, 4 * 6)
    assert abs(statistics.median(crossover.pair_costs(rows, block)) - 340_000) < 10_000
    est = crossover.balanced(even, odd)
    assert est is not None and abs(est[0] - 40_000) < 3_000 and est[1] <= est[0] <= est[2]


def _crossover_run(rows: list, off: str | None = None, on: str | None = None) -> dict:
    """One crossover run as the harness writes it (the fields ``summarize`` reads)."""
    return {
        "design": "crossover", "block": 16, "families": "all", "hot_path": "compiled",
        "gpu_timing": 8, "steps": len(rows), "median_off_ns": 3_000_000,
        "step_rows": rows, "off": off, "on": on, "switches": None, "bare_rows": None,
    }  # fmt: skip


def test_a_paused_reader_and_no_gpu_timer_pool_apart() -> None:
    """Variants with the reader paused (``pause_reader``) and without the GPU timer pool
    apart from the plain one (the split plan, ``plan_mrv2_timer_reader_split.json``)."""
    crossover = _crossover()
    rng = random.Random(3)
    rows = _crossover_rows(
        16, 8, 12, lambda g, i, on: 3_000_000 + 40_000 * on + rng.gauss(0, 5_000)
    )
    paused = dict(_crossover_run(rows), pause_reader=True)
    untimed = dict(_crossover_run(rows), gpu_timing=False)
    res = {"experiments": [{"scenario": "s", "result": {"runs": [
        _crossover_run(rows), paused, untimed, dict(paused, off="absent"),
    ]}}]}  # fmt: skip
    pooled = crossover.pooled(crossover.summarize(res))
    got = {(r["variant"], r["gpu_timing"]) for r in pooled}
    assert got == {("all", 8), ("all paused", 8), ("all", False), ("all paused off=absent", 8)}
    plan = json.loads((ROOT / "benchmarks/gpu/plan_mrv2_timer_reader_split.json").read_text())
    variants = plan["experiments"][0]["variants"]
    assert sum(bool(v.get("pause_reader")) for v in variants) == 3
    assert sum(v.get("gpu_timing") is False for v in variants) == 3


def _noisy_rows(rng: random.Random, sd_ns: int) -> Callable[[int], list]:
    """Crossover step rows costing ``cost_ns`` more per on step, with Gaussian noise."""

    def rows(cost_ns: int) -> list:
        return _crossover_rows(
            16, 8, 12, lambda g, i, on: 3_000_000 + cost_ns * on + rng.gauss(0, sd_ns)
        )

    return rows


def test_a_difference_names_the_gpu_timing_where_a_variant_ran_with_two() -> None:
    """``--diff``: where ``all`` ran with and without the GPU timer, ``all`` alone is
    refused (pooling both would hide the difference asked for) and ``all gpu_timing=X``
    picks one: the timed rows cost 40 µs, the untimed 25."""
    crossover = _crossover()
    rows = _noisy_rows(random.Random(9), 3_000)

    res = {"experiments": [{"scenario": "s", "result": {"runs": [
        _crossover_run(rows(40_000)), dict(_crossover_run(rows(25_000)), gpu_timing=False),
        dict(_crossover_run(rows(40_000)), pause_reader=True),
    ]}}]}  # fmt: skip
    pooled = crossover.pooled(crossover.summarize(res))
    with pytest.raises(ValueError, match="gpu_timing 8 and False"):
        crossover.differences(pooled, [("all", "all paused")])
    (d,) = crossover.differences(pooled, [("all gpu_timing=8", "all gpu_timing=False")])
    assert d["pairs"] == [4 * 11, 4 * 11] and abs(d["median_us"] - 15) < 3
    (p,) = crossover.differences(pooled, [("all gpu_timing=8", "all paused")])
    assert abs(p["median_us"]) < 3


def test_crossover_difference_between_two_variants(tmp_path: Path) -> None:
    """``--diff A B``: variant A's per-step cost minus variant B's over their pooled block
    pairs, with a bootstrap interval that holds the true difference (60 - 40 µs) and not
    zero; two variants of the same cost give an interval around zero."""
    crossover = _crossover()
    rows = _noisy_rows(random.Random(5), 5_000)

    res = {"experiments": [{"scenario": "s", "result": {"runs": [
        _crossover_run(rows(60_000), off="absent"), _crossover_run(rows(40_000)),
        _crossover_run(rows(60_000), off="absent"), _crossover_run(rows(40_000)),
        _crossover_run(rows(40_000), off="absent", on="dormant"),
    ]}}]}  # fmt: skip
    pooled = crossover.pooled(crossover.summarize(res))
    assert {r["variant"] for r in pooled} == {"all", "all off=absent", "all on=dormant off=absent"}
    (d,) = crossover.differences(pooled, [("all off=absent", "all")])
    assert d["pairs"] == [2 * 4 * 11, 2 * 4 * 11]
    assert abs(d["median_us"] - 20) < 2 and d["ci95_us"][0] > 5 and d["ci95_us"][1] < 35
    (same,) = crossover.differences(pooled, [("all on=dormant off=absent", "all")])
    assert same["ci95_us"][0] < 0 < same["ci95_us"][1]
    assert crossover.differences(pooled, [("all", "no such variant")]) == []

    src = tmp_path / "r.json"
    src.write_text(json.dumps(res))
    out = tmp_path / "pooled.json"
    cli = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu/crossover.py"), "--pool", str(src),
         "--diff", "all off=absent", "all", "--json", str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "[all off=absent] - [all]: step_steady +" in cli.stdout
    doc = json.loads(out.read_text())
    assert len(doc["variants"]) == 3 and doc["differences"][0]["a"] == "all off=absent"


def test_crossover_tags_compare_two_probe_trees(tmp_path: Path) -> None:
    """``RESULTS@TAG``: the runs of two probe trees (a before/after in one session) pool
    apart under their tags, and ``--diff 'new: all' 'old: all'`` prints the difference of
    their costs (here 30 - 45 µs); untagged files keep their variant names."""
    crossover = _crossover()
    assert crossover.tagged("a/r.json.gz@new") == ("a/r.json.gz", "new")
    assert crossover.tagged("a/r.json=a/r.probe.db@old") == ("a/r.json=a/r.probe.db", "old")
    assert crossover.tagged("runs@2/r.json") == ("runs@2/r.json", "")
    assert crossover.tagged("r.json") == ("r.json", "")
    rng = random.Random(9)
    files = []
    for name, cost in (("n1", 30_000), ("o1", 45_000), ("n2", 30_000), ("o2", 45_000)):
        rows = _crossover_rows(
            16, 8, 12, lambda g, i, on, c=cost: 3_000_000 + c * on + rng.gauss(0, 4_000)
        )
        src = tmp_path / f"{name}.json"
        src.write_text(json.dumps({"experiments": [{"scenario": "s", "result": {
            "runs": [_crossover_run(rows)]}}]}))  # fmt: skip
        files.append(f"{src}@{'new' if name[0] == 'n' else 'old'}")
    out = tmp_path / "pooled.json"
    cli = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu/crossover.py"), "--pool", *files,
         "--diff", "new: all", "old: all", "--json", str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "[new: all] - [old: all]: step_steady -" in cli.stdout
    doc = json.loads(out.read_text())
    assert sorted(r["variant"] for r in doc["variants"]) == ["new: all", "old: all"]
    assert all(r["runs"] == 2 for r in doc["variants"])
    (d,) = doc["differences"]
    assert abs(d["median_us"] + 15) < 3 and d["ci95_us"][1] < 0


def test_crossover_halves_separate_a_cost_that_fades_after_each_switch() -> None:
    """``half_costs``: a cost of 40 µs a step plus 60 µs on the first ten steps after each
    switch (a warm-up) reads about 100 µs in the first half of the blocks (steps 1-7) and
    40 µs in the second (steps 8-15), where ``step_steady``'s median over steps 1-15 reads
    the warm-up."""
    crossover = _crossover()
    rng = random.Random(8)
    rows = _crossover_rows(
        16,
        8,
        12,
        lambda g, i, on: 3_000_000 + on * (40_000 + 60_000 * (i % 16 < 10)) + rng.gauss(0, 2_000),
    )
    early, late = crossover.half_costs(rows, 16)
    assert len(early) == len(late) == 4 * 11
    assert abs(statistics.median(early) - 100_000) < 3_000
    assert abs(statistics.median(late) - 40_000) < 3_000
    steady = statistics.median(crossover.pair_costs(rows, 16, skip_first=True))
    assert abs(steady - 100_000) < 3_000


def test_an_engine_whose_reader_has_exited_is_refused() -> None:
    """The harness checks its ``probe collect`` reader once the engine is ready: a reader
    that exited (here the real CLI refusing an ``--out`` that exists, as a re-run of the
    same name once met) is an error naming the exit status, not a silent run without one."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.probe.db"
        out.write_bytes(b"")
        reader = subprocess.Popen(
            [sys.executable, "-m", "probe", "collect", "--run-dir", d, "--out", str(out)],
            cwd=ROOT, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        reader.wait(timeout=60)
        with pytest.raises(RuntimeError, match=r"reader \(probe collect\) exited with rc=2"):
            harness.reader_alive("e", reader)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        harness.reader_alive("e", alive)
    finally:
        alive.kill()
        alive.wait()


def test_a_counted_variant_tells_the_calls_compiled_hooks_hand_to_python(monkeypatch) -> None:
    """``"count_python_calls"``: each compiled hook built during the variant (here a real
    ``accel.build_hook`` around a stand-in build) has its Python ``record`` counted: with
    no compiled ring bound, every call leaves C, and each one shows; a variant whose hooks
    never leave C reports none; ``probe.engine.accel`` is restored by identity, and crossover
    names the variant apart and pools the counts."""
    from probe.engine import accel, hooks
    from probe.engine.runtime import RT

    if accel.active() != "compiled":
        pytest.skip("the compiled hot path is not built here")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks/gpu"))
    import pycalls

    plain_build_hook = accel.build_hook
    counter = pycalls.PythonCalls()
    counter.patch()
    try:
        recorded: list = []

        class Md:
            pass

        class CM:
            num_actual_tokens, num_reqs, max_query_len = 8, 4, 2

        def build(self: object, prefix: int, cm: object) -> object:
            return Md()

        def record(md: object, t0: int, t1: int, *a: object, **k: object) -> None:
            recorded.append(md)

        hook = accel.build_hook(build, record, RT, 0)
        assert hook is not None
        with accel.use("python"):  # no C path: the Python wrapper is installed as it is
            assert accel.gate(build, record, RT) is record
        RT.enabled = True
        try:
            for _ in range(3):
                hook(object(), 0, CM())
        finally:
            RT.enabled = False
    finally:
        counter.unpatch()
    assert accel.build_hook is plain_build_hook
    assert counter.result(3) == {"calls": {"build_hook.record test_a_counted_variant_tells_"
                                           "the_calls_compiled_hooks_hand_to_python.<locals>."
                                           "build": len(recorded)}, "on_steps": 3}  # fmt: skip
    assert len(recorded) == 3

    monkeypatch.setattr(hooks, "install", lambda *a, **k: None)
    monkeypatch.setattr(hooks, "enable", lambda *a, **k: None)
    monkeypatch.setattr(hooks, "uninstall", lambda: [])
    cmd: dict = {"design": "crossover", "block": 4, "generates": 2, "gpu_timing": False,
                 "count_python_calls": True}  # fmt: skip
    res = harness.stepwise(_Engine(16, [], [True]), cmd, lambda *a: [], lambda n: None, object())
    RT.enabled = False
    assert res["python_calls"] == {"calls": {}, "on_steps": 16}
    assert accel.build_hook is plain_build_hook
    crossover = _crossover()
    rows = _crossover_rows(16, 8, 12, lambda g, i, on: 3_000_000 + 40_000 * on)
    run = dict(_crossover_run(rows), python_calls={"calls": {"x": 96}, "on_steps": 96})
    res2 = {"experiments": [{"scenario": "s", "result": {"runs": [run, run]}}]}
    (row,) = crossover.pooled(crossover.summarize(res2))
    assert row["variant"] == "all counted"
    assert row["python_calls"] == {"calls": {"x": 192}, "on_steps": 192}


def test_greedy_tokens_are_compared_workload_by_workload_across_variants(tmp_path: Path) -> None:
    """The harness hashes each workload's greedy tokens (``token_digest``: request order
    kept, None when generate gave nothing); crossover compares them across every variant
    run of a scenario and names the workloads whose tokens differ."""

    class Out:
        def __init__(self, toks: list[int]) -> None:
            self.outputs = [type("C", (), {"token_ids": toks})()]

    a = harness.token_digest([Out([1, 2]), Out([3])])
    assert a == harness.token_digest([Out([1, 2]), Out([3])])
    assert a != harness.token_digest([Out([3]), Out([1, 2])])  # order is part of it
    assert harness.token_digest(None) is None

    crossover = _crossover()
    rows = _crossover_rows(16, 8, 12, lambda g, i, on: 3_000_000 + 40_000 * on)

    def run(digests: list, **kw: object) -> dict:
        return dict(_crossover_run(rows), token_digests=digests,
                    workload={"requests": None, "out_len": 256}, **kw)  # fmt: skip

    same = ["a", "b", "c"]
    res = {"experiments": [{"scenario": "s", "result": {"runs": [
        run(same), run(same, off="absent"), run(["a", None, "c"], pause_reader=True),
    ]}}]}  # fmt: skip
    (t,) = crossover.token_identity(crossover.summarize(res))
    assert t == {"scenario": "s", "requests": None, "out_len": 256, "rows": 3,
                 "workloads": 3, "differ": []}  # fmt: skip
    res["experiments"][0]["result"]["runs"].append(run(["a", "x", "c"]))
    (t,) = crossover.token_identity(crossover.summarize(res))
    assert t["differ"] == [1] and t["rows"] == 4

    src = tmp_path / "r.json"
    src.write_text(json.dumps(res))
    out = tmp_path / "o.json"
    cli = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu/crossover.py"), "--pool", str(src),
         "--json", str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "greedy tokens over 4 variant runs x 3 workloads: DIFFER in workload(s) 1" in cli.stdout
    assert json.loads(out.read_text())["tokens"][0]["differ"] == [1]


def _overhead_result(attached: list[float], absent: list[float], same_tokens: bool) -> dict:
    modes = {"attached": attached, "absent": absent}
    return {
        "experiments": [
            {
                "kind": "overhead",
                "result": {
                    "modes": {
                        m: {
                            "tok_s": {
                                "n": len(v),
                                "median": statistics.median(v),
                                "min": min(v),
                                "max": max(v),
                            },
                            "ratio_to_absent": statistics.median(v) / statistics.median(absent),
                            "paired_ratio_to_absent": [
                                x / y for x, y in zip(v, absent, strict=True)
                            ],
                        }
                        for m, v in modes.items()
                    },
                    "token_identity": same_tokens,
                    "dropped": 0,
                },
            }
        ]
    }


def test_overhead_runs_pool_their_paired_ratios_and_read_gzipped(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Several runs' whole-workload repetitions pool mode by mode (each run pairs its own
    repetitions), from the gzipped files the results folders keep; one run whose tokens
    differed makes the pooled token line say so."""
    import gzip

    one = _overhead_result([90.0, 99.0, 100.0], [100.0, 100.0, 100.0], True)
    two = _overhead_result([98.0, 97.0], [100.0, 100.0], False)
    p1, p2 = tmp_path / "r1-results.json.gz", tmp_path / "r2-results.json"
    p1.write_bytes(gzip.compress(json.dumps(one).encode()))
    p2.write_text(json.dumps(two))
    assert summarize.load_results(str(p1)) == one
    over = [(str(p), summarize.load_results(str(p))["experiments"][0]["result"]) for p in (p1, p2)]
    pooled = summarize.pool_overhead(over)
    att = pooled["modes"]["attached"]
    assert att["reps"] == 5 and att["median_paired_ratio"] == pytest.approx(0.98)
    assert att["ci95"][0] <= 0.98 <= att["ci95"][1]
    assert pooled["token_identity"] == {"all_runs": False}
    monkeypatch.setattr(sys, "argv", ["summarize.py", str(p1), str(p2)])
    summarize.main()
    out = capsys.readouterr().out
    assert "Overhead pooled over 2 runs" in out and "| attached | 5 | 0.9800" in out


def test_the_tsc_clock_pools_apart_and_the_clock_plan_alternates_the_two() -> None:
    """A variant run on the TSC clock (``"clock": "tsc"``) pools apart as ``all clock=tsc``;
    one on clock_gettime, or from before the clock was recorded, is ``all``; the H200 plan
    for the clock alternates the two in each design."""
    crossover = _crossover()
    rows = _noisy_rows(random.Random(11), 3_000)
    res = {"experiments": [{"scenario": "s", "result": {"runs": [
        _crossover_run(rows(40_000)), dict(_crossover_run(rows(30_000)), clock="tsc"),
        dict(_crossover_run(rows(40_000)), clock="boottime"),
    ]}}]}  # fmt: skip
    pooled = crossover.pooled(crossover.summarize(res))
    assert {(r["variant"], r["runs"]) for r in pooled} == {("all", 2), ("all clock=tsc", 1)}
    (d,) = crossover.differences(pooled, [("all clock=tsc", "all")])
    assert abs(d["median_us"] + 10) < 3
    plan = json.loads((ROOT / "benchmarks/gpu/plan_mrv2_clock.json").read_text())
    clocks = [(v.get("off"), v["clock"]) for v in plan["experiments"][0]["variants"]]
    assert (
        clocks
        == [(None, "boottime"), (None, "tsc")] * 4 + [("absent", "boottime"), ("absent", "tsc")] * 2
    )
