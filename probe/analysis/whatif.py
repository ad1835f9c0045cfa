"""What-if: a recording's batch shapes replayed through the installed vLLM's own graph dispatch.

Each recorded forward step of the target model is one batch shape (tokens, requests,
longest query, uniform decode or not). :func:`whatif` builds, from the recording's static
snapshot, the engine's graph settings (the requested ``cudagraph_mode``, capture sizes,
``max_num_seqs``, each attention group's graph support, 1 + k), changes the ones a
:class:`Setting` names, and hands them to vLLM's own code:

1. ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` on a real ``VllmConfig``, with
   the minimum support over the attention groups (V1: every group, as
   ``_check_and_update_cudagraph_mode`` takes them; MRV2: the target model's groups, as
   ``init_attn_backend`` does): the resolved mode and, on V1 with FULL decode graphs and
   MTP, the capture sizes rounded to multiples of 1 + k;
2. the runner's real dispatcher built from that mode: V1's ``CudagraphDispatcher`` with
   ``initialize_cudagraph_keys``; MRV2's ``ModelCudaGraphManager`` (its own ``__init__``
   and ``_init_candidates``, on ``device="cpu"``, inside a one-rank gloo group it needs
   for ``get_pp_group()``; the graphs are marked captured, as ``capture()`` ends);
3. its ``dispatch`` for every recorded shape, and the miss reason from
   :mod:`probe.reasons`, as the probe's hooks compute it in a live engine.

Steps whose reason is not decided by the batch shape (``warmup_or_profile``,
``forced_eager``, ``cascade_attention``, ``lora_mismatch``) keep their recorded mode and
reason (:data:`KEPT`). Every derived number comes from :mod:`probe.analysis.views` over the
replayed :class:`~probe.step.Step` objects. Nothing here imports vLLM at import time.

The capture sizes suggested for the recorded shapes come from
:func:`probe.analysis.capture_sizes.suggest_capture_sizes`, checked by a replay of their own.

    >>> from probe.analysis.whatif import Setting
    >>> Setting(support=(("FlashMLASparseMetadataBuilder", "UNIFORM_SINGLE_TOKEN_DECODE"),)).label
    '--support FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE'
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import logging
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from probe.analysis import costmodel
from probe.analysis import views as analysis
from probe.analysis.capture_sizes import SPLIT_SIZE_FIELDS, padding_of, suggest_capture_sizes
from probe.reasons import SUPPORT_NAMES
from probe.records import Mode, Reason
from probe.step import Step

__all__ = [
    "KEPT",
    "Engine",
    "Replayer",
    "Setting",
    "VllmError",
    "WhatIfError",
    "load_vllm",
    "parse_sizes",
    "parse_support",
    "whatif",
]

#: reasons the batch shape does not decide (runner state, DP peers, LoRA): kept as recorded
KEPT = frozenset(
    {Reason.WARMUP_OR_PROFILE, Reason.FORCED_EAGER, Reason.CASCADE_ATTENTION, Reason.LORA_MISMATCH}
)


class WhatIfError(ValueError):
    """A setting or recording the what-if cannot use (a usage error)."""


class VllmError(RuntimeError):
    """The installed vLLM cannot be imported here, or its own code failed (a runtime failure)."""


# -- input ------------------------------------------------------------------------------------


def parse_sizes(text: str, flag: str = "--capture-sizes") -> tuple[int, ...]:
    """``"1,2,4,8"`` -> (1, 2, 4, 8); raises :class:`WhatIfError` naming the bad item."""
    out = []
    for item in (p.strip() for p in text.split(",")):
        try:
            v = int(item)
        except ValueError:
            raise WhatIfError(f"{flag}: {item!r} is not an integer") from None
        if v < 1:
            raise WhatIfError(f"{flag}: {v} is not a size (give integers from 1 up)")
        out.append(v)
    return tuple(out)


def parse_support(items: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``["Builder=LEVEL[,Builder=LEVEL]", ...]`` -> ((builder, LEVEL), ...)."""
    out: dict[str, str] = {}
    for text in items:
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, sep, level = (s.strip() for s in item.partition("="))
            if not sep or not name:
                raise WhatIfError(f"--support {item!r}: expected Builder=LEVEL")
            if level.upper() not in SUPPORT_NAMES:
                raise WhatIfError(
                    f"--support {item!r}: level must be one of {', '.join(SUPPORT_NAMES)}"
                )
            out[name.rpartition(":")[2]] = level.upper()
    return tuple(out.items())


