"""What a hooked call costs at the call boundary alone, warm and with caches evicted.

    python benchmarks/call_boundary.py [--n 2000] [--cold 400] [--json PATH]

One Python caller calls ``obj.m(x)`` (``m`` returns ``x``), as vLLM's code calls a hooked
method, in these forms:

- ``plain``: vLLM's own method, no hook (the caller's frame pushes the callee's inline);
- ``python bypass``: a Python wrapper that is off (``if not RT.enabled: return orig(...)``,
  what the pure-Python path runs while dormant);
- ``compiled bypass``: the compiled Span while the probe is off (a C object between the
  two frames: vLLM's callee then runs in a new activation of the evaluation loop);
- ``compiled span``: the same Span on, inside a step, staging its record for a real
  shared-memory ring;
- Python 3.12+ only, the way in that leaves the frames as they are: ``sys.monitoring``
  local ``PY_START`` and ``PY_RETURN`` events on the method's code object alone, with C
  callbacks that do nearly nothing (``slice``, which takes the events' two and three
  arguments: the mechanism's own cost) and with Python callbacks that read
  ``CLOCK_BOOTTIME`` and keep it (what a probe without new C would do). With the events
  off the bytecode is vLLM's own again (``plain``).

``warm``: interleaved rounds of ``--n`` back-to-back calls, the best round of each (ns per
call). ``cold``: each case's single calls after evicting the caches (a 64 MB array summed
and some torch work), interleaved over the cases, ``--cold`` of each: the lower quartile
and the median (ns). The "added" columns are each case minus ``plain``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from _timing import evictor, per_call

Case = tuple[str, Callable[[], Any], Callable[[], None], Callable[[], None]]


def _method() -> Callable[..., Any]:
    """A fresh ``m(self, x) -> x`` with a code object of its own (local events are per
    code object)."""

    def m(self: Any, x: int) -> int:
        return x

    return types.FunctionType(m.__code__.replace(), m.__globals__, "m")


def _caller(fn: Callable[..., Any], name: str) -> Callable[[], Any]:
    obj = type(f"Obj_{name.replace(' ', '_')}", (), {"m": fn})()

    def caller() -> Any:
        return obj.m(1)

    return caller


def _nothing() -> None:
    return None


def _monitoring_cases() -> list[Case]:
    """The ``sys.monitoring`` cases (Python 3.12+), or none."""
    mon = getattr(sys, "monitoring", None)
    if mon is None:
        return []
    tool = mon.PROFILER_ID
    mon.use_tool_id(tool, "probe call_boundary")
    ev = mon.events
    clk, boot = time.clock_gettime_ns, time.CLOCK_BOOTTIME
    stamps = [0, 0]

    def start(code: Any, offset: int) -> None:
        stamps[0] = clk(boot)

    def ret(code: Any, offset: int, value: Any) -> None:
        stamps[1] = clk(boot)

    out: list[Case] = []
    for label, on_start, on_ret in (
        ("monitoring, C callbacks", slice, slice),
        ("monitoring, Python clock", start, ret),
    ):
        fn = _method()
        code = fn.__code__

        def on(code: Any = code, a: Any = on_start, b: Any = on_ret) -> None:
            mon.register_callback(tool, ev.PY_START, a)
            mon.register_callback(tool, ev.PY_RETURN, b)
            mon.set_local_events(tool, code, ev.PY_START | ev.PY_RETURN)

        def off(code: Any = code) -> None:
            mon.set_local_events(tool, code, 0)

        out.append((label, _caller(fn, label), on, off))
    return out


def _cases() -> list[Case]:
    """(label, the caller's call, set up before each timing, undo after), untimed set-ups."""
    from probe.engine import accel
    from probe.engine.runtime import RT
    from probe.records import Phase

    m = _method()

    def python_wrapper(self: Any, x: int) -> int:
        if not RT.enabled:
            return m(self, x)
        return m(self, x)  # not reached: measured off

    span = accel.span_hook(m, RT, int(Phase.SAMPLE), False)
    if span is None:
        raise SystemExit("probe: error: the compiled extension is not built (setup.py build_ext)")

    def enable() -> None:
        RT.enabled, RT.in_step = True, 1

    def disable() -> None:
        RT.enabled, RT.in_step = False, 0  # leaving the step flushes its buffer to the ring

    compiled = _caller(span, "compiled")
    inframe = _caller(_inframe_method(RT, int(Phase.SAMPLE)), "in-frame")
    return [
        ("plain", _caller(m, "plain"), _nothing, _nothing),
        ("python bypass", _caller(python_wrapper, "python bypass"), _nothing, _nothing),
        ("compiled bypass", compiled, _nothing, _nothing),
        ("compiled span", compiled, enable, disable),
        *_tsc_case(compiled, enable, disable),
        ("in-frame, off", inframe, _nothing, _nothing),
        ("in-frame, on", inframe, enable, disable),
        *_monitoring_cases(),
    ]


def _tsc_case(
    compiled: Callable[[], Any], enable: Callable[[], None], disable: Callable[[], None]
) -> list[Case]:
    """The compiled span again with the hooks' clock on the time stamp counter (carried to
    BOOTTIME, ``probe.engine.accel._accel.set_clock``), where the extension has that clock."""
    from probe.engine.accel import _accel
    from probe.engine.runtime import RT

    if not hasattr(_accel, "set_clock") or _accel.set_clock("tsc") != "tsc":
        return []
    _accel.set_clock("boottime")

    def on() -> None:  # as an attach with PROBE_CLOCK=tsc sets it
        _accel.set_clock("tsc")
        RT.clock_tsc = 1
        enable()

    def off() -> None:
        disable()
        RT.clock_tsc = 0
        _accel.set_clock("boottime")

    return [("compiled span, tsc clock", compiled, on, off)]


def _inframe_method(core: Any, phase: int) -> Callable[..., Any]:
    """``m`` as it would run with the probe in its own bytecode instead of a C object
    around it (an instrumented copy of the code object): the caller's frame still pushes
    the callee's inline; the callee reads the switch, takes the two stamps with builtin
    calls and stages its span record through the compiled packer. Its names are the
    closure's cells, as an instrumented code object would hold them as constants."""
    clk, boot = time.clock_gettime_ns, time.CLOCK_BOOTTIME
    put = core.put.span  # bound at attach: build this after RT.attach

    def m(self: Any, x: int) -> int:
        on = core.enabled
        if on:
            t0 = clk(boot)
        r = x  # vLLM's body
        if on:
            put(core.step, phase, t0, clk(boot), 0, 0, 0, 0)
        return r

    return m


def _calibration_evictor(code: bool) -> Callable[[], None]:
    """The eviction of ``probe.engine.calibrate``'s cold timings: four times the L2 copied, and
    with ``code`` its source compiled (the figures the report's cost range is made of)."""
    from probe.engine import calibrate

    n = calibrate.evict_bytes()
    src, dst = bytearray(n), bytearray(n)

    def evict() -> None:
        dst[:] = src
        if code:
            compile(calibrate._EVICT_CODE, "<probe-evict>", "exec")

    return evict


def _cold_timer() -> tuple[Callable[[], int], float]:
    """The timer of the cold calls and its ns per tick: the raw time stamp counter where
    the extension has it (it touches no memory; ``clock_gettime`` would bring the vDSO's
    pages into the caches right before the call it times, hiding what a cold clock read
    costs the hooks), else ``CLOCK_BOOTTIME``."""
    from probe.engine import calibrate

    ticks, name = calibrate.cold_timer()
    if name != "tsc":
        return partial(time.clock_gettime_ns, time.CLOCK_BOOTTIME), 1.0
    k0, t0 = time.clock_gettime_ns(time.CLOCK_BOOTTIME), ticks()
    time.sleep(0.2)
    k1, t1 = time.clock_gettime_ns(time.CLOCK_BOOTTIME), ticks()
    return ticks, (k1 - k0) / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--cold", type=int, default=400)
    ap.add_argument(
        "--evict",
        choices=("engine", "data", "code"),
        default="engine",
        help="between cold calls: 64 MB touched and torch work (engine); the attach "
        "calibration's own eviction, 4x L2 copied (data) and CPython's compiler run too (code)",
    )
    ap.add_argument("--json")
    a = ap.parse_args()
    from probe.engine.ring_writer import RingWriter
    from probe.engine.runtime import RT

    tmp = Path(tempfile.mkdtemp(prefix="probe-bench-", dir="/dev/shm"))
    writer = RingWriter.create(tmp / "ring", 1 << 22)
    RT.reset()
    RT.attach(writer)
    cases = _cases()
    warm: dict[str, list[float]] = {c[0]: [] for c in cases}
    for _ in range(15):
        for label, fn, on, off in cases:
            on()
            warm[label].append(per_call(fn, a.n, 1))
            off()
    evict = evictor() if a.evict == "engine" else _calibration_evictor(a.evict == "code")
    tick, ns_per_tick = _cold_timer()
    cold: dict[str, list[int]] = {c[0]: [] for c in cases}
    for i in range(a.cold):
        k = i % len(cases)
        for label, fn, on, off in cases[k:] + cases[:k]:
            on()
            evict()
            t0 = tick()
            fn()
            t1 = tick()
            off()
            cold[label].append(round((t1 - t0) * ns_per_tick))
    RT.detach()
    writer.close()
    res: dict[str, dict[str, float]] = {}
    for label in warm:
        q = statistics.quantiles(cold[label], n=4)
        res[label] = {"warm_ns": min(warm[label]), "cold_q1_ns": q[0], "cold_median_ns": q[1]}
    base = res["plain"]
    print(f"Python {sys.version.split()[0]}; ns per call")
    print(f"{'call':26} {'warm':>6} {'cold q1':>8} {'cold med':>9} {'+warm':>6} "
          f"{'+cold q1':>9} {'+cold med':>10}")  # fmt: skip
    for label, v in res.items():
        v["added_warm_ns"] = v["warm_ns"] - base["warm_ns"]
        v["added_cold_q1_ns"] = v["cold_q1_ns"] - base["cold_q1_ns"]
        v["added_cold_median_ns"] = v["cold_median_ns"] - base["cold_median_ns"]
        print(f"{label:26} {v['warm_ns']:6.0f} {v['cold_q1_ns']:8.0f} {v['cold_median_ns']:9.0f} "
              f"{v['added_warm_ns']:6.0f} {v['added_cold_q1_ns']:9.0f} "
              f"{v['added_cold_median_ns']:10.0f}")  # fmt: skip
    if a.json:
        Path(a.json).write_text(
            json.dumps({"python": sys.version.split()[0], "evict": a.evict, "cases": res}, indent=1)
            + "\n"
        )


if __name__ == "__main__":
    main()
