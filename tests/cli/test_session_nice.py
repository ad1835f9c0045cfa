"""``probe attach --session-nice N``: the attach in a session (autogroup) of its own with
nice N, so that on a host a saturated server keeps busy it is not left in the run queue
(docs/reliability.md, "The attach's session weight"). The fork, the new session, the
autogroup's nice, the exit status and signals through the parent, and the one-line errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from probe.reader import session
from probe.reader.session import AUTO_NICE, early, may_raise

ROOT = Path(__file__).resolve().parents[2]
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")
needs_autogroups = pytest.mark.skipif(
    not (AUTOGROUP.exists() and AUTOGROUP.read_text().strip() == "1"),
    reason="the kernel does not group by session",
)

CHILD = """
import os, signal, sys, time
import probe.cli.main
from probe.reader import session
started = os.getpid()
args = ["attach", "--url", "http://127.0.0.1:1"]
if sys.argv[1] != "default":
    args += ["--session-nice", sys.argv[1]]
if len(sys.argv) > 4:  # a kernel without session groups (its switch in a file)
    rc = session.raise_share(session.setting_value(sys.argv[1]), enabled_path=sys.argv[4])
else:
    rc = session.early(args)
if rc is None:  # where the attach would run
    light = "probe.reader.recording" not in sys.modules  # moved before the heavy imports
    group = open("/proc/self/autogroup").read().split() or ["root", "nice", "-"]
    signal.signal(signal.SIGWINCH, lambda *a: open(sys.argv[2] + ".winch", "w").close())
    signal.signal(signal.SIGINT, lambda *a: os._exit(9))  # as the attach handles it
    with open(sys.argv[2] + ".tmp", "w") as f:
        print(light, started, os.getpid(), os.getsid(0), group[0], group[2],
              os.getpriority(os.PRIO_PROCESS, 0), session.SHARE.replace(" ", "_"), file=f)
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    if sys.argv[3] == "sleep":
        time.sleep(30)
    os._exit(7)
print(f"parent rc {rc}", flush=True)
sys.exit(rc)
"""
Started = dict[str, str]


def _run(
    tmp_path: Path, nice: str, mode: str = "exit", how: str = "child", *extra: str
) -> subprocess.Popen[str]:
    """``how``: ``child`` (a script's child: no process group or session of its own),
    ``job`` (leads its process group, as a terminal's job does) or ``leader`` (leads its
    session already)."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, nice, str(tmp_path / "child"), mode, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        process_group=0 if how == "job" else None, start_new_session=how == "leader",
    )  # fmt: skip


def _started(tmp_path: Path) -> Started:
    keys = ["light", "started", "pid", "sid", "group", "group_nice", "nice", "share"]
    return dict(zip(keys, (tmp_path / "child").read_text().split(), strict=True))


def _own_group() -> str:
    # Empty where this process's session has the default (root) group, as under a
    # container's init: the kernel prints a line only for a session's own autogroup.
    return (Path("/proc/self/autogroup").read_text().split() or ["root"])[0]


@needs_autogroups
@pytest.mark.skipif(not may_raise(), reason="CAP_SYS_NICE")
def test_a_terminals_job_forks_and_the_attach_runs_in_a_session_of_its_own(
    tmp_path: Path,
) -> None:
    p = _run(tmp_path, "-3", how="job")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 7 and "parent rc 7" in out, err
    c = _started(tmp_path)
    assert c["light"] == "True"  # before the recording and command modules were imported
    assert c["pid"] != c["started"] and c["sid"] == c["pid"]  # a new session, led by the child
    assert c["group"].startswith("/autogroup-") and c["group"] != _own_group()
    assert (c["group_nice"], c["nice"]) == ("-3", "-3")


@needs_autogroups
@pytest.mark.skipif(not may_raise(), reason="CAP_SYS_NICE")
def test_a_scripts_child_moves_itself_and_keeps_its_pid(tmp_path: Path) -> None:
    """No terminal and no process group of its own: ``setsid`` in the process itself, so
    the pid a script started (and may signal, or find in ``probe ps``) is the attach's."""
    p = _run(tmp_path, "default")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 7 and "parent rc" not in out, err
    c = _started(tmp_path)
    assert c["pid"] == c["started"] == c["sid"]
    assert c["group"].startswith("/autogroup-") and c["group"] != _own_group()
    assert (c["group_nice"], c["nice"]) == (str(AUTO_NICE), str(AUTO_NICE))  # auto: raised
    assert c["share"] == f"a_session_of_its_own,_autogroup_nice_{AUTO_NICE}"


@needs_autogroups
def test_a_session_leader_only_sets_its_groups_nice(tmp_path: Path) -> None:
    p = _run(tmp_path, "4", how="leader")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 7 and "parent rc" not in out, err
    c = _started(tmp_path)
    assert c["pid"] == c["started"] == c["sid"]
    assert (c["group_nice"], c["nice"]) == ("4", "4")


