"""What a hostile file system hands the ``probe`` command: link loops, dangling links and
parents it may not search, in every command that takes a path; inputs it must not write
beside (a WAL-mode rocpd profile on a read-only mount); a disk that fills between two
outputs of one command.

Each test runs ``probe`` as a user does (a process of its own, from this tree) on real
files and mounts, and asserts its exit status, its one ``probe: error:`` line and what
it left on disk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from recordings import sqlite_of

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "probe/data/default.probe"
RECORDING_DB = sqlite_of(RECORDING)  # the same as one SQLite file, copied where a case needs it
KINETO = ROOT / "tests/data/run3-groundtruth.kineto.trimmed.json.gz"


def probe(
    *argv: str, cwd: Path, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "PROBE_PROGRESS": "0", **(env or {})}
    return subprocess.run(
        [*prefix, sys.executable, "-m", "probe", *argv],
        cwd=cwd,
        env=e,
        capture_output=True,
        timeout=300,
    )


def one_error(r: subprocess.CompletedProcess[bytes], *mentions: str) -> str:
    err = r.stderr.decode("utf-8", "replace")
    assert b"Traceback" not in r.stderr, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("probe: error:"), err
    for m in mentions:
        assert m in lines[0], err
    return lines[0]


@contextlib.contextmanager
def tmpfs(at: Path, size: str) -> Iterator[Path]:
    at.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(at)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.decode().strip()}")
    try:
        yield at
    finally:
        subprocess.run(["umount", str(at)], check=False)


# -- link loops, dangling links, parents that cannot be searched ---------------------------


def _paths(d: Path) -> None:
    (d / "good.probe.db").write_bytes(RECORDING_DB.read_bytes())
    (d / "loop.db").symlink_to("loop.db")
    (d / "a.db").symlink_to("b.db")
    (d / "b.db").symlink_to("a.db")
    (d / "dangling.db").symlink_to("nothing-there.db")
    (d / "loopdir").symlink_to("loopdir")


INPUTS = {
    "report": ["report", "{bad}"],
    "report --json": ["report", "{bad}", "--json"],
    "export --prometheus-textfile": ["export", "{bad}", "--prometheus-textfile", "x.prom"],
    "export --perfetto": ["export", "{bad}", "--perfetto", "x.pftrace", "--force"],
    "export --openmetrics": ["export", "{bad}", "--openmetrics", "x.om"],
    "export --rocpd": ["export", "{bad}", "--rocpd", "x.db"],
    "export two recordings": ["export", "good.probe.db", "{bad}", "--openmetrics", "x.om"],
    "export --to": ["export", "{bad}", "--to", "prometheus", "--out", "x.prom"],
    "merge recording": ["merge", "{bad}", str(KINETO), "--allow-unaligned", "--out", "m.pf"],
    "merge profile": ["merge", "good.probe.db", "{bad}", "--allow-unaligned", "--out", "m.pf"],
    "ab --a": ["ab", "--a", "{bad}", "--b", "good.probe.db"],
    "ab --b": ["ab", "--a", "good.probe.db", "--b", "{bad}"],
    "doctor": ["doctor", "{bad}"],
    "whatif": ["whatif", "{bad}"],
}
OUTPUTS = {
    "export --prometheus-textfile": ["export", "good.probe.db", "--prometheus-textfile", "{bad}"],
    "export --perfetto": ["export", "good.probe.db", "--perfetto", "{bad}"],
    "export --openmetrics": ["export", "good.probe.db", "--openmetrics", "{bad}"],
    "export --rocpd": ["export", "good.probe.db", "--rocpd", "{bad}"],
    "export --parquet": ["export", "good.probe.db", "--parquet", "{bad}"],
    "merge --out": ["merge", "good.probe.db", str(KINETO), "--allow-unaligned", "--out", "{bad}"],
    "record --out": ["record", "--out", "{bad}", "--", "/bin/true"],
    "collect --out": ["collect", "--run-dir", "run", "--out", "{bad}"],
}
BAD_INPUTS = ["loop.db", "a.db", "dangling.db", "loopdir/r.db"]
BAD_OUTPUTS = ["loopdir/out.x", "dangling-dir/out.x", "loop.db/out.x"]


@pytest.mark.parametrize("bad", BAD_INPUTS)
@pytest.mark.parametrize("cmd", list(INPUTS))
def test_an_input_that_leads_nowhere_is_one_line(tmp_path: Path, cmd: str, bad: str) -> None:
    _paths(tmp_path)
    before = sorted(os.listdir(tmp_path))
    r = probe(*(a.format(bad=bad) for a in INPUTS[cmd]), cwd=tmp_path)
    assert r.returncode in (1, 2)
    one_error(r, bad.split("/")[0])
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("bad", BAD_OUTPUTS)
@pytest.mark.parametrize("cmd", list(OUTPUTS))
def test_an_output_under_a_link_loop_is_one_line(tmp_path: Path, cmd: str, bad: str) -> None:
    _paths(tmp_path)
    (tmp_path / "dangling-dir").symlink_to("no-such-dir")
    (tmp_path / "run").mkdir(mode=0o700)
    before = sorted(os.listdir(tmp_path))
    r = probe(*(a.format(bad=bad) for a in OUTPUTS[cmd]), cwd=tmp_path)
    assert r.returncode in (1, 2)
    one_error(r, bad.split("/")[0])
    assert sorted(os.listdir(tmp_path)) == before


def _without_dac() -> tuple[str, ...]:
    """Run as root without the capabilities that pass by file modes (a user's view of a
    folder it may not search)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to drop the override of file modes")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search", "--")


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "locked/in/r.probe.db"],
        ["export", "locked/in/r.probe.db", "--perfetto", "x.pftrace"],
        ["export", "good.probe.db", "--perfetto", "locked/in/x.pftrace"],
        ["export", "good.probe.db", "--parquet", "locked/in/pq"],
        ["merge", "good.probe.db", "locked/in/k.json", "--allow-unaligned", "--out", "m.pf"],
        ["ab", "--a", "locked/in/r.probe.db", "--b", "good.probe.db"],
        ["doctor", "locked/in/r.probe.db"],
        ["whatif", "locked/in/r.probe.db"],
        ["record", "--out", "locked/in/r.db", "--", "/bin/true"],
        ["collect", "--run-dir", "locked/in", "--out", "c.db"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_parent_that_cannot_be_searched_is_one_line(tmp_path: Path, argv: list[str]) -> None:
    prefix = _without_dac()
    _paths(tmp_path)
    (tmp_path / "locked/in").mkdir(parents=True)
    (tmp_path / "locked/in/r.probe.db").write_bytes(RECORDING_DB.read_bytes())
    os.chmod(tmp_path / "locked", 0)
    try:
        r = probe(*argv, cwd=tmp_path, prefix=prefix)
        assert r.returncode in (1, 2)
        one_error(r, "locked")
    finally:
        os.chmod(tmp_path / "locked", 0o755)
    assert sorted(os.listdir(tmp_path / "locked/in")) == ["r.probe.db"]


# -- a WAL-mode rocpd profile on a read-only mount -------------------------------------------


def _rocpd_profile(d: Path) -> Path:
    """A real rocpd database (``probe export --rocpd`` of the bundled recording)."""
    r = probe("export", str(RECORDING), "--rocpd", "rp.db", cwd=d)
    assert r.returncode == 0, r.stderr
    return d / "rp.db"


def _in_wal(src: Path, out: Path, how: str) -> None:
    """``src`` in WAL mode into the folder ``out``: ``frames``: half of its regions
    deleted in the ``-wal`` (not checkpointed), the ``.db`` and ``-wal`` copied without
    the ``-shm``; ``empty``: the ``.db`` beside a zero-length ``-wal``."""
    work = src.parent / f"work-{how}-{out.name}"
    work.mkdir()
    db = work / "rp.db"
    shutil.copyfile(src, db)
    c = sqlite3.connect(db)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA wal_autocheckpoint=0")
    if how == "frames":
        (region,) = c.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'rocpd_region%'"
        ).fetchone()
        with c:
            c.execute(f"DELETE FROM {region} WHERE id % 2 = 0")
        shutil.copyfile(db, out / "rp.db")
        shutil.copyfile(f"{db}-wal", out / "rp.db-wal")
    else:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        shutil.copyfile(db, out / "rp.db")
        (out / "rp.db-wal").write_bytes(b"")
    c.close()


