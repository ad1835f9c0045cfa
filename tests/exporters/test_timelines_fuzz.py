"""Fuzz: mutated real profiles through ``probe merge``, one invariant for every case.

Seeds are real files from ``tests/data/profiles`` (a Kineto trace, rocprofv3 kernel and
API CSVs) and a rocpd database the side-car writer builds from real rocprofv3 rows. Each
case mutates one (bytes flipped, truncated, spliced; JSON values or CSV fields replaced)
and runs ``probe merge RECORDING PROFILE --out OUT --allow-unaligned`` in-process:

- exit 0, and OUT is a well-formed Perfetto trace holding exactly the kernels the
  profile's reader returns; or exit 1/2 with exactly one ``probe: error:`` line;
- never an exception out of ``main`` (a traceback), never more than 10 s;
- nothing created or changed outside OUT.

``$PROBE_FUZZ_EXAMPLES`` sets the number of cases (default 100: about 15 s here).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import signal
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perfetto_read import read_trace
from profiles_data import profile_path
from recordings import copy_recording

from exporters.timelines.load import load_profiles
from exporters.timelines.rocpd_writer import create_rocpd_db
from exporters.timelines.rocprofv3_csv import read_rocprofv3_csv
from probe.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
WINDOW = ROOT / "tests/data/groundtruth-window.probe"
EXAMPLES = int(os.environ.get("PROBE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("PROBE_FUZZ_RANDOM") != "1",
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LIMIT_S = 10


def _seed_rocpd() -> bytes:
    prof = read_rocprofv3_csv(profile_path("rocprofv3-csv", "rocm-systems-2025-08"))
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "seed_results.db"
        with create_rocpd_db(db, "3", machine_id="m", hostname="h") as w:
            w.add_profile(prof)
        return db.read_bytes()


@pytest.fixture(scope="module")
def seeds() -> dict[str, bytes]:
    kin = profile_path("kineto", "tracelens_vllm_decode_full_graph_execution_hipgraph.json.gz")
    csv_dir = profile_path("rocprofv3-csv", "rocprofiler-sdk-2024-10")
    return {
        "trace.json": gzip.decompress(kin.read_bytes()),
        "trace.json.gz": kin.read_bytes(),
        "kernel_trace.csv": (csv_dir / "kernel_trace.csv").read_bytes(),
        "hip_api_trace.csv": (csv_dir / "hip_runtime_trace.csv").read_bytes(),
        "results.db": _seed_rocpd(),
    }


_JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([float("nan"), float("inf"), -1.5, 1e300]),
    st.text(max_size=8),
    st.just([[[[[]]]]]),
    st.just({"a": {"b": {"c": []}}}),
)


@st.composite
def mutated(draw: st.DrawFn, name: str, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["flip", "truncate", "splice", "field"]))
    if kind == "truncate":
        return data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    if kind == "field" and name == "trace.json":
        doc = json.loads(data)
        events = doc["traceEvents"]
        for _ in range(draw(st.integers(1, 4))):
            e = events[draw(st.integers(0, len(events) - 1))]
            key = draw(st.sampled_from(["ts", "dur", "pid", "tid", "cat", "name", "args", "ph"]))
            e[key] = draw(_JSON_VALUES)
        return json.dumps(doc).encode()
    if kind == "field" and name.endswith(".csv"):
        lines = data.decode().splitlines()
        i = draw(st.integers(0, len(lines) - 1))
        cells = lines[i].split(",")
        j = draw(st.integers(0, len(cells) - 1))
        cells[j] = draw(st.sampled_from(["", "-1", "x", '"', "9" * 30, "1e5", "Agent -3"]))
        lines[i] = ",".join(cells)
        return ("\n".join(lines) + "\n").encode()
    if kind == "field" and name == "results.db":
        return _rocpd_field(data, draw)
    buf = bytearray(data)
    # rocpd: leave page 1 (header, schema) to other mutations half of the time
    lo = 100 if name == "results.db" and draw(st.booleans()) else 0
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(lo, len(buf) - 1))
        if kind == "flip":
            buf[i] = draw(st.integers(0, 255))
        else:
            buf[i:i] = draw(st.binary(min_size=1, max_size=16))
    return bytes(buf)


def _rocpd_field(data: bytes, draw: st.DrawFn) -> bytes:
    """One column of one table set to a drawn value (NULL, text, any 64-bit integer)."""
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "x.db"
        db.write_bytes(data)
        conn = sqlite3.connect(db)
        try:
            tables = [
                n
                for (n,) in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'rocpd_%'"
                )
            ]
            table = draw(st.sampled_from(sorted(tables)))
            cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]
            col = draw(st.sampled_from(cols))
            value = draw(
                st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=6))
            )
            conn.execute("PRAGMA ignore_check_constraints = ON")
            conn.execute(f'UPDATE OR IGNORE "{table}" SET "{col}" = ?', (value,))
            conn.commit()
        except sqlite3.IntegrityError:  # NOT NULL: the seed stays as it was
            conn.rollback()
        finally:
            conn.close()
        return db.read_bytes()


def _tree(d: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def fire(*_: Any) -> None:
        raise TimeoutError(f"probe merge ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _run_case(name: str, blob: bytes) -> int:
    base = Path(tempfile.mkdtemp(prefix="probe-fuzz-"))
    (base / "in").mkdir(parents=True)
    rec = copy_recording(WINDOW, base / "in" / "run.probe")
    prof = base / "in" / name
    prof.write_bytes(blob)
    out = base / "out" / "merged.pftrace"
    out.parent.mkdir()
    before = _tree(base)
    err = io.StringIO()
    try:
        with (
            _deadline(LIMIT_S),
            contextlib.redirect_stderr(err),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            code = main(["merge", str(rec), str(prof), "--out", str(out), "--allow-unaligned"])
        after = _tree(base)
        created = {k: v for k, v in after.items() if before.get(k) != v}
        assert set(created) <= {"out/merged.pftrace"}, f"files touched: {sorted(created)}"
        if code == 0:
            assert out.exists()
            (profile,) = load_profiles([prof])  # what the reader says this input holds
            tr = read_trace(out)  # balanced, declared tracks
            assert len(tr.by_category("kernel")) == len(profile.kernels)
            assert tr.clock_ids <= {6}
        else:
            assert code in (1, 2), code
            lines = err.getvalue().strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("probe: error: "), err.getvalue()
            assert not out.exists()
        return code
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(
    "name", ["trace.json", "trace.json.gz", "kernel_trace.csv", "hip_api_trace.csv", "results.db"]
)
def test_seed_merges(seeds: dict[str, bytes], name: str) -> None:
    """The unmutated seeds go through the same invariant (and merge: exit 0)."""
    assert _run_case(name, seeds[name]) == 0


@FUZZ
@given(data=st.data())
def test_mutated_profiles_through_probe_merge(seeds: dict[str, bytes], data: Any) -> None:
    name = data.draw(st.sampled_from(sorted(seeds)))
    _run_case(name, data.draw(mutated(name, seeds[name])))