def test_off_and_auto_without_the_right_run_as_started(tmp_path: Path) -> None:
    runs = [("off", [])]
    if os.geteuid() == 0 and shutil.which("setpriv"):
        runs.append(("default", ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice"]))
    for nice, prefix in runs:
        (tmp_path / "child").unlink(missing_ok=True)
        p = subprocess.run(
            [*prefix, sys.executable, "-c", CHILD, nice, str(tmp_path / "child"), "exit"],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert p.returncode == 7 and "parent rc" not in p.stdout, p.stderr
        c = _started(tmp_path)
        assert c["pid"] == c["started"] and c["sid"] == str(os.getsid(0)), nice  # not moved
        assert c["nice"] == str(os.getpriority(os.PRIO_PROCESS, 0)), nice
        if prefix:
            assert c["share"] == "as_started_(raising_it_needs_CAP_SYS_NICE)"


@pytest.mark.skipif(not may_raise(), reason="CAP_SYS_NICE")
def test_without_session_groups_the_attach_sets_its_own_nice(tmp_path: Path) -> None:
    off = tmp_path / "enabled"
    off.write_text("0\n")
    p = _run(tmp_path, "-2", "exit", "child", str(off))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 7 and "parent rc" not in out, err
    c = _started(tmp_path)
    assert c["pid"] == c["started"] and c["sid"] == str(os.getsid(0))  # no new session
    assert c["nice"] == "-2" and c["share"] == "nice_-2_(no_session_groups)"


def _state(pid: str) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@needs_autogroups
@pytest.mark.skipif(not may_raise(), reason="CAP_SYS_NICE")
def test_signals_to_a_jobs_parent_reach_the_attach_and_its_status_comes_back(
    tmp_path: Path,
) -> None:
    p = _run(tmp_path, "0", "sleep", "job")
    _wait_for(lambda: (tmp_path / "child").exists(), "the child did not start")
    child = _started(tmp_path)["pid"]
    p.send_signal(signal.SIGWINCH)  # a resize of the terminal
    _wait_for(lambda: (tmp_path / "child.winch").exists(), "SIGWINCH not forwarded")
    p.send_signal(signal.SIGTSTP)  # Ctrl-Z: both stop
    _wait_for(lambda: _state(child) == "T" and _state(str(p.pid)) == "T", "Ctrl-Z")
    p.send_signal(signal.SIGCONT)  # fg: both go on
    _wait_for(lambda: _state(child) == "S" and _state(str(p.pid)) == "S", "fg")
    p.send_signal(signal.SIGTERM)
    out, _err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM and f"parent rc {128 + signal.SIGTERM}" in out


@needs_autogroups
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="root + setpriv")
def test_a_raise_without_the_right_is_one_line_and_starts_nothing() -> None:
    p = subprocess.run(
        ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice", sys.executable, "-m",
         "probe", "attach", "--url", "http://127.0.0.1:1", "--duration", "1", "--no-live",
         "--session-nice", "-5"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert lines == [
        "probe: error: --session-nice -5: Operation not permitted (a value below the "
        "session's present one needs CAP_SYS_NICE, or root)"
    ]


@pytest.mark.parametrize("command", ["attach", "top"])
def test_a_nice_out_of_range_is_refused_before_anything(command: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "probe", command, "--url", "http://127.0.0.1:1",
         "--session-nice", "-21"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == (
        "probe: error: argument --session-nice: '-21': give a nice value from -20 to 19"
    )


def test_early_leaves_other_command_lines_to_the_parser() -> None:
    nice0, sid0 = os.getpriority(os.PRIO_PROCESS, 0), os.getsid(0)
    for argv in (
        [], ["report"], ["attach", "--session-nice", "x"], ["attach", "--session-nice", "-21"],
        ["attach", "--session-nice", "-5", "--help"], ["record", "--session-nice", "-5"],
        ["attach", "--session-nice", "off", "--", "--session-nice", "-5"],
        ["top", "--session-nice", "x"], ["top", "--session-nice", "-5", "--help"],
        ["top", "--session-nice", "off"], ["ps", "--session-nice", "-5"],
    ):  # fmt: skip
        assert early(argv) is None, argv  # nothing done: this process is pytest's
    assert os.getpriority(os.PRIO_PROCESS, 0) == nice0 and os.getsid(0) == sid0


@needs_autogroups
def test_the_command_line_attach_reports_in_the_child_and_returns_its_status() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "probe", "attach", "--url", "http://127.0.0.1:1",
         "--duration", "1", "--no-live", "--session-nice=2"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "probe: error: no process of this user listens on port 1 (http://127.0.0.1:1); is "
        "the server up?"
    ]


@needs_autogroups
@pytest.mark.parametrize("command", ["attach", "top"])
def test_called_from_a_program_that_leads_its_group_it_never_forks_under_it(command: str) -> None:
    prog = (
        "import os, sys\nfrom probe.cli import main as cli\n"
        f"rc = cli.main(['{command}', '--url', 'http://127.0.0.1:1', '--session-nice', '0'])\n"
        "print('host', os.getpid(), rc)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", prog], capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, process_group=0,
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.count("host") == 1 and p.stdout.split()[2] == "2"
    assert p.stderr.strip().splitlines() == [
        "probe: error: --session-nice 0: this process leads its process group (or has a "
        f"terminal), so only a fork could give it a session of its own; run probe {command} as "
        "a command"
    ]


@needs_autogroups
@pytest.mark.parametrize("command", ["attach", "top"])
def test_the_command_takes_its_share_before_the_parser_is_imported(command: str) -> None:
    prog = (
        "import sys\nfrom probe.cli import entry\nfrom probe.reader import session\n"
        "raise_share = session.raise_share\n"
        "def spy(*a, **k):\n"
        "    heavy = ('probe.cli.main', 'argparse', 'probe.cli.commands', 'sqlite3')\n"
        "    seen = [m for m in heavy if m in sys.modules]\n"
        "    r = raise_share(*a, **k)\n"
        "    print('before', seen, open('/proc/self/autogroup').read().split()[2], flush=True)\n"
        "    return r\n"
        "session.raise_share = spy\n"
        f"sys.argv = ['probe', '{command}', '--url', 'http://127.0.0.1:1', '--session-nice', '3']\n"
        "sys.exit(entry.main())\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", prog], capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert p.stdout.splitlines()[0] == "before [] 3", p.stdout + p.stderr
    assert p.returncode == 2 and "no process of this user listens on port 1" in p.stderr


@needs_autogroups
@pytest.mark.skipif(not may_raise(), reason="CAP_SYS_NICE")
def test_auto_goes_on_as_started_where_the_nice_cannot_be_written() -> None:
    """A read-only ``/proc``, say: ``auto`` never stops an attach (the meta says why); an
    explicit value is the user's, so the same failure is a one-line error."""
    prog = (
        "import errno, os, sys\nfrom probe.reader import session\n"
        "from probe.errors import UsageError\n"
        "def ro(nice, group):\n"
        "    raise OSError(errno.EROFS, os.strerror(errno.EROFS))\n"
        "session._set = ro\n"
        "setting = session.parse_setting(sys.argv[1])\n"
        "try:\n"
        "    print(session.raise_share(setting), session.MOVED, session.SHARE)\n"
        "except UsageError as exc:\n"
        "    print('error', exc)\n"
    )
    for how in ("child", "job"):
        out = {}
        for setting in ("auto", "-5"):
            p = subprocess.run(
                [sys.executable, "-c", prog, setting], capture_output=True, text=True, cwd=ROOT,
                timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
                process_group=0 if how == "job" else None,
            )  # fmt: skip
            out[setting] = p.stdout.strip().splitlines()
        # in the job's case the child goes on (and prints), the parent returns its status
        moved = "True a session of its own, " if how == "job" else "False "
        assert out["auto"][0] == f"None {moved}as started (nice -5: Read-only file system)", (
            how, out,
        )  # fmt: skip
        refused = "error --session-nice -5: Read-only file system"
        assert out["-5"][-1].startswith(refused), (how, out)


@needs_autogroups
@pytest.mark.skipif(not may_raise(), reason="CAP_SYS_NICE")
def test_a_ctrl_c_reaches_the_attach_even_where_sigint_was_ignored_at_the_start(
    tmp_path: Path,
) -> None:
    """A shell without job control starts background commands with SIGINT ignored; the
    attach handles SIGINT itself anyway, so the parent of the fork forwards it."""
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, "0", str(tmp_path / "child"), "sleep"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, process_group=0,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    _wait_for(lambda: (tmp_path / "child").exists(), "the child did not start")
    assert _started(tmp_path)["pid"] != str(p.pid)  # forked
    p.send_signal(signal.SIGINT)
    out, _err = p.communicate(timeout=30)
    assert p.returncode == 9 and "parent rc 9" in out


def test_the_run_queue_wait_is_read_from_schedstat(tmp_path: Path) -> None:
    """The second field of ``/proc/self/schedstat`` is the time runnable but not running,
    in ns; no file or no number: None (the attach then says nothing)."""
    f = tmp_path / "schedstat"
    f.write_text("812345678 4500000000 731\n")
    assert session.cpu_wait_s(str(f)) == 4.5
    f.write_text("812345678\n")
    assert session.cpu_wait_s(str(f)) is None
    f.write_text("a b c\n")
    assert session.cpu_wait_s(str(f)) is None
    assert session.cpu_wait_s(str(tmp_path / "none")) is None
    mine = session.cpu_wait_s()  # this process's own, where the kernel keeps it
    assert mine is None or mine >= 0.0


def test_a_reader_that_waited_for_a_cpu_says_so() -> None:
    """At least a second and a tenth of the time it ran: one line with both figures;
    less, or unknown: nothing."""
    note = session.wait_note(16.94, 32.41)
    assert note is not None and "waited 16.9 s of its 32.4 s for a CPU" in note
    assert "setsid -w sh -c 'echo -5 > /proc/self/autogroup" in note
    assert "\n" not in note
    assert session.wait_note(2.0, 5.0) is not None
    assert session.wait_note(0.9, 3.0) is None  # under a second
    assert session.wait_note(2.9, 30.0) is None  # under a tenth
    assert session.wait_note(None, 30.0) is None
