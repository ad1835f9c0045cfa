"""The one translation of steps into metric updates, over columns: a batch of one
process's steps (:class:`probe.reader.recording_batches.StepBatch`) gives its updates as
arrays (:class:`Updates`: per metric, each update's step, its label set as a code, its
value), in the order a step-by-step pass makes them (:func:`per_step`).

- the exports read a recording's column batches (:func:`replay_columns` feeding a sink's
  ``step_columns``: the textfile; :func:`column_events`: OpenMetrics' and OTLP's samples)
  and build no Step but for the ranks matched side by side (:func:`rank_steps`);
- the live sinks' Steps become a batch (:func:`batch_of_steps`, :func:`step_updates`),
  and :func:`exporters.metrics.updates` makes one ``Update`` of each.

    >>> ups = column_updates(info, batch, Classes(), builder_label(info))  # doctest: +SKIP
    >>> [u.metric for u in ups][:2]  # doctest: +SKIP
    ['vllm_graph_probe_engine_idle_seconds_total', 'vllm_graph_probe_steps_total']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from exporters.base import (
    NAMESPACE,
    ProcessInfo,
    in_turns,
    process_labels,
    processes_from_recording,
)
from probe.analysis import rules
from probe.analysis.accumulators import PHASE_NS
from probe.analysis.steady import Classes
from probe.progress import SILENT, Progress
from probe.reader.recording_batches import StepBatch
from probe.reader.recording_rows import NULL_BITS
from probe.records import BuildTag, Mode, Reason
from probe.step import PHASES, GpuSample, Step

__all__ = [
    "Labels",
    "NeedsSteps",
    "Updates",
    "batch_of_steps",
    "builder_label",
    "builder_of_id",
    "column_events",
    "column_updates",
    "columns_read",
    "gpu_updates",
    "per_step",
    "rank_steps",
    "replay_columns",
    "step_calls",
    "step_updates",
    "updates_of_steps",
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
    out = {k: v for k, v in cols.items() if not k.startswith(("n_", "_span", "_hook"))}
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
    if "_span_calls" in cols:  # counted from each Step's records (:func:`batch_of_steps`)
        return cols["_span_calls"], cols["_hook_calls"]
    return stored_calls({info.pid: info.calibration}).take(cols)


def column_updates(
    info: ProcessInfo,
    batch: StepBatch,
    classes: Classes,
    builder: Callable[[Any], str],
    calls_per_step: bool = False,
    *,
    split: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
    gpu: bool = True,
) -> Iterator[Updates]:
    """:func:`exporters.metrics.updates` of a batch of ``info``'s steps (its device timings
    those the steps hold), ``classes`` splitting them; ``builder`` labels a build by its
    builder's name as stored. The hooked calls are the batch's totals, or
    (``calls_per_step``) each forward step's, as ``updates`` of that step alone makes them.
    Each metric's updates come in the order ``updates`` makes them; across metrics, a
    step's come in its order where every metric gives a step at most one update (the
    phases, builds and reorders are in step order, each step's in its order). ``split``:
    each row's (steady, engine idle, period, gap) already found (else ``classes`` finds
    it); ``gpu``: the device timings the steps hold too (else none: a live batch's arrive
    apart, :func:`gpu_updates`)."""
    cols = batch.steps
    n = NAMESPACE
    st, idle, period, gap = split if split is not None else classes_of(classes, info.pid, cols)
    sti = st.astype(np.int64)
    mode = cols["mode"]
    fw = mode >= 0

    def emit(metric: str, lab: Labels, rows: np.ndarray, codes: np.ndarray, values: Any) -> Updates:
        # an integer stays one (a count, tokens: an OTLP counter's points stay integers)
        return Updates(f"{n}_{metric}", rows, codes, np.asarray(values), lab)

    def ones(k: int) -> np.ndarray:
        return np.ones(k, dtype=np.int64)

    none = Labels()
    i = np.flatnonzero(idle)
    yield emit("engine_idle_seconds_total", none, i, np.zeros(len(i), np.int64), gap[i] / 1e9)
    f = np.flatnonzero(fw)
    m, s = mode[f], sti[f]
    lab = Labels(mode=_MODES, reason=_REASONS, steady=_BOOL)
    yield emit("steps_total", lab, f, lab.code(m, cols["reason"][f] + 1, s), ones(len(f)))
    udql = cols["uniform_decode_query_len"]
    decode = fw & (cols["uniform"] == 1) & (udql >= 1)
    d = np.flatnonzero(decode)
    top = int(udql[d].max()) + 1 if len(d) else 1
    lab = Labels(query_len=top, steady=_BOOL)
    yield emit("decode_steps_total", lab, d, lab.code(udql[d], sti[d]), ones(len(d)))
    d = np.flatnonzero(decode & (mode == int(Mode.FULL)))
    yield emit("decode_full_steps_total", lab, d, lab.code(udql[d], sti[d]), ones(len(d)))
    graph = fw & (mode != int(Mode.NONE))
    g = np.flatnonzero(graph & (cols["replayed"] == 1))
    lab = Labels(mode=_MODES, steady=_BOOL)
    yield emit("replays_confirmed_total", lab, g, lab.code(mode[g], sti[g]), ones(len(g)))
    g = np.flatnonzero(graph)
    lab = Labels(steady=_BOOL)
    yield emit("padded_tokens_total", lab, g, sti[g], cols["padded_tokens"][g])
    yield emit("real_tokens_total", lab, g, sti[g], cols["num_tokens"][g])
    yield emit("scheduled_tokens_total", lab, f, s, cols["num_tokens"][f])
    yield emit("serving_seconds_total", lab, f, s, period[f] / 1e9)
    dr = np.flatnonzero(fw & (cols["draft_mode"] >= 0))
    dlab = Labels(mode=_MODES, reason=_REASONS)
    dcode = dlab.code(cols["draft_mode"][dr], cols["draft_reason"][dr] + 1)
    yield emit("draft_steps_total", dlab, dr, dcode, ones(len(dr)))
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
    yield emit("reorder_decisions_total", clab, rrow, ro["changed"][r], ones(len(r)))
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
        totals = np.array(
            [span[st].sum(), hook[st].sum(), span[warm].sum(), hook[warm].sum()], dtype=np.int64
        )
        codes = klab.code(np.array([0, 1, 0, 1]), np.array([1, 1, 0, 0]))
        yield emit("hooked_calls_total", klab, np.full(4, -1), codes, totals)
    if gpu:
        g = np.flatnonzero(~_null(cols, "gpu_busy_ns"))
        yield from _gpu(
            g, cols["gpu_busy_ns"][g], cols["gpu_step_ns"][g], cols["gpu_idle_before_ns"][g],
            _null(cols, "gpu_step_ns")[g] | _null(cols, "gpu_idle_before_ns")[g],
            sti[g], idle[g], emit,
        )  # fmt: skip


def gpu_updates(
    info: ProcessInfo, samples: Sequence[GpuSample], classes: Classes
) -> Iterator[Updates]:
    """The updates of device timings that arrive apart from their steps (a live sink's),
    each of a step ``classes`` has classified (others are older than it remembers: none);
    ``rows``: each one's index in ``samples``."""
    got = [(i, g, classes.get(info.pid, g.step)) for i, g in enumerate(samples)]
    kept = [(i, g, c) for i, g, c in got if c is not None]
    n = NAMESPACE

    def emit(metric: str, lab: Labels, rows: np.ndarray, codes: np.ndarray, values: Any) -> Updates:
        return Updates(f"{n}_{metric}", rows, codes, np.asarray(values), lab)

    rows = np.array([i for i, _, _ in kept], dtype=np.int64)
    busy = np.array([g.busy_ns for _, g, _ in kept], dtype=np.int64)
    step_ns = np.array([g.step_ns if g.step_ns is not None else 0 for _, g, _ in kept], np.int64)
    before = np.array([g.idle_before_ns or 0 for _, g, _ in kept], dtype=np.int64)
    missing = np.array(
        [g.step_ns is None or g.idle_before_ns is None for _, g, _ in kept], dtype=bool
    )
    sti = np.array([int(c[0]) for _, _, c in kept], dtype=np.int64)
    idle = np.array([bool(c[1]) for _, _, c in kept], dtype=bool)
    yield from _gpu(rows, busy, step_ns, before, missing, sti, idle, emit)


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
    rows: np.ndarray,
    busy: np.ndarray,
    step_ns: np.ndarray,
    before: np.ndarray,
    missing: np.ndarray,
    sti: np.ndarray,
    idle: np.ndarray,
    emit: Callable[[str, Labels, np.ndarray, np.ndarray, Any], Updates],
) -> Iterator[Updates]:
    """Device timings (each of step ``rows``; ``missing``: without a step span or an idle
    before it): the forward's busy time of each; the step span, the idle before it and
    whether it was host-bound of each that has them and followed no engine-idle gap."""
    lab = Labels(steady=_BOOL)
    yield emit("forward_gpu_busy_seconds", lab, rows, sti, busy / 1e9)
    t = ~missing & ~idle
    rt, st_ns, bf, s = rows[t], step_ns[t], before[t], sti[t]
    yield emit("gpu_step_seconds", lab, rt, s, st_ns / 1e9)
    yield emit("gpu_idle_before_step_seconds", lab, rt, s, bf / 1e9)
    bound = rules.host_bound(bf, st_ns)
    yield emit("host_bound_steps_total", lab, rt, s, np.where(bound, 1.0, 0.0))


