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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from extras import needs
from recordings import sqlite_of

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "probe/data/default.probe"
RECORDING_DB = sqlite_of(RECORDING)  # as SQLite, for the cases that change its bytes or rows
H200 = ROOT / "tests/data"
WINDOW = H200 / "groundtruth-window.probe"
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
PERFETTO = pytest.param("--perfetto", marks=needs("perfetto"))  # the --perfetto case of a flag


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


@pytest.mark.parametrize("flag", ["--openmetrics", "--rocpd", PERFETTO])
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


def _second_writer_while_the_first_writes(
    target: Path, *extra: str
) -> tuple[tuple[int, bytes], tuple[int, bytes]]:
    """The first export holds its temporary (stopped there), the second runs to its end,
    then the first goes on: the overlap is certain, not a matter of timing."""
    first = _start_export(target, *extra)
    try:
        for _ in range(60_000):  # behaviour, not time: until the temporary shows
            if (
                any(n.startswith(".") for n in os.listdir(target.parent))
                or first.poll() is not None
            ):
                break
            time.sleep(0.002)
        assert first.poll() is None, "the first export ended before its temporary was seen"
        first.send_signal(signal.SIGSTOP)
        second = _start_export(target, *extra)
        out2 = second.communicate(timeout=120)[1]
        first.send_signal(signal.SIGCONT)
        out1 = first.communicate(timeout=120)[1]
        return (first.returncode, out1), (second.returncode, out2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            first.send_signal(signal.SIGCONT)
            first.kill()
        first.wait()


@needs("perfetto")
def test_two_exports_to_one_target_one_wins_the_other_fails(tmp_path: Path) -> None:
    target = tmp_path / "out.pftrace"
    (rc1, err1), (rc2, err2) = _second_writer_while_the_first_writes(target, "--perfetto")
    # the second finished first and stands; the first finds it there and replaces nothing
    assert (rc1, rc2) == (1, 0), (err1, err2)
    assert b"another writer" in err1 and b"Traceback" not in err1
    assert leftovers(tmp_path, "out.pftrace") == []


@needs("perfetto")
def test_two_forced_exports_to_one_existing_target_one_fails(tmp_path: Path) -> None:
    target = tmp_path / "out.pftrace"
    target.write_bytes(b"old")
    (rc1, err1), (rc2, err2) = _second_writer_while_the_first_writes(
        target, "--force", "--perfetto"
    )
    assert (rc1, rc2) == (1, 0), (err1, err2)
    assert b"another writer" in err1 and b"Traceback" not in err1
    assert target.read_bytes() != b"old"
    assert leftovers(tmp_path, "out.pftrace") == []


# -- signals --------------------------------------------------------------------------------


def _dispositions(ignore_hup: bool) -> Callable[[], None]:
    """The child's signal dispositions as a terminal's foreground command has them, set
    explicitly: a runner started under ``nohup`` (SIGHUP ignored) or as a background job of
    a shell without job control (SIGINT ignored) passes its ignored signals on, and the
    probe rightly keeps a signal its caller ignores."""

    def set_them() -> None:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        if ignore_hup:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)

    return set_them


