"""The hook framework: one table of targets drives install and uninstall.

A hook module declares ``TARGETS``: a tuple of :class:`Target`, each naming an owner
(a class or a module, by dotted path) and an attribute, and a factory that builds the
wrapper from the original. :class:`Installer` resolves every target, saves the original
object found in ``owner.__dict__`` and restores exactly that object on uninstall. A target
that does not resolve in the running vLLM is reported by name and skipped.

    >>> inst = Installer()
    >>> gone = Target("demo.gone", "probe_no_such_module", "", "f", lambda orig, hook: orig)
    >>> report = inst.install([gone])
    >>> report.missing[0][0], report.installed
    ('demo.gone', [])

Wrappers follow three rules (docs/architecture.md, "Rules for every hook"):
- bypass first: ``if not RT.enabled: return orig(*args, **kwargs)``;
- the original's result and exceptions pass through unchanged;
- a fault in probe code is counted and the hook is removed (``Hook.fail``), never raised.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import logging
import sys
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.engine import accel
from probe.engine.runtime import BOOTTIME, RT

log = logging.getLogger("probe")

_MISSING = object()

Factory = Callable[[Callable[..., Any], "Hook"], Callable[..., Any]]


@dataclass(frozen=True)
class Target:
    """One attribute to wrap.

    Attributes:
        hook_id: stable name, ``family.what`` (e.g. ``"step.v1.execute_model"``).
        module: dotted module path that holds the owner.
        owner: class name inside ``module`` (dotted for nested), or ``""`` for the module.
        name: attribute to wrap.
        factory: ``factory(original, hook) -> wrapper``.
        inherit: wrap even when ``name`` is inherited rather than in ``owner.__dict__``
            (the wrapper is then set on the owner and deleted again on uninstall).
        gate: put the wrapper behind the compiled dormant path (:func:`probe.engine.accel.gate`):
            ``"on"`` calls it only while the probe is enabled, ``"sampling"`` also while
            sampling; ``""`` (hooks that must run while off, e.g. the static snapshot)
            always calls it. A wrapper with a gate must itself bypass when off, which is
            what runs on the pure-Python path.
    """

    hook_id: str
    module: str
    owner: str
    name: str
    factory: Factory
    inherit: bool = False
    gate: str = ""
    family: str = ""  # set by the Family that lists it

    @property
    def family_name(self) -> str:
        """The family this target belongs to (its hook-id prefix if no Family set it)."""
        return self.family or self.hook_id.split(".", 1)[0]


LateTargets = Callable[[Any], list[tuple[Target, Any]]]


@dataclass(frozen=True)
class Family:
    """One hook module's targets: the one table install, detach, status and enable use.

    Attributes:
        name: the family's name (``probe record --hooks NAME``, the control socket).
        versions: the vLLM releases its targets were checked on.
        targets: static targets, resolved by module and owner name at install.
        late: targets that exist only on live objects, resolved from the model runner on
            the first enabled step (builders, the model's logits, the drafter).
    """

    name: str
    versions: str
    targets: tuple[Target, ...]
    late: LateTargets | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "targets", tuple(dataclasses.replace(t, family=self.name) for t in self.targets)
        )

    def late_targets(self, runner: Any) -> list[tuple[Target, Any]]:
        """The late targets for ``runner``, each marked with this family."""
        if self.late is None:
            return []
        return [(dataclasses.replace(t, family=self.name), o) for t, o in self.late(runner)]


@dataclass
class Hook:
    """A wrapper in place: what was replaced, by what, and how to undo it."""

    target: Target
    owner: Any
    original: Any  # the object that was in owner.__dict__ (or _MISSING when inherited)
    wrapper: Any = None
    installer: Installer | None = None

    @property
    def hook_id(self) -> str:
        return self.target.hook_id

    @property
    def family(self) -> str:
        return self.target.family_name

    def fail(self, exc: BaseException) -> None:
        """Called by a wrapper when probe code raised: count it and remove this hook."""
        try:
            if self.installer is not None:
                self.installer.remove(self)
            RT.fault(self.hook_id, exc, disabled=True)
        except Exception:
            pass


@dataclass
class InstallReport:
    installed: list[str] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    #: targets whose module the installed vLLM does not ship at all (e.g. the classic
    #: runner's on a release with Model Runner V2 only): not a missing hook
    not_in_vllm: list[tuple[str, str]] = field(default_factory=list)

    def add_not_in_vllm(self, target: Target) -> None:
        """Record ``target`` as not in this vLLM, once."""
        if all(hid != target.hook_id for hid, _ in self.not_in_vllm):
            self.not_in_vllm.append((target.hook_id, f"{target.module}: not in this vLLM"))


def not_in_vllm(module: str) -> bool:
    """Whether ``module`` is a ``vllm`` module the installed vLLM does not ship (a file
    check under the package's folder: nothing is imported). False where vLLM itself is
    not installed: that is a missing target, not a release without it."""
    top, _, rest = module.partition(".")
    if top != "vllm" or not rest:
        return False
    paths = list(getattr(sys.modules.get(top), "__path__", None) or ())
    if not paths:
        try:
            spec = importlib.util.find_spec(top)  # a top-level name: nothing is imported
        except (ImportError, ValueError):
            return False
        paths = list(spec.submodule_search_locations or ()) if spec is not None else []
    if not paths:
        return False
    rel = rest.replace(".", "/")
    return not any(
        (Path(p) / f"{rel}.py").exists() or (Path(p) / rel / "__init__.py").exists() for p in paths
    )


def loaded_runner_class(module: str, runner: Any) -> type | None:
    """``module``'s ``GPUModelRunner`` class if that module is loaded and ``runner`` is an
    instance of it (a platform subclass included), else None. Late targets use it to tell
    the classic runner from Model Runner V2 without importing either."""
    cls = getattr(sys.modules.get(module), "GPUModelRunner", None)
    return cls if isinstance(cls, type) and isinstance(runner, cls) else None


def resolve_owner(module: str, owner: str) -> Any:
    """Import ``module`` and walk ``owner``; raises LookupError with a readable reason."""
    try:
        obj: Any = importlib.import_module(module)
    except Exception as exc:  # ImportError, or vLLM failing to import on this platform
        raise LookupError(f"{module}: cannot import ({type(exc).__name__}: {exc})") from None
    for part in owner.split(".") if owner else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LookupError(f"{module}.{owner}: no attribute {part!r}") from None
    return obj


def as_installed(func: Callable[..., Any], wrapper: Any, gate: str | None, rt: Any = None) -> Any:
    """A hook's wrapper as the installer puts it in place: a Python function behind the
    compiled dormant gate when its target asks for one (``gate``: "on" or "sampling"); a
    compiled wrapper as it is (it checks the switch itself). The calibration builds its
    wrappers the same way, so it times what runs."""
    if gate and isinstance(wrapper, types.FunctionType):
        return accel.gate(func, wrapper, RT if rt is None else rt, sampling=gate == "sampling")
    return wrapper


class Installer:
    """Installs and removes hooks, keyed by (owner, name); restores originals by identity."""

    def __init__(self) -> None:
        self.hooks: dict[tuple[int, str], Hook] = {}
        # class -> attribute writes this installer made on it: each can spend one of its
        # type-version tags (capped per class from CPython 3.13)
        self.modified: dict[type, int] = {}

    def _wrote(self, owner: Any) -> None:
        if isinstance(owner, type):
            self.modified[owner] = self.modified.get(owner, 0) + 1

    def writes_felt_by(self, cls: type) -> int:
        """The attribute writes this installer made on ``cls`` or any class in its MRO:
        each one cleared ``cls``'s version tag, so this bounds the tags it made ``cls``
        spend."""
        return sum(self.modified.get(c, 0) for c in cls.__mro__)

    def install(self, targets: Iterable[Target]) -> InstallReport:
        report = InstallReport()
        for target in targets:
            if not_in_vllm(target.module):
                report.add_not_in_vllm(target)
                continue
            try:
                owner = resolve_owner(target.module, target.owner)
            except LookupError as exc:
                report.missing.append((target.hook_id, str(exc)))
                continue
            if not self.install_on(target, owner, report):
                continue
        return report

    def install_on(self, target: Target, owner: Any, report: InstallReport | None = None) -> bool:
        """Wrap ``target.name`` on an already-resolved owner (used for late targets)."""
        key = (id(owner), target.name)
        if key in self.hooks:
            log.warning("probe: %s already installed on %r; unchanged", target.hook_id, owner)
            if report is not None:
                report.already.append(target.hook_id)
            return False
        original = vars(owner).get(target.name, _MISSING)
        if original is _MISSING:
            if not target.inherit or not hasattr(owner, target.name):
                if report is not None:
                    where = getattr(owner, "__qualname__", getattr(owner, "__name__", owner))
                    report.missing.append((target.hook_id, f"{where} has no {target.name!r}"))
                return False
            func = getattr(owner, target.name)
        else:
            func = original
        if isinstance(func, (staticmethod, classmethod)):
            if report is not None:
                report.missing.append((target.hook_id, f"{target.name!r} is not a plain function"))
            return False
        hook = Hook(target, owner, original, installer=self)
        wrapper = as_installed(func, target.factory(func, hook), target.gate)
        hook.wrapper = wrapper
        _mark(hook.wrapper, func, target.hook_id)
        setattr(owner, target.name, hook.wrapper)
        self._wrote(owner)
        self.hooks[key] = hook
        if report is not None:
            report.installed.append(target.hook_id)
        return True

    def remove(self, hook: Hook) -> None:
        key = (id(hook.owner), hook.target.name)
        if self.hooks.get(key) is not hook:
            return
        del self.hooks[key]
        current = vars(hook.owner).get(hook.target.name, _MISSING)
        if current is not hook.wrapper:
            log.warning(
                "probe: %s was replaced by someone else; leaving %r in place",
                hook.hook_id,
                current,
            )
            return
        if hook.original is _MISSING:
            delattr(hook.owner, hook.target.name)
        else:
            setattr(hook.owner, hook.target.name, hook.original)
        self._wrote(hook.owner)

    def uninstall(self) -> list[str]:
        """Remove every hook this installer placed; returns their ids. Idempotent."""
        if not self.hooks:
            log.warning("probe: uninstall with nothing installed; unchanged")
            return []
        removed = []
        for hook in list(self.hooks.values()):
            self.remove(hook)
            removed.append(hook.hook_id)
        return removed

    def installed_ids(self) -> list[str]:
        return sorted(h.hook_id for h in self.hooks.values())


def _mark(wrapper: Any, original: Any, hook_id: str) -> None:
    """Make the wrapper look like the original to introspection (name, doc, signature):
    a Python function or a compiled wrapper (which has a ``__dict__`` for this)."""
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(wrapper, attr, getattr(original, attr))
    with contextlib.suppress(AttributeError, TypeError):
        wrapper.__wrapped__ = original
        wrapper.__probe_hook__ = hook_id


def timed(orig: Callable[..., Any], record: Callable[..., Any], rt: Any = RT) -> Callable[..., Any]:
    """The pure-Python twin of a compiled hook that hands its result to ``record(result,
    t0, t1, *args, **kwargs)`` (dispatch, replay, reorder): bypass when ``rt`` (the
    process's runtime unless given) is off, CLOCK_BOOTTIME first and last thing around the
    original, the original's result and exceptions unchanged."""
    clock = time.clock_gettime_ns

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not rt.enabled:
            return orig(*args, **kwargs)
        t0 = clock(BOOTTIME)
        result = orig(*args, **kwargs)
        t1 = clock(BOOTTIME)
        record(result, t0, t1, *args, **kwargs)
        return result

    wrapper.__name__ = wrapper.__qualname__ = getattr(orig, "__name__", "wrapper")
    return wrapper
