"""The seed's own class on CPU: vLLM's ROCMAiterMLASparseMetadataBuilder through the probe.

The real builder of each wheel tree is constructed by its own ``__init__`` from a real
VllmConfig (the tiny DeepSeek-V3.2 config in ``benchmarks/gpu/tinyv32``, a real MTP
SpeculativeConfig with k = 1 or 2) and its real ``build()`` runs through the probe's
builder hook, installed as the engine installs it (the late targets of the first step).

What runs for real: the builder's Python, vLLM's own Triton kernels (Triton's
interpreter on CPU tensors: ``generate_sparse_seqlen_kernel``, 0.33's token-to-request
kernel), aiter's ``dtypes`` and ``get_mla_metadata_info_v1`` from the installed
``amd-aiter`` sources (:mod:`.aiter_standin`). Stood in, because they need a GPU: aiter's
``get_mla_metadata_v1`` HIP kernel (a signature-true stand-in, see ``aiter_standin``),
``torch.cuda.current_stream`` (the builder synchronizes it after that kernel), the CU
count, and the attention layer in the static forward context (its ``impl``: no sinks;
no prefill backend), which needs the model.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from probe.analysis.traps import findings
from probe.engine import hooks
from probe.engine.hooks import snapshot
from probe.engine.ring_writer import RingWriter
from probe.engine.runtime import RT
from probe.reader.assemble import fill_builds
from probe.records import Build, Dispatch, Reason

from . import aiter_standin
from .vllm_env import CAPTURE_SIZES, MAX_NUM_SEQS, Vllm, resolve_kwargs

pytestmark = [pytest.mark.wheels, pytest.mark.usefixtures("clean_probe")]

TINY_V32 = Path(__file__).resolve().parents[2] / "benchmarks/gpu/tinyv32"
KERNEL_MODULES = (
    "vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse",
    "vllm.v1.attention.ops.metadata",  # 0.33: CommonAttentionMetadata.token_to_req_indices
)
BACKEND = "ROCM_AITER_MLA_SPARSE"
LAYER = "model.layers.0.self_attn.attn"


@dataclasses.dataclass(frozen=True)
class Batch:
    id: str
    q: tuple[int, ...]  # query length per request, in batch order
    context: tuple[int, ...]  # tokens computed before this step


def batches(k: int) -> list[Batch]:
    uq = 1 + k
    return [
        Batch("decode", (uq,) * 3, (100, 37, 250)),
        Batch("decode_6_reqs", (uq,) * MAX_NUM_SEQS, (64,) * MAX_NUM_SEQS),
        Batch("mixed_chunk", (uq, uq, 40), (90, 12, 0)),
        Batch("mixed_short_draft", (uq, 1, 17), (30, 30, 200)),
        Batch("prefill", (9, 5), (0, 0)),
    ]


@pytest.fixture(scope="module")
def configs(vl: Vllm) -> Callable[[int], Any]:
    """Real VllmConfigs of the tiny V3.2 model with MTP k = 1 or 2 (built once: ~40 s)."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    mc = ModelConfig(
        model=str(TINY_V32), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=4096
    )
    pc = ParallelConfig()
    sc = SpeculativeConfig(
        method="mtp", num_speculative_tokens=2, target_model_config=mc, target_parallel_config=pc
    )
    base = vl.VllmConfig(model_config=mc, parallel_config=pc, speculative_config=sc)
    cache: dict[int, Any] = {}

    def get(k: int) -> Any:
        if k not in cache:
            vc = copy.copy(base)
            # k = 1 shares the validated MTP config; only the draft length differs.
            spec = copy.copy(sc)
            spec.num_speculative_tokens = k
            vc.speculative_config = spec
            vc.compilation_config = copy.deepcopy(base.compilation_config)
            vc.scheduler_config = copy.copy(base.scheduler_config)
            vc.scheduler_config.max_num_seqs = MAX_NUM_SEQS
            cc = vc.compilation_config
            # As vllm_env.make_vllm_config: the graph settings a GPU platform would derive.
            cc.cudagraph_mode = vl.CUDAGraphMode.FULL_AND_PIECEWISE
            cc.cudagraph_capture_sizes = list(CAPTURE_SIZES)
            cc.max_cudagraph_capture_size = CAPTURE_SIZES[-1]
            cc.use_inductor_graph_partition = False
            cc.mode = vl.CompilationMode.VLLM_COMPILE
            cc.splitting_ops = list(cc._attention_ops)
            cache[k] = vc
        return cache[k]

    return get


