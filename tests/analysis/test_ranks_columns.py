"""Ranks side by side over a recording's columns (probe.analysis.ranks_columns) against the
Step path (probe.analysis.ranks.engine_ranks, dp_rank) on the same recordings: equal field
for field, whatever the chunk, on the committed TP=2 recording and on recordings written
here with every case the rules branch on (offsets, missing steps, steps without a launch
time or device timing, equal arrivals, mismatched batches, a CPU engine, several
data-parallel ranks, values past 64-bit arithmetic)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from probe.analysis import ranks
from probe.analysis.ranks_columns import (
    dp_rank_of_columns,
    engine_ranks_of_columns,
    per_step_of_columns,
    ranks_of_recording,
)
from probe.reader.recording import Recording, RecordingWriter
from probe.records import Mode, Reason
from probe.step import PHASES, Step, new_step

ROOT = Path(__file__).resolve().parents[2]
TP2 = ROOT / "tests/data/serve-tp2.probe"


def _steps(rnd: random.Random, pid: int, n: int, *, first: int, base: int) -> list[Step]:
    out = []
    for k in range(n):
        step = first + k
        if rnd.random() < 0.03:  # a step this rank did not record
            continue
        no_launch = rnd.random() < 0.02
        ph = {p: rnd.choice([0, 10, 10, 500, rnd.randrange(5000)]) for p in PHASES}
        t0 = base + k * 100_000 + rnd.choice([0, 0, 50, rnd.randrange(3000)])
        idle = None if rnd.random() < 0.1 else rnd.choice([0, 40, rnd.randrange(5000)])
        out.append(
            new_step(
                pid=pid, step=step, t0=t0, t1=t0 + 9000, host_ns=9000,
                num_tokens=(k % 7) + (100 if rnd.random() < 0.02 else 0), num_reqs=2,
                mode=Mode.NONE if no_launch else Mode.FULL,
                reason=Reason.FORCED_EAGER if rnd.random() < 0.2 else Reason.HIT,
                padded_tokens=(k % 7) + rnd.choice([0, 0, 3]), padded_reqs=2,
                max_query_len=1, uniform_decode_query_len=1, uniform=True, replayed=True,
                pieces=0, captures=0,
                cpu_launch_overhead_ns=None if no_launch else rnd.choice([1000, 1000, 1200]),
                phases=ph, gpu_idle_before_ns=idle,
                gpu_busy_ns=None if rnd.random() < 0.1 else rnd.randrange(10_000),
            )
        )  # fmt: skip
    return out


def _write(path: Path, ranks_: list[tuple[int, int, int, list[Step]]], platform: str) -> Path:
    w = RecordingWriter(path)
    for pid, tp, dp, steps in ranks_:
        w.add_process(pid, None)
        w.set_snapshot(pid, {"role": "worker", "tp_rank": tp, "dp_rank": dp, "platform": platform})
        w.add_steps(steps)
    w.close()
    return path


def _recording(tmp: Path, name: str, shape: list[tuple[int, int]], *, platform: str = "cuda",
               base: int = 10**12, seed: int = 7, n: int = 700) -> Path:  # fmt: skip
    """A recording of ranks (tp, dp) of ``shape``, each enabled a few steps apart."""
    rnd = random.Random(seed)
    rows = []
    for i, (tp, dp) in enumerate(shape):
        pid = 1000 + i
        rows.append((pid, tp, dp, _steps(rnd, pid, n, first=1 + 2 * i, base=base)))
    return _write(tmp / name, rows, platform)


def _step_path(rec: Recording) -> ranks.RanksSummary:
    rr = ranks.recording_ranks(rec)
    dp = (
        [(r, rec.iter_steps(r.rank.pid)) for e in rr.by_dp.values() for r in e]
        if len(rr.by_dp) > 1
        else []
    )
    return ranks.ranks_summary(rr.engines, dp, sync_launch=rr.sync_launch)


CASES = {
    "three ranks": dict(shape=[(0, 0), (1, 0), (2, 0)]),
    "four ranks of a CPU engine": dict(shape=[(0, 0), (1, 0), (2, 0), (3, 0)], platform="cpu"),
    "two engines": dict(shape=[(0, 0), (1, 0), (0, 1), (1, 1)]),
    "two ranks past 64 bits": dict(shape=[(0, 0), (1, 0)], base=2**62, n=300),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_columns_give_the_step_paths_figures(tmp_path: Path, case: str) -> None:
    rec = Recording.open(_recording(tmp_path, "r.probe.db", **CASES[case]))  # type: ignore[arg-type]
    want = _step_path(rec)
    assert want.engines and all(e.matched for e in want.engines)
    assert ranks_of_recording(rec) == want
    rr = ranks.recording_ranks(rec)
    for chunk in (1, 97, 256, 100_000):
        got = [engine_ranks_of_columns(rec, e, sync_launch=rr.sync_launch, chunk=chunk)
               for e in rr.engines]  # fmt: skip
        assert got == list(want.engines), chunk


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_columns_give_the_step_paths_matched_steps(tmp_path: Path, case: str) -> None:
    rec = Recording.open(_recording(tmp_path, "r.probe.db", **CASES[case]))  # type: ignore[arg-type]
    rr = ranks.recording_ranks(rec)
    for chunk in (97, 100_000):
        for e in rr.engines:
            want, want_facts = ranks.per_step(e, sync_launch=rr.sync_launch, chunk=chunk)
            got, facts = per_step_of_columns(rec, e, sync_launch=rr.sync_launch, chunk=chunk)
            steps = list(want)
            assert steps and list(got) == steps
            assert facts == want_facts
        rr = ranks.recording_ranks(rec)  # fresh Step iterators


def test_the_cases_reach_every_branch(tmp_path: Path) -> None:
    """The recordings above hold what the rules branch on (so the equality means something)."""
    rec = Recording.open(_recording(tmp_path, "r.probe.db", **CASES["three ranks"]))  # type: ignore[arg-type]
    (e,) = _step_path(rec).engines
    assert e.offsets == (0, 2, 4)
    assert all(e.unmatched) and e.no_launch and e.batch_mismatches and e.within_uncertainty
    assert 0 < e.wait_steps < e.matched - e.within_uncertainty
    cpu = Recording.open(
        _recording(tmp_path, "c.probe.db", **CASES["four ranks of a CPU engine"])  # type: ignore[arg-type]
    )
    (c,) = _step_path(cpu).engines
    assert "forward start" in c.arrival and c.wait_steps == c.matched - c.within_uncertainty
    two = Recording.open(_recording(tmp_path, "d.probe.db", **CASES["two engines"]))  # type: ignore[arg-type]
    d = _step_path(two).dp
    assert len(d) == 4 and all(x.forced_eager and x.padded for x in d)


def test_the_tp2_recording_and_its_data_parallel_costs() -> None:
    rec = Recording.open(TP2)
    assert ranks_of_recording(rec) == _step_path(rec)
    for r in (r for e in ranks.recording_ranks(rec).by_dp.values() for r in e):
        assert dp_rank_of_columns(rec, r) == ranks.dp_rank(r, rec.iter_steps(r.rank.pid))


def _reference(
    ranks_: list[ranks.RankInput], sync_launch: bool
) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """The rules of probe.analysis.ranks step by step, in Python integers, written apart
    from the code: each rank's steps taken by the reference rank's step number plus the
    offset, and per matched step (last, skew, phase, excess, wait) as the module's
    docstring defines them; with the tallies."""
    offsets, _ = ranks.align_offsets([list(r.steps)[: ranks.ALIGN_WINDOW] for r in ranks_])
    by_step = [{s.step: s for s in r.steps} for r in ranks_]
    counts = [len(list(r.steps)) for r in ranks_]
    cands = ["start", *(p for p in ranks.PHASES_BEFORE_FORWARD
                        if not (sync_launch and p == "forward_launch"))]  # fmt: skip

    def lead(x: int, xs: list[int]) -> float:
        ys = sorted(xs)
        m = len(ys) // 2
        return (2 * x - (2 * ys[m] if len(ys) % 2 else ys[m - 1] + ys[m])) / 2

    out: list[tuple[Any, ...]] = []
    full = mismatches = no_launch = 0
    for s0 in ranks_[0].steps:
        got = [by_step[i].get(s0.step + offsets[i]) for i in range(len(ranks_))]
        steps = [g for g in got if g is not None]
        if len(steps) < len(got):
            continue
        full += 1
        mismatches += any((s.num_tokens, s.num_reqs) != (s0.num_tokens, s0.num_reqs)
                          for s in steps)  # fmt: skip
        if any(s.cpu_launch_overhead_ns is None for s in steps):
            no_launch += 1
            continue
        fl = [s.phases.get("forward_launch", 0) for s in steps]
        ends = [s.t0 + (s.cpu_launch_overhead_ns or 0) - (f if sync_launch else 0)
                for s, f in zip(steps, fl, strict=True)]  # fmt: skip
        last = max(range(len(ends)), key=lambda i: (ends[i], -i))
        others = [i for i in range(len(ends)) if i != last]
        skew = round(lead(ends[last], [ends[i] for i in others]))
        if skew <= 0:
            out.append((s0.step, None, skew, None, 0, None))
            continue
        leads = {"start": lead(steps[last].t0, [steps[i].t0 for i in others])}
        for p in cands[1:]:
            leads[p] = lead(
                steps[last].phases.get(p, 0), [steps[i].phases.get(p, 0) for i in others]
            )
        phase = max(cands, key=lambda c: leads[c])
        idle = steps[last].gpu_idle_before_ns
        wait = (
            sum(ends[last] - ends[i] for i in others)
            if sync_launch
            else None
            if idle is None
            else sum(min(ends[last] - ends[i], idle) for i in others)
        )
        out.append((s0.step, last, skew, phase, round(leads[phase]), wait))
    tally = {"unmatched": tuple(c - full for c in counts), "batch_mismatches": mismatches,
             "no_launch": no_launch}  # fmt: skip
    return out, tally


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_matching_gives_the_rules_figures_step_by_step(tmp_path: Path, case: str) -> None:
    """The one matching (probe.analysis.ranks_match, behind both the Step and the column
    paths) against the rules computed step by step apart from it, on every case: each
    matched step's last rank, skew, phase, excess and wait, and the tallies."""
    rec = Recording.open(_recording(tmp_path, "r.probe.db", **CASES[case]))  # type: ignore[arg-type]
    rr = ranks.recording_ranks(rec)
    for e in rr.engines:
        inputs = [ranks.RankInput(r.rank, list(rec.iter_steps(r.rank.pid))) for r in e]
        want, tally = _reference(inputs, rr.sync_launch)
        it, facts = ranks.per_step(inputs, sync_launch=rr.sync_launch, chunk=97)
        got = [
            (sr.step, sr.last, sr.skew_ns, sr.phase, sr.phase_excess_ns, sr.wait_ns) for sr in it
        ]
        assert got == want
        assert any(w[1] is not None for w in want) and any(w[1] is None for w in want)
        t = facts["tally"]
        assert tuple(t[f"unmatched{i}"] for i in range(len(inputs))) == tally["unmatched"]
        assert (t["batch_mismatches"], t["no_launch"]) == (
            tally["batch_mismatches"],
            tally["no_launch"],
        )
        got_e = engine_ranks_of_columns(rec, e, sync_launch=rr.sync_launch)
        assert got_e.matched == len(want)
        assert got_e.within_uncertainty == sum(1 for w in want if w[1] is None)
        assert got_e.unmatched == tally["unmatched"]


def test_the_skew_percentiles_are_the_same_when_their_values_spill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each rank's skews held a few at a time (the rest in a temporary file) give the same
    exact percentiles and maximum as held whole."""
    import probe.analysis.order_stats as order_stats

    whole = ranks_of_recording(Recording.open(TP2))
    assert whole.engines and whole.engines[0].skew_p99_ns is not None
    monkeypatch.setattr(order_stats, "HELD", 3)
    spilled = ranks_of_recording(Recording.open(TP2))
    assert spilled == whole
