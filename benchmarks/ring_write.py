"""Cost of one ``RingWriter.write()``: the only work a hook adds to vLLM's host thread.

Each scenario times every call with ``perf_counter_ns`` (median, p99, p99.9), and then
times the same number of calls in one untimed loop (mean), which excludes the cost of the
timer itself; the timer's own overhead (an empty timed pair) is printed alongside.

Scenarios:
  room         no reader, the ring is big enough for every write (commit path)
  drained      a reader in another process drains the ring every millisecond (the
               collector's cadence; commit path)
  busy         a reader in another process drains the ring in a tight loop (commit
               path, with the reader polling the index's cache line all the time)
  full         no reader, a 1024-slot ring: all but the first 1024 writes are drops
  raw          write_raw() of a pre-packed record, no reader, room
  step         the probe's step buffer (``Runtime.write`` inside a step): 16 records
               appended, the 17th closes the step and the 17 go in one write_many();
               timed per step, reported per record

Usage::

    python benchmarks/ring_write.py                 # 1,000,000 writes per scenario
    python benchmarks/ring_write.py -n 200000 --json out/ring_write.json
"""

from __future__ import annotations

import argparse
import array
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe.engine.ring_writer import RingWriter, WriteFn, WriteRawFn
from probe.reader.ring_reader import RingReader
from probe.records import RECORD, RecordKind
from probe.ring import MAX_CAPACITY

SCENARIOS = ("room", "drained", "busy", "full", "raw", "step")
PER_STEP = 17  # records per MRV2 engine step on the H200 (benchmarks/evidence/overhead.md)
READER_PERIOD_S = {"drained": 0.001, "busy": 0.0}


def _drain(path: str, period_s: float, ready: Any, conn: Connection) -> None:
    """Reader process: drain ``path`` until the writer closes it; send the count back."""
    reader = RingReader.open(path)
    ready.set()
    n = 0
    while True:
        closed = reader.writer_closed
        n += len(reader.read())
        if closed and reader.pending == 0:
            break
        if period_s:
            time.sleep(period_s)
    conn.send((n, reader.dropped))
    reader.close()


def _percentile(sorted_values: list[int], q: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _timings(samples: array.array[int]) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "median_ns": int(statistics.median(ordered)),
        "mean_ns": round(statistics.fmean(ordered), 1),
        "p99_ns": _percentile(ordered, 0.99),
        "p999_ns": _percentile(ordered, 0.999),
        "max_ns": ordered[-1],
    }


def _timed_write(write: WriteFn, n: int) -> tuple[array.array[int], int]:
    pc = time.perf_counter_ns
    span = RecordKind.SPAN
    samples = array.array("q", bytes(8 * n))
    ok = 0
    for i in range(n):
        t = pc()
        ok += write(span, 4, 0, 0, i, i, i, i, i, i, i, i)
        samples[i] = pc() - t
    return samples, ok


def _timed_raw(write_raw: WriteRawFn, n: int) -> tuple[array.array[int], int]:
    pc = time.perf_counter_ns
    rec = RECORD.pack(RecordKind.SPAN, 4, 0, 0, 7, 100, 250, 1, 2, 3, 4, 5)
    samples = array.array("q", bytes(8 * n))
    ok = 0
    for i in range(n):
        t = pc()
        ok += write_raw(rec)
        samples[i] = pc() - t
    return samples, ok


def _step_buffer(writer: RingWriter, n: int, timed: bool) -> tuple[array.array[int], float]:
    """``n`` records through a Runtime attached to ``writer``, ``PER_STEP`` per step:
    per-step times (ns per record) when ``timed``, and the mean ns per record."""
    from probe.engine.runtime import Runtime

    rt = Runtime()
    rt.attach(writer)  # one HELLO record first, as in the engine
    write = rt.write
    pc = time.perf_counter_ns
    span = RecordKind.SPAN
    steps = n // PER_STEP
    samples = array.array("q", bytes(8 * steps if timed else 0))
    t_all = pc()
    for k in range(steps):
        t = pc()
        rt.in_step = 1
        for i in range(PER_STEP - 1):
            write(span, 4, 0, 0, k, i, i, i, i, i, i, i)
        rt.in_step = 0
        write(span, 1, 0, 0, k, k, k, k, k, k, k, k)  # the step's closing record: flush
        if timed:
            samples[k] = (pc() - t) // PER_STEP
    return samples, (pc() - t_all) / max(1, steps * PER_STEP)