_SIZE_LISTS = ("prefill_cudagraph_capture_token_sizes", "decode_cudagraph_capture_request_sizes")


def flag(field_name: str) -> str:
    """The ``probe whatif`` flag of a vLLM setting: its own name, dashed."""
    return "--" + field_name.replace("_", "-")


@dataclass(frozen=True)
class Setting:
    """What changes against the recording (None / empty: as recorded).

    ``split``: Model Runner V2's split graph sizes (:data:`SPLIT_SIZE_FIELDS`) by name,
    a tuple of sizes for the two lists, an int for the caps.
    """

    mode: str | None = None
    capture_sizes: tuple[int, ...] | None = None
    max_capture_size: int | None = None
    support: tuple[tuple[str, str], ...] = ()
    split: tuple[tuple[str, Any], ...] = ()

    @property
    def empty(self) -> bool:
        return self == Setting()

    @property
    def label(self) -> str:
        parts = [f"--mode {self.mode}"] if self.mode else []
        if self.capture_sizes is not None:
            parts.append(f"--capture-sizes {','.join(map(str, self.capture_sizes))}")
        if self.max_capture_size is not None:
            parts.append(f"--max-capture-size {self.max_capture_size}")
        for name, value in self.split:
            shown = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
            parts.append(f"{flag(name)} {shown}")
        parts += [f"--support {b}={lvl}" for b, lvl in self.support]
        return " ".join(parts) or "the recording's settings"


@dataclass(frozen=True)
class Group:
    role: str
    builder: str
    backend: str
    support: int


@dataclass(frozen=True)
class Engine:
    """One recorded process's graph settings, read from its static snapshot."""

    vllm_version: str
    runner: str
    requested_mode: str
    resolved_mode: str
    compile_mode: str
    capture_sizes: tuple[int, ...]
    max_capture_size: int
    max_num_seqs: int
    max_num_batched_tokens: int | None
    uq: int
    groups: tuple[Group, ...]
    min_support: int
    min_backend: str | None
    #: the recorded values of :data:`SPLIT_SIZE_FIELDS` (a release that has them)
    split: tuple[tuple[str, Any], ...] = ()
    #: the compilation settings the snapshot names (to compare with the installed vLLM)
    settings: tuple[str, ...] = ()
    #: breakable CUDA graphs on (None: not recorded)
    breakable: bool | None = None

    @classmethod
    def of(cls, snap: Mapping[str, Any], where: str) -> Engine:
        comp = snap.get("compilation") or {}
        res = snap.get("resolve") or {}
        sizes = comp.get("cudagraph_capture_sizes")
        need = {
            "compilation.cudagraph_capture_sizes": sizes,
            "max_num_seqs": snap.get("max_num_seqs"),
            "runner": snap.get("runner"),
        }
        for name, value in need.items():
            if value is None:
                raise WhatIfError(f"{where}: the static snapshot has no {name}")
        groups = tuple(
            Group(g.get("role", "target"), g["builder"], str(g.get("backend")), g["support_value"])
            for g in snap.get("groups") or ()
            if g.get("builder") and isinstance(g.get("support_value"), int)
        )
        requested = res.get("requested_mode") or comp.get("cudagraph_mode") or "NONE"
        low = res.get("min_cg_support_value")
        if low is None:
            low = min((g.support for g in groups), default=len(SUPPORT_NAMES) - 1)
        return cls(
            vllm_version=str(snap.get("vllm_version")),
            runner=str(snap["runner"]),
            requested_mode=str(requested),
            resolved_mode=str(res.get("resolved_mode") or comp.get("cudagraph_mode")),
            compile_mode=str(comp.get("mode") or "VLLM_COMPILE"),
            capture_sizes=tuple(sorted(int(x) for x in sizes or ())),
            max_capture_size=int(comp.get("max_cudagraph_capture_size") or max(sizes or [0])),
            max_num_seqs=int(snap["max_num_seqs"]),
            max_num_batched_tokens=snap.get("max_num_batched_tokens"),
            uq=int(snap.get("uniform_decode_query_len") or 1),
            groups=groups,
            min_support=int(low),
            min_backend=res.get("min_cg_attn_backend"),
            split=tuple(
                (k, tuple(int(x) for x in v) if isinstance(v, list) else int(v))
                for k in SPLIT_SIZE_FIELDS
                if (v := comp.get(k)) is not None
            ),
            settings=tuple(sorted(k for k, v in comp.items() if v is not None)),
            breakable=_flag(comp.get("use_breakable_cudagraph", comp.get("breakable_cudagraph"))),
        )

    def counted(self) -> tuple[Group, ...]:
        """The groups whose minimum the runner resolves with (see the module doc)."""
        return (
            self.groups
            if self.runner == "v1"
            else tuple(g for g in self.groups if g.role == "target")
        )


