"""Feed a recording's steps, rank by rank, through the live view's sink (the one
``probe top`` uses) and draw it once, as ``probe top`` would at the end of the recording.

    PYTHONPATH=. python docs/captures/top_replay.py RECORDING
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

from probe.cli.render_live import LiveStats, render
from probe.reader.recording import Recording


class _Proc:
    """The parts of a collector's ProcessState the live view reads."""

    def __init__(self, p: dict[str, Any]) -> None:
        self.pid = p["pid"]
        self.snapshot = p.get("snapshot")
        self.rank_label = f"tp{p.get('tp_rank') or 0}"
        self.dropped = p.get("dropped") or 0
        self.hook_faults = 0


def main(path: str) -> None:
    rec = Recording.open(path)
    steps = list(rec.iter_steps())
    last = max(s.t1 for s in steps)
    procs = [p for p in rec.processes() if any(s.pid == p["pid"] for s in steps)]
    stats = LiveStats(clock_ns=lambda: last, roles={p["pid"]: p["role"] for p in procs})
    for p in procs:
        proc: Any = _Proc(p)
        stats.on_process(proc)
        rows = [s for s in steps if s.pid == p["pid"]]
        for i in range(0, len(rows), 16):  # as the collector hands them over
            stats.on_steps(proc, rows[i : i + 16])
    Console().print(render(stats, "probe top"))


if __name__ == "__main__":
    main(sys.argv[1])
