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
from pathlib import Path

import pytest

from probe.errors import UsageError
from probe.session import early, in_own_session

ROOT = Path(__file__).resolve().parents[1]
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")
needs_autogroups = pytest.mark.skipif(
    not (AUTOGROUP.exists() and AUTOGROUP.read_text().strip() == "1"),
    reason="the kernel does not group by session",
)

CHILD = """
import os, sys, time
import probe.cli
from probe import session
parent = os.getpid()
rc = session.early(["attach", "--url", "http://127.0.0.1:1", "--session-nice", sys.argv[1]])
if rc is None:  # the child: where the attach would run
    light = "probe.recording" not in sys.modules  # moved before the heavy imports
    group = open("/proc/self/autogroup").read()
    with open(sys.argv[2], "w") as f:
        f.write(f"{light} {parent} {os.getpid()} {os.getsid(0)} {group}")
    if sys.argv[3] == "sleep":
        time.sleep(30)
    os._exit(7)
print(f"parent rc {rc}", flush=True)
sys.exit(rc)
"""


def _run(tmp_path: Path, nice: int, mode: str = "exit") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(nice), str(tmp_path / "child"), mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@needs_autogroups
def test_the_attach_runs_in_a_session_of_its_own_with_that_nice(tmp_path: Path) -> None:
    p = _run(tmp_path, 3)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 7 and "parent rc 7" in out, err
    light, parent, child, sid, group = (tmp_path / "child").read_text().split(maxsplit=4)
    assert light == "True"  # before the recording and command modules were imported
    assert child != parent and sid == child  # a new session, led by the child
    name, nice = group.split()[0], group.split()[2]
    assert nice == "3"
    # Empty where this process's session has the default (root) group, as under a
    # container's init: the kernel prints a line only for a session's own autogroup.
    own = (Path("/proc/self/autogroup").read_text().split() or ["root"])[0]
    assert name.startswith("/autogroup-") and name != own  # another group than the starter's


@needs_autogroups
def test_a_signal_to_the_parent_reaches_the_attach_and_its_status_comes_back(
    tmp_path: Path,
) -> None:
    p = _run(tmp_path, 0, "sleep")
    for _ in range(200):
        if (tmp_path / "child").exists():
            break
        time.sleep(0.05)
    assert (tmp_path / "child").exists()
    p.send_signal(signal.SIGTERM)
    out, _err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM and f"parent rc {128 + signal.SIGTERM}" in out


def test_a_kernel_without_session_groups_is_a_usage_error(tmp_path: Path) -> None:
    off = tmp_path / "enabled"
    off.write_text("0\n")
    with pytest.raises(UsageError, match="does not share the CPU by session"):
        in_own_session(-5, str(off))
    with pytest.raises(UsageError, match="does not share the CPU by session"):
        in_own_session(-5, str(tmp_path / "missing"))


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


def test_a_nice_out_of_range_is_refused_before_anything() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "probe", "attach", "--url", "http://127.0.0.1:1",
         "--session-nice", "-21"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == (
        "probe: error: argument --session-nice: '-21': give a nice value from -20 to 19"
    )


def test_early_leaves_other_command_lines_to_the_parser() -> None:
    for argv in (
        [], ["report"], ["attach", "--url", "x"], ["attach", "--session-nice", "x"],
        ["attach", "--session-nice", "-21"], ["attach", "--session-nice", "-5", "--help"],
        ["record", "--session-nice", "-5"], ["attach", "--", "--session-nice", "-5"],
    ):  # fmt: skip
        assert early(argv) is None, argv  # no fork: nothing to wait for


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
