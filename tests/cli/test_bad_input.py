"""Every bad input a clear error, every failed write handled, nothing lost.

One test (or a parametrized set) per class of the issue, each run the way a user meets
it: the ``probe`` command in a subprocess, real files, FIFOs, a real tmpfs where a full
or read-only file system is the case. ``PROBE_CODE_ROOT`` runs the same tests against
another checkout (how each was seen to fail on the code before the fix).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from extras import needs
from recordings import sqlite_of

ROOT = Path(os.environ.get("PROBE_CODE_ROOT") or Path(__file__).resolve().parents[2])
# the bundled recording as SQLite: the damage done here (bytes, rows, WAL) is SQLite's
BUNDLED = sqlite_of(ROOT / "probe" / "data" / "default.probe")


def probe(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def one_error(r: subprocess.CompletedProcess[str], status: int) -> str:
    """The run ended with ``status`` and exactly one ``probe: error:`` line, no traceback."""
    assert r.returncode == status, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("probe: error: ")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def listing(d: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``d``: (mode, size, mtime_ns), to see that nothing changed."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = os.lstat(p)
        out[str(p.relative_to(d))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def report_steps(path: Path) -> int:
    """The forward steps ``probe report`` counts in ``path`` (it must succeed)."""
    r = probe("report", "--json", str(path))
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["hit_rates_all"]["steps"])


def forward_steps_among_first(n: int) -> int:
    from probe.analysis import views as analysis
    from probe.reader.recording import Recording

    rec = Recording.open(BUNDLED)
    try:
        return len(analysis.forward_steps(itertools.islice(rec.iter_steps(), n)))
    finally:
        rec.close()


def small_recording(path: Path, steps: int, *, close: bool = True) -> None:
    """A real recording of the bundled one's first ``steps`` steps."""
    code = f"""
import sys
from probe.reader.recording import Recording, RecordingWriter
src = Recording.open({str(BUNDLED)!r})
w = RecordingWriter({str(path)!r})
for p in src.processes():
    w.db.execute("INSERT INTO processes (pid) VALUES (?)", (p["pid"],))
w.add_steps(s for i, s in zip(range({steps}), src.iter_steps()))
w.commit()
if {close!r}:
    w.close()
else:
    print("committed", flush=True)
    sys.stdin.read()
"""
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )


@pytest.fixture
def tmpfs() -> Iterator[callable]:  # type: ignore[valid-type]
    """Mount small tmpfs file systems (full, read-only); skipped where mount is refused."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        d = Path(tempfile.mkdtemp(prefix="probe-tmpfs-"))
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], capture_output=True
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


# -- the recording path goes into the SQLite URI ------------------------------------------


@pytest.mark.parametrize("name", ["run#1.probe.db", "a?mode=rwc.probe.db", "x%41.probe.db"])
def test_a_recording_named_with_uri_characters_is_that_file(tmp_path: Path, name: str) -> None:
    # the decoys: what an unquoted file:{p}?mode=ro URI would open instead
    small_recording(tmp_path / "run", 3)
    small_recording(tmp_path / "a", 3)
    small_recording(tmp_path / "xA.probe.db", 3)
    shutil.copy(BUNDLED, tmp_path / name)
    before = listing(tmp_path)
    assert report_steps(tmp_path / name) == report_steps(BUNDLED) > 3
    assert listing(tmp_path) == before  # nothing created, nothing changed


# -- inputs that are not files --------------------------------------------------------------


@pytest.mark.parametrize("cmd", [["report"], ["doctor"], ["export", "--perfetto", "OUT"]])
def test_a_fifo_given_as_a_recording_is_refused_at_once(tmp_path: Path, cmd: list[str]) -> None:
    fifo = tmp_path / "rec.probe.db"
    os.mkfifo(fifo)
    argv = [a.replace("OUT", str(tmp_path / "out.pftrace")) for a in cmd]
    r = probe(*argv, str(fifo), timeout=10)  # a FIFO that blocked would time out here
    assert "not a regular file" in one_error(r, 2)
    assert not (tmp_path / "out.pftrace").exists()


def test_a_device_given_as_a_recording_is_refused(tmp_path: Path) -> None:
    assert "not a regular file" in one_error(probe("report", "/dev/zero", timeout=10), 2)


# -- a recording left by a killed reader is self-contained -----------------------------------


def _killed_writer(path: Path, steps: int) -> None:
    """A writer that committed ``steps`` steps and was SIGKILLed before closing."""
    code = f"""
