"""The rules every figure of the summary is split by, in one place, with the reasons
(``docs/rules.md`` says the same for people; :data:`RULES` is what the report prints).

- **Steady state** (:func:`warmup_why`, :data:`FIRST_USE_SLOWER`): warm-up is what is
  really start-up: steps that captured a graph, steps dispatched as warm-up or profile
  (dummy and profile runs), the steps before a rank's first graph replay (when the rank
  replays at all), and the first use of a batch shape (a graph's mode and padded tokens;
  every eager step shares one shape) only where it shows compile or JIT cost: host time
  over :data:`FIRST_USE_SLOWER` times the median host time of the rank's steady steps of
  the same mode (of all its steady steps when the mode has no other), and over
  :data:`FIRST_USE_MIN_NS`. Every other forward step is steady state.
- **Engine idle** (:func:`engine_idle`): the gap between two consecutive steps of a rank
  (the end of one to the start of the next) is the engine with nothing in flight when the
  step after it carried over no request from an earlier one (``Step.carried_reqs`` 0:
  every request it runs is new, so none was running in the gap). The step after it does
  not count in the GPU idle share or the host-bound verdict, and the gap is reported as
  engine idle time. A gap before a step that carried requests over is serving time,
  however long: the host waiting for the GPU (a large prefill on a large model takes
  hundreds of ms) while requests run. Recordings without the engine's state (schema
  version 1) fall back to the host gap's length, :data:`ENGINE_IDLE_GAP_NS` or more.
- **Host-bound** (:data:`HOST_BOUND_SHARE`, :func:`host_bound`): a step is host-bound when
  the GPU sat idle before it for more than this share of the step period (the idle gap plus
  the step's span on the device), the engine not idle.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CLASSES",
    "ENGINE_IDLE_GAP_NS",
    "FIRST_USE_MIN_NS",
    "FIRST_USE_SLOWER",
    "HOST_BOUND_SHARE",
    "RULES",
    "STEADY",
    "WARMUP_WHY",
    "engine_idle",
    "first_use_slow",
    "host_bound",
]

#: a step is host-bound when the GPU sat idle before it for more than this share of the
#: step period (idle gap + the step's span on the device)
HOST_BOUND_SHARE = 0.10

#: the fallback engine-idle rule, for steps recorded without the engine's state
#: (``carried_reqs``, schema version 1): a host gap between two steps of a rank of at
#: least this long is engine idle. It reads a long wait for the GPU (a large prefill on a
#: large model) as idle too, which the engine's state does not
ENGINE_IDLE_GAP_NS = 100_000_000

#: a first use of a shape is warm-up only when its host time is over this many times the
#: steady median of its mode on the rank: compile and JIT cost 100-3,000x a step on the
#: committed recordings (1.3-14 s against 2-5 ms), while a first use without them runs
#: within 1-3x (a larger prefill, a new decode size)
FIRST_USE_SLOWER = 5.0
#: ... and over this much host time: no compile or JIT is cheaper, and a live view, which
#: judges a first use against the steady steps it has seen so far, agrees with the report
#: on every step below it
FIRST_USE_MIN_NS = 100_000_000

# the classes of a forward step (the summary's groups carry them; 0 is steady)
STEADY = 0
CAPTURE = 1
PROFILE = 2
BEFORE_REPLAY = 3
FIRST_USE = 4
#: the class names, by code, as the report and the metrics' ``steady`` split print them
CLASSES = ("steady", "capture", "warmup_or_profile", "before_first_replay", "first_use")

#: why a step is warm-up, in words (the report's warm-up table)
WARMUP_WHY = {
    "capture": "captured a graph",
    "warmup_or_profile": "dispatched as warm-up or profile (dummy or profile run)",
    "before_first_replay": "before the rank's first graph replay",
    "first_use": f"first use of its shape, over {FIRST_USE_SLOWER:g}x the steady median "
    f"host time of its mode and over {FIRST_USE_MIN_NS / 1e6:g} ms (compile/JIT)",
}

RULES = {
    "steady": "warm-up, reported apart: steps that captured a graph or were dispatched as "
    "warm-up/profile, a rank's steps before its first graph replay, and the first use of a "
    "shape (mode and padded tokens; one shape for eager) only where its host time is over "
    f"{FIRST_USE_SLOWER:g}x the steady median of its mode on the rank and over "
    f"{FIRST_USE_MIN_NS / 1e6:g} ms (compile/JIT cost); "
    "every other forward step is steady state",
    "engine_idle": "engine idle: the gap before a step that carried over no request from "
    "an earlier step (nothing in flight); reported apart, and the step after it counts in "
    "neither the GPU idle share nor the host-bound verdict; a gap while requests run (the "
    "host waiting for the GPU) is serving time; steps recorded without the engine's state "
    f"fall back to a gap of {ENGINE_IDLE_GAP_NS / 1e6:g} ms or more",
    "host_bound": f"host-bound: the GPU idle before a step over {HOST_BOUND_SHARE:.0%} of "
    "the step period (idle gap + the step on the device), the engine not idle",
}


def host_bound(idle_before_ns: Any, step_ns: Any, share: float = HOST_BOUND_SHARE) -> Any:
    """:data:`HOST_BOUND_SHARE`'s test: scalars or numpy arrays alike."""
    return idle_before_ns > share * (idle_before_ns + step_ns)


def engine_idle(gap_ns: Any, carried_reqs: Any, sample_every: int = 1) -> Any:
    """The engine-idle test of the gap before a step: the step carried over no request
    (``carried_reqs`` 0); where it was not recorded (below 0 in columns, None for one
    step) the gap is :data:`ENGINE_IDLE_GAP_NS` or more (``sample_every`` times that under
    ``--sample N``, where the gap before a recorded step spans N steps). Scalars or numpy
    arrays alike."""
    floor = ENGINE_IDLE_GAP_NS * max(1, sample_every)
    if carried_reqs is None:
        return gap_ns >= floor
    if isinstance(carried_reqs, int):
        return carried_reqs == 0 if carried_reqs >= 0 else gap_ns >= floor
    import numpy as np

    return np.where(carried_reqs >= 0, carried_reqs == 0, gap_ns >= floor)


def first_use_slow(host_ns: int, median: float | None) -> bool:
    """The first-use test: compile/JIT cost shows (over :data:`FIRST_USE_SLOWER` times the
    steady ``median`` of its mode, and over :data:`FIRST_USE_MIN_NS`)."""
    return median is not None and host_ns > FIRST_USE_SLOWER * median and host_ns > FIRST_USE_MIN_NS
