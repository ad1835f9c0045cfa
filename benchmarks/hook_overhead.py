"""Added cost per hooked call, probe enabled and disabled, on a real vLLM function.

    python benchmarks/hook_overhead.py [--n 20000] [--json PATH]

Runs every case on both hot paths (probe.accel): ``compiled`` (the C extension) and
``python`` (the pure-Python wrappers, packers and ring writer, with the extension's hot
state object), and once more in a child process with ``PROBE_ACCEL=0`` (the install with no
extension at all: ``python-noext``). One table.

The target is the real ``CudagraphDispatcher.dispatch`` of the installed vLLM (a FULL
hit, the steady-state case) and a phase span on the real ``GPUModelRunner._may_reorder_
batch`` path's cheapest kind of wrapper (a span around a plain function). For each:
the original, the installed hook with the probe disabled (bypass), and enabled (one
record into a real shared-memory ring drained by nobody, so it never fills: capacity is
reset between rounds). Reported: median ns per call over rounds, and the added cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _timing import per_call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    from probe import accel

    paths = [accel.NAME] if a.child else (["compiled", "python"] if accel.COMPILED else ["python"])
    results: dict[str, Any] = {}
    for path in paths:
        with accel.use(path):
            for k, v in run_cases(a.n).items():
                results[f"{k} [{path}]"] = v
    if a.child:
        print(json.dumps(results))
        return
    env = dict(os.environ, PROBE_ACCEL="0")
    out = subprocess.run(
        [sys.executable, __file__, "--n", str(a.n), "--child"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for k, v in json.loads(out.strip().splitlines()[-1]).items():
        results[k.replace("[python]", "[python-noext]")] = v
    print(f"{'target':60} {'orig':>6} {'off':>6} {'on':>6} {'+off':>6} {'+on':>6}  (ns/call)")
    for k, v in results.items():
        print(
            f"{k:60} {v['original_ns']:6.0f} {v['disabled_ns']:6.0f} {v['enabled_ns']:6.0f} "
            f"{v['added_disabled_ns']:6.0f} {v['added_enabled_ns']:6.0f}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


def run_cases(n: int, rounds: int = 21) -> dict[str, Any]:
    from vllm.config import CompilationMode, CUDAGraphMode, VllmConfig
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    from probe import hooks
    from probe.hooks import step
    from probe.hooks._base import Installer, Target
    from probe.records import Phase
    from probe.ring import RingWriter
    from probe.runtime import RT

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

    def measure(label: str, call: Any, orig_call: Any, install: Any, uninstall: Any) -> None:
        """Interleaved rounds (original, dormant hook, enabled hook) so that drift of the
        machine moves all three alike; the medians of the per-round differences."""
        install()
        rows = []
        for _ in range(rounds):
            base = per_call(orig_call, n, rounds=1)
            RT.enabled = False
            off = per_call(call, n, rounds=1)
            hooks.enable(writer, gpu_timing=False)
            RT.in_step = 1
            on = per_call(call, n, rounds=1)
            hooks.disable()
            RT.in_step = 0
            rows.append((base, off, on))
        uninstall()
        med = statistics.median
        results[label] = {
            "original_ns": med(r[0] for r in rows),
            "disabled_ns": med(r[1] for r in rows),
            "enabled_ns": med(r[2] for r in rows),
            "added_disabled_ns": med(r[1] - r[0] for r in rows),
            "added_enabled_ns": med(r[2] - r[0] for r in rows),
            "rounds": rounds,
            "calls_per_round": n,
        }

    measure(
        "CudagraphDispatcher.dispatch (FULL hit)",
        lambda: d.dispatch(6, uniform_decode=True),
        lambda: orig_dispatch(d, 6, uniform_decode=True),
        lambda: hooks.install(["dispatch"], lazy=False),
        hooks.uninstall,
    )
    inst = Installer()
    t = Target("bench.span", __name__, "", "noop", step.span(Phase.REORDER))
    measure(
        "phase span around a trivial method",
        lambda: obj.noop(1),
        lambda: orig_noop(obj, 1),
        lambda: inst.install_on(t, Plain),
        inst.uninstall,
    )
    if hooks.INSTALLER.hooks:  # enable() installed the always-on family
        hooks.uninstall()
    writer.close()
    return results


if __name__ == "__main__":
    main()