import os, signal
from probe.reader.recording import Recording, RecordingWriter
src = Recording.open({str(BUNDLED)!r})
w = RecordingWriter({str(path)!r})
for p in src.processes():
    w.db.execute("INSERT INTO processes (pid) VALUES (?)", (p["pid"],))
w.add_steps(s for i, s in zip(range({steps}), src.iter_steps()))
w.commit()
os.kill(os.getpid(), signal.SIGKILL)
"""
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == -signal.SIGKILL


def test_a_killed_readers_db_alone_is_readable_and_nothing_is_created(tmp_path: Path) -> None:
    left = tmp_path / "left"
    left.mkdir()
    _killed_writer(left / "k.probe.db", 200)
    assert (left / "k.probe.db-wal").exists()  # the writer died in WAL mode
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(left / "k.probe.db", copy / "k.probe.db")  # the .db alone
    before = listing(copy)
    assert report_steps(copy / "k.probe.db") == forward_steps_among_first(200) > 0
    assert listing(copy) == before  # no -wal/-shm created beside it


def test_a_killed_readers_db_on_a_read_only_mount(tmp_path: Path, tmpfs: callable) -> None:  # type: ignore[valid-type]
    d = tmpfs("size=16m")
    _killed_writer(d / "k.probe.db", 50)
    (d / "k.probe.db-wal").unlink()
    (d / "k.probe.db-shm").unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
    assert report_steps(d / "k.probe.db") == forward_steps_among_first(50) > 0


# -- the output side ---------------------------------------------------------------------------


def test_export_onto_a_fifo_refuses_and_leaves_it(tmp_path: Path) -> None:
    fifo = tmp_path / "metrics.prom"
    os.mkfifo(fifo)
    r = probe("export", "--prometheus-textfile", str(fifo), "--force", timeout=20)
    assert "not a regular file" in one_error(r, 2)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_record_force_onto_a_fifo_refuses_and_leaves_it(tmp_path: Path) -> None:
    fifo = tmp_path / "run.probe.db"
    os.mkfifo(fifo)
    r = probe("record", "--force", "--out", str(fifo), "--", "true", timeout=20)
    assert "not a regular file" in one_error(r, 2)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_export_onto_a_planted_link_refuses_and_the_victim_is_unchanged(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    link = tmp_path / "shared.prom"
    link.symlink_to(victim)
    r = probe("export", "--prometheus-textfile", str(link), "--force")
    assert "symbolic link" in one_error(r, 2)
    assert victim.read_text() == "mine\n" and link.is_symlink()


def test_collect_does_not_overwrite_without_force(tmp_path: Path) -> None:
    out = tmp_path / "old.probe.db"
    out.write_bytes(b"precious")
    (tmp_path / "rings").mkdir()
    r = probe("collect", "--run-dir", str(tmp_path / "rings"), "--out", str(out))
    assert "use --force" in one_error(r, 2)
    assert out.read_bytes() == b"precious"


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--perfetto", "{d}/missing/x.pftrace"],
        ["export", "--perfetto", "{d}"],
        ["merge", "BUNDLED", "PROFILE", "--out", "{d}/missing/x.pftrace"],
    ],
)
def test_an_output_in_a_missing_folder_or_a_directory_is_one_line(
    tmp_path: Path, argv: list[str]
) -> None:
    from tests.profiles_data import profile_path

    csv_dir = profile_path("rocprofv3-csv", "rocprofiler-sdk-2024-10")
    argv = [
        a.replace("{d}", str(tmp_path))
        .replace("BUNDLED", str(BUNDLED))
        .replace("PROFILE", str(csv_dir))
        for a in argv
    ]
    before = listing(tmp_path)
    r = probe(*argv)
    one_error(r, 2)
    assert listing(tmp_path) == before


@needs("perfetto")
def test_export_on_a_full_file_system_leaves_nothing(tmpfs: callable) -> None:  # type: ignore[valid-type]
    d = tmpfs("size=64k")
    r = probe("export", "--perfetto", str(d / "x.pftrace"))
    assert "No space left on device" in one_error(r, 1)
    assert list(d.iterdir()) == []


def test_export_on_a_read_only_file_system_is_one_line(tmpfs: callable) -> None:  # type: ignore[valid-type]
    d = tmpfs("ro,size=64k")
    r = probe("export", "--prometheus-textfile", str(d / "x.prom"))
    assert "read-only" in one_error(r, 2)


@pytest.mark.parametrize("cmd", [["report"], ["doctor"], ["env"], ["report", "--json"]])
def test_stdout_on_dev_full_is_one_error(cmd: list[str]) -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "probe", *cmd],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    r.stdout = ""
    assert "standard output" in one_error(r, 1)  # type: ignore[arg-type]


@needs("prometheus")
def test_dash_writes_the_textfile_to_stdout(tmp_path: Path) -> None:
    r = probe("export", "--prometheus-textfile", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "vllm_graph_probe_steps_total" in r.stdout
    assert list(tmp_path.iterdir()) == []  # not a file named "-"


# -- arguments and PROBE_* values, checked before anything starts -----------------------------


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["record", "--interval", "-1", "-o", "{d}/r.db", "--", "true"], {}),
        (["record", "--interval", "nan", "-o", "{d}/r.db", "--", "true"], {}),
        (["record", "-o", "{d}/r.db", "--", "{d}"], {}),
        (["record", "-o", "{d}/r.db", "--", "{d}/notexec"], {}),
        (["record", "--prometheus", ":99999", "-o", "{d}/r.db", "--", "true"], {}),
        (["record", "--run-dir", "/etc/passwd", "-o", "{d}/r.db", "--", "true"], {}),
        (["record", "--hooks", "nope", "-o", "{d}/r.db", "--", "true"], {}),
        (["record", "-o", "{d}/r.db", "--", "true"], {"PROBE_RING_CAPACITY": "3"}),
        (["record", "-o", "{d}/r.db", "--", "true"], {"PROBE_SAMPLE_EVERY": "0"}),
        (["record", "-o", "{d}/r.db", "--", "true"], {"PROBE_CLOCK": "hpet"}),
        (["collect", "--interval", "-1", "--run-dir", "{d}", "-o", "{d}/r.db"], {}),
        (["export", "--timeout", "-1", "--otlp", "127.0.0.1:1"], {}),
        (["ab", "--reps", "0", "--b-override", "X=Y", "--", "true"], {}),
        (["report", "--width", "-5"], {}),
        (["attach", "--interval", "0", "--pid", "1"], {}),
        (["ps", "--pid", "-1"], {}),
        (["doctor", "--pid", "0"], {}),
        # an empty value (an unset shell variable) named the bundled recording or the
        # working directory without a word; collect then waited there for rings
        (["report", ""], {}),
        (["export", "", "--perfetto", "{d}/x.pftrace"], {}),
        (["collect", "--run-dir", "", "-o", "{d}/r.db"], {}),
        (["record", "--run-dir", "", "-o", "{d}/r.db", "--", "true"], {}),
        (["merge", str(BUNDLED), "", "--out", "{d}/m.pftrace"], {}),
        (["ab", "--a", "", "--b", str(BUNDLED)], {}),
    ],
)
def test_bad_arguments_are_usage_errors_before_anything_starts(
    tmp_path: Path, argv: list[str], env: dict[str, str]
) -> None:
    (tmp_path / "notexec").write_text("#!/bin/sh\n")
    before = listing(tmp_path)
    r = probe(*[a.replace("{d}", str(tmp_path)) for a in argv], env=env, cwd=tmp_path)
    one_error(r, 2)
    assert listing(tmp_path) == before


def test_an_empty_value_is_named_and_a_workloads_own_empty_argument_passes(
    tmp_path: Path,
) -> None:
    assert "--run-dir: an empty value" in one_error(probe("ps", "--run-dir", ""), 2)
    assert "recording: an empty value" in one_error(probe("report", ""), 2)
    script = tmp_path / "args.py"
    script.write_text(
        "import sys, pathlib\npathlib.Path(sys.argv[1]).write_text(repr(sys.argv[2:]))\n"
    )
    seen = tmp_path / "seen"
    workload = [sys.executable, str(script), str(seen), ""]
    r = probe("record", "-o", str(tmp_path / "r.db"), "--", *workload)
    assert r.returncode == 0, r.stderr
    assert seen.read_text() == "['']"


def test_a_refused_otlp_endpoint_fails_fast_and_says_so() -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = probe("export", "--otlp", f"http://127.0.0.1:{port}", "--timeout", "2")
    assert f"127.0.0.1:{port}" in one_error(r, 1)


# -- litter ------------------------------------------------------------------------------------


def test_a_command_that_cannot_start_leaves_no_session_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    bad = tmp_path / "garbage"
    bad.write_bytes(b"\x7fELF not really")
    bad.chmod(0o755)
    r = probe("record", "--run-dir", str(run), "-o", str(tmp_path / "r.probe.db"), "--", str(bad))
    one_error(r, 1)
    assert list(run.iterdir()) == []


SERVE_AND_WAIT = """
import multiprocessing as mp, os, signal, sys, time