def _checkpointed(src: Path, d: Path, how: str) -> Path:
    """The same content as one plain file: what the output must match."""
    work = d / f"plain-{how}"
    work.mkdir()
    _in_wal(src, work, how)
    c = sqlite3.connect(work / "rp.db")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.execute("PRAGMA journal_mode=DELETE")
    c.close()
    return work / "rp.db"


@pytest.mark.parametrize("how", ["frames", "empty"])
def test_a_wal_mode_profile_on_a_read_only_mount_is_read_whole_creating_nothing(
    tmp_path: Path, how: str
) -> None:
    src = _rocpd_profile(tmp_path)
    (tmp_path / "good.probe.db").write_bytes(RECORDING_DB.read_bytes())
    plain = _checkpointed(src, tmp_path, how)
    want = probe("merge", "good.probe.db", str(plain), "--allow-unaligned", "--json", cwd=tmp_path)
    assert want.returncode == 0, want.stderr
    with tmpfs(tmp_path / "ro", "64m") as mnt:
        _in_wal(src, mnt, how)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        before = sorted(os.listdir(mnt))
        argv = ["merge", "good.probe.db", str(mnt / "rp.db"), "--allow-unaligned"]
        got = probe(*argv, "--json", cwd=tmp_path)
        assert got.returncode == 0, got.stderr
        assert sorted(os.listdir(mnt)) == before  # no -shm, nothing else
        assert got.stdout.replace(os.fsencode(mnt), os.fsencode(plain.parent)) == want.stdout
        r = probe(*argv, "--report", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert sorted(os.listdir(mnt)) == before
    if how == "frames":  # the -wal's content is read: half the regions are gone
        whole = probe(
            "merge", "good.probe.db", str(src), "--allow-unaligned", "--json", cwd=tmp_path
        )
        assert whole.stdout != want.stdout


def test_a_wal_mode_profile_in_a_writable_folder_is_left_as_it_was(tmp_path: Path) -> None:
    src = _rocpd_profile(tmp_path)
    (tmp_path / "good.probe.db").write_bytes(RECORDING_DB.read_bytes())
    there = tmp_path / "there"
    there.mkdir()
    _in_wal(src, there, "frames")
    before = {n: (there / n).read_bytes() for n in os.listdir(there)}
    argv = ["merge", "good.probe.db", str(there / "rp.db"), "--allow-unaligned", "--report"]
    r = probe(*argv, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert {n: (there / n).read_bytes() for n in os.listdir(there)} == before


# -- several outputs of one command on a disk that fills -------------------------------------


@pytest.mark.parametrize(
    "outputs",
    [
        ["--prometheus-textfile", "full/ok.prom", "--perfetto", "full/big.pftrace"],
        ["--openmetrics", "full/big.om", "--prometheus-textfile", "full/ok.prom"],
        ["--prometheus-textfile", "room/ok.prom", "--perfetto", "full/big.pftrace"],
    ],
    ids=["textfile then perfetto", "openmetrics then textfile", "two file systems"],
)
def test_outputs_of_one_export_on_a_full_disk_are_all_or_none(
    tmp_path: Path, outputs: list[str]
) -> None:
    (tmp_path / "room").mkdir()
    with tmpfs(tmp_path / "full", "256k") as full:
        r = probe("export", str(RECORDING), *outputs, cwd=tmp_path)
        assert r.returncode == 1
        one_error(r, "No space left on device", "nothing written")
        assert os.listdir(full) == []
        assert os.listdir(tmp_path / "room") == []


def test_outputs_of_one_merge_on_a_full_disk_are_all_or_none(tmp_path: Path) -> None:
    (tmp_path / "room").mkdir()
    with tmpfs(tmp_path / "full", "256k") as full:
        r = probe(
            "merge", str(RECORDING), str(KINETO), "--allow-unaligned",
            "--out", "room/m.pftrace", "--rocpd", "full/m.db", cwd=tmp_path,
        )  # fmt: skip
        assert r.returncode == 1
        one_error(r, "full/m.db")
        assert os.listdir(full) == []
        assert os.listdir(tmp_path / "room") == []


def test_outputs_of_one_export_are_all_written_where_there_is_room(tmp_path: Path) -> None:
    r = probe(
        "export", str(RECORDING), "--prometheus-textfile", "ok.prom", "--perfetto", "t.pftrace",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["ok.prom", "t.pftrace"]
    said = r.stderr.decode().splitlines()
    assert any("ok.prom" in s for s in said) and any("t.pftrace" in s for s in said)


# -- run directories -------------------------------------------------------------------------


def test_a_relative_probe_run_dir_is_refused_in_one_line(tmp_path: Path) -> None:
    r = probe(
        "record", "--out", "r.db", "--", "/bin/true", cwd=tmp_path, env={"PROBE_RUN_DIR": "text"}
    )
    assert r.returncode == 2
    one_error(r, "PROBE_RUN_DIR", "absolute")
    assert os.listdir(tmp_path) == []  # no folder "text", no recording


def test_collect_over_junk_rings_names_them_and_ends(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "ring-111.shm").write_bytes(os.urandom(4096))
    (run / "ring-222.shm").write_bytes(b"")
    (run / "ring-333.shm").write_bytes(b"not a ring\n")
    r = probe("collect", "--run-dir", str(run), "--out", "c.db", cwd=tmp_path)  # ends: no timeout
    assert r.returncode == 1
    one_error(r, "no readable ring", "ring-111.shm", "ring-222.shm", "ring-333.shm")
    assert sorted(os.listdir(tmp_path)) == ["run"]  # no empty recording


def test_record_of_a_file_that_is_not_a_program_says_only_its_error(tmp_path: Path) -> None:
    (tmp_path / "r.db").write_bytes(b"old")
    r = probe("record", "--force", "--out", "r.db", "--", "/etc/hostname", cwd=tmp_path)
    assert r.returncode == 1
    one_error(r, "cannot start /etc/hostname")
