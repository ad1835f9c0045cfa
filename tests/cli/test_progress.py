"""Progress on stderr for export, merge, collect and ab (``probe/cli/progress.py``).

In process: the real writers drive a :class:`Display` on a rich console that writes into
a ``StringIO`` as a terminal would (``force_terminal``), with a fake clock and no refresh
thread, so each pushed count is one frame; the frames must climb to the stage's total.
Through the CLI: the same commands with ``--progress`` (forced onto a pipe), with
``--no-progress`` and with neither (stderr is a pipe: no display) write the same stdout
and the same files; on a real pseudo-terminal the display appears unless ``--json``,
``CI``, ``NO_COLOR`` or ``TERM=dumb`` ask for plain output.
"""

from __future__ import annotations

import os
import pty
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from extras import needs
from rich.console import Console
from terminal import read_terminal

from probe.cli.progress import Display, display_for, wanted
from probe.progress import counted
from probe.reader.recording import Recording, default_recording

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "tests/data"
WINDOW = H200 / "groundtruth-window.probe"
KINETO = H200 / "run3-groundtruth.kineto.trimmed.json.gz"
STEPS = 1305  # the bundled recording's steps
RECORDS = 31125  # its steps and detail rows: what perfetto and rocpd read

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COUNT = re.compile(r"([\d,]+)/([\d,]+) (\w+)")


class Clock:
    """A clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float = 0.05) -> None:
        self.t = 0.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def _display(clock: Clock | None = None, **kw: Any) -> tuple[Display, StringIO]:
    buf = StringIO()
    console = Console(file=buf, force_terminal=True, width=140, soft_wrap=True)
    return Display(console, get_time=clock or Clock(), auto_refresh=False, **kw), buf


def frames(text: str) -> list[str]:
    """The lines a terminal was sent, escape codes removed, one per redraw."""
    return [f.strip() for f in re.split(r"[\r\n]", ANSI.sub("", text)) if f.strip()]


def counts(text: str, stage: str) -> list[tuple[int, int, str]]:
    """(done, total, unit) of every frame of ``stage``, in order."""
    out = []
    for f in frames(text):
        if stage in f and (ms := list(COUNT.finditer(f))):
            m = ms[-1]  # the count column, after any "run 1/5" of the text
            out.append((int(m[1].replace(",", "")), int(m[2].replace(",", "")), m[3]))
    return out


def climbs_to(
    seen: list[tuple[int, int, str]], total: int, unit: str, *, between: bool = True
) -> None:
    """Frames start at 0, never go back, pass through counts in between, end at total.

    ``between=False`` for a command run on the real clock: the display draws at most
    every 0.1 s, so a fast stage may go from 0 to its total in one redraw."""
    done = [d for d, _, _ in seen]
    assert seen, "no frame of the stage"
    assert {(t, u) for _, t, u in seen} == {(total, unit)}
    assert done[0] == 0 and done[-1] == total
    assert done == sorted(done)
    if between:
        assert any(0 < d < total for d in done), done


class Calls:
    """A Progress that records what it is told."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, int | None, str]] = []
        self.done: list[int] = []

    def stage(self, description: str, total: int | None = None, unit: str = "steps") -> None:
        self.stages.append((description, total, unit))
        self.done.append(0)

    def advance(self, n: int = 1) -> None:
        self.done[-1] += n


@pytest.fixture(scope="module")
def rec() -> Iterator[Recording]:
    r = Recording.open(default_recording())
    yield r
    r.close()


# -- the display ----------------------------------------------------------------------------


def test_counted_advances_in_chunks_and_exactly() -> None:
    calls = Calls()
    calls.stage("x", 1000)
    seen = []
    for i in counted(range(1000), calls, every=256):
        seen.append(i)
    assert seen == list(range(1000)) and calls.done == [1000]


def test_counts_reach_rich_at_most_every_interval_not_per_step() -> None:
    clock = Clock(step=0.0)  # time stands still: nothing is pushed after the first frame
    d, buf = _display(clock)
    with d:
        d.stage("replaying steps", 100_000)
        for _ in range(100_000):
            d.advance()
        still = counts(buf.getvalue(), "replaying steps")
        clock.t += 0.1  # one interval later: the next advance pushes
        d.advance()
        after = counts(buf.getvalue(), "replaying steps")
    assert {c[0] for c in still} == {0} and len(still) <= 2  # add_task draws once itself
    assert [c[0] for c in after[len(still) :]] == [100_001]


