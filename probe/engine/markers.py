"""Live markers inside the vLLM process: roctx (``PROBE_ROCTX=1``) or NVTX (``PROBE_NVTX=1``).

Engine side: imports only the standard library and the record declaration, and the
``roctx`` or ``nvtx`` module only when asked for. NVTX uses :class:`NvtxEmitter`, which has
:class:`RoctxEmitter`'s ``push``/``pop``/``mark``; everything below applies to both.

With ``PROBE_ROCTX=1`` in vLLM's environment and ROCm's ``roctx`` module importable, each
enable of the probe in a process also

- wraps the probe's step and phase hooks (``step.*``, ``phase.*``) in roctx
  ``rangePush``/``rangePop``, so ``rocprofv3 --marker-trace`` (or ``--sys-trace``) records
  ``step 12`` > ``prepare_inputs``, ``metadata_build``, ``forward_launch``... around the
  kernels they launch, with rocprofv3's own timestamps (MRV2's FULL ``forward_launch`` is
  its target replay hook's call, ranged only when it is the launch);
- tees the probe's packers (``RT.put``) so that each graph dispatch, replay and reorder
  decision is also a roctx mark at the moment it is recorded: ``dispatch FULL hit step 12
  tokens 128/128``, ``replay FULL step 12``, ``reorder changed moved 3 step 12``.

Nothing of this exists unless asked for: without the variable :func:`start` returns
``None`` and installs nothing. Without ``roctx`` it logs one error naming what to install
and the probe goes on without it. A fault inside it (a roctx call raising) switches it
off and is counted as the probe's fault ``roctx``; vLLM never sees it.

The core hooks it up with one line at the end of ``probe.engine.hooks.enable()``::

    markers.start(RT, INSTALLER)

The range wrappers sit outside the probe's own wrappers and take the probe hook's place
as ``Hook.wrapper``, so removing the probe's hooks (detach, uninstall) removes them too and
restores vLLM's originals by identity; after ``disable()`` they are dormant (one identity
check). A step range is named ``step N`` with the number the probe is about to give the
step (an MRV2 dummy run is named after the next step too).

Cost, measured by ``benchmarks/nvtx_roctx_overhead.py`` against a roctx stand-in whose
calls do nothing (so it is this module's Python cost, without roctx's own): about 0.4 µs
added per wrapped call for the range and 0.6 µs per decision mark. roctx's own cost with
rocprofv3 attached comes on top.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from probe.records import SPECS, Flag, Mode, Packers, Reason, RecordKind, ReplayKind

__all__ = [
    "DEFAULT_DOMAIN",
    "ENV_VAR",
    "MarkersLive",
    "NvtxEmitter",
    "NvtxUnavailableError",
    "RoctxEmitter",
    "RoctxUnavailableError",
    "start",
]

log = logging.getLogger("probe")

# -- roctx ------------------------------------------------------------------------------

_ROCTX_HELP = (
    "the 'roctx' Python module is not importable. It ships with ROCm's rocprofiler-sdk "
    "(not on PyPI): add /opt/rocm/lib/python{major}.{minor}/site-packages to PYTHONPATH, "
    "or build rocprofiler-sdk with ROCPROFILER_PYTHON_VERSIONS including this interpreter. "
    "Ranges are recorded by 'rocprofv3 --marker-trace' (or --sys-trace)."
)
_ROCTX_API = ("rangePush", "rangePop", "mark", "rangeStart", "rangeStop")


class RoctxUnavailableError(ImportError):
    """The ROCm ``roctx`` module (from rocprofiler-sdk) cannot be imported or is incomplete."""


class RoctxEmitter:
    """Emit roctx ranges and marks from Python so rocprofv3 records them.

    Uses rocprofiler-sdk's ``roctx`` module (``rangePush``/``rangePop`` for nested
    per-thread ranges, ``rangeStart``/``rangeStop`` for ranges that may end on another
    thread, ``mark`` for instants), imported when the emitter is created. With no profiler
    attached the calls are near no-ops. ``importer`` replaces :func:`importlib.import_module`
    (tests pass a fake module)::

        emitter = RoctxEmitter()            # RoctxUnavailableError without ROCm's roctx
        with emitter.range("step 12 FULL bs=64"):
            ...
        emitter.mark("reorder: 3 requests moved")

    Calls go straight to roctx; this class adds no locking or buffering, so put it behind
    the probe's own fault handling on a hot path.
    """

    def __init__(self, *, importer: Callable[[str], ModuleType] = importlib.import_module) -> None:
        try:
            module = importer("roctx")
        except ImportError as exc:
            raise RoctxUnavailableError(
                _ROCTX_HELP.format(major=sys.version_info.major, minor=sys.version_info.minor)
            ) from exc
        missing = [name for name in _ROCTX_API if not callable(getattr(module, name, None))]
        if missing:
            where = getattr(module, "__file__", None) or "<unknown location>"
            raise RoctxUnavailableError(
                f"the 'roctx' module at {where} lacks {', '.join(missing)}; expected ROCm "
                "rocprofiler-sdk's roctx Python bindings"
            )
        self.module = module
        self._push: Callable[[str], Any] = module.rangePush
        self._pop: Callable[[], Any] = module.rangePop
        self._mark: Callable[[str], Any] = module.mark
        self._start: Callable[[str], Any] = module.rangeStart
        self._stop: Callable[[int], Any] = module.rangeStop

    def push(self, message: str) -> None:
        """Open a nested range on this thread (``roctxRangePushA``)."""
        self._push(message)

    def pop(self) -> None:
        """Close this thread's innermost range (``roctxRangePop``)."""
        self._pop()

    def mark(self, message: str) -> None:
        """Record an instant (``roctxMarkA``)."""
        self._mark(message)

    def start(self, message: str) -> int:
        """Open a range that any thread may close; returns its id (``roctxRangeStartA``)."""
        return int(self._start(message))

    def stop(self, range_id: int) -> None:
        """Close a range opened by :meth:`start` (``roctxRangeStop``)."""
        self._stop(range_id)

    @contextlib.contextmanager
    def range(self, message: str) -> Iterator[None]:
        """Push a range for the duration of a ``with`` block; it is popped on exceptions too."""
        self._push(message)
        try:
            yield
        finally:
            self._pop()