def worker(run_dir):
    # as vLLM's engine core and workers do: SIGTERM raises SystemExit
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    os.environ["PROBE_RUN_DIR"] = run_dir
    from probe.engine.control_server import start_server
    start_server()
    print(os.getpid(), flush=True)
    while True:
        time.sleep(0.1)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=worker, args=(sys.argv[1],))
    p.start()
    p.join()
    print("exit", p.exitcode, flush=True)
"""


def test_a_sigterm_multiprocessing_worker_removes_its_socket(tmp_path: Path) -> None:
    run = Path(tempfile.mkdtemp(prefix="pt-", dir="/tmp"))  # a socket path must be short
    os.chmod(run, 0o700)
    script = tmp_path / "serve.py"
    script.write_text(SERVE_AND_WAIT)
    try:
        p = subprocess.Popen(
            [sys.executable, str(script), str(run)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert p.stdout is not None
        pid = int(p.stdout.readline())
        deadline = time.monotonic() + 30
        while not (run / f"ctl-{pid}.sock").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(pid, signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        assert [x.name for x in run.iterdir()] == []
    finally:
        shutil.rmtree(run, ignore_errors=True)


# -- the control server ----------------------------------------------------------------------


@pytest.fixture
def short_run_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="pc-", dir="/tmp"))
    os.chmod(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class _Host:
    """The probe behind the server, without hooks: what the watchdog turns off."""

    def __init__(self) -> None:
        self.enabled = False
        self.writer = None

    def installed_families(self) -> list[str]:
        return []

    def parked_hooks(self) -> int:
        return 0

    def known_families(self) -> list[str]:
        return ["step"]

    def enable(self, ring: Path, gpu_timing: int, families: object, sample_every: int = 1) -> None:
        self.enabled = True

    def disable(self) -> None:
        self.enabled = False

    def heartbeat_ns(self) -> int:
        return 0

    def dropped(self) -> int:
        return 0

    def faults(self) -> dict[str, int]:
        return {}

    def snapshot(self) -> None:
        return None

    def static(self) -> dict[str, object]:
        return {}


def _send(path: Path, obj: dict[str, object], timeout: float = 3.0) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(json.dumps(obj).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    out: dict[str, object] = json.loads(buf)
    return out


def _trickler(path: Path, stop: threading.Event) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                s.sendall(b" ")
            except OSError:
                return
            stop.wait(0.3)


def _server(run_dir: Path, **kw: object):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT))
    from probe.engine import control_server

    srv = control_server.ControlServer(run_dir, host=_Host(), **kw)  # type: ignore[arg-type]
    srv.open()
    return srv


def test_a_trickling_client_holds_up_no_other_client(short_run_dir: Path) -> None:
    srv = _server(short_run_dir)
    stop = threading.Event()
    t = threading.Thread(target=_trickler, args=(srv.path, stop), daemon=True)
    t.start()
    try:
        time.sleep(0.5)
        assert _send(srv.path, {"cmd": "status"}, timeout=3.0)["ok"] is True
    finally:
        stop.set()
        srv.close()


def test_the_watchdog_trips_while_a_client_trickles(short_run_dir: Path) -> None:
    gone = {"reader": False}
    srv = _server(
        short_run_dir,
        watchdog_interval_s=0.1,
        alive=lambda pid: not gone["reader"],
    )
    try:
        assert _send(srv.path, {"cmd": "enable", "gpu_timing": False})["ok"] is True
        stop = threading.Event()
        threading.Thread(target=_trickler, args=(srv.path, stop), daemon=True).start()
        time.sleep(0.3)
        gone["reader"] = True  # the reader died; a client keeps the socket busy
        deadline = time.monotonic() + 3.0
        while srv.host.enabled and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        assert not srv.host.enabled and srv.watchdog_trips == 1
    finally:
        srv.close()


def test_a_trickled_request_is_cut_off_at_its_deadline(short_run_dir: Path) -> None:
    srv = _server(short_run_dir)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(srv.path))
            s.settimeout(15)
            reply = b""
            while not reply:
                s.sendall(b" ")
                time.sleep(0.5)
                s.setblocking(False)
                try:
                    reply = s.recv(4096)
                except BlockingIOError:
                    pass
                except OSError:
                    break
                finally:
                    s.setblocking(True)
                    s.settimeout(15)
        assert b"no whole request" in reply
    finally:
        srv.close()


@pytest.mark.parametrize(
    "args",
    [
        {"sample_every": 2**64 + 1},
        {"gpu_timing": 2**64 + 1},
        {"sample_every": 0},
        {"duration_s": 0},
        {"duration_s": -1},
        {"duration_s": float("nan")},
        {"duration_s": 1e300},
        {"duration_s": True},
        {"duration_s": "3"},
    ],
)
def test_numeric_control_fields_are_bounded(short_run_dir: Path, args: dict[str, Any]) -> None:
    srv = _server(short_run_dir)
    try:
        reply = _send(srv.path, {"cmd": "enable", **args})
        assert reply["ok"] is False and not srv.host.enabled
    finally:
        srv.close()


def test_an_unsafe_shared_run_dir_falls_back_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sys.path.insert(0, str(ROOT))
    from probe.engine import control_server

    shm = tmp_path / "shm"
    shm.mkdir()
    planted = shm / f"vllm-graph-probe-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)  # another user's folder would be refused the same way
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    with caplog.at_level("WARNING", logger="probe"):
        d = control_server.run_dir({"XDG_RUNTIME_DIR": str(xdg)}, shm_root=str(shm))
    assert d == xdg / "vllm-graph-probe"
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert str(planted) in caplog.text and str(d) in caplog.text
    d2 = control_server.run_dir({}, shm_root=str(shm), tmp_root=str(tmp_path))
    assert d2.parent == tmp_path and stat.S_IMODE(os.stat(d2).st_mode) == 0o700
    # and a reader finds the same private folder again
    assert control_server.run_dir({}, shm_root=str(shm), tmp_root=str(tmp_path)) == d2


# -- the documents ---------------------------------------------------------------------------


def test_the_known_gaps_section_the_documents_point_to_exists() -> None:
    for doc in ("reliability.md", "threat-model.md"):
        text = (ROOT / "docs" / doc).read_text()
        if "Known gaps" in text:
            assert "\n## Known gaps" in (ROOT / "docs" / "reliability.md").read_text(), doc


# -- content after the header: a pid that names no process (found by the fuzz) ----------------


@pytest.mark.parametrize("cmd", [["report"], ["export", "--perfetto", "{d}/x.pftrace"]])
def test_a_step_of_an_undeclared_process_is_a_damaged_recording(
    tmp_path: Path, cmd: list[str]
) -> None:
    import sqlite3

    rec = tmp_path / "r.probe.db"
    shutil.copy(BUNDLED, rec)
    with sqlite3.connect(rec) as db:  # one step's pid changed by one
        db.execute("UPDATE steps SET pid = pid + 1 WHERE rowid = (SELECT min(rowid) FROM steps)")
    r = probe(*[a.replace("{d}", str(tmp_path)) for a in cmd], str(rec))
    assert "not in processes" in one_error(r, 2)
    assert not (tmp_path / "x.pftrace").exists()


@pytest.mark.parametrize(
    "cmd",
    [["report"], pytest.param(["export", "--perfetto", "{d}/x.pftrace"], marks=needs("perfetto"))],
)
def test_a_span_that_ends_before_it_starts_is_a_damaged_recording(
    tmp_path: Path, cmd: list[str]
) -> None:
    import sqlite3

    rec = tmp_path / "r.probe.db"
    shutil.copy(BUNDLED, rec)
    with sqlite3.connect(rec) as db:  # found by the fuzz: one byte of a span's t1 flipped
        db.execute(
            "UPDATE spans SET t1_ns = t0_ns - 17179869184 "
            "WHERE rowid = (SELECT min(rowid) FROM spans)"
        )
    r = probe(*[a.replace("{d}", str(tmp_path)) for a in cmd], str(rec))
    assert "before t0" in one_error(r, 2)
    assert not (tmp_path / "x.pftrace").exists()


# -- a schema name that is not UTF-8 (found by the fuzz at 300 examples) -----------------------


def _non_utf8_name(src: Path, dst: Path, pattern: bytes) -> None:
    """``src`` with one byte of a schema object's name (as ``sqlite_master`` spells it)
    made 0x83: SQLite's "malformed database schema (NAME)" is then not UTF-8 text, and
    Python's sqlite3 raised UnicodeDecodeError in place of its DatabaseError."""
    data = bytearray(src.read_bytes())
    at = data.find(pattern)
    assert at > 0, pattern
    name_at = at + pattern.index(b"_") - 1  # a byte inside the name, past its type word
    data[name_at] = 0x83
    dst.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "cmd", [["report"], ["report", "--json"], ["doctor"], ["export", "--perfetto", "{d}/x.pftrace"]]
)
def test_a_recording_whose_schema_name_is_not_utf8_is_one_line(
    tmp_path: Path, cmd: list[str]
) -> None:
    rec = tmp_path / "r.probe.db"
    _non_utf8_name(BUNDLED, rec, b"indexbuilds_step")
    r = probe(*[a.replace("{d}", str(tmp_path)) for a in cmd], str(rec))
    line = one_error(r, 2)
    assert "damaged or truncated recording (text that is not UTF-8: malformed database" in line
    assert not (tmp_path / "x.pftrace").exists()


