"""The probe's own cost per hooked call, measured inside the engine process at attach.

The first enable of a process runs a few hundred calls of each wrapper kind around a no-op,
on the hot path that will run (compiled or pure Python, :mod:`probe.engine.accel`), on a runtime
and a scratch ring of their own, and keeps the per-call cost it added (best of several
rounds, so a preempted round does not count). Later enables of the same process on the
same hot path reuse that figure (:func:`once`, marked ``"reused": true``): the calibration
is about 5 ms of the engine's GIL, which every re-attach would otherwise pay again. The
result goes into the static snapshot (``snapshot["probe"]["calibration"]``) and so into the
recording, where ``probe report`` turns it into "probe cost X-Y µs per step (A-B% of CPU
launch overhead)" from the hooked calls each step made (:func:`probe.analysis.cost.cost_line`).

Kinds:

- ``span_ns``: a plain phase span (prepare_inputs, metadata_build, sample, logits, draft,
  sync): bypass check, two CLOCK_BOOTTIME reads, one SPAN record staged;
- ``hook_ns``: a hook with a body on its common path (the V1 dispatch hook on a FULL hit,
  around a stand-in dispatcher; in C on the compiled path): the hooks for dispatch,
  builds, reorder, replays, forward and the step bracket;
- ``dormant_ns``: any hook while the probe is off.

These are per-call costs around a no-op in a hot loop. Inside vLLM's step every hooked call
runs cold (vLLM's own work between two of them evicts the wrapper, its type, the runtime and
the step buffer from the core's caches), and costs several times that. So the span and the
hook are also timed cold (``span_cold_ns``, ``hook_cold_ns``): :data:`COLD_CALLS` single
calls of each, each after copying a buffer of four times the core's L2 cache
(:func:`evict_bytes`, 4-16 MB), interleaved with the bare no-op, the medians' difference,
timed by the raw time stamp counter where there is one (``cold_timer``: :func:`cold_timer`);
at most :data:`COLD_BUDGET_S` of the engine's time (the calls it got by then, at least a
few, are kept). On the H200 host a cold compiled span costs 1.1-1.9 µs against 0.15 µs
warm (``benchmarks/call_boundary.py``); ``benchmarks/gpu`` measures the whole in-engine
cost end to end, and there these data-only cold figures read 1.9-5.2x low (a floor). So
the span and the hook are timed once more with code evicted too (CPython's compiler run
before each call: ``span_cold_code_ns``, ``hook_cold_code_ns``, at most
:data:`COLD_CODE_BUDGET_S`), which read high on the CPU engine; both are recorded until a
GPU run says which tracks an engine.
"""

from __future__ import annotations

import importlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CALLS = 300
ROUNDS = 7
COLD_CALLS = 24
COLD_BUDGET_S = 0.12
COLD_CODE_BUDGET_S = 0.1
_EVICT_CODE = "".join(
    f"def f{i}(a, b={i}, *c, **d):\n"
    f"    x = [a * b for _ in range({i})]\n"
    f"    return {{'k{i}': x, 'y': (a, b, c, d)}} if a else None\n"
    for i in range(30)
)
"""Source that :func:`_cold_ns` compiles before each call with ``code=True``: CPython's
parser and compiler, a large body of code run between two timed calls, as vLLM's own work
runs between two hooked calls (a data copy alone leaves the wrapper's code in L1i and the
branch predictors trained)."""
_L2_FALLBACK = 2 << 20


