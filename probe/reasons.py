"""Why a step did or did not replay a FULL CUDA graph, from the dispatcher's own state.

The hooks call these functions right after vLLM's own dispatch returned. They take the
real vLLM objects as arguments, read the same state the dispatch read, and name the
first thing that kept the step off a FULL graph (docs/architecture.md, "Definitions"). Nothing
here imports vLLM at module import time; :func:`split_from_metadata` imports vLLM's
``split_decodes_and_prefills`` on first use.

Supported: vLLM 0.26 to 0.34, the classic runner's ``CudagraphDispatcher`` (``v1``, to
0.33) and Model Runner V2's ``CudaGraphManager`` (``mrv2``; from 0.34 with its decode
graphs by request count). Version differences are read off
the objects (attributes present or not), never off version strings.

Example::

    mode, desc = dispatcher.dispatch(num_tokens=6, uniform_decode=True)
    reason = v1_reason(dispatcher, mode, desc, num_tokens=6, uniform_decode=True)
    desc = manager.dispatch(num_reqs, num_tokens, uniform_token_count, 0)
    reason = mrv2_reason(manager, desc, num_reqs=num_reqs, num_tokens=num_tokens,
                         uniform_token_count=uniform_token_count)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, replace
from typing import Any

from probe.records import Mode, Reason

# AttentionCGSupport values (vllm/v1/attention/backend.py, the same in 0.26 to 0.34).
SUPPORT_NEVER = 0
SUPPORT_UNIFORM_SINGLE_TOKEN_DECODE = 1
SUPPORT_UNIFORM_BATCH = 2
SUPPORT_ALWAYS = 3
#: the AttentionCGSupport names, each at its value
SUPPORT_NAMES = ("NEVER", "UNIFORM_SINGLE_TOKEN_DECODE", "UNIFORM_BATCH", "ALWAYS")

# CUDAGraphMode as (decode part, mixed part), the way CUDAGraphMode.value nests it.
_MODE_PARTS: dict[str, tuple[int, int]] = {
    "NONE": (Mode.NONE, Mode.NONE),
    "PIECEWISE": (Mode.PIECEWISE, Mode.PIECEWISE),
    "FULL": (Mode.FULL, Mode.FULL),
    "FULL_DECODE_ONLY": (Mode.FULL, Mode.NONE),
    "FULL_AND_PIECEWISE": (Mode.FULL, Mode.PIECEWISE),
}
_ALL_RUNTIME_MODES = frozenset({Mode.NONE, Mode.PIECEWISE, Mode.FULL})
#: the CUDAGraphMode names a user can set as ``cudagraph_mode``
MODE_NAMES = tuple(_MODE_PARTS)


@dataclass(frozen=True)
class GraphContext:
    """What the engine asked for and what ``resolve_cudagraph_mode_and_sizes`` made of it.

    The dispatchers only keep the resolved mode, so a PIECEWISE engine that was demoted
    for lack of backend support looks the same as one configured PIECEWISE. This context,
    taken where the mode is resolved, tells them apart.
    """

    requested_mode: str | None
    resolved_mode: str | None
    min_cg_support: int | None
    min_cg_backend: str | None
    uniform_decode_query_len: int

    def support_demoted_decode(self) -> bool:
        """True when the resolver took FULL decode graphs away for lack of support.

        These are rules 2 and 3 of ``resolve_cudagraph_mode_and_sizes``: decode FULL with
        support NEVER, or decode FULL with ``uniform_decode_query_len > 1`` and support
        below UNIFORM_BATCH (the UNIFORM_SINGLE_TOKEN_DECODE + MTP case).
        """
        requested = mode_parts(self.requested_mode)
        resolved = mode_parts(self.resolved_mode)
        support = self.min_cg_support
        if requested is None or support is None or requested[0] != Mode.FULL:
            return False
        if resolved is not None and resolved[0] == Mode.FULL:
            return False
        support = _int_value(support)
        return support == SUPPORT_NEVER or (
            self.uniform_decode_query_len > 1 and support < SUPPORT_UNIFORM_BATCH
        )


def _int_value(x: Any) -> int:
    return int(getattr(x, "value", x))


def mode_parts(mode: Any) -> tuple[int, int] | None:
    """``(decode, mixed)`` runtime modes of a CUDAGraphMode, its name, or its value."""
    if mode is None:
        return None
    if isinstance(mode, str):  # "FULL_AND_PIECEWISE" or "CUDAGraphMode.FULL_AND_PIECEWISE"
        return _MODE_PARTS.get(mode.rpartition(".")[2].upper())
    name = getattr(mode, "name", None)
    if isinstance(name, str) and name in _MODE_PARTS:
        return _MODE_PARTS[name]
    value = getattr(mode, "value", mode)
    if isinstance(value, tuple) and len(value) == 2:
        return int(value[0]), int(value[1])
    if isinstance(value, int):
        return value, value
    return None


def mode_value(mode: Any) -> int:
    """Runtime mode (NONE/PIECEWISE/FULL) of a CUDAGraphMode or int; -1 if not one."""
    value = getattr(mode, "value", mode)
    return value if isinstance(value, int) else -1


def _runtime_set(modes: Set[Any] | None) -> frozenset[int] | None:
    if modes is None:
        return None
    return frozenset(mode_value(m) for m in modes)


def _requested_reason_for_mixed(ctx: GraphContext) -> Reason:
    """Why a non-uniform batch would not be FULL under the mode the user asked for."""
    requested = mode_parts(ctx.requested_mode)
    if requested is not None and requested[1] == Mode.NONE:
        return Reason.MIXED_BATCH_IN_FULL_DECODE_ONLY
    return Reason.NOT_UNIFORM


def _no_full_engine_reason(
    ctx: GraphContext | None, uniform_decode: bool, engine_mode: tuple[int, int]
) -> Reason:
    """Reason for an engine whose resolved mode has no FULL graphs at all."""
    if ctx is not None and ctx.support_demoted_decode():
        if uniform_decode:
            return Reason.BACKEND_SUPPORT_TOO_LOW
        return _requested_reason_for_mixed(ctx)
    if engine_mode[1] == Mode.PIECEWISE:
        return Reason.PIECEWISE_ONLY
    return Reason.GRAPHS_DISABLED


def _structural_reason(
    engine: tuple[int, int], uniform_decode: bool, ctx: GraphContext | None
) -> Reason:
    """Why no FULL graph fits when no key exists for this shape (LoRA aside)."""
    decode, mixed = engine
    if decode != Mode.FULL:
        return _no_full_engine_reason(ctx, uniform_decode, engine)
    if mixed == Mode.FULL:
        return Reason.NO_FULL_KEY_FOR_SIZE
    if uniform_decode:
        return Reason.NO_FULL_KEY_FOR_SIZE
    if mixed == Mode.NONE:
        return Reason.MIXED_BATCH_IN_FULL_DECODE_ONLY
    return Reason.NOT_UNIFORM


# ----------------------------------------------------------------------------------
# V1: CudagraphDispatcher (vllm/v1/cudagraph_dispatcher.py, identical logic in 0.26/0.33)


def _v1_effective_loras(dispatcher: Any, has_lora: bool, num_active_loras: int) -> int:
    """The LoRA count ``CudagraphDispatcher.dispatch`` looks keys up with."""
    if not (has_lora and num_active_loras > 0):
        return num_active_loras
    if getattr(dispatcher, "specialize_lora_count", False):
        captured = getattr(dispatcher, "captured_lora_counts", [])
        idx = bisect.bisect_left(captured, num_active_loras)
        return int(captured[idx]) if idx < len(captured) else num_active_loras
    lora_config = dispatcher.vllm_config.lora_config
    return int(lora_config.max_loras) + 1 if lora_config is not None else num_active_loras


def _lora_variant_exists(keys: Iterable[Any], desc: Any) -> bool:
    """A key with this batch's shape exists, but for another LoRA case."""
    for key in keys:
        if (
            key.num_tokens == desc.num_tokens
            and key.num_reqs == desc.num_reqs
            and key.uniform == desc.uniform
            and (key.has_lora, key.num_active_loras) != (desc.has_lora, desc.num_active_loras)
        ):
            return True
    return False


