"""Time and peak memory of the offline commands over recordings of 10 k to 1 M steps.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/scale.py \\
        --steps 10000 100000 1000000 --out benchmarks/results/scale/

Each size is a recording made from real recorded steps: the bundled H200 recording
(``probe/data/default.probe``, one worker) and the TP=2 serve recording
(``tests/data/serve-tp2.probe``, two workers), their steps
and every detail row repeated with shifted step numbers and times, over ``--ranks``
ranks (the even ranks the bundled worker's steps, the odd ones the TP=2 workers' in turn),
all ranks over the same stretch of time. Then each command runs as a child process of
its own: ``report --json``, ``ab`` (the recording against itself), ``export`` to every
offline target (``--perfetto``, ``--openmetrics``, ``--prometheus-textfile``, ``--rocpd``,
``--parquet``), and ``merge`` with a real Kineto profile of vLLM's decode (from the shared
data, ``$PROBE_SHARED_DIR``; ``--allow-unaligned``).
Its wall time and peak resident memory (``wait4``'s ``ru_maxrss``) go into
``RESULTS.json`` and a table, with the file size and bytes per step, the machine's load
average before each command, the command line and the commit. ``--only`` picks commands;
``--skip`` leaves some out (by name, at a size: ``perfetto@1000000``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = (
    (ROOT / "probe" / "data" / "default.probe", None),
    (ROOT / "tests" / "data" / "serve-tp2.probe", None),
)
SHARED = Path(os.environ.get("PROBE_SHARED_DIR") or ROOT.parent / "shared")
KINETO = SHARED / "data" / "profiles" / "kineto"
KINETO_FILE = "tracelens_vllm_decode_full_graph_execution_hipgraph.json.gz"
TIMED = ("t0_ns", "t1_ns")


def _sources() -> list[tuple[Path, int]]:
    """(SQLite recording, worker pid) of every recorded worker, the bundled one first."""
    from benchmarks.processes import sqlite_source

    out = []
    for src, _ in SOURCES:
        path = sqlite_source(src)
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            for (pid,) in db.execute("SELECT DISTINCT pid FROM steps ORDER BY pid"):
                out.append((path, int(pid)))
    return out


def make_columnar(path: Path, steps: int, ranks: int) -> None:
    """A columnar recording of ``steps`` steps over ``ranks`` ranks, as :func:`make` makes
    the SQLite one (the same steps, pids, shifts), written table by table with pyarrow in
    (pid, step) order, each table's columns encoded as the compactor's writer chooses them
    (DuckDB: delta for times and steps, dictionaries for the rest), zstd."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from probe.reader.columnar_compact import write_json
    from probe.reader.columnar_read import read_manifest
    from probe.reader.columnar_schema import TABLES

    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    srcs = [(src, pid) for src, _ in SOURCES for pid in _pids(src)]
    odd = srcs[1:] or srcs
    first_manifest = read_manifest(srcs[0][0])
    tables = {t: {src: pq.read_table(src / f"{t}.parquet") for src, _ in SOURCES} for t in TABLES}
    per_rank = [steps // ranks + (1 if r < steps % ranks else 0) for r in range(ranks)]
    origin: int | None = None
    writers: dict[str, Any] = {}
    pending: dict[str, list[Any]] = {t: [] for t in TABLES}
    rows: dict[str, int] = dict.fromkeys(TABLES, 0)
    processes = []

    def flush(t: str, force: bool = False) -> None:
        if pending[t] and (force or rows[t] >= 1 << 18):
            tab = pa.concat_tables(pending[t])
            if t not in writers:
                delta = [c for c in tab.column_names if c.endswith("_ns") or
                         (t == "steps" and c in ("step", "carried_reqs"))]  # fmt: skip
                writers[t] = pq.ParquetWriter(
                    path / f"{t}.parquet", tab.schema, compression="zstd",
                    use_dictionary=[c for c in tab.column_names if c not in delta],
                    column_encoding=dict.fromkeys(delta, "DELTA_BINARY_PACKED"),
                    data_page_version="2.0",
                )  # fmt: skip
            writers[t].write_table(tab, row_group_size=1 << 18)
            pending[t], rows[t] = [], 0

    for r in range(ranks):
        src, spid = srcs[0] if r % 2 == 0 else odd[(r // 2) % len(odd)]
        own = {t: tables[t][src].filter(pc.equal(tables[t][src]["pid"], spid)) for t in TABLES}
        st = own["steps"]
        top = pc.max(st["step"]).as_py()
        t0, t1 = pc.min(st["t0_ns"]).as_py(), pc.max(st["t1_ns"]).as_py()
        origin = t0 if origin is None else origin
        period = t1 - t0 + 1_000_000
        pid = 100_000 + r
        proc = next(p for p in read_manifest(src)["processes"] if p["pid"] == spid)
        processes.append({**proc, "pid": pid, "tp_rank": r,
                          "boottime_ns": proc["boottime_ns"] - t0 + origin,
                          "epoch_ns": proc["epoch_ns"] - t0 + origin})  # fmt: skip
        n = per_rank[r]
        for k in range(-(-n // top)):
            shift, limit = origin - t0 + k * period, n - k * top
            for t in TABLES:
                tab = own[t]
                if limit < top:
                    tab = tab.filter(pc.less_equal(tab["step"], limit))
                cols = {}
                for c in tab.column_names:
                    a = tab[c]
                    if c == "pid":
                        a = pa.array([pid] * len(tab), pa.int64())
                    elif c == "step":
                        a = pc.add(a, k * top)
                    elif c in TIMED:
                        a = pc.add(a, shift)
                    cols[c] = a
                pending[t].append(pa.table(cols, schema=tab.schema))
                rows[t] += len(tab)
                flush(t)
    for t in TABLES:
        flush(t, force=True)
        writers[t].close()
    manifest = {**first_manifest, "processes": processes, "faults": [], "outside": [],
                "anomalies": [], "tables": {t: f"{t}.parquet" for t in TABLES}}  # fmt: skip
    from probe.reader.columnar_compact import write_processes

    write_processes(manifest, path / "processes.parquet")
    manifest["tables"]["processes"] = "processes.parquet"
    write_json(path / "recording.json", manifest)


def _pids(src: Path) -> list[int]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    return sorted(
        pc.unique(pq.read_table(src / "steps.parquet", columns=["pid"])["pid"]).to_pylist()
    )


def make(path: Path, steps: int, ranks: int) -> None:
    """A recording of ``steps`` steps over ``ranks`` ranks from the real recorded ones."""
    from probe.reader.recording_schema import APPLICATION_ID, DDL, SCHEMA_VERSION

    path.unlink(missing_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.execute(f"PRAGMA application_id={APPLICATION_ID}")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    db.executescript(DDL)
    db.execute("BEGIN")
    srcs = _sources()
    first = srcs[0][0]
    db.execute("ATTACH ? AS m", (f"file:{first}?mode=ro",))
    db.execute("INSERT INTO meta SELECT * FROM m.meta")
    db.execute("COMMIT")
    db.execute("DETACH m")
    origin: int | None = None
    per_rank = [steps // ranks + (1 if r < steps % ranks else 0) for r in range(ranks)]
    odd = [s for s in srcs[1:]] or srcs
    for r in range(ranks):
        src, spid = srcs[0] if r % 2 == 0 else odd[(r // 2) % len(odd)]
        db.execute("ATTACH ? AS s", (f"file:{src}?mode=ro",))
        db.execute("BEGIN")
        top, t0, t1 = db.execute(
            "SELECT max(step), min(t0_ns), max(t1_ns) FROM s.steps WHERE pid = ?", (spid,)
        ).fetchone()
        if origin is None:
            origin = t0
        period = t1 - t0 + 1_000_000  # one repetition after the other, 1 ms apart
        pid = 100_000 + r
        boot, epoch = db.execute(
            "SELECT boottime_ns, epoch_ns FROM s.processes WHERE pid = ?", (spid,)
        ).fetchone()
        db.execute(
            "INSERT INTO processes SELECT ?, role, ?, pp_rank, dp_rank, vllm_version, runner, "
            "model, ?, ?, perf_counter_ns, dropped, snapshot FROM s.processes WHERE pid = ?",
            (pid, r, boot - t0 + origin, epoch - t0 + origin, spid),
        )
        n = per_rank[r]
        reps = -(-n // top)
        for k in range(reps):
            shift = origin - t0 + k * period
            limit = n - k * top
            for table in ("steps", "spans", "dispatches", "replays", "builds", "reorders"):
                have = {c[1] for c in db.execute(f"PRAGMA s.table_info({table})")}
                # the target's columns; one a source of an earlier schema lacks reads NULL
                cols = [c[1] for c in db.execute(f"PRAGMA main.table_info({table})")]
                sel = ", ".join(
                    "?" if c == "pid" else "step + ?" if c == "step"
                    else f"{c} + ?" if c in TIMED else c if c in have else "NULL"
                    for c in cols
                )  # fmt: skip
                args: list[Any] = []
                for c in cols:
                    if c == "pid":
                        args.append(pid)
                    elif c == "step":
                        args.append(k * top)
                    elif c in TIMED:
                        args.append(shift)
                args += [spid, limit]
                order = "step" if table == "steps" else "step, rowid"
                db.execute(
                    f"INSERT INTO {table} SELECT {sel} FROM s.{table} "
                    f"WHERE pid = ? AND step <= ? ORDER BY {order}",
                    args,
                )
        db.execute("COMMIT")
        db.execute("DETACH s")
    db.execute("VACUUM")
    db.close()


def _size(rec: Path) -> int:
    """A recording's bytes: the file, or every file of its folder."""
    if rec.is_dir():
        return sum(f.stat().st_size for f in rec.rglob("*") if f.is_file())
    return rec.stat().st_size


def _run(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    load = os.getloadavg()
    t = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t
    out = {
        "cmd": " ".join(cmd[2:]),
        "rc": p.returncode,
        "wall_s": round(wall, 2),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
        "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),
        "load_before": [round(x, 2) for x in load],
    }
    if p.returncode:
        out["stderr"] = err.decode(errors="replace")[-400:]
    return out


def commands(rec: Path, work: Path) -> dict[str, list[str]]:
    kineto = [KINETO / KINETO_FILE] if (KINETO / KINETO_FILE).exists() else []
    cmds = {
        "perfetto": ["export", str(rec), "--perfetto", str(work / "t.pftrace")],
        "openmetrics": ["export", str(rec), "--openmetrics", str(work / "t.om")],
        "textfile": ["export", str(rec), "--prometheus-textfile", str(work / "t.prom")],
        "rocpd": ["export", str(rec), "--rocpd", str(work / "t.rocpd.db")],
        "parquet": ["export", str(rec), "--parquet", str(work / "pq")],
    }
    if kineto:
        cmds["merge"] = [
            "merge", str(rec), str(kineto[0]), "--allow-unaligned", "--out", str(work / "m.pftrace")
        ]  # fmt: skip
    cmds["report"] = ["report", str(rec), "--json"]
    cmds["ab"] = ["ab", "--a", str(rec), "--b", str(rec), "--json"]
    for c in cmds.values():
        if c[0] in ("export", "merge"):
            c += ["--force", "--no-progress"]
    return cmds


def table(results: dict[str, Any]) -> str:
    """RESULTS.json as a Markdown table: per command and size, CPU s / wall s / peak MB."""
    sizes = sorted(results["sizes"].values(), key=lambda e: (e["steps"], e.get("format", "")))
    names = list(dict.fromkeys(n for e in sizes for n in e.get("runs", {})))
    head = (
        "| command | "
        + " | ".join(f"{e['steps']:,} steps, {e.get('format', 'sqlite')}" for e in sizes)
        + " |"
    )
    rows = [head, "|---|" + "---|" * len(sizes)]
    rows.append(
        "| recording | " + " | ".join(
            f"{e['file_bytes'] / 1e6:,.0f} MB, {e['bytes_per_step']:,.0f} B/step" for e in sizes
        ) + " |"
    )  # fmt: skip
    for n in names:
        cells = []
        for e in sizes:
            r = e.get("runs", {}).get(n)
            if r is None:
                cells.append("not run")
            elif r["rc"]:
                cells.append(f"exit {r['rc']}")
            else:
                cells.append(
                    f"{r['cpu_s']:,.1f} / {r['wall_s']:,.1f} s, {r['peak_rss_mb']:,.0f} MB"
                )
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _head() -> str:
    """The commit of the tree the command ran from (a dirty tree is marked)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "probe", "exporters"])
    return head.stdout.strip() + ("+dirty" if dirty.returncode else "")


def _save(out: Path | None, results: dict[str, Any]) -> None:
    """RESULTS.json after every command: a run cut short keeps what it measured."""
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "RESULTS.json").write_text(json.dumps(results, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--steps", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument(
        "--formats", nargs="+", default=["sqlite", "columnar"], choices=["sqlite", "columnar"]
    )
    ap.add_argument("--work", type=Path, default=Path("/tmp/probe-scale"))
    ap.add_argument("--out", type=Path, help="folder for RESULTS.json (merged with what is there)")
    ap.add_argument("--only", nargs="+", help="commands to run (default: all)")
    ap.add_argument("--skip", nargs="*", default=[], help="NAME or NAME@STEPS to leave out")
    ap.add_argument("--keep", action="store_true", help="keep the recordings made")
    ap.add_argument("--table", type=Path, help="print RESULTS.json of this folder as a table")
    a = ap.parse_args()
    if a.table:
        print(table(json.loads((a.table / "RESULTS.json").read_text())))
        return 0
    a.work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    results: dict[str, Any] = {}
    if a.out and (a.out / "RESULTS.json").exists():
        results = json.loads((a.out / "RESULTS.json").read_text())
    results.setdefault("sizes", {})
    results["command"] = "PYTHONPATH=$PWD nice -n 10 " + " ".join(
        [".venv/bin/python", "benchmarks/scale.py", *sys.argv[1:]]
    )
    results["machine"] = f"{os.cpu_count()} CPUs, {os.uname().release}"
    for n, fmt in [(n, f) for n in a.steps for f in a.formats]:
        key = str(n) if fmt == "sqlite" else f"{n} {fmt}"
        rec = a.work / (f"scale-{n}.probe.db" if fmt == "sqlite" else f"scale-{n}.probe")
        t = time.monotonic()
        if not rec.exists():
            (make if fmt == "sqlite" else make_columnar)(rec, n, a.ranks)
        made = time.monotonic() - t
        size = _size(rec)
        entry: dict[str, Any] = results["sizes"].get(key, {})
        entry.update(
            steps=n, ranks=a.ranks, file_bytes=size, bytes_per_step=round(size / n, 1),
            made_s=round(made, 1), commit=commit, format=fmt,
        )  # fmt: skip
        runs = entry.setdefault("runs", {})
        for name, c in commands(rec, a.work).items():
            if (a.only and name not in a.only) or name in a.skip or f"{name}@{n}" in a.skip:
                continue
            r = _run([sys.executable, "-m", "probe", *c], env)
            r["commit"] = _head()
            runs[name] = r
            print(json.dumps({"steps": n, "name": name, **r}), flush=True)
            for out in ("t.pftrace", "t.om", "t.prom", "t.rocpd.db", "m.pftrace"):
                if (a.work / out).exists():
                    r.setdefault("out_bytes", (a.work / out).stat().st_size)
                    (a.work / out).unlink()
            if (a.work / "pq").exists():
                r["out_bytes"] = sum(
                    f.stat().st_size for f in (a.work / "pq").rglob("*") if f.is_file()
                )
                shutil.rmtree(a.work / "pq")
            results["sizes"][key] = entry
            _save(a.out, results)
        results["sizes"][key] = entry
        _save(a.out, results)
        if not a.keep:
            shutil.rmtree(rec) if rec.is_dir() else rec.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