def _flag(v: Any) -> bool | None:
    """A recorded on/off setting: a bool, or an environment variable's text."""
    if v is None or isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Applied:
    """A :class:`Setting` applied to an :class:`Engine`: the inputs vLLM is given."""

    requested_mode: str
    capture_sizes: tuple[int, ...]
    max_capture_size: int
    min_support: int
    min_backend: str | None
    #: the split graph sizes vLLM is given (where it has them); absent: its default
    split: tuple[tuple[str, Any], ...] = ()
    #: ``cudagraph_capture_sizes`` is the user's (vLLM's ``legacy_sizes``): the recording
    #: had no split sizes, or ``--capture-sizes`` / ``--max-capture-size`` was given
    legacy: bool = True


def apply(engine: Engine, s: Setting) -> Applied:
    """The inputs of vLLM's resolver under ``s``; raises :class:`WhatIfError`."""
    sizes, top = engine.capture_sizes, engine.max_capture_size
    mnbt = engine.max_num_batched_tokens
    if s.capture_sizes is not None:
        # vLLM's _set_cudagraph_sizes for user-given sizes: de-duplicated, sorted, none
        # above max_num_batched_tokens, and the maximum must be the largest of them
        sizes = tuple(sorted({x for x in s.capture_sizes if mnbt is None or x <= mnbt}))
        if not sizes:
            raise WhatIfError(f"--capture-sizes: every size is above max_num_batched_tokens {mnbt}")
        if s.max_capture_size is not None and s.max_capture_size != sizes[-1]:
            raise WhatIfError(
                f"--max-capture-size {s.max_capture_size} must be the largest capture size "
                f"({sizes[-1]}), as vLLM requires when both are given"
            )
        top = sizes[-1]
    elif s.max_capture_size is not None:
        if s.max_capture_size > engine.max_capture_size:
            raise WhatIfError(
                f"--max-capture-size {s.max_capture_size} is above the recorded largest size "
                f"{engine.max_capture_size}: give --capture-sizes to add sizes"
            )
        sizes = tuple(x for x in sizes if x <= s.max_capture_size)
        if not sizes:
            raise WhatIfError(f"--max-capture-size {s.max_capture_size}: no recorded size fits")
        top = sizes[-1]  # vLLM truncates the maximum to the largest size
    low, backend = engine.min_support, engine.min_backend
    if s.support:
        known = sorted({g.builder for g in engine.groups})
        level = dict(s.support)
        for name in level:
            if name not in known:
                raise WhatIfError(
                    f"--support {name}: no attention group of this recording uses it "
                    f"(its builders: {', '.join(known) or 'none recorded'})"
                )
        low, backend = len(SUPPORT_NAMES) - 1, None
        for g in engine.counted():
            v = SUPPORT_NAMES.index(level[g.builder]) if g.builder in level else g.support
            if v < low:
                low, backend = v, g.backend
    split, legacy = _split_of(engine, s)
    return Applied(s.mode or engine.requested_mode, sizes, top, low, backend, split, legacy)


