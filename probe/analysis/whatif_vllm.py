"""What-if on the installed vLLM: loading it on any machine (a CPU one included), building
its graph settings and its runner's dispatcher from a recording's engine, whatever the
release's signatures (:mod:`probe.analysis.whatif` replays the shapes through them)."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import logging
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from probe.analysis.capture_sizes import SPLIT_SIZE_FIELDS
from probe.analysis.whatif_settings import (
    Applied,
    Engine,
    VllmError,
    WhatIfError,
    flag,
)
from probe.records import Mode, Reason
from probe.step import Step


@dataclass
class Vllm:
    """The installed vLLM's classes the replay uses."""

    version: str
    config: Any
    support: Any  # AttentionCGSupport
    dispatcher: Any  # CudagraphDispatcher; None until a V1 recording needs it
    manager: Any  # ModelCudaGraphManager, or None where MRV2 is not importable
    manager_error: str = ""
    platform: str = ""  # the platform vLLM runs the replay on, and who chose it

    def new_config(self) -> Any:
        """A default ``VllmConfig``; :class:`VllmError` where vLLM cannot make one."""
        try:
            return self.config.VllmConfig()
        except Exception as exc:  # e.g. no platform: a GPU build without its GPU
            raise VllmError(
                f"vLLM {self.version} cannot make a VllmConfig here "
                f"({self.platform or 'its platform'}): {one_line(exc)}"
            ) from None

    def v1_dispatcher(self) -> Any:
        """The classic runner's ``CudagraphDispatcher``, imported on first use: a vLLM
        without the classic runner (Model Runner V2 only) is never asked for it."""
        if self.dispatcher is None:
            if not has_module("vllm.v1.cudagraph_dispatcher"):
                raise VllmError(
                    f"the recording ran the classic runner (V1), which vLLM {self.version} "
                    "does not have (Model Runner V2 is its only runner): replay it with a "
                    "vLLM that has V1 (0.26 to 0.33)"
                )
            with contextlib.redirect_stdout(sys.stderr):
                from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
            self.dispatcher = CudagraphDispatcher
        return self.dispatcher