def test_a_rocpd_database_whose_schema_name_is_not_utf8_is_a_profile_error(
    tmp_path: Path,
) -> None:
    from exporters.timelines.model import ProfileError
    from exporters.timelines.rocpd import read_rocpd, rocpd_origin
    from exporters.timelines.rocpd_writer import create_rocpd_db

    good, bad = tmp_path / "good.db", tmp_path / "bad.db"
    with create_rocpd_db(good, "3", machine_id="0" * 32, hostname="h"):
        pass
    _non_utf8_name(good, bad, b"tablerocpd_info_agent")
    for read in (rocpd_origin, read_rocpd):
        with pytest.raises(ProfileError, match="malformed database schema"):
            read(bad)
    r = probe("merge", str(BUNDLED), str(bad), "--out", str(tmp_path / "m.pftrace"))
    assert "malformed database schema" in one_error(r, 2)
    assert not (tmp_path / "m.pftrace").exists()


# -- what quick_check passes: a damaged snapshot, a damaged column name (found by the fuzz) ---


@pytest.mark.parametrize(
    "cmd",
    [
        ["report"],
        ["doctor"],
        pytest.param(["export", "--perfetto", "{d}/x.pftrace"], marks=needs("perfetto")),
    ],
)
def test_a_snapshot_that_is_not_a_json_object_is_named(tmp_path: Path, cmd: list[str]) -> None:
    import sqlite3

    for bad, why in (('{"a": ', "not JSON"), ("[1, 2]", "not a JSON object")):
        rec = tmp_path / "r.probe.db"
        shutil.copy(BUNDLED, rec)
        with sqlite3.connect(rec) as db:
            db.execute("UPDATE processes SET snapshot = ?", (bad,))
        r = probe(*[a.replace("{d}", str(tmp_path)) for a in cmd], str(rec))
        assert f"table processes, pid 2947, column snapshot: {why}" in one_error(r, 2)
        assert not (tmp_path / "x.pftrace").exists()