def _signal_mid_write(
    tmp_path: Path, sig: int, argv: Sequence[str], *, ignore_hup: bool = False
) -> int:
    """Start ``argv`` writing into ``tmp_path``; once its temporary exists, stop it, send
    ``sig``, let it go on; returns its exit status. The stop makes the moment certain."""
    e = {**os.environ, "PYTHONPATH": str(ROOT), "PROBE_PROGRESS": "0"}
    p = subprocess.Popen(
        [sys.executable, "-m", "probe", *argv],
        cwd=tmp_path,
        env=e,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_dispositions(ignore_hup),
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
@pytest.mark.parametrize("flag", [PERFETTO, "--rocpd", "--openmetrics"])
def test_a_signal_mid_export_leaves_nothing(tmp_path: Path, sig: int, flag: str) -> None:
    rc = _signal_mid_write(tmp_path, sig, ["export", str(RECORDING), flag, "out"])
    assert rc == 128 + sig
    assert leftovers(tmp_path) == []


def test_under_nohup_a_sighup_mid_export_changes_nothing(tmp_path: Path) -> None:
    """A signal the caller ignores stays ignored: under ``nohup`` the export goes on to
    its end and its file is whole."""
    argv = ["export", str(RECORDING), "--openmetrics", "out"]
    assert _signal_mid_write(tmp_path, signal.SIGHUP, argv, ignore_hup=True) == 0
    assert leftovers(tmp_path, "out") == []
    assert (tmp_path / "out").read_text().endswith("# EOF\n")


@needs("perfetto")
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
    [
        ["report"],
        ["export", "--openmetrics", "-"],
        pytest.param(["export", "--to", "prometheus", "--out", "-"], marks=needs("prometheus")),
    ],
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
    (tmp_path / name).write_bytes(RECORDING_DB.read_bytes())
    r = probe("report", name, cwd=tmp_path, env={"PYTHONIOENCODING": "utf-8:strict"})
    assert r.returncode == 0, r.stderr
    assert b"Traceback" not in r.stderr
    assert b"\\xff\\xfe.probe.db" in r.stdout


# -- the terminal --------------------------------------------------------------------------------

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m"


def _hostile_recording(tmp_path: Path) -> Path:
    import json

    rec = tmp_path / "hostile.probe.db"
    rec.write_bytes(RECORDING_DB.read_bytes())
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
    from probe.cli.terminal import sanitize

    assert sanitize("a\tb\nc ü 中") == "a\tb\nc ü 中"
    assert sanitize("\x1b[31m\x07\x00\x7f\x9b") == "\\x1b[31m\\x07\\x00\\x7f\\x9b"
    assert sanitize(os.fsdecode(b"\xff")) == "\\xff"


# -- the control protocol ---------------------------------------------------------------------


@contextlib.contextmanager
def answering(run_dir: Path, reply: bytes) -> Iterator[Path]:
    """A process (this one) answering ``reply`` to anything on a control socket."""
    import socket
    import threading

    path = run_dir / f"ctl-{os.getpid()}.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(8)
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield path
    finally:
        stop.set()
        t.join()
        srv.close()


HOSTILE_REPLIES = {
    "nested": b"[" * 200_000 + b"]" * 200_000 + b"\n",
    "nested-object": b'{"ok": true, "a": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001 + b"\n",
    "duplicate-key": b'{"ok": false, "ok": true, "pid": 1}\n',
    "huge": b'{"ok": true, "pad": "' + b"x" * (4 << 20) + b'"}\n',
}


@pytest.mark.parametrize("kind", list(HOSTILE_REPLIES))
@pytest.mark.parametrize("cmd", [["ps"], ["doctor", "--pid"], ["attach", "--pid"]])
def test_a_hostile_control_reply_is_one_line(run_dir: Path, kind: str, cmd: list[str]) -> None:
    with answering(run_dir, HOSTILE_REPLIES[kind]):
        argv = [*cmd, str(os.getpid())] if cmd[-1] == "--pid" else cmd
        if cmd[0] == "attach":
            argv += ["--duration", "1", "--no-live"]
        r = probe(*argv, "--run-dir", str(run_dir))
    assert b"Traceback" not in r.stderr and b"RecursionError" not in r.stderr, r.stderr[-2000:]
    assert r.returncode in (0, 1, 2)
    if cmd == ["ps"]:  # listed with its error, never as answered
        assert b"error" in r.stdout


def test_parse_message_bounds_depth_and_refuses_duplicate_keys() -> None:
    from probe.reader.control import parse_message

    assert parse_message(b'{"cmd": "status", "s": "[[[[{{{{"}') == {
        "cmd": "status",
        "s": "[[[[{{{{",
    }
    with pytest.raises(ValueError, match="deeper"):
        parse_message(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ValueError, match="twice"):
        parse_message(b'{"cmd": "status", "cmd": "enable"}')


def test_the_server_obeys_no_duplicated_key() -> None:
    from probe.engine.control_server import ControlServer

    srv = ControlServer.__new__(ControlServer)
    srv.requests = 0
    reply = srv.handle_line(b'{"cmd": "status", "cmd": "enable"}', peer_pid=os.getpid())
    assert reply["ok"] is False and "twice" in reply["error"]


def test_ps_deletes_nothing_it_did_not_create(run_dir: Path) -> None:
    dead = 2**22 + 12345  # above pid_max's default: no such process
    planted = run_dir / f"ctl-{dead}.sock"
    planted.write_bytes(b"mine")
    r = probe("ps", "--run-dir", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert planted.read_bytes() == b"mine"


# -- values the readers trust ----------------------------------------------------------------


def _with_meta(tmp_path: Path, key: str, value: str) -> Path:
    rec = tmp_path / "m.probe.db"
    rec.write_bytes(RECORDING_DB.read_bytes())
    with contextlib.closing(sqlite3.connect(rec)) as c, c:
        c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
    return rec


META_DAMAGE = {
    "unbalanced quote": ("command", '["collect, "x'),
    "date in an integer": ("started_epoch_ns", "2026-01-01"),
    "infinite integer": ("started_epoch_ns", "1e999"),
    "float sample": ("sample_every", "2.5"),
}


@pytest.mark.parametrize("damage", list(META_DAMAGE))
@pytest.mark.parametrize("cmd", ["report", "ab"])
def test_a_damaged_meta_row_is_one_line(tmp_path: Path, damage: str, cmd: str) -> None:
    key, value = META_DAMAGE[damage]
    rec = _with_meta(tmp_path, key, value)
    argv = (
        ["report", str(rec)] if cmd == "report" else ["ab", "--a", str(rec), "--b", str(RECORDING)]
    )
    r = probe(*argv)
    assert r.returncode == 2
    one_error(r, "m.probe.db", "meta", key)


@pytest.mark.parametrize(
    "where",
    [("compilation",), ("groups",), ("groups", 0), ("limiting_group",), ("traps", 0), ("hooks",)],
)
@pytest.mark.parametrize("cmd", [["doctor", "--json"], ["doctor"]])
def test_an_integer_where_the_snapshot_holds_an_object(
    tmp_path: Path, where: tuple[object, ...], cmd: list[str]
) -> None:
    import json

    rec = tmp_path / "s.probe.db"
    rec.write_bytes(RECORDING_DB.read_bytes())
    with contextlib.closing(sqlite3.connect(rec)) as c, c:
        (raw,) = c.execute("SELECT snapshot FROM processes WHERE snapshot IS NOT NULL").fetchone()
        snap = json.loads(raw)
        o = snap
        for k in where[:-1]:
            o = o[k]
        o[where[-1]] = 5
        c.execute("UPDATE processes SET snapshot = ?", (json.dumps(snap),))
    r = probe(cmd[0], str(rec), *cmd[1:])
    assert r.returncode == 2
    one_error(r, "snapshot", str(where[0]))


def test_record_of_a_command_that_cannot_start_leaves_no_recording(tmp_path: Path) -> None:
    script = tmp_path / "bad.sh"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    r = probe("record", "--out", "r.probe.db", "--", str(script), cwd=tmp_path)
    assert r.returncode == 1
    assert b"cannot start" in r.stderr and b"Traceback" not in r.stderr
    assert leftovers(tmp_path, "bad.sh") == []


@pytest.mark.parametrize("offset", ["9000000000000000000", "-9000000000000000000", "1" + "0" * 30])
def test_merge_offset_far_out_of_range_is_an_error(tmp_path: Path, offset: str) -> None:
    r = probe(
        "merge",
        str(WINDOW),
        str(KINETO),
        "--offset-ns",
        offset,
        "--report",
        "--out",
        "o.pftrace",
        cwd=tmp_path,
    )
    assert r.returncode == 2
    one_error(r, "--offset-ns")
    assert leftovers(tmp_path) == []


# -- a recording with its -wal but not its -shm ------------------------------------------------


def _doubled_in_wal(d: Path) -> Path:
    """The bundled recording in WAL mode with a second copy of its steps committed to the
    ``-wal`` and not checkpointed; returns a copy of the ``.db`` and ``-wal`` only."""
    import shutil

    src = d / "w.probe.db"
    src.write_bytes(RECORDING_DB.read_bytes())
    c = sqlite3.connect(src)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA wal_autocheckpoint=0")
    cols = [r[1] for r in c.execute("PRAGMA table_info(steps)")]
    sel = ", ".join("step + 1000000" if x == "step" else x for x in cols)
    with c:
        c.execute(f"INSERT INTO steps SELECT {sel} FROM steps")
    out = d / "copy"
    out.mkdir()
    shutil.copyfile(src, out / src.name)
    shutil.copyfile(f"{src}-wal", out / f"{src.name}-wal")
    c.close()
    return out / src.name


def test_a_wal_without_its_shm_is_read_whole(tmp_path: Path) -> None:
    from probe.reader.recording import Recording

    copy = _doubled_in_wal(tmp_path)
    before = sorted(os.listdir(copy.parent))
    base = Recording.open(RECORDING)
    n = len(list(base.iter_steps()))
    base.close()
    rec = Recording.open(copy)
    try:
        assert len(list(rec.iter_steps())) == 2 * n
    finally:
        rec.close()
    assert sorted(os.listdir(copy.parent)) == before  # nothing made beside it
    r = probe("report", str(copy), "--json")
    assert r.returncode == 0, r.stderr


def test_a_finished_recording_is_one_file(tmp_path: Path) -> None:
    from probe.reader.recording import RecordingWriter

    p = tmp_path / "r.probe.db"
    w = RecordingWriter(p)
    w.set_meta(command=["x"])
    w.commit()
    w.close()
    assert sorted(os.listdir(tmp_path)) == ["r.probe.db"]


# -- paths longer than SQLite takes ------------------------------------------------------------


def _deep(tmp_path: Path) -> Path:
    d = tmp_path / "/".join(["d" * 200] * 3)
    d.mkdir(parents=True)
    assert len(os.fsencode(d)) > 600
    return d


def test_a_recording_at_a_path_longer_than_sqlite_takes_opens(tmp_path: Path) -> None:
    d = _deep(tmp_path)
    (d / "r.probe.db").write_bytes(RECORDING_DB.read_bytes())
    r = probe("report", str(d / "r.probe.db"), "--json")
    assert r.returncode == 0, r.stderr[-500:]
    assert os.listdir(d) == ["r.probe.db"]


@pytest.mark.parametrize("flag", ["--rocpd", PERFETTO, "--openmetrics"])
def test_an_output_at_a_path_longer_than_sqlite_takes(tmp_path: Path, flag: str) -> None:
    d = _deep(tmp_path)
    r = probe("export", str(RECORDING), flag, str(d / "out"))
    assert r.returncode == 0, r.stderr[-500:]
    assert os.listdir(d) == ["out"]


# -- network exporters: the deadline on every path, exit 1 when nothing was delivered ---------


@contextlib.contextmanager
def trickling_server() -> Iterator[int]:
    """A TCP server that reads a request and answers one byte every 2 s: each read
    meets the socket's timeout, the whole answer never comes."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    stop = threading.Event()

    def answer(c: socket.socket) -> None:
        with c, contextlib.suppress(OSError):
            c.recv(1 << 20)
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n":
                if stop.wait(2.0):
                    return
                c.send(bytes([b]))

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=answer, args=(c,), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join()
        srv.close()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nobody listens once it is closed


OTLP_ARGS = {
    "http": ["--otlp-protocol", "http/protobuf"],
    "grpc": ["--otlp-protocol", "grpc"],
}


@needs("otlp")
@pytest.mark.parametrize("how", ["--otlp", "--to"])
@pytest.mark.parametrize("proto", list(OTLP_ARGS))
def test_otlp_to_a_closed_port_exits_1(how: str, proto: str) -> None:
    url = f"127.0.0.1:{_closed_port()}"
    url = f"http://{url}" if proto == "http" else url
    target = ["--otlp", url] if how == "--otlp" else ["--to", "otlp", "--out", url]
    r = probe("export", *target, *OTLP_ARGS[proto], "--timeout", "2")
    assert r.returncode == 1
    one_error(r, "nothing exported")


@needs("otlp")
@pytest.mark.parametrize("how", ["--otlp", "--to"])
@pytest.mark.parametrize("proto", list(OTLP_ARGS))
def test_otlp_to_a_trickling_server_ends_and_exits_1(how: str, proto: str) -> None:
    """The command ends (probe() gives it 120 s: a hang guard, not a measurement; the
    server would take minutes to answer one request) and says nothing was delivered."""
    with trickling_server() as port:
        url = f"http://127.0.0.1:{port}" if proto == "http" else f"127.0.0.1:{port}"
        target = ["--otlp", url] if how == "--otlp" else ["--to", "otlp", "--out", url]
        r = probe("export", *target, *OTLP_ARGS[proto], "--timeout", "2")
    assert r.returncode == 1
    one_error(r, "0 exported")


def test_deadline_gives_up_on_a_call_that_does_not_return() -> None:
    import threading

    from exporters.otlp import Deadline

    release = threading.Event()
    d = Deadline(0.05)
    assert d.call(lambda: 7) == (True, 7)
    assert d.call(release.wait) == (False, None)
    assert d.gone
    assert d.call(lambda: 7) == (False, None)  # nothing more is sent
    release.set()


def test_new_growing_file_is_checked_and_fresh(tmp_path: Path) -> None:
    from probe.errors import UsageError
    from probe.reader.output import new_growing_file

    seg = tmp_path / "roll-0001.probe.db"
    assert new_growing_file(seg, force=False, flag="--record") == seg
    assert seg.stat().st_size == 0
    with pytest.raises(UsageError, match="exists"):
        new_growing_file(seg, force=False, flag="--record")
    (tmp_path / "link").symlink_to(seg)
    with pytest.raises(UsageError, match="symbolic link"):
        new_growing_file(tmp_path / "link", force=True, flag="--record")
    with pytest.raises(UsageError, match="grows"):
        new_growing_file("-", force=True, flag="--record")
    Path(f"{seg}-wal").write_bytes(b"old")
    new_growing_file(seg, force=True, flag="--record")
    assert sorted(os.listdir(tmp_path)) == ["link", "roll-0001.probe.db"]
