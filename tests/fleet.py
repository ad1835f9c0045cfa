"""A fleet's recordings as the agent lays them out (``host=<host>/day=<day>/NAME.probe``),
made from the committed recordings, and the queries of docs/fleet.md read from the page
with the report figure each one reproduces.

Each committed recording is converted twice: once as it is, then, with its meta's ``host``
set to its partition's, into the fleet folder (so ``probe report`` and the folders name one
host, in the manifest and in ``processes.parquet`` alike).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from probe.reader.columnar_convert import convert
from probe.reader.columnar_schema import MANIFEST
from probe.reader.recording import default_recording

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "fleet.md"

#: (recording, host, day) of the fleet: two hosts, one of them on two days; no pid twice
FLEET: tuple[tuple[str, str, str], ...] = (
    ("default", "gpu-a", "2026-03-01"),
    ("serve-tp2", "gpu-b", "2026-03-01"),
    ("cpu_graphs_off", "gpu-b", "2026-03-02"),
)


def committed(name: str) -> Path:
    """A committed recording: ``default`` is the bundled one, any other name one of
    tests/data/."""
    return default_recording() if name == "default" else ROOT / "tests" / "data" / f"{name}.probe"


def as_host(src: Path, out: Path, host: str, work: Path) -> None:
    """``src`` written at ``out`` (columnar) with its meta's ``host`` set to ``host``."""
    stage = work / f"{out.name}.stage"
    convert(src, stage)
    manifest = json.loads((stage / MANIFEST).read_text())
    manifest["meta"]["host"] = host
    (stage / MANIFEST).write_text(json.dumps(manifest))
    out.parent.mkdir(parents=True, exist_ok=True)
    convert(stage, out)


def build_fleet(root: Path, work: Path) -> Path:
    """The fleet folder ``root`` (:data:`FLEET`), made in ``work``'s scratch space."""
    for name, host, day in FLEET:
        as_host(committed(name), root / f"host={host}" / f"day={day}" / f"{name}.probe", host, work)
    return root


def probe(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probe", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=None if env is None else dict(env),
    )


def report(root: Path) -> dict[str, Any]:
    """``probe report ROOT --json``."""
    r = probe("report", str(root), "--json")
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)


def blocks(lang: str) -> list[str]:
    """The fenced blocks of docs/fleet.md in ``lang``, as written."""
    return [
        m.group(2) for m in BLOCK.finditer(DOC.read_text(encoding="utf-8")) if m.group(1) == lang
    ]


def doc_queries() -> dict[str, str]:
    """Each figure query of docs/fleet.md (a ``sql`` block whose first line is
    ``-- figure: NAME``): NAME -> the query's text."""
    out = {}
    for text in blocks("sql"):
        m = re.match(r"-- figure: (\w+)\n", text)
        if m:
            out[m.group(1)] = text
    return out


def doc_spark_views() -> Callable[[Any, str], None]:
    """docs/fleet.md's ``probe_views(spark, root)``, defined by running its block."""
    (text,) = [b for b in blocks("python") if b.startswith("def probe_views(")]
    scope: dict[str, Any] = {}
    exec(text, scope)
    fn: Callable[[Any, str], None] = scope["probe_views"]
    return fn


def _by_key(rows: list[dict[str, Any]], *key: str) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: tuple(r[k] for k in key))


def expected(name: str, rep: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows the figure query ``name`` must give, read from ``probe report --json``, in
    the order of :func:`in_order`."""
    if name == "hit_rates_all":
        return [dict(rep["hit_rates_all"])]
    if name == "miss_reasons":
        keep = ("mode", "reason", "count", "share")
        return _by_key([{k: r[k] for k in keep} for r in rep["miss_reasons"]], "mode", "reason")
    if name == "nonforward_steps":
        return [{"nonforward_steps": rep["nonforward_steps"]}]
    if name == "per_rank":
        host = {p["pid"]: p["host"] for p in rep["processes"]}
        forward = {p["pid"]: p["forward_steps"] for p in rep["processes"]}
        rows = []
        for r in rep["per_rank"]:
            h = r["hit_rates_all"]
            assert h["steps"] == forward[r["pid"]]
            rows.append(
                {"host": host[r["pid"]], "pid": r["pid"], "tp_rank": r["tp_rank"],
                 **{k: h[k] for k in ("steps", "full", "piecewise", "none", "full_hit_rate",
                                      "graph_rate")}}
            )  # fmt: skip
        return _by_key(rows, "host", "pid")
    raise KeyError(f"docs/fleet.md has a figure query {name!r} that no test checks")


def in_order(name: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A query's rows in the order :func:`expected` gives them."""
    if name == "miss_reasons":
        return _by_key(rows, "mode", "reason")
    if name == "per_rank":
        return _by_key(rows, "host", "pid")
    return rows
