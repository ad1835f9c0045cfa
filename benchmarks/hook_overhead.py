"""Added cost per hooked call, probe enabled and disabled, on a real vLLM function.

    python benchmarks/hook_overhead.py [--n 200] [--rounds 1500] [--cold 10] [--json PATH]

Runs every case on both hot paths (probe.engine.accel): ``compiled`` (the C extension) and
``python`` (the pure-Python wrappers, packers and ring writer, with the extension's hot
state object), and once more in a child process with ``PROBE_ACCEL=0`` (the install with no
extension at all: ``python-noext``). One table.

The target is the real ``CudagraphDispatcher.dispatch`` of the installed vLLM (a FULL
hit, the steady-state case; and a miss as V1's eager MTP drafter makes one every step,
``valid_modes={NONE}``) and a phase span on the real ``GPUModelRunner._may_reorder_
batch`` path's cheapest kind of wrapper (a span around a plain function). For each:
the original (vLLM's function put back, called through the same attribute), the installed
hook with the probe disabled (bypass), and enabled (one record per call into a real
shared-memory ring, drained between segments so it never fills). Each round times ``--n``
back-to-back calls in each of the three states, in an order rotated from round to round:
segments of a millisecond or so, so that the machine's drift (the real dispatch varied
5.6-10.1 µs a call from run to run here with 40,000-call segments) lands on all three
alike. Reported: the medians over ``--rounds`` rounds of ns per call and of the per-round
added cost, with a bootstrap 95% interval of the latter.

``--cold K`` (default 10; 0 leaves it out): also the same three states with the caches
cold, as each hooked call runs inside an engine step: in each of ``--cold-rounds`` rounds
(order rotated), the median of ``K`` single calls in each state, each after copying a
buffer of four times the core's L2 (``probe.engine.calibrate.evict_bytes``, what the calibration
at attach does). The second table: the cold medians and the added cold cost per call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _timing import per_call

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from crossover import ci95  # the bootstrap interval of a median


def _table(title: str, results: dict[str, Any]) -> None:
    """One table of added ns per call, dormant and enabled, with their intervals."""
    print(
        f"{title:56} {'orig':>6} {'off':>6} {'on':>6} {'+off [95%]':>18} {'+on [95%]':>18}"
        "  (ns/call)"
    )
    for k, v in results.items():
        lo0, hi0 = v["added_disabled_ci95"]
        lo1, hi1 = v["added_enabled_ci95"]
        print(
            f"{k:56} {v['original_ns']:6.0f} {v['disabled_ns']:6.0f} {v['enabled_ns']:6.0f} "
            f"{v['added_disabled_ns']:6.0f} [{lo0:4.0f},{hi0:5.0f}] "
            f"{v['added_enabled_ns']:6.0f} [{lo1:4.0f},{hi1:5.0f}]"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=200, help="dispatch calls per segment (spans: 20x)")
    ap.add_argument("--rounds", type=int, default=1500)
    ap.add_argument("--cold", type=int, default=10, help="single cold calls per state and round")
    ap.add_argument("--cold-rounds", type=int, default=40)
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    from probe.engine import accel

    paths = [accel.NAME] if a.child else (["compiled", "python"] if accel.COMPILED else ["python"])
    results: dict[str, Any] = {}
    for path in paths:
        with accel.use(path):
            for k, v in run_cases(a.n, a.rounds, a.cold, a.cold_rounds).items():
                results[f"{k} [{path}]"] = v
    if a.child:
        print(json.dumps(results))
        return
    env = dict(os.environ, PROBE_ACCEL="0")
    out = subprocess.run(
        [
            *(sys.executable, __file__, "--n", str(a.n), "--rounds", str(a.rounds)),
            *("--cold", str(a.cold), "--cold-rounds", str(a.cold_rounds), "--child"),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for k, v in json.loads(out.strip().splitlines()[-1]).items():
        results[k.replace("[python]", "[python-noext]")] = v
    _table("target", results)
    if a.cold > 0:
        print()
        _table("cold (single calls, caches evicted)", {k: v["cold"] for k, v in results.items()})
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


def run_cases(n: int, rounds: int, cold: int = 0, cold_rounds: int = 0) -> dict[str, Any]:
    from vllm.config import CompilationMode, CUDAGraphMode, VllmConfig
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    from probe.engine import hooks
    from probe.engine.calibrate import cold_call_ns, evict_bytes
    from probe.engine.hooks import step
    from probe.engine.hooks._base import Installer, Target
    from probe.engine.ring_writer import RingWriter
    from probe.engine.runtime import RT
    from probe.reader.ring_reader import RingReader
    from probe.records import Phase

    vc = VllmConfig()
    cc = vc.compilation_config
    cc.mode = CompilationMode.NONE
    cc.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    cc.cudagraph_capture_sizes = [2, 4, 8, 16, 32]
    cc.max_cudagraph_capture_size = 32
    d = CudagraphDispatcher(vc)
    d.uniform_decode_query_len = 2
    d.initialize_cudagraph_keys(CUDAGraphMode.FULL_DECODE_ONLY, uniform_decode_query_len=2)

    class Plain:
        def noop(self, x: int) -> int:
            return x

    obj = Plain()
    orig_dispatch = vars(CudagraphDispatcher)["dispatch"]
    orig_noop = vars(Plain)["noop"]
    results: dict[str, Any] = {}
    tmp = Path(tempfile.mkdtemp(prefix="probe-bench-", dir="/dev/shm"))
    writer = RingWriter.create(tmp / "ring-bench.shm", 1 << 22)

    reader = RingReader.open(writer.path)
    nbytes = evict_bytes()
    src, dst = bytearray(nbytes), bytearray(nbytes)

    def cold_calls(call: Any, k: int) -> float:
        """The median ns of ``k`` single calls, each after evicting the core's caches."""
        return statistics.median(cold_call_ns(call, src, dst) for _ in range(k))

    def segment(
        state: str, call: Any, install: Any, uninstall: Any, calls: int, cold_k: int = 0
    ) -> float:
        """ns per call of ``calls`` back-to-back calls of the same call shape in one state,
        after a tenth as many untimed: ``orig`` (vLLM's own function in place), ``off``
        (the hook installed, the probe disabled) or ``on`` (enabled, in a step); the ring
        drained afterwards. With ``cold_k``, the median of that many single cold calls
        (:func:`cold_calls`) instead."""
        if state == "orig":
            per_call(call, calls // 10 + 1, rounds=1)
            return cold_calls(call, cold_k) if cold_k else per_call(call, calls, rounds=1)
        install()
        if state == "on":
            hooks.enable(writer, gpu_timing=False)
            RT.in_step = 1
        else:
            RT.enabled = False
        per_call(call, calls // 10 + 1, rounds=1)
        ns = cold_calls(call, cold_k) if cold_k else per_call(call, calls, rounds=1)
        if state == "on":
            RT.in_step = 0
            hooks.disable()
        uninstall()
        if hooks.INSTALLER.hooks:  # enable() installs the always-on family
            hooks.uninstall()
        for _ in reader.read():
            pass
        return ns

    def measure(label: str, call: Any, install: Any, uninstall: Any, calls: int) -> None:
        """``rounds`` rounds of three short segments (original, dormant hook, enabled hook),
        the order rotated from round to round, so that drift of the machine and the
        position in a round move all three alike; the medians of the per-round
        differences, with a bootstrap 95% interval. The original is called through the
        same attribute as the hook (``call``), with vLLM's function put back."""
        results[label] = _rounds(rounds, lambda st: segment(st, call, install, uninstall, calls))
        results[label]["calls_per_segment"] = calls
        if cold > 0:
            results[label]["cold"] = _rounds(
                cold_rounds, lambda st: segment(st, call, install, uninstall, calls, cold)
            )
            results[label]["cold"]["calls_per_state"] = cold
            results[label]["cold"]["evict_bytes"] = nbytes

    def install_dispatch() -> None:
        hooks.install(["dispatch"], lazy=False)
        assert vars(CudagraphDispatcher)["dispatch"] is not orig_dispatch

    measure(
        "CudagraphDispatcher.dispatch (FULL hit)",
        lambda: d.dispatch(6, uniform_decode=True),
        install_dispatch,
        hooks.uninstall,
        n,
    )
    none = {CUDAGraphMode.NONE}
    measure(
        "CudagraphDispatcher.dispatch (miss: the eager drafter's)",
        lambda: d.dispatch(64, valid_modes=set(none)),
        install_dispatch,
        hooks.uninstall,
        n,
    )
    inst = Installer()
    t = Target("bench.span", __name__, "", "noop", step.span(Phase.REORDER))
    measure(
        "phase span around a trivial method",
        lambda: obj.noop(1),
        lambda: inst.install_on(t, Plain),
        inst.uninstall,
        n * 20,  # a segment of about the dispatch's length
    )
    assert vars(CudagraphDispatcher)["dispatch"] is orig_dispatch
    assert vars(Plain)["noop"] is orig_noop
    if hooks.INSTALLER.hooks:  # enable() installed the always-on family
        hooks.uninstall()
    reader.close()
    writer.close()
    return results


def _rounds(rounds: int, segment: Callable[[str], float]) -> dict[str, Any]:
    """``rounds`` rounds of the three states' segments (original, dormant hook, enabled
    hook), the order rotated from round to round, so that drift of the machine and the
    position in a round move all three alike: the medians, and the medians of the
    per-round differences with a bootstrap 95% interval."""
    order = ("orig", "off", "on")
    rows = []
    for i in range(rounds):
        got = {}
        for k in range(3):
            state = order[(i + k) % 3]
            got[state] = segment(state)
        rows.append((got["orig"], got["off"], got["on"]))
    med = statistics.median
    off = [r[1] - r[0] for r in rows]
    on = [r[2] - r[0] for r in rows]
    return {
        "original_ns": med(r[0] for r in rows),
        "disabled_ns": med(r[1] for r in rows),
        "enabled_ns": med(r[2] for r in rows),
        "added_disabled_ns": med(off),
        "added_enabled_ns": med(on),
        "added_disabled_ci95": _interval(off),
        "added_enabled_ci95": _interval(on),
        "rounds": rounds,
    }


def _interval(xs: list[float]) -> list[float]:
    """:func:`crossover.ci95` (seed 7, as this benchmark's results were computed); one
    point repeated below three rounds."""
    ci = ci95(xs, seed=7)
    return list(ci) if ci is not None else [statistics.median(xs)] * 2


if __name__ == "__main__":
    main()
