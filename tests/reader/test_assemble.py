"""StepAssembler on hand-built record sequences, and the SQLite recording round trip."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from probe.analysis import views as analysis
from probe.reader.assemble import Step, StepAssembler
from probe.reader.recording import Recording, RecordingError, RecordingWriter
from probe.records import (
    Build,
    BuildTag,
    Decoded,
    Flag,
    Mode,
    Phase,
    Reason,
    RecordKind,
    ReplayKind,
    decode,
    encode,
    pack,
    pack_pair,
)

OUT = int(Flag.OUTSIDE_STEP)


def span(step: int, phase: Phase, t0: int, t1: int, flags: int = 0, v0: int = 0) -> bytes:
    return encode(RecordKind.SPAN, phase, 0, flags, step, t0, t1, v0, 1 if v0 else 0)


def disp(step: int, mode: Mode, reason: Reason, flags: int = 0, t: int = 15) -> bytes:
    return encode(
        RecordKind.DISPATCH, mode, reason, flags, step, t, t + 1, 6, 8, 3, 4, pack_pair(2, 2)
    )


def replay(step: int, mode: Mode, kind: ReplayKind = ReplayKind.REPLAY, flags: int = 0) -> bytes:
    return encode(RecordKind.REPLAY, mode, kind, flags, step, 40, 45, 8)


def assemble(recs: list[bytes]) -> tuple[list[Step], StepAssembler]:
    asm = StepAssembler(pid=42)
    steps: list[Step] = []
    for raw in recs:
        rec = decode(raw)
        assert rec is not None
        steps += asm.feed(rec)
    return steps + asm.flush(), asm


def forward_step(step: int, base: int, mode: Mode, *extra: bytes) -> list[bytes]:
    return [
        span(step, Phase.EXECUTE, base, base + 100, v0=6),
        disp(step, mode, Reason.HIT if mode == Mode.FULL else Reason.NOT_UNIFORM, t=base + 10),
        span(step, Phase.FORWARD_LAUNCH, base + 20, base + 60),
        *extra,
        span(step, Phase.SAMPLE_TOKENS, base + 110, base + 130),
    ]


def test_decode_roundtrip() -> None:
    rec: Decoded | None = decode(disp(3, Mode.FULL, Reason.HIT))
    assert rec is not None and rec.step == 3
    assert (rec.mode, rec.reason, rec.max_query_len, rec.uniform_decode_query_len) == (  # type: ignore[union-attr]
        Mode.FULL,
        Reason.HIT,
        2,
        2,
    )


def test_steps_grouped_by_number_outside_excluded() -> None:
    recs = [
        disp(0, Mode.FULL, Reason.HIT, flags=OUT),  # capture-time dispatch
        replay(0, Mode.FULL, ReplayKind.CAPTURE, flags=OUT),
        *forward_step(1, 1000, Mode.FULL, replay(1, Mode.FULL)),
        span(1, Phase.FORWARD_LAUNCH, 5, 6, flags=OUT),  # a dummy run between steps
        *forward_step(2, 2000, Mode.FULL, replay(2, Mode.FULL)),
    ]
    steps, asm = assemble(recs)
    assert [s.step for s in steps] == [1, 2]
    assert [len(s.spans) for s in steps] == [3, 3]
    assert asm.outside == {"dispatch": 1, "replay": 1, "span": 1}
    assert asm.anomalies == []
    assert all(s.captures == 0 for s in steps)
    assert (steps[0].t0, steps[0].t1, steps[0].host_ns) == (1000, 1130, 120)
    assert (steps[0].num_tokens, steps[0].num_reqs) == (6, 1)


def test_full_with_replay() -> None:
    [s], _ = assemble(forward_step(1, 1000, Mode.FULL, replay(1, Mode.FULL)))
    assert (s.mode, s.reason, s.replayed, s.pieces) == (Mode.FULL, Reason.HIT, True, 0)
    assert (s.padded_tokens, s.num_tokens, s.padded_reqs) == (8, 6, 4)


def test_full_without_replay_not_replayed() -> None:
    [s], _ = assemble(forward_step(1, 1000, Mode.FULL))
    assert s.mode == Mode.FULL and not s.replayed


def test_piecewise_pieces() -> None:
    pieces = [replay(1, Mode.PIECEWISE) for _ in range(3)]
    [s], _ = assemble(forward_step(1, 1000, Mode.PIECEWISE, *pieces))
    assert (s.mode, s.reason, s.replayed, s.pieces) == (
        Mode.PIECEWISE,
        Reason.NOT_UNIFORM,
        True,
        3,
    )


def test_capture_inside_step_is_anomaly() -> None:
    [s], asm = assemble(forward_step(7, 1000, Mode.FULL, replay(7, Mode.FULL, ReplayKind.CAPTURE)))
    assert s.captures == 1 and not s.replayed
    assert len(asm.anomalies) == 1 and "step 7" in asm.anomalies[0]


def test_nested_spans_not_double_counted() -> None:
    recs = forward_step(
        1,
        1000,
        Mode.FULL,
        span(1, Phase.METADATA_BUILD, 1020, 1050),
        span(1, Phase.METADATA_BUILD, 1025, 1035),  # nested
        span(1, Phase.METADATA_BUILD, 1045, 1055),  # overlapping the end
        span(1, Phase.METADATA_BUILD, 1070, 1075),  # disjoint
    )
    [s], _ = assemble(recs)
    assert s.phases["metadata_build"] == 35 + 5
    assert s.phases["forward_launch"] == 40


def _phase_disp(t0: int, t1: int, flags: int) -> bytes:
    """A dispatch phase's record (FULL hit, 6 tokens padded to 8): ``Flag.SPAN`` set."""
    return encode(RecordKind.DISPATCH, Mode.FULL, Reason.HIT, flags | int(Flag.SPAN), 1, t0,
                  t1, 6, 8, 3, 4, pack_pair(2, 2))  # fmt: skip


