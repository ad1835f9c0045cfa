"""The live sinks' rules for ``probe agent`` on the real H200 recording's steps: labels
fixed at a process's first step, a scrape that never waits on a batch being applied, the
endpoint kept up until the final values were scraped, ended processes forgotten, and the
rolling recordings (rotation, retention, every step in exactly one file)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from exporters.base import processes_from_recording
from exporters.prometheus import PrometheusSink, ServingSink
from probe.reader.recording import Recording, default_recording


def _info_and_steps() -> tuple[object, list[object]]:
    rec = Recording.open(default_recording())
    [info] = processes_from_recording(rec)
    return info, list(rec.iter_steps(info.pid))[:200]


def _series(text: str, name: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(name + "{")]


def test_labels_are_fixed_at_the_first_step() -> None:
    """The hello arrives before the snapshot: the facts known then (no model) are not
    exported; the first step's are, and a model name arriving later splits nothing."""
    info, steps = _info_and_steps()
    early = dataclasses.replace(info, model="", vllm_version="")  # type: ignore[type-var]
    later = dataclasses.replace(info, model="renamed-later")  # type: ignore[type-var]
    sink = PrometheusSink()
    sink.process(early)  # type: ignore[arg-type]
    assert not _series(sink.exposition().decode(), "vllm_graph_probe_records_dropped_total")
    sink.steps(info, steps[:100], [])  # type: ignore[arg-type]
    sink.steps(later, steps[100:], [])  # type: ignore[arg-type]
    sink.process(later)  # type: ignore[arg-type]
    text = sink.exposition().decode()
    rows = _series(text, "vllm_graph_probe_steps_total")
    assert rows and all(f'model_name="{info.model}"' in r for r in rows)  # type: ignore[attr-defined]
    assert "renamed-later" not in text
    total = sum(float(r.rsplit(" ", 1)[1]) for r in rows)
    assert total == sum(1 for s in steps if s.forward)  # type: ignore[attr-defined]


def test_a_scrape_does_not_wait_for_a_batch_being_applied() -> None:
    info, steps = _info_and_steps()
    sink = PrometheusSink()
    sink.steps(info, steps[:50], [])  # type: ignore[arg-type]
    before = sink.served()
    with sink._lock:  # a batch being applied
        got = sink.served()
    assert got == before  # the last whole exposition, at once
    sink.steps(info, steps[50:], [])  # type: ignore[arg-type]
    assert sink.served() != before


def test_close_serves_until_the_final_values_were_scraped() -> None:
    info, steps = _info_and_steps()
    sink = ServingSink("127.0.0.1", 0, linger_s=30)
    url = sink.url
    sink.steps(info, steps[:20], [])  # type: ignore[arg-type]
    urllib.request.urlopen(url, timeout=5).read()
    sink.steps(info, steps[20:], [])  # type: ignore[arg-type]
    seen: list[bytes] = []
    closer = threading.Thread(target=sink.close)
    closer.start()
    time.sleep(0.3)
    assert closer.is_alive()  # waiting for a scrape of the final values
    seen.append(urllib.request.urlopen(url, timeout=5).read())
    closer.join(10)
    assert not closer.is_alive()
    rows = _series(seen[0].decode(), "vllm_graph_probe_steps_total")
    assert sum(float(r.rsplit(" ", 1)[1]) for r in rows) == sum(
        1
        for s in steps
        if s.forward  # type: ignore[attr-defined]
    )
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_close_without_a_scraper_does_not_wait() -> None:
    sink = ServingSink("127.0.0.1", 0)
    t0 = time.monotonic()
    sink.close()
    assert time.monotonic() - t0 < 5


def test_the_agents_own_counters() -> None:
    sink = PrometheusSink()
    sink.add_agent_metrics()
    sink.agent_event("attaches")
    sink.agent_event("attaches")
    sink.agent_event("restarts")
    sink.agent_event("attached", 3)
    text = sink.exposition().decode()
    assert "vllm_graph_probe_agent_attaches_total 2.0" in text
    assert "vllm_graph_probe_agent_restarts_total 1.0" in text
    assert "vllm_graph_probe_agent_detaches_total 0.0" in text
    assert "vllm_graph_probe_agent_attached 3.0" in text


