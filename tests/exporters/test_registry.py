"""The exporter registry: one contract, an entry-point group, ``probe export --to NAME``."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from extras import needs

from exporters import registry
from exporters.base import ExportSink
from probe.cli.main import main
from probe.reader.recording import Recording, default_recording

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_registers_every_builtin_in_the_group() -> None:
    """The project's own entry points are the built-in table (they cannot drift)."""
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    group = eps[registry.GROUP]
    assert set(group) == set(registry.BUILTIN)
    for name, value in group.items():
        module, _, attr = value.partition(":")
        assert module == "exporters.registry"
        assert getattr(registry, attr) is registry.BUILTIN[name]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=needs(exp.extra) if exp.extra else ())
        for name, exp in sorted(registry.BUILTIN.items())
    ],
)
def test_every_builtin_has_the_contract(name: str) -> None:
    exp = registry.get(name)
    mod = exp.load()
    assert callable(mod.write)
    if exp.live:
        # the live half: a factory of collector sinks (on_process, on_steps, close)
        assert callable(mod.make_sink)
        sink_types = [
            v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, ExportSink)
        ]
        assert sink_types, f"{name}: no ExportSink"


def test_to_list_lists_every_exporter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--to", "list"]) == 0
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines()]
    assert names == sorted(registry.BUILTIN)


@pytest.mark.parametrize(
    "name",
    [
        "openmetrics",
        pytest.param("prometheus", marks=needs("prometheus")),
        pytest.param("perfetto", marks=needs("perfetto")),
        "rocpd",
    ],
)
def test_to_runs_each_file_exporter(name: str, tmp_path: Path) -> None:
    out = tmp_path / f"out.{name}"
    assert main(["export", "--to", name, "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    if name == "openmetrics":
        assert out.read_text().endswith("# EOF\n")
    elif name == "prometheus":
        assert "vllm_graph_probe_steps_total{" in out.read_text()
    elif name == "rocpd":
        # the side-car: one region per step at least, read back with the probe's reader
        from exporters.timelines.rocpd import read_rocpd

        prof = read_rocpd(out)
        n_steps = sum(1 for _ in Recording.open(default_recording()).iter_steps())
        assert sum(1 for m in prof.markers if m.name.startswith("step")) >= n_steps - 10
        with sqlite3.connect(out) as db:
            assert db.execute("select count(*) from sqlite_master").fetchone()[0] > 0


def test_unknown_exporter_names_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--to", "nosuch", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert "no exporter named 'nosuch'" in err and "openmetrics" in err and "rocpd" in err


def test_to_needs_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--to", "rocpd"]) == 2
    assert "--to rocpd needs --out FILE" in capsys.readouterr().err


def test_a_plugin_distribution_adds_an_exporter(tmp_path: Path) -> None:
    """A third-party package's entry point in the group is listed and run, found by
    importlib.metadata from its installed dist-info, as vLLM finds stat-logger plugins."""
    site = tmp_path / "site"
    (site / "probe_csv-0.1.dist-info").mkdir(parents=True)
    (site / "probe_csv-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: probe-csv\nVersion: 0.1\n"
    )
    (site / "probe_csv-0.1.dist-info" / "entry_points.txt").write_text(
        f"[{registry.GROUP}]\ncsv = probe_csv:EXPORTER\n"
    )
    (site / "probe_csv.py").write_text(
        textwrap.dedent(
            """
            from exporters.registry import Exporter

            EXPORTER = Exporter("csv", "one line per step", "FILE", "probe_csv")

            def write(recording, target):
                with open(target, "w") as f:
                    for s in recording.iter_steps():
                        f.write(f"{s.pid},{s.step},{s.host_ns}\\n")
            """
        )
    )
    env_path = f"{site}:{ROOT}"
    run = [sys.executable, "-m", "probe", "export", "--to"]
    listed = subprocess.run(
        [*run, "list"],
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[0] == "csv" for line in listed.stdout.splitlines())
    out = tmp_path / "steps.csv"
    ran = subprocess.run(
        [*run, "csv", "--out", str(out)],
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    n = sum(1 for _ in Recording.open(default_recording()).iter_steps())
    assert len(out.read_text().splitlines()) == n