@pytest.fixture
def aiter(monkeypatch: pytest.MonkeyPatch) -> Iterator[aiter_standin.Aiter]:
    """``aiter`` as far as it runs here, and the GPU-only parts stood in (module docstring)."""
    import torch
    import triton
    import triton.language as tl
    from vllm.platforms import current_platform

    state = aiter_standin.build()
    syncs: list[int] = []
    monkeypatch.setattr(
        torch.cuda,
        "current_stream",
        lambda device=None: SimpleNamespace(synchronize=lambda: syncs.append(len(state.calls))),
    )
    monkeypatch.setattr(
        type(current_platform), "num_compute_units", classmethod(lambda cls, d=0: 304)
    )
    # vLLM found no GPU driver for Triton and bound its placeholder; Triton's interpreter
    # runs the same kernels on CPU tensors (conftest sets TRITON_INTERPRET before import).
    if not triton.knobs.runtime.interpret:
        pytest.skip("Triton was imported before TRITON_INTERPRET=1 was set")
    for name in KERNEL_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        monkeypatch.setattr(mod, "tl", tl, raising=False)
        monkeypatch.setattr(mod, "triton", triton, raising=False)
        for attr, fn in list(vars(mod).items()):
            jitted = inspect.isfunction(fn) and fn.__module__ == name
            if jitted and inspect.getsource(fn).lstrip().startswith("@triton.jit"):
                monkeypatch.setattr(mod, attr, triton.jit(fn))
    state.syncs = syncs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "aiter", state.module)
    yield state


@pytest.fixture
def wring(tmp_path: Path, vllm_version: str) -> Iterator[RingWriter]:
    writer = RingWriter.create(tmp_path / "ring", capacity=8192)
    yield writer
    writer.close()


def _spec() -> Any:
    import torch
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    return MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)