def test_a_damaged_column_name_of_any_table_is_named(tmp_path: Path) -> None:
    """One byte of a column's name in the processes table flipped (the schema is text, so
    quick_check passes): the column the probe reads is missing, said at open."""
    data = bytearray(BUNDLED.read_bytes())
    at = data.find(b"pid INTEGER PRIMARY KEY, role TEXT") + len(b"pid INTEGER PRIMARY KEY, ")
    data[at] = 0x80
    rec = tmp_path / "r.probe.db"
    rec.write_bytes(bytes(data))
    assert "table processes has no role" in one_error(probe("report", str(rec)), 2)


def test_a_nul_byte_in_an_argument_is_a_usage_error() -> None:
    """Only a caller of ``probe.cli.main.main`` can pass one (exec refuses it); os.stat raised."""
    import contextlib
    import io

    from probe.cli import main as cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        cli.main(["report", "\x00"])
    assert exc.value.code == 2
    assert err.getvalue().splitlines()[-1] == "probe: error: recording: a value with a NUL byte"


def test_export_without_the_perfetto_extra_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from probe.cli.main import main

    monkeypatch.setitem(sys.modules, "perfetto.protos.perfetto.trace", None)  # -> ImportError
    out = tmp_path / "x.pftrace"
    assert main(["export", "--perfetto", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "pip install 'vllm-graph-probe[perfetto]'" in err[0]
    assert "Traceback" not in err[0]
    assert not out.exists()
