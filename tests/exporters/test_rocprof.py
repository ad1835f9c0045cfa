"""rocprofv3 CSV/JSON readers, the rocpd writer and reader, and the roctx emitter.

Real files come from ``tests/data/profiles`` (see ``SOURCES.md`` there). No public rocpd
database exists, so the rocpd databases used here are BUILT BY THIS PROJECT's schema code
(:func:`exporters.timelines.rocpd_writer.create_rocpd_db`) and filled from the real rocprofv3
CSV rows; ``test_rocpd_amd.py`` builds them with AMD's own SQL.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import sqlite3
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from profiles_data import profile_path

from exporters.timelines.analyses import count_graph_launches, kernels_by_launch, launch_delays
from exporters.timelines.model import GpuKernel, HostCall, Marker, Profile, ProfileError
from exporters.timelines.rocpd import read_rocpd
from exporters.timelines.rocpd_writer import (
    CREATED_BY,
    DEFAULT_SPAN_CATEGORY,
    create_rocpd_db,
    write_rocpd_regions,
)
from exporters.timelines.rocprofv3_csv import read_rocprofv3_csv
from exporters.timelines.rocprofv3_json import read_rocprofv3_json
from probe.engine.markers import RoctxEmitter, RoctxUnavailableError

ROCPD_LAYOUTS = ("3", "4.1.0")  # one version of each layout the writer writes

CSV = "rocprofv3-csv"
DOC_2024 = f"{CSV}/rocprofiler-sdk-2024-10"
DOC_2025 = f"{CSV}/rocm-systems-2025-08"
VIEWER = f"{CSV}/rocprof-unified-viewer"
GUID = "0000ddb5-8903-7903-b269-cd8d3745bb8a"  # the guid of the real rocpd-to-csv.csv rows


def _csv(*parts: str) -> Profile:
    return read_rocprofv3_csv(profile_path(*parts))


# ----------------------------------------------------------------------------- CSV


def test_old_kernel_trace_columns_numeric_agent_no_stream() -> None:
    p = _csv(DOC_2024, "kernel_trace.csv")
    # SOURCES.md says 8 dispatches; the file has 7 data rows and a trailing newline.
    assert len(p.kernels) == 7
    assert p.meta["kernel_column_sets"] == ["old"]
    first = p.kernels[0]
    assert first == GpuKernel(
        name="void addition_kernel<float>(float*, float const*, float const*, int, int)",
        start_ns=8819330200067564,
        end_ns=8819330200116308,
        device=1,
        stream=None,
        correlation_id=1451,
        pid=None,
        tid=69,
        queue=1,
    )
    assert {k.queue for k in p.kernels} == {1, 2, 3, 4}


def test_new_kernel_trace_columns_agent_text() -> None:
    p = _csv(DOC_2025, "kernel_trace.csv")
    assert len(p.kernels) == 9
    assert p.meta["kernel_column_sets"] == ["new"]
    assert {k.device for k in p.kernels} == {4}  # "Agent 4"
    assert {k.stream for k in p.kernels} == {1, 2, 3, 4}
    assert [k.correlation_id for k in p.kernels] == [1, 2, 3, 4, 5, 6, 11, 12, 13]
    truncated = _csv(DOC_2025, "kernel_trace_truncated.csv")
    assert [k.name for k in truncated.kernels] == [
        "addition_kernel",
        "subtract_kernel",
        "multiply_kernel",
        "divide_kernel",
    ]


def test_hip_runtime_trace_2024_and_2025_differ_only_in_domain() -> None:
    old = _csv(DOC_2024, "hip_runtime_trace.csv")
    new = _csv(DOC_2025, "hip_runtime_trace.csv")
    assert len(old.host_calls) == len(new.host_calls) == 8
    assert {c.domain for c in old.host_calls} == {"HIP_RUNTIME_API"}
    assert {c.domain for c in new.host_calls} == {"HIP_RUNTIME_API_EXT"}
    assert [dataclasses.replace(c, domain="") for c in old.host_calls] == [
        dataclasses.replace(c, domain="") for c in new.host_calls
    ]
    launch = next(c for c in new.host_calls if c.name == "hipLaunchKernel")
    assert (launch.pid, launch.tid, launch.correlation_id) == (238, 238, 5)
    assert launch.duration_ns == 1191916548408842 - 1191916547842972


def test_hip_trace_mixes_compiler_and_runtime_domains() -> None:
    p = _csv(DOC_2025, "hip_trace.csv")
    domains = collections.Counter(c.domain for c in p.host_calls)
    assert domains == {"HIP_COMPILER_API_EXT": 5, "HIP_RUNTIME_API_EXT": 12}


def test_marker_trace_ranges_and_instants() -> None:
    p = _csv(DOC_2024, "marker_api_trace.csv")
    assert not p.host_calls and not p.kernels
    assert len(p.markers) == 5
    assert {m.category for m in p.markers} == {"MARKER_CORE_API"}
    instants = [m.name for m in p.markers if m.start_ns == m.end_ns]
    assert instants == ["before hipLaunchKernel", "after hipLaunchKernel"]
    cross_thread = next(m for m in p.markers if m.name == "hipLaunchKernel range")
    assert (cross_thread.pid, cross_thread.tid) == (717, 0)
    assert _csv(DOC_2025, "marker_api_trace.csv").markers == p.markers


def test_rocpd_converted_csv_with_guid_column() -> None:
    p = _csv(DOC_2025, "rocpd-to-csv.csv")
    assert len(p.host_calls) == 13
    assert p.meta["guids"] == [GUID]
    assert p.host_calls[-1] == HostCall(
        "hipFree", "HIP_RUNTIME_API_EXT", 3719662428491354, 3719662428514084, 137, 137, 13
    )


def test_quote_all_files_and_graph_launch_kernels() -> None:
    prefill = read_rocprofv3_csv(
        [
            profile_path(VIEWER, "prefill_kernel_trace.csv"),
            profile_path(VIEWER, "prefill_hip_api_trace.csv"),
        ]
    )
    assert len(prefill.kernels) == 1128
    assert len(prefill.host_calls) == 5
    assert {k.stream for k in prefill.kernels} == {1, 2}
    assert count_graph_launches(prefill) == 3
    # The fixture keeps a subset of dispatches: only the second replay's kernels are in it.
    by_launch = {corr: len(ks) for corr, ks in kernels_by_launch(prefill).items()}
    assert by_launch == {57175: 0, 57328: 1123, 57482: 0}
    assert all(k.pid == 3985093 for k in prefill.kernels)  # from the API rows' thread id
    assert prefill.meta["kernel_pid_from_api_rows"] == 1128
    graph = next(d for d in launch_delays(prefill) if d.is_graph_launch)
    assert graph.kernel_count == 1123
    assert graph.start_to_start_ns == 90754858086907 - 90754858074746

    decode = _csv(VIEWER)  # the whole folder: decode and prefill together
    assert len(decode.kernels) == 144 + 1128
    assert len(decode.host_calls) == 920 + 5
    # SOURCES.md lists no graph launch for decode, but its API rows hold one hipGraphLaunch
    # (correlation 64168) and 24 of its kernels share that id.
    assert count_graph_launches(decode) == 4
    assert len(kernels_by_launch(decode)[64168]) == 24


def test_directory_skips_non_trace_files() -> None:
    p = _csv(DOC_2025)
    skipped = sorted(Path(f).name for f in p.meta["skipped_files"])
    assert skipped == [
        "counter_collection.csv",
        "memory_allocation_trace.csv",
        "memory_copy_trace.csv",
        "scratch_memory_trace.csv",
    ]
    assert len(p.kernels) == 9 + 4
    assert len(p.markers) == 5


def _copy_rows(src: Path, dst: Path, transform: Callable[[list[str]], list[str]]) -> Path:
    lines = src.read_text(encoding="utf-8").splitlines()
    dst.write_text("\n".join(transform(lines)) + "\n", encoding="utf-8")
    return dst


def test_missing_columns_are_listed(tmp_path: Path) -> None:
    src = profile_path(DOC_2025, "kernel_trace.csv")
    bad = _copy_rows(
        src,
        tmp_path / "kernel_trace.csv",
        lambda ls: [ls[0].replace('"Correlation_Id","Start_Timestamp",', "")],
    )
    with pytest.raises(ProfileError) as err:
        read_rocprofv3_csv(bad)
    assert err.value.path == str(bad)
    assert "Correlation_Id, Start_Timestamp" in str(err.value)
    assert str(bad) in str(err.value)

    api = _copy_rows(
        profile_path(DOC_2025, "hip_trace.csv"),
        tmp_path / "hip_api_trace.csv",
        lambda ls: [ls[0].replace('"Process_Id",', "")],
    )
    with pytest.raises(ProfileError, match=r"missing required column.*Process_Id"):
        read_rocprofv3_csv(api)


def test_bad_csv_inputs(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="not a rocprofv3 kernel or API trace"):
        read_rocprofv3_csv(profile_path(DOC_2024, "hip_api_stats.csv"))
    with pytest.raises(ProfileError, match="no such file"):
        read_rocprofv3_csv(tmp_path / "kernel_trace.csv")
    empty = tmp_path / "empty_kernel_trace.csv"
    empty.write_text("")
    with pytest.raises(ProfileError, match="empty file"):
        read_rocprofv3_csv(empty)
    src = profile_path(DOC_2025, "hip_trace.csv").read_text()
    cut = tmp_path / "hip_trace.csv"
    cut.write_text(src[: src.index("hipSetDevice") + 20])  # a file cut mid-row
    with pytest.raises(ProfileError, match=r"line 8 has \d+ fields"):
        read_rocprofv3_csv(cut)
    notint = tmp_path / "hip_api_trace.csv"
    notint.write_text(src.replace("15,15,6,", "15,x15,6,"))
    with pytest.raises(ProfileError, match="line 7, column Thread_Id: 'x15' is not an integer"):
        read_rocprofv3_csv(notint)
    binary = tmp_path / "kernel_trace.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProfileError, match="not UTF-8"):
        read_rocprofv3_csv(binary)
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    with pytest.raises(ProfileError, match="no rocprofv3 kernel or API trace CSV found"):
        read_rocprofv3_csv(nothing)


# ----------------------------------------------------------------------------- JSON


@pytest.fixture(scope="module")
def rocprof_json() -> Profile:
    return read_rocprofv3_json(profile_path("rocprofv3-json", "908_results.json.gz"))


def test_rocprofv3_json_kernels(rocprof_json: Profile) -> None:
    p = rocprof_json
    assert len(p.kernels) == 43915
    assert p.meta["unresolved_kernel_ids"] == 0
    assert not p.host_calls and not p.markers  # kernel-trace-only capture
    assert p.kernels[0] == GpuKernel(
        name="__amd_rocclr_copyBuffer",
        start_ns=63857982592000,
        end_ns=63857982594840,
        device=2,  # logical_node_id of agent handle 37946, the first MI350X
        stream=0,
        correlation_id=1,
        pid=908,
        tid=908,
        queue=16,
    )
    assert {k.device for k in p.kernels} == {2}
    tids = collections.Counter(k.tid for k in p.kernels)
    assert tids == {1229: 26551, 908: 14787, 973: 2019, 997: 558}
    assert collections.Counter(k.stream for k in p.kernels).most_common(1) == [(567, 37300)]
    names = collections.Counter(k.name for k in p.kernels)
    assert names["__amd_rocclr_fillBufferAligned"] == 3213
    assert len({k.correlation_id for k in p.kernels}) == 43915
    (proc,) = p.meta["processes"]
    assert proc["pid"] == 908
    assert sum(a["type"] == 2 for a in proc["agents"]) == 8


def _synthetic_tool_json() -> dict[str, Any]:
    """A small rocprofv3 JSON document BUILT BY THIS TEST in the real file's layout.

    The real capture has no hip_api or marker_api records, so these sections are written
    here: strings.buffer_records is indexed by the buffer-tracing kind enum, and
    strings.marker_api is a cereal map ([{"key": corr, "value": message}]).
    """
    kinds = [{"kind": "NONE", "operations": []}] * 5 + [
        {"kind": "HIP_RUNTIME_API", "operations": ["hipGraphLaunch", "hipLaunchKernel"]},
        {"kind": "HIP_COMPILER_API", "operations": []},
        {"kind": "MARKER_CORE_API", "operations": ["roctxMarkA", "roctxRangePushA"]},
    ]
    corr = {"internal": 7, "external": 0}
    return {
        "rocprofiler-sdk-tool": [
            {
                "metadata": {"pid": 42},
                "agents": [{"id": {"handle": 9}, "type": 2, "node_id": 3, "logical_node_id": 1}],
                "kernel_symbols": [{"kernel_id": 5, "formatted_kernel_name": "k"}],
                "strings": {
                    "buffer_records": kinds,
                    "marker_api": [{"key": 8, "value": "step 1"}],
                },
                "buffer_records": {
                    "kernel_dispatch": [
                        {
                            "thread_id": 43,
                            "correlation_id": corr,
                            "start_timestamp": 150,
                            "end_timestamp": 160,
                            "dispatch_info": {
                                "agent_id": {"handle": 9},
                                "queue_id": {"handle": 2},
                                "kernel_id": 5,
                            },
                            "stream_id": {"handle": 1},
                        }
                    ],
                    "hip_api": [
                        {
                            "kind": 5,
                            "operation": 0,
                            "thread_id": 43,
                            "correlation_id": corr,
                            "start_timestamp": 100,
                            "end_timestamp": 120,
                        }
                    ],
                    "marker_api": [
                        {
                            "kind": 7,
                            "operation": 1,
                            "thread_id": 43,
                            "correlation_id": {"internal": 8, "external": 0},
                            "start_timestamp": 90,
                            "end_timestamp": 200,
                        },
                        {
                            "kind": 7,
                            "operation": 0,
                            "thread_id": 43,
                            "correlation_id": {"internal": 9, "external": 0},
                            "start_timestamp": 95,
                            "end_timestamp": 95,
                        },
                    ],
                },
            }
        ]
    }


def test_rocprofv3_json_api_and_marker_records(tmp_path: Path) -> None:
    path = tmp_path / "42_results.json"
    path.write_text(json.dumps(_synthetic_tool_json()))
    p = read_rocprofv3_json(path)
    assert p.host_calls == (HostCall("hipGraphLaunch", "HIP_RUNTIME_API", 100, 120, 42, 43, 7),)
    assert p.markers == (Marker("step 1", 90, 200, 42, 43, "MARKER_CORE_API"),)
    assert p.meta["marker_records_without_message"] == 1
    assert p.kernels == (GpuKernel("k", 150, 160, 1, 1, 7, 42, 43, queue=2),)
    assert {c: len(k) for c, k in kernels_by_launch(p).items()} == {7: 1}


def test_rocprofv3_json_bad_inputs(tmp_path: Path) -> None:
    real = profile_path("rocprofv3-json", "908_results.json.gz").read_bytes()
    truncated = tmp_path / "908_results.json.gz"
    truncated.write_bytes(real[: len(real) // 3])
    with pytest.raises(ProfileError, match="truncated gzip") as err:
        read_rocprofv3_json(truncated)
    assert err.value.path == str(truncated)
    other = tmp_path / "other.json"
    other.write_text('{"traceEvents": []}')
    with pytest.raises(ProfileError, match="no top-level 'rocprofiler-sdk-tool' key"):
        read_rocprofv3_json(other)
    doc = _synthetic_tool_json()
    del doc["rocprofiler-sdk-tool"][0]["buffer_records"]["kernel_dispatch"][0]["start_timestamp"]
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps(doc))
    with pytest.raises(
        ProfileError, match=r"kernel_dispatch\[0\]: missing field 'start_timestamp'"
    ):
        read_rocprofv3_json(missing)
    text = tmp_path / "notjson.json"
    text.write_text("rocprofv3 crashed\n")
    with pytest.raises(ProfileError, match="not JSON"):
        read_rocprofv3_json(text)


# ----------------------------------------------------------------------------- rocpd

# (id, folders/files whose real CSV rows fill the database)
DATASETS = {
    "rocprofiler-sdk-2024-10": [DOC_2024],
    "rocm-systems-2025-08": [DOC_2025],
    "viewer-decode": [
        f"{VIEWER}/decode_kernel_trace.csv",
        f"{VIEWER}/decode_hip_api_trace.csv",
    ],
    "viewer-prefill": [
        f"{VIEWER}/prefill_kernel_trace.csv",
        f"{VIEWER}/prefill_hip_api_trace.csv",
    ],
}


def _expected_after(layout: str, kernels: tuple[GpuKernel, ...]) -> tuple[GpuKernel, ...]:
    if layout != "3":
        return kernels
    # rocpd 3.x declares rocpd_kernel_dispatch.stream_id NOT NULL; rocprofv3 writes the
    # default stream 0 for a dispatch without one, and so does the writer.
    return tuple(dataclasses.replace(k, stream=0) if k.stream is None else k for k in kernels)


@pytest.mark.parametrize("layout", ROCPD_LAYOUTS)
@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_rocpd_built_from_real_csv_reads_back_equal(
    tmp_path: Path, layout: str, dataset: str
) -> None:
    csv_profile = read_rocprofv3_csv([profile_path(*part.split("/")) for part in DATASETS[dataset]])
    db_path = tmp_path / "built_by_project_results.db"
    with create_rocpd_db(db_path, layout, guid=GUID, machine_id="m", hostname="h") as db:
        db.add_profile(csv_profile)
    back = read_rocpd(db_path)
    assert back.meta["schema_version"] == layout
    assert back.meta["created_by"] == [CREATED_BY]
    assert back.kernels == _expected_after(layout, csv_profile.kernels)
    assert back.host_calls == csv_profile.host_calls
    assert back.markers == csv_profile.markers
    assert len(back.kernels) + len(back.host_calls) + len(back.markers) > 0


@pytest.mark.parametrize("layout", ROCPD_LAYOUTS)
def test_rocpd_schema_shape(tmp_path: Path, layout: str) -> None:
    """The built-in schema: 3.x tables carry the uuid suffix and have one pass-through view
    each (AMD's rocpd_views.sql); 4.1.0 tables are unsuffixed, as AMD's 4.1.0 views need."""
    db_path = tmp_path / "shape.db"
    create_rocpd_db(db_path, layout, guid=GUID, machine_id="m", hostname="h").close()
    conn = sqlite3.connect(db_path)
    objects = dict(
        conn.execute("SELECT name, type FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
    )
    suffix = "_" + GUID.replace("-", "_") if layout == "3" else ""
    tables = sorted(n for n, t in objects.items() if t == "table")
    assert all(t.endswith(suffix) for t in tables)
    assert len(tables) == (20 if layout == "3" else 26)
    views = {n for n, t in objects.items() if t == "view"}
    assert views == ({t[: -len(suffix)] for t in tables} if suffix else set())
    cols = [r[1] for r in conn.execute(f"PRAGMA table_info(`rocpd_region{suffix}`)")]
    if layout == "4.1.0":
        assert "rocpd_info_category" in tables
        assert "track_id" in cols and "pid" not in cols
    else:
        assert {"nid", "pid", "tid", "start", "end"} <= set(cols)
    meta = dict(conn.execute("SELECT tag, value FROM rocpd_metadata"))
    assert meta["schema_version"] == layout
    assert meta["guid"] == GUID and meta["uuid"] == suffix
    for view in sorted(views):  # every view must be queryable
        conn.execute(f"SELECT * FROM `{view}` LIMIT 1").fetchall()
    conn.close()


@pytest.mark.parametrize("layout", ROCPD_LAYOUTS)
def test_rocpd_rows_follow_rocprofv3_conventions(tmp_path: Path, layout: str) -> None:
    """stack_id holds the internal correlation id, correlation_id the external one (0)."""
    p = _csv(DOC_2025, "kernel_trace.csv")
    db_path = tmp_path / "conv.db"
    with create_rocpd_db(db_path, layout, guid=GUID, machine_id="m") as db:
        db.add_kernels(p.kernels)
    conn = sqlite3.connect(db_path)
    rows = conn.execute("SELECT stack_id, correlation_id FROM rocpd_event ORDER BY id").fetchall()
    assert [r[0] for r in rows] == [k.correlation_id for k in p.kernels]
    assert {r[1] for r in rows} == {0}
    conn.close()
    assert {k.device for k in read_rocpd(db_path).kernels} == {4}


@dataclasses.dataclass(frozen=True)
class ProbeSpan:
    """Stand-in for a probe record type: only the attribute names matter."""

    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    category: str


@pytest.mark.parametrize("layout", ROCPD_LAYOUTS)
def test_side_car_spans_merge_with_rocprof_rows(tmp_path: Path, layout: str) -> None:
    rocprof = _csv(DOC_2025, "rocpd-to-csv.csv")
    launch = next(c for c in rocprof.host_calls if c.name == "hipLaunchKernel")
    spans = [
        ProbeSpan("step 7 FULL bs=32", launch.start_ns - 1000, launch.end_ns + 1000, 137, 137, ""),
        ProbeSpan("dispatch", launch.start_ns - 500, launch.start_ns - 10, 137, 137, "PROBE_PHASE"),
        ProbeSpan("reorder: unchanged", launch.start_ns - 600, launch.start_ns - 600, 137, 137, ""),
    ]
    db_path = tmp_path / "probe_results.db"
    with create_rocpd_db(db_path, layout, machine_id="m") as db:
        db.add_host_calls(rocprof.host_calls)
        assert write_rocpd_regions(db, spans) == 3
        db.add_markers([Marker("roctx range", 1, 2, 137, 138, "MARKER_CORE_RANGE_API")])
    back = read_rocpd(db_path)
    assert back.host_calls == rocprof.host_calls
    default = DEFAULT_SPAN_CATEGORY
    expected = [
        Marker("roctx range", 1, 2, 137, 138, "MARKER_CORE_RANGE_API"),
        Marker(spans[0].name, spans[0].start_ns, spans[0].end_ns, 137, 137, default),
        Marker(spans[2].name, spans[2].start_ns, spans[2].end_ns, 137, 137, default),
        Marker(spans[1].name, spans[1].start_ns, spans[1].end_ns, 137, 137, "PROBE_PHASE"),
    ]
    assert list(back.markers) == expected
    conn = sqlite3.connect(db_path)
    # the instant went to rocpd_sample, as rocprofv3 stores instant records
    assert conn.execute("SELECT COUNT(*) FROM rocpd_sample").fetchone() == (1,)
    messages = {r[0] for r in conn.execute("SELECT extdata FROM rocpd_event") if r[0] != "{}"}
    assert json.dumps({"message": "dispatch"}) in messages
    conn.close()


def test_rocpd_writer_rules(tmp_path: Path) -> None:
    db_path = tmp_path / "x.db"
    create_rocpd_db(db_path, machine_id="m").close()
    with pytest.raises(FileExistsError):
        create_rocpd_db(db_path)
    create_rocpd_db(db_path, overwrite=True, machine_id="m").close()
    with pytest.raises(ValueError, match=r"no built-in rocpd schema '4\.0'"):
        create_rocpd_db(tmp_path / "y.db", "4.0")
    with pytest.raises(ValueError, match="guid"):
        create_rocpd_db(tmp_path / "z.db", guid="x; DROP TABLE")
    db = create_rocpd_db(tmp_path / "w.db", "3", machine_id="m")
    kernel = GpuKernel("k", 1, 2, 0, 0, 1, 10, 10, queue=1)
    db.add_kernels([kernel])
    with pytest.raises(ValueError, match="queue 1 is used by pids 10 and 11"):
        db.add_kernels([dataclasses.replace(kernel, pid=11)])
    # the failed call rolled back its rows and the writer's id caches together
    db.add_kernels([dataclasses.replace(kernel, pid=11, queue=2, stream=5)])
    with pytest.raises(ValueError, match="ends"):
        db.add_regions([ProbeSpan("bad", 5, 4, 1, 1, "")])
    db.close()
    with pytest.raises(ValueError, match="closed"):
        db.add_regions([])
    kernels = read_rocpd(tmp_path / "w.db").kernels
    assert [(k.pid, k.queue, k.stream) for k in kernels] == [(10, 1, 0), (11, 2, 5)]


def test_rocpd_unknown_pid_round_trips_as_none(tmp_path: Path) -> None:
    kernels = [GpuKernel("k", 1, 2, None, None, 3, None, None)]
    for layout in ROCPD_LAYOUTS:
        db_path = tmp_path / f"{layout}.db"
        with create_rocpd_db(db_path, layout, machine_id="m") as db:
            db.add_kernels(kernels)
        (k,) = read_rocpd(db_path).kernels
        assert (k.pid, k.tid, k.device, k.correlation_id) == (None, None, None, 3)
        assert (k.stream, k.queue) == ((0, 0) if layout == "3" else (None, None))


@pytest.fixture()
def built_db(tmp_path: Path) -> Path:
    db_path = tmp_path / "built_results.db"
    with create_rocpd_db(db_path, guid=GUID, machine_id="m") as db:
        db.add_profile(_csv(DOC_2025))
    return db_path


def test_read_rocpd_bad_files(tmp_path: Path, built_db: Path) -> None:
    with pytest.raises(ProfileError, match="no such file"):
        read_rocpd(tmp_path / "absent.db")
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(ProfileError, match="empty file"):
        read_rocpd(empty)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    with pytest.raises(ProfileError, match="not an SQLite database") as err:
        read_rocpd(garbage)
    assert err.value.path == str(garbage)
    data = built_db.read_bytes()
    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ProfileError, match="truncated database"):
        read_rocpd(truncated)
    plain = tmp_path / "plain.db"
    conn = sqlite3.connect(plain)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(ProfileError, match="no rocpd_metadata"):
        read_rocpd(plain)


def test_read_rocpd_corrupt_pages(tmp_path: Path, built_db: Path) -> None:
    data = bytearray(built_db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for i in range(page, len(data)):  # keep page 1 (header and schema), garble the rest
        data[i] = 0xA5
    broken = tmp_path / "broken.db"
    broken.write_bytes(bytes(data))
    with pytest.raises(ProfileError, match="corrupt or unreadable rocpd database") as err:
        read_rocpd(broken)
    assert str(broken) in str(err.value)


@pytest.mark.parametrize(
    ("version", "error"),
    [
        ("5.0.0", "unknown rocpd schema version '5.0.0'"),
        ("4.0", "layout does not match the version"),  # 4.0 keeps times in rocpd_timestamp
        ("3", None),
    ],
)
def test_read_rocpd_schema_versions(built_db: Path, version: str, error: str | None) -> None:
    conn = sqlite3.connect(built_db)
    table = next(
        n
        for (n,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE name LIKE 'rocpd_metadata_%'"
        )
    )
    conn.execute(f"UPDATE `{table}` SET value = ? WHERE tag = 'schema_version'", (version,))
    conn.commit()
    conn.close()
    if error is None:  # ROCm/rocprofiler-sdk's rocpd_metadata.sql writes "3" for the same layout
        assert read_rocpd(built_db).meta["schema_version"] == "3"
    else:
        with pytest.raises(ProfileError, match=error):
            read_rocpd(built_db)


def test_read_rocpd_layout_must_match_version(tmp_path: Path) -> None:
    db_path = tmp_path / "track.db"
    create_rocpd_db(db_path, "4.1.0", guid=GUID, machine_id="m").close()
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE rocpd_metadata SET value = '3.0.0' WHERE tag = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(ProfileError, match="layout does not match the version"):
        read_rocpd(db_path)


# ----------------------------------------------------------------------------- roctx


class RecordingRoctx(types.ModuleType):
    """A fake ``roctx`` with the real module's function names (rocprofiler-sdk
    source/lib/python/roctx/__init__.py) that records every call."""

    def __init__(self) -> None:
        super().__init__("roctx")
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.depth = 0

    def rangePush(self, msg: str) -> int:
        self.calls.append(("rangePush", (msg,)))
        self.depth += 1
        return self.depth - 1

    def rangePop(self) -> int:
        self.calls.append(("rangePop", ()))
        self.depth -= 1
        return self.depth

    def mark(self, msg: str) -> None:
        self.calls.append(("mark", (msg,)))

    def rangeStart(self, msg: str) -> int:
        self.calls.append(("rangeStart", (msg,)))
        return 77

    def rangeStop(self, range_id: int) -> None:
        self.calls.append(("rangeStop", (range_id,)))


def test_roctx_missing_module_message() -> None:
    def importer(name: str) -> types.ModuleType:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    with pytest.raises(RoctxUnavailableError) as err:
        RoctxEmitter(importer=importer)
    message = str(err.value)
    assert "'roctx'" in message and "rocprofiler-sdk" in message and "ROCm" in message
    assert "/opt/rocm/lib/python" in message
    assert isinstance(err.value, ImportError)

    incomplete = types.ModuleType("roctx")
    setattr(incomplete, "mark", lambda msg: None)  # noqa: B010 - a module attribute
    with pytest.raises(RoctxUnavailableError, match="lacks rangePush, rangePop, rangeStart"):
        RoctxEmitter(importer=lambda name: incomplete)


def test_roctx_call_sequence() -> None:
    fake = RecordingRoctx()
    requested: list[str] = []

    def importer(name: str) -> types.ModuleType:
        requested.append(name)
        return fake

    emitter = RoctxEmitter(importer=importer)
    assert requested == ["roctx"]
    with emitter.range("step 3 FULL bs=64"):
        emitter.mark("reorder: 2 moved")
        emitter.push("dispatch")
        emitter.pop()
    rid = emitter.start("graph replay")
    emitter.stop(rid)
    with pytest.raises(RuntimeError), emitter.range("failing step"):
        raise RuntimeError("vLLM error passes through")
    assert fake.calls == [
        ("rangePush", ("step 3 FULL bs=64",)),
        ("mark", ("reorder: 2 moved",)),
        ("rangePush", ("dispatch",)),
        ("rangePop", ()),
        ("rangePop", ()),
        ("rangeStart", ("graph replay",)),
        ("rangeStop", (77,)),
        ("rangePush", ("failing step",)),
        ("rangePop", ()),
    ]
    assert fake.depth == 0


def test_json_gzip_reader_is_shared(tmp_path: Path) -> None:
    """read_rocprofv3_json accepts plain and gzip files by content, not by name."""
    doc = _synthetic_tool_json()
    gz = tmp_path / "named_plain.json"
    gz.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert len(read_rocprofv3_json(gz).kernels) == 1
