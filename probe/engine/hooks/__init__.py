"""Hook families and their lifecycle.

Each family is a module with a ``TARGETS`` table (and, where targets exist only on live
objects, a ``late_targets(runner)`` function):

========== ============================================================================
step       step bracket (execute_model + sample_tokens) and host phase spans
dispatch   graph dispatch decision with its miss reason (V1 dispatcher; MRV2 dispatch
           phase, the speculator's (late) and, under DP > 1, the manager (late))
replay     replay confirmation (CUDAGraphWrapper, breakable, MRV2 run_*graph; MRV2 FULL launch)
builders   attention-metadata builds per builder class (late), host sync stalls
reorder    batch reorder decisions (V1 _may_reorder_batch, MRV2 sort_batch_req_ids)
static     resolve of the graph mode (always on, once per process)
========== ============================================================================

Installing is lazy: a target whose module is not imported yet is wrapped when vLLM imports
it (a post-import hook), so a process that never loads the model runner (the API server)
never pays for it.

    >>> from probe.engine import hooks
    >>> report = hooks.install()            # dormant: one attribute check per call
    >>> hooks.enable(writer)                # doctest: +SKIP
    >>> hooks.disable(); hooks.uninstall()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any

from probe.engine import calibrate, markers
from probe.engine.hooks import builders, dispatch, reorder, replay, snapshot, step
from probe.engine.hooks._base import Family, Hook, Installer, InstallReport, Target, not_in_vllm
from probe.engine.runtime import RT
from probe.records import BlobType

log = logging.getLogger("probe")

FAMILY_TABLE: tuple[Family, ...] = (
    step.FAMILY,
    dispatch.FAMILY,
    replay.FAMILY,
    builders.FAMILY,
    reorder.FAMILY,
    snapshot.FAMILY,
)
"""The one table of hook families: install, detach, status and enable all read it."""
FAMILIES: dict[str, tuple[Target, ...]] = {f.name: f.targets for f in FAMILY_TABLE}
LATE: dict[str, Callable[[Any], list[tuple[Target, Any]]]] = {
    f.name: f.late_targets for f in FAMILY_TABLE if f.late is not None
}

INSTALLER = Installer()
_lock = threading.RLock()
_families: list[str] = []
_deferred: dict[str, list[Target]] = {}
LAST_REPORT = InstallReport()


def targets(families: Iterable[str] | None = None) -> list[Target]:
    names = list(FAMILIES) if families is None else list(families)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown hook families {unknown}; known: {sorted(FAMILIES)}")
    return [t for n in names for t in FAMILIES[n]]


def install(families: Sequence[str] | None = None, *, lazy: bool = True) -> InstallReport:
    """Install dormant hooks. ``lazy``: defer targets whose module is not imported yet."""
    global LAST_REPORT
    with _lock:
        if INSTALLER.hooks or _deferred:
            log.warning("probe: hooks already installed; unchanged")
            return LAST_REPORT
        _families[:] = list(FAMILIES) if families is None else list(families)
        now: list[Target] = []
        for t in targets(_families):
            if lazy and t.module not in sys.modules and not not_in_vllm(t.module):
                _deferred.setdefault(t.module, []).append(t)
            else:
                now.append(t)  # a module this vLLM lacks is reported, once, by install
        report = INSTALLER.install(now)
        if _deferred:
            _PostImport.arm()
        LAST_REPORT = report
        return report


def uninstall() -> list[str]:
    """Remove every hook (deferred ones included); exact inverse of :func:`install`."""
    with _lock:
        disable()
        _deferred.clear()
        _PostImport.disarm()
        PARKED.clear()
        if not INSTALLER.hooks:
            log.warning("probe: uninstall with nothing installed; unchanged")
            return []
        return INSTALLER.uninstall()


ALWAYS_ON = ("static",)


def _install_missing(families: Sequence[str] | None, *, lazy: bool = True) -> None:
    """Install the families' targets that are not installed yet (no warnings)."""
    names = list(FAMILIES) if families is None else list(families)
    for n in names:
        if n not in _families:
            _families.append(n)
    have = {h.hook_id for h in INSTALLER.hooks.values()}
    pending = {t.hook_id for ts in _deferred.values() for t in ts}
    now: list[Target] = []
    for t in targets(names):
        if t.hook_id in have or t.hook_id in pending:
            continue
        if lazy and t.module not in sys.modules and not not_in_vllm(t.module):
            _deferred.setdefault(t.module, []).append(t)
        else:
            now.append(t)
    report = INSTALLER.install(now)
    LAST_REPORT.installed.extend(report.installed)
    LAST_REPORT.missing.extend(report.missing)
    for hook_id, why in report.not_in_vllm:
        if all(h != hook_id for h, _ in LAST_REPORT.not_in_vllm):
            LAST_REPORT.not_in_vllm.append((hook_id, why))
    if _deferred:
        _PostImport.arm()