def v1_reason(
    dispatcher: Any,
    mode: Any,
    desc: Any,
    *,
    num_tokens: int,
    uniform_decode: bool,
    has_lora: bool = False,
    num_active_loras: int = 0,
    valid_modes: Set[Any] | None = None,
    invalid_modes: Set[Any] | None = None,
    ctx: GraphContext | None = None,
) -> Reason:
    """Why ``CudagraphDispatcher.dispatch`` returned ``mode`` for these inputs.

    ``mode``/``desc`` are what the real ``dispatch`` returned for the keyword arguments,
    which are the ones ``dispatch`` received. For a PIECEWISE step the reason is why
    FULL was not taken. Checks follow the order of ``dispatch`` itself.

    Pass ``ctx`` for the model's dispatcher only: the MTP drafter's dispatcher holds
    PIECEWISE keys by design, and without ``ctx`` its steps read ``piecewise_only``.
    """
    if mode_value(mode) == Mode.FULL:
        return Reason.HIT
    if not getattr(dispatcher, "keys_initialized", False):
        return Reason.WARMUP_OR_PROFILE
    engine = mode_parts(dispatcher.cudagraph_mode) or (Mode.NONE, Mode.NONE)
    max_size = dispatcher.compilation_config.max_cudagraph_capture_size
    too_big = max_size is not None and num_tokens > max_size
    if engine == (Mode.NONE, Mode.NONE) or max_size is None:
        if too_big:
            return Reason.BATCH_TOO_BIG
        return _no_full_engine_reason(ctx, uniform_decode, engine)

    allowed = set(_runtime_set(valid_modes) or _ALL_RUNTIME_MODES)
    invalid = _runtime_set(invalid_modes) or frozenset()
    allowed -= invalid
    if allowed <= {Mode.NONE}:
        return Reason.FORCED_EAGER
    if too_big:
        return Reason.BATCH_TOO_BIG

    separate = engine[0] != engine[1]
    lora_on = getattr(dispatcher.vllm_config, "lora_config", None) is not None
    if not lora_on and (Mode.FULL not in engine or (separate and not uniform_decode)):
        # No FULL key can match: none exist, or (separate routines) only uniform ones.
        return _structural_reason(engine, uniform_decode, ctx)
    try:
        full_desc = dispatcher._create_padded_batch_descriptor(
            num_tokens,
            uniform_decode and separate,
            has_lora,
            _v1_effective_loras(dispatcher, has_lora, num_active_loras),
        )
    except (AssertionError, IndexError):
        return Reason.UNKNOWN
    keys = dispatcher.cudagraph_keys
    full_keys = keys.get(_full_key(keys), set())
    if full_desc in full_keys:
        # A FULL graph exists for this batch; only the allowed modes kept it off.
        if Mode.FULL in invalid:
            model_config = getattr(dispatcher.vllm_config, "model_config", None)
            if getattr(model_config, "is_encoder_decoder", False):
                return Reason.FORCED_EAGER
            return Reason.CASCADE_ATTENTION
        return Reason.FORCED_EAGER
    if lora_on:
        if _lora_variant_exists(full_keys, full_desc):
            return Reason.LORA_MISMATCH
        if mode_value(mode) == Mode.NONE and engine[1] == Mode.PIECEWISE:
            relaxed = replace(full_desc, num_reqs=None, uniform=False)
            pw_keys = keys.get(_piecewise_key(keys), set())
            if relaxed not in pw_keys and _lora_variant_exists(pw_keys, relaxed):
                return Reason.LORA_MISMATCH
    return _structural_reason(engine, uniform_decode, ctx)