#: one step's updates at its end (epoch ns): (metric, sorted label pairs, value) each
Event = tuple[int, list[tuple[str, tuple[tuple[str, str], ...], float]]]


def column_events(
    info: ProcessInfo,
    batches: Iterable[StepBatch],
    classes: Classes,
    builder: Callable[[Any], str],
    progress: Progress = SILENT,
) -> Iterator[Event]:
    """:func:`exporters.series.step_events` of one process's steps given as column
    batches: each step's updates (:func:`column_updates`, its hooked calls its own) at its
    end (epoch ns), in the order ``updates`` of that step alone makes them; ``classes``
    splits them (its decisions; this process's state starts from none)."""
    cl = classes.for_process()
    base = process_labels(info)
    pairs_of: dict[tuple[str, int], tuple[tuple[str, str], ...]] = {}

    def item(u: Updates, code: int, v: Any) -> tuple[str, tuple[tuple[str, str], ...], Any]:
        pairs = pairs_of.get((u.metric, code))
        if pairs is None:
            pairs = pairs_of[(u.metric, code)] = tuple(sorted({**base, **u.labels(code)}.items()))
        return u.metric, pairs, v

    shift = info.epoch_ns_of(0)  # BOOTTIME to epoch (raises without a clock pair)
    for b in batches:
        ups = list(column_updates(info, b, cl, builder, calls_per_step=True))
        rows, _ = per_step(ups, len(b), item)
        ends = (b.steps["t1_ns"] + shift).tolist()
        for at in range(0, len(b), 256):  # progress a few hundred steps at a time
            yield from zip(ends[at : at + 256], rows[at : at + 256], strict=True)
            progress.advance(min(256, len(b) - at))