def has_module(name: str) -> bool:
    """Whether the installed vLLM ships module ``name`` (imports its parent packages only)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def select_platform() -> str:
    """Pick the platform vLLM replays on before anything binds it; returns how.

    The replay builds configs and graph managers on ``device="cpu"`` and needs no GPU,
    but vLLM's own platform detection finds none for a GPU build on a CPU-only host
    (0.26 to 0.32 look for "cpu" in the build's version string only; 0.33 on honour
    ``VLLM_TARGET_DEVICE=cpu``). Where detection finds no platform, this binds vLLM's
    own ``CpuPlatform`` as ``vllm.platforms.current_platform`` (the lazily resolved
    global vLLM's platform plugins fill). On x86 the CPU platform of 0.34 refuses to
    configure without Triton (its code raises where ``HAS_TRITON`` is false); Triton's
    CPU backend is not on PyPI, so where the GPU ``triton`` package is importable this
    process hides the GPUs (``CUDA_VISIBLE_DEVICES=""``), which vLLM's Triton check
    accepts as a worker whose devices are not visible yet. A platform vLLM
    found (a GPU, or a CPU build) is kept as it is."""
    import os

    with contextlib.redirect_stdout(sys.stderr):
        try:
            import vllm.platforms as platforms
        except Exception as exc:
            raise VllmError(
                "needs vLLM 0.26 to 0.34 importable (pip install vllm, or a vLLM tree on "
                f"PYTHONPATH): {one_line(exc)}"
            ) from None
        # ``import vllm`` itself may resolve the platform (0.26: for PIN_MEMORY); none of
        # the modules it imports binds it by name, so "none found" can still be replaced
        bound = getattr(platforms, "_current_platform", None)
        if bound is not None and type(bound).__name__ != "UnspecifiedPlatform":
            return f"{type(bound).__name__} (detected by vLLM)"
        how = "detected by vLLM"
        qualname = (
            str(platforms.resolve_current_platform_cls_qualname())
            if bound is None
            else "UnspecifiedPlatform"
        )
        if qualname.endswith("UnspecifiedPlatform"):
            qualname, how = "vllm.platforms.cpu.CpuPlatform", "no device found: vLLM's CPU platform"
        cls = platforms.resolve_obj_by_qualname(qualname)  # type: ignore[attr-defined]
        if (
            cls.__name__ == "CpuPlatform"
            and "vllm.triton_utils" not in sys.modules
            and "CUDA_VISIBLE_DEVICES" not in os.environ
            and _cpu_platform_requires_triton(cls)
            and cls.get_cpu_architecture().name == "X86"
            and importlib.util.find_spec("triton") is not None
        ):
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
            how += '; x86 without Triton\'s CPU backend: CUDA_VISIBLE_DEVICES=""'
        platforms._current_platform = cls()
        return f"{cls.__name__} ({how})"


def _cpu_platform_requires_triton(cls: type) -> bool:
    """Whether this vLLM's CPU platform refuses to configure without Triton, read from its
    code: ``check_and_update_config`` raises under a test of ``HAS_TRITON`` (0.34; 0.33
    only warns there)."""
    import ast
    import textwrap

    try:
        src = textwrap.dedent(inspect.getsource(cls.check_and_update_config))  # type: ignore[attr-defined]
        tree = ast.parse(src)
    except (OSError, TypeError, AttributeError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and "HAS_TRITON" in ast.unparse(node.test)
            and any(isinstance(n, ast.Raise) for b in node.body for n in ast.walk(b))
        ):
            return True
    return False


def load_vllm() -> Vllm:
    """Import the installed vLLM (its log lines go to stderr, not into the output).

    Only what every supported release has is imported here; the classic runner's
    dispatcher is imported when a V1 recording asks for it (:meth:`Vllm.v1_dispatcher`).
    """
    platform = select_platform()
    with contextlib.redirect_stdout(sys.stderr):
        try:
            import vllm
            import vllm.config as config
            from vllm.v1.attention.backend import AttentionCGSupport
        except Exception as exc:  # ImportError, or a platform vLLM cannot set up here
            raise VllmError(
                "needs vLLM 0.26 to 0.34 importable (pip install vllm, or a vLLM tree on "
                f"PYTHONPATH): {one_line(exc)}"
            ) from None
        manager: Any = None
        why = ""
        try:
            import vllm.v1.worker.gpu.cudagraph_utils as mrv2

            manager = mrv2.ModelCudaGraphManager
        except Exception as exc:
            why = one_line(exc)
    return Vllm(str(vllm.__version__), config, AttentionCGSupport, None, manager, why, platform)


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


@contextlib.contextmanager
def quiet_vllm() -> Iterator[None]:
    """vLLM's own log lines and prints held back, for a command that imports vLLM in
    ``probe``'s process (``probe whatif`` without ``--verbose``).

    vLLM's logging is left unconfigured (``VLLM_CONFIGURE_LOGGING=0`` unless the
    environment sets it) and its records end at the ``vllm`` logger, so the warnings the
    replay keeps for its output (on ``vllm.config.*``) still reach it; what vLLM prints goes
    nowhere. Everything is as it was afterwards."""
    import os

    log = logging.getLogger("vllm")
    handlers, propagate = log.handlers[:], log.propagate
    configure = os.environ.get("VLLM_CONFIGURE_LOGGING")
    if configure is None:
        os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    log.handlers = [logging.NullHandler()]
    log.propagate = False
    try:
        with (
            open(os.devnull, "w", encoding="utf-8") as sink,
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            yield
    finally:
        log.handlers, log.propagate = handlers, propagate
        if configure is None:
            os.environ.pop("VLLM_CONFIGURE_LOGGING", None)


@contextlib.contextmanager
def _vllm_warnings(into: list[str]) -> Iterator[None]:
    """vLLM's own warnings from the resolver, kept for the output instead of printed."""
    logs = [logging.getLogger(n) for n in ("vllm.config.compilation", "vllm.config.vllm")]

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            into.append(" ".join(record.getMessage().split()))

    handler, was = _Keep(logging.WARNING), [log.propagate for log in logs]
    for log in logs:
        log.addHandler(handler)
        log.propagate = False
    try:
        yield
    finally:
        for log, prop in zip(logs, was, strict=True):
            log.removeHandler(handler)
            log.propagate = prop


