"""Shared fixtures: a clean probe state and a real ring to record into."""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ring_drain import drain

from probe.engine import accel
from probe.engine.ring_writer import RingWriter

MISSING = object()

HOT_PATHS = ["compiled", "python"] if accel.COMPILED else ["python"]


@pytest.fixture(params=HOT_PATHS)
def hot_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test once per hot path (probe.engine.accel): the compiled one, when built, and
    pure Python. Ring writers, packers and wrappers made inside the test use it."""
    with accel.use(request.param):
        yield request.param


@pytest.fixture
def clean_probe() -> Iterator[None]:
    """Leaves no hook installed and the runtime as in a fresh process, pass or fail."""
    from probe.engine import hooks
    from probe.engine.runtime import RT

    RT.reset()
    yield
    hooks.disable()
    hooks._deferred.clear()
    hooks._PostImport.disarm()
    hooks.PARKED.clear()
    if hooks.INSTALLER.hooks:
        hooks.INSTALLER.uninstall()
    RT.reset()


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A private run directory (0o700) with a short path: a Unix socket's path must fit in
    108 bytes, which pytest's ``tmp_path`` may not."""
    d = Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp"))
    os.chmod(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[RingWriter]:
    writer = RingWriter.create(tmp_path / "ring", capacity=4096)
    yield writer
    writer.close()


def owner_of(module: str, owner: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in owner.split(".") if owner else ():
        obj = getattr(obj, part)
    return obj


def originals(targets: Any) -> dict[str, tuple[Any, Any]]:
    """hook_id -> (owner, the object in ``vars(owner)`` or MISSING), for resolvable targets."""
    out: dict[str, tuple[Any, Any]] = {}
    for t in targets:
        try:
            owner = owner_of(t.module, t.owner)
        except Exception:
            continue
        if t.name in vars(owner) or (t.inherit and hasattr(owner, t.name)):
            out[t.hook_id] = (owner, vars(owner).get(t.name, MISSING))
    return out


def assert_restored(target: Any, owner: Any, original: Any) -> None:
    if original is MISSING:
        assert target.name not in vars(owner), target.hook_id
    else:
        assert vars(owner)[target.name] is original, target.hook_id


def assert_wrapped(target: Any, owner: Any) -> None:
    current = vars(owner).get(target.name)
    assert getattr(current, "__probe_hook__", None) == target.hook_id, target.hook_id


@pytest.fixture
def kit() -> Any:
    """The helpers above, for test modules in any folder (no import of conftest needed)."""
    import types

    return types.SimpleNamespace(
        MISSING=MISSING,
        drain=drain,
        owner_of=owner_of,
        originals=originals,
        assert_restored=assert_restored,
        assert_wrapped=assert_wrapped,
    )


@pytest.fixture(scope="module")
def v1_dispatcher() -> Any:
    """A real CudagraphDispatcher on a real VllmConfig (cpu-testing.md section 2)."""
    from vllm.config import CompilationMode, CUDAGraphMode, VllmConfig
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    vc = VllmConfig()
    cc = vc.compilation_config
    cc.mode = CompilationMode.NONE
    cc.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    cc.cudagraph_capture_sizes = [2, 4, 8, 16, 32]
    cc.max_cudagraph_capture_size = 32
    d = CudagraphDispatcher(vc)
    d.uniform_decode_query_len = 2
    d.initialize_cudagraph_keys(CUDAGraphMode.FULL_DECODE_ONLY, uniform_decode_query_len=2)
    return d


# -- optional packages: a test module that needs one skips, saying which -----------------

OPTIONAL_PACKAGES = {
    "hypothesis": "the property-based tests (dev extra)",
    "numpy": "the dev extra",
    "torch": "the dev extra (CPU torch)",
    "vllm": "vLLM (the engine and wheel tests)",
    "perfetto": "the 'perfetto' extra",
    "prometheus_client": "the 'prometheus' extra",
    "grpc": "the 'otlp' extra",
    "opentelemetry": "the 'otlp' extra",
    "google": "the 'otlp' extra (protobuf)",
    "matplotlib": "the dev extra (dashboard rendering)",
    "nvtx": "the 'nvtx' extra",
}


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """A test module whose import fails for want of an optional package is skipped with
    the package's name and the extra that brings it, not an error: ``pip install -e .``
    alone runs every other test."""
    report = yield
    if report.failed and isinstance(collector, pytest.Module):
        import re

        text = str(report.longrepr)
        missing = re.findall(r"ModuleNotFoundError: No module named '([\w.]+)'", text)
        top = missing[-1].split(".")[0] if missing else ""
        if top in OPTIONAL_PACKAGES:
            report.outcome = "skipped"
            report.longrepr = (
                str(collector.path),
                None,
                f"Skipped: needs {top} ({OPTIONAL_PACKAGES[top]}), not installed",
            )
            report.result = []
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A test (or its fixture) that imports an optional package which is not installed at
    all is skipped with the package's name, like a module that needs one; a package that is
    installed but fails to import still fails."""
    report = yield
    exc = call.excinfo
    if report.failed and exc is not None and exc.errisinstance(ModuleNotFoundError):
        top = (getattr(exc.value, "name", None) or "").split(".")[0]
        if top in OPTIONAL_PACKAGES and _absent(top):
            report.outcome = "skipped"
            report.longrepr = (
                str(item.path),
                item.location[1],
                f"Skipped: needs {top} ({OPTIONAL_PACKAGES[top]}), not installed",
            )
    return report


def _absent(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is None
