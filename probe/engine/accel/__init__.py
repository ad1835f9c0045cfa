"""Which hot path runs inside vLLM: the compiled accelerator or pure Python.

The per-call work of the probe (the timed wrapper around a hooked vLLM method, the step
buffer and the publish of a whole step into the ring) has two implementations with the
same behaviour:

- ``compiled``: the C extension :mod:`probe.engine.accel._accel`, built by ``pip install`` when a C
  compiler and the Python headers are there (``setup.py``);
- ``python``: the code in :mod:`probe.engine.ring_writer`, :mod:`probe.engine.runtime` and the
hook modules.

The compiled one is chosen automatically when it imports; ``PROBE_ACCEL=0`` in the
environment of the vLLM process forces pure Python. One log line says when the extension
is missing; the ring's HELLO record carries which path ran, so the recording's meta and
``probe doctor`` show it.

    >>> from probe.engine import accel
    >>> accel.NAME in ("compiled", "python")
    True

Tests and benchmarks switch the wrappers, packers and ring writer between the two with
:func:`use`; the hot state object (:data:`Core`, the base of ``Runtime``) is fixed at import.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from probe import records

log = logging.getLogger("probe")

__all__ = [
    "COMPILED",
    "NAME",
    "WHY_NOT",
    "Core",
    "active",
    "gate",
    "make_ring",
    "span_hook",
    "use",
]


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("PROBE_ACCEL", "").strip() == "0":
        return None, "PROBE_ACCEL=0"
    try:
        import probe.engine.accel._accel as _accel
    except ImportError as exc:
        return None, f"the extension probe.engine.accel._accel is not built ({exc})"
    # the C writes records from the header generated off probe.records: a build from
    # another declaration would put fields in the wrong slots
    from probe.engine import gen_header

    if getattr(_accel, "DECLARATION", None) != gen_header.declaration_digest():
        return None, (
            "the extension probe.engine.accel._accel was built from another record declaration "
            "(rebuild it: python setup.py build_ext --inplace)"
        )
    return _accel, ""


_C, WHY_NOT = _load()
COMPILED = _C is not None
"""True when the compiled accelerator imported (and was not turned off)."""
NAME = "compiled" if COMPILED else "python"
if not COMPILED and WHY_NOT != "PROBE_ACCEL=0":
    log.warning("probe: using the pure-Python hot path (slower): %s", WHY_NOT)


HOT_FIELDS: dict[str, int] = {
    "enabled": 0,  # records are written
    "in_step": 0,  # >0 inside execute_model / sample_tokens
    "clock_tsc": 0,  # 1: the compiled hooks read the TSC clock (set_clock, at attach)
    "drafter": 0,  # >0 inside the MTP drafter / speculator
    "in_build": 0,  # inside a metadata build
    "sampling": 0,  # attached with sample_every > 1
    "gpu_timing": 0,  # device events on
    "step": 0,  # step sequence number of the current/last execute_model
    "sample_every": 1,  # record 1 engine step in N (execute_model decides)
    "sample_n": 0,  # steps seen while sampling
    "timer_every": 0,  # the GPU timer's period (compiled fast paths leave its steps)
    # the runner's dispatch phase and the decision a dispatcher made inside it
    # (probe.engine.hooks.dispatch; the record is written when the phase closes)
    "phase_open": 0,
    "decided": 0,
    "phase_num_reqs": 0,  # V1 runner: real requests
    "phase_max_q": 0,  # V1 runner: the longest query
    "dec_mode": 0,  # the decision: (mode, reason, flags, num_tokens, padded_tokens,
    "dec_reason": 0,  # num_reqs, padded_reqs, max_q, uq) of its DISPATCH record
    "dec_flags": 0,
    "dec_num_tokens": 0,
    "dec_padded_tokens": 0,
    "dec_num_reqs": 0,
    "dec_padded_reqs": 0,
    "dec_max_q": 0,
    "dec_uq": 0,
    # >0 while probe.engine.markers tees RT.put: the compiled Forward/Replay write through it
    "tee": 0,
    # the open target forward launch (hooks.step.forward) and the replays counted into it
    "fwd_open": 0,  # >0 while one is open
    "fwd_mode": 0,  # the last replay's mode
    "fwd_tokens": 0,  # and its num_tokens
    "fwd_full": 0,  # FULL replays
    "fwd_pieces": 0,  # PIECEWISE piece replays
    "fwd_captures": 0,  # captures
    "fwd_passes": 0,  # calls into MRV2's run_pw_graph
    "fwd_t0": 0,  # the first replay's start (0: none yet)
    "fwd_t1": 0,  # the last replay's end
}
"""The hot fields of ``Core`` (C members on the compiled path) and their fresh values."""


class PyCore:
    """The hot state in pure Python: the fields of :data:`HOT_FIELDS`, as
    ``probe.engine.accel._accel.
    Core`` has them."""

    enabled: int
    in_step: int
    clock_tsc: int
    drafter: int
    in_build: int
    sampling: int
    gpu_timing: int
    step: int
    sample_every: int
    sample_n: int
    timer_every: int
    phase_open: int
    decided: int
    phase_num_reqs: int
    phase_max_q: int
    dec_mode: int
    dec_reason: int
    dec_flags: int
    dec_num_tokens: int
    dec_padded_tokens: int
    dec_num_reqs: int
    dec_padded_reqs: int
    dec_max_q: int
    dec_uq: int
    tee: int
    fwd_open: int
    fwd_mode: int
    fwd_tokens: int
    fwd_full: int
    fwd_pieces: int
    fwd_captures: int
    fwd_passes: int
    fwd_t0: int
    fwd_t1: int

    def __init__(self) -> None:
        for name, value in HOT_FIELDS.items():
            setattr(self, name, value)


Core: type = _C.Core if _C is not None else PyCore
"""Base class of :class:`probe.engine.runtime.Runtime`."""

_active = NAME


def active() -> str:
    """The path new wrappers, packers and ring writers use: ``compiled`` or ``python``."""
    return _active


@contextmanager
def use(name: str) -> Iterator[None]:
    """Make new wrappers, packers and ring writers use ``name`` (tests, benchmarks)."""
    global _active
    if name not in ("compiled", "python"):
        raise ValueError(f"unknown hot path {name!r}; known: compiled, python")
    if name == "compiled" and not COMPILED:
        raise RuntimeError(f"the compiled hot path is not available: {WHY_NOT}")
    old, _active = _active, name
    try:
        yield
    finally:
        _active = old


CLOCKS = ("auto", "tsc", "boottime")
"""The settings of ``PROBE_CLOCK``: which clock the compiled hooks read their timestamps
from (the values in records are CLOCK_BOOTTIME ns either way)."""


CLOCKSOURCE = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
CPUINFO = Path("/proc/cpuinfo")


def _tsc_is_the_kernels(clocksource: Path = CLOCKSOURCE, cpuinfo: Path = CPUINFO) -> str:
    """Why the time stamp counter may not serve here ("" when it may): the kernel's own
    clocksource must be the TSC (then its vDSO reads the same counter, the kernel has found
    it synchronized across CPUs and not trapped), and the CPU's TSC constant and non-stop."""
    if _C is None or not hasattr(_C, "set_clock"):
        return "the compiled hot path is not in use"
    if _C.ticks() == 0:
        return "this processor has no time stamp counter the probe reads (x86-64 only)"
    try:
        src = clocksource.read_text()
        with open(cpuinfo) as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError as exc:
        return f"cannot read the kernel's clocksource ({exc.strerror})"
    if src.strip() != "tsc":
        return f"the kernel's clocksource is {src.strip()!r}, not 'tsc'"
    missing = [f for f in ("constant_tsc", "nonstop_tsc") if f not in flags]
    return f"the CPU's TSC lacks {', '.join(missing)}" if missing else ""


