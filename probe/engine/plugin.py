"""The vLLM general plugin: arms every vLLM process with dormant hooks.

vLLM calls :func:`register` once in each process it starts (API server, engine core, each
worker), through the ``vllm.general_plugins`` entry point this package declares. It:

1. applies the what-if graph-support override if ``PROBE_CG_SUPPORT_OVERRIDE`` is set
   (before vLLM resolves the graph mode);
2. installs the always-on start-up hook (the graph-mode resolve); the per-step hooks are
   installed only while a reader is attached, so a detached process pays nothing (on
   Python 3.13+, hooks a detach parked to spare their classes' version tags stay dormant:
   ``probe.engine.hooks.TAG_BUDGET``);
3. with ``PROBE_ENABLE=1`` (``probe record``), creates this process's ring and enables;
4. opens the control socket so ``probe attach`` can enable it later (``PROBE_CONTROL``).

Nothing here may stop vLLM from starting: every failure is logged and the process goes on
without the probe.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from probe import config

log = logging.getLogger("probe")

RING_PREFIX = "ring-"
RING_SUFFIX = ".shm"


def ring_path_for(pid: int, environ: Mapping[str, str] | None = None) -> str:
    from probe.ring_dir import UnsafeRingDirError, default_ring_dir

    env = os.environ if environ is None else environ
    run_dir = config.get(config.RUN_DIR, env)
    if run_dir is not None and not os.path.isabs(run_dir):
        raise UnsafeRingDirError(run_dir, "PROBE_RUN_DIR must be an absolute path")
    base = default_ring_dir() if run_dir is None else run_dir
    return os.path.join(str(base), f"{RING_PREFIX}{pid}{RING_SUFFIX}")


def start_ring(environ: Mapping[str, str] | None = None) -> object:
    """Create this process's ring and enable the hooks on it; returns the writer."""
    from probe.engine import hooks
    from probe.engine.ring_writer import RingWriter

    env = os.environ if environ is None else environ
    capacity = config.get_int(config.RING_CAPACITY, env)
    path = ring_path_for(os.getpid(), env)
    if os.path.exists(path):  # a stale ring of a previous process with our pid
        os.unlink(path)
    writer = RingWriter.create(path, capacity)
    fams = config.get(config.HOOKS, env)
    hooks.attach(
        writer,
        families=[f.strip() for f in fams.split(",")] if fams else None,
        gpu_timing=config.get_int(config.GPU_TIMING, env),
        sample_every=max(1, config.get_int(config.SAMPLE_EVERY, env)),
    )
    return writer


def register() -> None:
    """Entry point for ``vllm.general_plugins``; never raises."""
    env = os.environ
    try:
        if not config.get_bool(config.PLUGIN, env):
            return
    except config.ConfigError as exc:
        log.error("vllm-graph-probe: %s; the probe is off in this process", exc)
        return
    from probe.engine import hooks
    from probe.engine.hooks import snapshot
    from probe.engine.runtime import RT

    override = config.get(config.CG_SUPPORT_OVERRIDE, env)
    if override:
        try:
            applied = snapshot.apply_override(override)
            log.warning("vllm-graph-probe: what-if graph support override applied: %s", applied)
        except Exception as exc:
            RT.static["override_error"] = str(exc)
            log.error(
                "vllm-graph-probe: %s=%r not applied: %s",
                config.CG_SUPPORT_OVERRIDE.name,
                override,
                exc,
            )
    try:
        # Detached processes carry only the always-on hooks (the start-up resolve): the
        # rest are installed by attach (PROBE_ENABLE below, or the control socket).
        hooks.install(list(hooks.ALWAYS_ON))
    except Exception as exc:
        log.error("vllm-graph-probe: hooks not installed: %r", exc)
        return
    try:
        if config.get_bool(config.ENABLE, env):
            start_ring(env)
    except Exception as exc:
        log.error("vllm-graph-probe: recording not started in pid %d: %r", os.getpid(), exc)
    try:
        if config.get_bool(config.CONTROL, env):
            import importlib

            # the control socket (probe attach) is optional: absent in this build
            importlib.import_module("probe.engine.control_server").start_server(env)
    except ImportError:
        pass
    except Exception as exc:
        log.warning("vllm-graph-probe: control socket not opened: %r", exc)