def test_an_ended_process_is_forgotten() -> None:
    info, steps = _info_and_steps()
    sink = PrometheusSink()
    sink.steps(info, steps, [])  # type: ignore[arg-type]
    assert sink.forget(info.pid) > 0  # type: ignore[attr-defined]
    assert not _series(sink.exposition().decode(), "vllm_graph_probe_steps_total")
    assert not sink._fixed and not sink._known


def _bundled_process(n: int) -> tuple[Any, list[Any]]:
    """The bundled recording's worker as the collector hands it to a sink (a
    ``ProcessState``'s fields), and its first ``n`` steps."""
    rec = Recording.open(default_recording())
    [info] = processes_from_recording(rec)

    class Proc:
        pid = info.pid
        hello = None
        snapshot = next(p["snapshot"] for p in rec.processes() if p["pid"] == info.pid)
        dropped = 0
        hook_faults = 0
        assembler = None
        decoder = type("Decoder", (), {"strings": {}})

    return Proc, list(rec.iter_steps(info.pid))[:n]


def test_rolling_file_names_sort_as_the_files_were_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files made in one second, some pruned in between: no name is used twice, and the
    names sort in the order the files were made (as ``ls`` and a glob list them)."""
    import time as time_module

    from probe.reader.agent import RollingRecordings

    second = time_module.gmtime(1_800_000_000)
    monkeypatch.setattr(time_module, "gmtime", lambda *_: second)
    roll = RollingRecordings(tmp_path, 10.0, keep=2, clock=lambda: 0.0)
    made = [roll.path]
    for _ in range(4):
        roll.rotate()
        made.append(roll.path)
    roll.close()
    assert len(set(made)) == 5
    assert sorted(made) == made  # type: ignore[type-var]
    assert sorted(tmp_path.glob("host=*/day=*/agent-*.probe")) == made[-2:]


def test_rolling_recordings_rotate_keep_and_hold_every_step_once(tmp_path: Path) -> None:
    from probe.reader.agent import RollingRecordings

    Proc, steps = _bundled_process(90)
    clock = {"t": 0.0}

    roll = RollingRecordings(tmp_path, 10.0, keep=2, clock=lambda: clock["t"])
    for i in range(3):
        roll.on_process(Proc)  # type: ignore[arg-type]
        roll.on_steps(Proc, steps[i * 30 : (i + 1) * 30], [])  # type: ignore[arg-type]
        clock["t"] += 10.0
        roll.tick()
    roll.close()
    files = sorted(tmp_path.glob("host=*/day=*/agent-*.probe"))
    assert len(files) == 2  # three written, the oldest removed
    counts = [sum(1 for _ in Recording.open(p).iter_steps()) for p in files]
    # the last rotation opened an empty file; 30 each before
    assert counts == [30, 0], [p.name for p in files]
    for p in files:  # each file carries the process's facts
        [row] = Recording.open(p).processes()
        assert row["snapshot"]


def test_a_reader_of_a_rolling_file_never_stops_the_rotation(tmp_path: Path) -> None:
    """A user's ``probe report`` of the agent's current file when it rotates: the rotation
    goes on and compacts the file under the reader (in a thread: the agent's loop goes on
    meanwhile), the reader still reads what it opened,
    and the file keeps every step, self-contained (no live streams left)."""
    from probe.reader.agent import RollingRecordings
    from probe.reader.columnar_schema import LIVE, MANIFEST

    Proc, steps = _bundled_process(40)
    clock = {"t": 0.0}

    roll = RollingRecordings(tmp_path, 10.0, keep=None, clock=lambda: clock["t"])
    roll.on_process(Proc)  # type: ignore[arg-type]
    roll.on_steps(Proc, steps[:20], [])  # type: ignore[arg-type]
    roll.sink.writer.commit()  # type: ignore[union-attr]
    first = roll.path
    assert first is not None and (first / LIVE).is_dir()
    reader = Recording.open(first)  # held open across the rotation
    clock["t"] += 10.0
    roll.tick()
    assert roll.path != first and roll.unfinished == []
    assert [w.path for w in roll.compacting] == [first]  # compacting in a thread
    for w in roll.compacting:
        w.join()
    assert not (first / LIVE).exists()
    assert json.loads((first / MANIFEST).read_text())["state"] == "closed"
    assert sum(1 for _ in reader.iter_steps()) == 20
    roll.on_steps(Proc, steps[20:], [])  # type: ignore[arg-type]
    reader.close()
    clock["t"] += 10.0
    roll.tick()
    assert roll.unfinished == []
    roll.close()
    counts = [sum(1 for _ in Recording.open(p).iter_steps()) for p in roll.files]
    assert counts == [20, 20, 0]
    assert all(p.parent.parent.parent == tmp_path for p in roll.files)


def test_the_agent_enables_a_process_and_follows_its_hooks_going_off(
    run_dir: Path, clean_probe: None
) -> None:
    """A real control server (in this process): the agent finds its socket, enables it
    (one log line), and when the hooks go off without it (another client's disable)
    finishes it (one log line) and enables it again at the next scan; at close the
    process is disabled."""
    import io

    from probe.engine import hooks
    from probe.engine.control_server import ControlServer
    from probe.reader import agent as agent_mod
    from probe.reader.control import request

    hooks.install(list(hooks.ALWAYS_ON))
    srv = ControlServer(run_dir, environ={"PROBE_GPU_TIMING": "0"})
    srv.open()
    clock = {"t": 0.0}
    log = io.StringIO()
    sink = PrometheusSink()
    try:
        ag = agent_mod.Agent([run_dir], [sink], scan_s=1.0, log=log, clock=lambda: clock["t"])
        ag.step()
        assert list(ag.attached) == [os.getpid()]
        st = request(srv.path, "status", timeout=5)
        assert st["enabled"] and st["attached_by"] == os.getpid()
        request(srv.path, "disable", timeout=5)  # off without the agent
        clock["t"] += agent_mod.STATUS_EVERY_S
        ag.step()  # its status check finds it off, finishes it
        assert not ag.attached and ag.counts["detaches"] == 1
        clock["t"] += 1.0
        ag.step()  # the next scan enables it again
        assert list(ag.attached) == [os.getpid()] and ag.counts["attaches"] == 2
        ag.close()
        assert not request(srv.path, "status", timeout=5)["enabled"]
        lines = log.getvalue().splitlines()
        assert sum("attached pid" in ln for ln in lines) == 2
        assert sum("detached pid" in ln for ln in lines) == 2  # the disable, the close
        assert "its hooks went off (disable)" in log.getvalue()
    finally:
        srv.close()


ARMED_CHILD = """
import sys, time
from probe.engine import hooks
from probe.engine.control_server import ControlServer
hooks.install(list(hooks.ALWAYS_ON))
srv = ControlServer(sys.argv[1], environ={"PROBE_GPU_TIMING": "0"})
srv.open()
print("up", flush=True)
time.sleep(120)
"""


def _armed_child(run_dir: Path) -> Any:
    """A process with the probe's control socket in ``run_dir``, up when this returns."""
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen(
        [sys.executable, "-c", ARMED_CHILD, str(run_dir)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=root,
    )
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    return child


@pytest.mark.parametrize("off_first", [False, True], ids=["killed", "hooks-off-then-killed"])
def test_a_replaced_process_counts_as_a_restart(run_dir: Path, off_first: bool) -> None:
    """The server's process ends and its successor (same run dir, role and rank) is armed
    before the agent's next turn: the new one is a restart, whether the old one is still
    attached in that turn or was finished earlier because its hooks went off while it
    closed."""
    import io

    from probe.reader import agent as agent_mod
    from probe.reader.control import request

    clock = {"t": 0.0}
    log = io.StringIO()
    ag = agent_mod.Agent(
        [run_dir], [PrometheusSink()], scan_s=1.0, log=log, clock=lambda: clock["t"]
    )
    children = [_armed_child(run_dir)]
    try:
        ag.step()
        assert list(ag.attached) == [children[0].pid]
        if off_first:
            request(next(run_dir.glob(f"ctl-{children[0].pid}.sock")), "disable", timeout=5)
            clock["t"] += agent_mod.STATUS_EVERY_S
            ag.step()
            assert not ag.attached and "its hooks went off" in log.getvalue()
        children[0].kill()
        children[0].wait()
        children.append(_armed_child(run_dir))
        clock["t"] += 1.0
        ag.step()
        assert list(ag.attached) == [children[1].pid]
        assert ag.counts == {"attaches": 2, "detaches": 1, "restarts": 1}
        assert log.getvalue().count("(a restart)") == 1
        ag.close()
    finally:
        for c in children:
            c.kill()
            c.wait()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "give at least one of --prometheus, --otlp, --record-dir"),
        (["--run-dir", "/nonexistent-run-dir", "--prometheus", "127.0.0.1:0"], "no such directory"),
        (["--record-dir", "/nonexistent-rec-dir"], "not a directory"),
        (["--prometheus", "127.0.0.1:0", "--hooks", "bogus"], "unknown hook families"),
        (["--prometheus", "127.0.0.1:0", "--sample", "0"], "--sample"),
    ],
)
def test_bad_input_is_one_line(argv: list[str], says: str) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "probe", "agent", *argv], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("probe: error:")]
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_a_scrape_serves_what_the_reader_rendered_between_batches() -> None:
    """Fed by a reader (its ticks), the endpoint sends the exposition made at the last
    tick: a scrape makes nothing, so it never waits on the reader nor competes for a CPU."""
    info, steps = _info_and_steps()
    sink = ServingSink("127.0.0.1", 0)
    try:
        sink.steps(info, steps[:50], [])  # type: ignore[arg-type]
        sink.tick()
        first = urllib.request.urlopen(sink.url, timeout=5).read()
        assert first == sink.served()
        sink.steps(info, steps[50:], [])  # type: ignore[arg-type]
        assert sink.served() == first  # no tick since: the last whole exposition
        sink._rendered_at = 0.0  # the next tick is due (RENDER_EVERY_S passed)
        sink.tick()
        assert sink.served() != first and sink.served() == sink.exposition()
    finally:
        sink.linger_s = 0.0
        sink.close()


