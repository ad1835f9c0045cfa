"""The metric updates of a batch of one process's steps given as columns: what
:func:`exporters.metrics.updates` makes of the same steps as Steps, update for update in
the same order, as arrays (:class:`Updates`: per metric, each update's label set as a code
and its value). A sink applies them a metric at a time
(:meth:`exporters.prometheus.PrometheusSink.step_columns`): a recording's export reads
its column batches (:func:`probe.reader.recording_batches.step_batches`) and builds no
Step but for the ranks matched side by side.

    >>> from exporters.metrics_columns import column_updates   # doctest: +SKIP
    >>> [u.metric for u in column_updates(info, batch, Classes())][:2]  # doctest: +SKIP
    ['vllm_graph_probe_engine_idle_seconds_total', 'vllm_graph_probe_steps_total']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exporters.base import ProcessInfo, processes_from_recording
from exporters.metrics import NAMESPACE
from probe.analysis import rules
from probe.analysis.accumulators import PHASE_NS
from probe.analysis.steady import Classes
from probe.progress import SILENT, Progress
from probe.reader.recording_batches import StepBatch
from probe.reader.recording_rows import NULL_BITS
from probe.records import BuildTag, Mode, Reason
from probe.step import PHASES

__all__ = [
    "Labels",
    "Updates",
    "column_events",
    "column_updates",
    "columns_read",
    "replay_columns",
    "step_calls",
]


#: the detail tables the updates read
TABLES = ("builds", "reorders")

_BOOL = ("false", "true")
_MODES = tuple(m.name.lower() for m in sorted(Mode, key=int))
#: a reason's label by its value + 1 (0: none, "unknown")
_REASONS = ("unknown", *(r.label for r in sorted(Reason, key=int)))


class Labels:
    """A metric's own labels as one code per update: each label a dimension of the code
    (mixed radix), its values named by a tuple (or, ``None``, by the number itself:
    a query length)."""

    def __init__(self, **dims: tuple[str, ...] | int) -> None:
        self.names = list(dims)
        self.values = [v if isinstance(v, tuple) else None for v in dims.values()]
        self.sizes = [len(v) if isinstance(v, tuple) else v for v in dims.values()]

    def code(self, *parts: np.ndarray) -> np.ndarray:
        out = np.zeros(len(parts[0]) if parts else 0, dtype=np.int64)
        for p, size in zip(parts, self.sizes, strict=True):
            out = out * size + p
        return out

    def __call__(self, code: int) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, values, size in zip(
            reversed(self.names), reversed(self.values), reversed(self.sizes), strict=True
        ):
            code, i = divmod(code, size)
            out[name] = values[i] if values is not None else str(i)
        return out


@dataclass(frozen=True)
class Updates:
    """One metric's updates of a batch, in the order :func:`exporters.metrics.updates`
    makes them: ``rows`` each update's step (its row in the batch; -1: the batch's),
    ``codes`` its label set (``labels`` names a code's own labels, the process's are the
    sink's), ``values`` its value."""

    metric: str
    rows: np.ndarray
    codes: np.ndarray
    values: np.ndarray
    labels: Callable[[int], dict[str, str]]


def _null(cols: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    return ((cols["_nulls"] >> NULL_BITS[name]) & 1).astype(bool)


def classes_of(
    classes: Classes, pid: int, cols: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row of one process's batch: (steady, after an engine-idle gap, period ns, gap
    ns), each step classified by ``classes`` as :meth:`Classes.classify` would classify
    its Steps (steps seen before are not classified again; a step twice reads as its last
    row classed it)."""
    steps = cols["step"]
    seen = classes.recent.get(pid, {})
    fresh = not any(s in seen for s in steps.tolist())
    if fresh and (len(steps) < 2 or bool((np.diff(steps) > 0).all())):
        return classes.classify_columns(pid, _classed(cols))[1]  # type: ignore[return-value]
    todo = np.flatnonzero([s not in seen for s in steps.tolist()])
    todo = todo[np.argsort(steps[todo], kind="stable")]
    if len(todo):
        classes.classify_columns(pid, _classed({k: v[todo] for k, v in cols.items()}))
    got = [classes.get(pid, s) or (False, False, 0, 0) for s in steps.tolist()]
    st, idle, period, gap = (np.array(x) for x in zip(*got, strict=True))
    return st.astype(bool), idle.astype(bool), period.astype(np.int64), gap.astype(np.int64)


def _classed(cols: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A recording's step columns as :func:`probe.analysis.summary.columns_of_steps` gives
    the same steps (a phase it has not: 0)."""
    out = {k: v for k, v in cols.items() if not k.startswith("n_")}
    for c in PHASE_NS:
        out[c] = np.where(out[c] < 0, 0, out[c])
    return out


def step_calls(
    info: ProcessInfo, cols: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray] | None:
    """Per row: the step's hooked calls (span, hook; -1 without a forward), counted from
    the record counts a columnar file stores beside each step
    (:func:`probe.analysis.cost.hooked_calls`, as the summary counts them); None where the
    process has no calibration."""
    from probe.analysis.summary_read import stored_calls

    if info.calibration is None:
        return None
    return stored_calls({info.pid: info.calibration}).take(cols)


def column_updates(
    info: ProcessInfo,
    batch: StepBatch,
    classes: Classes,
    builder: Callable[[str | None], str],
    calls_per_step: bool = False,
) -> Iterator[Updates]:
    """:func:`exporters.metrics.updates` of a batch of ``info``'s steps (its device timings
    those the steps hold), ``classes`` splitting them; ``builder`` labels a build by its
    builder's name as stored. The hooked calls are the batch's totals, or
    (``calls_per_step``) each forward step's, as ``updates`` of that step alone makes them.
    Each metric's updates come in the order ``updates`` makes them; across metrics, a
    step's come in its order where every metric gives a step at most one update (the
    phases, builds and reorders are in step order, each step's in its order)."""
    cols = batch.steps
    n = NAMESPACE
    st, idle, period, gap = classes_of(classes, info.pid, cols)
    sti = st.astype(np.int64)
    mode = cols["mode"]
    fw = mode >= 0

    def emit(metric: str, lab: Labels, rows: np.ndarray, codes: np.ndarray, values: Any) -> Updates:
        v = np.asarray(values, dtype=np.float64)
        return Updates(f"{n}_{metric}", rows, codes, v, lab)

    none = Labels()
    i = np.flatnonzero(idle)
    yield emit("engine_idle_seconds_total", none, i, np.zeros(len(i), np.int64), gap[i] / 1e9)
    f = np.flatnonzero(fw)
    m, s = mode[f], sti[f]
    lab = Labels(mode=_MODES, reason=_REASONS, steady=_BOOL)
    yield emit("steps_total", lab, f, lab.code(m, cols["reason"][f] + 1, s), np.ones(len(f)))
    udql = cols["uniform_decode_query_len"]
    decode = fw & (cols["uniform"] == 1) & (udql >= 1)
    d = np.flatnonzero(decode)
    top = int(udql[d].max()) + 1 if len(d) else 1
    lab = Labels(query_len=top, steady=_BOOL)
    yield emit("decode_steps_total", lab, d, lab.code(udql[d], sti[d]), np.ones(len(d)))
    d = np.flatnonzero(decode & (mode == int(Mode.FULL)))
    yield emit("decode_full_steps_total", lab, d, lab.code(udql[d], sti[d]), np.ones(len(d)))
    graph = fw & (mode != int(Mode.NONE))
    g = np.flatnonzero(graph & (cols["replayed"] == 1))
    lab = Labels(mode=_MODES, steady=_BOOL)
    yield emit("replays_confirmed_total", lab, g, lab.code(mode[g], sti[g]), np.ones(len(g)))
    g = np.flatnonzero(graph)
    lab = Labels(steady=_BOOL)
    yield emit("padded_tokens_total", lab, g, sti[g], cols["padded_tokens"][g])
    yield emit("real_tokens_total", lab, g, sti[g], cols["num_tokens"][g])
    yield emit("scheduled_tokens_total", lab, f, s, cols["num_tokens"][f])
    yield emit("serving_seconds_total", lab, f, s, period[f] / 1e9)
    dr = np.flatnonzero(fw & (cols["draft_mode"] >= 0))
    dlab = Labels(mode=_MODES, reason=_REASONS)
    dcode = dlab.code(cols["draft_mode"][dr], cols["draft_reason"][dr] + 1)
    yield emit("draft_steps_total", dlab, dr, dcode, np.ones(len(dr)))
    lab = Labels(mode=_MODES, steady=_BOOL)
    c = np.flatnonzero(fw & ~_null(cols, "cpu_launch_overhead_ns"))
    yield emit(
        "cpu_launch_overhead_seconds", lab, c, lab.code(mode[c], sti[c]),
        cols["cpu_launch_overhead_ns"][c] / 1e9,
    )  # fmt: skip
    h = np.flatnonzero(fw & (cols["host_ns"] != 0))
    hcode = lab.code(mode[h], sti[h])
    yield emit("step_host_seconds", lab, h, hcode, cols["host_ns"][h] / 1e9)
    plab = Labels(phase=PHASES, steady=_BOOL)
    k = len(PHASES)
    ph = np.stack([cols[c][f] for c in PHASE_NS], axis=1)  # (row, phase): each step's in turn
    pcode = plab.code(np.tile(np.arange(k), len(f)), np.repeat(s, k))
    yield emit("phase_host_seconds", plab, np.repeat(f, k), pcode, ph.ravel() / 1e9)
    yield from _builds(batch.details["builds"], fw, builder, emit)
    ro = batch.details["reorders"]
    r = np.flatnonzero(fw[ro["row"]])
    rrow = ro["row"][r]
    clab = Labels(changed=_BOOL)
    yield emit("reorder_decisions_total", clab, rrow, ro["changed"][r], np.ones(len(r)))
    yield emit(
        "reorder_moved_requests_total", none, rrow, np.zeros(len(r), np.int64), ro["moved"][r]
    )
    calls = step_calls(info, cols)
    klab = Labels(kind=("span", "hook"), steady=_BOOL)
    if calls is not None and calls_per_step:
        span, hook = calls
        # each forward step: (span, steady), (hook, steady), (span, warm-up), (hook, ...)
        rows = np.repeat(f, 4)
        codes = np.tile(klab.code(np.array([0, 1, 0, 1]), np.array([1, 1, 0, 0])), len(f))
        mine = np.stack([span[f], hook[f]], axis=1)
        zero = np.zeros_like(mine)
        vals = np.where(st[f][:, None], np.hstack([mine, zero]), np.hstack([zero, mine]))
        yield emit("hooked_calls_total", klab, rows, codes, vals.ravel())
    elif calls is not None and fw.any():
        span, hook = calls
        warm = fw & ~st
        totals = [span[st].sum(), hook[st].sum(), span[warm].sum(), hook[warm].sum()]
        codes = klab.code(np.array([0, 1, 0, 1]), np.array([1, 1, 0, 0]))
        yield emit("hooked_calls_total", klab, np.full(4, -1), codes, totals)
    yield from _gpu(cols, sti, idle, emit)


def _builds(
    b: Mapping[str, Any],
    fw: np.ndarray,
    builder: Callable[[str | None], str],
    emit: Callable[[str, Labels, np.ndarray, np.ndarray, Any], Updates],
) -> Iterator[Updates]:
    """The metadata builds of the forward steps, a capture's left out."""
    keep = np.flatnonzero(fw[b["row"]] & (b["tag"] != list(BuildTag).index(BuildTag.CAPTURE)))
    names = [builder(b["builder"][i]) for i in keep.tolist()]
    known = tuple(dict.fromkeys(names))
    index = {x: i for i, x in enumerate(known)}
    lab = Labels(builder=known or ("",), drafter=_BOOL)
    code = lab.code(np.array([index[x] for x in names], np.int64), b["drafter"][keep])
    dur = (b["t1_ns"][keep] - b["t0_ns"][keep]) / 1e9
    yield emit("metadata_build_seconds", lab, b["row"][keep], code, dur)


def _gpu(
    cols: Mapping[str, np.ndarray],
    sti: np.ndarray,
    idle: np.ndarray,
    emit: Callable[[str, Labels, np.ndarray, np.ndarray, Any], Updates],
) -> Iterator[Updates]:
    """The device timings of the steps that hold one (a forward or not)."""
    lab = Labels(steady=_BOOL)
    g = np.flatnonzero(~_null(cols, "gpu_busy_ns"))
    yield emit("forward_gpu_busy_seconds", lab, g, sti[g], cols["gpu_busy_ns"][g] / 1e9)
    timed = ~_null(cols, "gpu_step_ns") & ~_null(cols, "gpu_idle_before_ns") & ~idle
    t = g[timed[g]]
    step_ns, before = cols["gpu_step_ns"][t], cols["gpu_idle_before_ns"][t]
    yield emit("gpu_step_seconds", lab, t, sti[t], step_ns / 1e9)
    yield emit("gpu_idle_before_step_seconds", lab, t, sti[t], before / 1e9)
    bound = rules.host_bound(before, step_ns)
    yield emit("host_bound_steps_total", lab, t, sti[t], np.where(bound, 1.0, 0.0))


#: one step's updates at its end (epoch ns): (metric, sorted label pairs, value) each
Event = tuple[int, list[tuple[str, tuple[tuple[str, str], ...], float]]]


def column_events(
    info: ProcessInfo,
    batches: Iterable[StepBatch],
    classes: Classes,
    builder: Callable[[str | None], str],
    progress: Progress = SILENT,
) -> Iterator[Event]:
    """:func:`exporters.series.step_events` of one process's steps given as column
    batches: each step's updates (:func:`column_updates`, its hooked calls its own) at its
    end (epoch ns), in the order ``updates`` of that step alone makes them; ``classes``
    splits them (its decisions; this process's state starts from none)."""
    from exporters.metrics import process_labels

    cl = classes.for_process()
    base = process_labels(info)
    pairs_of: dict[tuple[str, int], tuple[tuple[str, str], ...]] = {}
    shift = info.epoch_ns_of(0)  # BOOTTIME to epoch (raises without a clock pair)
    moved = f"{NAMESPACE}_reorder_moved_requests_total"
    for b in batches:
        rows: list[list[tuple[str, tuple[tuple[str, str], ...], float]]] = [
            [] for _ in range(len(b))
        ]
        ups = list(column_updates(info, b, cl, builder, calls_per_step=True))
        for u in ups:
            if u.metric != moved:
                _put(rows, u, base, pairs_of)
            if u.metric == f"{NAMESPACE}_reorder_decisions_total":
                _put(rows, next(x for x in ups if x.metric == moved), base, pairs_of, True)
        ends = (b.steps["t1_ns"] + shift).tolist()
        for at in range(0, len(b), 256):  # progress a few hundred steps at a time
            yield from zip(ends[at : at + 256], rows[at : at + 256], strict=True)
            progress.advance(min(256, len(b) - at))


def _put(
    rows: list[list[tuple[str, tuple[tuple[str, str], ...], float]]],
    u: Updates,
    base: Mapping[str, str],
    pairs_of: dict[tuple[str, int], tuple[tuple[str, str], ...]],
    interleave: bool = False,
) -> None:
    """``u``'s updates appended to their steps' lists; ``interleave``: each right after
    the update of the same index among the last ones put on its step (a reorder's moved
    requests after its decision)."""
    for code in np.unique(u.codes).tolist():
        if (u.metric, code) not in pairs_of:
            pairs_of[(u.metric, code)] = tuple(sorted({**base, **u.labels(code)}.items()))
    by_row: dict[int, list[tuple[str, tuple[tuple[str, str], ...], float]]] = {}
    for row, code, v in zip(u.rows.tolist(), u.codes.tolist(), u.values.tolist(), strict=True):
        by_row.setdefault(row, []).append((u.metric, pairs_of[(u.metric, code)], v))
    for row, items in by_row.items():
        if interleave:
            firsts = rows[row][-len(items) :]
            rows[row][-len(items) :] = [x for pair in zip(firsts, items, strict=True) for x in pair]
        else:
            rows[row] += items


def columns_read(rec: Any, infos: Sequence[ProcessInfo]) -> str:
    """How ``rec``'s steps are read as column batches for their metric updates: "counts"
    (with each step's record counts, the hooked calls: a columnar file stores them), "plain"
    (no process calibrated: no hooked calls to count), "" (not: an SQLite recording with a
    calibrated process is read as Steps)."""
    if getattr(rec, "stores_counts", False):
        return "counts"
    return "" if any(i.calibration is not None for i in infos) else "plain"


def builder_label(info: ProcessInfo) -> Callable[[str | None], str]:
    """A build's builder label by its name as stored (missing: "?"), as ``updates`` names
    a Step's build by its builder's number."""
    ids = {name: i for i, name in info.builder_names.items()}

    def label(name: str | None) -> str:
        bid = ids[name if name is not None else "?"]
        return info.builder_names.get(bid, f"<builder {bid}>")

    return label


class NeedsSteps(ValueError):
    """The recording's metric updates need its Steps (:func:`columns_read`)."""


def replay_columns(
    rec: Any,
    sink: Any,
    *,
    batch: int = 256,
    progress: Progress = SILENT,
    tables: tuple[str, ...] | None = None,
) -> int:
    """:func:`exporters.base.replay` of ``rec`` as column batches
    (:func:`probe.reader.recording_batches.step_batches`) into a sink that takes them
    (``step_columns(info, batch)``), in the same turns, each batch with the detail
    ``tables`` (None: the metric updates', with each step's record counts where the file
    stores them); the steps fed. Without ``tables``, refuses (:class:`NeedsSteps`, feeding
    nothing) where a calibrated process's hooked calls would need its Steps
    (:func:`columns_read`)."""
    from probe.reader.recording_batches import step_batches

    infos = processes_from_recording(rec)
    how = columns_read(rec, infos)
    if tables is None and not how:
        raise NeedsSteps(f"{rec.path}: calibrated processes' hooked calls need the Steps")
    counts = tables is None and how == "counts"
    tables = TABLES if tables is None else tables
    n = 0
    progress.stage("replaying steps", sum(rec.step_counts().values()), "steps")
    for info in infos:
        sink.process(info)
    turns = [(info, step_batches(rec, info.pid, batch, tables, counts)) for info in infos]
    while turns:
        still = []
        for info, batches in turns:
            b = next(batches, None)
            if b is not None:
                sink.step_columns(info, b)
                progress.advance(len(b))
                n += len(b)
                still.append((info, batches))
        turns = still
    return n


def rank_steps(batch: StepBatch) -> Sequence[Any]:
    """The batch's steps as Steps without their records (what ranks side by side reads)."""
    from probe.reader.recording_batches import step_kwargs
    from probe.step import new_step

    return [new_step(**kw) for kw in step_kwargs(batch.steps)]