# -- NVTX -------------------------------------------------------------------------------

DEFAULT_DOMAIN = "vllm-graph-probe"
"""NVTX domain of every range and mark (Nsight groups rows by domain)."""

_CACHE_LIMIT = 4096


class NvtxUnavailableError(ImportError):
    """The ``nvtx`` package is not importable."""

    def __init__(self, missing: str | None = "nvtx") -> None:
        super().__init__(
            f"NVTX output needs the 'nvtx' extra: pip install 'vllm-graph-probe[nvtx]' "
            f"(or: pip install nvtx); missing: {missing}",
            name=missing,
        )
        self.extra = "nvtx"


class NvtxEmitter:
    """Push, pop and mark NVTX ranges in one domain.

    ``importer`` replaces :func:`importlib.import_module` (tests pass a fake ``nvtx``).
    Event attributes are built once per distinct message and cached (up to 4096
    messages; past that they are built each time).
    """

    def __init__(
        self,
        domain: str = DEFAULT_DOMAIN,
        *,
        color: str | None = "green",
        importer: Callable[[str], ModuleType] = importlib.import_module,
    ) -> None:
        try:
            module = importer("nvtx")
        except ImportError as exc:
            raise NvtxUnavailableError(getattr(exc, "name", None) or "nvtx") from exc
        get_domain = getattr(module, "get_domain", None)
        if not callable(get_domain):
            where = getattr(module, "__file__", None) or "<unknown location>"
            raise NvtxUnavailableError(f"nvtx.get_domain (the module at {where} lacks it)")
        self.module = module
        self.domain_name = domain
        self._domain = get_domain(domain)
        self._color = color
        self._attrs: dict[str, Any] = {}
        self._push: Callable[[Any], Any] = self._domain.push_range
        self._pop: Callable[[], Any] = self._domain.pop_range
        self._mark: Callable[[Any], Any] = self._domain.mark

    def _attributes(self, message: str) -> Any:
        a = self._attrs.get(message)
        if a is None:
            a = self._domain.get_event_attributes(message=message, color=self._color)
            if len(self._attrs) < _CACHE_LIMIT:
                self._attrs[message] = a
        return a

    def push(self, message: str) -> None:
        """Open a nested range on this thread (``nvtxDomainRangePushEx``)."""
        self._push(self._attributes(message))

    def pop(self) -> None:
        """Close this thread's innermost range (``nvtxDomainRangePop``)."""
        self._pop()

    def mark(self, message: str) -> None:
        """Record an instant (``nvtxDomainMarkEx``)."""
        self._mark(self._attributes(message))

    @contextlib.contextmanager
    def range(self, message: str) -> Iterator[None]:
        """A range for the duration of a ``with`` block; popped on exceptions too."""
        self.push(message)
        try:
            yield
        finally:
            self._pop()


# -- the live tee and ranges --------------------------------------------------------------

ENV_VAR = "PROBE_ROCTX"
"""``1``: emit roctx ranges and marks live in each vLLM process the probe is enabled in."""

_WRAPPED_FAMILIES = ("step.", "phase.")
# hooks whose wrapper returns a context manager instead of doing the work inside the call
_NOT_WRAPPED = frozenset({"phase.mrv2.forward_context"})
# replay hooks whose call is the forward launch in one case: MRV2's target FULL launch is
# the base run_fullgraph (ModelCudaGraphManager's replay through super()), in a step with
# no forward open, outside the drafter (as probe.engine.hooks.replay.run_fullgraph decides)
_LAUNCH_RANGES = frozenset({"replay.mrv2.run_fullgraph"})

_CURRENT: list[MarkersLive | None] = [None]

_TEED = (RecordKind.DISPATCH, RecordKind.REPLAY, RecordKind.FORWARD, RecordKind.REORDER)
_DRAFTER = int(Flag.DRAFTER)


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


def _name(enum_type: Any, v: int, lower: bool = False) -> str:
    try:
        name: str = enum_type(v).name
    except ValueError:
        return str(v)
    return name.lower() if lower else name


