"""Graph dispatch decisions with their miss reason, for both runners.

Supports vLLM 0.26 to 0.34 (0.34: Model Runner V2 only; the V1 targets are not in it).

- V1: ``CudagraphDispatcher.dispatch`` decides; ``GPUModelRunner.
  _determine_batch_execution_and_padding`` around it knows the real request count and the
  longest query, which it hands to the inner hook (see below). The MTP
  drafter's own dispatcher (``SpecDecodeBaseProposer``) is the same class; its records are
  flagged DRAFTER by the drafter scope.
- MRV2: ``CudaGraphManager.dispatch`` decides; ``dispatch_cg_and_sync_dp`` skips it when
  the step must run eager (profile, encoder inputs), which the wrapper records itself.

A hit (FULL) costs one comparison. Only a miss computes its reason, from the dispatcher's
own inputs and state (:mod:`probe.reasons`): misses are eager or piecewise steps, already
the slow ones.

One record per decision: inside the runner's dispatch phase (V1
``_determine_batch_execution_and_padding``, MRV2 ``dispatch_cg_and_sync_dp``) the inner
hook hands its decision to the outer one (under DP > 1 the last re-dispatch wins, as in
vLLM), which writes it with the phase's own span (``Flag.SPAN``); a phase with no
decision inside it writes a plain DISPATCH span. A dispatch with no runner phase around
it (the MTP drafter's) writes its own record.

The hand-off is in hot fields of the runtime (:data:`probe.engine.accel.HOT_FIELDS`:
``phase_open``, the V1 runner's ``phase_num_reqs``/``phase_max_q``, the decision's
``dec_*``), C members on the compiled path, where the dispatchers' FULL hits and both
phase wrappers run in C and allocate nothing; misses (which compute a reason) and the
pure-Python path read and write the same fields.
"""

from __future__ import annotations

import inspect
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from operator import index
from typing import Any

from probe import calls
from probe.engine import accel
from probe.engine.hooks._base import Family, Hook, Target, loaded_runner_class, timed
from probe.engine.runtime import BOOTTIME, RT
from probe.records import Flag, Phase, Reason

_clock = time.clock_gettime_ns
_PHASE = int(Phase.DISPATCH)
_SPANF = int(Flag.SPAN)
_OUTSIDE = int(Flag.OUTSIDE_STEP)
_DRAFTER = int(Flag.DRAFTER)
_UNIFORM = int(Flag.UNIFORM)
_MRV2 = int(Flag.MRV2)
_HIT = int(Reason.HIT)


def _reasons() -> Any:
    from probe import reasons

    return reasons