def evict_bytes(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """How much memory the cold timings touch between two calls: four times cpu0's L2
    cache (its ``index*/level`` 2, from sysfs; 2 MB where sysfs does not say), within
    4-16 MB. Enough to push the wrapper's lines out of the core's private caches as
    vLLM's work between two hooked calls does; a shared last-level cache (hundreds of MB
    under some hypervisors) is not the measure."""
    l2 = 0
    try:
        for idx in sysfs.glob("index*"):
            if (idx / "level").read_text().strip() == "2":
                l2 = max(l2, _size_bytes((idx / "size").read_text()))
    except (OSError, ValueError):
        l2 = 0
    return min(max(4 * (l2 or _L2_FALLBACK), 4 << 20), 16 << 20)


def _size_bytes(text: str) -> int:
    """sysfs's cache size ("2048K", "32M") in bytes."""
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(t.rstrip("KMG")) * mult


def cold_timer() -> tuple[Callable[[], int], str]:
    """The timer of the cold calls and its name: the raw time stamp counter where the
    compiled extension reads one (``"tsc"``; it touches no memory), else ``perf_counter``.
    ``clock_gettime`` as the timer would bring the vDSO's code and data into the caches
    right before the call it times, hiding what a cold clock read costs the hooks on the
    ``boottime`` clock (``benchmarks/call_boundary.py`` measured 1.0-1.5 µs of it cold on
    this project's 2-core machine)."""
    try:
        ticks = getattr(importlib.import_module("probe.engine.accel._accel"), "ticks", None)
    except ImportError:
        ticks = None
    if ticks is not None and ticks() != 0:
        return ticks, "tsc"
    return time.perf_counter_ns, "perf_counter"


def cold_call_ns(
    fn: Callable[[], Any],
    src: bytearray,
    dst: bytearray,
    code: bool = False,
    timer: Callable[[], int] = time.perf_counter_ns,
) -> int:
    """Ticks of ``timer`` (ns by default) of one call of ``fn`` after evicting the core's
    caches: ``src`` copied over ``dst`` (:func:`evict_bytes` each) and, with ``code``,
    :data:`_EVICT_CODE` compiled."""
    dst[:] = src
    if code:
        compile(_EVICT_CODE, "<probe-evict>", "exec")
    t0 = timer()
    fn()
    return timer() - t0


def _cold_ns(
    pairs: list[tuple[Callable[[], Any], Callable[[], Any]]],
    nbytes: int,
    calls: int,
    budget_s: float,
    code: bool = False,
) -> tuple[list[float], int]:
    """For each (bare, wrapped) pair, the median ns of single wrapped calls minus the
    median of single bare calls, each call after touching ``nbytes`` of memory (and, with
    ``code``, compiling :data:`_EVICT_CODE`); the pairs' calls interleaved, until ``calls``
    of each or ``budget_s`` (at least 5 of each)."""
    src, dst = bytearray(nbytes), bytearray(nbytes)
    times: list[tuple[list[int], list[int]]] = [([], []) for _ in pairs]
    timer, _name = cold_timer()
    k0, c0 = time.perf_counter_ns(), timer()
    deadline = time.monotonic() + budget_s
    done = 0
    while done < calls and (done < 5 or time.monotonic() < deadline):
        for (bare, wrapped), (tb, tw) in zip(pairs, times, strict=True):
            for fn, ts in ((bare, tb), (wrapped, tw)):
                ts.append(cold_call_ns(fn, src, dst, code, timer))
        done += 1
    k1, c1 = time.perf_counter_ns(), timer()
    scale = (k1 - k0) / (c1 - c0) if c1 > c0 else 1.0  # ns per tick over the whole loop
    out = [float(statistics.median(tw) - statistics.median(tb)) * scale for tb, tw in times]
    return out, done


def _best_ns(fn: Callable[[], Any], calls: int, rounds: int) -> float:
    clock = time.perf_counter_ns
    best = float("inf")
    for _ in range(rounds):
        t0 = clock()
        for _ in range(calls):
            fn()
        best = min(best, (clock() - t0) / calls)
    return best


class _Mode:
    value = 2  # FULL


class _Desc:
    num_tokens = 8
    num_reqs = 4


class _Dispatcher:
    """Stands in for ``CudagraphDispatcher``: a FULL hit, with no work of its own."""

    uniform_decode_query_len = 2
    keys_initialized = True

    def __init__(self, full: Any) -> None:
        self.result = (full if full is not None else _Mode(), _Desc())

    def dispatch(self, num_tokens: int, uniform_decode: bool = False) -> Any:
        return self.result


_TAKEN: dict[tuple[str, bool], dict[str, Any]] = {}


def once() -> dict[str, Any]:
    """:func:`calibrate` the first time for the active hot path in this process, then a copy
    of that result marked ``"reused": true`` (a failed calibration is tried again).

    A calibration taken before vLLM was imported is not reused once it is: the dispatch
    hook compares vLLM's own FULL member, so without vLLM it times the Python record (about
    ten times the compiled one), which is what an engine that enables the probe before
    importing vLLM (``PROBE_ENABLE=1`` and ``probe.engine.plugin.register()`` first) gets first."""
    from probe.engine import accel
    from probe.engine.hooks import dispatch

    key = (accel.active(), dispatch._mode_members()[0] is not None)
    taken = _TAKEN.get(key)
    if taken is not None:
        return {**taken, "reused": True}
    cal = calibrate()
    _TAKEN[key] = cal
    return dict(cal)


def calibrate(
    calls: int = CALLS,
    rounds: int = ROUNDS,
    cold_calls: int = COLD_CALLS,
    cold_budget_s: float = COLD_BUDGET_S,
    cold_code_budget_s: float = COLD_CODE_BUDGET_S,
) -> dict[str, Any]:
    """Measure each wrapper kind on the active hot path, warm and (span and hook) cold.

    The wrappers run on a runtime of their own (:class:`probe.engine.runtime.Runtime`), never the
    process's ``RT``: an attach calibrates on the control thread while the engine's main
    thread runs steps through the hooks just installed, and switching ``RT`` on here would
    record those steps into the scratch ring and, for a step that returned after ``RT`` was
    put back, leave its ``in_step`` at -1 (every later record of the process then outside a
    step).

    ``cold_calls=0`` leaves the cold timings out; ``cold_code_budget_s=0`` the cold
    timings with code evicted too (``span_cold_code_ns``, ``hook_cold_code_ns``: on the
    CPU engine 2.5-4x what the crossover measures, where the data-only figures read
    it; on the H200 the data-only figures read 1.9-5.2x low; which tracks an engine is
    for a GPU run to tell, so both are recorded)."""
    from probe.engine import accel
    from probe.engine.hooks import dispatch, step
    from probe.engine.hooks._base import as_installed
    from probe.engine.ring_writer import RingWriter
    from probe.engine.runtime import Runtime
    from probe.records import Phase

    def noop(self: Any) -> None:
        return None

    class Owner:
        pass

    owner = Owner()
    rt = Runtime()
    tmp = Path(tempfile.mkdtemp(prefix="probe-calibration-"))
    os.chmod(tmp, 0o700)
    try:
        writer = RingWriter.create(tmp / "ring", 1 << 14)
        span = step.span(Phase.REORDER, rt=rt)(noop, _hook())
        d = _Dispatcher(dispatch._mode_members()[0])
        orig_dispatch = _Dispatcher.dispatch
        hook_impl = dispatch.v1_dispatch(orig_dispatch, _hook(), rt)
        # as the installer puts them in place (a compiled wrapper is not gated again)
        hooked = as_installed(orig_dispatch, hook_impl, "on", rt)
        gated_noop = as_installed(noop, step.span(Phase.REORDER, rt=rt)(noop, _hook()), "on", rt)
        bare_noop = _best_ns(lambda: noop(owner), calls, rounds)
        bare_dispatch = _best_ns(lambda: orig_dispatch(d, 8, True), calls, rounds)
        rt.enabled = False
        dormant = _best_ns(lambda: gated_noop(owner), calls, rounds) - bare_noop
        rt.attach(writer)
        rt.enabled = True
        rt.in_step = 1  # records staged as inside a step, flushed when it ends
        span_ns = _best_ns(lambda: span(owner), calls, rounds) - bare_noop
        hook_ns = _best_ns(lambda: hooked(d, 8, True), calls, rounds) - bare_dispatch
        cold: dict[str, Any] = {}
        if cold_calls > 0:
            nbytes = evict_bytes()
            pairs = [
                (lambda: noop(owner), lambda: span(owner)),
                (lambda: orig_dispatch(d, 8, True), lambda: hooked(d, 8, True)),
            ]
            (span_cold, hook_cold), got = _cold_ns(pairs, nbytes, cold_calls, cold_budget_s)
            cold = {
                "cold_timer": cold_timer()[1],
                "span_cold_ns": round(max(span_cold, 0.0), 1),
                "hook_cold_ns": round(max(hook_cold, 0.0), 1),
                "cold_calls": got,
                "cold_evict_bytes": nbytes,
            }
            if cold_code_budget_s > 0:
                (span_code, hook_code), got = _cold_ns(
                    pairs, nbytes, cold_calls, cold_code_budget_s, code=True
                )
                cold |= {
                    "span_cold_code_ns": round(max(span_code, 0.0), 1),
                    "hook_cold_code_ns": round(max(hook_code, 0.0), 1),
                    "cold_code_calls": got,
                }
        rt.in_step = 0
        rt.detach()
        writer.close()
        return {
            "hot_path": accel.active(),
            "calls": calls,
            "rounds": rounds,
            "span_ns": round(max(span_ns, 0.0), 1),
            "hook_ns": round(max(hook_ns, 0.0), 1),
            "dormant_ns": round(max(dormant, 0.0), 1),
            **cold,
        }
    finally:
        rt.detach()
        shutil.rmtree(tmp, ignore_errors=True)


def _hook() -> Any:
    from probe.engine.hooks._base import Hook, Target

    return Hook(Target("calibration", "", "", "noop", lambda o, h: o), None, None)