def attach(
    writer: Any,
    *,
    families: Sequence[str] | None = None,
    gpu_timing: bool | int = True,
    sample_every: int = 1,
) -> None:
    """Install the hooks and start writing to ``writer`` (``probe attach`` / ``record``).

    While detached only the ``static`` family is installed, so a detached process pays
    nothing per hooked call: the wrappers are not there at all. The exception, from
    Python 3.13: hooks a detach parked to spare their classes' version tags
    (:data:`TAG_BUDGET`) stay in place, dormant, and this attach finds them installed.
    """
    with _lock:
        wanted = set(FAMILIES) if families is None else set(families)
        for hook in list(INSTALLER.hooks.values()):  # parked hooks of a family not asked for
            if (id(hook.owner), hook.target.name) in PARKED and hook.family not in wanted:
                INSTALLER.remove(hook)
        PARKED.clear()
        _install_missing(families)
        enable(writer, gpu_timing=gpu_timing, sample_every=sample_every)


VERSION_TAG_CAP: int | None = 1000 if sys.version_info >= (3, 13) else None
"""Type-version tags a class may ever use (CPython's MAX_VERSIONS_PER_CLASS, from 3.13;
None where there is no cap). Every write of a class attribute clears the version tag of
the class and its subclasses, and the next lookup spends a new one; a class past the cap
is never cached or specialized on again, for the life of the process: its methods' own
``self.x`` and ``self.f()`` run unspecialized (3.7x slower after about 500 install and
uninstall cycles on 3.13.0, ``benchmarks/reattach_cost.py``). Each attach and detach
writes the hooked methods of vLLM's runner, dispatcher and builder classes."""

TAG_BUDGET = 250
"""The most type-version tags the probe lets its own writes spend of any class's cap
(a quarter): a detach that would pass it, counting the re-attach that follows, leaves
that class's wrappers in place, dormant (:data:`PARKED`), instead of removing them."""

PARKED: set[tuple[int, str]] = set()
"""Installer keys of the hooks a detach left in place (dormant) to spare the classes'
version tags; a later attach finds them installed, :func:`uninstall` removes them."""


def _parks(owner: Any, n: int) -> bool:
    """Whether removing ``n`` hooks from ``owner`` now and installing them again at the
    next attach would let the probe's writes pass :data:`TAG_BUDGET` for ``owner`` or any
    of its subclasses (each write to ``owner`` clears their tags too)."""
    if VERSION_TAG_CAP is None or not isinstance(owner, type):
        return False
    seen: set[int] = set()
    todo: list[type] = [owner]
    worst = 0
    while todo:
        cls = todo.pop()
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        worst = max(worst, INSTALLER.writes_felt_by(cls))
        with contextlib.suppress(TypeError):  # a metaclass's own __subclasses__
            todo.extend(type.__subclasses__(cls))
    return worst + 2 * n > min(TAG_BUDGET, VERSION_TAG_CAP)