def _split_of(engine: Engine, s: Setting) -> tuple[tuple[tuple[str, Any], ...], bool]:
    """The split graph sizes under ``s`` and whether the shared sizes are the user's.

    A recording with split sizes keeps them unless a flag changes one: a changed list
    drops its recorded cap (vLLM refuses sizes above it) unless the cap is given too.
    Given only the shared sizes (a recording from a release without split sizes, or
    ``--capture-sizes``), vLLM derives the split sizes itself (``legacy``)."""
    given = dict(s.split)
    shared_given = s.capture_sizes is not None or s.max_capture_size is not None
    if shared_given and not given:
        return (), True
    out = dict(engine.split) if not shared_given else {}
    for lst, cap in (
        ("prefill_cudagraph_capture_token_sizes", "max_prefill_cudagraph_capture_tokens"),
        ("decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests"),
    ):
        if lst in given and cap not in given:
            out.pop(cap, None)
        if cap in given and lst not in given:
            out.pop(lst, None)  # a new cap: vLLM's grid up to it
    out.update(given)
    if not given and engine.split:
        return tuple(sorted(out.items())), True  # as recorded: vLLM checks they agree
    return tuple(sorted(out.items())), shared_given or not out


# -- vLLM --------------------------------------------------------------------------------------


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
                f"({self.platform or 'its platform'}): {_one_line(exc)}"
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
                f"PYTHONPATH): {_one_line(exc)}"
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
                f"PYTHONPATH): {_one_line(exc)}"
            ) from None
        manager: Any = None
        why = ""
        try:
            import vllm.v1.worker.gpu.cudagraph_utils as mrv2

            manager = mrv2.ModelCudaGraphManager
        except Exception as exc:
            why = _one_line(exc)
    return Vllm(str(vllm.__version__), config, AttentionCGSupport, None, manager, why, platform)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


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
                        f"here: {_one_line(exc)}"
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
                    f"{s.pid} ({s.num_tokens} tokens, {s.num_reqs} requests): {_one_line(exc)}"
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


# -- the replay ------------------------------------------------------------------------------------


def _key(s: Step) -> str:
    return f"{s.mode.name.lower() if s.mode is not None else 'none'} {_label(s.reason)}"


def _label(r: Reason | None) -> str:
    return r.label if r is not None else "unknown"


def summary(steps: Sequence[Step]) -> dict[str, Any]:
    """The numbers each column shows, from :mod:`probe.analysis.views`."""
    rates = analysis.hit_rates(steps)
    return {
        "steps": rates["steps"],
        "full_share": rates["full_hit_rate"],
        "graph_share": rates["graph_rate"],
        "decode_full_share": rates["decode_full_hit_rate"],
        "padding_waste": rates["padding_waste"],
        "padded_tokens": rates["padded_tokens"],
        "real_tokens": rates["real_tokens"],
        "reasons": dict(Counter(_key(s) for s in steps).most_common()),
    }


def _changes(before: Sequence[Step], after: Sequence[Step]) -> list[dict[str, Any]]:
    moved = Counter(
        (_key(a), _key(b)) for a, b in zip(before, after, strict=True) if _key(a) != _key(b)
    )
    return [{"from": a, "to": b, "steps": n} for (a, b), n in moved.most_common()]


def _column(
    name: str, setting: str, graphs: Mapping[int, Graphs], steps: list[Step]
) -> dict[str, Any]:
    g = next(iter(graphs.values()))
    return {
        "column": name,
        "setting": setting,
        "resolved_mode": g.resolved_mode,
        "capture_sizes": list(g.capture_sizes),
        "max_capture_size": g.max_capture_size,
        "vllm_messages": sorted({m for x in graphs.values() for m in x.messages}),
        **summary(steps),
    }


