"""What many attach/detach cycles leave behind in the engine's own code.

    python benchmarks/reattach_cost.py [--cycles 0 100 300 450 550 700 1100] [--json PATH]

From CPython 3.13 a class may use at most 1,000 type-version tags (MAX_VERSIONS_PER_CLASS):
every write of one of its attributes clears its tag, the next lookup spends a new one, and
a class past the cap is never cached or specialized on again for the life of the process.
Each probe attach installs its hooks on vLLM's classes and each detach removes them.

This runs the probe's real ``hooks.attach`` / ``hooks.detach`` (a real ring, the installed
hot path) with one stand-in hook family: eight methods of a ``Runner`` class, as the step
family hooks eight of ``GPUModelRunner``'s. Between checkpoints it runs attach/detach
cycles; at each checkpoint, detached, it times ``Runner.step``, a loop of the kind a model
runner's methods are made of (``self.a()`` and ``self.n``, 100 per call), and prints ns per
loop iteration. Twice: with the probe's policy (:data:`probe.engine.hooks.TAG_BUDGET`: past it a
detach leaves the hooks in place, dormant) and with every detach removing the hooks
(``VERSION_TAG_CAP = None``, what the probe did before). Run it with Python 3.13 or later
to see the cap; on 3.12 and earlier both lines stay flat.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe.engine import hooks
from probe.engine.hooks._base import Installer, Target
from probe.engine.ring_writer import RingWriter

SRC = """
class Runner:
    def __init__(self):
        self.n = 1
    def a(self):
        return self.n
    def step(self):
        s = 0
        for _ in range(100):
            s += self.a() + self.n
        return s
"""


def _module() -> Any:
    mod = types.ModuleType("reattach_runner")
    sys.modules[mod.__name__] = mod
    exec(SRC, mod.__dict__)
    for i in range(8):
        setattr(mod.Runner, f"m{i}", _const(i))
    return mod


def _const(i: int) -> Any:
    return lambda self: i


def _factory(orig: Any, hook: Any) -> Any:
    def wrapper(*a: Any, **k: Any) -> Any:
        return orig(*a, **k)

    return wrapper


def run(policy: str, checkpoints: list[int], ring: RingWriter) -> list[dict[str, float]]:
    mod = _module()  # a fresh class per policy: its tags unspent
    targets = tuple(
        Target(f"bench.m{i}", mod.__name__, "Runner", f"m{i}", _factory) for i in range(8)
    )
    hooks.FAMILIES.clear()
    hooks.FAMILIES.update({"bench": targets, "static": ()})
    hooks.LATE.clear()
    hooks.INSTALLER = Installer()
    if policy == "remove":
        hooks.VERSION_TAG_CAP = None
    r = mod.Runner()
    out, done = [], 0
    for target in checkpoints:
        while done < target:
            hooks.attach(ring, families=["bench"], gpu_timing=False)
            r.step()
            hooks.detach()
            r.step()
            done += 1
        for _ in range(300):  # let the interpreter specialize what it still can
            r.step()
        samples = []
        for _ in range(5):
            t = time.perf_counter_ns()
            for _ in range(600):
                r.step()
            samples.append((time.perf_counter_ns() - t) / 600 / 100)
        out.append(
            {
                "cycles": done,
                "ns_per_iteration": statistics.median(samples),
                "writes": hooks.INSTALLER.writes_felt_by(mod.Runner),
                "parked": len(hooks.PARKED),
            }
        )
    hooks.uninstall()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cycles", type=int, nargs="+", default=[0, 100, 300, 450, 550, 700, 1100])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    logging.disable(logging.WARNING)
    cap = hooks.VERSION_TAG_CAP
    res: dict[str, Any] = {"python": sys.version.split()[0], "version_tag_cap": cap}
    with tempfile.TemporaryDirectory() as d:
        ring = RingWriter.create(Path(d) / "ring", capacity=1 << 16)
        try:
            for policy in ("park", "remove"):
                hooks.VERSION_TAG_CAP = cap
                res[policy] = run(policy, sorted(a.cycles), ring)
        finally:
            ring.close()
    print(f"Python {res['python']} (version-tag cap: {cap}); ns per loop iteration, detached")
    print(f"{'cycles':>7} | {'park past budget':>18} | {'always remove':>14}")
    for p, q in zip(res["park"], res["remove"], strict=True):
        print(
            f"{p['cycles']:>7} | {p['ns_per_iteration']:>9.1f} ({p['writes']:>3} writes) | "
            f"{q['ns_per_iteration']:>6.1f} ({q['writes']:>4} writes)"
        )
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
