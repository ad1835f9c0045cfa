"""roctx (``PROBE_ROCTX=1``) or NVTX (``PROBE_NVTX=1``) ranges and marks emitted live
inside the vLLM process. NVTX uses :class:`exporters.nvtx.NvtxEmitter`, which has the
roctx emitter's ``push``/``pop``/``mark``; everything below applies to both.

With ``PROBE_ROCTX=1`` in vLLM's environment and ROCm's ``roctx`` module importable, each
enable of the probe in a process also

- wraps the probe's step and phase hooks (``step.*``, ``phase.*``) in roctx
  ``rangePush``/``rangePop``, so ``rocprofv3 --marker-trace`` (or ``--sys-trace``) records
  ``step 12`` > ``prepare_inputs``, ``metadata_build``, ``forward_launch``... around the
  kernels they launch, with rocprofv3's own timestamps;
- tees the probe's record writer so that each graph dispatch, replay and reorder decision
  is also a roctx mark at the moment it is recorded: ``dispatch FULL hit step 12 tokens
  128/128``, ``replay FULL step 12``, ``reorder changed moved 3 step 12``.

Nothing of this exists unless asked for: without the variable :func:`start` returns
``None`` and installs nothing. Without ``roctx`` it logs one error naming what to install
and the probe goes on without it. A fault inside it (a roctx call raising) switches it
off and is counted as the probe's fault ``roctx``; vLLM never sees it.

The core hooks it up with one line at the end of ``probe.hooks.enable()``::

    importlib.import_module("exporters.roctx_live").start(RT, INSTALLER)

The range wrappers sit outside the probe's own wrappers and take the probe hook's place
as ``Hook.wrapper``, so removing the probe's hooks (detach, uninstall) removes them too and
restores vLLM's originals by identity; after ``disable()`` they are dormant (one identity
check). A step range is named ``step N`` with the number the probe is about to give the
step (an MRV2 dummy run is named after the next step too).

Cost, measured by ``benchmarks/nvtx_roctx_overhead.py`` against a roctx stand-in whose
calls do nothing (so it is this module's Python cost, without roctx's own): about 0.4 µs
added per wrapped call for the range and 0.6 µs per decision mark. A V1 MTP step has about
10 wrapped calls and 3-4 decisions: 6-7 µs per step, under 0.1% of a 9 ms step (about
0.3% of MRV2's 2.3 ms step). roctx's own cost with rocprofv3 attached comes on top.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from exporters.roctx_emit import RoctxEmitter, RoctxUnavailableError
from probe.records import Flag, Mode, Reason, RecordKind, ReplayKind

__all__ = ["ENV_VAR", "RoctxLive", "start"]

log = logging.getLogger("probe")

ENV_VAR = "PROBE_ROCTX"
"""``1``: emit roctx ranges and marks live in each vLLM process the probe is enabled in."""

_WRAPPED_FAMILIES = ("step.", "phase.")
# hooks whose wrapper returns a context manager instead of doing the work inside the call
_NOT_WRAPPED = frozenset({"phase.mrv2.forward_context"})

_CURRENT: list[RoctxLive | None] = [None]

_DISPATCH, _REPLAY, _REORDER = (
    int(RecordKind.DISPATCH),
    int(RecordKind.REPLAY),
    int(RecordKind.REORDER),
)
_DRAFTER = int(Flag.DRAFTER)
_MODES = {int(m): m.name for m in Mode}
_REASONS = {int(r): r.name.lower() for r in Reason}
_REPLAY_KINDS = {int(k): k.name.lower() for k in ReplayKind}


def _enabled(environ: Mapping[str, str] | None, which: str = "ROCTX") -> bool:
    from probe import config

    var = getattr(config, which)
    try:
        return config.get_bool(var, os.environ if environ is None else environ)
    except config.ConfigError as exc:
        log.error("vllm-graph-probe: %s; %s ranges are off", exc, which.lower())
        return False


def _range_name(hook_id: str) -> str:
    parts = hook_id.split(".")
    if parts[0] == "phase" and len(parts) >= 3 and parts[1] in ("v1", "mrv2"):
        return parts[2]
    return parts[-1]


class RoctxLive:
    """The roctx side of one enable: a tee over ``rt.write`` and the range wrappers."""

    def __init__(self, rt: Any, emitter: RoctxEmitter) -> None:
        self.rt = rt
        self.emitter = emitter
        self._inner: Callable[..., bool] = rt.write
        self.write: Callable[..., bool] = self._write  # bound once: identity is the switch
        self._kinds = frozenset({_DISPATCH, _REPLAY, _REORDER})
        self.marks = 0
        self.wrapped: list[str] = []

    @property
    def active(self) -> bool:
        """Whether this is the current emitter and the probe still writes through it."""
        return _CURRENT[0] is self and self.rt.write is self.write

    # -- marks (the tee) ------------------------------------------------------------------

    def _write(self, *fields: int) -> bool:
        ok = self._inner(*fields)
        if fields and fields[0] in self._kinds:
            try:
                self.emitter.mark(self.message(fields))
                self.marks += 1
            except Exception as exc:
                self.fail(exc)
        return ok

    @staticmethod
    def message(fields: tuple[int, ...]) -> str:
        """The mark text for a DISPATCH, REPLAY or REORDER record (fields as written)."""
        kind, a, b, c, step = fields[:5]
        who = "drafter " if c & _DRAFTER else ""
        if kind == _DISPATCH:
            return (
                f"{who}dispatch {_MODES.get(a, a)} {_REASONS.get(b, b)} step {step} "
                f"tokens {fields[7]}/{fields[8]}"
            )
        if kind == _REPLAY:
            return f"{who}{_REPLAY_KINDS.get(b, b)} {_MODES.get(a, a)} step {step}"
        if kind == _REORDER:
            return f"reorder {'changed' if a else 'unchanged'} moved {fields[11]} step {step}"
        return f"record {kind} step {step}"

    # -- ranges ---------------------------------------------------------------------------

    def wrap_hooks(self, installer: Any) -> list[str]:
        """Put a range around each installed step/phase hook not wrapped yet."""
        done = []
        for hook in list(installer.hooks.values()):
            hid = hook.hook_id
            if not hid.startswith(_WRAPPED_FAMILIES) or hid in _NOT_WRAPPED:
                continue
            if getattr(hook.wrapper, "__probe_roctx__", False):
                continue
            outer = self._range_wrapper(hook.wrapper, hid)
            if vars(hook.owner).get(hook.target.name) is not hook.wrapper:
                continue  # someone else replaced it: leave it alone
            setattr(hook.owner, hook.target.name, outer)
            hook.wrapper = outer  # the probe's removal now removes both layers
            done.append(hid)
        self.wrapped.extend(done)
        return done

    def _range_wrapper(self, inner: Callable[..., Any], hook_id: str) -> Callable[..., Any]:
        rt = self.rt
        name = _range_name(hook_id)
        is_step = hook_id.startswith("step.") and hook_id.endswith(".execute_model")

        def roctx_range(*args: Any, **kwargs: Any) -> Any:
            live = _CURRENT[0]
            if live is None or rt.write is not live.write:
                return inner(*args, **kwargs)
            try:
                live.emitter.push(f"step {rt.step + 1}" if is_step else name)
            except Exception as exc:
                live.fail(exc)
                return inner(*args, **kwargs)
            try:
                return inner(*args, **kwargs)
            finally:
                try:
                    live.emitter.pop()
                except Exception as exc:
                    live.fail(exc)

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(roctx_range, attr, getattr(inner, attr))
        roctx_range.__wrapped__ = inner  # type: ignore[attr-defined]
        roctx_range.__probe_hook__ = getattr(inner, "__probe_hook__", hook_id)  # type: ignore[attr-defined]
        roctx_range.__probe_roctx__ = True  # type: ignore[attr-defined]
        return roctx_range

    def fail(self, exc: BaseException) -> None:
        """Switch roctx off in this process (a roctx call raised); never raises."""
        try:
            if _CURRENT[0] is self:
                _CURRENT[0] = None
            if self.rt.write is self.write:
                self.rt.write = self._inner
            self.rt.fault("roctx", exc, disabled=True)
        except Exception:
            pass


def start(
    rt: Any,
    installer: Any,
    environ: Mapping[str, str] | None = None,
    *,
    importer: Callable[[str], ModuleType] = importlib.import_module,
) -> RoctxLive | None:
    """Start live roctx output for this enable when ``PROBE_ROCTX=1``; else do nothing.

    Call right after the probe is enabled (``rt.write`` is the ring writer's). Installs
    the tee now, wraps the step/phase hooks installed now, and the rest (deferred and
    late targets) on the first step. Never raises: a missing ``roctx`` is logged.
    """
    emitter: Any
    if _enabled(environ):
        try:
            emitter = RoctxEmitter(importer=importer)
        except RoctxUnavailableError as exc:
            log.error("vllm-graph-probe: %s=1 but %s", ENV_VAR, exc)
            return None
    elif _enabled(environ, "NVTX"):
        # the same ranges and marks for Nsight Systems: NvtxEmitter has roctx's interface
        from exporters.nvtx import NvtxEmitter, NvtxUnavailableError

        try:
            emitter = NvtxEmitter(importer=importer)
        except NvtxUnavailableError as exc:
            log.error("vllm-graph-probe: PROBE_NVTX=1 but %s", exc)
            return None
    else:
        _CURRENT[0] = None
        return None
    try:
        live = RoctxLive(rt, emitter)
        _CURRENT[0] = live
        rt.write = live.write
        live.wrap_hooks(installer)
        rt.on_first_step.append(lambda runner: live.wrap_hooks(installer))
        return live
    except Exception as exc:  # never stop the probe (or vLLM) over roctx
        _CURRENT[0] = None
        log.error("vllm-graph-probe: roctx ranges not started: %r", exc)
        return None