def test_a_span_from_dispatch_begins_where_the_dispatch_phase_ended() -> None:
    """MRV2's prepare_inputs phase is written by the runner's prepare_attn hook alone,
    marked FROM_DISPATCH: it runs from the end of the step's (target) dispatch phase."""
    frm, mrv2, dr = int(Flag.FROM_DISPATCH), int(Flag.MRV2), int(Flag.DRAFTER)
    prep = span(1, Phase.PREPARE_INPUTS, 1030, 1050, mrv2 | frm)
    base = [span(1, Phase.EXECUTE, 1000, 1100, mrv2, v0=6), _phase_disp(1005, 1012, mrv2), prep]
    [s], _ = assemble(base)
    assert s.phases["prepare_inputs"] == 1050 - 1012 and s.phases["dispatch"] == 7
    [p] = [x for x in s.spans if x.phase == Phase.PREPARE_INPUTS]
    assert (p.t0, p.t1, p.flags & frm) == (1012, 1050, frm)  # the stored span says so too
    # the drafter's dispatch after it, or one that ends after the span began, is not it
    late = [*base, _phase_disp(1060, 1070, mrv2 | dr)]
    assert assemble(late)[0][0].phases["prepare_inputs"] == 38
    # no dispatch phase in the step (cut by the hooks going on): the span's own start
    [s], _ = assemble([base[0], prep])
    assert s.phases["prepare_inputs"] == 20
    # without the flag a span is its own: as recordings before it were written
    [s], _ = assemble([*base[:2], span(1, Phase.PREPARE_INPUTS, 1030, 1050, mrv2)])
    assert s.phases["prepare_inputs"] == 20


