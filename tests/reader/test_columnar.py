"""The columnar recording: written, read, converted both ways, and crash-safe.

The kill test runs a real writer in a child process (the reader's own ColumnarWriter, fed
the bundled recording's real steps) and kills it with SIGKILL while it writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from probe.reader.columnar import ColumnarWriter
from probe.reader.columnar_convert import convert
from probe.reader.columnar_read import ColumnarRecording
from probe.reader.columnar_schema import (
    LIVE,
    MANIFEST,
    is_columnar,
)
from probe.reader.recording import Recording, RecordingError
from probe.step import Step

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def _sqlite_copy(tmp_path: Path, name: str) -> Path:
    """A committed recording as an SQLite file (converted from its columnar folder)."""
    src = ROOT / "probe" / "data" / "default.probe" if name == "default" else DATA / f"{name}.probe"
    out = tmp_path / f"{name}.probe.db"
    convert(src, out, to_sqlite=True)
    return out


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The bundled recording as SQLite and again as columnar (converted from it)."""
    tmp = tmp_path_factory.mktemp("both")
    db = _sqlite_copy(tmp, "default")
    col = tmp / "default.probe"
    assert convert(db, col) == 1305
    return db, col


def test_every_step_reads_the_same_from_both_formats(both: tuple[Path, Path]) -> None:
    db, col = both
    a, b = Recording.open(db), ColumnarRecording.open(col)
    assert list(a.iter_steps()) == list(b.iter_steps())
    assert a.meta() == b.meta()
    assert a.processes() == b.processes()
    assert a.builder_names() == b.builder_names()
    assert a.step_counts() == b.step_counts()
    assert a.record_count() == b.record_count()
    assert a.faults() == b.faults() and a.outside() == b.outside()
    pid = next(iter(a.step_counts()))
    assert list(a.iter_steps(pid)) == list(b.iter_steps(pid))
    assert list(b.iter_steps(pid + 10**6)) == []


def test_summary_and_report_are_the_same_from_both_formats(both: tuple[Path, Path]) -> None:
    from probe.cli.render_report import build_report

    db, col = both
    a = build_report(Recording.open(db))
    b = build_report(ColumnarRecording.open(col))
    a.pop("recording"), b.pop("recording"), a.pop("recordings"), b.pop("recordings")
    assert a == b


def test_columnar_back_to_sqlite_is_the_same(both: tuple[Path, Path], tmp_path: Path) -> None:
    db, col = both
    back = tmp_path / "back.probe.db"
    assert convert(col, back, to_sqlite=True) == 1305
    assert list(Recording.open(back).iter_steps()) == list(Recording.open(db).iter_steps())


def test_a_columnar_recording_is_much_smaller(both: tuple[Path, Path]) -> None:
    db, col = both
    size = sum(f.stat().st_size for f in col.iterdir())
    assert size * 5 < db.stat().st_size
    assert not (col / LIVE).exists()
    assert json.loads((col / MANIFEST).read_text())["state"] == "closed"


def test_a_recording_read_while_it_is_written_leaves_nothing_beside_it(tmp_path: Path) -> None:
    src = ColumnarRecording.open(ROOT / "probe" / "data" / "default.probe")
    steps = list(src.iter_steps())
    out = tmp_path / "live.probe"
    w = ColumnarWriter(out, commit_every_s=float("inf"))
    w.meta.update(src.meta())
    for p in src.processes():
        w.add_process(p["pid"], None)
    w.set_strings(steps[0].pid, src.builder_names()[steps[0].pid])
    w.add_steps(steps[:500])
    w.commit()
    w.add_steps(steps[500:700])  # not flushed: not read
    before = sorted(p.name for p in out.rglob("*"))
    live = ColumnarRecording.open(out)
    assert list(live.iter_steps()) == steps[:500]
    live.close()
    assert sorted(p.name for p in out.rglob("*")) == before
    w.close()
    assert list(ColumnarRecording.open(out).iter_steps()) == steps[:700]


CHILD = textwrap.dedent(
    """
    import sys
    from dataclasses import replace
    from probe.reader.columnar import ColumnarWriter
    from probe.reader.columnar_read import ColumnarRecording
    src = ColumnarRecording.open(sys.argv[1])
    steps = list(src.iter_steps())
    names = src.builder_names()
    w = ColumnarWriter(sys.argv[2], commit_every_s=float("inf"))
    for pid, n in names.items():
        w.set_strings(pid, n)
    w.add_process(steps[0].pid, None)
    batch, done, rep = int(sys.argv[3]), 0, 0
    while True:  # the steps again and again, numbered on: until it is killed
        for i in range(0, len(steps), batch):
            w.add_steps(replace(s, step=s.step + rep * 10**6) for s in steps[i:i + batch])
            w.commit()
            done += len(steps[i:i + batch])
            print(done, flush=True)
        rep += 1
    """
)


