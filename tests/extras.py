"""The optional extras a test needs, by the names pyproject.toml gives them.

A test that runs an exporter through ``probe``'s command line (or a hook against vLLM)
sees a missing extra as the command's usage error, not as an import error the conftest
could turn into a skip. So it says what it needs, and without that extra it is skipped
with the extra's name and the line that installs it; with the extra installed it runs
unchanged::

    pytestmark = needs("perfetto")                          # a module
    @needs("prometheus")                                    # a test
    pytest.param("--perfetto", marks=needs("perfetto"))     # one case
    require("otlp")                                         # inside a test, when known
"""

from __future__ import annotations

import importlib.util

import pytest

# extra -> the modules of it that the tests' code paths import
EXTRAS: dict[str, tuple[str, ...]] = {
    "perfetto": ("perfetto",),
    "prometheus": ("prometheus_client",),
    "otlp": (
        "opentelemetry.sdk",
        "opentelemetry.exporter.otlp.proto.http",
        "opentelemetry.exporter.otlp.proto.grpc",
    ),
    "parquet": ("pyarrow",),
    "vllm": ("vllm",),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is not installed
        return False


def missing(*extras: str) -> list[str]:
    """The extras among ``extras`` whose modules are not all installed."""
    return [e for e in extras if not all(_installed(m) for m in EXTRAS[e])]


def reason(absent: list[str]) -> str:
    names = " and ".join(f"the '{e}' extra" for e in absent)
    return f"needs {names}, not installed: pip install 'vllm-graph-probe[{','.join(absent)}]'"


def needs(*extras: str) -> pytest.MarkDecorator:
    """A mark that skips the test unless every one of ``extras`` is installed."""
    absent = missing(*extras)
    return pytest.mark.skipif(bool(absent), reason=reason(absent))


def require(*extras: str) -> None:
    """Skip the running test unless every one of ``extras`` is installed."""
    absent = missing(*extras)
    if absent:
        pytest.skip(reason(absent))
