"""The GPU timer's event record on a real device: cost per call and agreement.

    python3 benchmarks/gpu/timer_record.py [--n 2000] [--json OUT]

``torch.cuda.Event.record()`` builds a ``Stream`` through ``torch.cuda.current_stream()``
on every call; the timer's record (``probe.engine.hooks.step._current_stream_record``) makes one
per current stream. This prints the host cost of each per call (hot loop, median of
rounds), the cost of a whole timed step through ``GpuTimer.tick`` (five events and a
query), and checks that both records time the same device work: the elapsed time across
a ``torch.cuda._sleep`` kernel, recorded each way around the same kernels. Needs CUDA (or
ROCm); run it where the harness runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks._timing import per_call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="calls per round")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()

    import torch

    from probe.engine.hooks import step
    from probe.engine.runtime import RT

    if not torch.cuda.is_available():
        raise SystemExit("timer_record: no CUDA/ROCm device")
    torch.cuda.init()
    fast = step._current_stream_record(torch)
    ev = torch.cuda.Event(enable_timing=True)
    out: dict[str, object] = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    out["fast_is_plain"] = fast is step._plain_record
    torch.cuda.synchronize()
    out["plain_record_ns"] = per_call(ev.record, args.n)
    torch.cuda.synchronize()
    out["fast_record_ns"] = per_call(lambda: fast(ev), args.n)
    torch.cuda.synchronize()

    # agreement: the same sleeps timed by events recorded each way
    diffs = []
    for _ in range(20):
        a0, a1, b0, b1 = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        a0.record()
        fast(b0)
        torch.cuda._sleep(2_000_000)
        a1.record()
        fast(b1)
        torch.cuda.synchronize()
        diffs.append((a0.elapsed_time(a1), b0.elapsed_time(b1)))
    out["sleep_ms_plain_fast"] = [
        statistics.median(d[0] for d in diffs),
        statistics.median(d[1] for d in diffs),
    ]
    out["max_abs_diff_ms"] = max(abs(a - b) for a, b in diffs)

    # a whole timed step through the timer (records written to a null writer)
    timer = step.GpuTimer(1)
    RT.reset()

    def timed_step() -> None:
        timer.tick(step.TICK_PREV_END)
        RT.step += 1
        timer.tick(step.TICK_STEP_START)
        timer.tick(step.TICK_FORWARD_START)
        timer.tick(step.TICK_FORWARD_END)
        timer.tick(step.TICK_STEP_END)

    out["timed_step_ns"] = per_call(timed_step, max(1, args.n // 10))
    torch.cuda.synchronize()
    timer.poll()
    out["faults"] = dict(RT.faults)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
