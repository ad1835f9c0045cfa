"""The figure queries of docs/fleet.md in a local Spark session, over the Parquet files of
a fleet's recordings (two hosts, the agent's ``host=/day=`` layout) read by the page's own
``probe_views``: each gives ``probe report --json``'s figure over the same folder.

Needs pyspark (the dev extra) and a Java runtime; skipped, saying which, without them.
One Spark session (``local[1]``, no UI) for the module.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import doc_queries, doc_spark_views, expected, in_order


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("pyspark") is None,
        reason="pyspark is not installed (pip install 'vllm-graph-probe[dev]')",
    ),
    pytest.mark.skipif(_java() is None, reason="no Java runtime (java on PATH or JAVA_HOME)"),
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


@pytest.fixture(scope="module")
def spark(fleet: Path) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .appName("probe-fleet-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.memory", "512m")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    doc_spark_views()(session, str(fleet))
    yield session
    session.stop()


@pytest.mark.parametrize("name", sorted(doc_queries()))
def test_doc_figure_in_spark_equals_the_report(name: str, rep: dict[str, Any], spark: Any) -> None:
    rows = [r.asDict() for r in spark.sql(doc_queries()[name]).collect()]
    want = expected(name, rep)
    assert want, name
    assert in_order(name, rows) == want


def test_spark_reads_host_and_day_from_the_folders(fleet: Path, spark: Any) -> None:
    got = spark.sql("SELECT DISTINCT host, CAST(day AS STRING) AS day FROM steps").collect()
    found = sorted((r["host"], r["day"]) for r in got)
    parts = sorted(
        (p.parent.parent.name.removeprefix("host="), p.parent.name.removeprefix("day="))
        for p in fleet.glob("host=*/day=*/*.probe")
    )
    assert found == parts and len({h for h, _ in found}) == 2