T = TypeVar("T")


def per_step(
    ups: Sequence[Updates], n: int, item: Callable[[Updates, int, Any], T]
) -> tuple[list[list[T]], list[T]]:
    """The updates ``ups`` of a batch of ``n`` steps (as :func:`column_updates` gives
    them) as each step's, in the order :func:`exporters.metrics.updates` makes a step's
    (a reorder's moved requests right after its decision), and the batch's own (row -1)
    after; ``item`` makes each of (the metric's updates, a code, a value)."""
    moved = f"{NAMESPACE}_reorder_moved_requests_total"
    decisions = f"{NAMESPACE}_reorder_decisions_total"
    rows: list[list[T]] = [[] for _ in range(n)]
    batch: list[T] = []
    for u in ups:
        if u.metric == moved:
            continue  # each with its decision
        _put(rows, batch, u, item)
        if u.metric == decisions:
            _put(rows, batch, next(x for x in ups if x.metric == moved), item, True)
    return rows, batch


def _put(
    rows: list[list[T]],
    batch: list[T],
    u: Updates,
    item: Callable[[Updates, int, Any], T],
    interleave: bool = False,
) -> None:
    """``u``'s updates appended to their steps' lists (row -1: ``batch``'s);
    ``interleave``: each right after the update of the same index among the last ones
    put on its step (a reorder's moved requests after its decision)."""
    by_row: dict[int, list[T]] = {}
    for row, code, v in zip(u.rows.tolist(), u.codes.tolist(), u.values.tolist(), strict=True):
        by_row.setdefault(row, []).append(item(u, code, v))
    for row, items in by_row.items():
        if row < 0:
            batch += items
        elif interleave:
            firsts = rows[row][-len(items) :]
            rows[row][-len(items) :] = [x for pair in zip(firsts, items, strict=True) for x in pair]
        else:
            rows[row] += items


