"""Time and peak memory of the offline commands over recordings of many processes with a
few steps each (an always-on agent's rolling recordings of a fleet: every restart brings
new pids).

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/processes.py \\
        --processes 10 1000 10000 100000 --out benchmarks/results/processes/

Each recording holds ``--processes`` processes of ``--steps-per`` (default 2) steps each,
made from real recorded steps: the bundled H200 recording's worker
(``probe/data/default.probe``), its first steps and every detail row of them repeated
under a new pid per process (:func:`make`), each process with the worker's snapshot.
Then each command runs as a child process of its own (``report --json`` and ``export`` to
every offline target), under ``--timeout`` seconds: a command cut short is recorded as
``"> N s"``. Its wall time, CPU time and peak resident memory (``wait4``'s ``ru_maxrss``)
go into ``RESULTS.json`` under ``--label`` (``after`` by default), with the commit of the
tree that ran (``--tree``: another checkout, e.g. a worktree of main for the ``before``
row). ``--table`` prints a folder's results as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCE = ROOT / "probe" / "data" / "default.probe"
DETAIL = ("steps", "spans", "dispatches", "replays", "builds", "reorders", "gpu")
FIRST_PID = 100_000


def sqlite_source(source: Path) -> Path:
    """``source`` as an SQLite recording (a columnar one converted once, kept in the
    temporary folder by its manifest's digest)."""
    import hashlib
    import tempfile

    from probe.reader.columnar_convert import convert
    from probe.reader.recording_names import MANIFEST, is_columnar

    if not is_columnar(source):
        return source
    digest = hashlib.sha256((source / MANIFEST).read_bytes()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"probe-processes-source-{digest}.probe.db"
    if not out.exists():
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp.db")
        convert(source, tmp, to_sqlite=True)
        os.replace(tmp, out)
    return out


def make(path: Path, processes: int, steps_per: int = 2, source: Path = SOURCE) -> None:
    """A recording of ``processes`` processes of ``steps_per`` steps each: the first
    ``steps_per`` steps of ``source``'s first worker and their detail rows, under the pids
    ``FIRST_PID``, ``FIRST_PID + 1``, ... (all over the same stretch of time). A column the
    source's schema version lacks is left NULL, as the reader reads it in an older file."""
    from probe.reader.recording_schema import APPLICATION_ID, DDL, SCHEMA_VERSION

    path.unlink(missing_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.execute(f"PRAGMA application_id={APPLICATION_ID}")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    db.executescript(DDL)
    db.execute("ATTACH ? AS s", (f"file:{sqlite_source(source)}?mode=ro",))
    (spid,) = db.execute("SELECT min(pid) FROM s.steps").fetchone()
    (top,) = db.execute(
        f"SELECT step FROM s.steps WHERE pid = ? ORDER BY step LIMIT 1 OFFSET {steps_per - 1}",
        (spid,),
    ).fetchone()
    db.execute("BEGIN")
    db.execute("INSERT INTO meta SELECT * FROM s.meta")
    db.execute("CREATE TEMP TABLE n (i INTEGER PRIMARY KEY)")
    db.execute(
        "WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i + 1 < ?) "
        "INSERT INTO n SELECT i FROM c",
        (processes,),
    )
    pcols = [c[1] for c in db.execute("PRAGMA s.table_info(processes)")]
    sel = ", ".join(f"{FIRST_PID} + n.i" if c == "pid" else f"p.{c}" for c in pcols)
    db.execute(
        f"INSERT INTO processes ({', '.join(pcols)}) SELECT {sel} FROM n, s.processes AS p "
        "WHERE p.pid = ? ORDER BY n.i",
        (spid,),
    )
    for table in DETAIL:
        cols = [c[1] for c in db.execute(f"PRAGMA s.table_info({table})")]
        sel = ", ".join(f"{FIRST_PID} + n.i" if c == "pid" else f"d.{c}" for c in cols)
        order = "n.i, d.step" if table in ("steps", "gpu") else "n.i, d.step, d.rowid"
        db.execute(
            f"INSERT INTO {table} ({', '.join(cols)}) SELECT {sel} FROM n, s.{table} AS d "
            f"WHERE d.pid = ? AND d.step <= ? ORDER BY {order}",
            (spid, top),
        )
    db.execute("COMMIT")
    db.execute("DETACH s")
    db.close()


def commands(rec: Path, work: Path) -> dict[str, list[str]]:
    cmds = {
        "report": ["report", str(rec), "--json"],
        "textfile": ["export", str(rec), "--prometheus-textfile", str(work / "t.prom")],
        "openmetrics": ["export", str(rec), "--openmetrics", str(work / "t.om")],
        "perfetto": ["export", str(rec), "--perfetto", str(work / "t.pftrace")],
        "rocpd": ["export", str(rec), "--rocpd", str(work / "t.rocpd.db")],
        "parquet": ["export", str(rec), "--parquet", str(work / "pq")],
    }
    for c in cmds.values():
        if c[0] == "export":
            c += ["--force", "--no-progress"]
    return cmds


OUTPUTS = ("t.prom", "t.om", "t.pftrace", "t.rocpd.db", "pq")


def _run(
    cmd: list[str], env: dict[str, str], cwd: Path, timeout: float, memory_gb: float
) -> dict[str, Any]:
    """One command as a child process: its wall and CPU time and peak resident memory
    (``wait4``), killed (its process group) past ``timeout`` seconds; its address space
    limited to ``memory_gb`` (a shared machine: past it the command fails, not the
    machine)."""
    import resource

    limit = int(memory_gb * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    load = os.getloadavg()
    t = time.monotonic()
    p = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True, preexec_fn=cap,
    )  # fmt: skip
    cut = threading.Event()

    def kill() -> None:
        cut.set()
        os.killpg(p.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, kill)
    timer.start()
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t
    out: dict[str, Any] = {
        "cmd": " ".join(cmd[2:]),
        "rc": p.returncode,
        "wall_s": f"> {timeout:g} s" if cut.is_set() else round(wall, 2),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
        "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),
        "load_before": [round(x, 2) for x in load],
    }
    if cut.is_set():
        out["timed_out"] = True
    elif p.returncode:
        out["stderr"] = err.decode(errors="replace")[-400:]
    return out


def _commit(tree: Path) -> str:
    git = ["git", "-C", str(tree)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "probe", "exporters"])
    return head.stdout.strip() + ("+dirty" if dirty.returncode else "")


def table(results: dict[str, Any]) -> str:
    """RESULTS.json as a Markdown table: per command and label, a cell per size
    (CPU s / wall s, peak MB)."""
    sizes = sorted(results["sizes"].values(), key=lambda e: e["processes"])
    labels = list(dict.fromkeys(lb for e in sizes for lb in e.get("runs", {})))
    names = list(
        dict.fromkeys(n for e in sizes for lb in labels for n in e.get("runs", {}).get(lb, {}))
    )
    head = "| command | " + " | ".join(f"{e['processes']:,} processes" for e in sizes) + " |"
    rows = [head, "|---|" + "---|" * len(sizes)]
    for n in names:
        for lb in labels:
            cells = []
            for e in sizes:
                r = e.get("runs", {}).get(lb, {}).get(n)
                if r is None:
                    cells.append("not run")
                elif r.get("not_run"):
                    cut = f"{r['wall_s']} " if r.get("timed_out") else ""
                    cells.append(f"{cut}(not run: {r['not_run']})")
                elif r.get("timed_out"):
                    cells.append(f"{r['wall_s']} (cut short)")
                elif r["rc"]:
                    cells.append(f"exit {r['rc']} ({r['peak_rss_mb']:,.0f} MB)")
                else:
                    cells.append(
                        f"{r['cpu_s']:,.1f} / {r['wall_s']:,.1f} s, {r['peak_rss_mb']:,.0f} MB"
                    )
            commits = dict.fromkeys(
                e["runs"][lb][n]["commit"] for e in sizes if n in e.get("runs", {}).get(lb, {})
            )
            rows.append(f"| {n}, {lb} ({', '.join(commits)}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--processes", type=int, nargs="+", default=[10, 1_000, 10_000, 100_000])
    ap.add_argument("--steps-per", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/probe-processes"))
    ap.add_argument("--out", type=Path, help="folder for RESULTS.json (merged with what is there)")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose probe runs")
    ap.add_argument("--label", default="after", help="the row's name (before, after)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a command may run")
    ap.add_argument("--memory-gb", type=float, default=8.0, help="address space a command may use")
    ap.add_argument("--only", nargs="+", help="commands to run (default: all)")
    ap.add_argument("--keep", action="store_true", help="keep the recordings made")
    ap.add_argument("--table", type=Path, help="print RESULTS.json of this folder as a table")
    a = ap.parse_args()
    if a.table:
        print(table(json.loads((a.table / "RESULTS.json").read_text())))
        return 0
    a.work.mkdir(parents=True, exist_ok=True)
    tree = a.tree.resolve()
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100", "PROBE_PROGRESS": "0"}
    results: dict[str, Any] = {}
    if a.out and (a.out / "RESULTS.json").exists():
        results = json.loads((a.out / "RESULTS.json").read_text())
    results.setdefault("sizes", {})
    results.setdefault("commands", {})[a.label] = "PYTHONPATH=<tree> nice -n 10 " + " ".join(
        [".venv/bin/python", "benchmarks/processes.py", *sys.argv[1:]]
    )
    results["machine"] = f"{os.cpu_count()} CPUs, {os.uname().release}"
    cut: dict[str, int] = {}  # command -> the size at which it was cut short
    for n in a.processes:
        rec = a.work / f"processes-{n}x{a.steps_per}.probe.db"
        if not rec.exists():
            make(rec, n, a.steps_per)
        entry: dict[str, Any] = results["sizes"].setdefault(str(n), {})
        entry.update(
            processes=n, steps_per=a.steps_per, file_bytes=rec.stat().st_size,
        )  # fmt: skip
        runs = entry.setdefault("runs", {}).setdefault(a.label, {})
        for name, c in commands(rec, a.work).items():
            if a.only and name not in a.only:
                continue
            if name in cut:
                # cut short at a smaller size: larger ones take longer still
                r = {"rc": None, "wall_s": f"> {a.timeout:g} s", "timed_out": True,
                     "not_run": f"cut short at {cut[name]:,} processes"}  # fmt: skip
            else:
                r = _run([sys.executable, "-m", "probe", *c], env, tree, a.timeout, a.memory_gb)
                if r.get("timed_out"):
                    cut[name] = n
            r["commit"] = _commit(tree)
            runs[name] = r
            print(json.dumps({"processes": n, "label": a.label, "name": name, **r}), flush=True)
            for o in OUTPUTS:
                p = a.work / o
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
            if a.out:
                a.out.mkdir(parents=True, exist_ok=True)
                (a.out / "RESULTS.json").write_text(json.dumps(results, indent=1) + "\n")
        if not a.keep:
            rec.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