def _full_key(keys: dict[Any, Any]) -> Any:
    return next((k for k in keys if mode_value(k) == Mode.FULL), None)


def _piecewise_key(keys: dict[Any, Any]) -> Any:
    return next((k for k in keys if mode_value(k) == Mode.PIECEWISE), None)


# ----------------------------------------------------------------------------------
# MRV2: CudaGraphManager (vllm/v1/worker/gpu/cudagraph_utils.py)


def _mrv2_uniform_compatible(cand: Any, uniform_token_count: int | None, max_q: int | None) -> bool:
    """The parts of ``_is_compatible`` that test the batch's shape, not its size."""
    if cand.uniform_token_count is not None and cand.uniform_token_count != uniform_token_count:
        return False
    cand_max_q = getattr(cand, "max_query_len", None)  # 0.33: varlen decode graphs
    return cand_max_q is None or (max_q is not None and cand_max_q >= max_q)


def mrv2_reason(
    manager: Any,
    desc: Any,
    *,
    num_reqs: int,
    num_tokens: int,
    uniform_token_count: int | None,
    num_active_loras: int = 0,
    max_query_len: int | None = None,
    num_ubatches: int = 1,
    ctx: GraphContext | None = None,
) -> Reason:
    """Why ``CudaGraphManager.dispatch`` returned ``desc`` for these inputs.

    The keyword arguments are the ones ``dispatch`` received. A uniform decode batch is
    one whose ``uniform_token_count`` equals ``manager.decode_query_len``. With DP the
    runner dispatches twice (local, then synced values); each call has its own reason.
    Profile and encoder steps never reach ``dispatch`` (``dispatch_cg_and_sync_dp``
    takes ``need_eager`` first), so a hook there records them without this function.
    """
    if mode_value(desc.cg_mode) == Mode.FULL:
        return Reason.HIT
    if isinstance(getattr(manager, "_decode_descs", None), dict):
        return _mrv2_table_reason(
            manager,
            num_reqs=num_reqs,
            num_tokens=num_tokens,
            uniform_token_count=uniform_token_count,
            num_active_loras=num_active_loras,
            max_query_len=max_query_len,
            num_ubatches=num_ubatches,
            ctx=ctx,
        )
    engine = mode_parts(manager.cudagraph_mode) or (Mode.NONE, Mode.NONE)
    dql = int(manager.decode_query_len)
    uniform = uniform_token_count is not None and uniform_token_count == dql
    max_size = manager.compilation_config.max_cudagraph_capture_size
    capture_sizes = manager.compilation_config.cudagraph_capture_sizes
    too_big = max_size is not None and num_tokens > max_size
    if engine == (Mode.NONE, Mode.NONE) or not capture_sizes:
        if too_big:
            return Reason.BATCH_TOO_BIG
        return _no_full_engine_reason(ctx, uniform, engine)
    if not getattr(manager, "_graphs_captured", False):
        return Reason.WARMUP_OR_PROFILE
    if num_tokens <= 0:
        return Reason.FORCED_EAGER  # a DP peer's empty dummy batch
    if too_big:
        return Reason.BATCH_TOO_BIG

    effective = manager._resolve_effective_loras(num_active_loras)
    candidates = manager._candidates.get((num_tokens, effective))
    if candidates is None:
        cases = getattr(manager, "lora_capture_cases", [0])
        if any((num_tokens, c) in manager._candidates for c in cases if c != effective):
            return Reason.LORA_MISMATCH
        return _structural_reason(engine, uniform, ctx)
    full = [c for c in candidates if mode_value(c.cg_mode) == Mode.FULL]
    if not full:
        return _structural_reason(engine, uniform, ctx)
    shaped = [c for c in full if _mrv2_uniform_compatible(c, uniform_token_count, max_query_len)]
    if not shaped:
        # Every FULL graph for this size wants a uniform (or bounded) decode batch.
        return _structural_reason(engine, False, ctx)
    if not any(getattr(c, "num_ubatches", 1) == num_ubatches for c in shaped):
        # 0.33: the DP ranks agreed on a microbatch split no FULL graph was captured for.
        return Reason.FORCED_EAGER
    return Reason.NO_FULL_KEY_FOR_SIZE


