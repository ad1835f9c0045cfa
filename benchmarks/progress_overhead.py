"""What the progress display costs an export: the bundled recording written by each
exporter with no display and with the real one (rich, its refresh thread at 10 Hz, drawing
onto a terminal-like console that counts its redraws and drops the bytes), interleaved,
median (and the least: the run least disturbed) of ``--rounds``. CPU time is the
process's (every thread, the refresh thread too), less disturbed than wall time by other
work on the machine.

    PYTHONPATH=. python benchmarks/progress_overhead.py --rounds 9
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from exporters import openmetrics, perfetto, prometheus, rocpd
from probe.cli.progress import Display
from probe.progress import SILENT
from probe.reader.recording import Recording, default_recording

WRITERS: dict[str, Callable[..., Any]] = {
    "prometheus textfile": prometheus.write,
    "openmetrics": openmetrics.write,
    "perfetto": perfetto.write,
    "rocpd": rocpd.write,
}


class Frames(io.StringIO):
    """A terminal that keeps nothing but the number of line redraws."""

    redraws = 0

    def write(self, s: str) -> int:
        self.redraws += s.count("\x1b[2K")
        return len(s)


def _once(write: Callable[..., Any], rec: Recording, drawn: bool) -> tuple[float, float, int]:
    """(wall s, CPU s, redraws) of one export."""
    frames = Frames()
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out"
        t0, c0 = time.perf_counter(), time.process_time()
        if not drawn:
            write(rec, out, progress=SILENT)
        else:
            with Display(Console(file=frames, force_terminal=True, width=100)) as bars:
                write(rec, out, progress=bars)
        return time.perf_counter() - t0, time.process_time() - c0, frames.redraws


def redraw_ms(n: int = 200) -> float:
    """CPU ms of one redraw of the line: ``n`` pushes, each with a forced refresh."""
    bars = Display(Console(file=Frames(), force_terminal=True, width=100), auto_refresh=False)
    with bars:
        bars.stage("replaying steps", n)
        c0 = time.process_time()
        for _ in range(n):
            bars.advance()
            bars._push(draw=True)
        return (time.process_time() - c0) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    rec = Recording.open(default_recording())
    print(f"one redraw: {redraw_ms():.2f} ms of CPU")
    print(
        f"{'exporter':<20} {'wall off':>8} {'wall on':>8} {'cpu off':>8} {'cpu on':>8} "
        f"{'min off':>8} {'min on':>8} redraws"
    )
    for name, write in WRITERS.items():
        off, on = [], []
        _once(write, rec, False)  # warm the caches once
        for _ in range(args.rounds):
            off.append(_once(write, rec, False))
            on.append(_once(write, rec, True))

        def med(xs: list[tuple[float, float, int]], i: int) -> float:
            return statistics.median(x[i] for x in xs)

        least_off, least_on = min(x[1] for x in off), min(x[1] for x in on)
        print(
            f"{name:<20} {med(off, 0):>8.3f} {med(on, 0):>8.3f} {med(off, 1):>8.3f} "
            f"{med(on, 1):>8.3f} {least_off:>8.3f} {least_on:>8.3f} {med(on, 2):>7.0f}"
        )


if __name__ == "__main__":
    main()