def test_a_display_that_is_off_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    d = Display(None)
    with d:
        d.stage("x", 10)
        d.advance(5)
        d.describe("y")
        assert not d.on
        d.echo("a line")
        d.echo("data", stdout=True)
    out = capsys.readouterr()
    assert out.err == "a line\n" and out.out == "data\n"


def test_echo_to_stdout_lifts_the_display(capsys: pytest.CaptureFixture[str]) -> None:
    d, buf = _display()
    with d:
        d.stage("aligning", 2, "profiles")
        d.advance()
        d.echo("trace.json: clock pair", stdout=True)
        d.echo("probe: to stderr")
        d.advance()
    assert capsys.readouterr().out == "trace.json: clock pair\n"
    text = buf.getvalue()
    assert "trace.json" not in text and "probe: to stderr" in text
    climbs_to(counts(text, "aligning"), 2, "profiles")


def test_wanted_flag_then_plain_then_environment_then_terminal() -> None:
    class Tty(StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), StringIO()
    assert wanted(None, plain=False, stream=tty, environ={}) is True
    assert wanted(None, plain=False, stream=pipe, environ={}) is False
    assert wanted(True, plain=True, stream=pipe, environ={"CI": "true"}) is True
    assert wanted(False, plain=False, stream=tty, environ={}) is False
    assert wanted(None, plain=True, stream=tty, environ={}) is False
    for env in ({"CI": "true"}, {"CI": "1"}, {"NO_COLOR": "1"}, {"TERM": "dumb"}):
        assert wanted(None, plain=False, stream=tty, environ=env) is False, env
    for env in ({"CI": "false"}, {"CI": ""}, {"NO_COLOR": ""}, {"TERM": "xterm-256color"}):
        assert wanted(None, plain=False, stream=tty, environ=env) is True, env
    assert not display_for(None, plain=True, stream=tty, environ={}).console  # --json
    assert display_for(True, plain=True, stream=pipe, environ={}).console is not None


# -- the writers, through the display -------------------------------------------------------


def test_prometheus_textfile_bar_climbs_to_every_step(rec: Recording, tmp_path: Path) -> None:
    from exporters import prometheus

    d, buf = _display()
    with d:
        d.section("prometheus textfile")
        assert prometheus.write(rec, tmp_path / "a.prom", progress=d) == STEPS
    climbs_to(counts(buf.getvalue(), "prometheus textfile: replaying steps"), STEPS, "steps")
    prometheus.write(rec, tmp_path / "b.prom")
    assert (tmp_path / "a.prom").read_bytes() == (tmp_path / "b.prom").read_bytes()


def test_openmetrics_bar_climbs_to_every_step(rec: Recording, tmp_path: Path) -> None:
    from exporters import openmetrics

    d, buf = _display()
    with d:
        openmetrics.write(rec, tmp_path / "a.om", progress=d)
    climbs_to(counts(buf.getvalue(), "building timelines"), STEPS, "steps")
    openmetrics.write(rec, tmp_path / "b.om")
    assert (tmp_path / "a.om").read_bytes() == (tmp_path / "b.om").read_bytes()


@needs("perfetto")
def test_perfetto_bars_read_every_record_and_encode_every_slice(
    rec: Recording, tmp_path: Path
) -> None:
    from exporters import perfetto

    d, buf = _display()
    with d:
        perfetto.write(rec, tmp_path / "a.pftrace", progress=d)
    climbs_to(counts(buf.getvalue(), "reading records"), RECORDS, "records")
    climbs_to(counts(buf.getvalue(), "encoding trace"), RECORDS, "slices")
    perfetto.write(rec, tmp_path / "b.pftrace")
    assert (tmp_path / "a.pftrace").read_bytes() == (tmp_path / "b.pftrace").read_bytes()


def test_rocpd_bar_through_the_registry(rec: Recording, tmp_path: Path) -> None:
    from exporters import registry

    d, buf = _display()
    with d:
        assert registry.get("rocpd").write(rec, str(tmp_path / "a.db"), d) == RECORDS
    climbs_to(counts(buf.getvalue(), "writing regions"), RECORDS, "records")
    registry.get("rocpd").write(rec, str(tmp_path / "b.db"))
    assert _rocpd_dump(tmp_path / "a.db") == _rocpd_dump(tmp_path / "b.db")