def messages(kind: RecordKind, fields: tuple[Any, ...]) -> list[str]:
    """The marks for one DISPATCH, REPLAY, FORWARD or REORDER record, from its packer's
    fields (in declaration order, :mod:`probe.records`)."""
    r = dict(zip((f.name for f in SPECS[kind].fields), fields, strict=True))
    step = r["step"]
    who = "drafter " if r["flags"] & _DRAFTER else ""
    if kind == RecordKind.DISPATCH:
        return [
            f"{who}dispatch {_name(Mode, r['mode'])} {_name(Reason, r['reason'], True)} "
            f"step {step} tokens {r['num_tokens']}/{r['padded_tokens']}"
        ]
    if kind == RecordKind.REPLAY:
        return [f"{who}{_name(ReplayKind, r['kind'], True)} {_name(Mode, r['mode'])} step {step}"]
    if kind == RecordKind.FORWARD:
        out = [f"{who}replay FULL step {step}"] * r["full_replays"]
        if r["pieces"]:
            out.append(f"{who}replay PIECEWISE x{r['pieces']} step {step}")
        if r["captures"]:
            out.append(f"{who}capture {_name(Mode, r['mode'])} x{r['captures']} step {step}")
        return out
    changed = "changed" if r["changed"] else "unchanged"
    return [f"reorder {changed} moved {r['moved']} step {step}"]


class MarkersLive:
    """The live side of one enable: a tee over ``rt.put`` and the range wrappers."""

    def __init__(self, rt: Any, emitter: Any) -> None:
        self.rt = rt
        self.emitter = emitter
        self._inner: Packers = rt.put
        put = Packers()
        for spec in SPECS.values():
            inner = getattr(self._inner, spec.name)
            setattr(put, spec.name, self._tee(spec.kind, inner) if spec.kind in _TEED else inner)
        self.put = put  # identity is the switch: rt.put is self.put while active
        self.marks = 0
        self.wrapped: list[str] = []

    @property
    def active(self) -> bool:
        """Whether this is the current emitter and the probe still writes through it."""
        return _CURRENT[0] is self and self.rt.put is self.put

    # -- marks (the tee) ------------------------------------------------------------------

    def _tee(self, kind: RecordKind, inner: Callable[..., Any]) -> Callable[..., Any]:
        def tee(*fields: Any) -> Any:
            ok = inner(*fields)
            try:
                for m in messages(kind, fields):
                    self.emitter.mark(m)
                    self.marks += 1
            except Exception as exc:
                self.fail(exc)
            return ok

        return tee

    # -- ranges ---------------------------------------------------------------------------

    def wrap_hooks(self, installer: Any) -> list[str]:
        """Put a range around each installed step/phase hook not wrapped yet."""
        done = []
        for hook in list(installer.hooks.values()):
            hid = hook.hook_id
            wanted = hid.startswith(_WRAPPED_FAMILIES) or hid in _LAUNCH_RANGES
            if not wanted or hid in _NOT_WRAPPED:
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
        launch_only = hook_id in _LAUNCH_RANGES
        name = "forward_launch" if launch_only else _range_name(hook_id)
        is_step = hook_id.startswith("step.") and hook_id.endswith(".execute_model")

        def roctx_range(*args: Any, **kwargs: Any) -> Any:
            live = _CURRENT[0]
            if live is None or rt.put is not live.put:
                return inner(*args, **kwargs)
            if launch_only and not (
                rt.in_step
                and not rt.drafter
                and not rt.fwd_open
                and args
                and type(args[0]).__name__ == "ModelCudaGraphManager"
            ):
                return inner(*args, **kwargs)  # a replay of its own, not the launch
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
            if self.rt.put is self.put:
                self.rt.put = self._inner
                self.rt.tee = 0
            self.rt.fault("roctx", exc, disabled=True)
        except Exception:
            pass


def start(
    rt: Any,
    installer: Any,
    environ: Mapping[str, str] | None = None,
    *,
    importer: Callable[[str], ModuleType] = importlib.import_module,
) -> MarkersLive | None:
    """Start live roctx output for this enable when ``PROBE_ROCTX=1``; else do nothing.

    Call right after the probe is enabled (``rt.put`` are the ring writer's). Installs
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
        try:
            emitter = NvtxEmitter(importer=importer)
        except NvtxUnavailableError as exc:
            log.error("vllm-graph-probe: PROBE_NVTX=1 but %s", exc)
            return None
    else:
        _CURRENT[0] = None
        rt.tee = 0
        return None
    try:
        live = MarkersLive(rt, emitter)
        _CURRENT[0] = live
        rt.put = live.put
        rt.tee = 1  # the compiled hooks that stage records themselves write through rt.put
        live.wrap_hooks(installer)
        rt.on_first_step.append(lambda runner: live.wrap_hooks(installer))
        return live
    except Exception as exc:  # never stop the probe (or vLLM) over roctx
        _CURRENT[0] = None
        log.error("vllm-graph-probe: roctx ranges not started: %r", exc)
        return None
