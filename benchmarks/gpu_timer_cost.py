"""Host cost of the GPU timer's steps: a whole engine step with and without its events.

    PYTHONPATH=$PWD python benchmarks/gpu_timer_cost.py [--n 400] [--evict-mb 64]
    PYTHONPATH=/path/to/other/tree python benchmarks/gpu_timer_cost.py   # another probe

A stand-in runner (``execute_model`` calling ``_model_forward``, then ``sample_tokens``)
carries the real step hooks of probe.engine.hooks.step on each hot path (probe.engine.accel).
Each row
times whole steps from the caller's side, minus the same step unwrapped:

- ``untimed``: the hooks on, the GPU timer off;
- ``timed``: the hooks on and every step timed (``GpuTimer(1)``: the five events of a
  timed step and the poll that writes its GPU record).

There is no device here: the events are stand-ins whose ``record()``/``query()``/
``elapsed_time()`` are plain Python methods, so ``timed - untimed`` is the probe's own
host work on a timed step (how it reaches the timer, the timer's bookkeeping, the GPU
record), not the driver's ``cudaEventRecord``. Warm: back to back; cold: ~``--evict-mb``
MB touched and some torch code run before each step (see forward_replay_cost.py). Median
ns over ``--n`` steps. The timer is given its events by attribute, so the script runs
against probe trees from before ``GpuTimer(event=...)`` too.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from _timing import evictor, median_ns

_clk = time.clock_gettime_ns
_BOOT = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


class FakeEvent:
    def __init__(self) -> None:
        self.t = 0

    def record(self) -> None:
        self.t = _clk(_BOOT)

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) / 1e6


class SchedulerOutput:
    total_num_scheduled_tokens = 128
    num_scheduled_tokens = dict.fromkeys(range(64), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--evict-mb", type=int, default=64)
    a = ap.parse_args()
    from probe.engine import accel
    from probe.engine.hooks import step
    from probe.engine.hooks._base import Installer, Target
    from probe.engine.ring_writer import RingWriter
    from probe.engine.runtime import RT

    evict = evictor(a.evict_mb)

    def runner_class() -> type:
        class GPUModelRunner:
            def execute_model(self, so: Any) -> Any:
                return self._model_forward(so.total_num_scheduled_tokens)

            def _model_forward(self, x: int) -> Any:
                return x

            def sample_tokens(self, grammar: Any = None) -> Any:
                return grammar

        return GPUModelRunner

    plain = runner_class()()
    so = SchedulerOutput()

    def plain_step() -> None:
        plain.execute_model(so)
        plain.sample_tokens()

    print(f"probe from {Path(step.__file__).parents[1]}; hot paths: {accel.NAME}")
    print(f"{'path':10} {'timer':8} {'warm':>8} {'cold':>8}  (ns added per step, median)")
    paths = ["compiled", "python"] if accel.COMPILED else ["python"]
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            cls = runner_class()
            inst = Installer()
            with accel.use(path):
                for hid, name, fac in (
                    ("step.v1.execute_model", "execute_model", step.execute("v1")),
                    ("phase.v1.forward_launch", "_model_forward", step.forward),
                    ("step.v1.sample_tokens", "sample_tokens", step.sample_tokens("v1")),
                ):
                    inst.install_on(Target(hid, __name__, "", name, fac), cls)
                ring = Path(tmp) / path
                writer = RingWriter.create(ring, capacity=1 << 16)
            r = cls()

            def hooked_step(r: Any = r) -> None:
                r.execute_model(so)
                r.sample_tokens()

            for timed in (False, True):
                RT.reset()
                RT.attach(writer)
                RT.on_first_step = []
                step.TIMER.clear()
                if timed:
                    timer = step.GpuTimer(1)
                    timer._event = FakeEvent  # type: ignore[attr-defined]
                    step.TIMER.append(timer)
                    RT.gpu_timing, RT.timer_every = True, 1
                    RT.timer_tick = getattr(timer, "tick", None)  # absent before the ticks
                RT.enabled = True
                row = []
                for cold in (False, True):
                    ev = evict if cold else None
                    h = median_ns(hooked_step, a.n, ev, every=200, between=partial(_drain, writer))
                    p = median_ns(plain_step, a.n, ev)
                    row.append(h - p)
                print(f"{path:10} {'timed' if timed else 'untimed':8} {row[0]:8.0f} {row[1]:8.0f}")
                if RT.faults:
                    print("faults:", RT.faults)
                RT.detach()
            inst.uninstall()
            writer.close()
            RT.reset()


def _drain(writer: Any) -> None:
    """Read the ring empty (it would fill: nothing else reads it here)."""
    from probe.reader.ring_reader import RingReader

    with RingReader.open(writer.path) as reader:
        for _ in reader.read():
            pass


if __name__ == "__main__":
    main()