class Replayer:
    """A recording's forward steps with a batch shape, and each rank's :class:`Engine`.

    Raises :class:`WhatIfError` for steps with no shape or no snapshot. Use
    :meth:`session` around :meth:`graphs` and :meth:`replay`::

        r = Replayer(rec.iter_steps(), snapshots)
        with r.session(load_vllm()):
            steps = r.replay(r.graphs(r.applied(Setting(mode="PIECEWISE"))))
    """

    def __init__(self, steps: Iterable[Step], snapshots: Mapping[int, Mapping[str, Any]]) -> None:
        self.steps = [s for s in analysis.forward_steps(steps) if s.num_tokens > 0]
        if not self.steps:
            raise WhatIfError("no forward step with a batch shape to replay")
        self.engines: dict[int, Engine] = {}
        for pid in sorted({s.pid for s in self.steps}):
            snap = snapshots.get(pid)
            if not snap:
                raise WhatIfError(f"pid {pid} has steps but no static snapshot")
            self.engines[pid] = Engine.of(snap, f"pid {pid}")
        self.vl: Vllm | None = None
        self._cache: dict[tuple[Engine, Applied], Graphs] = {}

    def applied(self, setting: Setting) -> dict[int, Applied]:
        return {pid: apply(e, setting) for pid, e in self.engines.items()}

    @contextlib.contextmanager
    def session(self, vl: Vllm) -> Iterator[None]:
        """vLLM's log lines to stderr, and what MRV2's manager needs (:func:`mrv2_context`)."""
        mrv2 = any(e.runner == "mrv2" for e in self.engines.values())
        with (
            contextlib.redirect_stdout(sys.stderr),
            mrv2_context(vl) if mrv2 else contextlib.nullcontext(),
        ):
            self.vl = vl
            try:
                yield
            finally:
                self.vl = None
                self._cache.clear()

    def graphs(self, applied: Mapping[int, Applied]) -> dict[int, Graphs]:
        if self.vl is None:
            raise RuntimeError("Replayer.graphs outside Replayer.session")
        out = {}
        for pid, e in self.engines.items():
            key = (e, applied[pid])
            if key not in self._cache:
                try:
                    self._cache[key] = build(self.vl, e, applied[pid])
                except (WhatIfError, VllmError):
                    raise
                except Exception as exc:  # vLLM's own code failed on these settings
                    raise VllmError(
                        f"vLLM {self.vl.version} could not build the {e.runner} dispatcher "
                        f"for these settings: {_one_line(exc)}"
                    ) from None
            out[pid] = self._cache[key]
        return out

    def replay(self, graphs: Mapping[int, Graphs]) -> list[Step]:
        """The steps as these graphs would dispatch them (:data:`KEPT` ones as recorded)."""
        out = []
        for s in self.steps:
            if s.reason in KEPT:
                out.append(s)
                continue
            mode, reason, padded, padded_reqs = graphs[s.pid](s)
            out.append(
                replace(s, mode=mode, reason=reason, padded_tokens=padded, padded_reqs=padded_reqs)
            )
        return out