def batch_of_steps(info: ProcessInfo, steps: Sequence[Step]) -> StepBatch:
    """Steps as a :class:`StepBatch`: their columns
    (:func:`probe.analysis.summary.columns_of_steps`' and the draft's, the NULL bits), their
    builds (``builder``: its number) and reorders, and each forward step's hooked calls
    counted from its records with ``info``'s calibration
    (:func:`probe.analysis.cost.calls_with`)."""
    from probe.analysis.cost import calls_with
    from probe.analysis.summary import columns_of_steps

    n = len(steps)

    def arr(vals: Iterable[int]) -> np.ndarray:
        return np.fromiter(vals, dtype=np.int64, count=n)

    def opt(v: int | None) -> int:
        return -1 if v is None else int(v)

    cols = columns_of_steps(steps)
    cols["draft_mode"] = arr(opt(s.draft_mode) for s in steps)
    cols["draft_reason"] = arr(opt(s.draft_reason) for s in steps)
    nulls = np.zeros(n, dtype=np.int64)
    for name in ("cpu_launch_overhead_ns", "gpu_busy_ns", "gpu_idle_before_ns", "gpu_step_ns"):
        nulls |= arr(getattr(s, name) is None for s in steps) << NULL_BITS[name]
    cols["_nulls"] = nulls
    cal = info.calibration
    if cal is not None:
        calls = [calls_with(s, cal) if s.forward else (-1, -1) for s in steps]
        cols["_span_calls"] = arr(a for a, _ in calls)
        cols["_hook_calls"] = arr(h for _, h in calls)
    tags = list(BuildTag)
    builds = [(j, b) for j, s in enumerate(steps) for b in s.builds]
    reorders = [(j, o) for j, s in enumerate(steps) for o in s.reorders]
    k = len(builds)
    details: dict[str, dict[str, Any]] = {
        "builds": {
            "row": np.fromiter((j for j, _ in builds), np.int64, count=k),
            "tag": np.fromiter((tags.index(b.tag) for _, b in builds), np.int64, count=k),
            "drafter": np.fromiter((b.flags & 1 for _, b in builds), np.int64, count=k),
            "t0_ns": np.fromiter((b.t0 for _, b in builds), np.int64, count=k),
            "t1_ns": np.fromiter((b.t1 for _, b in builds), np.int64, count=k),
            "builder": [b.builder_id for _, b in builds],
        },
        "reorders": {
            "row": np.fromiter((j for j, _ in reorders), np.int64, count=len(reorders)),
            "changed": np.fromiter((o.changed for _, o in reorders), np.int64, len(reorders)),
            "moved": np.fromiter((o.moved for _, o in reorders), np.int64, len(reorders)),
        },
    }
    return StepBatch(cols, details)