def test_every_builtin_exporter_reports_progress() -> None:
    from exporters import registry

    assert all(e.reports_progress for e in registry.BUILTIN.values())


@pytest.fixture
def otlp_endpoint() -> Iterator[str]:
    class Ok(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)  # an empty body is an empty Export*ServiceResponse
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_otlp_stages_spans_then_metric_samples(rec: Recording, otlp_endpoint: str) -> None:
    """Spans, then the metric samples, each process's sent as they are computed: both
    stages count the steps read."""
    from exporters import otlp

    calls = Calls()
    w = otlp.write(rec, otlp_endpoint, progress=calls)
    assert w.spans_failed == 0 and w.metric_exports_failed == 0 and w.metric_exports > 0
    assert calls.stages == [
        ("replaying steps", STEPS, "steps"),
        ("sending metric samples", STEPS, "steps"),
    ]
    assert calls.done == [STEPS, STEPS]


@needs("perfetto")
def test_merge_stages_load_align_write(tmp_path: Path) -> None:
    from exporters.timelines.align import align
    from exporters.timelines.load import load_profiles
    from exporters.timelines.merge import merge_to_perfetto

    calls = Calls()
    window = Recording.open(WINDOW)
    [prof] = load_profiles([KINETO], progress=calls)
    merge_to_perfetto(window, [(prof, align(window, prof))], tmp_path / "m", progress=calls)
    events = len(prof.host_calls) + len(prof.markers) + len(prof.kernels)
    assert calls.stages == [
        (f"loading {KINETO.name} (1/1)", None, ""),
        ("reading records", window.record_count(), "records"),
        ("placing kineto events", events, "events"),
        # every record and every event is one slice
        ("encoding trace", window.record_count() + events, "slices"),
    ]
    assert calls.done[1:] == [s[1] for s in calls.stages[1:]]


# -- the commands -----------------------------------------------------------------------------


def _probe(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "probe", *args],
        cwd=cwd,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=240,
    )


def _rocpd_dump(path: Path) -> list[str]:
    """The database as SQL, its per-database GUID (random by design) made constant."""
    con = sqlite3.connect(path)
    try:
        guid = {r[1]: r[2] for r in con.execute("SELECT * FROM rocpd_metadata")}["guid"]
        text = "\n".join(con.iterdump())
    finally:
        con.close()
    return text.replace(guid, "GUID").replace(guid.replace("-", "_"), "GUID").splitlines()


EXPORT = ["--perfetto", "t.pftrace", "--openmetrics", "t.om", "--prometheus-textfile", "t.prom"]


@needs("perfetto", "prometheus")
def test_export_outputs_are_the_same_with_and_without_progress(tmp_path: Path) -> None:
    runs = {}
    for name, flag in (("default", []), ("on", ["--progress"])):
        d = tmp_path / name
        d.mkdir()
        runs[name] = _probe("export", *EXPORT, "--rocpd", "t.db", *flag, cwd=d)
        assert runs[name].returncode == 0, runs[name].stderr[-2000:]
        assert runs[name].stdout == b""
    for f in ("t.pftrace", "t.om", "t.prom"):
        assert (tmp_path / "on" / f).read_bytes() == (tmp_path / "default" / f).read_bytes(), f
    assert _rocpd_dump(tmp_path / "on/t.db") == _rocpd_dump(tmp_path / "default/t.db")
    # stderr is not a terminal: no display unless forced, the summary lines unchanged
    assert b"\x1b" not in runs["default"].stderr
    lines = runs["default"].stderr.decode().splitlines()
    om = (tmp_path / "default" / "t.om").read_text().splitlines()
    samples = sum(1 for ln in om if not ln.startswith("#"))
    assert [ln.split(" -> ")[0] for ln in lines] == [
        f"probe: {samples} timestamped samples",
        f"probe: {STEPS:,} engine steps",
        "probe: timeline",
        f"probe: {RECORDS} spans",
    ]
    on = runs["on"].stderr.decode()
    for line in lines:
        assert line in on
    climbs_to(counts(on, "prometheus textfile: replaying steps"), STEPS, "steps", between=False)
    assert counts(on, "openmetrics: building timelines")[-1] == (STEPS, STEPS, "steps")
    assert counts(on, "perfetto: encoding trace")[-1] == (RECORDS, RECORDS, "slices")
    assert counts(on, "rocpd: writing regions")[-1] == (RECORDS, RECORDS, "records")


