"""Kineto trace import and the graph-launch / HTA-style analyses, on real traces.

The traces come from ``tests/data/profiles/kineto`` (HolisticTraceAnalysis and TraceLens
test data, see ``SOURCES.md``). Every count below was checked against the raw JSON.
"""

from __future__ import annotations

import collections
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from profiles_data import profile_path

from exporters.timelines.analyses import (
    count_graph_launches,
    gpu_busy_idle,
    kernels_by_launch,
    launch_delays,
)
from exporters.timelines.kineto import read_kineto
from exporters.timelines.model import (
    CLOCK_UNIX_EPOCH,
    GpuKernel,
    HostCall,
    Profile,
    ProfileError,
    is_graph_launch,
)

A100 = "hta_negative_queue_length_rank0_a100_cudagraph.json.gz"
V100 = "hta_trace_diff_test_v100_cudagraph.json.gz"
MI250 = "hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz"
MI210 = "tracelens_mi210_gpu_only_trace.json.gz"
SGLANG = "tracelens_sglang_Qwen3-8B_decode_mi300x_hipgraph.json.gz"
VLLM_FULL = "tracelens_vllm_decode_full_graph_execution_hipgraph.json.gz"
VLLM_PIECEWISE = "tracelens_vllm_prefilldecode_piecewise_graph_execution_hipgraph.json.gz"
VLLM_CAPTURE = "tracelens_vllm_prefilldecode_piecewise_graph_capture_rank_0.json.gz"


def _path(name: str) -> Path:
    return profile_path("kineto", name)


def _loader() -> Callable[[str], Profile]:
    cache: dict[str, Profile] = {}

    def load(name: str) -> Profile:
        if name not in cache:
            cache[name] = read_kineto(_path(name))
        return cache[name]

    return load


@pytest.fixture(scope="module")
def trace() -> Callable[[str], Profile]:
    """Parse each real trace once per test session of this module."""
    return _loader()