def set_clock(setting: str) -> tuple[str, str]:
    """Point the compiled hooks' timestamps at ``setting`` (one of :data:`CLOCKS`);
    returns ``(clock in use, why not the TSC)``. ``tsc`` and ``auto`` take the time stamp
    counter, carried to BOOTTIME ns (``probe/engine/accel/_accel.c``: always within the kernel's own
    readings around it), where :func:`_tsc_is_the_kernels` allows it: the vDSO's
    ``clock_gettime`` touches a code page and a data page that a stretch of vLLM's code has
    evicted, the counter nothing (``benchmarks/call_boundary.py``). ``boottime``, and
    the pure-Python path always, read ``clock_gettime(CLOCK_BOOTTIME)``."""
    if setting not in CLOCKS:
        raise ValueError(f"unknown clock {setting!r}; known: {', '.join(CLOCKS)}")
    why = "PROBE_CLOCK=boottime" if setting == "boottime" else _tsc_is_the_kernels()
    if _C is None or not hasattr(_C, "set_clock"):
        return "boottime", why
    return str(_C.set_clock("boottime" if why else "tsc")), why


def clock() -> str:
    """The clock the compiled hooks read now: ``tsc`` or ``boottime``."""
    if _C is None or not hasattr(_C, "set_clock"):
        return "boottime"
    return "tsc" if _C.clock_is_tsc() else "boottime"