@contextlib.contextmanager
def mrv2_context(vl: Vllm) -> Iterator[None]:
    """What ``ModelCudaGraphManager.__init__`` needs from its process: a pipeline group
    (``get_pp_group()``; a one-rank gloo group on a file store, made here when none
    exists) and the platform's graph-pool handle, which only ``capture()`` uses (an
    opaque placeholder where the platform has none, e.g. CPU)."""
    from vllm.distributed import parallel_state
    from vllm.platforms import current_platform

    ps: Any = parallel_state
    platform = type(current_platform)
    pool_was = getattr(platform, "_global_graph_pool", None)
    if pool_was is None:
        platform._global_graph_pool = object()
    made = False
    with tempfile.TemporaryDirectory(prefix="probe-whatif-") as tmp:
        try:
            if not ps.model_parallel_is_initialized():
                try:
                    with vl.config.set_current_vllm_config(vl.new_config()):
                        ps.init_distributed_environment(
                            world_size=1,
                            rank=0,
                            local_rank=0,
                            distributed_init_method=f"file://{tmp}/store",
                            backend="gloo",
                        )
                        made = True
                        ps.ensure_model_parallel_initialized(1, 1)
                except VllmError:
                    raise
                except Exception as exc:
                    raise VllmError(
                        f"vLLM {vl.version}: no one-rank gloo group for MRV2's graph manager "
                        f"here: {one_line(exc)}"
                    ) from None
            yield
        finally:
            if made:
                ps.destroy_model_parallel()
                ps.destroy_distributed_environment()
            platform._global_graph_pool = pool_was


@dataclass
class Graphs:
    """What vLLM made of one :class:`Applied`: the resolved mode, the sizes it kept, and a
    ``decide(step) -> (mode, reason, padded tokens, padded requests)`` by its dispatcher."""

    resolved_mode: str
    capture_sizes: tuple[int, ...]
    max_capture_size: int
    messages: list[str]
    decide: Callable[[Step], tuple[Mode, Reason, int, int]]
    vllm_version: str
    memo: dict[tuple[int, int, int, bool], tuple[Mode, Reason, int, int]] = field(
        default_factory=dict
    )
    #: the split graph sizes vLLM resolved (where it has them)
    split: tuple[tuple[str, Any], ...] = ()

    def __call__(self, s: Step) -> tuple[Mode, Reason, int, int]:
        key = (s.num_tokens, s.num_reqs, s.max_query_len, s.uniform)
        if key not in self.memo:
            try:
                self.memo[key] = self.decide(s)
            except Exception as exc:
                raise VllmError(
                    f"vLLM {self.vllm_version}'s dispatch failed on step {s.step} of pid "
                    f"{s.pid} ({s.num_tokens} tokens, {s.num_reqs} requests): {one_line(exc)}"
                ) from None
        return self.memo[key]


