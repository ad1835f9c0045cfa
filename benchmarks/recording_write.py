"""The reader's write cost per step: each recording writer fed the same real steps.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/recording_write.py \\
        --steps 200000 --out benchmarks/results/recording-format/write.json

The steps are the bundled H200 recording's (``probe/data/default.probe``), repeated with
their step numbers shifted, handed to the writer in the reader's batches (64 steps, as the
collector drains a ring), flushed every half second as in a live session. Per writer: CPU
seconds in ``add_steps`` and flushes (µs per step), then the close (the columnar writer's
compaction into Parquet; SQLite's device-time join and checkpoint), and the bytes per step
of what is left. Process CPU time (``time.process_time``) of this process alone:
DuckDB's threads, which compact, are counted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _size(p: Path) -> int:
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return p.stat().st_size


def run(
    kind: str, steps: list[Any], names: dict[int, dict[int, str]], n: int, work: Path
) -> dict[str, Any]:
    from probe.reader.columnar import ColumnarWriter
    from probe.reader.recording import RecordingWriter

    out = work / ("w.probe.db" if kind == "sqlite" else "w.probe")
    w: Any = RecordingWriter(out) if kind == "sqlite" else ColumnarWriter(out)
    for pid, ns in names.items():
        w.set_strings(pid, ns)
        w.add_process(pid, None)
    top = max(s.step for s in steps)
    t = time.process_time()
    done, rep = 0, 0
    while done < n:
        for i in range(0, len(steps), 64):
            batch = [dataclasses.replace(s, step=s.step + rep * top) for s in steps[i : i + 64]]
            batch = batch[: n - done]
            w.add_steps(batch)
            done += len(batch)
            if done >= n:
                break
        rep += 1
    write = time.process_time() - t
    t = time.process_time()
    w.close()
    close = time.process_time() - t
    size = _size(out)
    shutil.rmtree(out) if out.is_dir() else out.unlink()
    return {
        "writer": kind,
        "steps": n,
        "write_us_per_step": round(write / n * 1e6, 2),
        "close_s": round(close, 2),
        "close_us_per_step": round(close / n * 1e6, 2),
        "bytes_per_step": round(size / n, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from probe.reader.recording import Recording, default_recording

    rec = Recording.open(default_recording())
    steps = list(rec.iter_steps())
    names = rec.builder_names()
    results = {
        "command": " ".join([".venv/bin/python", "benchmarks/recording_write.py", *sys.argv[1:]]),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("sqlite", "columnar"):
            r = run(kind, steps, names, a.steps, Path(tmp))
            print(json.dumps(r), flush=True)
            results["runs"].append(r)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