def _compiled() -> ModuleType | None:
    return _C if _active == "compiled" else None


def make_ring(mm: Any, capacity: int) -> Any | None:
    """The compiled writer of a mapped ring, or None for the pure-Python one."""
    c = _compiled()
    return None if c is None else c.Ring(mm, capacity)


def is_compiled_ring(hot: Any) -> bool:
    return _C is not None and isinstance(hot, _C.Ring)


def bind_packers(
    rt: Any, ring: Any
) -> tuple[records.Packers, Callable[..., Any], Callable[[], None]]:
    """``(put, stage, flush)`` of a compiled ring bound to the compiled Core ``rt``."""
    ring.bind(rt)
    put = records.Packers()
    for spec in records.SPECS.values():
        setattr(put, spec.name, ring.packer(int(spec.kind), records.c_layout(spec)))
    return put, ring.stage, ring.flush


def can_bind(rt: Any, hot: Any) -> bool:
    """Whether ``rt`` can stage straight into the compiled ring ``hot``."""
    return _C is not None and isinstance(rt, _C.Core) and isinstance(hot, _C.Ring)


def span_hook(
    orig: Callable[..., Any], rt: Any, phase: int, drafter: bool, flags: int = 0
) -> Any | None:
    """A compiled phase-span wrapper around ``orig`` (``flags`` set on each span), or None
    (use the Python one)."""
    c = _compiled()
    if c is None or not isinstance(rt, c.Core):
        return None
    return c.Span(orig, rt, phase, drafter, flags)


def gate(
    orig: Callable[..., Any], impl: Callable[..., Any], rt: Any, sampling: bool = False
) -> Any:
    """``impl`` behind a compiled dormant path (off: ``orig`` is called straight from C);
    ``impl`` itself on the Python path. ``sampling``: call ``impl`` while sampling too."""
    c = _compiled()
    if c is None or not isinstance(rt, c.Core):
        return impl
    return c.Gate(orig, impl, rt, sampling)


def step_hook(
    orig: Callable[..., Any], impl: Callable[..., Any], rt: Any, which: int, mrv2: bool
) -> Any | None:
    """``execute_model`` (which=0) or ``sample_tokens`` (1) with its common path compiled,
    handing every other call to the Python hook ``impl``; None on the Python path."""
    c = _compiled()
    if c is None or not isinstance(rt, c.Core):
        return None
    return c.Step(orig, impl, rt, which, mrv2)


def dispatch_hook(
    orig: Callable[..., Any],
    record: Callable[..., Any],
    rt: Any,
    full: Any,
    which: int,
    positions: tuple[int, ...] | None = None,
) -> Any | None:
    """A dispatcher (which=0: V1 ``CudagraphDispatcher``, 1: MRV2 ``CudaGraphManager``)
    whose FULL hits are recorded in C; every other result goes to the Python ``record(
    result, t0, t1, *args, **kwargs)``. None on the Python path or without vLLM's FULL."""
    c = _compiled()
    if c is None or not isinstance(rt, c.Core) or full is None:
        return None
    return c.Dispatch(orig, record, rt, full, which, positions)