def test_a_client_that_hangs_up_is_one_line_never_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import socket
    import struct

    from loopback import wait_for

    sink = ServingSink("127.0.0.1", 0, linger_s=0.0)
    lines: list[str] = []
    sink.note = lines.append
    try:
        for _ in range(3):
            c = socket.create_connection(("127.0.0.1", sink.port), timeout=5)
            c.sendall(b"GET /metrics HTTP/1.1\r\n")  # and gone, with a reset
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()
        wait_for(lambda: sink.hangups == 3, 10, "three hang-ups seen")
        assert urllib.request.urlopen(sink.url, timeout=5).status == 200
    finally:
        sink.close()
    assert len(lines) == 3 and all("hung up" in ln for ln in lines), lines
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err


def test_a_process_that_ended_has_its_end_as_a_metric_and_a_host_label() -> None:
    info, steps = _info_and_steps()
    sink = PrometheusSink()
    sink.steps(info, steps[:20], [])  # type: ignore[arg-type]
    name = "vllm_graph_probe_process_ended_timestamp_seconds"
    assert not _series(sink.exposition().decode(), name)  # absent while it runs
    sink.finished(info.pid, at=1_700_000_000.0)  # type: ignore[attr-defined]
    [row] = _series(sink.exposition().decode(), name)
    assert row.endswith(" 1.7e+09") and f'pid="{info.pid}"' in row  # type: ignore[attr-defined]
    host = info.host  # type: ignore[attr-defined]
    rows = _series(sink.exposition().decode(), "vllm_graph_probe_steps_total")
    assert host and rows and all(f'host="{host}"' in r for r in rows)
