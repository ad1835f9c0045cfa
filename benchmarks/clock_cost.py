"""Cost of the clocks a hook can read, on this machine (ns per call, median of rounds).

    python benchmarks/clock_cost.py [--n 200000] [--json OUT]

Every probe record carries two timestamps; what a timestamp costs depends on the kernel's
clock source: with a vDSO clock (tsc, kvm-clock) ``clock_gettime`` stays in user space
(tens of ns); without one each read is a system call (hundreds of ns to microseconds), which
virtual machines can show. Prints the clock source beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path
from typing import Any

from _timing import per_call

CLOCKS: dict[str, Any] = {
    "clock_gettime_ns(CLOCK_BOOTTIME)": partial(time.clock_gettime_ns, time.CLOCK_BOOTTIME),
    "clock_gettime_ns(CLOCK_MONOTONIC)": partial(time.clock_gettime_ns, time.CLOCK_MONOTONIC),
    "perf_counter_ns()": time.perf_counter_ns,
    "monotonic_ns()": time.monotonic_ns,
    "time_ns()": time.time_ns,
}


def clocksource() -> dict[str, str]:
    base = Path("/sys/devices/system/clocksource/clocksource0")
    out = {}
    for name in ("current_clocksource", "available_clocksource"):
        try:
            out[name] = (base / name).read_text().strip()
        except OSError as exc:
            out[name] = f"unreadable ({exc.strerror})"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    empty = per_call(int, a.n, rounds=7)  # a C call that does nothing useful
    res: dict[str, Any] = {"clocksource": clocksource(), "empty_call_ns": empty, "clocks": {}}
    for name, fn in CLOCKS.items():
        res["clocks"][name] = per_call(fn, a.n, rounds=7) - empty
    print(
        f"clock source: {res['clocksource']['current_clocksource']} "
        f"(available: {res['clocksource']['available_clocksource']})"
    )
    for name, ns in res["clocks"].items():
        print(f"{name:36s} {ns:8.0f} ns")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
