"""What a hostile user tries, per class: the one guarded write path (every flag and
exporter), signals, closed and broken standard streams, a full disk under the SQLite
writers, escape sequences meant for a terminal.

Each test runs the ``probe`` command as a user does (a process of its own, from this
tree) and asserts its exit status, its one ``probe: error:`` line and what it left on disk.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "probe/data/default.probe.db"
H200 = ROOT / "benchmarks/results/h200-2026-11-30"
WINDOW = H200 / "groundtruth-window.probe.db"
KINETO = H200 / "run3-groundtruth.kineto.trimmed.json.gz"


def probe(
    *argv: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    shell_redirect: str = "",
    preexec: object = None,
) -> subprocess.CompletedProcess[bytes]:
    """``python -m probe ARGV`` from this tree; ``shell_redirect`` is appended to a shell
    line (``>&-``), so the streams are what a shell hands over."""
    e = {**os.environ, "PYTHONPATH": str(ROOT), "PROBE_PROGRESS": "0", **(env or {})}
    if shell_redirect:
        line = " ".join(_q(a) for a in (sys.executable, "-m", "probe", *argv))
        return subprocess.run(
            ["/bin/sh", "-c", f"{line} {shell_redirect}"],
            cwd=cwd,
            env=e,
            capture_output=True,
            timeout=120,
        )
    return subprocess.run(
        [sys.executable, "-m", "probe", *argv],
        cwd=cwd,
        env=e,
        capture_output=True,
        timeout=120,
        preexec_fn=preexec,  # type: ignore[arg-type]
    )


def _q(a: str) -> str:
    return "'" + a.replace("'", "'\\''") + "'"


def one_error(r: subprocess.CompletedProcess[bytes], *mentions: str) -> str:
    err = r.stderr.decode("utf-8", "replace")
    assert b"Traceback" not in r.stderr, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("probe: error:"), err
    for m in mentions:
        assert m in lines[0], err
    return lines[0]


def leftovers(d: Path, *keep: str) -> list[str]:
    return sorted(n for n in os.listdir(d) if n not in keep)


# -- one write path: --to NAME --out TARGET like the named flags --------------------------

FILE_EXPORTERS = ["openmetrics", "perfetto", "prometheus", "rocpd"]


@pytest.mark.parametrize("name", FILE_EXPORTERS)
def test_to_out_does_not_overwrite_without_force(tmp_path: Path, name: str) -> None:
    target = tmp_path / "out.file"
    target.write_bytes(b"keep me")
    r = probe("export", "--to", name, "--out", str(target))
    assert r.returncode == 2
    one_error(r, "--out", "exists", "--force")
    assert target.read_bytes() == b"keep me"
    assert leftovers(tmp_path, "out.file") == []


def test_to_out_with_force_replaces(tmp_path: Path) -> None:
    target = tmp_path / "out.om"
    target.write_bytes(b"old")
    r = probe("export", "--to", "openmetrics", "--out", str(target), "--force")
    assert r.returncode == 0, r.stderr
    assert target.read_bytes().startswith(b"# ")
    assert leftovers(tmp_path, "out.om") == []


@pytest.mark.parametrize("name", FILE_EXPORTERS)
def test_to_out_refuses_a_planted_symlink(tmp_path: Path, name: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"victim")
    (tmp_path / "out").symlink_to(victim)
    r = probe("export", "--to", name, "--out", str(tmp_path / "out"), "--force")
    assert r.returncode == 2
    one_error(r, "symbolic link")
    assert victim.read_bytes() == b"victim" and (tmp_path / "out").is_symlink()
    assert leftovers(tmp_path, "out", "victim") == []


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
@pytest.mark.parametrize("name", ["openmetrics", "perfetto"])
def test_to_out_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str, name: str) -> None:
    if kind == "fifo":
        target = tmp_path / "fifo"
        os.mkfifo(target)
    elif kind == "directory":
        target = tmp_path / "dir"
        target.mkdir()
    else:  # a node of its own (never /dev/null: a write path that replaced it, as root,
        # would take the system's null device away)
        target = tmp_path / "null"
        try:
            os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root")
    r = probe("export", "--to", name, "--out", str(target), "--force")
    assert r.returncode == 2
    one_error(r, str(target))
    assert leftovers(tmp_path, target.name) == []
    if kind == "directory":
        assert os.listdir(target) == []


def test_to_out_dash_is_stdout(tmp_path: Path) -> None:
    r = probe("export", "--to", "openmetrics", "--out", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(b"# ") and r.stdout.rstrip().endswith(b"# EOF")
    assert leftovers(tmp_path) == []  # no file called "-"


def test_to_rocpd_out_dash_is_refused(tmp_path: Path) -> None:
    r = probe("export", "--to", "rocpd", "--out", "-", cwd=tmp_path)
    assert r.returncode == 2
    one_error(r, "database")
    assert r.stdout == b"" and leftovers(tmp_path) == []


@pytest.mark.parametrize("flag", ["--openmetrics", "--rocpd", "--perfetto"])
def test_a_legal_248_byte_name_is_written(tmp_path: Path, flag: str) -> None:
    name = "n" * 245 + ".db"
    assert len(name) == 248
    r = probe("export", flag, name, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert leftovers(tmp_path) == [name]


def test_a_name_past_255_bytes_is_one_usage_error(tmp_path: Path) -> None:
    r = probe("export", "--openmetrics", "n" * 256, cwd=tmp_path)
    assert r.returncode == 2
    one_error(r, "too long")


def _start_export(target: Path, *extra: str) -> subprocess.Popen[bytes]:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "PROBE_PROGRESS": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "probe", "export", *extra, str(target)],
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_two_exports_to_one_target_one_wins_the_other_fails(tmp_path: Path) -> None:
    target = tmp_path / "out.pftrace"
    procs = [_start_export(target, "--perfetto") for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs if p.stderr]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 1], results
    loser = next(err for rc, err in results if rc == 1).decode()
    assert "another writer" in loser and "Traceback" not in loser
    assert leftovers(tmp_path, "out.pftrace") == []


def test_two_forced_exports_to_one_existing_target_one_fails(tmp_path: Path) -> None:
    target = tmp_path / "out.pftrace"
    target.write_bytes(b"old")
    procs = [_start_export(target, "--force", "--perfetto") for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs if p.stderr]
    assert sorted(rc for rc, _ in results) == [0, 1], results
    assert target.read_bytes() != b"old"
    assert leftovers(tmp_path, "out.pftrace") == []


# -- signals --------------------------------------------------------------------------------


def _signal_mid_write(tmp_path: Path, sig: int, argv: Sequence[str]) -> int:
    """Start ``argv`` writing into ``tmp_path``; once its temporary exists, stop it, send
    ``sig``, let it go on; returns its exit status. The stop makes the moment certain."""
    e = {**os.environ, "PYTHONPATH": str(ROOT), "PROBE_PROGRESS": "0"}
    p = subprocess.Popen(
        [sys.executable, "-m", "probe", *argv],
        cwd=tmp_path,
        env=e,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(60_000):  # behaviour, not time: until the temporary shows
            if any(n.startswith(".") for n in os.listdir(tmp_path)) or p.poll() is not None:
                break
            time.sleep(0.002)
        assert p.poll() is None, "the command ended before its temporary was seen"
        p.send_signal(signal.SIGSTOP)
        p.send_signal(sig)
        p.send_signal(signal.SIGCONT)
        rc = p.wait(timeout=120)
        err = p.stderr.read() if p.stderr else b""
        assert b"Traceback" not in err, err
        return rc
    finally:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
        p.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
@pytest.mark.parametrize("flag", ["--perfetto", "--rocpd", "--openmetrics"])
def test_a_signal_mid_export_leaves_nothing(tmp_path: Path, sig: int, flag: str) -> None:
    rc = _signal_mid_write(tmp_path, sig, ["export", str(RECORDING), flag, "out"])
    assert rc == 128 + sig
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_mid_merge_leaves_nothing(tmp_path: Path, sig: int) -> None:
    argv = ["merge", str(WINDOW), str(KINETO), "--out", "m.pftrace", "--rocpd", "m.db"]
    rc = _signal_mid_write(tmp_path, sig, argv)
    assert rc == 128 + sig
    assert leftovers(tmp_path) == []


# -- a full disk under the SQLite writers ----------------------------------------------------


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path, size: str = "192k") -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _file_size_limit(limit: int) -> object:
    def set_limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it is EFBIG, not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return set_limit


SQLITE_WRITERS = {
    "export --rocpd": ["export", str(RECORDING), "--rocpd", "out.db"],
    "export --to rocpd": ["export", str(RECORDING), "--to", "rocpd", "--out", "out.db"],
    "merge --rocpd": ["merge", str(WINDOW), str(KINETO), "--rocpd", "out.db"],
}


@pytest.mark.parametrize("which", list(SQLITE_WRITERS))
def test_sqlite_writer_on_a_full_tmpfs_is_one_line(tmp_path: Path, which: str) -> None:
    with small_tmpfs(tmp_path) as mnt:
        r = probe(*SQLITE_WRITERS[which], cwd=mnt)
        assert r.returncode == 1
        one_error(r, "out.db", "full")
        assert leftovers(mnt) == []


@pytest.mark.parametrize("which", list(SQLITE_WRITERS))
def test_sqlite_writer_past_the_file_size_limit_is_one_line(tmp_path: Path, which: str) -> None:
    r = probe(*SQLITE_WRITERS[which], cwd=tmp_path, preexec=_file_size_limit(64 * 1024))
    assert r.returncode == 1
    one_error(r, "out.db")
    assert leftovers(tmp_path) == []


def test_sqlite_writer_on_a_read_only_mount_is_one_line(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path) as mnt:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        r = probe("export", str(RECORDING), "--rocpd", "out.db", cwd=mnt)
        assert r.returncode == 2
        one_error(r, "read-only")


# -- standard streams -------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["report"], ["doctor"], ["export", "--to", "list"], ["env"]])
def test_closed_stdout_is_one_error_line(argv: list[str]) -> None:
    r = probe(*argv, shell_redirect=">&-")
    assert r.returncode == 1
    one_error(r, "standard output")


def test_closed_stderr_keeps_the_data_stream_clean(tmp_path: Path) -> None:
    out = tmp_path / "out.om"
    r = probe("export", "--openmetrics", "-", shell_redirect=f"2>&- >{_q(str(out))}")
    assert r.returncode == 0
    data = out.read_bytes()
    assert data.startswith(b"# ") and data.rstrip().endswith(b"# EOF")
    assert b"probe:" not in data


def test_closed_stderr_on_an_error_still_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    r = probe("report", "/nonexistent.db", shell_redirect=f"2>&- >{_q(str(out))}")
    assert r.returncode == 2
    assert out.read_bytes() == b""


@pytest.mark.parametrize(
    "argv",
    [["report"], ["export", "--openmetrics", "-"], ["export", "--to", "prometheus", "--out", "-"]],
)
def test_a_reader_that_leaves_early_is_quiet(argv: list[str]) -> None:
    line = " ".join(_q(a) for a in (sys.executable, "-m", "probe", *argv))
    e = {**os.environ, "PYTHONPATH": str(ROOT), "PROBE_PROGRESS": "0"}
    r = subprocess.run(
        ["bash", "-c", f"{line} | head -c 1 >/dev/null; exit ${{PIPESTATUS[0]}}"],
        env=e,
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 128 + signal.SIGPIPE, r.stderr
    assert r.stderr == b""


def test_a_file_name_not_utf8_under_strict_utf8_stdout(tmp_path: Path) -> None:
    name = os.fsdecode(b"\xff\xfe.probe.db")
    (tmp_path / name).write_bytes(RECORDING.read_bytes())
    r = probe("report", name, cwd=tmp_path, env={"PYTHONIOENCODING": "utf-8:strict"})
    assert r.returncode == 0, r.stderr
    assert b"Traceback" not in r.stderr
    assert b"\\xff\\xfe.probe.db" in r.stdout


# -- the terminal --------------------------------------------------------------------------------

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m"


def _hostile_recording(tmp_path: Path) -> Path:
    import json

    rec = tmp_path / "hostile.probe.db"
    rec.write_bytes(RECORDING.read_bytes())
    with contextlib.closing(sqlite3.connect(rec)) as c, c:
        c.execute(
            "UPDATE meta SET value = ? WHERE key = 'command'", (json.dumps(["vllm", ESCAPES]),)
        )
        c.execute("UPDATE processes SET model = ?", ("DeepSeek" + ESCAPES,))
        for pid, snap in c.execute("SELECT pid, snapshot FROM processes").fetchall():
            if not snap:
                continue
            s = json.loads(snap)
            s["model"] = "DeepSeek" + ESCAPES
            c.execute("UPDATE processes SET snapshot = ? WHERE pid = ?", (json.dumps(s), pid))
    return rec


@pytest.mark.parametrize("argv", [["report"], ["doctor"]])
def test_escape_sequences_from_a_recording_never_reach_the_terminal(
    tmp_path: Path, argv: list[str]
) -> None:
    rec = _hostile_recording(tmp_path)
    r = probe(*argv, str(rec), "--width", "200") if argv == ["report"] else probe(*argv, str(rec))
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert "\\x1b]0;owned" in out  # shown, escaped


def test_sanitize_keeps_text_and_escapes_controls() -> None:
    from probe.terminal import sanitize

    assert sanitize("a\tb\nc ü 中") == "a\tb\nc ü 中"
    assert sanitize("\x1b[31m\x07\x00\x7f\x9b") == "\\x1b[31m\\x07\\x00\\x7f\\x9b"
    assert sanitize(os.fsdecode(b"\xff")) == "\\xff"