@needs("prometheus")
def test_export_to_stdout_keeps_stdout_the_data(tmp_path: Path) -> None:
    plain = _probe("export", "--prometheus-textfile", "-", cwd=tmp_path)
    forced = _probe("export", "--prometheus-textfile", "-", "--progress", cwd=tmp_path)
    assert plain.returncode == forced.returncode == 0
    assert forced.stdout == plain.stdout and plain.stdout.startswith(b"# HELP")
    assert b"\x1b" not in plain.stderr
    assert counts(forced.stderr.decode(), "replaying steps")[-1] == (STEPS, STEPS, "steps")


@needs("perfetto")
def test_merge_outputs_are_the_same_with_and_without_progress(tmp_path: Path) -> None:
    runs = {}
    for name, flag in (("default", []), ("on", ["--progress"])):
        d = tmp_path / name
        d.mkdir()
        runs[name] = _probe(
            "merge", str(WINDOW), str(KINETO), "--out", "m.pftrace", "--report", *flag, cwd=d
        )
        assert runs[name].returncode == 0, runs[name].stderr[-2000:]
    assert runs["on"].stdout == runs["default"].stdout
    assert b"wrote m.pftrace" in runs["on"].stdout
    assert (tmp_path / "on/m.pftrace").read_bytes() == (tmp_path / "default/m.pftrace").read_bytes()
    assert runs["default"].stderr == b""
    on = runs["on"].stderr.decode()
    assert f"loading {KINETO.name} (1/1)" in on
    assert counts(on, "aligning")[-1] == (1, 1, "profiles")
    assert counts(on, "placing kineto events")[-1][0] == counts(on, "placing kineto events")[-1][1]


def test_ab_compare_mode_counts_the_recordings(tmp_path: Path) -> None:
    a = str(H200 / "stock_mrv2_k1.probe")
    b = str(ROOT / "probe/data/default.probe")
    plain = _probe("ab", "--a", a, "--b", b, "--width", "100", cwd=tmp_path)
    forced = _probe("ab", "--a", a, "--b", b, "--width", "100", "--progress", cwd=tmp_path)
    assert plain.returncode == forced.returncode == 0
    assert forced.stdout == plain.stdout and b"decode FULL share" in plain.stdout
    assert plain.stderr == b""
    seen = counts(forced.stderr.decode(), "ab: reading recordings")
    climbs_to(seen, 2, "recordings", between=False)


def test_ab_run_mode_counts_runs_and_passes_the_workload_output_on(tmp_path: Path) -> None:
    script = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    out = _probe(
        "ab",
        "--b-override",
        "FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE",
        "--reps",
        "1",
        "--out",
        str(tmp_path / "ab"),
        "--progress",
        "--",
        sys.executable,
        "-c",
        script,
        cwd=tmp_path,
    )
    # the workload runs no vLLM: both arms run, then the comparison has no steps to compare
    assert out.returncode == 2 and out.stdout == b""
    err = out.stderr.decode()
    assert err.rstrip().endswith("no forward steps recorded")
    assert [c[0] for c in counts(err, "ab: run")][-1] == 2
    assert {c[1:] for c in counts(err, "ab")} == {(2, "runs"), (2, "recordings")}
    assert "ab: run 1/1 arm A" in err and "ab: run 1/1 arm B" in err
    lines = frames(err)  # the workload's own lines, each once per arm, whole
    assert lines.count("to stdout") == 2 and lines.count("to stderr") == 2
    assert err.count("probe ab: run 0 arm ") == 2


WRITER = """
import os, sys
from pathlib import Path
from probe.records import Mode, Phase, Reason, RecordKind, pack_pair
from probe.engine.ring_writer import RingWriter
ring = RingWriter.create(Path(sys.argv[1]) / f"ring-{os.getpid()}.shm", 1 << 16)
w = ring.write
span, disp = int(RecordKind.SPAN), int(RecordKind.DISPATCH)
ex, fw = int(Phase.EXECUTE), int(Phase.FORWARD_LAUNCH)
w(int(RecordKind.HELLO), 0, 0, 0, 0, 0, 0, os.getpid(), 1, 2, 3, 0)
for step in range(1, 301):
    t = step * 1000
    w(span, ex, 0, 0, step, t, t + 900, 8, 4, 0, 0, 0)
    w(disp, int(Mode.FULL), int(Reason.HIT), 0, step, t + 10, t + 11, 6, 8, 3, 4, pack_pair(2, 2))
    w(span, fw, 0, 0, step, t + 20, t + 600, 0, 0, 0, 0, 0)
ring.close(unlink=False)
"""


