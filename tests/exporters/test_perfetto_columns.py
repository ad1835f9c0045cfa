"""The Perfetto export reads column batches: its trace is the one a pass over the
recording's Steps builds (:func:`_trace_from_steps`, each step's slices added in turn),
on every committed recording, either format, a set of two files, and recordings edited
where the passes a table at a time must take care: a process whose first graph decision
is a replay, detail rows of a step the steps table lacks. The events are encoded by hand:
the protobuf runtime serialises a parsed trace to the same bytes."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from perfetto_read import read_trace
from recordings import committed, copy_recording, rows_of_no_step, sqlite_of

from exporters.perfetto import (
    Slice,
    TraceBuilder,
    drafter_prefix,
    phase_name,
    rank_tracks,
    step_name,
    write_recording,
)
from exporters.perfetto_stream import Runs, packed
from probe.reader.recording import Recording, record_fields, step_fields
from probe.reader.recording_set import open_many

ROOT = Path(__file__).resolve().parents[2]
TP2 = ROOT / "tests/data/serve-tp2.probe"
STOCK = ROOT / "tests/data/stock_mrv2_k1.probe"
STEP_ARGS = ("mode", "reason", "runner", "num_tokens", "padded_tokens", "num_reqs",
             "padded_reqs", "max_query_len", "uniform_decode_query_len", "uniform", "replayed",
             "pieces", "captures", "host_ns", "cpu_launch_overhead_ns", "gpu_busy_ns",
             "gpu_idle_before_ns", "gpu_step_ns", "draft_mode", "draft_reason",
             "draft_replays", "draft_dispatches")  # fmt: skip


def _names(p: dict[str, Any]) -> tuple[str, str]:
    role = p.get("role")
    parts = [f"vLLM {role or 'vLLM process'}"]
    parts += [f"{lb}{p[k]}" for k, lb in (("tp_rank", "tp"), ("pp_rank", "pp"), ("dp_rank", "dp"))
              if p.get(k) is not None]  # fmt: skip
    thread = f"{role or 'main'} tp{p.get('tp_rank') or 0} pp{p.get('pp_rank') or 0}"
    return " ".join(parts), thread


def _trace_from_steps(rec: Any, path: Path) -> bytes:
    """The trace of ``rec`` from its Steps (:meth:`Recording.iter_steps`): every step's
    slices added in turn, each kind with its rank; the ranks side by side as the export
    adds them."""
    b = TraceBuilder()
    procs = {int(p["pid"]): p for p in rec.processes()}
    for pid in rec.step_counts():
        procs.setdefault(pid, {"pid": pid})
    thread, sub = {}, {}
    for pid in sorted(procs):
        p = procs[pid]
        proc_name, thread_name = _names(p)
        proc = b.process_track(pid, proc_name)
        thread[pid] = b.thread_track(pid, pid, thread_name)
        for name in ("graph decisions", "metadata builds", "reorder"):
            sub[(pid, name)] = b.child_track(proc, name)
        if p.get("boottime_ns") is not None and p.get("epoch_ns") is not None:
            b.clock_pair(int(p["boottime_ns"]), int(p["epoch_ns"]))
    names = rec.builder_names()

    def args(r: Any, builders: dict[int, str]) -> dict[str, Any]:
        f = record_fields(r, builders.get)
        return {"step": r.step, **{k: v for k, v in f.items() if k not in ("t0_ns", "t1_ns")}}

    for s in rec.iter_steps():
        f = step_fields(s)
        step_args = {"step": s.step, **{k: f[k] for k in STEP_ARGS}}
        b.add(thread[s.pid], Slice(step_name(s), s.t0, s.t1, "step", step_args), rank=0)
        for sp in s.spans:
            b.add(thread[s.pid], Slice(phase_name(sp), sp.t0, sp.t1, "phase", {"step": s.step}),
                  rank=1)  # fmt: skip
        builders = names.get(s.pid, {})
        decisions = sub[(s.pid, "graph decisions")]
        for d in s.dispatches:
            name = f"{drafter_prefix(d)}dispatch {d.mode.name} {d.reason.name.lower()}"
            b.add(decisions, Slice(name, d.t0, d.t1, "dispatch", args(d, builders)), rank=2)
        for r in s.replays:
            name = f"{drafter_prefix(r)}{r.kind.name.lower()} {r.mode.name}"
            b.add(decisions, Slice(name, r.t0, r.t1, "replay", args(r, builders)), rank=3)
        for bd in s.builds:
            name = f"{builders.get(bd.builder_id, '?')} ({bd.tag.name.lower()})"
            b.add(sub[(s.pid, "metadata builds")],
                  Slice(name, bd.t0, bd.t1, "build", args(bd, builders)), rank=4)  # fmt: skip
        for o in s.reorders:
            a, track = args(o, builders), sub[(s.pid, "reorder")]
            name = "reorder" + (" (changed)" if o.changed else "")
            b.add(track, Slice(name, o.t0, o.t1, "reorder", a), rank=5)
            if o.changed:
                b.add(track, Slice(f"reorder moved {o.moved}", o.t1, o.t1, "reorder", a), rank=5)
    rank_tracks(b, rec)
    return b.write(path).read_bytes()


def _same_trace(rec: Any, tmp_path: Path) -> bytes:
    got = write_recording(rec, tmp_path / "columns.pftrace").read_bytes()
    assert got == _trace_from_steps(rec, tmp_path / "steps.pftrace")
    return got


@pytest.mark.parametrize("path", committed())
def test_the_column_trace_is_the_steps_trace(path: str, tmp_path: Path) -> None:
    data = _same_trace(Recording.open(path), tmp_path)
    assert read_trace(tmp_path / "columns.pftrace").by_category("step")
    assert data


def test_a_sqlite_recording_and_a_set_of_two(tmp_path: Path) -> None:
    _same_trace(Recording.open(sqlite_of(TP2)), tmp_path)
    _same_trace(open_many([sqlite_of(TP2), STOCK]), tmp_path)


def test_a_first_replay_and_rows_of_missing_steps(tmp_path: Path) -> None:
    """The first worker's first dispatches removed (its first decision is then a replay,
    a decisions track placed after the other worker's) and some steps removed whose
    detail rows stay (they belong to no step)."""
    dst = copy_recording(sqlite_of(TP2), tmp_path / "edited.probe.db")
    db = sqlite3.connect(dst)
    first, second = sorted(p for (p,) in db.execute("SELECT DISTINCT pid FROM steps"))
    (lo,) = db.execute("SELECT min(step) FROM replays WHERE pid = ?", (first,)).fetchone()
    db.execute("DELETE FROM dispatches WHERE pid = ? AND step <= ?", (first, lo + 3))
    db.execute("DELETE FROM steps WHERE pid = ? AND step % 7 = 3", (second,))
    db.commit()
    orphans = rows_of_no_step(db, "spans")
    db.close()
    assert orphans > 0
    rec = Recording.open(dst)
    _same_trace(rec, tmp_path)
    tr = read_trace(tmp_path / "columns.pftrace")
    decisions = [s.track for s in tr.slices if s.category in ("dispatch", "replay")]
    order = list(dict.fromkeys(decisions))  # the tracks in the order the file has them
    pid_of = {u: tr.tracks[d.parent_uuid].process.pid for u, d in tr.tracks.items()
              if d.HasField("parent_uuid")}  # fmt: skip
    assert [pid_of[u] for u in order] == [second, first]


def test_events_are_the_bytes_the_protobuf_runtime_writes(tmp_path: Path) -> None:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    b = TraceBuilder()
    t = b.child_track(b.process_track(7, "p"), "x")
    flow = b.flow_id()
    values: list[Any] = [0, 1, 127, 128, 300, 1 << 40, -1, -(1 << 40), True, False, 0.5,
                         -2.25, "", "text", "ünï", None]  # fmt: skip
    for i, v in enumerate(values):
        s = Slice(f"s{i % 5}", 10 * i, 10 * i + (0 if i % 4 == 0 else 25), "c" if i % 2 else "",
                  {"a": v, "b": i, "ключ": "v"}, (flow,) if i == 1 else (),
                  (flow,) if i == 9 else ())  # fmt: skip
        b.add(t, s)
    data = b.write(tmp_path / "x.pftrace").read_bytes()
    assert pb.Trace.FromString(data).SerializeToString() == data
    assert len(read_trace(tmp_path / "x.pftrace").slices) == len(values)


def test_spilled_runs_merge_in_key_order() -> None:
    rng = random.Random(5)
    runs = Runs(spill_at=7)
    want: dict[int, list[Any]] = {1: [], 2: []}
    for seq in range(200):
        track = rng.choice((1, 2))
        start = seq // 3 * 10 + rng.randrange(40)  # mostly in order, overlapping runs
        key = (start, -start - 5, 0, seq)
        runs.add(track, key, Slice("s", start, start + 5))
        want[track].append(key)
    assert runs.runs[1] and runs.runs[2]  # spilled
    for track, keys in want.items():
        got = list(runs.items(track))
        assert [k for k, _ in got] == sorted(keys)
        assert all(t == packed(Slice("s", k[0], k[0] + 5)) for k, t in got)
    runs.close()