def test_a_metadata_build_from_dispatch_ends_the_prepare_inputs_phase(tmp_path: Path) -> None:
    """MRV2's prepare_inputs phase is told by the metadata
    build's span (the model state's prepare_attn), marked FROM_DISPATCH: the reader adds
    the prepare_inputs span from the end of the step's target dispatch phase to the
    build's start, one span in the step like a recorded one, and no call of the probe."""
    frm, mrv2, dr = int(Flag.FROM_DISPATCH), int(Flag.MRV2), int(Flag.DRAFTER)
    build = span(1, Phase.METADATA_BUILD, 1050, 1070, mrv2 | frm)
    base = [span(1, Phase.EXECUTE, 1000, 1100, mrv2, v0=6), _phase_disp(1005, 1012, mrv2), build]
    [s], _ = assemble(base)
    assert s.phases["prepare_inputs"] == 1050 - 1012 and s.phases["metadata_build"] == 20
    [p] = [x for x in s.spans if x.phase == Phase.PREPARE_INPUTS]
    assert (p.t0, p.t1, p.flags & frm) == (1012, 1050, frm)
    # calls: the build's span and the dispatch phase's; the bracket and the dispatch
    assert analysis.hooked_calls(s) == (2, 2)
    assert analysis.hooked_calls(s, dispatch_in_phase=True) == (1, 2)
    # the same read back from a recording, whose spans keep no flags but the drafter's
    w = RecordingWriter(tmp_path / "mrv2.probe.db")
    w.add_process(s.pid, None)
    w.add_steps([s])
    w.commit()
    w.close()
    rec = Recording.open(tmp_path / "mrv2.probe.db")
    try:
        [back] = rec.iter_steps()
    finally:
        rec.close()
    assert back.phases["prepare_inputs"] == 38
    assert analysis.hooked_calls(back, dispatch_in_phase=True) == (1, 2)
    # the drafter's dispatch, or one ending after the build began, does not start it
    [s], _ = assemble([*base, _phase_disp(1060, 1075, mrv2 | dr)])
    assert s.phases["prepare_inputs"] == 38
    # no dispatch phase in the step (cut by the hooks going on): no prepare_inputs
    [s], _ = assemble([base[0], build])
    assert s.phases["prepare_inputs"] == 0 and s.phases["metadata_build"] == 20
    # a drafter's build so marked does not end the target's phase; an unmarked build
    # (recordings before) none at all
    for flags in (mrv2 | frm | dr, mrv2):
        [s], _ = assemble([*base[:2], span(1, Phase.METADATA_BUILD, 1050, 1070, flags)])
        assert s.phases["prepare_inputs"] == 0
    # with the runner's prepare_attn hooked too (micro-batching): the union, two calls
    prep = span(1, Phase.PREPARE_INPUTS, 1030, 1040, mrv2 | frm)
    [s], _ = assemble([*base, prep])
    assert s.phases["prepare_inputs"] == 38
    assert analysis.hooked_calls(s, dispatch_in_phase=True) == (2, 2)


def test_the_step_decision_is_the_dispatch_phases_not_a_later_target_dispatch() -> None:
    """vLLM 0.30+ MRV2 with ``kv_sharing_fast_prefill``: after the dispatch phase decided
    the step (PIECEWISE, 100 tokens padded to 104), ``FastPrefillHelper.prepare`` asks the
    target's manager about the logits count (7 tokens, NONE). The step's mode, reason and
    padding, and the real token count of its builds, are the phase's; a step with no phase
    record (an older recording, a runner without the phase hook) keeps the last one."""
    sp, mrv2 = int(Flag.SPAN), int(Flag.MRV2)

    def d(mode: Mode, reason: Reason, flags: int, t0: int, tokens: int, padded: int) -> bytes:
        return encode(RecordKind.DISPATCH, mode, reason, flags, 1, t0, t0 + 5,
                      tokens, padded, 3, 4, pack_pair(50, 2))  # fmt: skip

    phase = d(Mode.PIECEWISE, Reason.NOT_UNIFORM, mrv2 | sp, 1005, 100, 104)
    logits = d(Mode.NONE, Reason.BATCH_TOO_BIG, mrv2, 1020, 7, 7)
    build = pack(Build(1, BuildTag.STEP, 1, mrv2, 1030, 1035, padded_tokens=104,
                       real_tokens=-1, padded_reqs=4, real_reqs=-1, max_query_len=50,
                       reorder_batch_threshold=-1, num_decodes=2, num_prefills=1,
                       num_decode_tokens=2, num_prefill_tokens=-1))  # fmt: skip
    head = span(1, Phase.EXECUTE, 1000, 1100, mrv2, v0=6)
    tail = span(1, Phase.SAMPLE_TOKENS, 1110, 1130, mrv2)
    [s], _ = assemble([head, phase, logits, build, tail])
    assert (s.mode, s.reason, s.padded_tokens) == (Mode.PIECEWISE, Reason.NOT_UNIFORM, 104)
    [b] = s.builds
    assert (b.real_tokens, b.num_prefill_tokens) == (100, 98)
    # no phase record: the last target dispatch, as before
    plain = d(Mode.PIECEWISE, Reason.NOT_UNIFORM, mrv2, 1005, 100, 104)
    [s], _ = assemble([head, plain, logits, build, tail])
    assert (s.mode, s.padded_tokens) == (Mode.NONE, 7)
    assert s.builds[0].real_tokens == 7


