"""The generated dashboards type-check against Grafana's published types (``tsc --strict``).

``@grafana/schema`` (Grafana's dashboard and panel-plugin types) and ``typescript`` come
from the npm registry, installed by this test with ``npm`` into a temporary directory
(CI has the package registries, not a Grafana server: none installs here). Without
``npm`` the test is skipped and says so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from dashboards import schema_check
from dashboards.generate import DASHBOARDS

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
NPM = shutil.which("npm")


@pytest.fixture(scope="module")
def node_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if NPM is None:
        pytest.skip(
            "npm is not installed: the dashboards' check against @grafana/schema needs it "
            "(apt-get install npm)"
        )
    d = tmp_path_factory.mktemp("grafana-schema")
    out = subprocess.run(
        [NPM, "install", "--prefix", str(d), "--no-audit", "--no-fund", *schema_check.NPM_PACKAGES],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"npm install {schema_check.NPM_PACKAGES}: {out.stderr[-2000:]}"
    return d


def test_committed_dashboards_have_zero_type_errors(node_dir: Path) -> None:
    files = schema_check.write_harnesses(node_dir, ROOT / "dashboards")
    assert len(files) == len(DASHBOARDS)
    out = schema_check.tsc(node_dir, files)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_check_catches_what_grafana_would_not_load(node_dir: Path, tmp_path: Path) -> None:
    """An unknown panel option, a misspelt mapping type and a variable field the model
    lacks: each is an error, in the panel or place it is in."""
    build = DASHBOARDS["vllm_graph_probe_graphs.json"]
    d = build()
    d["panels"][0]["options"]["colourMode"] = "value"
    d["panels"][6]["fieldConfig"]["defaults"]["mappings"][0]["type"] = "specail"
    d["templating"]["list"][1]["definition"] = "label_values(x, job)"
    (tmp_path / "bad.json").write_text(json.dumps(d, indent=2))
    ts = node_dir / "bad.ts"
    ts.write_text(schema_check.harness("bad.json", (tmp_path / "bad.json").read_text()))
    out = schema_check.tsc(node_dir, [ts])
    assert out.returncode != 0
    text = out.stdout
    assert "colourMode" in text
    assert '"specail"' in text
    assert "definition" in text
