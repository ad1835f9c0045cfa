"""Replay confirmation: the graph really replayed (or was captured, or passed through).

Supports vLLM 0.26 to 0.34.

- ``CUDAGraphWrapper.__call__`` (V1 FULL around the model; one PIECEWISE wrapper per
  torch.compile piece in either runner). A call whose forward-context mode matches the
  wrapper's and whose entry holds a graph is a replay; an entry without a graph is a
  capture, which outside a capture window is an anomaly the report shows loudly.
  Pass-throughs (mode mismatch) are not recorded: they are the common case for the outer
  FULL wrapper on PIECEWISE steps and say nothing new. V1's FULL wrapper around the whole
  model is also the target's forward launch (its FORWARD record, its own replay or the
  pieces of a pass-through counted in it) when called in a step with no forward open:
  ``_model_forward`` is then left unhooked (:func:`probe.engine.hooks.step.late_targets`), so a
  V1 forward is one hooked call, as MRV2's is.
- ``BreakableCUDAGraphWrapper.__call__`` (0.33's default for DeepSeek-V3.2; opt-in in 0.26).
- ``CudaGraphManager.run_fullgraph`` (MRV2 FULL: bypasses the wrappers entirely) and
  ``run_pw_graph``; the target's ``run_fullgraph`` (``ModelCudaGraphManager``'s, through
  ``super()``) is also the MRV2 FULL forward launch span.

Inside a target forward launch (:func:`probe.engine.hooks.step.scope_replay`) a replay is not a
record of its own: it is counted into that launch's FORWARD record. On the compiled path
(:func:`probe.engine.accel.replay_hook`) the MRV2 hooks and the plain wrapper's common case run in
C; what C cannot read or stage goes to the same Python ``record``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from probe.engine import accel
from probe.engine.hooks import dispatch, step
from probe.engine.hooks._base import Family, Hook, Target, timed
from probe.engine.runtime import BOOTTIME, RT
from probe.records import Flag, ReplayKind

scope_replay = step.scope_replay

_clock = time.clock_gettime_ns
_REPLAYED = int(ReplayKind.REPLAY)
_CAPTURE = int(ReplayKind.CAPTURE)
_PASS = int(ReplayKind.PASSTHROUGH)
_OUTSIDE = int(Flag.OUTSIDE_STEP)
_DRAFTER = int(Flag.DRAFTER)
_MRV2 = int(Flag.MRV2)
_BREAKABLE = int(Flag.BREAKABLE)


def _forward_context_module() -> Any:
    import vllm.forward_context as fc

    return fc


def wrapper_call(breakable: bool) -> Callable[[Callable[..., Any], Hook], Any]:
    extra = _BREAKABLE if breakable else 0

    def factory(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
        fcm = _forward_context_module()
        full = None if breakable else dispatch._mode_members()[0]
        fwd_record = step.forward_record(hook)

        def record(t0: int, t1: int, mode: int, captured: bool, desc: Any) -> None:
            """After a replay or capture (the compiled hook hands off here what it cannot
            stage itself)."""
            try:
                n = getattr(desc, "num_tokens", 0)
                if RT.fwd_open and not RT.drafter:
                    scope_replay(mode, captured, n, t0, t1)
                else:
                    f = extra | (0 if RT.in_step else _OUTSIDE)
                    if RT.drafter:
                        f |= _DRAFTER
                    kind = _REPLAYED if captured else _CAPTURE
                    RT.put.replay(RT.step, mode, kind, f, t0, t1, n)
            except Exception as exc:
                hook.fail(exc)

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not RT.enabled:
                return orig(self, *args, **kwargs)
            # decided inside the try, vLLM's call made outside it (its exceptions are its
            # own, and it runs once)
            plain, launch, passes, captured, value, desc = True, False, True, False, 0, None
            try:
                ctx = fcm._forward_context
                if ctx is not None:
                    mode = ctx.cudagraph_runtime_mode
                    want = self.runtime_mode
                    value = mode.value
                    # V1's FULL wrapper around the whole model, in a step with no forward
                    # open, is the forward launch (step.late_targets leaves _model_forward
                    # unhooked then); a pass-through's pieces count themselves into it
                    launch = bool(
                        full is not None
                        and want is full
                        and RT.in_step
                        and not RT.drafter
                        and not RT.fwd_open
                    )
                    passes = value == 0 or (want is not None and mode != want)
                    plain = passes and not launch
                    if not passes:
                        desc = ctx.batch_descriptor
                        if breakable:
                            entries = self.entries
                            key = desc if self.key_fn is None else None
                            entry = entries.get(key) if key is not None else None
                            captured = entry is not None and entry.capture is not None
                            if key is None:  # keyed by a function of the inputs: assume replay
                                captured = bool(entries)
                        else:
                            entry = self.concrete_cudagraph_entries.get(desc)
                            captured = entry is not None and entry.cudagraph is not None
            except Exception as exc:
                hook.fail(exc)
                return orig(self, *args, **kwargs)
            if plain:
                return orig(self, *args, **kwargs)
            if launch:

                def replayed(_res: Any, t0: int, t1: int, *_a: Any, **_k: Any) -> None:
                    record(t0, t1, value, captured, desc)  # into the scope the launch opened

                return step.launch(
                    orig, fwd_record, (self, *args), kwargs, None if passes else replayed
                )
            t0 = _clock(BOOTTIME)
            result = orig(self, *args, **kwargs)
            t1 = _clock(BOOTTIME)
            record(t0, t1, value, captured, desc)
            return result

        if breakable:
            return __call__
        compiled = accel.replay_hook(orig, __call__, record, RT, 2, fcm, fwd_record, full)
        return compiled if compiled is not None else __call__

    return factory


def _drafter(manager: Any) -> bool:
    return bool(RT.drafter) or type(manager).__name__ != "ModelCudaGraphManager"


def run_fullgraph(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    """``CudaGraphManager.run_fullgraph``: every MRV2 FULL replay, and the target's FULL
    forward launch itself. ``ModelCudaGraphManager.run_fullgraph`` calls it through
    ``super()`` and only slices the hidden states after it, so a target replay in a step
    with no forward open is the launch (:func:`probe.engine.hooks.step.launch`: the device
    events, one FORWARD record counting this replay): one hooked call, not two."""

    def record(result: Any, t0: int, t1: int, self: Any, desc: Any, *a: Any, **kw: Any) -> None:
        try:
            drafter = _drafter(self)
            if RT.fwd_open and not drafter:
                scope_replay(2, True, desc.num_tokens, t0, t1)
            else:
                f = _MRV2 | (0 if RT.in_step else _OUTSIDE) | (_DRAFTER if drafter else 0)
                RT.put.replay(RT.step, 2, _REPLAYED, f, t0, t1, desc.num_tokens)
        except Exception as exc:
            hook.fail(exc)

    fwd_record = step.forward_record(hook)
    clock = _clock

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not RT.enabled:
            return orig(self, *args, **kwargs)
        if RT.in_step and not RT.fwd_open and not _drafter(self):
            return step.launch(orig, fwd_record, (self, *args), kwargs, record)
        t0 = clock(BOOTTIME)
        result = orig(self, *args, **kwargs)
        t1 = clock(BOOTTIME)
        record(result, t0, t1, self, *args, **kwargs)
        return result

    compiled = accel.replay_hook(orig, wrapper, record, RT, 0, None, fwd_record)
    return compiled if compiled is not None else wrapper


def run_pw_graph(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    """MRV2 PIECEWISE: one record per call; the pieces inside are counted separately."""

    def record(result: Any, t0: int, t1: int, self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            drafter = _drafter(self)
            if RT.fwd_open and not drafter:
                RT.fwd_passes += 1  # confirmation comes from the pieces
            else:
                f = _MRV2 | (0 if RT.in_step else _OUTSIDE) | (_DRAFTER if drafter else 0)
                if getattr(self, "use_breakable_cg", False):
                    f |= _BREAKABLE
                RT.put.replay(RT.step, 1, _PASS, f, t0, t1, 0)
        except Exception as exc:
            hook.fail(exc)

    wrapper = timed(orig, record)

    compiled = accel.replay_hook(orig, wrapper, record, RT, 1)
    return compiled if compiled is not None else wrapper


CG = "vllm.v1.worker.gpu.cudagraph_utils"

TARGETS: tuple[Target, ...] = (
    Target(
        "replay.wrapper",
        "vllm.compilation.cuda_graph",
        "CUDAGraphWrapper",
        "__call__",
        wrapper_call(False),
        gate="on",
    ),
    Target(
        "replay.breakable",
        "vllm.compilation.breakable_cudagraph",
        "BreakableCUDAGraphWrapper",
        "__call__",
        wrapper_call(True),
        gate="on",
    ),
    Target(
        "replay.mrv2.run_fullgraph",
        CG,
        "CudaGraphManager",
        "run_fullgraph",
        run_fullgraph,
        gate="on",
    ),
    Target(
        "replay.mrv2.run_pw_graph", CG, "CudaGraphManager", "run_pw_graph", run_pw_graph, gate="on"
    ),
)

FAMILY = Family("replay", "0.26-0.34", TARGETS)
TARGETS = FAMILY.targets  # each marked with its family
