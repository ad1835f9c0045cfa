"""The report names the user's own command, or says which probe command recorded it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from probe.cli.render_report import command_line

ROOT = Path(__file__).resolve().parents[2]


def test_a_recorded_command_is_shown_as_a_shell_line() -> None:
    meta = {"command": ["vllm", "serve", "m", "--tag", "a b"], "probe_command": ["probe", "record"]}
    assert command_line(meta) == ("command", "vllm serve m --tag 'a b'")


def test_the_probes_own_command_is_labelled_as_such() -> None:
    assert command_line({"command": ["collect", "/tmp/run4/rings"]}) == (
        "recorded by",
        "probe collect /tmp/run4/rings",
    )
    argv = ["probe", "attach", "--url", "http://127.0.0.1:8000"]
    assert command_line({"command": argv, "probe_command": argv})[0] == "recorded by"
    assert command_line({}) == ("command", "")


def test_the_bundled_report_says_who_recorded_it() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "probe", "report"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert "recorded by" in out.stdout and "probe collect" in out.stdout
    assert "['collect'" not in out.stdout


def test_a_local_model_folder_is_kept_by_its_name() -> None:
    from probe.engine.identity import model_name

    assert model_name("/home/me/models/tinyv32/") == "tinyv32"
    assert model_name("./tinyv32") == "tinyv32"
    assert model_name("deepseek-ai/DeepSeek-V3.2") == "deepseek-ai/DeepSeek-V3.2"