def detach() -> Any:
    """Stop writing and remove every hook but the always-on ones; returns the writer.
    Where removing them would spend too many of a class's type-version tags
    (:data:`VERSION_TAG_CAP`, :data:`TAG_BUDGET`), that class's hooks stay in place,
    dormant (:data:`PARKED`): one compiled flag test per call instead of none."""
    with _lock:
        writer = disable()
        by_owner: dict[int, list[Hook]] = {}
        for hook in list(INSTALLER.hooks.values()):
            if hook.family not in ALWAYS_ON:
                by_owner.setdefault(id(hook.owner), []).append(hook)
        for hs in by_owner.values():
            if _parks(hs[0].owner, len(hs)):
                log.info(
                    "probe: leaving %d hook(s) on %s in place, dormant: removing them "
                    "again would spend more than %d of its type-version tags",
                    len(hs), getattr(hs[0].owner, "__qualname__", hs[0].owner), TAG_BUDGET,
                )  # fmt: skip
                PARKED.update((id(h.owner), h.target.name) for h in hs)
                continue
            for h in hs:
                INSTALLER.remove(h)
        for mod in list(_deferred):
            _deferred[mod] = [t for t in _deferred[mod] if t.family_name in ALWAYS_ON]
            if not _deferred[mod]:
                del _deferred[mod]
        if not _deferred:
            _PostImport.disarm()
        _families[:] = [f for f in _families if f in ALWAYS_ON]
        return writer


def _on_import(name: str) -> None:
    with _lock:
        pending = _deferred.pop(name, None)
        if pending:
            report = INSTALLER.install(pending)
            LAST_REPORT.installed.extend(report.installed)
            LAST_REPORT.missing.extend(report.missing)
        if not _deferred:
            _PostImport.disarm()


class _PostImport(importlib.abc.MetaPathFinder):
    """Calls ``_on_import(name)`` right after a deferred target module has executed."""

    _instance: _PostImport | None = None

    @classmethod
    def arm(cls) -> None:
        if cls._instance is None:
            cls._instance = cls()
            sys.meta_path.insert(0, cls._instance)

    @classmethod
    def disarm(cls) -> None:
        inst, cls._instance = cls._instance, None
        if inst is not None and inst in sys.meta_path:
            sys.meta_path.remove(inst)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _deferred:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                loader = spec.loader
                exec_module = loader.exec_module

                def exec_and_hook(module: ModuleType, _exec: Any = exec_module) -> None:
                    _exec(module)
                    try:
                        _on_import(fullname)
                    except Exception as exc:  # never break vLLM's import
                        log.warning("probe: installing hooks for %s failed: %r", fullname, exc)

                loader.exec_module = exec_and_hook  # type: ignore[method-assign]
                return spec
        return None


# -- enable / disable ----------------------------------------------------------------------


def enable(writer: Any, *, gpu_timing: bool | int = True, sample_every: int = 1) -> None:
    """Start writing records to ``writer``. The first step then installs late targets
    (builders, the model's logits, the drafter) and writes the static snapshot.

    ``sample_every`` N > 1 records one engine step in N: ``execute_model`` switches every
    hook on for that step and off for the others (a step is recorded whole or not at all).

    In a detached process (only the always-on hooks installed) this installs the rest
    first, like :func:`attach`. :func:`disable` leaves hooks dormant; :func:`detach`
    removes them (zero cost while no reader is attached; on Python 3.13+ a detach past
    :data:`TAG_BUDGET` parks them dormant instead).
    """
    with _lock:
        if not any(f not in ALWAYS_ON for f in _families):
            # a detached process (only the always-on hooks, and any a detach parked):
            # bring the rest in first
            PARKED.clear()
            _install_missing(None)
        RT.detach()
        try:  # the probe's own cost per call, on the path about to run (probe.engine.calibrate)
            RT.static["calibration"] = calibrate.once()
        except Exception as exc:
            RT.static["calibration"] = {"error": repr(exc)}
        RT.attach(writer)
        RT.gpu_timing = False
        RT.timer_every = 0
        RT.timer_tick = None
        step.TIMER.clear()
        if gpu_timing:
            try:
                import torch

                if torch.cuda.is_available():
                    every = 8 if gpu_timing is True else int(gpu_timing)
                    step.TIMER.append(step.GpuTimer(every))
                    RT.gpu_timing = True
                    RT.timer_every = step.TIMER[0].every
                    RT.timer_tick = step.TIMER[0].tick  # the compiled hooks' way in
            except Exception as exc:
                log.info("probe: no device timing (%r)", exc)
        RT.on_first_step = [_first_step]
        RT.sample_every = max(1, int(sample_every))
        RT.sample_n = 0
        RT.sampling = RT.sample_every > 1
        RT.enabled = True
        # roctx ranges for rocprofv3 (PROBE_ROCTX=1): wraps the hooks only when asked
        markers.start(RT, INSTALLER)


