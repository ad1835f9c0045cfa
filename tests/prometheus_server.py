"""A real Prometheus (Debian 2.42's ``prometheus``; scripts/test installs it when root) for
the tests that query one, and the queries they send it."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from loopback import free_port, get_json, wait_for

PROMETHEUS = shutil.which("prometheus")
LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$")


def query(base: str, expr: str) -> dict[str, Any]:
    """An instant query; a Grafana ``label_values(metric, label)`` variable query goes to
    the label-values API, as Grafana sends it."""
    lv = LABEL_VALUES.match(expr)
    if lv:
        url = f"{base}/api/v1/label/{lv[2]}/values?" + urllib.parse.urlencode({"match[]": lv[1]})
    else:
        url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        return get_json(url)  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:  # 400/422 carry Prometheus's error as JSON
        return json.loads(exc.read())  # type: ignore[no-any-return]


def concrete(expr: str) -> str:
    """A dashboard query as Grafana would send it with every variable at "All"."""
    return re.sub(
        r"\$\{?(\w+)\}?",
        ".*",
        expr.replace("$__rate_interval", "1m").replace("$__range", "1h"),
    )


@contextlib.contextmanager
def prometheus_server(d: Any, targets: list[str]) -> Iterator[str]:
    """A real Prometheus on a loopback port scraping ``targets`` every second; its URL."""
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus)")
    (d / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: probe\n    static_configs:\n"
        f"      - targets: {targets!r}\n"
    )
    with running_prometheus(
        d, f"--storage.tsdb.path={d / 'data'}", "--web.enable-lifecycle"
    ) as base:
        yield base


@contextlib.contextmanager
def running_prometheus(d: Any, *flags: str) -> Iterator[str]:
    """Prometheus run with ``d/prometheus.yml`` and ``flags`` on a free loopback port, its
    log in ``d``; its URL once ready, stopped on leaving."""
    port = free_port()
    log = open(d / "prometheus.log", "wb")  # noqa: SIM115 (closed in teardown)
    proc = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={d / 'prometheus.yml'}",
            *flags,
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=1).status == 200,
            30,
            "prometheus to start",
        )
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
