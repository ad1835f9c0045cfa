"""The ``probe`` command as a user runs it: a subprocess, exit status and output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from probe.cli.main import default_recording


def probe(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probe", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


needs_bundled = pytest.mark.skipif(
    not default_recording().exists(), reason="bundled recording not there yet"
)


@needs_bundled
def test_report_default_recording() -> None:
    r = probe("report", "--width", "160")
    assert r.returncode == 0, r.stderr
    assert "backend_support_too_low" in r.stdout
    assert "Traceback" not in r.stderr


@needs_bundled
def test_report_json() -> None:
    r = probe("report", "--json")
    assert r.returncode == 0, r.stderr
    assert isinstance(json.loads(r.stdout), dict)


@needs_bundled
def test_doctor() -> None:
    r = probe("doctor")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def _usage_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("probe: error: ")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def test_report_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.probe.db"
    line = _usage_error(probe("report", str(path)))
    assert str(path) in line
    assert probe("report", str(path)).stderr.strip() == line


def test_report_text_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a recording\n")
    line = _usage_error(probe("report", str(path)))
    assert str(path) in line and "SQLite" in line
    assert probe("doctor", str(path)).stderr.strip() == line


def test_record_without_command(tmp_path: Path) -> None:
    r = probe("record", "--out", str(tmp_path / "x.probe.db"))
    line = _usage_error(r)
    assert "command" in line
    assert r.stderr.strip() == line
    _usage_error(probe("record"))  # argparse: --out is required


def test_record_bad_override(tmp_path: Path) -> None:
    out = tmp_path / "x.probe.db"
    r = probe("record", "--out", str(out), "--override", "Foo=BAR", "--", "true")
    line = _usage_error(r)
    assert "override" in line
    assert r.stderr.strip() == line
    assert not out.exists()


@pytest.mark.parametrize("spec", [":=NEVER", "vllm.x:=NEVER", ":Builder=NEVER", "a..b:C=NEVER"])
def test_an_override_without_a_module_or_class_is_refused(tmp_path: Path, spec: str) -> None:
    """``module:Class`` with either side empty or not a dotted name (found by the fuzz:
    ``:=NEVER`` parsed as module "" and class "", and failed only in the child)."""
    out = tmp_path / "x.probe.db"
    line = _usage_error(probe("record", "--out", str(out), "--override", spec, "--", "true"))
    assert "expected module:Class" in line
    assert not out.exists()


COMMANDS = sorted(
    p.stem
    for p in (Path(__file__).resolve().parents[2] / "probe" / "cli" / "commands").glob("*.py")
    if not p.stem.startswith("_")
)


def test_every_command_is_in_the_help_test() -> None:
    assert {"agent", "top", "record", "report", "attach", "ps"} <= set(COMMANDS)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_says_what_the_command_does(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    from probe.cli.main import main

    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    out = capsys.readouterr().out
    # argparse prints the description between the usage and the options
    between = out.split("\n\n")[1]
    assert not between.startswith(("options:", "positional arguments:")), out
    assert len(between.split()) >= 8


def test_the_version_is_the_packages() -> None:
    import tomllib

    import probe
    from probe.cli.commands import probe_version

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "probe.__version__"}
    assert probe_version() == probe.__version__
    assert probe.__version__[0].isdigit() and "unknown" not in probe.__version__


def test_the_bundled_recording_names_no_machine_path() -> None:
    from recordings import raw_rows

    db = raw_rows(default_recording())  # every row of every table, as SQL text
    try:
        dump = "\n".join(db.iterdump())
    finally:
        db.close()
    # and the folder's own text (its manifest: meta, processes, snapshots)
    dump += "".join(p.read_text() for p in default_recording().glob("*.json"))
    for prefix in ("/home/", "/root/", "/tmp/", "/work/"):
        assert prefix not in dump


def test_every_option_with_a_time_value_names_its_unit(capsys: pytest.CaptureFixture[str]) -> None:
    """``--rotate MIN`` says minutes: a metavar that reads as a unit is spelled out."""
    from probe.cli.main import main

    with pytest.raises(SystemExit):
        main(["agent", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--rotate MIN a new recording file every MIN minutes" in out