def build(vl: Vllm, engine: Engine, a: Applied) -> Graphs:
    """Resolve ``a`` with vLLM's resolver and build the runner's real dispatcher."""
    from probe.reasons import GraphContext, mode_value, mrv2_reason, v1_reason

    cfg = vl.config
    vc = vl.new_config()
    vc.scheduler_config.max_num_seqs = engine.max_num_seqs
    if engine.max_num_batched_tokens:
        vc.scheduler_config.max_num_batched_tokens = engine.max_num_batched_tokens
    cc = vc.compilation_config
    cc.cudagraph_mode = cfg.CUDAGraphMode[a.requested_mode]
    cc.cudagraph_capture_sizes = list(a.capture_sizes)
    cc.max_cudagraph_capture_size = a.max_capture_size
    cc.use_inductor_graph_partition = False
    cc.mode = cfg.CompilationMode[engine.compile_mode]
    # vLLM's default splitting ops for this compilation mode (VLLM_COMPILE: at attention,
    # which lets the resolver fall back to PIECEWISE rather than NONE), by its own code
    cc.splitting_ops = None
    cc.set_splitting_ops_for_v1(
        all2all_backend=vc.parallel_config.all2all_backend, data_parallel_size=1
    )
    messages: list[str] = []
    with _vllm_warnings(messages):
        split_sizes(vl, vc, engine, a)
    support = vl.support(a.min_support)
    v2 = engine.runner == "mrv2"
    resolve = cc.resolve_cudagraph_mode_and_sizes
    params = inspect.signature(resolve).parameters
    kw: dict[str, Any] = {"uniform_decode_query_len": engine.uq}
    if "use_v2_model_runner" in params:  # 0.26 to 0.33; 0.34 has MRV2 only
        kw["use_v2_model_runner"] = v2
    if "piecewise_capture_available" in params and engine.breakable is not None:
        # MRV2: breakable graphs or a compiled model (VLLM_COMPILE) capture PIECEWISE
        kw["piecewise_capture_available"] = (
            engine.breakable or engine.compile_mode == "VLLM_COMPILE"
        )
    try:
        with _vllm_warnings(messages):
            mode = resolve(support, a.min_backend, **kw)
    except ValueError as exc:
        raise WhatIfError(f"vLLM refuses this setting: {' '.join(str(exc).split())}") from None
    ctx = GraphContext(a.requested_mode, mode.name, a.min_support, a.min_backend, engine.uq)

    def out(m: Any, reason: Reason, desc: Any) -> tuple[Mode, Reason, int, int]:
        return Mode(mode_value(m)), Reason(reason), int(desc.num_tokens), int(desc.num_reqs or 0)

    if not v2:
        try:
            d = vl.v1_dispatcher()(vc)
        except AssertionError as exc:
            raise WhatIfError(f"vLLM refuses this setting: {' '.join(str(exc).split())}") from None
        # no SpeculativeConfig here (it needs the target model): the runner hands the
        # dispatcher 1 + k itself, and __init__ would read 0 speculative tokens
        d.uniform_decode_query_len = engine.uq
        d.initialize_cudagraph_keys(mode, uniform_decode_query_len=engine.uq)

        def decide(s: Step) -> tuple[Mode, Reason, int, int]:
            m, desc = d.dispatch(num_tokens=s.num_tokens, uniform_decode=s.uniform)
            why = v1_reason(d, m, desc, num_tokens=s.num_tokens, uniform_decode=s.uniform, ctx=ctx)
            return out(m, why, desc)

    else:
        if vl.manager is None:
            raise VllmError(
                f"the recording is MRV2 but vLLM {vl.version}'s ModelCudaGraphManager does "
                f"not import here: {vl.manager_error}"
            )
        import torch

        mgr = vl.manager(vc, torch.device("cpu"), mode, **decode_query_kwargs(vl, vc, engine.uq))
        mgr._graphs_captured = True  # capture() needs the GPU; this flag is all it leaves
        has_max_q = "max_query_len" in inspect.signature(mgr.dispatch).parameters

        def decide(s: Step) -> tuple[Mode, Reason, int, int]:
            # the recording keeps whether the batch was uniform decode, which is all the
            # candidates compare; a longer query than 1 + k means a prefill, whose
            # max_query_len vLLM >= 0.33 does not pass (its varlen decode graphs)
            utc = engine.uq if s.uniform else None
            kw: dict[str, Any] = {}
            if has_max_q:
                kw["max_query_len"] = s.max_query_len if s.max_query_len <= engine.uq else None
            desc = mgr.dispatch(s.num_reqs, s.num_tokens, utc, 0, **kw)
            why = mrv2_reason(
                mgr, desc, num_reqs=s.num_reqs, num_tokens=s.num_tokens,
                uniform_token_count=utc, ctx=ctx, **kw,
            )  # fmt: skip
            return out(desc.cg_mode, why, desc)

    sizes = tuple(cc.cudagraph_capture_sizes or ())
    top = int(cc.max_cudagraph_capture_size or 0)
    split = tuple(
        (k, tuple(v) if isinstance(v, list) else v)
        for k in SPLIT_SIZE_FIELDS
        if (v := getattr(cc, k, None)) is not None
    )
    return Graphs(mode.name, sizes, top, messages, decide, vl.version, split=split)