def build_hook(
    orig: Callable[..., Any], record: Callable[..., Any], rt: Any, tag: int
) -> Any | None:
    """A metadata build (``tag``: a BuildTag) whose common path is recorded in C; every
    other call goes to the Python ``record(md, t0, t1, self, *args, **kwargs)``. None on
    the Python path."""
    c = _compiled()
    if c is None or not isinstance(rt, c.Core):
        return None
    return c.Build(orig, record, rt, tag)


def reorder_hook(
    orig: Callable[..., Any],
    record: Callable[..., Any],
    impl: Callable[..., Any],
    rt: Any,
    which: int,
) -> Any | None:
    """A reorder decision (which=0: V1 ``_may_reorder_batch``, 1: MRV2 ``sort_batch_req_ids``)
    recorded in C; a call it cannot start goes to the Python hook ``impl``, a result it
    cannot read to ``record``. None on the Python path."""
    c = _compiled()
    if c is None or not isinstance(rt, c.Core):
        return None
    return c.Reorder(orig, record, impl, rt, which)


def phase_hook(
    orig: Callable[..., Any],
    record: Callable[..., Any],
    impl: Callable[..., Any],
    rt: Any,
    which: int,
    positions: tuple[int, ...] | None = None,
    full: Any = None,
) -> Any | None:
    """The runner's dispatch phase (which=0: V1 ``_determine_batch_execution_and_padding``,
    1: MRV2 ``dispatch_cg_and_sync_dp`` in the runner, 2: in a speculator's module) in C,
    its close handed to the Python ``record`` when it cannot write it: ``record(t0, t1,
    *args, **kwargs)`` for V1, ``record(result, t0, t1, *args, **kwargs)`` for MRV2
    (``full``: vLLM's ``CUDAGraphMode.FULL``, the hit it reads from the result). None on
    the Python path."""
    c = _compiled()
    if c is None or not isinstance(rt, c.Core):
        return None
    return c.Phase(orig, record, impl, rt, which, positions, full)


def forward_hook(
    orig: Callable[..., Any], impl: Callable[..., Any], record: Callable[..., Any], rt: Any
) -> Any | None:
    """The forward launch (``hooks.step.forward``) in C: its scope in the Core's hot
    fields, the FORWARD or SPAN record staged; ``impl`` (the Python hook) takes the GPU
    timer's steps and calls without a compiled ring, ``record(t0, t1, opened, outer)``
    what C cannot stage. None on the Python path."""
    c = _compiled()
    if c is None or not isinstance(rt, c.Core):
        return None
    return c.Forward(orig, impl, record, rt)


def replay_hook(
    orig: Callable[..., Any],
    impl: Callable[..., Any],
    record: Callable[..., Any],
    rt: Any,
    which: int,
    fcm: Any = None,
    fwd_record: Callable[..., Any] | None = None,
    full: Any = None,
) -> Any | None:
    """A graph replay hook (``hooks.replay``) in C: which=0 MRV2 ``run_fullgraph``, 1
    ``run_pw_graph`` (both hand ``record(result, t0, t1, *args, **kwargs)`` what C cannot
    read), 2 ``CUDAGraphWrapper.__call__`` (``fcm``: vllm.forward_context; ``impl`` takes
    the calls whose forward context C cannot read, ``record(t0, t1, mode, captured,
    desc)`` the rest it cannot stage). which=0 with ``fwd_record`` (``hooks.step.
    forward_record``) is also the target's FULL forward launch; which=2 with ``fwd_record``
    and ``full`` (vLLM's ``CUDAGraphMode.FULL``): a wrapper of that mode called in a step
    with no forward open is V1's forward launch. None on the Python path."""
    c = _compiled()
    if c is None or not isinstance(rt, c.Core):
        return None
    return c.Replay(orig, impl, record, rt, which, fcm, fwd_record, full)
