"""The bad-input invariant, fuzzed: whatever the arguments and the recording, ``probe``
exits 0 with the report of the valid input, or exits 1/2 with one ``probe: error:``
line; never a traceback, never longer than 10 s, never a file created or changed
outside the named output.

Each case is a real ``probe`` subprocess in a folder of its own holding a copy of the
bundled recording (intact, or with bytes flipped, truncated or overwritten) and the
paths the arguments name. ``PROBE_FUZZ_EXAMPLES`` sets the cases per test (default 15,
derandomized); ``PROBE_FUZZ_RANDOM=1`` draws new ones. Figures: docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from recordings import sqlite_of

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# as SQLite: the fuzz damages a recording's bytes, and SQLite's are what it was built on
BUNDLED = sqlite_of(ROOT / "probe" / "data" / "default.probe")
EXAMPLES = int(os.environ.get("PROBE_FUZZ_EXAMPLES", "15"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("PROBE_FUZZ_RANDOM") != "1",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
OUTCOMES: dict[str, int] = {}

VALUES = st.sampled_from(
    [
        "REC",
        "OUT",
        "-",
        "-1",
        "0",
        "nan",
        "inf",
        "1e309",
        "99999",
        ":99999",
        "127.0.0.1:1",
        "http://127.0.0.1:1",
        "/dev/null",
        "/etc/passwd",
        "FIFO",
        "DIR",
        "DIR/missing/x",
        "x" * 300,
        "\u00e9\u00e8",
        "%41#?",
        "",
    ]
)
FLAGS = {
    "report": ["--json", "--width"],
    "doctor": ["--json", "--width", "--pid", "--url", "--run-dir"],
    "export": ["--perfetto", "--prometheus-textfile", "--timeout", "--sampling", "--force"],
    "env": [],
    "ps": ["--json", "--pid", "--url", "--run-dir"],
    "record": ["--out", "--interval", "--duration", "--hooks", "--sample", "--run-dir"],
    "collect": ["--run-dir", "--out", "--interval", "--force"],
    "merge": ["--out", "--report", "--offset-ns", "--force"],
    "ab": ["--a", "--b", "--reps", "--width"],
}
BOOLEAN = {"--json", "--force", "--report"}


@st.composite
def argv(draw: Any) -> list[str]:
    cmd = draw(st.sampled_from(sorted(FLAGS)))
    out = [cmd]
    if cmd in ("report", "doctor", "export", "merge") and draw(st.booleans()):
        out.append(draw(VALUES))
    for flag in draw(st.lists(st.sampled_from(FLAGS[cmd] or ["--help"]), max_size=4)):
        out.append(flag)
        if flag not in BOOLEAN and flag != "--help":
            out.append(draw(VALUES))
    if cmd == "record" and draw(st.booleans()):
        out += ["--", draw(st.sampled_from(["true", "DIR", "/dev/null", "nope-not-a-command"]))]
    return out


def _case_dir(tmp: Path) -> Path:
    d = tmp / f"case-{len(list(tmp.iterdir()))}"
    d.mkdir()
    shutil.copy(BUNDLED, d / "rec.probe.db")
    os.mkfifo(d / "fifo")
    (d / "dir").mkdir()
    return d


def _listing(d: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for p in sorted(d.rglob("*")):
        s = os.lstat(p)
        out[str(p.relative_to(d))] = (s.st_mode, s.st_size, s.st_mtime_ns)
    return out


def _expected_report() -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "probe", "report", "--json", str(BUNDLED)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
        check=True,
    )
    rep: dict[str, Any] = json.loads(r.stdout)
    rep.pop("recording")
    return rep


def run_case(d: Path, args: list[str], *, output: str | None = None) -> str:
    """Run one case and check the invariant; returns its outcome kind."""
    subs = {"REC": "rec.probe.db", "OUT": "out.file", "FIFO": "fifo", "DIR": "dir"}
    real = [subs.get(a, a.replace("DIR/", "dir/")) for a in args]
    before = _listing(d)
    proc = subprocess.Popen(
        [sys.executable, "-m", "probe", *real],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=d,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PROBE_RUN_DIR": str(d / "dir")},
    )
    try:
        out, err = proc.communicate(timeout=4 if real[0] == "collect" else 10)
    except subprocess.TimeoutExpired:
        if real[0] != "collect":
            proc.kill()
            proc.communicate()
            OUTCOMES["hang"] = OUTCOMES.get("hang", 0) + 1
            raise AssertionError(f"probe {real} ran past 10 s") from None
        # a reader of a real run folder waits for rings until it is told to stop, as
        # ``probe record`` tells it: stopped so, it ends as any command does
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            OUTCOMES["hang"] = OUTCOMES.get("hang", 0) + 1
            raise AssertionError(f"probe {real} did not stop on SIGINT") from None
    # bytes: ``export --perfetto -`` writes a binary trace to stdout
    r = subprocess.CompletedProcess(
        proc.args, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    )
    assert "Traceback" not in r.stderr, (real, r.stderr[-3000:])
    if r.returncode == 0:
        kind = "exit 0"
        if real[:2] == ["report", "--json"] and len(real) == 2:
            rep = json.loads(r.stdout)
            rep.pop("recording")
            assert rep == _expected_report(), "a different report of the same recording"
    else:
        assert r.returncode in (1, 2), (real, r.returncode, r.stderr[-2000:])
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("probe: error: ")]
        assert len(errors) == 1, (real, r.stderr[-2000:])
        kind = f"exit {r.returncode}"
    # nothing created or changed outside the named output (and the rings folder)
    after = _listing(d)
    writes = ("--out", "-o", "--perfetto", "--prometheus-textfile")
    named = {real[i + 1] for i, a in enumerate(real[:-1]) if a in writes}
    named |= {output} if output else set()
    changed = {
        k
        for k in set(before) | set(after)
        if before.get(k) != after.get(k)
        and k not in named
        and not k.startswith("dir/")
        # the rings folder's own mtime moves with the session folders made and removed in it
        and not (k == "dir" and before.get(k, (0,))[0] == after.get(k, (1,))[0])
    }
    assert not changed, (real, sorted(changed))
    OUTCOMES[kind] = OUTCOMES.get(kind, 0) + 1
    return kind


@SETTINGS
@given(args=argv())
def test_cli_arguments_keep_the_invariant(tmp_path_factory: Any, args: list[str]) -> None:
    tmp = tmp_path_factory.mktemp("fz", numbered=True)
    run_case(_case_dir(tmp), args)


@SETTINGS
@given(
    how=st.sampled_from(["flip", "truncate", "overwrite"]),
    at=st.floats(min_value=0.0, max_value=1.0),
    blob=st.binary(min_size=1, max_size=64),
    cmd=st.sampled_from(
        [["report", "--json"], ["report"], ["doctor"], ["export", "--perfetto", "OUT"]]
    ),
)
def test_damaged_recordings_keep_the_invariant(
    tmp_path_factory: Any, how: str, at: float, blob: bytes, cmd: list[str]
) -> None:
    tmp = tmp_path_factory.mktemp("fz", numbered=True)
    d = _case_dir(tmp)
    p = d / "rec.probe.db"
    data = bytearray(p.read_bytes())
    i = int(at * (len(data) - 1))
    if how == "flip":
        for k, b in enumerate(blob[:4]):
            data[(i + k) % len(data)] ^= b or 1
    elif how == "truncate":
        del data[i:]
    else:
        data[i : i + len(blob)] = blob
    p.write_bytes(bytes(data))
    args = [*cmd, "REC"]
    if args[:2] == ["report", "--json"]:
        # a damaged file may not give the intact report; the invariant is the exit/one line
        args = ["report", "--json", "REC", "--width", "100"]
    run_case(d, args)


def teardown_module() -> None:
    print(f"\nfuzz outcomes ({EXAMPLES} examples per test): {json.dumps(OUTCOMES, sort_keys=True)}")


# -- the write path, signals and streams -------------------------------------------------------
# One guarded write path whatever the exporter (``--to NAME --out TARGET``) or the named
# flag; a target of any kind; a signal while the temporary exists; stdout or stderr closed,
# or a reader that leaves early. The invariant: exit 0, 1, 2, 128+signal or 141 (SIGPIPE);
# never a traceback; the target is a complete new regular file only on exit 0 (or the
# data on stdout), otherwise it is as it was; nothing else is left in its folder.

EXPORTERS = ["openmetrics", "perfetto", "prometheus", "rocpd", "otlp", "nope"]
WRITE_FLAGS = ["--openmetrics", "--perfetto", "--prometheus-textfile", "--rocpd"]
TARGETS = ["absent", "file", "symlink", "fifo", "dir", "device", "-", "name248", "name256"]
STREAMS = ["normal", "stdout closed", "stderr closed", "reader leaves"]
SIGNALS = [0, int(signal.SIGTERM), int(signal.SIGHUP), int(signal.SIGINT)]


def _target(d: Path, kind: str) -> str:
    if kind == "file":
        (d / "t.out").write_bytes(b"before")
    elif kind == "symlink":
        (d / "victim").write_bytes(b"victim")
        (d / "t.out").symlink_to(d / "victim")
    elif kind == "fifo":
        os.mkfifo(d / "t.out")
    elif kind == "dir":
        (d / "t.out").mkdir()
    elif kind == "device":
        try:
            os.mknod(d / "t.out", 0o666 | 0o020000, os.makedev(1, 3))  # a null device
        except PermissionError:
            return "t.out"  # not root: absent instead
    elif kind == "-":
        return "-"
    elif kind == "name248":
        return "n" * 245 + ".om"
    elif kind == "name256":
        return "n" * 256
    return "t.out"


def _state(d: Path) -> dict[str, tuple[int, bytes]]:
    out = {}
    for p in sorted(d.iterdir()):
        s = os.lstat(p)
        data = p.read_bytes() if p.is_file() and not p.is_symlink() and s.st_size < 64 else b""
        out[p.name] = (s.st_mode, data)
    return out


@SETTINGS
@given(
    how=st.sampled_from(["--to", "flag"]),
    exporter=st.sampled_from(EXPORTERS),
    flag=st.sampled_from(WRITE_FLAGS),
    target=st.sampled_from(TARGETS),
    force=st.booleans(),
    stream=st.sampled_from(STREAMS),
    sig=st.sampled_from(SIGNALS),
)
def test_the_write_path_signals_and_streams_keep_the_invariant(
    tmp_path_factory: Any,
    how: str,
    exporter: str,
    flag: str,
    target: str,
    force: bool,
    stream: str,
    sig: int,
) -> None:
    import time

    d = tmp_path_factory.mktemp("w")
    rec = d.parent / f"{d.name}.probe.db"
    shutil.copy(BUNDLED, rec)
    name = _target(d, target)
    if exporter == "otlp" and how == "--to":
        name = "http://127.0.0.1:1"  # a closed port
    out = ["--to", exporter, "--out", name] if how == "--to" else [flag, name]
    args = ["export", str(rec), *out, *(["--force"] if force else []), "--timeout", "2"]
    before = _state(d)
    line = " ".join(
        "'" + a.replace("'", "'\\''") + "'" for a in (sys.executable, "-m", "probe", *args)
    )
    redirect = {
        "normal": "",
        "stdout closed": ">&-",
        "stderr closed": "2>&-",
        "reader leaves": "| head -c 1 >/dev/null; exit ${PIPESTATUS[0]}",
    }[stream]
    proc = subprocess.Popen(
        [
            "bash",
            "-c",
            f"exec {line} {redirect}" if stream != "reader leaves" else f"{line} {redirect}",
        ],
        cwd=d,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PROBE_PROGRESS": "0"},
    )
    signalled = False
    if sig and stream != "reader leaves":
        for _ in range(20_000):  # until the temporary shows, or the command ends
            if proc.poll() is not None or any(n.startswith(".probe-") for n in os.listdir(d)):
                break
            time.sleep(0.001)
        if proc.poll() is None and any(n.startswith(".probe-") for n in os.listdir(d)):
            proc.send_signal(signal.SIGSTOP)
            proc.send_signal(sig)
            proc.send_signal(signal.SIGCONT)
            signalled = True
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        OUTCOMES["write: hang"] = OUTCOMES.get("write: hang", 0) + 1
        raise AssertionError(f"probe {args} {stream} did not end") from None
    rc = proc.returncode
    assert b"Traceback" not in stderr, (args, stream, stderr[-2000:])
    allowed = (
        {0, 1, 2}
        | ({128 + sig} if signalled else set())
        | ({141} if stream == "reader leaves" else set())
    )
    assert rc in allowed, (args, stream, sig, rc, stderr[-2000:])
    after = _state(d)
    t = name if name in after or name in before else None
    if rc == 0 and t is not None and name != "-":
        assert stat_is_regular(d / name), (args, after.get(name))
        assert {k: v for k, v in after.items() if k != name} == {
            k: v for k, v in before.items() if k != name
        }, (args, stream)
    else:
        assert after == before, (args, stream, sig, rc, sorted(set(after) ^ set(before)))
    if stream == "normal" and rc == 0 and name == "-":
        assert b"probe:" not in stdout[:200]
    kind = "exit 0" if rc == 0 else f"exit {rc}"
    if signalled:
        kind = f"signal {sig} -> exit {rc}"
    OUTCOMES[f"write: {kind}"] = OUTCOMES.get(f"write: {kind}", 0) + 1


def stat_is_regular(p: Path) -> bool:
    import stat as st_

    return st_.S_ISREG(os.lstat(p).st_mode)
