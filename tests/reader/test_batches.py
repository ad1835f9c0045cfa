"""Column batches: either format, and several files read as one, give the same rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from probe.reader.columnar_schema import TABLES, detail_schema, step_schema
from probe.reader.recording import Recording, RecordingError
from probe.reader.recording_set import RecordingSet
from tests.recordings import committed, copy_recording, sqlite_of

RECS = committed()


def _table(rec: object, table: str, pid: int | None = None, size: int = 65_536) -> pa.Table:
    full = step_schema(with_counts=False) if table == "steps" else detail_schema(table)
    got = list(rec.batches(table, list(full.names), pid, size))  # type: ignore[attr-defined]
    t = pa.Table.from_batches(got, schema=got[0].schema) if got else full.empty_table()
    # a columnar file reads text as dictionaries: compared as plain text
    return t.cast(pa.schema([pa.field(f.name, f.type) for f in full]))


@pytest.mark.parametrize("path", RECS)
@pytest.mark.parametrize("table", TABLES)
def test_sqlite_batches_equal_the_columnar_ones(path: str, table: str) -> None:
    col = Recording.open(path)
    sql = Recording.open(sqlite_of(path))
    want = _table(col, table)
    assert want.num_rows > 0 or table != "steps"
    assert _table(sql, table, size=97).equals(want)
    pids = sorted(col.step_counts())
    one = _table(sql, table, pids[-1])
    assert one.equals(_table(col, table, pids[-1]))
    assert set(one.column("pid").to_pylist()) <= {pids[-1]}


def _split(src: Path, tmp: Path) -> list[Path]:
    """``src`` (SQLite) as two files: its steps below and from the middle step of each
    process on, with their detail rows."""
    import sqlite3

    halves = []
    for i, keep in enumerate(("<", ">=")):
        dst = tmp / f"half{i}.probe.db"
        copy_recording(src, dst)
        db = sqlite3.connect(dst)
        mids = dict(db.execute("SELECT pid, (min(step) + max(step)) / 2 FROM steps GROUP BY pid"))
        for t in TABLES:
            for pid, mid in mids.items():
                db.execute(f"DELETE FROM {t} WHERE pid = ? AND NOT step {keep} ?", (pid, mid))
        db.commit()
        db.close()
        halves.append(dst)
    return halves


def test_a_set_of_rolling_files_batches_as_its_whole(tmp_path: Path) -> None:
    src = sqlite_of(RECS[0])
    whole = Recording.open(src)
    a, b = _split(src, tmp_path)
    for order in ((a, b), (b, a)):  # files named in either order: steps still in order
        rs = RecordingSet([Recording.open(p) for p in order])
        for table in TABLES:
            got = _table(rs, table)
            want = _table(whole, table)
            if order[0] == a:
                assert got.equals(want), table
            else:  # interleaved files: ordered by step, the earlier-named file first
                assert got.sort_by([("pid", "ascending"), ("step", "ascending")]).num_rows == (
                    want.num_rows
                )
                steps = got.column("step").to_pylist()
                pids = got.column("pid").to_pylist()
                assert list(zip(pids, steps, strict=True)) == sorted(zip(pids, steps, strict=True))


def test_a_damaged_value_in_a_batch_is_one_recording_error(tmp_path: Path) -> None:
    import sqlite3

    dst = tmp_path / "bad.probe.db"
    copy_recording(sqlite_of(RECS[0]), dst)
    db = sqlite3.connect(dst)
    db.execute("UPDATE steps SET t0_ns = 'soon' WHERE rowid = 3")
    db.commit()
    db.close()
    rec = Recording.open(dst)
    with pytest.raises(RecordingError, match="damaged recording: steps: t0_ns"):
        list(rec.batches("steps"))


def test_a_set_reads_as_checked_step_columns_as_one_file_does(tmp_path: Path) -> None:
    import numpy as np

    from probe.reader.recording_columns import iter_step_columns

    src = sqlite_of(RECS[0])
    a, b = _split(src, tmp_path)
    rs = RecordingSet([Recording.open(a), Recording.open(b)])

    def whole(rec: object) -> dict[str, np.ndarray]:
        chunks = list(iter_step_columns(rec, chunk=101))
        return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}

    want, got = whole(Recording.open(src)), whole(rs)
    assert set(got) == set(want)
    for k, v in want.items():
        assert np.array_equal(got[k], v), k


@pytest.mark.parametrize("path", RECS)
def test_steps_built_from_batches_equal_the_row_decoders(path: str) -> None:
    """A columnar recording's Steps (built a batch at a time) are the Steps the row decoder
    makes of the same recording as SQLite: every field and detail record."""
    from probe.reader.recording_batches import steps_of_batches

    col, sql = Recording.open(path), Recording.open(sqlite_of(path))
    want = list(sql.iter_steps())
    assert list(col.iter_steps()) == want
    assert list(steps_of_batches(sql)) == want  # the SQLite file's batches too
    pid = sorted(col.step_counts())[-1]
    assert list(col.iter_steps(pid)) == [s for s in want if s.pid == pid]
    # without their records (what the what-if reads): the same steps, no record read
    bare = {f: () for f in ("spans", "builds", "reorders", "dispatches", "replays")}
    assert list(steps_of_batches(col, records=False)) == [replace(s, **bare) for s in want]


def test_a_damaged_columnar_value_is_named_as_the_row_decoder_names_it(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    dst = tmp_path / "bad.probe"
    copy_recording(RECS[0], dst)
    t = pq.read_table(dst / "spans.parquet")
    i = t.schema.get_field_index("t1_ns")
    bad = t.column("t1_ns").to_pylist()
    bad[5] = t.column("t0_ns")[5].as_py() - 1
    pq.write_table(t.set_column(i, "t1_ns", pa.array(bad, pa.int64())), dst / "spans.parquet")
    why = r"spans row \(pid \d+, step \d+\): t1 is \d+, before t0"
    with pytest.raises(RecordingError, match=why):
        list(Recording.open(dst).iter_steps())


def test_one_process_of_a_columnar_file_reads_without_its_pid_column() -> None:
    rec = Recording.open(RECS[0])
    pid = sorted(rec.step_counts())[-1]
    got = [b for b in rec.batches("steps", ["step"], pid)]
    assert got and all(b.schema.names == ["step"] for b in got)
    steps = [s for b in got for s in b.column(0).to_pylist()]
    assert steps == [s.step for s in rec.iter_steps(pid)]


def test_a_set_of_columnar_files_reads_as_checked_step_columns() -> None:
    import numpy as np

    from probe.reader.recording_columns import iter_step_columns

    rs = RecordingSet([Recording.open(p) for p in RECS[:2]])
    got = np.concatenate([c["step"] for c in iter_step_columns(rs, chunk=97)])
    assert got.tolist() == [s.step for s in rs.iter_steps()]


@pytest.mark.parametrize("path", RECS)
@pytest.mark.parametrize("fmt", ["columnar", "sqlite"])
def test_detail_columns_are_the_rows_of_iter_steps(path: str, fmt: str) -> None:
    """Each detail table's checked columns (a batch of 97 rows at a time, beside the step
    keys read a batch at a time) are the records of the steps, in their order."""
    from probe.reader.recording import record_fields
    from probe.reader.recording_columns import iter_detail_columns
    from probe.reader.recording_schema import DETAIL_TABLES

    rec = Recording.open(path if fmt == "columnar" else sqlite_of(path))
    names = rec.builder_names()
    for t in DETAIL_TABLES:
        want = [
            {"pid": s.pid, "step": s.step, **record_fields(r, names.get(s.pid, {}).get)}
            for s in rec.iter_steps()
            for r in getattr(s, t.step_field)
        ]
        got = []
        for b, cols in iter_detail_columns(rec, t.name, size=97):
            assert b.num_rows == len(cols["pid"]) <= 97
            got += pa.Table.from_batches([b]).cast(_plain(b.schema)).to_pylist()
        for row in got:  # as the SQLite rows hold them: flags 0/1, a lost builder's name ?
            row.update({k: int(v) for k, v in row.items() if isinstance(v, bool)})
            if t.name == "builds" and row["builder"] is None:
                row["builder"] = "?"
        assert got == want, t.name


def _plain(schema: pa.Schema) -> pa.Schema:
    """``schema`` with text as plain text (a columnar file's dictionaries)."""
    plain = [f.type.value_type if pa.types.is_dictionary(f.type) else f.type for f in schema]
    return pa.schema([pa.field(f.name, t) for f, t in zip(schema, plain, strict=True)])


def test_detail_rows_of_a_step_not_in_steps_are_left_out(tmp_path: Path) -> None:
    import sqlite3

    from probe.reader.recording_columns import iter_detail_columns

    dst = tmp_path / "orphans.probe.db"
    copy_recording(sqlite_of(RECS[0]), dst)
    db = sqlite3.connect(dst)
    pids = [r[0] for r in db.execute("SELECT DISTINCT pid FROM steps ORDER BY pid")]
    last = db.execute("SELECT max(step) FROM steps").fetchone()[0]
    gap = db.execute(
        "SELECT a.step + 1 FROM steps AS a WHERE NOT EXISTS (SELECT 1 FROM steps AS b "
        "WHERE b.pid = a.pid AND b.step = a.step + 1) ORDER BY a.pid, a.step LIMIT 1"
    ).fetchone()[0]
    # spans of no step: before the first, after a process's last, past the end
    for pid, step in ((pids[0], 0), (pids[0], gap), (pids[-1], last + 10), (pids[-1], last + 20)):
        db.execute(
            "INSERT INTO spans SELECT ?, ?, phase, t0_ns, t1_ns, drafter FROM spans LIMIT 2",
            (pid, step),
        )
    db.commit()
    db.close()
    rec = Recording.open(dst)
    want = [(s.pid, s.step) for s in rec.iter_steps() for _ in s.spans]
    for size in (1, 7, 65_536):
        got = [
            (p, s)
            for _, cols in iter_detail_columns(rec, "spans", ["phase"], size=size)
            for p, s in zip(cols["pid"].tolist(), cols["step"].tolist(), strict=True)
        ]
        assert got == want, size
    db = sqlite3.connect(dst)
    total, orphans = db.execute(
        "SELECT count(*), sum(NOT EXISTS (SELECT 1 FROM steps AS s WHERE s.pid = d.pid "
        "AND s.step = d.step)) FROM spans AS d"
    ).fetchone()
    db.close()
    assert orphans >= 6 and len(want) == total - orphans