def test_a_writer_killed_mid_write_reads_whole_up_to_its_last_flush(tmp_path: Path) -> None:
    src = ROOT / "probe" / "data" / "default.probe"
    out = tmp_path / "killed.probe"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    batch = 87  # 1305 = 15 x 87: every flush ends on a batch
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(src), str(out), str(batch)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert child.stdout is not None
    last = 0
    for line in child.stdout:  # flushes reported; the kill lands while it writes more
        last = int(line)
        if last >= 20 * batch:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    assert (out / LIVE).is_dir()  # never compacted: read from its live streams
    rec = Recording.open(out)
    got = list(rec.iter_steps())
    rec.close()
    assert len(got) >= last and len(got) % batch == 0  # whole flushes, the last included
    want = list(ColumnarRecording.open(src).iter_steps())

    def shape(s: Step) -> tuple[object, ...]:
        return (s.step % 10**6, s.t0, s.mode, s.host_ns, s.phases, len(s.spans), len(s.builds))

    # every step whole and in the order written (the repetitions numbered on), none partial
    assert [s.step // 10**6 for s in got] == [i // len(want) for i in range(len(got))]
    assert [shape(s) for s in got] == [shape(want[i % len(want)]) for i in range(len(got))]


def test_a_stream_shorter_than_its_manifest_says_is_damage(tmp_path: Path) -> None:
    src = ColumnarRecording.open(ROOT / "probe" / "data" / "default.probe")
    steps = list(src.iter_steps())
    out = tmp_path / "cut.probe"
    w = ColumnarWriter(out, commit_every_s=float("inf"))
    w.set_strings(steps[0].pid, src.builder_names()[steps[0].pid])
    w.add_steps(steps[:300])
    w.commit()
    stream = out / LIVE / "steps.arrows"
    data = stream.read_bytes()
    stream.write_bytes(data[: len(data) // 2])  # what the manifest counts is not all there
    with pytest.raises(RecordingError, match="damaged recording: live stream steps"):
        ColumnarRecording.open(out)


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda p: (p / MANIFEST).write_text("{"), "is not JSON"),
        (lambda p: (p / MANIFEST).write_text('{"format": "x"}'), "not a probe recording"),
        (lambda p: (p / "steps.parquet").write_bytes(b"PAR1" * 8), "damaged recording: steps"),
        (lambda p: (p / "spans.parquet").unlink(), "table spans is missing"),
    ],
)
def test_damage_is_one_clear_error(tmp_path: Path, damage: object, why: str) -> None:
    out = tmp_path / "d.probe"
    convert(ROOT / "probe" / "data" / "default.probe", out)
    damage(out)  # type: ignore[operator]
    with pytest.raises(RecordingError, match=why):
        rec = ColumnarRecording.open(out)
        list(rec.iter_steps())


def test_damage_gives_one_line_and_exit_2_from_report(tmp_path: Path) -> None:
    out = tmp_path / "d.probe"
    convert(ROOT / "probe" / "data" / "default.probe", out)
    (out / "steps.parquet").write_bytes(b"PAR1" * 8)
    p = subprocess.run(
        [sys.executable, "-m", "probe", "report", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 2
    assert p.stderr.startswith("probe: error: ") and len(p.stderr.strip().splitlines()) == 1
    assert "Traceback" not in p.stderr


def test_only_a_folder_with_a_manifest_is_a_recording(tmp_path: Path) -> None:
    assert not is_columnar(tmp_path)
    (tmp_path / MANIFEST).write_text("{}")
    assert is_columnar(tmp_path)


def test_a_recording_closed_while_a_reader_opens_it_is_read_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer closes (compacts in place, removes its live streams) while a reader is
    compacting the same live streams privately: the reader reads the closed recording,
    every step the writer wrote."""
    import probe.reader.columnar_compact as cc

    src = ColumnarRecording.open(ROOT / "probe" / "data" / "default.probe")
    steps = list(src.iter_steps())
    out = tmp_path / "closing.probe"
    w = ColumnarWriter(out, commit_every_s=float("inf"))
    w.meta.update(src.meta())
    for p in src.processes():
        w.add_process(p["pid"], None)
    w.set_strings(steps[0].pid, src.builder_names()[steps[0].pid])
    w.add_steps(steps[:400])
    w.commit()
    w.add_steps(steps[400:600])
    real = cc.compact
    closed: list[bool] = []

    def racing(path: str | Path) -> None:
        if Path(path) != out and not closed:
            closed.append(w.close())  # the writer's own compaction runs first, to its end
            assert not (out / LIVE).exists()
        real(path)

    monkeypatch.setattr(cc, "compact", racing)
    rec = ColumnarRecording.open(out)
    assert closed and rec.manifest["state"] == "closed"
    assert list(rec.iter_steps()) == steps[:600]
    assert not list(tmp_path.glob("probe-read-*"))


def test_arrow_arrays_read_from_their_buffers_as_numpy_reads_them() -> None:
    """numpy_of reads an integer or boolean array (a slice of one too) from its buffers as
    Arrow's own conversion does, a NULL as the value asked for; nulls_of finds the NULLs
    as Arrow's is_null does."""
    import numpy as np
    import pyarrow as pa

    from probe.reader.columnar_read import nulls_of, numpy_of

    rng = np.random.default_rng(3)
    for kind, values in (
        (pa.int64(), rng.integers(-(2**62), 2**62, 300)),
        (pa.int32(), rng.integers(-1000, 1000, 300)),
        (pa.bool_(), rng.integers(0, 2, 300).astype(bool)),
    ):
        whole = pa.array(values, kind)
        for a in (whole, whole.slice(3), whole.slice(13, 101), whole.slice(300)):
            assert numpy_of(a).tolist() == a.to_numpy(zero_copy_only=False).tolist()
        gaps = pa.array([None if i % 7 == 0 else v for i, v in enumerate(values.tolist())], kind)
        for a in (gaps, gaps.slice(5, 77)):
            want = [-1 if v is None else int(v) for v in a.to_pylist()]
            assert np.asarray(numpy_of(a, null=-1), np.int64).tolist() == want
            assert nulls_of(a).tolist() == a.is_null().to_pylist()
        assert not nulls_of(whole.slice(2, 9)).any()


def test_a_recordings_sql_prints_no_progress_bar() -> None:
    """DuckDB draws a progress bar on a long query; a command's SQL over a recording turns
    it off (``report --json`` writes nothing but its JSON)."""
    rec = ColumnarRecording.open(ROOT / "probe" / "data" / "default.probe")
    try:
        assert rec.sql("SELECT current_setting('enable_progress_bar')") == [(False,)]
    finally:
        rec.close()
