"""The probe's own cost per hooked call, measured inside the engine process at attach.

The first enable of a process runs a few hundred calls of each wrapper kind around a no-op,
on the hot path that will run (compiled or pure Python, :mod:`probe.accel`), into a scratch
ring of its own, and keeps the per-call cost it added (best of several rounds, so a
preempted round does not count). Later enables of the same process on the same hot path
reuse that figure (:func:`once`, marked ``"reused": true``): the calibration is about 5 ms
of the engine's GIL, which every re-attach would otherwise pay again. The result goes into
the static snapshot (``snapshot["probe"]["calibration"]``) and so into the recording, where
``probe report`` turns it into "probe cost ≥ X µs per step (Y% of CPU launch overhead)"
from the hooked calls each step made.

Kinds:

- ``span_ns``: a plain phase span (prepare_inputs, metadata_build, sample, logits, draft,
  sync): bypass check, two CLOCK_BOOTTIME reads, one SPAN record staged;
- ``hook_ns``: a hook with a body on its common path (the V1 dispatch hook on a FULL hit,
  around a stand-in dispatcher; in C on the compiled path): the hooks for dispatch,
  builds, reorder, replays, forward and the step bracket;
- ``dormant_ns``: any hook while the probe is off.

These are fixed per-call costs around a no-op: the first call of the day inside a real step
(cold caches) costs more, which ``benchmarks/gpu`` measures end to end on the GPU.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CALLS = 300
ROUNDS = 7


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


def once(rt: Any) -> dict[str, Any]:
    """:func:`calibrate` the first time for the active hot path in this process, then a copy
    of that result marked ``"reused": true`` (a failed calibration is tried again).

    A calibration taken before vLLM was imported is not reused once it is: the dispatch
    hook compares vLLM's own FULL member, so without vLLM it times the Python record (about
    ten times the compiled one), which is what an engine that enables the probe before
    importing vLLM (``PROBE_ENABLE=1`` and ``probe.plugin.register()`` first) gets first."""
    from probe import accel
    from probe.hooks import dispatch

    key = (accel.active(), dispatch._mode_members()[0] is not None)
    taken = _TAKEN.get(key)
    if taken is not None:
        return {**taken, "reused": True}
    cal = calibrate(rt)
    _TAKEN[key] = cal
    return dict(cal)


def calibrate(rt: Any, calls: int = CALLS, rounds: int = ROUNDS) -> dict[str, Any]:
    """Measure each wrapper kind on the active hot path; ``rt`` must be detached and is
    left detached as it was (its step counter untouched)."""
    from probe import accel
    from probe.hooks import dispatch, step
    from probe.hooks._base import as_installed
    from probe.records import Phase
    from probe.ring import RingWriter

    def noop(self: Any) -> None:
        return None

    class Owner:
        pass

    owner = Owner()
    tmp = Path(tempfile.mkdtemp(prefix="probe-calibration-"))
    os.chmod(tmp, 0o700)
    saved = (rt.step, rt.in_step, rt.enabled)
    try:
        writer = RingWriter.create(tmp / "ring", 1 << 14)
        span = step.span(Phase.REORDER)(noop, _hook())
        d = _Dispatcher(dispatch._mode_members()[0])
        orig_dispatch = _Dispatcher.dispatch
        hook_impl = dispatch.v1_dispatch(orig_dispatch, _hook())
        # as the installer puts them in place (a compiled wrapper is not gated again)
        hooked = as_installed(orig_dispatch, hook_impl, "on", rt)
        gated_noop = as_installed(noop, step.span(Phase.REORDER)(noop, _hook()), "on", rt)
        bare_noop = _best_ns(lambda: noop(owner), calls, rounds)
        bare_dispatch = _best_ns(lambda: orig_dispatch(d, 8, True), calls, rounds)
        rt.enabled = False
        dormant = _best_ns(lambda: gated_noop(owner), calls, rounds) - bare_noop
        rt.attach(writer)
        rt.enabled = True
        rt.in_step = 1  # records staged as inside a step, flushed when it ends
        span_ns = _best_ns(lambda: span(owner), calls, rounds) - bare_noop
        hook_ns = _best_ns(lambda: hooked(d, 8, True), calls, rounds) - bare_dispatch
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
        }
    finally:
        rt.step, rt.in_step, rt.enabled = saved
        shutil.rmtree(tmp, ignore_errors=True)


def _hook() -> Any:
    from probe.hooks._base import Hook, Target

    return Hook(Target("calibration", "", "", "noop", lambda o, h: o), None, None)


def cost_per_step_ns(cal: dict[str, Any], spans: float, hooks: float) -> float:
    """The probe's cost for one step that made ``spans`` plain span calls and ``hooks``
    Python-bodied hook calls, by the calibration."""
    return float(cal.get("span_ns", 0.0)) * spans + float(cal.get("hook_ns", 0.0)) * hooks