def _builder(vc: Any, spec: Any) -> Any:
    """The real builder, by its own ``__init__``, as the runner makes it at KV-cache init."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import ROCMAiterMLASparseBackend

    vc.compilation_config.static_forward_context[LAYER] = SimpleNamespace(
        impl=SimpleNamespace(sinks=None), prefill_backend=None
    )
    with set_current_vllm_config(vc):
        return ROCMAiterMLASparseBackend.get_builder_cls()(spec, [LAYER], vc, torch.device("cpu"))


def _runner(vc: Any, uq: int, builder: Any, spec: Any) -> Any:
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import ROCMAiterMLASparseBackend

    group = SimpleNamespace(
        backend=ROCMAiterMLASparseBackend,
        kv_cache_spec=spec,
        layer_names=[LAYER],
        metadata_builders=[builder],
    )
    return SimpleNamespace(vllm_config=vc, uniform_decode_query_len=uq, attn_groups=[group])


def _metadata(batch: Batch) -> Any:
    """A real CommonAttentionMetadata for the batch (fields of this tree's dataclass)."""
    import numpy as np
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    q = np.array(batch.q, dtype=np.int32)
    ctx = np.array(batch.context, dtype=np.int32)
    qsl = torch.from_numpy(np.concatenate([[0], np.cumsum(q)]).astype(np.int32))
    seq = torch.from_numpy(q + ctx)
    n = int(q.sum())
    values = {
        "query_start_loc": qsl.clone(),
        "query_start_loc_cpu": qsl,
        "seq_lens": seq.clone(),
        "num_reqs": len(q),
        "num_actual_tokens": n,
        "max_query_len": int(q.max()),
        "max_seq_len": int(seq.max()),
        "block_table_tensor": torch.zeros((len(q), 8), dtype=torch.int32),
        "slot_mapping": torch.arange(n, dtype=torch.int64),
        "is_prefilling": torch.from_numpy(ctx == 0),
        "seq_lens_cpu_upper_bound": seq.clone(),  # 0.33
        "_seq_lens_cpu": seq.clone(),  # 0.26
        "_num_computed_tokens_cpu": torch.from_numpy(ctx),  # 0.26
    }
    names = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
    return CommonAttentionMetadata(**{k: v for k, v in values.items() if k in names})


def _resolve(vc: Any, uq: int, spec: Any) -> Any:
    """vLLM's resolver on the builder class's own support, as the V1 runner calls it."""
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import ROCMAiterMLASparseBackend

    from probe.reasons import min_support

    value, name = min_support([(ROCMAiterMLASparseBackend, spec)], vc)
    cc = vc.compilation_config
    return cc.resolve_cudagraph_mode_and_sizes(
        AttentionCGSupport(value), name, uniform_decode_query_len=uq, **resolve_kwargs(cc, v2=False)
    )


def _first_step(runner: Any) -> dict[str, Any]:
    """What the step hook does on the first enabled step: late targets, then the snapshot."""
    for cb in list(RT.on_first_step):
        cb(runner)
    snap = RT.static["snapshot"]
    assert isinstance(snap, dict)
    return snap


@pytest.mark.parametrize("k", [1, 2])
def test_builds_through_the_probe_match_the_builders_metadata(
    k: int,
    vl: Vllm,
    configs: Callable[[int], Any],
    aiter: aiter_standin.Aiter,
    wring: RingWriter,
    kit: Any,
) -> None:
    assert aiter.import_error is not None, "aiter imports here: run these on ROCm for real"
    vc, spec, uq = configs(k), _spec(), 1 + k
    hooks.install(["static", "builders", "dispatch"], lazy=False)
    builder = _builder(vc, spec)
    # Read from the builder, not inferred: the threshold it holds, and what it asked for.
    assert builder.reorder_batch_threshold == uq
    init = snapshot.reorder_init_of(builder)
    assert init is not None and init["supports_spec_as_decode"] is True
    assert init["reorder_batch_threshold"] == 1 and init["result"] == uq

    _resolve(vc, uq, spec)
    hooks.enable(wring, gpu_timing=False)
    snap = _first_step(_runner(vc, uq, builder, spec))
    assert f"build.{type(builder).__name__}.build" in hooks.INSTALLER.installed_ids()
    RT.in_step = 1
    built = []
    for batch in batches(k):
        RT.step += 1
        built.append((batch, builder.build(0, _metadata(batch))))
    RT.in_step = 0
    hooks.disable()

    records = [r for r in kit.drain(wring)[0] if isinstance(r, Build)]
    assert [r.step for r in records] == [RT.step - len(built) + 1 + i for i in range(len(built))]
    for rec, (batch, md) in zip(records, built, strict=True):
        assert (rec.padded_tokens, rec.padded_reqs, rec.max_query_len) == (
            md.num_actual_tokens,
            md.num_reqs,
            md.max_query_len,
        ), batch.id
        # inside vLLM the hook reads no tensor: the real counts are the reader's
        assert (rec.real_tokens, rec.real_reqs) == (-1, -1), batch.id
        (filled,) = fill_builds([rec], [])  # no dispatch here: the unpadded counts
        assert (filled.real_tokens, filled.real_reqs) == (sum(batch.q), len(batch.q)), batch.id
        assert rec.reorder_batch_threshold == builder.reorder_batch_threshold
        if hasattr(md, "num_decodes"):  # 0.33: the builder's own split
            split = (md.num_decodes, md.num_prefills, md.num_decode_tokens)
            assert (rec.num_decodes, rec.num_prefills, rec.num_decode_tokens) == split, batch.id
            assert filled.num_prefill_tokens == sum(batch.q) - md.num_decode_tokens
        else:  # 0.26's metadata carries no split
            assert (rec.num_decodes, rec.num_prefills) == (-1, -1)
    # The aiter work-split kernel ran once per distinct metadata key, then the sync.
    assert aiter.calls and aiter.syncs == list(range(1, len(aiter.calls) + 1))  # type: ignore[attr-defined]
    for call in aiter.calls:
        assert call.arguments["num_heads_k"] == 1 and call.arguments["page_size"] == 1
        assert call.installed_error is not None  # the PyPI wheel's signature is older

    (g,) = snap["groups"]
    assert (g["backend"], g["support"]) == (BACKEND, "UNIFORM_BATCH")
    assert g["reorder_batch_threshold"] == uq and g["spec_as_decode"] is True
    assert snap["resolve"]["resolved_mode"] == "FULL_AND_PIECEWISE"
    text = _doctor_text(snap)
    assert f"{BACKEND}" in text and "support UNIFORM_BATCH" in text


def _doctor_text(snap: dict[str, Any]) -> str:
    from rich.console import Console

    from probe.cli.render_report import doctor, render_doctor

    console = Console(width=100, record=True, color_system=None)
    render_doctor(doctor(snap), console)
    return console.export_text()


@pytest.mark.usefixtures("needs_v1")
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("override", [None, "UNIFORM_SINGLE_TOKEN_DECODE"])
def test_whatif_override_demotes_decode_to_piecewise(
    k: int,
    override: str | None,
    vl: Vllm,
    configs: Callable[[int], Any],
    aiter: aiter_standin.Aiter,
    wring: RingWriter,
    kit: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The override as ``probe record --override`` applies it (``PROBE_CG_SUPPORT_OVERRIDE``
    at plugin load, before the runner resolves), then vLLM's resolver and dispatcher."""
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import (
        ROCMAiterMLASparseMetadataBuilder as B,
    )

    vc = copy.copy(configs(k))
    vc.compilation_config = copy.deepcopy(vc.compilation_config)
    spec, uq = _spec(), 1 + k
    hooks.install(["static", "builders", "dispatch"], lazy=False)
    if override:
        # apply_override sets both on the class; these put the class back afterwards.
        monkeypatch.setattr(B, "_cudagraph_support", B._cudagraph_support)
        monkeypatch.setattr(
            B, "get_cudagraph_support", classmethod(B.get_cudagraph_support.__func__)
        )
        applied = snapshot.apply_override(f"ROCMAiterMLASparseMetadataBuilder={override}")
        assert applied[0]["was"] == "UNIFORM_BATCH"
    builder = _builder(vc, spec)
    mode = _resolve(vc, uq, spec)
    hooks.enable(wring, gpu_timing=False)
    snap = _first_step(_runner(vc, uq, builder, spec))

    d = vl.CudagraphDispatcher(vc)
    assert d.uniform_decode_query_len == uq  # read from the real SpeculativeConfig
    d.initialize_cudagraph_keys(mode, uniform_decode_query_len=uq)
    RT.in_step = 1
    got, _ = d.dispatch(num_tokens=3 * uq, uniform_decode=True)
    RT.in_step = 0
    hooks.disable()
    (rec,) = [r for r in kit.drain(wring)[0] if isinstance(r, Dispatch)]
    (g,) = snap["groups"]
    if override is None:
        assert (mode.name, got.name, rec.reason) == ("FULL_AND_PIECEWISE", "FULL", Reason.HIT)
        assert "spec_decode_needs_uniform_batch" not in {f["code"] for f in findings(snap)}
        return
    assert mode.name == "PIECEWISE" and got.name == "PIECEWISE"
    assert rec.mode.name == "PIECEWISE" and rec.reason == Reason.BACKEND_SUPPORT_TOO_LOW
    assert g["support"] == override and snap["override"][0]["support"] == override
    assert snap["resolve"]["requested_mode"] == "FULL_AND_PIECEWISE"
    codes = {t["code"] for t in findings(snap)}
    assert {"spec_decode_needs_uniform_batch", "mode_downgraded"} <= codes
