"""Added cost per hooked call, probe enabled and disabled, on a real vLLM function.

    python benchmarks/hook_overhead.py [--n 200000] [--json PATH]

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
import tempfile
from pathlib import Path
from typing import Any

from _timing import per_call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--json")
    a = ap.parse_args()
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
    results: dict[str, Any] = {}
    tmp = Path(tempfile.mkdtemp(prefix="probe-bench-", dir="/dev/shm"))
    writer = RingWriter.create(tmp / "ring-bench.shm", 1 << 22)

    def measure(label: str, call: Any, install: Any, uninstall: Any) -> None:
        base = per_call(call, a.n)
        install()
        RT.enabled = False
        off = per_call(call, a.n)
        hooks.enable(writer, gpu_timing=False)
        RT.in_step = 1
        on = per_call(call, a.n)
        hooks.disable()
        RT.in_step = 0
        uninstall()
        results[label] = {
            "original_ns": base,
            "disabled_ns": off,
            "enabled_ns": on,
            "added_disabled_ns": off - base,
            "added_enabled_ns": on - base,
        }

    measure(
        "CudagraphDispatcher.dispatch (FULL hit)",
        lambda: d.dispatch(6, uniform_decode=True),
        lambda: hooks.install(["dispatch"], lazy=False),
        hooks.uninstall,
    )
    inst = Installer()
    t = Target("bench.span", __name__, "", "noop", step.span(Phase.REORDER))
    measure(
        "phase span around a trivial method",
        lambda: obj.noop(1),
        lambda: inst.install_on(t, Plain),
        inst.uninstall,
    )
    writer.close()
    print(f"{'target':44} {'orig':>8} {'off':>8} {'on':>8} {'+off':>7} {'+on':>7}  (ns/call)")
    for k, v in results.items():
        print(
            f"{k:44} {v['original_ns']:8.0f} {v['disabled_ns']:8.0f} {v['enabled_ns']:8.0f} "
            f"{v['added_disabled_ns']:7.0f} {v['added_enabled_ns']:7.0f}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
