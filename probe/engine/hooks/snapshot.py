"""The static picture (the ``doctor`` view), the resolve hook, and the what-if override.

Supports vLLM 0.26 to 0.34 (0.34: Model Runner V2's split graph sizes and its decode
graphs by request count, breakable graphs from the compilation config).

- ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` is wrapped from plugin load on,
  always (it runs once per process at start-up, so it costs nothing per step): it records
  the mode asked for, the minimum attention support and the backend that set it, and the
  mode vLLM resolved to. This is the only place the *reason* for a downgrade exists.
- ``AttentionMetadataBuilder._init_reorder_batch_threshold`` is wrapped the same way (once
  per builder, at KV-cache init): what each builder asked for (the threshold and whether
  it counts speculative tokens as decodes) is kept per builder object, so the snapshot
  reads the speculative-as-decode flag from the builder's own call instead of inferring
  it from the resulting threshold.
- The what-if override (``PROBE_CG_SUPPORT_OVERRIDE`` or ``probe ab``) sets a builder's
  graph support before that resolve runs, so the same workload can be measured both ways.
- :func:`take_snapshot` reads the live runner on the first enabled step: version, runner,
  platform, ranks, every attention group's builder with its declared and effective graph
  support, the minimum and the group that limits it, capture sizes, thresholds, and
  known traps.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from probe.calls import SPLIT_SIZE_FIELDS
from probe.engine.hooks._base import Family, Hook, Target, resolve_owner
from probe.engine.identity import live_ranks, model_name
from probe.engine.runtime import RT

SUPPORT_NAMES = ("NEVER", "UNIFORM_SINGLE_TOKEN_DECODE", "UNIFORM_BATCH", "ALWAYS")

# Builders a user is likely to name in an override, by class name.
KNOWN_BUILDERS: Mapping[str, str] = {
    "ROCMAiterMLASparseMetadataBuilder": "vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse",
    "FlashMLASparseMetadataBuilder": "vllm.v1.attention.backends.mla.flashmla_sparse",
    "FlashAttnMLASparseMetadataBuilder": "vllm.v1.attention.backends.mla.flashattn_mla_sparse",
    "FlashInferMLASparseMetadataBuilder": "vllm.v1.attention.backends.mla.flashinfer_mla_sparse",
    "DeepseekV32IndexerMetadataBuilder": "vllm.v1.attention.backends.mla.indexer",
    "FlashMLAMetadataBuilder": "vllm.v1.attention.backends.mla.flashmla",
    "CutlassMLAMetadataBuilder": "vllm.v1.attention.backends.mla.cutlass_mla",
    "TritonMLAMetadataBuilder": "vllm.v1.attention.backends.mla.triton_mla",
    "FlashAttentionMetadataBuilder": "vllm.v1.attention.backends.flash_attn",
}


class OverrideError(ValueError):
    """A what-if override names an unknown builder or support level."""


_EXAMPLE = "vllm.v1.attention.backends.mla.flashmla_sparse:FlashMLASparseMetadataBuilder"


def parse_override(text: str) -> list[tuple[str, str, str]]:
    """``"Builder=SUPPORT[,...]"`` -> [(module, class, SUPPORT)]; raises OverrideError."""
    out = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in item:
            raise OverrideError(f"{item!r}: expected Builder=SUPPORT")
        name, support = (s.strip() for s in item.split("=", 1))
        support = support.upper()
        if support not in SUPPORT_NAMES:
            raise OverrideError(f"{item!r}: support must be one of {', '.join(SUPPORT_NAMES)}")
        if ":" in name:
            module, cls = (s.strip() for s in name.split(":", 1))
            if not all(p.isidentifier() for p in (*module.split("."), *cls.split("."))):
                raise OverrideError(f"{name!r}: expected module:Class (e.g. {_EXAMPLE})")
        elif name in KNOWN_BUILDERS:
            module, cls = KNOWN_BUILDERS[name], name
        else:
            known = ", ".join(sorted(KNOWN_BUILDERS))
            raise OverrideError(f"{name!r}: unknown builder; use module:Class or one of {known}")
        out.append((module, cls, support))
    return out


def apply_override(text: str) -> list[dict[str, str]]:
    """Set each named builder's graph support. Returns what was applied (for the snapshot).

    Both the class attribute and ``get_cudagraph_support`` are replaced: some builders
    (the V3.2 indexer) decide in the method and ignore the attribute.
    """
    applied = []
    for module, cls_name, support in parse_override(text):
        try:
            cls = resolve_owner(module, cls_name)
            enum = resolve_owner("vllm.v1.attention.backend", "AttentionCGSupport")
        except LookupError as exc:
            raise OverrideError(str(exc)) from None
        value = enum[support]
        before = getattr(cls, "_cudagraph_support", None)
        cls._cudagraph_support = value

        def get_cudagraph_support(klass: Any, /, *args: Any, _v: Any = value, **kw: Any) -> Any:
            return _v

        cls.get_cudagraph_support = classmethod(get_cudagraph_support)
        applied.append(
            {
                "builder": cls_name,
                "module": module,
                "support": support,
                "was": getattr(before, "name", str(before)),
            }
        )
    RT.static["override"] = applied
    return applied


def resolve_hook(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    """Always on: one call per process at start-up."""

    def resolve_cudagraph_mode_and_sizes(self: Any, *args: Any, **kwargs: Any) -> Any:
        requested = getattr(self.cudagraph_mode, "name", None)
        result = orig(self, *args, **kwargs)
        try:
            support = args[0] if args else kwargs.get("min_cg_support")
            backend = args[1] if len(args) > 1 else kwargs.get("min_cg_attn_backend")
            uq = args[2] if len(args) > 2 else kwargs.get("uniform_decode_query_len", 1)
            # vLLM may resolve more than once (the runner re-resolves after KV-cache init):
            # the mode the user asked for is the input of the first call.
            first = RT.static.get("resolve") or {}
            RT.static["resolve"] = {
                "requested_mode": first.get("requested_mode", requested),
                "resolved_mode": getattr(result, "name", str(result)),
                "min_cg_support": getattr(support, "name", str(support)),
                "min_cg_support_value": getattr(support, "value", None),
                "min_cg_attn_backend": backend,
                "uniform_decode_query_len": uq,
            }
            RT.graph_ctx = None  # rebuilt from the new facts
        except Exception as exc:
            hook.fail(exc)
        return result

    return resolve_cudagraph_mode_and_sizes


# id(builder) -> (weak reference to it, what its _init_reorder_batch_threshold was given)
_REORDER_INIT: dict[int, tuple[Any, dict[str, Any]]] = {}


def reorder_init_hook(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    """Always on: once per builder. Keeps the call's arguments and the threshold it set."""
    sig = inspect.signature(orig)

    def _init_reorder_batch_threshold(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = orig(self, *args, **kwargs)
        try:
            bound = sig.bind(self, *args, **kwargs)
            bound.apply_defaults()
            given = {k: v for k, v in bound.arguments.items() if k != "self"}
            given["result"] = getattr(self, "reorder_batch_threshold", None)
            if len(_REORDER_INIT) >= 4096:
                _REORDER_INIT.clear()
            _REORDER_INIT[id(self)] = (weakref.ref(self), given)
        except Exception as exc:
            hook.fail(exc)
        return result

    return _init_reorder_batch_threshold


def reorder_init_of(builder: Any) -> dict[str, Any] | None:
    """What ``builder``'s ``_init_reorder_batch_threshold`` was called with (None: not seen)."""
    entry = _REORDER_INIT.get(id(builder))
    if entry is None or entry[0]() is not builder:
        return None
    return entry[1]


TARGETS: tuple[Target, ...] = (
    Target(
        "static.reorder_init",
        "vllm.v1.attention.backend",
        "AttentionMetadataBuilder",
        "_init_reorder_batch_threshold",
        reorder_init_hook,
    ),
    Target(
        "static.resolve",
        "vllm.config.compilation",
        "CompilationConfig",
        "resolve_cudagraph_mode_and_sizes",
        resolve_hook,
    ),
)


# -- the snapshot -------------------------------------------------------------------------


def _name(v: Any) -> Any:
    return getattr(v, "name", v if isinstance(v, (int, float, str, bool, type(None))) else str(v))


def _groups(runner: Any) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for tag, holder, attr in (
        ("target", runner, "attn_groups"),
        ("drafter", getattr(runner, "drafter", None), "draft_attn_groups"),
        ("drafter", getattr(runner, "speculator", None), "attn_groups"),
    ):
        groups = getattr(holder, attr, None) if holder is not None else None
        if not groups:
            continue
        for g in groups:
            for group in g if isinstance(g, (list, tuple)) else (g,):
                out.append((tag, group))
    return out


def _misspelled(cls: type) -> list[str]:
    """Attributes that look like graph support but are not the one vLLM reads."""
    bad = []
    for klass in cls.__mro__:
        for attr in vars(klass):
            low = attr.lower()
            if (
                ("cudagraph" in low.replace("_", "") or "cuda_graph" in low)
                and "support" in low
                and attr not in ("_cudagraph_support", "get_cudagraph_support")
            ):
                bad.append(f"{klass.__name__}.{attr}")
    return bad


def take_snapshot(runner: Any) -> dict[str, Any]:
    snap: dict[str, Any] = {"pid": os.getpid()}
    try:
        import vllm

        snap["vllm_version"] = getattr(vllm, "__version__", "unknown")
    except Exception:
        snap["vllm_version"] = "unknown"
    mod = type(runner).__module__
    snap["runner"] = (
        "mrv2" if ".worker.gpu.model_runner" in mod or ".cpu.model_runner" in mod else "v1"
    )
    snap["runner_class"] = f"{mod}.{type(runner).__qualname__}"
    vc = getattr(runner, "vllm_config", None)
    try:
        from vllm.platforms import current_platform

        snap["platform"] = (
            str(getattr(current_platform, "device_name", "")) or type(current_platform).__name__
        )
    except Exception:
        snap["platform"] = "unknown"
    snap.update(live_ranks())
    mc = getattr(vc, "model_config", None)
    served = str(getattr(mc, "served_model_name", None) or getattr(mc, "model", ""))
    snap["model"] = model_name(served)
    # as vLLM labels its own metrics (model_name): the metrics join on it
    snap["served_model_name"] = served
    cc = getattr(vc, "compilation_config", None)
    sc = getattr(vc, "scheduler_config", None)
    spec = getattr(vc, "speculative_config", None)
    k = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
    uq = (
        getattr(runner, "uniform_decode_query_len", None)
        or getattr(runner, "decode_query_len", None)
        or 1 + k
    )
    snap["speculative"] = {"method": getattr(spec, "method", None), "k": k} if spec else None
    snap["uniform_decode_query_len"] = uq
    sizes = list(getattr(cc, "cudagraph_capture_sizes", None) or [])
    snap["compilation"] = {
        "mode": _name(getattr(cc, "mode", None)),
        "cudagraph_mode": _name(getattr(cc, "cudagraph_mode", None)),
        "cudagraph_capture_sizes": sizes,
        "max_cudagraph_capture_size": getattr(cc, "max_cudagraph_capture_size", None),
        "breakable_cudagraph": breakable_cudagraph(cc),
        **split_sizes(cc),
    }
    decode_graphs = decode_graph_requests(getattr(runner, "cudagraph_manager", None))
    if decode_graphs is not None:
        snap["decode_graphs"] = decode_graphs
    snap["max_num_seqs"] = getattr(sc, "max_num_seqs", None)
    snap["chunked_prefill"] = getattr(sc, "enable_chunked_prefill", None)
    snap["max_num_batched_tokens"] = getattr(sc, "max_num_batched_tokens", None)
    snap["reorder_batch_threshold"] = getattr(runner, "reorder_batch_threshold", None)
    snap["resolve"] = RT.static.get("resolve")
    snap["override"] = RT.static.get("override", [])
    groups = []
    for tag, group in _groups(runner):
        builders = list(getattr(group, "metadata_builders", None) or [])
        if not builders and hasattr(group, "get_metadata_builder"):
            try:
                builders = [group.get_metadata_builder()]
            except Exception:
                builders = []
        b = builders[0] if builders else None
        entry: dict[str, Any] = {
            "role": tag,
            "backend": _backend_name(getattr(group, "backend", None)),
            "builder": type(b).__name__ if b is not None else None,
            "layers": len(getattr(group, "layer_names", []) or []),
        }
        if b is not None:
            cls = type(b)
            entry["declared_support"] = _name(getattr(cls, "_cudagraph_support", None))
            try:
                eff = cls.get_cudagraph_support(vc, group.kv_cache_spec)
                entry["support"] = _name(eff)
                entry["support_value"] = int(eff.value)
            except Exception as exc:
                entry["support"] = f"error: {exc}"
            entry["reorder_batch_threshold"] = getattr(b, "reorder_batch_threshold", None)
            init = reorder_init_of(b)
            # None: the builder never called _init_reorder_batch_threshold while the probe
            # watched (e.g. the V3.2 indexer opts out), or the probe loaded after it did.
            entry["spec_as_decode"] = None if init is None else init.get("supports_spec_as_decode")
            entry["reorder_threshold_requested"] = (
                None if init is None else init.get("reorder_batch_threshold")
            )
            entry["misspelled"] = _misspelled(cls)
            entry["support_set_on_class"] = "_cudagraph_support" in vars(cls)
            entry["support_follows_attribute"] = support_follows_attribute(
                cls, vc, getattr(group, "kv_cache_spec", None)
            )
        entry["support_on_non_builder"] = support_on_non_builder(getattr(group, "backend", None))
        groups.append(entry)
    snap["groups"] = groups
    target = [g for g in groups if g["role"] == "target" and "support_value" in g]
    if target:
        low = min(target, key=lambda g: g["support_value"])
        snap["min_support"] = low["support"]
        snap["min_support_value"] = low["support_value"]
        snap["limiting_group"] = {"backend": low["backend"], "builder": low["builder"]}
    return snap


def split_sizes(cc: Any) -> dict[str, Any]:
    """The split graph sizes as resolved, where the compilation config has them."""
    out: dict[str, Any] = {}
    for name in SPLIT_SIZE_FIELDS:
        if hasattr(cc, name):
            v = getattr(cc, name)
            out[name] = list(v) if isinstance(v, (list, tuple)) else v
    return out


def breakable_cudagraph(cc: Any) -> Any:
    """Whether breakable CUDA graphs are on: the compilation config's own setting where
    it has one (vLLM 0.34 on: resolved at start-up, no longer written to the
    environment), else ``VLLM_USE_BREAKABLE_CUDAGRAPH`` as the process has it."""
    value = getattr(cc, "use_breakable_cudagraph", None)
    if isinstance(value, bool):
        return value
    return os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH")


def decode_graph_requests(manager: Any) -> dict[str, list[int]] | None:
    """MRV2's uniform-decode graphs by request count, per decode query length, from the
    manager's ``_decode_descs`` table (vLLM 0.34 on; None before): ``{"2": [1, 2, 4]}``."""
    table = getattr(manager, "_decode_descs", None)
    if not isinstance(table, dict):
        return None
    out: dict[str, set[int]] = {}
    for key, descs in table.items():
        q = str(key[0] if isinstance(key, tuple) else key)
        out.setdefault(q, set()).update(
            int(d.num_reqs) for d in descs if getattr(d, "num_reqs", None) is not None
        )
    return {q: sorted(v) for q, v in sorted(out.items())}


def support_follows_attribute(cls: type, vllm_config: Any, kv_cache_spec: Any) -> bool | None:
    """Whether ``cls.get_cudagraph_support()`` returns what ``_cudagraph_support`` says.

    Asked of two throw-away subclasses that set the attribute to two different levels
    (the class itself is not touched); None when the method cannot be called here.
    """
    try:
        enum = type(cls._cudagraph_support)  # type: ignore[attr-defined]
        answers = []
        for level in (enum(0), enum(3)):
            probe_cls: Any = type(f"_{cls.__name__}Probe", (cls,), {"_cudagraph_support": level})
            answers.append(probe_cls.get_cudagraph_support(vllm_config, kv_cache_spec) is level)
    except Exception:
        return None
    return all(answers)


def support_on_non_builder(backend: Any) -> list[str]:
    """Backend and impl classes that set ``_cudagraph_support`` themselves (never read)."""
    if backend is None:
        return []
    classes = [backend]
    with contextlib.suppress(Exception):
        classes.append(backend.get_impl_cls())
    return [c.__name__ for c in classes if "_cudagraph_support" in vars(c)]


def _backend_name(backend: Any) -> str | None:
    if backend is None:
        return None
    try:
        return str(backend.get_name())
    except Exception:
        return getattr(backend, "__name__", str(backend))


def snapshot_json(runner: Any) -> bytes:
    return json.dumps(take_snapshot(runner), default=str).encode()


FAMILY = Family("static", "0.26-0.34", TARGETS)
TARGETS = FAMILY.targets  # each marked with its family
