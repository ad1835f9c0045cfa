"""Steps are the only way out of a recording: no module but the codec reads its rows.

``probe/reader/recording.py`` is the one codec between :class:`probe.step.Step` and SQLite.
Everything else in ``probe/``, ``exporters/`` and ``dashboards/`` reads a recording
through ``Recording.iter_steps()`` (and the per-process tables: ``meta()``,
``processes()``, ``builder_names()``, ``faults()``, ``outside()``, ``anomalies()``).

Three checks: no module outside the codec touches a recording's connection (``.db``) in
its source; every command that reads a recording (report, doctor, export to every file
format, merge with a real Kineto trace, ab) and the dashboards' renderer, run on a
recording whose connection notes each use, used it only from the codec; and inside the
codec only the Step reader reads the steps and detail tables.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from extras import needs
from recordings import sqlite_of

from probe.cli.main import main
from probe.reader.recording import Recording

ROOT = Path(__file__).resolve().parents[2]
CODEC = ROOT / "probe" / "reader" / "recording.py"
# the codec's own modules: opening a file, and the validated columnar read of the summary
CODECS = {
    CODEC,
    *(ROOT / "probe" / "reader" / m for m in ("recording_open.py", "recording_columns.py")),
}
H200 = ROOT / "tests/data"
# SQLite conversions of the committed (columnar) recordings: the watch is on the SQLite codec's
# connection
WINDOW = sqlite_of(H200 / "groundtruth-window.probe")
KINETO = H200 / "run3-groundtruth.kineto.trimmed.json.gz"
BUNDLED = sqlite_of(ROOT / "probe/data/default.probe")


def _sources() -> list[Path]:
    files = [p for d in ("probe", "exporters", "dashboards") for p in (ROOT / d).rglob("*.py")]
    return sorted(p for p in files if p not in CODECS)


def test_no_module_but_the_codec_touches_a_recordings_connection() -> None:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "db":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .db")
    assert found == [], "read the recording through Recording.iter_steps():\n" + "\n".join(found)


class _Watched:
    """A recording's connection that notes every use from a file other than the codec."""

    def __init__(self, db: sqlite3.Connection, seen: list[str]) -> None:
        object.__setattr__(self, "_db", db)
        object.__setattr__(self, "_seen", seen)

    def _note(self, what: str) -> None:
        frame = sys._getframe(2)
        if Path(frame.f_code.co_filename).resolve() not in CODECS:
            self._seen.append(f"{frame.f_code.co_filename}:{frame.f_lineno}: db.{what}")

    def __getattr__(self, name: str) -> Any:
        self._note(name)
        return getattr(self._db, name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._note(name)
        setattr(self._db, name, value)


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ``Recording.open`` gives a recording whose connection is watched."""
    seen: list[str] = []
    opened = Recording.open.__func__  # type: ignore[attr-defined]

    def open_watched(cls: type[Recording], path: str | Path) -> Recording:
        rec = opened(cls, path)
        return dataclasses.replace(rec, db=_Watched(rec.db, seen))  # type: ignore[arg-type]

    monkeypatch.setattr(Recording, "open", classmethod(open_watched))
    return seen


def test_the_watch_sees_a_read_from_outside_the_codec(watched: list[str]) -> None:
    rec = Recording.open(WINDOW)
    assert sum(1 for _ in rec.iter_steps()) == 25
    assert watched == []  # the codec's own reads
    rec.db.execute("SELECT * FROM steps").fetchall()
    assert len(watched) == 1 and "test_steps_only.py" in watched[0]


@needs("perfetto", "prometheus")
def test_every_reader_reads_steps(
    watched: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w, out = str(WINDOW), tmp_path
    commands = [
        ["report", w, "--json"],
        ["report", w],
        ["doctor", w],
        ["export", w, "--perfetto", str(out / "a.pftrace")],
        ["export", w, "--rocpd", str(out / "a.db")],
        ["export", w, "--openmetrics", str(out / "a.om")],
        ["export", w, "--prometheus-textfile", str(out / "a.prom")],
        ["merge", w, str(KINETO), "--report", "--out", str(out / "m.pftrace")],
        ["merge", w, str(KINETO), "--json", "--rocpd", str(out / "m.db")],
        ["ab", "--a", w, "--b", str(BUNDLED), "--json"],
    ]
    for argv in commands:
        assert main(argv) == 0, (argv, capsys.readouterr().err)
    from dashboards.render_recording import Data

    assert Data(Recording.open(WINDOW), 1.0).rows
    assert watched == [], "\n".join(watched)


_TABLES = "steps|spans|dispatches|replays|builds|reorders|gpu"
_STEP_TABLES = re.compile(rf"\bFROM\s+(?:(?:{_TABLES})\b|\{{)")


def test_only_the_step_reader_reads_step_tables() -> None:
    """A ``Recording`` method that reads the steps or detail tables returns Steps, the
    builder ids they carry, counts, or the tables as column batches (whose readers check
    every value: ``detail_columns``, ``iter_step_columns``); no other method hands those
    rows out."""
    tree = ast.parse(CODEC.read_text())
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Recording"]
    readers = set()
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and _STEP_TABLES.search(ast.unparse(fn)):
            readers.add(fn.name)
    assert readers == {
        "iter_steps",
        "batches",
        "_detail_rows",
        "_rows_of_pid",  # the query _detail_rows runs for one process (and its private index)
        "builder_names",
        "step_counts",
        "record_count",
    }