def test_cpu_launch_overhead() -> None:
    [s], _ = assemble(forward_step(1, 1000, Mode.FULL, replay(1, Mode.FULL)))
    assert s.cpu_launch_overhead_ns == 1060 - 1000


def test_drafter_dispatch_does_not_set_target_mode() -> None:
    drafter = int(Flag.DRAFTER)
    [s], _ = assemble(
        forward_step(1, 1000, Mode.FULL, disp(1, Mode.NONE, Reason.NOT_UNIFORM, flags=drafter))
    )
    assert (s.mode, s.draft_mode, s.draft_reason, s.draft_dispatches) == (
        Mode.FULL,
        Mode.NONE,
        Reason.NOT_UNIFORM,
        1,
    )


# -- recording -------------------------------------------------------------------------


def _write(path: Path) -> list[Step]:
    steps, _ = assemble(
        forward_step(1, 1000, Mode.FULL, replay(1, Mode.FULL))
        + forward_step(2, 2000, Mode.PIECEWISE, replay(2, Mode.PIECEWISE))
    )
    w = RecordingWriter(path)
    w.set_meta(command=["vllm", "serve", "m"])
    w.add_process(42, None)
    w.set_snapshot(42, {"runner": "v1", "vllm_version": "0.33.0"})
    w.add_steps(steps)
    w.commit()
    w.close()
    return steps


def test_recording_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run.probe.db"
    steps = _write(path)
    rec = Recording.open(path)
    try:
        assert rec.meta()["command"] == ["vllm", "serve", "m"]
        [proc] = rec.processes()
        assert proc["pid"] == 42 and proc["snapshot"]["vllm_version"] == "0.33.0"
        # the rows as SQLite holds them (the codec's encoding, read without the codec)
        rows = [dict(r) for r in rec.db.execute("SELECT * FROM steps ORDER BY pid, step")]
        assert [(r["pid"], r["step"]) for r in rows] == [(42, 1), (42, 2)]
        assert [r["mode"] for r in rows] == ["full", "piecewise"]
        assert [r["reason"] for r in rows] == ["hit", "not_uniform"]
        assert [r["cpu_launch_overhead_ns"] for r in rows] == [
            s.cpu_launch_overhead_ns for s in steps
        ]
        assert [bool(r["replayed"]) for r in rows] == [True, True]
        assert rows[1]["pieces"] == 1
    finally:
        rec.close()


def test_open_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.probe.db"
    with pytest.raises(RecordingError, match="no such file") as info:
        Recording.open(path)
    assert str(path) in str(info.value)


def test_open_not_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n" * 10)
    with pytest.raises(RecordingError, match="not an SQLite") as info:
        Recording.open(path)
    assert str(path) in str(info.value)