def _mrv2_table_reason(
    manager: Any,
    *,
    num_reqs: int,
    num_tokens: int,
    uniform_token_count: int | None,
    num_active_loras: int,
    max_query_len: int | None,
    num_ubatches: int,
    ctx: GraphContext | None,
) -> Reason:
    """``mrv2_reason`` for a manager with a decode table (vLLM 0.34 on).

    Uniform decode batches of query length ``q`` look their request count ``cdiv(tokens,
    q)`` up in ``_decode_descs[(q, loras, ubatches)]`` first (graphs by request count,
    from ``decode_cudagraph_capture_request_sizes``, up to ``max_num_seqs`` and the
    decode token budget); every batch then tries the token-keyed ``_candidates`` (from
    ``prefill_cudagraph_capture_token_sizes``). So "too big" is per kind of graph: a
    uniform decode batch past the decode table but within a prefill graph replays that
    one (no FULL key for its size), and a batch past every graph it can take runs eager.
    """
    engine = mode_parts(manager.cudagraph_mode) or (Mode.NONE, Mode.NONE)
    cc = manager.compilation_config
    max_size = cc.max_cudagraph_capture_size
    tables: dict[Any, Any] = manager._decode_descs
    queries = getattr(manager, "decode_max_reqs", None) or {int(manager.decode_query_len): 0}
    uniform = uniform_token_count is not None and uniform_token_count in queries
    prefill = sorted(getattr(cc, "prefill_cudagraph_capture_token_sizes", None) or ())
    largest_token_graph = max((k[0] for k in manager._candidates), default=0)
    if engine == (Mode.NONE, Mode.NONE) or not (tables or manager._candidates or prefill):
        if max_size is not None and num_tokens > max_size:
            return Reason.BATCH_TOO_BIG
        return _no_full_engine_reason(ctx, uniform, engine)
    if not getattr(manager, "_graphs_captured", False):
        return Reason.WARMUP_OR_PROFILE
    if num_tokens <= 0:
        return Reason.FORCED_EAGER  # a DP peer's empty dummy batch
    effective = manager._resolve_effective_loras(num_active_loras)
    if uniform and uniform_token_count is not None:
        n = -(-num_tokens // uniform_token_count)
        table = tables.get((uniform_token_count, effective, num_ubatches))
        if table is None:
            others = [k for k in tables if k[0] == uniform_token_count]
            if any(k[1] != effective for k in others):
                return Reason.LORA_MISMATCH
            if any(k[2] != num_ubatches for k in others):
                # the DP ranks agreed on a microbatch split no decode graph was captured for
                return Reason.FORCED_EAGER
        elif n < len(table):
            return Reason.UNKNOWN  # a decode graph holds it: dispatch would have taken it
    candidates = manager._candidates.get((num_tokens, effective))
    if candidates is None:
        cases = getattr(manager, "lora_capture_cases", [0])
        if any((num_tokens, c) in manager._candidates for c in cases if c != effective):
            return Reason.LORA_MISMATCH
        if uniform:  # a decode table too small for it says "no FULL key for its size"
            largest = max(
                [largest_token_graph, *(d.num_tokens for t in tables.values() for d in t)]
            )
            if num_tokens > largest:
                return Reason.BATCH_TOO_BIG
        elif manager._candidates and num_tokens > largest_token_graph:
            return Reason.BATCH_TOO_BIG  # past every prefill graph
        return _structural_reason(engine, uniform, ctx)
    full = [c for c in candidates if mode_value(c.cg_mode) == Mode.FULL]
    if not full:
        return _structural_reason(engine, uniform, ctx)
    shaped = [c for c in full if _mrv2_uniform_compatible(c, uniform_token_count, max_query_len)]
    if not shaped:
        return _structural_reason(engine, False, ctx)
    if not any(getattr(c, "num_ubatches", 1) == num_ubatches for c in shaped):
        return Reason.FORCED_EAGER
    return Reason.NO_FULL_KEY_FOR_SIZE


# ----------------------------------------------------------------------------------
# Static helpers


def min_support(
    builders_and_specs: Iterable[tuple[Any, Any]], vllm_config: Any = None
) -> tuple[int, str]:
    """Minimum AttentionCGSupport over attention groups, and the class that sets it.

    Items are ``(backend_or_builder_class, kv_cache_spec)``. Like the runners, it asks
    ``get_cudagraph_support(vllm_config, spec)`` (the class attribute when no config is
    given), starts from ALWAYS, and keeps the first class with the lowest value. The
    name is the backend's when a backend class is given (as vLLM logs it).
    """
    best, name = SUPPORT_ALWAYS, ""
    for owner, spec in builders_and_specs:
        getter: Callable[[], Any] | None = getattr(owner, "get_builder_cls", None)
        builder = getter() if getter is not None else owner
        if vllm_config is not None:
            support = builder.get_cudagraph_support(vllm_config, spec)
        else:
            support = builder._cudagraph_support
        value = _int_value(support)
        if value < best:
            best, name = value, owner.__name__
    return best, name


def split_from_metadata(
    cm: Any, threshold: int, require_uniform: bool, treat_short_extends_as_decodes: bool = True
) -> tuple[int, int, int, int]:
    """vLLM's own ``split_decodes_and_prefills`` on a ``CommonAttentionMetadata``.

    Returns ``(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens)`` as
    the builders compute it. CPU only: it reads ``query_start_loc_cpu``,
    ``max_query_len`` and ``is_prefilling``.
    """
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    nd, npf, ndt, npt = split_decodes_and_prefills(
        cm,
        decode_threshold=threshold,
        require_uniform=require_uniform,
        treat_short_extends_as_decodes=treat_short_extends_as_decodes,
    )
    return int(nd), int(npf), int(ndt), int(npt)


__all__ = [
    "MODE_NAMES",
    "SUPPORT_NAMES",
    "GraphContext",
    "min_support",
    "mode_parts",
    "mode_value",
    "mrv2_reason",
    "split_from_metadata",
    "v1_reason",
]
