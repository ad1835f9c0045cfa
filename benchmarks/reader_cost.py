"""The reader's CPU per engine step: decode, assemble, live statistics, the recording.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/reader_cost.py [--rounds 7] [--keep raw.bin]

Everything after the ring runs in the reader (``probe attach``/``record``), and on a host
whose CPUs vLLM keeps busy it competes with the engine and waits for a CPU in proportion
to what it needs (docs/reliability.md). This runs the real CPU engine once under ``probe
record`` (``tests/real_engine/run_llm.py``, in this process, with the ring reader tapped to
keep every block it copies), then replays the engine process's records through the
reader's stages, each round from scratch, and reports the least CPU time of ``--rounds``
per stage: ``decode`` (records -> objects), ``assemble`` (decode + steps), ``live``
(assemble + :class:`probe.cli.render_live.LiveStats`, what ``attach`` keeps for its summary) and
``record`` (assemble + :class:`probe.reader.recording.RecordingWriter` to a file in /tmp, in
batches of 64 steps as the collector hands them on). ``--records FILE`` replays a kept
capture instead of running the engine; the probe measured is the one ``PYTHONPATH`` names (a
worktree of another commit, say). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STAGES = ("decode", "assemble", "live", "record")


def capture(rounds: int) -> bytes:
    """The records of the busiest ring of one real ``probe record`` run, as read."""
    from probe.cli.main import main
    from probe.reader import ring_reader as ring

    blocks: dict[str, list[bytes]] = {}
    orig = ring.RingReader.read_block

    def tapped(self: Any, max_records: int | None = None) -> bytes:
        block = orig(self, max_records)
        blocks.setdefault(str(self._path), []).append(block)
        return block

    ring.RingReader.read_block = tapped  # type: ignore[method-assign]
    d = tempfile.mkdtemp(prefix="probe-reader-cost-")
    try:
        main([
            "record", "--out", f"{d}/r.probe.db", "--force", "--",
            sys.executable, str(ROOT / "tests/real_engine/run_llm.py"),
            "--rounds", str(rounds), "--requests", "32", "--out", f"{d}/tokens.json",
        ])  # fmt: skip
    finally:
        ring.RingReader.read_block = orig  # type: ignore[method-assign]
    return max((b"".join(v) for v in blocks.values()), key=len)


def run(stage: str, recs: list[bytes], db: str) -> tuple[float, int]:
    from probe.cli.render_live import LiveStats
    from probe.reader.assemble import StepAssembler
    from probe.reader.recording import RecordingWriter
    from probe.records import Decoder

    class Proc:  # what LiveStats reads of the collector's ProcessState
        pid, dropped, hook_faults, rank_label, snapshot, hello = 1, 0, 0, "tp0", None, None

    if os.path.exists(db):
        os.unlink(db)
    writer = RecordingWriter(db) if stage == "record" else None
    live = LiveStats(roles={1: "engine"}) if stage == "live" else None
    t = time.process_time()
    dec, asm = Decoder(), StepAssembler(1)
    decoded = [dec.feed(r) for r in recs]
    steps: list[Any] = []
    if stage != "decode":
        batch: list[Any] = []
        for d in decoded:
            if d is None:
                continue
            batch.extend(asm.feed(d))
            if len(batch) >= 64:
                if writer is not None:
                    writer.add_steps(batch)
                if live is not None:
                    live.on_steps(Proc, batch, [])  # type: ignore[arg-type]
                steps += batch
                batch = []
        batch.extend(asm.flush())
        if writer is not None:
            writer.add_steps(batch)
            writer.close()
        if live is not None:
            live.on_steps(Proc, batch, [])  # type: ignore[arg-type]
        steps += batch
    return time.process_time() - t, len(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--engine-rounds", type=int, default=6, help="run_llm.py --rounds")
    ap.add_argument("--records", type=Path, help="replay this capture (from --keep)")
    ap.add_argument("--keep", type=Path, help="write the capture here")
    a = ap.parse_args()
    from probe.records import RECORD_SIZE

    raw = a.records.read_bytes() if a.records else capture(a.engine_rounds)
    if a.keep:
        a.keep.write_bytes(raw)
    recs = [raw[i : i + RECORD_SIZE] for i in range(0, len(raw), RECORD_SIZE)]
    db = os.path.join(tempfile.mkdtemp(prefix="probe-reader-cost-"), "out.probe.db")
    best = {stage: min(run(stage, recs, db) for _ in range(a.rounds)) for stage in STAGES}
    nsteps = best["assemble"][1]
    out: dict[str, Any] = {"records": len(recs), "steps": nsteps}
    for stage, (cpu, _n) in best.items():
        out[stage] = {
            "cpu_ms": round(cpu * 1e3, 2),
            "us_per_record": round(cpu / len(recs) * 1e6, 2),
            "us_per_step": round(cpu / nsteps * 1e6, 1),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
