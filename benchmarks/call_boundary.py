"""What a hooked call costs at the call boundary alone, warm and with caches evicted.

    python benchmarks/call_boundary.py [--n 2000] [--cold 400] [--json PATH]

One Python caller calls ``obj.m(x)`` (``m`` returns ``x``), as vLLM's code calls a hooked
method, in four forms:

- ``plain``: vLLM's own method, no hook (the caller's frame pushes the callee's inline);
- ``python bypass``: a Python wrapper that is off (``if not RT.enabled: return orig(...)``,
  what the pure-Python path runs while dormant);
- ``compiled bypass``: the compiled Span while the probe is off (a C object between the
  two frames: vLLM's callee then runs in a new activation of the evaluation loop);
- ``compiled span``: the same Span on, inside a step, staging its record for a real
  shared-memory ring.

``warm``: interleaved rounds of ``--n`` back-to-back calls, the best round of each (ns per
call). ``cold``: each case's single calls after evicting the caches (a 64 MB array summed
and some torch work), interleaved over the cases, ``--cold`` of each: the lower quartile
and the median (ns). The "added" columns are each case minus ``plain``. Where the compiled
bypass's cold figure is close to the span's, a hooked call's cost inside an engine (where
every call runs cold) is mostly the boundary, not the record: fewer wrapped calls, or a
way in that leaves vLLM's frames inline, is what lowers it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _timing import evictor, per_call


def _cases() -> dict[str, Callable[[], Any]]:
    from probe import accel
    from probe.records import Phase
    from probe.runtime import RT

    def m(self: Any, x: int) -> int:
        return x

    def python_wrapper(self: Any, x: int) -> int:
        if not RT.enabled:
            return m(self, x)
        return m(self, x)  # not reached: measured off

    span = accel.span_hook(m, RT, int(Phase.SAMPLE), False)
    if span is None:
        raise SystemExit("probe: error: the compiled extension is not built (setup.py build_ext)")
    kinds = {"plain": m, "python bypass": python_wrapper, "compiled": span}
    out: dict[str, Callable[[], Any]] = {}
    for name, fn in kinds.items():
        cls = type(f"Obj_{name.replace(' ', '_')}", (), {"m": fn})
        obj = cls()

        def caller(obj: Any = obj) -> Any:
            return obj.m(1)

        out[name] = caller
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--cold", type=int, default=400)
    ap.add_argument("--json")
    a = ap.parse_args()
    from probe.ring import RingWriter
    from probe.runtime import RT

    cases = _cases()
    tmp = Path(tempfile.mkdtemp(prefix="probe-bench-", dir="/dev/shm"))
    writer = RingWriter.create(tmp / "ring", 1 << 22)
    RT.reset()
    RT.attach(writer)

    def state(on: bool) -> None:
        RT.enabled = on
        RT.in_step = 1 if on else 0  # leaving the step flushes its buffer to the ring

    # (label, case, probe on)
    runs = [
        ("plain", "plain", False),
        ("python bypass", "python bypass", False),
        ("compiled bypass", "compiled", False),
        ("compiled span", "compiled", True),
    ]
    warm: dict[str, list[float]] = {r[0]: [] for r in runs}
    for _ in range(15):
        for label, case, on in runs:
            state(on)
            warm[label].append(per_call(cases[case], a.n, 1))
            state(False)
    evict = evictor()
    clk, boot = time.clock_gettime_ns, time.CLOCK_BOOTTIME
    cold: dict[str, list[int]] = {r[0]: [] for r in runs}
    for i in range(a.cold):
        for label, case, on in runs[i % len(runs) :] + runs[: i % len(runs)]:
            fn = cases[case]
            evict()
            state(on)
            t0 = clk(boot)
            fn()
            t1 = clk(boot)
            state(False)
            cold[label].append(t1 - t0)
    RT.detach()
    writer.close()
    res: dict[str, dict[str, float]] = {}
    for label in warm:
        q = statistics.quantiles(cold[label], n=4)
        res[label] = {"warm_ns": min(warm[label]), "cold_q1_ns": q[0], "cold_median_ns": q[1]}
    base = res["plain"]
    print(f"{'call':18} {'warm':>7} {'cold q1':>8} {'cold med':>9} {'added warm':>11} "
          f"{'added q1':>9} {'added med':>10}  (ns per call)")  # fmt: skip
    for label, v in res.items():
        v["added_warm_ns"] = v["warm_ns"] - base["warm_ns"]
        v["added_cold_q1_ns"] = v["cold_q1_ns"] - base["cold_q1_ns"]
        v["added_cold_median_ns"] = v["cold_median_ns"] - base["cold_median_ns"]
        print(f"{label:18} {v['warm_ns']:7.0f} {v['cold_q1_ns']:8.0f} {v['cold_median_ns']:9.0f} "
              f"{v['added_warm_ns']:11.0f} {v['added_cold_q1_ns']:9.0f} "
              f"{v['added_cold_median_ns']:10.0f}")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