def has_split_sizes(vl: Vllm) -> bool:
    """Whether the installed vLLM sizes MRV2's graphs by the split fields (0.34 on)."""
    fields = getattr(vl.config.CompilationConfig, "__dataclass_fields__", None) or {}
    return all(k in fields for k in SPLIT_SIZE_FIELDS)


def split_sizes(vl: Vllm, vc: Any, engine: Engine, a: Applied) -> None:
    """Set the split graph sizes of ``a`` on ``vc`` the way vLLM resolves them at start-up
    (``VllmConfig._split_cudagraph_capture_sizes``, after the shared sizes), where the
    installed vLLM has them. Its own refusals are :class:`WhatIfError`."""
    if not has_split_sizes(vl):
        if a.split and not (a.legacy and dict(a.split) == dict(engine.split)):
            names = ", ".join(flag(k) for k, _ in a.split)
            raise WhatIfError(
                f"{names}: vLLM {vl.version} has no such setting (it sizes every graph by "
                "cudagraph_capture_sizes: give --capture-sizes)"
            )
        return
    split = getattr(vc, "_split_cudagraph_capture_sizes", None)
    lens = getattr(vc, "get_decode_cudagraph_query_lens", None)
    if split is None or lens is None:
        raise VllmError(
            f"vLLM {vl.version} has the split graph sizes but not the VllmConfig methods "
            "that resolve them (_split_cudagraph_capture_sizes, "
            "get_decode_cudagraph_query_lens): the what-if does not know this release"
        )
    cc = vc.compilation_config
    for k in SPLIT_SIZE_FIELDS:
        setattr(cc, k, None)
    for k, v in a.split:
        setattr(cc, k, list(v) if isinstance(v, tuple) else v)
    if cc.cudagraph_mode is None or cc.cudagraph_mode.name == "NONE":
        return  # vLLM resolves no sizes for an engine without graphs
    try:
        split(a.legacy, lens(engine.uq))
    except ValueError as exc:
        raise WhatIfError(f"vLLM refuses this setting: {' '.join(str(exc).split())}") from None


def decode_query_kwargs(vl: Vllm, vc: Any, uq: int) -> dict[str, Any]:
    """The decode query length(s) the installed graph manager takes, as its runner passes
    them: 0.34 ``decode_query_lens`` (query length -> most requests, by vLLM's
    ``get_decode_cudagraph_query_lens``), before that ``decode_query_len``."""
    params = inspect.signature(vl.manager.__init__).parameters
    if "decode_query_lens" in params:
        lens = getattr(vc, "get_decode_cudagraph_query_lens", None)
        return {
            "decode_query_lens": lens(uq)
            if lens is not None
            else {uq: vc.scheduler_config.max_num_seqs}
        }
    return {"decode_query_len": uq}