def test_open_truncated(tmp_path: Path) -> None:
    path = tmp_path / "run.probe.db"
    _write(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(RecordingError) as info:
        Recording.open(path)
    assert str(path) in str(info.value)


def test_open_other_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(RecordingError, match="not a probe recording") as info:
        Recording.open(path)
    assert str(path) in str(info.value)


def test_open_wrong_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "run.probe.db"
    _write(path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.commit()
    db.close()
    with pytest.raises(RecordingError, match="schema version 99") as info:
        Recording.open(path)
    assert str(path) in str(info.value)


def test_iter_steps_gives_back_the_steps_written(tmp_path: Path) -> None:
    path = tmp_path / "run.probe.db"
    steps = _write(path)
    rec = Recording.open(path)
    try:
        back = list(rec.iter_steps())
    finally:
        rec.close()

    # what the recording does not keep: a span's v0/v1/v2 (the step's num_tokens,
    # num_reqs and carried_reqs carry them) and the ring's builder ids (names are stored;
    # ids are the recording's)
    def kept(s: Step) -> Step:
        return replace(
            s,
            spans=tuple(replace(x, v0=0, v1=0, v2=-1) for x in s.spans),
            builds=tuple(replace(b, builder_id=0) for b in s.builds),
        )

    assert [kept(s) for s in back] == [kept(s) for s in steps]
    assert [s.spans for s in back] != [()] * len(back)


def _poke(path: Path, sql: str) -> None:
    db = sqlite3.connect(path)
    db.execute(sql)
    db.commit()
    db.close()


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("UPDATE steps SET mode = 'fast' WHERE step = 1", r"step 1\): mode is 'fast', not one of"),
        ("UPDATE steps SET num_tokens = -3 WHERE step = 2", r"num_tokens is -3, below 0"),
        ("UPDATE steps SET host_ns = 'soon' WHERE step = 1", r"host_ns is 'soon', not an integer"),
        ("UPDATE steps SET uniform = 2 WHERE step = 1", r"uniform is 2, not 0 or 1"),
        ("UPDATE steps SET runner = 'v9' WHERE step = 1", r"runner is 'v9', not one of v1, mrv2"),
        ("UPDATE steps SET t0_ns = NULL WHERE step = 1", r"t0_ns is NULL"),
        ("UPDATE spans SET phase = 'nap'", r"spans row .*phase is 'nap'"),
    ],
)
def test_iter_steps_refuses_a_value_that_does_not_fit(
    tmp_path: Path, sql: str, message: str
) -> None:
    path = tmp_path / "run.probe.db"
    _write(path)
    _poke(path, sql)
    rec = Recording.open(path)
    with pytest.raises(RecordingError, match=message) as info:
        list(rec.iter_steps())
    assert str(path) in str(info.value)
    rec.close()


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("DROP TABLE steps", r"no steps"),
        ("CREATE VIEW mine AS SELECT 1", r"also holds view mine"),
        ("CREATE TABLE notes (x)", r"also holds table notes"),
        ("CREATE TRIGGER t AFTER INSERT ON meta BEGIN SELECT 1; END", r"also holds trigger t"),
        ("ALTER TABLE steps DROP COLUMN draft_mode", r"table steps has no draft_mode"),
    ],
)
def test_open_refuses_anything_but_the_schema(tmp_path: Path, sql: str, message: str) -> None:
    path = tmp_path / "run.probe.db"
    _write(path)
    _poke(path, sql)
    with pytest.raises(RecordingError, match=message):
        Recording.open(path)


def test_a_view_in_place_of_a_table_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.probe.db"
    _write(path)
    _poke(path, "ALTER TABLE steps RENAME TO steps_real")
    _poke(path, "CREATE VIEW steps AS SELECT * FROM steps_real")
    with pytest.raises(RecordingError, match=r"steps: a view"):
        Recording.open(path)


def test_a_step_cut_before_its_first_span_takes_the_times_of_its_other_records() -> None:
    # the hooks went on inside step 5's reorder: only its REORDER and DISPATCH records
    # (the Known gap "untimed steps": t0_ns = t1_ns = 0 before)
    reorder = encode(RecordKind.REORDER, 0, 0, 0, 5, 1_000, 1_040, 1, 4, 4, 4, 0)
    steps, _ = assemble([reorder, disp(5, Mode.FULL, Reason.HIT, t=1_100)])
    assert [(s.step, s.t0, s.t1, s.host_ns) for s in steps] == [(5, 1_000, 1_101, 0)]
    # a step with its bracket keeps the bracket's times
    steps, _ = assemble([reorder, *forward_step(6, 2_000, Mode.FULL)])
    assert [(s.t0, s.t1) for s in steps if s.step == 6] == [(2_000, 2_130)]


def test_new_step_is_the_dataclass_built_without_its_init() -> None:
    """The assembler builds each Step with ``new_step`` (no frozen ``__init__``): the same
    object as ``Step(**kw)``, defaults included, and the same refusals."""
    import dataclasses

    from probe.step import new_step

    steps, _ = assemble([*forward_step(6, 2_000, Mode.FULL), *forward_step(7, 3_000, Mode.NONE)])
    for s in steps:
        kw = {f.name: getattr(s, f.name) for f in dataclasses.fields(Step)}
        for omitted in ((), ("gpu_busy_ns", "gpu_step_ns", "replays")):  # their defaults
            given = {k: v for k, v in kw.items() if k not in omitted}
            built = new_step(**given)
            assert built == Step(**given) and list(vars(built)) == list(vars(Step(**given)))
        with pytest.raises(dataclasses.FrozenInstanceError):
            built.step = 1  # type: ignore[misc]
        with pytest.raises(TypeError, match="pid"):
            new_step(**{k: v for k, v in kw.items() if k != "pid"})
        with pytest.raises(TypeError, match="nope"):
            new_step(**kw, nope=1)