def _raw(name: str, **kwargs: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(gzip.decompress(_path(name).read_bytes()), **kwargs)
    return doc


# ----------------------------------------------------------------------------- counts


@pytest.mark.parametrize(
    ("name", "launches", "api"),
    [
        (A100, 70, "cudaGraphLaunch"),
        (V100, 12, "cudaGraphLaunch"),
        (SGLANG, 1, "hipGraphLaunch"),
        (VLLM_FULL, 1, "hipGraphLaunch"),
        (VLLM_PIECEWISE, 25, "hipGraphLaunch"),
        (MI250, 0, ""),
        (MI210, 0, ""),
    ],
)
def test_graph_launch_counts(
    trace: Callable[[str], Profile], name: str, launches: int, api: str
) -> None:
    p = trace(name)
    assert count_graph_launches(p) == launches
    assert {c.name for c in p.host_calls if c.is_graph_launch} == ({api} if api else set())
    assert len(kernels_by_launch(p)) == launches
    assert p.clock == CLOCK_UNIX_EPOCH and p.source == "kineto"


def test_a100_cuda_graph_trace(trace: Callable[[str], Profile]) -> None:
    p = trace(A100)
    assert len(p.kernels) == 6080
    names = collections.Counter(c.name for c in p.host_calls)
    assert names["cudaLaunchKernel"] == 5240
    sizes = collections.Counter(len(ks) for ks in kernels_by_launch(p).values())
    assert sizes == {1: 35, 2: 30, 8: 5}
    assert p.meta["flow_events"] == {"ac2g": {"s": 6600, "f": 35071}}  # 41,671 ac2g events
    # 705 kernels ran at the start of the window; their launches predate the trace
    assert sum(k.pid is None for k in p.kernels) == 705
    assert "baseTimeNanoseconds" not in p.meta  # old trace: absolute epoch microseconds
    assert p.kernels[0].start_ns == 1683564901553999 * 1000


def test_v100_cuda_graph_trace_old_flow_category(trace: Callable[[str], Profile]) -> None:
    p = trace(V100)
    assert len(p.kernels) == 9876
    sizes = collections.Counter(len(ks) for ks in kernels_by_launch(p).values())
    assert sizes == {315: 6, 429: 6}
    assert p.meta["flow_events"] == {"async_cpu_to_gpu": {"s": 9984, "f": 26815}}
    assert collections.Counter(c.name for c in p.host_calls)["cudaStreamGetCaptureInfo"] == 684


def test_sglang_mi300x_single_hip_graph(trace: Callable[[str], Profile]) -> None:
    p = trace(SGLANG)
    assert len(p.kernels) == 555
    assert {c: len(ks) for c, ks in kernels_by_launch(p).items()} == {92178: 544}
    markers = collections.Counter(m.category for m in p.markers)
    assert markers == {"python_function": 821, "user_annotation": 2}
    assert "step[DECODE bs=32]" in {m.name for m in p.markers}


def test_vllm_full_decode_hip_graph(trace: Callable[[str], Profile]) -> None:
    p = trace(VLLM_FULL)
    assert len(p.kernels) == 425
    (launch,) = [c for c in p.host_calls if c.is_graph_launch]
    assert launch.correlation_id == 505113
    graph = kernels_by_launch(p)[505113]
    assert len(graph) == 421
    assert all(k.pid == 851 and k.tid == 851 for k in graph)  # from the launching call
    assert {k.device for k in p.kernels} == {2}
    # 4 eager kernels, each with its own hipLaunchKernel / hipExtModuleLaunchKernel
    eager = [k for k in p.kernels if k.correlation_id != 505113]
    assert len(eager) == 4


def test_vllm_piecewise_hip_graphs(trace: Callable[[str], Profile]) -> None:
    p = trace(VLLM_PIECEWISE)
    assert len(p.kernels) == 413
    sizes = collections.Counter(len(ks) for ks in kernels_by_launch(p).values())
    assert sizes == {15: 23, 12: 1, 4: 1}  # 361 graph kernels, 52 eager ones
    base = 1767189312000000000
    launches = sorted(c.start_ns for c in p.host_calls if c.is_graph_launch)
    assert launches[:3] == [
        base + 6520488437747732,
        base + 6520488438913296,
        base + 6520488439906182,
    ]
    assert count_graph_launches(p, launches[0], launches[3]) == 3
    assert count_graph_launches(p, start_ns=launches[-1]) == 1
    assert count_graph_launches(p, end_ns=launches[0]) == 0


def test_capture_trace_has_no_replays(trace: Callable[[str], Profile]) -> None:
    p = trace(VLLM_CAPTURE)
    names = collections.Counter(c.name for c in p.host_calls)
    assert count_graph_launches(p) == 0
    assert names["hipGraphInstantiateWithFlags"] == 25
    assert names["hipStreamBeginCapture"] == names["hipStreamEndCapture"] == 25
    assert len(p.kernels) == 99


def test_hip_launch_names_are_runtime_calls(trace: Callable[[str], Profile]) -> None:
    p = trace(MI250)
    names = collections.Counter(c.name for c in p.host_calls)
    assert (names["hipLaunchKernel"], names["hipExtModuleLaunchKernel"]) == (12, 2)
    assert {c.domain for c in p.host_calls} == {"cuda_runtime"}
    delays = launch_delays(p)
    assert len(delays) == 14 and not any(d.is_graph_launch for d in delays)
    assert [m.name for m in p.markers if m.category == "user_annotation"] == [
        "ProfilerStep#1",
        "Optimizer.step#SGD.step",
        "ProfilerStep#2",
    ]
    gpu_only = trace(MI210)
    assert len(gpu_only.kernels) == 562 and len(gpu_only.host_calls) == 631


# ----------------------------------------------------------------------------- timestamps


def test_timestamps_are_exact_nanoseconds(trace: Callable[[str], Profile]) -> None:
    raw = _raw(VLLM_FULL, parse_float=str)
    (event,) = [e for e in raw["traceEvents"] if e.get("name") == "hipGraphLaunch"]
    assert (event["ts"], event["dur"]) == ("6520618855031.205", "506.768")
    (launch,) = [c for c in trace(VLLM_FULL).host_calls if c.is_graph_launch]
    base = raw["baseTimeNanoseconds"]
    assert launch.start_ns == base + int(event["ts"].replace(".", ""))
    assert launch.end_ns - launch.start_ns == 506768
    assert trace(VLLM_FULL).meta["baseTimeNanoseconds"] == 1767189312000000000


# ----------------------------------------------------------------------------- analyses


def test_launch_delays_graph_first_kernel(trace: Callable[[str], Profile]) -> None:
    (full,) = [d for d in launch_delays(trace(VLLM_FULL)) if d.is_graph_launch]
    assert (full.correlation_id, full.kernel_count) == (505113, 421)
    assert full.start_to_start_ns == 6885076
    assert full.end_to_start_ns == 6378308
    (sglang,) = [d for d in launch_delays(trace(SGLANG)) if d.is_graph_launch]
    # the first replayed kernel starts 14 us after the call and long before it returns
    assert (sglang.start_to_start_ns, sglang.end_to_start_ns) == (14066, -1558543)
    v100 = [d for d in launch_delays(trace(V100)) if d.is_graph_launch]
    assert len(v100) == 12
    assert all(d.start_to_start_ns > 0 for d in v100)


def test_gpu_busy_idle_over_graph_replays(trace: Callable[[str], Profile]) -> None:
    p = trace(VLLM_FULL)
    graph = kernels_by_launch(p)[505113]
    window = (graph[0].start_ns, max(k.end_ns for k in graph))
    (full,) = gpu_busy_idle(p, [window])
    assert (full.busy_ns, full.idle_ns, full.kernel_count) == (10388482, 420, 421)
    assert full.busy_fraction > 0.9999
    s = trace(SGLANG)
    graph = kernels_by_launch(s)[92178]
    window = (graph[0].start_ns, max(k.end_ns for k in graph))
    (sg,) = gpu_busy_idle(s, [window], device=9)
    assert (sg.busy_ns, sg.idle_ns) == (9656404, 274232)
    (empty,) = gpu_busy_idle(s, [window], device=0)
    assert (empty.busy_ns, empty.idle_ns, empty.kernel_count) == (0, window[1] - window[0], 0)
    with pytest.raises(ValueError, match="ends before it starts"):
        gpu_busy_idle(s, [(10, 5)])


intervals = st.lists(
    st.tuples(st.integers(0, 200), st.integers(0, 50)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(intervals, st.integers(0, 260), st.integers(0, 60))
def test_gpu_busy_idle_matches_brute_force(
    spans: list[tuple[int, int]], start: int, length: int
) -> None:
    kernels = [GpuKernel("k", s, e, 0, i % 3, i, 1, 1) for i, (s, e) in enumerate(spans)]
    profile = Profile.build("test", CLOCK_UNIX_EPOCH, kernels)
    (r,) = gpu_busy_idle(profile, [(start, start + length)])
    covered = {t for s, e in spans for t in range(s, e)}
    expected_busy = sum(1 for t in range(start, start + length) if t in covered)
    assert r.busy_ns == expected_busy
    assert r.busy_ns + r.idle_ns == length
    assert r.kernel_count == sum(1 for s, e in spans if s < start + length and e > start)


def test_is_graph_launch_spellings() -> None:
    for name in ("cudaGraphLaunch", "cudaGraphLaunch_v10000", "cudaGraphLaunch_ptsz"):
        assert is_graph_launch(name)
    assert is_graph_launch("hipGraphLaunch_spt") and is_graph_launch("cuGraphLaunch")
    assert not is_graph_launch("hipGraphLaunchNode") and not is_graph_launch("hipLaunchKernel")
    call = HostCall("hipGraphLaunch", "cuda_runtime", 0, 1, 1, 1, 9)
    profile = Profile.build("test", CLOCK_UNIX_EPOCH, host_calls=[call])
    assert kernels_by_launch(profile) == {9: ()}
    assert launch_delays(profile) == ()


# ----------------------------------------------------------------------------- flows


@pytest.mark.parametrize(
    ("name", "flow_category"), [(VLLM_FULL, "ac2g"), (V100, "async_cpu_to_gpu")]
)
def test_flow_events_restore_missing_correlation(
    tmp_path: Path, trace: Callable[[str], Profile], name: str, flow_category: str
) -> None:
    """A real graph replay with ``args.correlation`` removed from its kernels."""
    raw = _raw(name)
    first = next(e for e in raw["traceEvents"] if e.get("name", "").endswith("GraphLaunch"))
    corr = first["args"]["correlation"]
    keep = []
    for e in raw["traceEvents"]:
        if e.get("cat") == "kernel" and e["args"].get("correlation") == corr:
            e["args"].pop("correlation")
            keep.append(e)
        elif e is first or (e.get("cat") == flow_category and e.get("id") == corr):
            keep.append(e)
    raw["traceEvents"] = keep
    excerpt = tmp_path / "excerpt.json"
    excerpt.write_text(json.dumps(raw))
    p = read_kineto(excerpt)
    expected = len(kernels_by_launch(trace(name))[corr])
    assert len(p.kernels) == expected
    assert p.meta["kernels_correlated_by_flow"] == expected
    assert {k.correlation_id for k in p.kernels} == {corr}
    assert len(kernels_by_launch(p)[corr]) == expected


# ----------------------------------------------------------------------------- bad input


def test_bad_inputs_name_the_file(tmp_path: Path) -> None:
    real = _path(VLLM_FULL).read_bytes()
    truncated = tmp_path / "trace.json.gz"
    truncated.write_bytes(real[: len(real) // 2])
    with pytest.raises(ProfileError, match="truncated gzip") as err:
        read_kineto(truncated)
    assert err.value.path == str(truncated) and str(truncated) in str(err.value)

    not_json = tmp_path / "trace.json"
    not_json.write_text("<html>502 Bad Gateway</html>")
    with pytest.raises(ProfileError, match="not JSON") as err:
        read_kineto(not_json)
    assert str(not_json) in str(err.value)

    no_events = tmp_path / "no_events.json"
    no_events.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": []}))
    with pytest.raises(ProfileError, match="no 'traceEvents' list") as err:
        read_kineto(no_events)
    assert str(no_events) in str(err.value)

    array = tmp_path / "array.json"
    array.write_text("[]")
    with pytest.raises(ProfileError, match="top level is a JSON list"):
        read_kineto(array)

    bad_ts = tmp_path / "bad_ts.json"
    event = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": "soon"}
    bad_ts.write_text(json.dumps({"traceEvents": [event]}))
    with pytest.raises(ProfileError, match=r"traceEvents\[0\] \(kernel 'k'\): 'ts'"):
        read_kineto(bad_ts)

    with pytest.raises(ProfileError, match="no such file"):
        read_kineto(tmp_path / "absent.json.gz")

    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(real[:10] + b"\x00" * 64 + real[74:])
    with pytest.raises(ProfileError, match="gzip"):
        read_kineto(corrupt)


def test_gpu_busy_idle_counts_a_kernel_across_an_instant() -> None:
    """A zero-length window inside a kernel counts that kernel, also with a zero-length
    kernel at the same instant (found by the property test above)."""
    kernels = [GpuKernel("k", 0, 2, 0, 0, 0, 1, 1), GpuKernel("k", 1, 1, 0, 1, 1, 1, 1)]
    profile = Profile.build("test", CLOCK_UNIX_EPOCH, kernels)
    (r,) = gpu_busy_idle(profile, [(1, 1)])
    assert (r.busy_ns, r.idle_ns, r.kernel_count) == (0, 0, 1)
    (r,) = gpu_busy_idle(profile, [(2, 2)])
    assert r.kernel_count == 0