def _bind(sig: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    out = dict(bound.arguments)
    out.pop("self", None)
    return out


class _ReasonMemo:
    """Miss reasons per dispatcher object, by the call's inputs.

    A reason is a function of the arguments and of the dispatcher's state, which only
    changes at start-up (the captured/initialized flag and the mode are in the key) or
    when the snapshot changes (a new ``RT.graph_ctx`` empties that dispatcher's memo). So
    a PIECEWISE or eager engine pays for the reason once per distinct batch shape, not
    once per step.

    Each dispatcher's memo is found by ``id()`` and confirmed through a weak reference
    to the dispatcher itself: a new dispatcher that reuses a freed one's address (a
    rebuilt engine, a test) starts empty instead of inheriting the old reasons.
    """

    __slots__ = ("by_owner", "limit")

    def __init__(self, limit: int = 4096) -> None:
        # id(owner) -> (weak reference to owner, graph context, reasons by key)
        self.by_owner: dict[int, tuple[Any, Any, dict[Any, int]]] = {}
        self.limit = limit

    def _memo(self, owner: Any, ctx: Any) -> dict[Any, int] | None:
        entry = self.by_owner.get(id(owner))
        if entry is not None and entry[0]() is owner and entry[1] is ctx:
            return entry[2]
        try:
            ref = weakref.ref(owner)
        except TypeError:  # not weak-referenceable: no memo for it
            return None
        if len(self.by_owner) >= self.limit:
            self.by_owner.clear()
        cache: dict[Any, int] = {}
        self.by_owner[id(owner)] = (ref, ctx, cache)  # ctx held, not compared by id
        return cache

    def get(self, owner: Any, ctx: Any, key: Any, compute: Callable[[], Any]) -> int:
        return self.lookup(owner, ctx, key, compute)[0]

    def lookup(
        self, owner: Any, ctx: Any, key: Any, compute: Callable[[], Any]
    ) -> tuple[int, bool]:
        """The reason, and whether it is held by the memo (so that the same inputs under
        the same ``ctx`` give the same reason: the compiled dispatch keeps the last one)."""
        cache = self._memo(owner, ctx)
        if cache is None:
            return int(compute()), False
        try:
            return cache[key], True
        except KeyError:
            pass
        except TypeError:  # an unhashable argument: no memo for this call
            return int(compute()), False
        reason = int(compute())
        if len(cache) >= self.limit:
            cache.clear()
        cache[key] = reason
        return reason, True


def _frozen(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The call's arguments as a memo key. vLLM passes ``valid_modes``/``invalid_modes`` as
    sets on exactly the calls that miss: forced eager and the drafter's eager steps
    (``{CUDAGraphMode.NONE}``), cascade attention and encoder outputs (``invalid_modes=
    {FULL}``), every re-dispatch under DP > 1, the kv-sharing fast-prefill logits dispatch.
    Unhashable as they come, they would recompute the reason on every such call."""
    return (
        tuple(frozenset(a) if isinstance(a, set) else a for a in args),
        tuple((k, frozenset(v) if isinstance(v, set) else v) for k, v in kwargs.items()),
    )


def _positions(sig: inspect.Signature, *names: str) -> list[int]:
    """Index of each parameter in ``args`` (``self`` excluded); -1 when absent."""
    params = [p for p in sig.parameters if p != "self"]
    return [params.index(n) if n in params else -1 for n in names]


def _int_or_0(v: Any) -> int:
    """A runner's count as the phase keeps it: ``v or 0``, as an int."""
    return index(v) if v else 0


def v1_runner_dispatch(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    """``GPUModelRunner._determine_batch_execution_and_padding``: batch facts + DISPATCH span."""
    sig = inspect.signature(orig)
    names = list(sig.parameters)
    n_reqs, n_maxq = calls.V1_RUNNER_PHASE
    i_reqs = names.index(n_reqs) if n_reqs in names else -1
    i_maxq = names.index(n_maxq) if n_maxq in names else -1

    def close(t0: int, t1: int, /, *args: Any, **kwargs: Any) -> None:
        try:
            _close_phase(t0, t1, 0)
        except Exception as exc:
            _abandon_phase(hook, exc)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not RT.enabled:
            return orig(*args, **kwargs)
        try:
            n = len(args)
            rt = RT
            rt.phase_num_reqs = _int_or_0(args[i_reqs] if 0 <= i_reqs < n else kwargs.get(n_reqs))
            rt.phase_max_q = _int_or_0(args[i_maxq] if 0 <= i_maxq < n else kwargs.get(n_maxq))
            rt.decided = 0
            rt.phase_open = 1
        except Exception as exc:
            _abandon_phase(hook, exc)
            return orig(*args, **kwargs)
        t0 = _clock(BOOTTIME)
        try:
            return orig(*args, **kwargs)
        finally:
            t1 = _clock(BOOTTIME)
            close(t0, t1, *args, **kwargs)

    compiled = accel.phase_hook(orig, close, wrapper, RT, 0, (i_reqs, i_maxq))
    return compiled if compiled is not None else wrapper


def _close_phase(t0: int, t1: int, extra: int, draft: bool = False) -> None:
    """End of the runner's dispatch phase: its decision and span in one DISPATCH record
    (or a plain span when no decision was made inside it). A speculator's phase
    (``draft``) writes its decision as the drafter's own DISPATCH (no span of the step's
    dispatch phase), and nothing when none was made."""
    rt = RT
    decided = rt.decided
    if decided:
        decision = (
            rt.dec_mode, rt.dec_reason, rt.dec_flags, rt.dec_num_tokens, rt.dec_padded_tokens,
            rt.dec_num_reqs, rt.dec_padded_reqs, rt.dec_max_q, rt.dec_uq,
        )  # fmt: skip
    rt.phase_open = rt.decided = rt.phase_num_reqs = rt.phase_max_q = 0
    if decided:
        _put(decision, t0, t1, 0 if draft else _SPANF)
    elif not draft:
        f = extra | (0 if rt.in_step else _OUTSIDE) | (_DRAFTER if rt.drafter else 0)
        rt.put.span(rt.step, _PHASE, t0, t1, f, 0, 0, 0)


def _abandon_phase(hook: Hook, exc: BaseException) -> None:
    """A fault in a phase hook: the phase is closed unwritten (so that dispatches after it
    write their own records) and the hook removed."""
    RT.phase_open = RT.decided = RT.phase_num_reqs = RT.phase_max_q = 0
    hook.fail(exc)


def _put(decision: tuple[int, ...], t0: int, t1: int, extra: int = 0, rt: Any = RT) -> None:
    """One DISPATCH record of ``(mode, reason, flags, num_tokens, padded_tokens, num_reqs,
    padded_reqs, max_q, uq)`` spanning ``t0..t1``."""
    m, reason, f, num_tokens, padded_tokens, num_reqs, padded_reqs, max_q, uq = decision
    rt.put.dispatch(
        rt.step, m, reason, f | extra, t0, t1, num_tokens, padded_tokens, num_reqs,
        padded_reqs, max_q, uq,
    )  # fmt: skip


def _decide(
    m: int,
    reason: int,
    f: int,
    t0: int,
    t1: int,
    num_tokens: int,
    padded_tokens: int,
    num_reqs: int,
    padded_reqs: int,
    max_q: int,
    uq: int,
    rt: Any = RT,
) -> None:
    """A dispatcher's decision: to the open runner phase (the last one wins), or a record
    of its own."""
    if not rt.phase_open:
        decision = (m, reason, f, num_tokens, padded_tokens, num_reqs, padded_reqs, max_q, uq)
        _put(decision, t0, t1, 0, rt)
        return
    rt.dec_mode, rt.dec_reason, rt.dec_flags = m, reason, f
    rt.dec_num_tokens, rt.dec_padded_tokens = num_tokens, padded_tokens
    rt.dec_num_reqs, rt.dec_padded_reqs = num_reqs, padded_reqs
    rt.dec_max_q, rt.dec_uq = max_q, uq
    rt.decided = 1


def _mode_members() -> tuple[Any, Any]:
    """vLLM's FULL and PIECEWISE members: compared by identity on the hot path (an Enum's
    ``.value`` and hash are Python-level and cost more than the rest of the record).
    (None, None) in a process that has not imported vLLM (the calibration at attach must
    not be the one to import it: tens of seconds on a busy host)."""
    if "vllm" not in sys.modules:
        return None, None
    try:
        from vllm.config import CUDAGraphMode

        return CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE
    except Exception:
        return None, None


_V1_NT, _V1_UD = (calls.V1_DISPATCH.index(n) for n in ("num_tokens", "uniform_decode"))


def v1_dispatch(orig: Callable[..., Any], hook: Hook, rt: Any = RT) -> Callable[..., Any]:
    """``CudagraphDispatcher.dispatch``: mode, padding and (on a miss) the reason; ``rt``
    the runtime it reads and writes (the process's own, or the calibration's)."""
    sig = inspect.signature(orig)
    full, piecewise = _mode_members()
    hit = _HIT
    memo = _ReasonMemo()

    def record(
        result: Any, t0: int, t1: int, self: Any, *args: Any, **kwargs: Any
    ) -> tuple[int, int] | None:
        """Write the decision; returns ``(mode, reason)`` of a miss whose reason the memo
        holds (the compiled hook then records the same inputs itself, in C), else None."""
        learned = None
        try:
            mode, desc = result[0], result[1]
            m = 2 if mode is full else 1 if mode is piecewise else int(mode.value)
            num_tokens = args[_V1_NT] if len(args) > _V1_NT else kwargs[calls.V1_DISPATCH[_V1_NT]]
            uniform = (
                args[_V1_UD] if len(args) > _V1_UD else kwargs.get(calls.V1_DISPATCH[_V1_UD], False)
            )
            if m == 2:
                reason = hit
            else:
                ctx = rt.graph_ctx
                key = (
                    getattr(self, "keys_initialized", None),
                    getattr(self, "cudagraph_mode", None),
                    m,
                    desc,
                    _frozen(args, kwargs),
                )
                reason, held = memo.lookup(
                    self,
                    ctx,
                    key,
                    lambda: _reasons().v1_reason(
                        self, mode, desc, ctx=ctx, **_bind(sig, (self, *args), kwargs)
                    ),
                )
                if held:
                    learned = (m, reason)
            f = (0 if rt.in_step else _OUTSIDE) | (_DRAFTER if rt.drafter else 0)
            if uniform:
                f |= _UNIFORM
            _decide(
                m,
                reason,
                f,
                t0,
                t1,
                num_tokens,
                desc.num_tokens,
                rt.phase_num_reqs,  # the runner's phase (0 outside one)
                desc.num_reqs or 0,
                rt.phase_max_q,
                self.uniform_decode_query_len,
                rt,
            )
            return learned
        except Exception as exc:
            hook.fail(exc)
            return None

    dispatch = timed(orig, record, rt)

    # a FULL hit (the steady state) is recorded in C, and so is a miss whose inputs match
    # the last one ``record`` handed back (the eager drafter's every step, a PIECEWISE
    # engine's); everything else by ``record``
    compiled = accel.dispatch_hook(orig, record, rt, full, 0)
    return compiled if compiled is not None else dispatch


def _caller_max_query_len(depth: int = 6, above: int = 2) -> int:
    """The batch's longest query as MRV2's own caller computed it, for a dispatch that
    was given neither a uniform token count nor ``max_query_len``.

    That is every batch with a prefill: 0.26's ``dispatch`` takes no ``max_query_len``,
    and 0.33's runner passes None for a batch with a prefill (its varlen decode graphs
    must not admit one). The runners and speculators compute the value right before
    they dispatch, in their own frame: 0.33's ``GPUModelRunner.execute_model`` as
    ``batch_req_state.num_scheduled_tokens`` (batch order, after adaptive verification
    trimmed it), 0.26's as ``max_query_len``, both versions' speculators as
    ``max_query_len`` (``input_batch.num_scheduled_tokens.max()``). Read from the
    nearest caller frame that has one; 0 when none does. Only these batches pay for it.
    """
    frame: Any = sys._getframe(above)  # above the hook's record (the frames between)
    for _ in range(depth):
        if frame is None:
            break
        loc = frame.f_locals
        state = loc.get("batch_req_state")
        nst = getattr(state, "num_scheduled_tokens", None)
        if nst is not None and len(nst):
            return int(nst.max())
        mq = loc.get("max_query_len")
        if mq is not None:
            return int(mq)
        frame = frame.f_back
    return 0


_MRV2_INPUTS = calls.MRV2_DISPATCH
"""The inputs of an MRV2 dispatch the decision is read with (the manager's ``dispatch``
and ``dispatch_cg_and_sync_dp`` name them alike)."""


def _mrv2_inputs(at: Sequence[int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """:data:`_MRV2_INPUTS` of one call, each by its position in ``args`` (``at``, fixed
    at install by :func:`_positions`; -1 absent) else by keyword, else 0, 0, None, None."""
    n = len(args)
    return [
        args[i] if 0 <= i < n else kwargs.get(name, d)
        for i, name, d in zip(at, _MRV2_INPUTS, (0, 0, None, None), strict=True)
    ]


Decision = tuple[int, int, int, int, int, int, int, int, int]
"""A decision's fields: mode, reason, flags, num_tokens, padded_tokens, num_reqs,
padded_reqs, max_q, uq (as :func:`_put` writes them)."""


class _Mrv2Decider:
    """An MRV2 graph manager's decision as one DISPATCH's fields, from the manager, the
    ``BatchExecutionDescriptor`` its ``dispatch`` returned and that call's inputs: shared
    by the manager's own hook and the dispatch phase (which reads the descriptor
    ``dispatch_cg_and_sync_dp`` returns). A FULL hit costs one comparison; only a miss
    computes its reason, once per distinct input (:class:`_ReasonMemo`)."""

    __slots__ = ("full", "memo", "piecewise")

    def __init__(self) -> None:
        self.full, self.piecewise = _mode_members()
        self.memo = _ReasonMemo()

    def __call__(
        self,
        manager: Any,
        desc: Any,
        num_reqs: Any,
        num_tokens: Any,
        utc: Any,
        maxq: Any,
        key: tuple[Any, ...],
        inputs: Callable[[], dict[str, Any]],
    ) -> Decision:
        """``(mode, reason, flags, num_tokens, padded_tokens, num_reqs, padded_reqs,
        max_q, uq)``. Only a miss reads ``key`` (the call's inputs, hashable) and, once
        per distinct key, calls ``inputs()``: the keyword arguments ``mrv2_reason``
        takes."""
        cg_mode = desc.cg_mode
        m = 2 if cg_mode is self.full else 1 if cg_mode is self.piecewise else int(cg_mode.value)
        if m == 2:
            reason = _HIT
        else:
            ctx = RT.graph_ctx
            memo_key = (
                getattr(manager, "_graphs_captured", None),
                getattr(manager, "cudagraph_mode", None),
                m,
                desc.num_tokens,
                desc.num_reqs,
                key,
            )
            reason = self.memo.get(
                manager,
                ctx,
                memo_key,
                lambda: _reasons().mrv2_reason(manager, desc, ctx=ctx, **inputs()),
            )
        dql = manager.decode_query_len
        # int(): the speculators pass numpy integers (``num_scheduled_tokens.max()``),
        # and a numpy int32 shifted left by 32 is 0, not the packed pair.
        max_q = int(maxq or utc or _caller_max_query_len(above=3))  # above its caller
        f = _MRV2 | (0 if RT.in_step else _OUTSIDE)
        if RT.drafter or type(manager).__name__ != "ModelCudaGraphManager":
            f |= _DRAFTER
        if utc is not None and utc == dql:
            f |= _UNIFORM
        return (
            m, reason, f, num_tokens, desc.num_tokens, num_reqs, desc.num_reqs or 0, max_q, dql,
        )  # fmt: skip


def mrv2_dispatch(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    """``CudaGraphManager.dispatch`` (MRV2), hooked only where the dispatch phase cannot
    see the decision in what it returns: under DP > 1 (:func:`late_targets`), where the
    synced re-dispatch's own inputs give its reason.

    The arguments are read by position (fixed at install from the signature, so both
    0.26's four parameters and 0.33's six work); only a miss binds them, once per
    distinct input (:class:`_ReasonMemo`)."""
    sig = inspect.signature(orig)
    positions = _positions(sig, *_MRV2_INPUTS)
    decide = _Mrv2Decider()

    def record(desc: Any, t0: int, t1: int, self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            num_reqs, num_tokens, utc, maxq = _mrv2_inputs(positions, args, kwargs)
            m, reason, f, nt, pt, nr, pr, mq, uq = decide(
                self, desc, num_reqs, num_tokens, utc, maxq, _frozen(args, kwargs),
                lambda: _bind(sig, (self, *args), kwargs),
            )  # fmt: skip
            _decide(m, reason, f, t0, t1, nt, pt, nr, pr, mq, uq)
        except Exception as exc:
            hook.fail(exc)

    dispatch = timed(orig, record)

    # a FULL hit (the steady state) is recorded in C; everything else by ``record``
    compiled = accel.dispatch_hook(orig, record, RT, decide.full, 1, tuple(positions))
    return compiled if compiled is not None else dispatch


def _mrv2_phase(orig: Callable[..., Any], hook: Hook, draft: bool) -> Callable[..., Any]:
    """``dispatch_cg_and_sync_dp``: the step's graph decision and its span.

    The decision is the one a hooked manager handed in (under DP > 1: the last
    re-dispatch), else the descriptor the call returns with the call's own inputs (the
    manager is not hooked: one hooked call per decision, not two); ``need_eager`` (the
    manager skipped) is FORCED_EAGER inside a step. The runner's phase (``draft`` False)
    writes it as a DISPATCH with ``Flag.SPAN`` (a plain span when nothing was decided);
    a speculator's (``draft``) as the drafter's own DISPATCH, nothing when nothing was."""
    eager = int(Reason.FORCED_EAGER)
    positions = _positions(inspect.signature(orig), *_MRV2_INPUTS)
    decide = _Mrv2Decider()
    extra = _MRV2 | (_DRAFTER if draft else 0)

    def close(res: Any, t0: int, t1: int, /, *args: Any, **kwargs: Any) -> None:
        try:
            rt = RT
            num_reqs, num_tokens, utc, maxq = _mrv2_inputs(positions, args, kwargs)
            if kwargs.get(calls.NEED_EAGER):
                if rt.in_step:
                    f = extra | (_DRAFTER if rt.drafter else 0)
                    _decide(0, eager, f, t0, t1, num_tokens, num_tokens, num_reqs, num_reqs, 0, 0)
            elif not rt.decided and isinstance(res, tuple) and res:
                loras = kwargs.get("num_active_loras", 0)
                manager = args[0] if args else kwargs["cudagraph_manager"]
                m, reason, f, nt, pt, nr, pr, mq, uq = decide(
                    manager, res[0], num_reqs, num_tokens, utc, maxq,
                    (num_reqs, num_tokens, utc, maxq, loras),
                    lambda: {
                        "num_reqs": num_reqs, "num_tokens": num_tokens,
                        "uniform_token_count": utc, "max_query_len": maxq,
                        "num_active_loras": loras,
                    },
                )  # fmt: skip
                _decide(m, reason, f | (extra & _DRAFTER), t0, t1, nt, pt, nr, pr, mq, uq)
            _close_phase(t0, t1, _MRV2, draft)
        except Exception as exc:
            _abandon_phase(hook, exc)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not RT.enabled:
            return orig(*args, **kwargs)
        RT.decided = 0
        RT.phase_open = 1
        res = None
        t0 = _clock(BOOTTIME)
        try:
            res = orig(*args, **kwargs)
            return res
        finally:
            t1 = _clock(BOOTTIME)
            close(res, t0, t1, *args, **kwargs)

    which = 2 if draft else 1
    compiled = accel.phase_hook(orig, close, wrapper, RT, which, tuple(positions), decide.full)
    return compiled if compiled is not None else wrapper


def mrv2_sync_dp(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    """The runner's ``dispatch_cg_and_sync_dp``: the step's decision with the DISPATCH
    span (:func:`_mrv2_phase`)."""
    return _mrv2_phase(orig, hook, draft=False)


def mrv2_draft_sync_dp(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    """A speculator module's ``dispatch_cg_and_sync_dp``: the drafter's decision
    (:func:`_mrv2_phase`)."""
    return _mrv2_phase(orig, hook, draft=True)


V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
MRV2_RUNNER = "vllm.v1.worker.gpu.model_runner"

TARGETS: tuple[Target, ...] = (
    Target(
        "dispatch.v1.dispatcher",
        "vllm.v1.cudagraph_dispatcher",
        "CudagraphDispatcher",
        "dispatch",
        v1_dispatch,
        gate="on",
    ),
    Target(
        "dispatch.v1.runner",
        V1_RUNNER,
        "GPUModelRunner",
        "_determine_batch_execution_and_padding",
        v1_runner_dispatch,
        gate="on",
    ),
    Target(
        "dispatch.mrv2.sync_dp",
        MRV2_RUNNER,
        "",
        "dispatch_cg_and_sync_dp",
        mrv2_sync_dp,
        gate="on",
    ),
)

MRV2_MANAGERS = "vllm.v1.worker.gpu.cudagraph_utils"
MANAGER = Target("dispatch.mrv2.manager", MRV2_MANAGERS, "CudaGraphManager", "dispatch",
                 mrv2_dispatch, gate="on")  # fmt: skip
DRAFT_SYNC_DP = Target("dispatch.mrv2.draft_sync_dp", "", "", "dispatch_cg_and_sync_dp",
                       mrv2_draft_sync_dp, gate="on")  # fmt: skip


def late_targets(runner: Any) -> list[tuple[Target, Any]]:
    """MRV2's targets that depend on the live runner: the speculator's dispatch phase (in
    each module of its class that calls ``dispatch_cg_and_sync_dp``: the drafter's
    decision, one hooked call), and ``CudaGraphManager.dispatch`` only under DP > 1
    (where a synced re-dispatch inside the phase has its own inputs and reason). At DP 1
    the phase reads the manager's decision from what it returns, so a step's decision
    costs one hooked call, not two."""
    if loaded_runner_class(MRV2_RUNNER, runner) is None:
        return []
    runner_mod = sys.modules[MRV2_RUNNER]
    out: list[tuple[Target, Any]] = []
    if int(getattr(runner, "dp_size", 1) or 1) > 1:
        manager = getattr(sys.modules.get(MRV2_MANAGERS), "CudaGraphManager", None)
        if isinstance(manager, type):
            out.append((MANAGER, manager))
    drafter = getattr(runner, "speculator", None) or getattr(runner, "drafter", None)
    seen: set[str] = set()
    for klass in type(drafter).__mro__ if drafter is not None else ():
        name = klass.__module__
        mod = sys.modules.get(name)
        if name in seen or mod is None or mod is runner_mod:
            continue
        seen.add(name)
        if callable(vars(mod).get("dispatch_cg_and_sync_dp")):
            out.append((DRAFT_SYNC_DP, mod))
    return out


FAMILY = Family("dispatch", "0.26-0.34", TARGETS, late_targets)
TARGETS = FAMILY.targets  # each marked with its family