def _rings(run_dir: Path) -> None:
    run_dir.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", WRITER, str(run_dir)], env=env, check=True, timeout=60)


def test_collect_shows_a_status_line_and_records_the_same(tmp_path: Path) -> None:
    results = {}
    for name, flag in (("default", []), ("on", ["--progress"])):
        run_dir = tmp_path / f"run-{name}"
        _rings(run_dir)
        out = _probe(
            "collect", "--run-dir", str(run_dir), "--out", f"{name}.probe.db", *flag, cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr[-2000:]
        rec = Recording.open(tmp_path / f"{name}.probe.db")
        results[name] = (out, [(s.step, s.mode) for s in rec.iter_steps()])
        rec.close()
    assert results["on"][1] == results["default"][1] and len(results["on"][1]) == 300
    assert results["default"][0].stderr == b"" and results["on"][0].stdout == b""
    status = [f for f in frames(results["on"][0].stderr.decode()) if "collect:" in f]
    assert any(re.search(r"collect: [\d,]+ steps · 1 process \(\d running\) · 0 dropped", f)
               for f in status), status  # fmt: skip
    assert re.search(r"\d+:\d\d:\d\d$", status[-1])  # elapsed, not a bar
    assert "━" not in "".join(status)


@pytest.mark.parametrize("command", ["export", "merge", "collect", "ab"])
def test_every_command_takes_no_progress(command: str) -> None:
    from probe.cli.main import build_parser

    rest = {
        "export": ["x.db", "--perfetto", "x"],
        "merge": ["x.db", "y.json", "--out", "x"],
        "collect": ["--run-dir", "d", "--out", "x"],
        "ab": ["--a", "x", "--b", "y"],
    }[command]
    p = build_parser()
    assert p.parse_args([command, *rest, "--no-progress"]).progress is False
    assert p.parse_args([command, *rest, "--progress"]).progress is True
    assert p.parse_args([command, *rest]).progress is None


# -- on a real terminal ---------------------------------------------------------------------


def _on_a_terminal(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, bytes, bytes]:
    """Run ``probe ARGS`` with stderr on a pseudo-terminal; (status, stdout, terminal)."""
    master, slave = pty.openpty()
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", **env}
    for k in ("CI", "NO_COLOR"):
        if k not in env:
            full_env.pop(k, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "probe", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=full_env,
    )
    os.close(slave)
    seen = read_terminal(master, idle=60)
    os.close(master)
    stdout = proc.stdout.read() if proc.stdout else b""
    return proc.wait(timeout=60), stdout, seen


@needs("prometheus")
@pytest.mark.parametrize(
    ("extra", "env", "drawn"),
    [
        ([], {}, True),
        (["--no-progress"], {}, False),
        ([], {"CI": "true"}, False),
        ([], {"NO_COLOR": "1"}, False),
        ([], {"TERM": "dumb"}, False),
        (["--progress"], {"CI": "true"}, True),
    ],
)
def test_on_a_terminal_only_unless_plain_output_is_asked_for(
    tmp_path: Path, extra: list[str], env: dict[str, str], drawn: bool
) -> None:
    rc, out, tty = _on_a_terminal(
        ["export", "--prometheus-textfile", "t.prom", *extra], tmp_path, env
    )
    assert rc == 0 and out == b""
    text = tty.decode(errors="replace")
    assert "probe: 1,305 engine steps -> t.prom" in text
    assert ("replaying steps" in text) is drawn, text[-500:]


def test_json_output_draws_nothing_on_a_terminal(tmp_path: Path) -> None:
    a = str(H200 / "stock_mrv2_k1.probe")
    rc, out, tty = _on_a_terminal(["ab", "--a", a, "--b", a, "--json"], tmp_path, {})
    assert rc == 0 and out.startswith(b"{")
    assert tty == b""
