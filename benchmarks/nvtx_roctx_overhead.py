"""Cost of the live NVTX and roctx output (probe/engine/markers.py).

    python benchmarks/nvtx_roctx_overhead.py [--n 20000] [--json PATH]

Measured, in ns per call (median of rounds), on this machine with no profiler attached:

- NVTX: ``NvtxEmitter.push`` + ``pop`` of a cached message, and ``mark``, through the real
  ``nvtx`` package (its no-op domain when Nsight Systems is not attached);
- roctx live: a phase span (the probe's real ``step.span`` wrapper, enabled, writing into
  a list writer) with and without the roctx range layer, and a DISPATCH record written
  through the roctx tee (decoded and marked) against the plain writer. ROCm's roctx is
  absent here: a stand-in whose calls do nothing measures this module's Python cost;
  roctx's own cost with rocprofv3 attached comes on top.
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path

from _timing import per_call


def _noop_roctx() -> types.ModuleType:
    m = types.ModuleType("roctx")
    m.rangePush = lambda msg: 0  # type: ignore[attr-defined]
    m.rangePop = lambda: 0  # type: ignore[attr-defined]
    m.mark = lambda msg: None  # type: ignore[attr-defined]
    m.rangeStart = lambda msg: 1  # type: ignore[attr-defined]
    m.rangeStop = lambda i: None  # type: ignore[attr-defined]
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--json")
    a = ap.parse_args()
    results: dict[str, float] = {}

    try:
        from probe.engine.markers import NvtxEmitter

        nv = NvtxEmitter()
        results["nvtx push+pop (cached message)"] = per_call(
            lambda: (nv.push("forward_launch"), nv.pop()), a.n
        )
        results["nvtx mark (cached message)"] = per_call(lambda: nv.mark("dispatch"), a.n)
    except ImportError as exc:
        print(f"nvtx not measured: {exc}")

    from probe.engine import markers as roctx_live
    from probe.engine.hooks import step
    from probe.engine.hooks._base import Installer, Target
    from probe.engine.runtime import RT
    from probe.records import Mode, Phase, Reason, RecordKind

    class Plain:
        def noop(self) -> None:
            return None

    class ListWriter:
        dropped = 0

        def __init__(self) -> None:
            self.n = 0

        def write(self, *fields: int) -> bool:
            self.n += 1
            return True

        def write_raw(self, rec: bytes) -> bool:
            return True

    obj = Plain()
    inst = Installer()
    inst.install_on(Target("phase.v1.bench", "", "", "noop", step.span(Phase.REORDER)), Plain)
    RT.reset()
    RT.attach(ListWriter())
    RT.enabled = True
    RT.in_step = 1
    dispatch = (int(RecordKind.DISPATCH), int(Mode.FULL), int(Reason.HIT), 0, 7, 1, 2,
                128, 128, 64, 64, 0)  # fmt: skip
    results["probe span, enabled (no roctx)"] = per_call(obj.noop, a.n)
    results["DISPATCH record write (no roctx)"] = per_call(lambda: RT.write(*dispatch), a.n)
    live = roctx_live.start(RT, inst, {"PROBE_ROCTX": "1"}, importer=lambda n: _noop_roctx())
    assert live is not None and live.wrapped == ["phase.v1.bench"]
    results["probe span + roctx range"] = per_call(obj.noop, a.n)
    results["DISPATCH record write + roctx mark"] = per_call(lambda: RT.write(*dispatch), a.n)
    RT.reset()
    inst.uninstall()
    results["added by the roctx range, per wrapped call"] = (
        results["probe span + roctx range"] - results["probe span, enabled (no roctx)"]
    )
    results["added by the roctx mark, per decision"] = (
        results["DISPATCH record write + roctx mark"] - results["DISPATCH record write (no roctx)"]
    )
    for k, v in results.items():
        print(f"{k:48} {v:8.0f} ns")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
