"""What the progress display costs an export: the bundled recording written by each
exporter with no display and with the real one (rich, its refresh thread at 10 Hz, drawing
to a terminal-like console on /dev/null), interleaved, median of ``--rounds``.

    python benchmarks/progress_overhead.py --rounds 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from exporters import openmetrics, perfetto, prometheus, rocpd
from probe.progress import SILENT, Display
from probe.recording import Recording, default_recording

WRITERS: dict[str, Callable[..., Any]] = {
    "prometheus textfile": prometheus.write,
    "openmetrics": openmetrics.write,
    "perfetto": perfetto.write,
    "rocpd": rocpd.write,
}


def _once(write: Callable[..., Any], rec: Recording, drawn: bool) -> float:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out"
        t0 = time.perf_counter()
        if not drawn:
            write(rec, out, progress=SILENT)
        else:
            with open(os.devnull, "w") as null:
                console = Console(file=null, force_terminal=True, width=100)
                with Display(console) as bars:
                    write(rec, out, progress=bars)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rec = Recording.open(default_recording())
    print(f"{'exporter':<20} {'without s':>10} {'with s':>8} {'ratio':>6}")
    for name, write in WRITERS.items():
        off, on = [], []
        _once(write, rec, False)  # warm the caches once
        for _ in range(args.rounds):
            off.append(_once(write, rec, False))
            on.append(_once(write, rec, True))
        a, b = statistics.median(off), statistics.median(on)
        print(f"{name:<20} {a:>10.3f} {b:>8.3f} {b / a:>6.3f}")


if __name__ == "__main__":
    main()
