"""Every environment variable the probe reads, in one place.

Precedence everywhere: explicit argument > environment > default. Values are read when
the plugin installs (``probe.engine.plugin.register``) or a CLI command starts, never at import.

    $ probe env          # prints each variable, its value here, and what it does
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

ENV_PREFIX = "PROBE_"


class EnvVar(NamedTuple):
    """One variable: its name, what it does, its default. (Not a dataclass: a reader's
    start imports this module, and ``dataclasses`` with ``inspect`` under it cost ``probe
    attach`` about 7 ms of CPU before its enable.)"""

    name: str
    help: str
    default: str | None = None


ENABLE = EnvVar("PROBE_ENABLE", "1: enable hooks at plugin load and write a ring (probe record).")
RUN_DIR = EnvVar(
    "PROBE_RUN_DIR",
    "Directory for rings and control sockets (default: /dev/shm/vllm-graph-probe-<uid>).",
)
RING_CAPACITY = EnvVar("PROBE_RING_CAPACITY", "Records per ring, a power of two.", "65536")
MAX_RING_CAPACITY = 1 << 24
"""The most records a ring holds (1 GiB of 64-byte slots); the ring's layout takes it too."""
GPU_TIMING = EnvVar(
    "PROBE_GPU_TIMING",
    "N: time every N-th step with device events (never synchronized); 0: off.",
    "8",
)
SAMPLE_EVERY = EnvVar(
    "PROBE_SAMPLE_EVERY",
    "N: record one engine step in N (every hook on for that step, off for the others); "
    "the probe's cost per step divides by about N. 1: every step.",
    "1",
)
CG_SUPPORT_OVERRIDE = EnvVar(
    "PROBE_CG_SUPPORT_OVERRIDE",
    "What-if: Builder=SUPPORT[,Builder=SUPPORT], e.g. "
    "FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE. Applied before the graph "
    "mode is resolved. Builder is a known class name or module:Class.",
)
CLOCK = EnvVar(
    "PROBE_CLOCK",
    "The compiled hooks' clock: boottime (clock_gettime(CLOCK_BOOTTIME) on every read), or "
    "tsc / auto (the time stamp counter, carried to CLOCK_BOOTTIME ns, where the kernel's "
    "clocksource is the TSC; else boottime). Records are BOOTTIME ns either way.",
    "boottime",
)
HOOKS = EnvVar("PROBE_HOOKS", "Comma-separated hook families to install (default: all).")
CONTROL = EnvVar("PROBE_CONTROL", "0: do not open the per-process control socket.", "1")
PLUGIN = EnvVar("PROBE_PLUGIN", "0: the vLLM plugin does nothing in this process.", "1")
READER_NICE = EnvVar(
    "PROBE_READER_NICE",
    "Niceness added to the reader process of record and collect, so that on a busy host "
    "the engine gets the CPU first and the ring absorbs the wait; 0: unchanged. attach "
    "and top keep the user's priority and bound their work per poll instead.",
    "10",
)
ROCTX = EnvVar(
    "PROBE_ROCTX",
    "1: also emit roctx ranges (steps, phases) and marks (graph and reorder decisions) "
    "live in each vLLM process while the probe is enabled; needs ROCm's roctx module. "
    "Adds about 6-7 us per V1 step (probe/engine/markers.py).",
)
NVTX = EnvVar(
    "PROBE_NVTX",
    "1: emit NVTX ranges (steps, phases) and marks (graph and reorder decisions) live in "
    "each vLLM process while attached, for Nsight Systems (needs the nvtx package).",
)

ALL: tuple[EnvVar, ...] = (
    ENABLE,
    RUN_DIR,
    RING_CAPACITY,
    GPU_TIMING,
    SAMPLE_EVERY,
    CG_SUPPORT_OVERRIDE,
    HOOKS,
    CLOCK,
    CONTROL,
    PLUGIN,
    ROCTX,
    NVTX,
    READER_NICE,
)


class ConfigError(ValueError):
    """A configuration value is malformed. Carries the variable name and the bad value."""

    def __init__(self, name: str, value: str, why: str) -> None:
        super().__init__(f"{name}={value!r}: {why}")
        self.name = name
        self.value = value


def get(var: EnvVar, environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    value = env.get(var.name)
    return var.default if value is None or value == "" else value


def get_bool(var: EnvVar, environ: Mapping[str, str] | None = None) -> bool:
    value = get(var, environ)
    if value is None:
        return False
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ConfigError(var.name, value, "expected 1/0, true/false, yes/no or on/off")


def get_int(var: EnvVar, environ: Mapping[str, str] | None = None) -> int:
    value = get(var, environ)
    try:
        return int(value or "0")
    except ValueError:
        raise ConfigError(var.name, value or "", "expected an integer") from None


def lower_reader_priority(environ: Mapping[str, str] | None = None) -> int:
    """Called by the reader commands: make way for the engine. Returns the increment used."""
    try:
        inc = get_int(READER_NICE, environ)
    except ConfigError:
        inc = 10
    if inc > 0:
        try:
            os.nice(inc)
        except OSError:
            return 0
    return max(inc, 0)


def describe(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    lines = []
    for var in ALL:
        value = env.get(var.name)
        shown = "unset" if value is None else repr(value)
        default = f" (default {var.default})" if var.default is not None else ""
        lines.append(f"{var.name} = {shown}{default}\n    {var.help}")
    return "\n".join(lines)


def _int_in(var: EnvVar, env: Mapping[str, str], lo: int, hi: int) -> int:
    n = get_int(var, env)
    if not lo <= n <= hi:
        raise ConfigError(var.name, get(var, env) or "", f"expected {lo}..{hi}")
    return n


def validate(environ: Mapping[str, str] | None = None) -> None:
    """Check every ``PROBE_*`` value a probed process will read, before it starts.

    Raises :class:`ConfigError` naming the first bad variable. ``probe record`` calls it
    so that a bad value is one error line here, not an empty recording and a line in the
    child's log. (Hook family names and the override are checked by their own parsers.)
    """
    env = os.environ if environ is None else environ
    for var in (ENABLE, CONTROL, PLUGIN, ROCTX, NVTX):
        get_bool(var, env)
    cap = _int_in(RING_CAPACITY, env, 64, MAX_RING_CAPACITY)
    if cap & (cap - 1):
        raise ConfigError(RING_CAPACITY.name, str(cap), "expected a power of two")
    _int_in(GPU_TIMING, env, 0, MAX_STEP_INTERVAL)
    _int_in(SAMPLE_EVERY, env, 1, MAX_STEP_INTERVAL)
    _int_in(READER_NICE, env, -20, 19)
    clock_setting(env)


def clock_setting(environ: Mapping[str, str] | None = None) -> str:
    """``PROBE_CLOCK``: ``auto``, ``tsc`` or ``boottime`` (``probe.engine.accel.set_clock``)."""
    env = os.environ if environ is None else environ
    v = (get(CLOCK, env) or "boottime").strip().lower()
    if v not in ("auto", "tsc", "boottime"):
        raise ConfigError(CLOCK.name, get(CLOCK, env) or "", "expected auto, tsc or boottime")
    return v


MAX_STEP_INTERVAL = 1 << 20
"""The largest ``sample_every``/``gpu_timing`` step interval accepted anywhere."""
