"""``probe attach`` sends its enable as early as it can in its own CPU time.

On a saturated host the attach waits for a CPU far longer than it works, so the wall time
to "attached" grows with the CPU it needs first (docs/reliability.md). Before the enable:
the checks of the command line, discovery, the busy check; after it: the reader's modules,
its statistics, the recording. The rings are opened right after the enable (a process
unlinks its ring at its deadline); what fails after the enable disables every process
before it is reported, and leaves no file behind.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from probe.engine.control_server import ControlServer
from probe.reader.control import request

ROOT = Path(__file__).resolve().parents[2]
# not imported before the enable: the reader, and the ring's code (its records, the
# compiled hot path): the rings are opened with os.open (probe.ring_dir.OPEN_FLAGS)
READER = (
    "probe.reader.collector",
    "probe.reader.assemble",
    "probe.cli.render_live",
    "probe.reader.recording",
    "probe.reader.ring_reader",
    "probe.records",
)


@pytest.fixture
def server(run_dir: Path, clean_probe: None) -> Iterator[ControlServer]:
    """An armed process (this one) as the plugin leaves it: the always-on hooks only."""
    from probe.engine import hooks

    hooks.install(list(hooks.ALWAYS_ON))  # lazy: no vLLM import
    srv = ControlServer(run_dir, environ={"PROBE_GPU_TIMING": "0"})
    srv.open()
    yield srv
    srv.close()


SPY = """
import json, sys
from probe.cli import attach_session

enable = attach_session.Session.enable

def spy(self, *args, **kwargs):
    with open(sys.argv[1], "w") as f:
        json.dump(sorted(sys.modules), f)
    return enable(self, *args, **kwargs)

attach_session.Session.enable = spy
from probe.cli import main as cli
sys.exit(cli.main(sys.argv[2:]))
"""


def test_the_enable_goes_out_before_the_readers_modules_are_imported(
    server: ControlServer, run_dir: Path
) -> None:
    seen = run_dir / "modules.json"
    rec = run_dir / "a.probe.db"
    p = subprocess.run(
        [sys.executable, "-c", SPY, str(seen), "attach", "--run-dir", str(run_dir),
         "--duration", "0.3", "--no-live", "--record", str(rec)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    at_enable = set(json.loads(seen.read_text()))
    assert "probe.reader.discover" in at_enable  # the spy saw the start
    assert [m for m in READER if m in at_enable] == []
    assert "probe: detached (duration reached)" in p.stderr
    assert p.stderr.rstrip().endswith(f"probe: recording written to {rec}")
    from probe.reader.recording import Recording

    meta = Recording.open(rec).meta()
    assert meta["stop_reason"] == "duration reached"
    assert int(meta["created_epoch_ns"]) >= int(meta["started_epoch_ns"])  # the enable between
    assert meta["attached"] == [{"pid": os.getpid(), "role": "other"}]
    assert server.attached_by is None


def test_a_recording_that_cannot_be_made_after_the_enable_disables_and_leaves_nothing(
    server: ControlServer,
    run_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from probe.cli import main as cli
    from probe.engine.runtime import RT
    from probe.reader import recording

    states: list[bool] = []

    def refused(path: Path) -> None:
        states.append(RT.enabled)  # the hooks are on by now
        path.with_name(f"{path.name}-wal").write_bytes(b"")  # as sqlite leaves one
        raise sqlite3.OperationalError("disk I/O   error")

    monkeypatch.setattr(recording, "RecordingWriter", refused)
    rec = run_dir / "a.probe.db"
    argv = ["attach", "--run-dir", str(run_dir), "--duration", "5", "--no-live"]
    assert cli.main([*argv, "--record", str(rec)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"probe: attached to 1 process(es): {os.getpid()} other",
        f"probe: error: attach: cannot write {rec}: disk I/O error",
    ]
    assert states == [True] and not RT.enabled and server.attached_by is None
    assert request(server.path, "status")["last_off"]["reason"] == "disable"
    assert sorted(p.name for p in run_dir.iterdir()) == [server.path.name]  # no ring either


def test_a_fault_after_the_recording_was_opened_closes_and_removes_it(
    server: ControlServer, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from probe.cli import attach_session
    from probe.cli import main as cli
    from probe.engine.runtime import RT

    def broken(self: attach_session.Session, sinks: object = ()) -> None:
        raise RuntimeError("a bug of the reader")

    monkeypatch.setattr(attach_session.Session, "collect", broken)
    rec = run_dir / "a.probe.db"
    argv = ["attach", "--run-dir", str(run_dir), "--duration", "5", "--no-live"]
    with pytest.raises(RuntimeError, match="a bug of the reader"):
        cli.main([*argv, "--record", str(rec)])
    assert not RT.enabled and server.attached_by is None
    assert sorted(p.name for p in run_dir.iterdir()) == [server.path.name]


def test_an_enable_refused_leaves_no_recording(
    run_dir: Path, clean_probe: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file made for ``--record`` before the enable goes when the enable fails."""
    from probe.cli import main as cli
    from probe.engine.control_server import ProbeHost

    full = OSError(28, "No space left on device")

    class Refusing(ProbeHost):
        def enable(self, *args: object, **kwargs: object) -> None:
            raise full

    srv = ControlServer(run_dir, environ={}, host=Refusing({}))
    srv.open()
    try:
        rec = run_dir / "a.probe.db"
        argv = ["attach", "--run-dir", str(run_dir), "--no-live", "--record", str(rec)]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"probe: error: pid {os.getpid()} (other): enable failed: {full!r}"]
        assert sorted(p.name for p in run_dir.iterdir()) == [srv.path.name]
        assert srv.attached_by is None
    finally:
        srv.close()


def test_a_ring_unlinked_at_the_deadline_before_the_reader_started_is_read(
    run_dir: Path, clean_probe: None
) -> None:
    """The rings are opened at the enable, the collector comes later: a process whose
    deadline came in between (it unlinked its ring) is read all the same."""
    from probe.cli.attach_session import Session
    from probe.engine.runtime import RT

    clock = SimpleNamespace(now=10**12)
    srv = ControlServer(run_dir, environ={}, clock_ns=lambda: clock.now, watchdog_thread=False)
    srv.open()
    try:
        proc = SimpleNamespace(socket=srv.path, pid=os.getpid(), role="worker")
        session = Session([proc], run_dir, [])
        session.enable(duration_s=3)
        [ring] = session.rings
        assert RT.enabled and ring.exists() and list(session.ring_fds) == [ring]
        clock.now += 3 * 10**9
        assert srv.watchdog() is True  # the deadline: hooks off, ring unlinked
        assert not RT.enabled and not ring.exists()
        session.collect([])
        col = session.collector
        col.poll()
        col.assemble()
        [state] = col.procs.values()
        assert col.errors == [] and state.hello is not None and state.hello.pid == os.getpid()
        assert session.ring_fds == {} and session.close() == []
    finally:
        srv.close()