def disable() -> Any:
    """Stop writing; hooks stay installed and dormant. Returns the detached writer."""
    with _lock:
        RT.on_first_step = []
        return RT.detach()


def _first_step(runner: Any) -> None:
    with _lock:
        for fam, late in LATE.items():
            if fam not in _families:
                continue
            try:
                pairs = late(runner)
            except LookupError as exc:  # e.g. the builder base class no longer resolves
                LAST_REPORT.missing.append((f"{fam}.late", str(exc)))
                continue
            except Exception as exc:
                RT.fault(f"late.{fam}", exc, disabled=False)
                continue
            for target, owner in pairs:
                key = (id(owner), target.name)
                if key not in INSTALLER.hooks:
                    INSTALLER.install_on(target, owner, LAST_REPORT)
        write_snapshot(runner)


def write_snapshot(runner: Any) -> dict[str, Any]:
    try:
        snap = snapshot.take_snapshot(runner)
    except Exception as exc:
        RT.fault("static.snapshot", exc, disabled=False)
        snap = {"error": repr(exc)}
    not_imported = [
        (t.hook_id, f"{mod}: not imported in this process")
        for mod, ts in _deferred.items()
        for t in ts
    ]
    snap["hooks"] = {
        "installed": INSTALLER.installed_ids(),
        "missing": [*LAST_REPORT.missing, *not_imported],
        # targets of modules this vLLM does not ship (the classic runner's on a release
        # with Model Runner V2 only): each once, and not counted as missing hooks
        "not_in_this_vllm": list(LAST_REPORT.not_in_vllm),
    }
    snap["probe"] = {
        "hot_path": RT.hot_path,
        "clock": RT.clock,
        "clock_why": RT.clock_why,
        "calibration": RT.static.get("calibration"),
    }
    RT.static["snapshot"] = snap
    RT.graph_ctx = graph_context(snap)
    RT.write_blob(BlobType.SNAPSHOT, json.dumps(snap, default=str).encode())
    return snap


def graph_context(snap: dict[str, Any]) -> Any:
    try:
        from probe.reasons import GraphContext
    except ImportError:
        return None
    res = snap.get("resolve") or {}
    comp = snap.get("compilation") or {}
    return GraphContext(
        requested_mode=res.get("requested_mode"),
        resolved_mode=res.get("resolved_mode") or comp.get("cudagraph_mode"),
        min_cg_support=res.get("min_cg_support_value", snap.get("min_support_value")),
        min_cg_backend=res.get("min_cg_attn_backend")
        or (snap.get("limiting_group") or {}).get("builder"),
        uniform_decode_query_len=int(snap.get("uniform_decode_query_len") or 1),
    )


__all__ = [
    "ALWAYS_ON",
    "FAMILIES",
    "FAMILY_TABLE",
    "INSTALLER",
    "attach",
    "detach",
    "disable",
    "enable",
    "install",
    "targets",
    "uninstall",
    "write_snapshot",
]