def whatif(
    steps: Iterable[Step],
    snapshots: Mapping[int, Mapping[str, Any]],
    setting: Setting,
    *,
    suggest_count: int | None = None,
    vl: Vllm | None = None,
    costs_from: costmodel.Costs | None = None,
) -> dict[str, Any]:
    """Replay ``steps`` (a recording's) under its own settings and under ``setting``.

    ``snapshots``: each pid's static snapshot. Returns plain data: the recorded and the
    replayed columns (:func:`summary` each), the per-step reproduction check of the
    recording's own settings, the what-if's changes against the recording, and the
    suggested capture sizes. Each column's ``worth`` is its steady host time per step and
    CPU launch overhead, predicted by :mod:`probe.analysis.costmodel` from the costs measured in
    the recording (then in ``costs_from``, another recording's; the recorded column:
    measured). Raises :class:`WhatIfError` for input it cannot use (before vLLM is
    imported) and :class:`VllmError` when vLLM is not importable.
    """
    steps = list(steps)
    r = Replayer(steps, snapshots)
    fw, engines = r.steps, r.engines
    own_a, target_a = r.applied(Setting()), r.applied(setting)
    first = next(iter(engines.values()))
    vl = vl or load_vllm()
    r_platform = vl.platform
    gone = settings_not_in(vl, engines.values())
    with r.session(vl):
        own = r.graphs(own_a)
        own_steps = r.replay(own)
        columns = [
            {
                "column": "recorded",
                "setting": "as recorded",
                "resolved_mode": first.resolved_mode,
                "capture_sizes": list(first.capture_sizes),
                "max_capture_size": first.max_capture_size,
                "vllm_messages": [],
                **summary(fw),
            },
            _column("replay", "the recording's settings", own, own_steps),
        ]
        replayed = {"recorded": fw, "replay": own_steps}
        target, target_steps = own, own_steps
        if not setting.empty:
            target = r.graphs(target_a)
            target_steps = r.replay(target)
            columns.append(_column("what-if", setting.label, target, target_steps))
            replayed["what-if"] = target_steps
        on = "what-if" if not setting.empty else "recorded"
        suggestion = _suggest(engines, target, target_steps, suggest_count, on)
        if suggestion.get("sizes"):
            sizes = tuple(suggestion["sizes"])
            split = suggestion.get("split")
            sized = {
                p: (
                    replace(a, split=_with(a.split, split), legacy=False)
                    if split
                    else replace(a, capture_sizes=sizes, max_capture_size=sizes[-1])
                )
                for p, a in (target_a if not setting.empty else own_a).items()
            }
            got = r.graphs(sized)
            sug_steps = r.replay(got)
            col = _column("suggested", "suggested capture sizes", got, sug_steps)
            base = columns[-1]
            suggestion["verified"] = (
                col["padded_tokens"] - col["real_tokens"]
                <= base["padded_tokens"] - base["real_tokens"]
                and _count(sug_steps, Mode.FULL) >= _count(target_steps, Mode.FULL)
                and sum(s.graph for s in sug_steps) >= sum(s.graph for s in target_steps)
            )
            if suggestion["verified"]:
                columns.append(col)
                replayed["suggested"] = sug_steps
    pairs = list(zip(fw, own_steps, strict=True))
    same = [(a, b) for a, b in pairs if (a.mode, a.reason) == (b.mode, b.reason)]
    mismatched = [
        {"pid": a.pid, "step": a.step, "recorded": _key(a), "replayed": _key(b),
         "num_tokens": a.num_tokens, "num_reqs": a.num_reqs, "max_query_len": a.max_query_len,
         "uniform": a.uniform}
        for a, b in pairs
        if (a.mode, a.reason) != (b.mode, b.reason)
    ]  # fmt: skip
    sources = _worth(steps, columns, replayed, costs_from)
    return {
        "vllm_installed": next(iter(own.values())).vllm_version,
        "vllm_platform": r_platform,
        "not_in_installed_vllm": gone,
        "vllm_recorded": sorted({e.vllm_version for e in engines.values()}),
        "runner": sorted({e.runner for e in engines.values()}),
        "ranks": len(engines),
        "requested_mode": first.requested_mode,
        "what_if_requested_mode": next(iter(target_a.values())).requested_mode,
        "min_support": {
            "recorded": SUPPORT_NAMES[first.min_support],
            "what_if": SUPPORT_NAMES[next(iter(target_a.values())).min_support],
        },
        "kept_as_recorded": sum(1 for s in fw if s.reason in KEPT),
        "reproduction": {
            "steps": len(fw),
            "mode_and_reason_match": len(same),
            "padding_match": sum(
                (a.padded_tokens, a.padded_reqs) == (b.padded_tokens, b.padded_reqs)
                for a, b in same
            ),
            "mismatches": mismatched[:10],
        },
        "columns": columns,
        "changes": _changes(fw, target_steps) if not setting.empty else [],
        "suggestion": suggestion,
        "costs": sources,
    }


