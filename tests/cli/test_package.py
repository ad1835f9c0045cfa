"""The package a user installs: a wheel built from this tree with ``python -m build`` carries
the compiled hot path, the plugin's entry point and the bundled recording, and the README's
first command runs from it in a fresh environment.

Slow-ish (a build and two virtual environments, about two minutes) and it needs PyPI for
``build`` and the wheel's two dependencies (rich, numpy), as CI has: marked ``package``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.package, pytest.mark.timeout(900)]


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, env=env, timeout=800
    )
    assert r.returncode == 0, f"{cmd}: {r.stdout[-2000:]}{r.stderr[-4000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tree's committed and working files, built into a wheel by ``python -m build``."""
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src"
    files = _run("git", "ls-files", "-co", "--exclude-standard", cwd=ROOT).splitlines()
    for rel in files:
        if rel.startswith("tests/") or not (ROOT / rel).is_file():
            continue
        dst = src / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes((ROOT / rel).read_bytes())
    _run(sys.executable, "-m", "venv", tmp / "tools", cwd=tmp)
    _run(tmp / "tools/bin/python", "-m", "pip", "install", "-q", "build", cwd=tmp)
    _run(tmp / "tools/bin/python", "-m", "build", "--wheel", "-o", tmp / "dist", src, cwd=tmp)
    (whl,) = (tmp / "dist").glob("vllm_graph_probe-*.whl")
    return whl


def test_the_wheel_holds_the_compiled_path_the_plugin_and_the_recording(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (entry,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        points = z.read(entry).decode()
    assert any(n.startswith("probe/engine/accel/_accel.") and n.endswith(".so") for n in names)
    for table in ("recording.json", "steps.parquet", "spans.parquet", "builds.parquet"):
        assert f"probe/data/default.probe/{table}" in names
    assert "[vllm.general_plugins]\nvllm_graph_probe = probe.engine.plugin:register" in points
    assert "probe = probe.cli.entry:main" in points


def test_the_readmes_first_command_runs_from_the_wheel_in_a_fresh_venv(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    _run(venv / "bin/python", "-m", "pip", "install", "-q", wheel, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROBE_ACCEL")}
    out = _run(venv / "bin/probe", "report", "--width", "100", cwd=tmp_path, env=env)
    assert "forward steps         1,298" in out
    assert "decode steps with MTP (query length 2) ran PIECEWISE" in " ".join(out.split())
    where = _run(
        venv / "bin/python",
        "-c",
        "import probe, probe.engine.accel as a; print(probe.__file__, a.COMPILED)",
        cwd=tmp_path,
        env=env,
    ).split()
    assert where[0].startswith(str(venv)) and where[1] == "True"
    # the plugin's entry point is what vLLM looks up
    plugins = _run(
        venv / "bin/python",
        "-c",
        "from importlib.metadata import entry_points as e;"
        "print([p.value for p in e(group='vllm.general_plugins')])",
        cwd=tmp_path,
        env=env,
    )
    assert "probe.engine.plugin:register" in plugins
