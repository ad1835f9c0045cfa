"""``probe agent``'s CPU per engine step: a real engine's records through the agent's reader.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/reader_cost.py --rounds 1 --keep /tmp/records.bin
    PYTHONPATH=$PWD .venv/bin/python benchmarks/agent_cpu.py --records /tmp/records.bin \\
        [--rounds 7] [--copies 8] [--profile 30]

The agent's work per step is all in its reader process: copy the ring, decode, assemble,
apply the metric updates (Prometheus counters, histograms, the ranks matcher, the
steady-state split), write the rolling recording. This writes the captured records of
one engine process (``reader_cost.py --keep``: the busiest ring of a real ``probe record``
run of the tiny CPU model) into a real ring ``--copies`` times over (each copy a process
of its own: ``ring-<pid>.shm``), then reads them as ``probe agent --prometheus
--record-dir`` does: one :class:`probe.reader.collector.Collector` with the agent's slice
(``assemble_s``), a Prometheus sink and :class:`probe.reader.agent.RollingRecordings`,
polled until every ring is read and each process finished. It reports the least CPU time
(``time.process_time``) of ``--rounds`` per engine step, and the same with the Prometheus
sink alone and the recording alone. ``--profile N``: cProfile of one round, the top N
functions by own time, on stderr. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SINKS = {
    "agent": ("prometheus", "recording"),
    "prometheus": ("prometheus",),
    "recording": ("recording",),
}


def rings(raw: bytes, copies: int, d: Path) -> list[Path]:
    """``copies`` rings in ``d``, each holding every record of ``raw``."""
    from probe.engine.ring_writer import RingWriter
    from probe.records import RECORD_SIZE

    n = len(raw) // RECORD_SIZE
    cap = 1 << max(12, (n - 1).bit_length())
    out = []
    for i in range(copies):
        p = d / f"ring-{900_000 + i}.shm"
        w = RingWriter.create(p, cap)
        put = w.hot.write_raw
        for k in range(n):
            if not put(raw[k * RECORD_SIZE : (k + 1) * RECORD_SIZE]):
                raise SystemExit(f"ring full at record {k} of {n}")
        w.close(unlink=False)
        out.append(p)
    return out


def one(raw: bytes, copies: int, which: tuple[str, ...]) -> tuple[float, int]:
    """CPU seconds of reading ``copies`` rings of ``raw`` as the agent does, and the steps."""
    from exporters.prometheus import PrometheusSink
    from probe.reader.agent import ASSEMBLE_SLICE_S, RollingRecordings
    from probe.reader.collector import Collector

    d = Path(tempfile.mkdtemp(prefix="probe-agent-cpu-"))
    try:
        paths = rings(raw, copies, d)
        (d / "rec").mkdir()
        t = time.process_time()
        sinks: list[Any] = []
        if "prometheus" in which:
            sinks.append(PrometheusSink())
        if "recording" in which:
            sinks.append(RollingRecordings(d / "rec", 3600.0, None, meta={"agent": True}))
        col = Collector(None, sinks, assemble_s=ASSEMBLE_SLICE_S, now_ns=time.monotonic_ns)
        for p in paths:
            col.add_ring(p)
        col.poll()
        while col.spooled:
            col.poll()
        steps = 0
        for pid in list(col.procs):
            state = col.finish(pid)
            steps += state.steps_seen if state is not None else 0
        for s in sinks:
            if "prometheus" in which and hasattr(s, "exposition"):
                s.exposition()  # what one scrape renders
        col.close()
        return time.process_time() - t, steps
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=Path, required=True, help="reader_cost.py --keep's file")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--copies", type=int, default=8, help="processes, each all the records")
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    a = ap.parse_args()
    from probe.records import RECORD_SIZE

    raw = a.records.read_bytes()
    out: dict[str, Any] = {"records_per_copy": len(raw) // RECORD_SIZE, "copies": a.copies}
    for name, which in SINKS.items():
        best = min(one(raw, a.copies, which) for _ in range(a.rounds))
        cpu, steps = best
        out["steps"] = steps
        out[name] = {"cpu_s": round(cpu, 3), "us_per_step": round(cpu / steps * 1e6, 1)}
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        one(raw, a.copies, SINKS["agent"])
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(a.profile)
        print(buf.getvalue(), file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