def _worth(
    steps: Sequence[Step],
    columns: list[dict[str, Any]],
    replayed: Mapping[str, Sequence[Step]],
    costs_from: costmodel.Costs | None,
) -> list[dict[str, Any]]:
    """Each column's ``worth`` (see :func:`whatif`); returns the cost sources used."""
    keys = costmodel.steady_keys(steps)
    own = costmodel.Costs.of(steps, "the recording", keys)
    costs = [own] if costs_from is None else [own, costs_from]
    base = costmodel.measured(replayed["recorded"], keys)
    for c in columns:
        if c["column"] == "recorded":
            w = {**base, "measured": True, "priced": {}, "no_cost": []}
        else:
            w = {**costmodel.predict(replayed[c["column"]], keys, costs), "measured": False}
        for k in ("host_ns_per_step", "cpu_launch_overhead_ns"):
            a, b = base[k], w[k]
            w[f"{k}_vs_recorded"] = b / a if a and b is not None else None
        c["worth"] = w
    return [{"source": c.source, "shapes": c.shapes} for c in costs]


def _with(
    split: Iterable[tuple[str, Any]], lists: Mapping[str, Sequence[int]]
) -> tuple[tuple[str, Any], ...]:
    """``split`` with these size lists (and each list's cap dropped: the sizes set it)."""
    caps = {
        "prefill_cudagraph_capture_token_sizes": "max_prefill_cudagraph_capture_tokens",
        "decode_cudagraph_capture_request_sizes": "max_decode_cudagraph_capture_requests",
    }
    out = {k: v for k, v in split if k not in {caps[n] for n in lists}}
    out.update({k: tuple(v) for k, v in lists.items()})
    return tuple(sorted(out.items()))


def settings_not_in(vl: Vllm, engines: Iterable[Engine]) -> list[dict[str, str]]:
    """The recorded settings the installed vLLM no longer has (or took over otherwise),
    each with what the replay does about it; read off the installed vLLM's classes."""
    fields = getattr(vl.config.CompilationConfig, "__dataclass_fields__", None) or {}
    split = has_split_sizes(vl)
    out: dict[str, str] = {}
    for e in engines:
        if e.runner == "v1" and not has_module("vllm.v1.worker.gpu_model_runner"):
            out["the classic model runner (V1)"] = (
                f"vLLM {vl.version} has Model Runner V2 only: a V1 recording does not replay"
            )
        for name in e.settings:
            if name == "breakable_cudagraph":
                if "use_breakable_cudagraph" in fields:
                    out["VLLM_USE_BREAKABLE_CUDAGRAPH"] = (
                        f"vLLM {vl.version} keeps breakable graphs in "
                        "compilation_config.use_breakable_cudagraph (the variable, where "
                        "set, still decides it)"
                    )
                continue
            if name not in fields:
                out[f"compilation_config.{name}"] = (
                    f"not in vLLM {vl.version}: the replay goes without it"
                )
        if split and not e.split and e.runner == "mrv2":
            out["compilation_config.cudagraph_capture_sizes"] = (
                f"deprecated for Model Runner V2 in vLLM {vl.version}, which sizes prefill "
                "graphs by prefill_cudagraph_capture_token_sizes and decode graphs by "
                "decode_cudagraph_capture_request_sizes: the replay derives both from the "
                "recorded sizes, as vLLM does"
            )
    return [{"setting": k, "note": v} for k, v in out.items()]


def _count(steps: Iterable[Step], mode: Mode) -> int:
    return sum(1 for s in steps if s.mode == mode)


