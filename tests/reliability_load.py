"""Sustained load on the real ring and the real Collector, with memory sampled in both.

A writer process writes step-shaped records (the hooks' record mix) into a real
:class:`~probe.engine.ring_writer.RingWriter` as fast as it can for ``seconds``; the calling
process runs
the real :class:`~probe.reader.collector.Collector` on it (decode, assemble, a counting sink).
Both sample their resident set size from ``/proc`` once a second. The accounting must be
exact: write calls = records read + records dropped.

    python tests/reliability_load.py --seconds 600      # the manual long run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from probe.engine.ring_writer import RingWriter
from probe.reader.collector import Collector, ProcessState
from probe.records import Mode, Phase, Reason, RecordKind, pack_pair
from probe.step import Step


def rss_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _writer(path: str, capacity: int, seconds: float, conn: Any) -> None:
    ring = RingWriter.create(path, capacity)
    write = ring.write
    calls = step = 0
    rss: list[int] = []
    deadline = time.monotonic() + seconds
    next_sample = 0.0
    span, disp = int(RecordKind.SPAN), int(RecordKind.DISPATCH)
    ex, fw, st = int(Phase.EXECUTE), int(Phase.FORWARD_LAUNCH), int(Phase.SAMPLE_TOKENS)
    full, hit, pair = int(Mode.FULL), int(Reason.HIT), pack_pair(2, 2)
    write(int(RecordKind.HELLO), 0, 0, 0, 0, 0, 0, os.getpid(), 1, 2, 3, 0)
    calls += 1
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        if now >= next_sample:
            rss.append(rss_kib())
            next_sample = now + 1.0
        for _ in range(256):
            step += 1
            t = step * 1000
            write(span, ex, 0, 0, step, t, t + 900, 8, 4, 0, 0, 0)
            write(disp, full, hit, 0, step, t + 10, t + 11, 6, 8, 3, 4, pair)
            write(span, fw, 0, 0, step, t + 20, t + 600, 0, 0, 0, 0, 0)
            write(span, st, 0, 0, step, t + 910, t + 990, 0, 0, 0, 0, 0)
            calls += 4
    written = ring.written
    ring.close(unlink=False)
    conn.send(
        {"calls": calls, "written": written, "dropped": ring.dropped, "steps": step, "rss": rss}
    )


@dataclass
class _Counting:
    steps: int = 0

    def on_process(self, proc: ProcessState) -> None:
        pass

    def on_steps(self, proc: ProcessState, steps: Sequence[Step], gpu: Sequence[Any]) -> None:
        self.steps += len(steps)

    def close(self) -> None:
        pass


@dataclass
class LoadResult:
    seconds: float
    capacity: int
    calls: int
    written: int
    read: int
    dropped: int
    steps_written: int
    steps_assembled: int
    polls: int = 0
    writer_rss_kib: list[int] = field(default_factory=list)
    reader_rss_kib: list[int] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.calls / self.seconds

    @staticmethod
    def growth(samples: list[int]) -> int:
        """KiB the second half's peak exceeds the first half's (after a 2 s warm-up)."""
        s = samples[2:] if len(samples) > 6 else samples
        half = max(1, len(s) // 2)
        return max(s[half:], default=0) - max(s[:half], default=0)


def run_load(seconds: float, capacity: int = 1 << 16, poll_s: float = 0.001) -> LoadResult:
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o700)
        path = Path(d) / "ring-1.shm"
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_writer, args=(str(path), capacity, seconds, child))
        proc.start()
        while not path.exists():
            time.sleep(0.01)
        sink = _Counting()
        col = Collector(rings=[path], sinks=[sink])
        read = polls = 0
        rss: list[int] = []
        done = threading.Event()

        def sample() -> None:  # a thread: samples even while one poll runs for long
            while not done.wait(1.0):
                rss.append(rss_kib())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        while True:
            read += col.poll()
            polls += 1
            [state] = col.procs.values()
            if state.reader.writer_closed and state.reader.pending == 0:
                break
            time.sleep(poll_s)
        elapsed = time.monotonic() - t0
        done.set()
        sampler.join()
        out = parent.recv()
        proc.join()
        col.close()
        return LoadResult(
            seconds=elapsed,
            capacity=capacity,
            calls=out["calls"],
            written=out["written"],
            read=read,
            dropped=out["dropped"],
            steps_written=out["steps"],
            steps_assembled=sink.steps,
            polls=polls,
            writer_rss_kib=out["rss"],
            reader_rss_kib=rss,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--capacity", type=int, default=1 << 16)
    args = ap.parse_args()
    r = run_load(args.seconds, args.capacity)
    d = asdict(r)
    d["writer_rss_kib"] = {"first": r.writer_rss_kib[:3], "max": max(r.writer_rss_kib)}
    d["reader_rss_kib"] = {"first": r.reader_rss_kib[:3], "max": max(r.reader_rss_kib)}
    d["records_per_s"] = round(r.rate)
    d["writer_growth_kib"] = LoadResult.growth(r.writer_rss_kib)
    d["reader_growth_kib"] = LoadResult.growth(r.reader_rss_kib)
    d["exact"] = r.calls == r.read + r.dropped
    print(json.dumps(d, indent=2))


if __name__ == "__main__":
    main()