def _untimed_write(write: WriteFn, n: int) -> float:
    pc = time.perf_counter_ns
    span = RecordKind.SPAN
    t = pc()
    for i in range(n):
        write(span, 4, 0, 0, i, i, i, i, i, i, i, i)
    return (pc() - t) / n


def _untimed_raw(write_raw: WriteRawFn, n: int) -> float:
    pc = time.perf_counter_ns
    rec = RECORD.pack(RecordKind.SPAN, 4, 0, 0, 7, 100, 250, 1, 2, 3, 4, 5)
    t = pc()
    for _ in range(n):
        write_raw(rec)
    return (pc() - t) / n


def _timer_overhead(n: int) -> int:
    pc = time.perf_counter_ns
    samples = array.array("q", bytes(8 * n))
    for i in range(n):
        t = pc()
        samples[i] = pc() - t
    return int(statistics.median(samples))


def run_scenario(name: str, n: int, directory: Path) -> dict[str, Any]:
    capacity = {"full": 1024, "drained": 1 << 16, "busy": 1 << 16}.get(name, 0)
    if not capacity:
        capacity = min(MAX_CAPACITY, 1 << max(0, (n - 1).bit_length()))
    result: dict[str, Any] = {"scenario": name, "n": n, "capacity": capacity}
    for phase in ("timed", "untimed"):
        path = directory / f"{name}-{phase}.ring"
        writer = RingWriter.create(path, capacity)
        proc = None
        if name in READER_PERIOD_S:
            ctx = mp.get_context("spawn")
            ready = ctx.Event()
            parent_conn, child_conn = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_drain, args=(str(path), READER_PERIOD_S[name], ready, child_conn)
            )
            proc.start()
            if not ready.wait(60):
                raise RuntimeError("reader process did not start")
        if name == "step":
            samples, mean = _step_buffer(writer, n, phase == "timed")
            if phase == "timed":
                committed = writer._hot.written() - 1  # less the HELLO record
                result.update(_timings(samples), committed=committed, dropped=writer.dropped)
            else:
                result["mean_untimed_ns"] = round(mean, 1)
        elif phase == "timed":
            if name == "raw":
                samples, ok = _timed_raw(writer.write_raw, n)
            else:
                samples, ok = _timed_write(writer.write, n)
            result.update(_timings(samples), committed=ok, dropped=writer.dropped)
        else:
            mean = (
                _untimed_raw(writer.write_raw, n)
                if name == "raw"
                else _untimed_write(writer.write, n)
            )
            result["mean_untimed_ns"] = round(mean, 1)
        writer.close(unlink=False)
        if proc is not None:
            read, dropped = parent_conn.recv()
            proc.join()
            if read + dropped != n:
                raise RuntimeError(f"lost records: read {read} + dropped {dropped} != {n}")
            result[f"reader_read_{phase}"] = read
        os.unlink(path)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="writes per scenario")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--dir", type=Path, help="directory for the ring files")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(
        prefix="ring-bench-", dir=args.dir or ("/dev/shm" if Path("/dev/shm").is_dir() else None)
    ) as tmp:
        overhead = _timer_overhead(200_000)
        results = [run_scenario(s, args.n, Path(tmp)) for s in args.scenarios]

    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "timer_overhead_ns": overhead,
    }
    print(
        f"ring write(): {args.n:,} calls per scenario, Python {meta['python']}, "
        f"{meta['machine']}, {meta['cpus']} CPUs; timer overhead {overhead} ns "
        "(included in median/p99, not in the untimed mean)"
    )
    columns = [
        ("scenario", "scenario"),
        ("capacity", "capacity"),
        ("median ns", "median_ns"),
        ("mean ns", "mean_ns"),
        ("p99 ns", "p99_ns"),
        ("p99.9 ns", "p999_ns"),
        ("untimed mean ns", "mean_untimed_ns"),
        ("dropped", "dropped"),
    ]
    header = tuple(title for title, _ in columns)
    rows = [tuple(str(r[key]) for _, key in columns) for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    for row in (header, *rows):
        print(
            "  ".join(
                cell.rjust(w) if i else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