def builder_of_id(info: ProcessInfo) -> Callable[[Any], str]:
    """A Step's build's builder label by its builder's number."""
    return lambda bid: info.builder_names.get(bid, f"<builder {bid}>")


def step_updates(
    info: ProcessInfo, steps: Sequence[Step], gpu: Sequence[GpuSample], classes: Classes
) -> list[Updates]:
    """The updates of a batch of Steps and of device timings that arrive apart (a live
    sink's) as arrays, a metric at a time: :func:`column_updates` of
    :func:`batch_of_steps` (classified by ``classes``), then :func:`gpu_updates` (rows:
    each timing's index in ``gpu``)."""
    return _of_steps(info, steps, classes) + _of_gpu(info, gpu, classes)


def _of_steps(info: ProcessInfo, steps: Sequence[Step], classes: Classes) -> list[Updates]:
    if not steps:
        return []
    b = batch_of_steps(info, steps)
    split = _split_of_steps(classes, b.steps)
    return list(column_updates(info, b, classes, builder_of_id(info), split=split, gpu=False))


def _of_gpu(info: ProcessInfo, gpu: Sequence[GpuSample], classes: Classes) -> list[Updates]:
    return list(gpu_updates(info, gpu, classes)) if gpu else []


def updates_of_steps(
    info: ProcessInfo, steps: Sequence[Step], gpu: Sequence[GpuSample], classes: Classes
) -> Iterator[tuple[str, dict[str, str], Any]]:
    """:func:`exporters.metrics.updates` as (metric, labels, value): each step's updates
    (:func:`step_updates`) in the step's order, the batch's hooked calls, then each device
    timing's."""
    base = process_labels(info)

    def item(u: Updates, code: int, v: Any) -> tuple[str, dict[str, str], Any]:
        return u.metric, {**base, **u.labels(code)}, v

    # the steps first (classified), then the device timings of steps classified by now
    rows, batch = per_step(_of_steps(info, steps, classes), len(steps), item)
    for r in rows:
        yield from r
    yield from batch
    rows, _ = per_step(_of_gpu(info, gpu, classes), len(gpu), item)
    for r in rows:
        yield from r


def _split_of_steps(
    classes: Classes, cols: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`classes_of` of a batch of Steps, whatever processes they are of (each
    process's rows classified as its own, in the order given)."""
    pid = cols["pid"]
    pids = list(dict.fromkeys(pid.tolist()))
    if len(pids) == 1:
        return classes_of(classes, pids[0], cols)
    st, idle = np.zeros(len(pid), bool), np.zeros(len(pid), bool)
    period, gap = np.zeros(len(pid), np.int64), np.zeros(len(pid), np.int64)
    for p in pids:
        at = np.flatnonzero(pid == p)
        got = classes_of(classes, p, {k: v[at] for k, v in cols.items()})
        for out, x in zip((st, idle, period, gap), got, strict=True):
            out[at] = x
    return st, idle, period, gap


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
    sources = [(info, step_batches(rec, info.pid, batch, tables, counts)) for info in infos]
    for info, b in in_turns(sources):
        sink.step_columns(info, b)
        progress.advance(len(b))
        n += len(b)
    return n


def rank_steps(batch: StepBatch) -> Sequence[Any]:
    """The batch's steps as Steps without their records (what ranks side by side reads)."""
    from probe.reader.recording_batches import step_kwargs
    from probe.step import new_step

    return [new_step(**kw) for kw in step_kwargs(batch.steps)]