def _suggest(
    engines: Mapping[int, Engine],
    graphs: Mapping[int, Graphs],
    steps: Sequence[Step],
    limit: int | None,
    on: str,
) -> dict[str, Any]:
    """Capture sizes for the graph-dispatched, shape-decided steps of one column."""
    g = next(iter(graphs.values()))
    e = next(iter(engines.values()))
    if len({(x.capture_sizes, x.max_capture_size, x.split) for x in graphs.values()}) > 1:
        return {"sizes": None, "why": "the ranks have different capture sizes"}
    if g.split and e.runner == "mrv2":
        return _suggest_split(e, g, steps, limit, on)
    tokens = Counter(s.num_tokens for s in steps if s.graph and s.reason not in KEPT)
    limit = limit or len(g.capture_sizes)
    if not tokens or not g.capture_sizes:
        return {"sizes": None, "limit": limit, "why": "no step was graph-dispatched"}
    # V1 rounds every size to 1 + k when FULL decode graphs run with MTP
    rounds = e.runner == "v1" and g.resolved_mode in (
        "FULL",
        "FULL_DECODE_ONLY",
        "FULL_AND_PIECEWISE",
    )
    multiple = e.uq if rounds and e.uq > 1 else 1
    sizes = suggest_capture_sizes(tokens, g.max_capture_size, limit, multiple)
    return {
        "sizes": list(sizes),
        "limit": limit,
        "largest": g.max_capture_size,
        "multiple_of": multiple,
        "padding_tokens": padding_of(tokens, sizes),
        "padding_tokens_now": padding_of(tokens, g.capture_sizes),
        "settings": on,
    }


def _suggest_split(
    e: Engine, g: Graphs, steps: Sequence[Step], limit: int | None, on: str
) -> dict[str, Any]:
    """Model Runner V2 with split graph sizes (vLLM 0.34 on): uniform decode batches
    replay graphs keyed by request count (``decode_cudagraph_capture_request_sizes``,
    padding whole requests) when the mode has a separate decode routine; every other
    batch pads to ``prefill_cudagraph_capture_token_sizes``. Each list is suggested for
    its own batches, keeping its largest size."""
    split = dict(g.split)
    prefill_now = sorted(split.get("prefill_cudagraph_capture_token_sizes") or ())
    decode_now = sorted(split.get("decode_cudagraph_capture_request_sizes") or ())
    separate = g.resolved_mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    shaped = [s for s in steps if s.graph and s.reason not in KEPT]
    decode = [s for s in shaped if separate and s.uniform and s.num_reqs <= (decode_now or [0])[-1]]
    tokens = Counter(s.num_tokens for s in shaped if s not in decode)
    reqs = Counter(s.num_reqs for s in decode)
    lists: dict[str, list[int]] = {}
    now = 0
    padding = 0
    if tokens and prefill_now:
        n = limit or len(prefill_now)
        got = suggest_capture_sizes(tokens, prefill_now[-1], n)
        lists["prefill_cudagraph_capture_token_sizes"] = list(got)
        padding += padding_of(tokens, got)
        now += padding_of(tokens, prefill_now)
    if reqs and decode_now:
        n = limit or len(decode_now)
        got = suggest_capture_sizes(reqs, decode_now[-1], n)
        lists["decode_cudagraph_capture_request_sizes"] = list(got)
        padding += e.uq * padding_of(reqs, got)
        now += e.uq * padding_of(reqs, decode_now)
    if not lists:
        return {"sizes": None, "limit": limit, "why": "no step was graph-dispatched"}
    union = sorted(
        set(lists.get("prefill_cudagraph_capture_token_sizes", prefill_now))
        | {n * e.uq for n in lists.get("decode_cudagraph_capture_request_sizes", ())}
    )
    return {
        "sizes": union,
        "split": lists,
        "limit": limit or max(len(prefill_now), len(decode_now)),
        "largest": g.max_capture_size,
        "multiple_of": 1,
        "padding_tokens": padding,
        "padding_tokens_now": now,
        "settings": on,
    }
