"""Two arms of an A/B, the same workload under two settings, compared like with like: the
figures ``probe ab`` prints, each B/A with a 95% interval, and the verdict
(``docs/rules.md``, "A/B", says the same for people, with the method's measured error).

    >>> from probe.analysis.ab import compare, read_run
    >>> from probe.reader.recording import Recording, default_recording
    >>> run = read_run(Recording.open(default_recording()))
    >>> cmp = compare([run], [run])
    >>> cmp["pairing"]["matched"], cmp["metrics"]["steady_tokens_per_s"]["ratio_B_over_A"]
    (True, 1.0)

**Pairing.** Both arms usually ran the same workload, so their steady steps pair by batch
shape (:data:`SHAPE_KEY`): per shape, each arm's mean; per arm, those means weighted by
the shape's share of the steps (the mean of the two arms' shares, so both arms are read
under one mix); B/A the ratio of the two. Throughput is tokens per second of serving
time under that mix (a shape's tokens are the same in both arms, so throughput B/A is
the ratio of the mean step periods). The A and B columns are each arm's own steady
figures (the summary's, the mean over its recordings). When the mixes are the same B/A
is their ratio; when they differ a little, B/A is the paired one, and the difference in
mix is not read as a difference in speed.

**Interval.** With two or more recordings in an arm, over the repetitions: each
recording's paired figure, the log figures' variance within each arm pooled over both
arms and with :data:`RUN_SPREAD` (at :data:`RUN_SPREAD_DF` degrees of freedom), a Student
t on the log ratio. With one recording per arm, over the variation within them: each
recording cut into :data:`BLOCKS` runs of consecutive steps, the b-th run of A paired
with the b-th of B (the same part of the workload), the ratio estimator's variance with
those pairs as clusters; plus an allowance of :data:`RUN_SPREAD` per arm for the spread
between runs, which one run cannot show. The design is taken out (small batches late in
a varied-length run are not slower for that), the drift within a run stays in.

**Workloads that differ.** When the arms' shape mixes differ by more than
:data:`MIX_TOLERANCE` (total variation distance over the shares of steps), the steps do
not pair: the figures are each arm's own, and the intervals are over repetitions, or
over :data:`BLOCKS` runs of consecutive steps (which differ by design where the batch
changes over a run), and the comparison says so.

A verdict names the faster arm only where the throughput interval excludes 1.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from probe.analysis.rules import STEADY
from probe.analysis.summary import Summary
from probe.records import Mode

__all__ = [
    "BLOCKS",
    "FIGURES",
    "MIX_TOLERANCE",
    "RUN_SPREAD",
    "RUN_SPREAD_DF",
    "SHAPE_KEY",
    "Run",
    "RunSteps",
    "compare",
    "read_run",
    "run_of",
    "run_steps",
    "steps_of_columns",
    "t95",
]

#: the figures compared: key, label, and which way is better (1: higher, -1: lower)
FIGURES: tuple[tuple[str, str, int], ...] = (
    ("steady_tokens_per_s", "steady throughput (tokens/s)", 1),
    ("steady_host_ns", "steady host time per step", -1),
    ("cpu_launch_overhead_ns", "CPU launch overhead (mean)", -1),
    ("decode_full_share", "decode FULL share", 1),
    ("forward_launch_ns", "forward launch (mean)", -1),
    ("draft_ns", "draft (mean)", -1),
)
#: runs of consecutive steps per recording, for an interval within the recordings
BLOCKS = 10
#: the arms' shape mixes pair when they differ by at most this (total variation distance
#: over the shares of steps): the steps left unpaired are then at most this share
MIX_TOLERANCE = 0.10
#: one run's figures spread around their setting's mean by this much between runs
#: (standard deviation of the log): what one recording per arm cannot show, so its
#: interval carries it (see docs/rules.md for where the figure comes from)
RUN_SPREAD = 0.04
#: ... measured with this many degrees of freedom (two arms of five repetitions)
RUN_SPREAD_DF = 8
#: what a batch shape is. Not the graph mode, which is what the arms change (FULL in one,
#: PIECEWISE in the other, for the same batch); the scheduler's batch, which the workload
#: decides: whether it is a uniform decode batch, its requests and its scheduled tokens.
#: A mixed batch's composition (its longest query) is left out: its cost follows its
#: tokens and requests, and a finer key leaves more steps without a partner.
SHAPE_KEY = "uniform decode, requests, scheduled tokens"

# the per-step values behind each figure (throughput: the step's period)
_VALUE_OF = {
    "steady_tokens_per_s": "period_ns",
    "steady_host_ns": "host_ns",
    "cpu_launch_overhead_ns": "cpu_launch_overhead_ns",
    "decode_full_share": "decode_full",
    "forward_launch_ns": "forward_launch_ns",
    "draft_ns": "draft_ns",
}

# two-sided 95% Student t quantiles by degrees of freedom (1..30; above: 1.96)
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
    2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
    2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t95(df: float) -> float:
    """The two-sided 95% Student t quantile at ``df`` degrees of freedom (rounded down;
    1.96 above 30)."""
    if not df >= 1:
        raise ValueError(f"t95: degrees of freedom must be at least 1, got {df}")
    return _T95[math.floor(df) - 1] if df < len(_T95) + 1 else 1.96


# -- one recording's steps -------------------------------------------------------------------


@dataclass
class RunSteps:
    """A recording's steady forward steps (the rules of :mod:`probe.analysis.rules`), one
    entry per step and rank in (pid, step) order: ``row`` its position among all the
    recording's ``rows``, ``shape`` its batch shape (:data:`SHAPE_KEY`, as one code),
    ``tokens``, and per value behind a figure (:data:`_VALUE_OF`) a float, NaN where the
    step has none."""

    rows: int
    pid: np.ndarray
    step: np.ndarray
    row: np.ndarray
    shape: np.ndarray
    tokens: np.ndarray
    values: dict[str, np.ndarray]

    def take(self, keep: np.ndarray) -> RunSteps:
        """The steps where ``keep`` (a mask or indices), as a run of their own."""
        return RunSteps(
            self.rows,
            self.pid[keep],
            self.step[keep],
            self.row[keep],
            self.shape[keep],
            self.tokens[keep],
            {k: v[keep] for k, v in self.values.items()},
        )


_TOKENS = (1 << 32) - 1


def shape_codes(uniform: np.ndarray, reqs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """:data:`SHAPE_KEY` as one integer per step (its low 32 bits: the tokens)."""
    code: np.ndarray = (
        (uniform.astype(np.int64) << 56)
        | (np.minimum(reqs, (1 << 24) - 1).astype(np.int64) << 32)
        | np.minimum(tokens, _TOKENS).astype(np.int64)
    )
    return code


def run_steps(rec: Any) -> RunSteps:
    """A recording's steady steps, as :class:`RunSteps` (one pass over its columns)."""
    from probe.reader.recording_columns import iter_step_columns

    return steps_of_columns(iter_step_columns(rec))


def steps_of_columns(chunks: Iterable[Mapping[str, np.ndarray]]) -> RunSteps:
    """The steady steps of column chunks in (pid, step) order (those of
    :func:`probe.reader.recording_columns.iter_step_columns`, or
    :func:`probe.analysis.summary.columns_of_steps`), classed by
    :class:`probe.analysis.summary.Summary` as every figure is."""
    s = Summary()
    parts: list[dict[str, np.ndarray]] = []
    rows = 0
    for cols in chunks:
        s.add_columns(cols)
        raw, period = s.last[0], s.last[4]
        decode = (cols["uniform"] == 1) & (cols["uniform_decode_query_len"] >= 1)
        clo = cols["cpu_launch_overhead_ns"]
        parts.append(
            {
                "pid": cols["pid"],
                "step": cols["step"],
                "row": rows + np.arange(len(raw)),
                "raw": raw,
                "shape": shape_codes(cols["uniform"], cols["num_reqs"], cols["num_tokens"]),
                "tokens": cols["num_tokens"],
                "period_ns": period.astype(np.float64),
                "host_ns": np.where(cols["host_ns"] > 0, cols["host_ns"], np.nan),
                "cpu_launch_overhead_ns": np.where(clo >= 0, clo, np.nan),
                "decode_full": np.where(
                    decode, (cols["mode"] == int(Mode.FULL)).astype(np.float64), np.nan
                ),
                "forward_launch_ns": cols["forward_launch_ns"].astype(np.float64),
                "draft_ns": cols["draft_ns"].astype(np.float64),
            }
        )
        rows += len(raw)
    if not parts:
        e = np.zeros(0, dtype=np.int64)
        return RunSteps(0, e, e, e, e, e, {v: e.astype(np.float64) for v in _VALUE_OF.values()})
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    keep = s.settled(cat["pid"], cat["step"], cat["raw"]) == STEADY
    return RunSteps(
        rows,
        cat["pid"][keep],
        cat["step"][keep],
        cat["row"][keep],
        cat["shape"][keep],
        cat["tokens"][keep],
        {v: cat[v][keep].astype(np.float64) for v in _VALUE_OF.values()},
    )


@dataclass
class Run:
    """One recording's part in an A/B: its own steady figures (the summary's), its steady
    mode/reason counts, its headline, and its steady steps for the pairing."""

    recording: str
    forward_steps: int
    steady_steps: int
    figures: dict[str, float | None]
    reasons: Counter[str]
    headline: dict[str, Any]
    steps: RunSteps = field(repr=False)


def read_run(rec: Any, name: str | None = None) -> Run:
    """One recording as a :class:`Run` (its summary, and its steps for the pairing)."""
    from probe.analysis.summary_read import summarize_recording

    return run_of(summarize_recording(rec), run_steps(rec), str(rec.path) if name is None else name)


def run_of(summary: Summary, steps: RunSteps, name: str) -> Run:
    """A :class:`Run` of a recording's (or a set of steps') summary and steady steps."""
    from probe.analysis.summary_read import ab_values

    fig = summary.figures()
    reasons: Counter[str] = Counter()
    for r in fig["miss_reasons"]:
        if int(r["steady"]):
            reasons[f"{r['mode']}/{r['reason']}"] += int(r["steady"])
    return Run(
        name,
        int(fig["forward_steps"]),
        int(fig["steady_steps"]),
        ab_values(summary),
        reasons,
        fig["headline"],
        steps,
    )


# -- the pairing -----------------------------------------------------------------------------


@dataclass
class _Engine:
    """An arm's steps as the engine took them: the ranks of a step number averaged (TP
    ranks run the same batch at once), in step order, recording after recording."""

    shape: np.ndarray
    tokens: np.ndarray
    run: np.ndarray  # which recording of the arm
    block: np.ndarray  # which tenth of its recording (the b-th of each recording pair)
    values: dict[str, np.ndarray]


def _engine(runs: Sequence[RunSteps]) -> _Engine:
    shapes, tokens, run_ids, blocks = [], [], [], []
    values: dict[str, list[np.ndarray]] = {v: [] for v in _VALUE_OF.values()}
    for i, r in enumerate(runs):
        if len(r.step) == 0:
            continue
        order = np.lexsort((r.shape, r.step))
        step, shape = r.step[order], r.shape[order]
        new = np.ones(len(step), dtype=bool)
        new[1:] = (step[1:] != step[:-1]) | (shape[1:] != shape[:-1])
        first = np.flatnonzero(new)
        n = len(first)
        shapes.append(shape[first])
        tokens.append(r.tokens[order][first])
        run_ids.append(np.full(n, i))
        b = np.zeros(n, dtype=np.int64)
        for j, part in enumerate(np.array_split(np.arange(n), min(BLOCKS, n))):
            b[part] = j
        blocks.append(b)
        for v in values:
            x = r.values[v][order]
            ok = ~np.isnan(x)
            tot = np.add.reduceat(np.where(ok, x, 0.0), first)
            cnt = np.add.reduceat(ok.astype(np.float64), first)
            with np.errstate(invalid="ignore", divide="ignore"):
                values[v].append(np.where(cnt > 0, tot / cnt, np.nan))
    if not shapes:
        e = np.zeros(0, dtype=np.int64)
        return _Engine(e, e, e, e, {v: e + 0.0 for v in values})
    return _Engine(
        np.concatenate(shapes),
        np.concatenate(tokens),
        np.concatenate(run_ids),
        np.concatenate(blocks),
        {v: np.concatenate(x) for v, x in values.items()},
    )


def _shares(e: _Engine) -> dict[int, float]:
    u, n = np.unique(e.shape, return_counts=True)
    return {int(s): float(c) / len(e.shape) for s, c in zip(u, n, strict=True)}


def mix_difference(a: Mapping[int, float], b: Mapping[int, float]) -> float:
    """The total variation distance of two shape mixes (shape -> share of steps): the
    share of steps that would have to change shape for one to become the other."""
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


@dataclass
class _Paired:
    value: float  # the arm's mean under the common mix
    parts: np.ndarray  # what each b-th run of consecutive steps adds to it
    per_run: list[float]  # each recording's, for the interval over repetitions


def _paired(e: _Engine, v: str, w: Mapping[int, float], nruns: int) -> _Paired | None:
    """One arm's paired figure: per shape the mean of value ``v``, weighted by ``w``;
    what the steps of each b-th run of consecutive steps of its recordings add to it;
    each recording's own figure (a shape it lacks read at the arm's mean)."""
    x = e.values[v]
    ok = ~np.isnan(x) & np.isin(e.shape, list(w))
    if not ok.any():
        return None
    shape, x, run, block = e.shape[ok], x[ok], e.run[ok], e.block[ok]
    u, inv, n = np.unique(shape, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    mean = np.bincount(inv, weights=x, minlength=len(u)) / n
    wt = np.array([w[int(s)] for s in u])
    parts = np.bincount(block, weights=(wt / n)[inv] * x, minlength=BLOCKS)
    per_run = []
    for r in range(nruns):
        mine = run == r
        if not mine.any():
            continue
        tot = np.bincount(inv[mine], weights=x[mine], minlength=len(u))
        cnt = np.bincount(inv[mine], minlength=len(u))
        own = np.where(cnt > 0, tot / np.maximum(cnt, 1), mean)
        per_run.append(float(wt @ own))
    return _Paired(float(wt @ mean), parts, per_run)


def _mean_se(xs: Sequence[float]) -> tuple[float, float | None, int]:
    """Mean, its standard error (None for one value) and the degrees of freedom."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, None, 0
    return m, statistics.stdev(xs) / len(xs) ** 0.5, len(xs) - 1


def over_repetitions(a: Sequence[float], b: Sequence[float]) -> dict[str, float | None]:
    """B/A of the means, with a 95% interval from the relative standard errors (delta
    method on the log ratio, Student t at the smaller arm's degrees of freedom)."""
    ma, sa, da = _mean_se(a)
    mb, sb, db = _mean_se(b)
    if not ma:
        return {"ratio": None, "low": None, "high": None}
    r = mb / ma
    if sa is None or sb is None or not mb or r <= 0:
        return {"ratio": r, "low": None, "high": None}
    rel = math.hypot(sa / ma, sb / mb)
    t = t95(min(da, db))
    return {"ratio": r, "low": r * math.exp(-t * rel), "high": r * math.exp(t * rel)}


def _within(num: _Paired, den: _Paired, allowance: float) -> dict[str, float | None]:
    """``num / den`` with a 95% interval from the b-th runs of consecutive steps of the two
    arms taken as pairs (the same part of the workload): the ratio estimator's variance
    with the pairs as clusters, plus ``allowance`` (a variance of the log ratio, known
    exactly), a Student t on the log ratio at Welch's degrees of freedom."""
    out: dict[str, float | None] = {"ratio": None, "low": None, "high": None}
    if not den.value:
        return out
    r = num.value / den.value
    out["ratio"] = r
    k = int(((num.parts != 0) | (den.parts != 0)).sum())
    if r <= 0 or k < 2:
        return out
    dev = num.parts - r * den.parts
    var = k / (k - 1) * float((dev**2).sum()) / num.value**2
    se = math.sqrt(var + allowance)
    t = t95((var + allowance) ** 2 / (var**2 / (k - 1)) if var > 0 else math.inf)
    out["low"], out["high"] = r * math.exp(-t * se), r * math.exp(t * se)
    return out


# -- the present method, where the steps do not pair -----------------------------------------


def _blocks(r: RunSteps) -> list[dict[str, float | None]]:
    """Each figure of :data:`BLOCKS` runs of consecutive rows of a recording (its steady
    steps in them)."""
    size = max(1, -(-r.rows // BLOCKS))
    which = r.row // size
    out = []
    for b in range(-(-r.rows // size) if r.rows else 0):
        m = which == b
        fig: dict[str, float | None] = {}
        for key, v in _VALUE_OF.items():
            x = r.values[v][m]
            if key == "steady_tokens_per_s":
                per = float(x.sum())
                fig[key] = float(r.tokens[m].sum()) / per * 1e9 if per > 0 else None
            else:
                x = x[~np.isnan(x)]
                fig[key] = float(x.mean()) if len(x) else None
        out.append(fig)
    return out


def _unpaired(
    key: str, a: Sequence[Run], b: Sequence[Run], reps: int
) -> dict[str, float | None] | None:
    va = [v for x in a if (v := x.figures.get(key)) is not None]
    vb = [v for x in b if (v := x.figures.get(key)) is not None]
    if not va or not vb:
        return None
    if reps >= 2:
        iv = over_repetitions(va, vb)  # type: ignore[arg-type]
    else:
        ma, mb = statistics.fmean(va), statistics.fmean(vb)  # type: ignore[arg-type]
        point = mb / ma if ma else None
        iv = {"ratio": point, "low": None, "high": None}
        ba = [f[key] for x in a for f in _blocks(x.steps) if f.get(key) is not None]
        bb = [f[key] for x in b for f in _blocks(x.steps) if f.get(key) is not None]
        if point and len(ba) > 1 and len(bb) > 1:
            # the runs' spread, around the whole runs' B/A (the point the table shows)
            b_iv = over_repetitions(ba, bb)  # type: ignore[arg-type]
            if b_iv["low"] is not None and b_iv["ratio"]:
                iv["low"] = point * b_iv["low"] / b_iv["ratio"]
                iv["high"] = point * b_iv["high"] / b_iv["ratio"]  # type: ignore[operator]
    return {"A": statistics.fmean(va), "B": statistics.fmean(vb), **iv}  # type: ignore[arg-type]


# -- the comparison --------------------------------------------------------------------------


def compare(a: Sequence[Run], b: Sequence[Run], tolerance: float = MIX_TOLERANCE) -> dict[str, Any]:
    """The arms side by side (plain data, what every surface renders): per figure each
    arm's value, B/A and its 95% interval; how the steps paired (``pairing``; they pair
    when the shape mixes differ by at most ``tolerance``); what the interval is over
    (``interval_over``); the steady mode/reason counts over every recording of an arm
    (the three commonest); the verdict, and ``notes`` that say what the reader should
    know about the method on these data."""
    if not a or not b:
        raise ValueError("compare: each arm needs a recording")
    reps = min(len(a), len(b))
    ea, eb = _engine([x.steps for x in a]), _engine([x.steps for x in b])
    sa, sb = _shares(ea), _shares(eb)
    diff = mix_difference(sa, sb) if sa and sb else 1.0
    both = set(sa) & set(sb)
    matched = diff <= tolerance and bool(both)
    pairing = {
        "key": SHAPE_KEY,
        "matched": matched,
        "mix_difference": diff,
        "tolerance": tolerance,
        "shapes": {"A": len(sa), "B": len(sb), "both": len(both)},
        "paired_share": {
            "A": sum(sa[s] for s in both),
            "B": sum(sb[s] for s in both),
        },
    }
    several = max(len(a), len(b)) >= 2
    if matched:
        over = (
            "repetitions, steps paired by batch shape"
            if several
            else f"{BLOCKS} runs of consecutive steps within each recording and the "
            "run-to-run spread, steps paired by batch shape"
        )
    else:
        over = (
            "repetitions"
            if reps >= 2
            else f"{BLOCKS} runs of consecutive steps within each recording"
        )
    out: dict[str, Any] = {
        "reps": {"A": len(a), "B": len(b)},
        "interval_over": over,
        "pairing": pairing,
        "metrics": {},
    }
    w = {s: 0.5 * (sa[s] + sb[s]) for s in both}
    for key, label, better in FIGURES:
        m = _figure(key, ea, eb, w, len(a), len(b)) if matched else None
        if m is None and not matched:
            m = _unpaired(key, a, b, reps)
        if m is None:
            continue
        # each arm's own figure (the summary's, as every surface shows it); B/A is the
        # paired one, equal to B over A where the mixes are the same
        own_a, own_b = _own(key, a), _own(key, b)
        if own_a is not None and own_b is not None:
            m["A"], m["B"] = own_a, own_b
        out["metrics"][key] = {
            "label": label,
            "better": "higher" if better > 0 else "lower",
            "A": m["A"],
            "B": m["B"],
            "ratio_B_over_A": m["ratio"],
            "low": m["low"],
            "high": m["high"],
        }
    out["reasons"] = {
        arm: dict(_sum_reasons(runs).most_common(3)) for arm, runs in (("A", a), ("B", b))
    }
    out["headline"] = {"A": a[0].headline, "B": b[0].headline}
    out["verdict"] = verdict(out)
    out["notes"] = _notes(out)
    return out


def _own(key: str, runs: Sequence[Run]) -> float | None:
    """An arm's own figure: the mean of its recordings' (those that have it)."""
    vals = [v for x in runs if (v := x.figures.get(key)) is not None]
    return statistics.fmean(vals) if vals else None


def _sum_reasons(runs: Sequence[Run]) -> Counter[str]:
    tot: Counter[str] = Counter()
    for r in runs:
        tot.update(r.reasons)
    return tot


def _figure(
    key: str,
    ea: _Engine,
    eb: _Engine,
    w: Mapping[int, float],
    na: int,
    nb: int,
) -> dict[str, float | None] | None:
    """One figure under the common mix ``w`` (the shapes both arms have a value for)."""
    v = _VALUE_OF[key]

    def valued(e: _Engine) -> set[int]:
        return {int(s) for s in np.unique(e.shape[~np.isnan(e.values[v])])}

    common = valued(ea) & valued(eb) & set(w)
    if not common:
        return None
    tot = sum(w[s] for s in common)
    wf = {s: w[s] / tot for s in common}
    pa, pb = _paired(ea, v, wf, na), _paired(eb, v, wf, nb)
    if pa is None or pb is None:
        return None
    if key == "steady_tokens_per_s":
        # tokens per second under the mix: a shape's tokens are the same in both arms
        tokens = sum(wf[s] * (s & _TOKENS) for s in common)

        def conv(p: float) -> float | None:
            return tokens / p * 1e9 if p > 0 else None

        ra = [x for x in map(conv, pa.per_run) if x is not None]
        rb = [x for x in map(conv, pb.per_run) if x is not None]
        va, vb = conv(pa.value), conv(pb.value)
    else:
        ra, rb = pa.per_run, pb.per_run
        va, vb = pa.value, pb.value
    if va is None or vb is None:
        return None
    if max(na, nb) >= 2:
        return {"A": statistics.fmean(ra), "B": statistics.fmean(rb), **_pooled(ra, rb)}
    # throughput B/A is the ratio of A's mean period to B's
    allow = 2 * RUN_SPREAD**2
    iv = _within(pa, pb, allow) if key == "steady_tokens_per_s" else _within(pb, pa, allow)
    return {"A": va, "B": vb, **iv}


def _pooled(a: Sequence[float], b: Sequence[float]) -> dict[str, float | None]:
    """B/A of the means of the recordings' figures, with a 95% interval from their spread
    between runs: the log figures' variance within each arm, pooled over both arms and
    with :data:`RUN_SPREAD` at :data:`RUN_SPREAD_DF` degrees of freedom (the committed
    recordings' repetitions, so that two runs do not say less than one), a Student t on
    the log ratio."""
    out: dict[str, float | None] = {"ratio": None, "low": None, "high": None}
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    if ma <= 0 or mb <= 0 or min(*a, *b) <= 0:
        out["ratio"] = mb / ma if ma else None
        return out
    r = mb / ma
    ss = sum((math.log(x) - statistics.fmean(map(math.log, xs))) ** 2 for xs in (a, b) for x in xs)
    df = RUN_SPREAD_DF + len(a) + len(b) - 2
    spread = (RUN_SPREAD_DF * RUN_SPREAD**2 + ss) / df
    se = math.sqrt(spread * (1 / len(a) + 1 / len(b)))
    t = t95(df)
    return {"ratio": r, "low": r * math.exp(-t * se), "high": r * math.exp(t * se)}


def verdict(cmp: Mapping[str, Any]) -> str:
    """The verdict on steady throughput: the faster arm only where its interval excludes
    1."""
    m = cmp["metrics"].get("steady_tokens_per_s")
    if not m or m["ratio_B_over_A"] is None:
        return "no steady throughput in one of the arms: no verdict"
    r, lo, hi = m["ratio_B_over_A"], m["low"], m["high"]
    if lo is None or hi is None:
        return f"steady throughput B/A {r:.3f}, no interval: no verdict"
    if hi < 1:
        return (
            f"A is faster: steady throughput B/A {r:.3f} [{lo:.3f}, {hi:.3f}] "
            f"(B {1 - r:.0%} slower; interval over {cmp['interval_over']})"
        )
    if lo > 1:
        return (
            f"B is faster: steady throughput B/A {r:.3f} [{lo:.3f}, {hi:.3f}] "
            f"(B {r - 1:.0%} faster; interval over {cmp['interval_over']})"
        )
    return (
        f"no difference shown: steady throughput B/A {r:.3f} [{lo:.3f}, {hi:.3f}] includes 1 "
        f"(interval over {cmp['interval_over']})"
    )


def _notes(cmp: Mapping[str, Any]) -> list[str]:
    """What to know about the method on these data, in words."""
    p = cmp["pairing"]
    na, nb = cmp["reps"]["A"], cmp["reps"]["B"]
    notes = []
    if p["matched"]:
        notes.append(
            f"steps paired by batch shape ({p['key']}): {p['shapes']['both']} shapes, "
            f"{p['paired_share']['A']:.1%} of A's steps and {p['paired_share']['B']:.1%} "
            f"of B's; the mixes differ by {p['mix_difference']:.1%} of steps (pairing "
            f"up to {p['tolerance']:.0%}); each figure is per shape, weighted by the "
            "shape's share of both arms' steps"
        )
    else:
        notes.append(
            f"the workloads differ: the arms' batch-shape mixes ({p['key']}) differ by "
            f"{p['mix_difference']:.1%} of steps, over the {p['tolerance']:.0%} within which "
            "steps pair; the figures are each arm's own"
            + (
                ""
                if min(na, nb) >= 2
                else f", and the intervals over {BLOCKS} runs of consecutive steps, which "
                "differ by design where the batch changes over a run"
            )
        )
    arms = f"{na} recording{'s' if na != 1 else ''} of A and {nb} of B"
    if p["matched"] and max(na, nb) < 2:
        notes.append(
            "one recording per arm: the intervals are over the variation within each "
            f"(its {BLOCKS} runs of consecutive steps paired with the other arm's), with an "
            f"allowance of {RUN_SPREAD:.0%} per arm for the spread between runs, which one "
            "run cannot show (measured between the repetitions of the committed H200 "
            "recordings; --reps 5 measures it on this workload)"
        )
    elif p["matched"]:
        notes.append(
            f"{arms}: the intervals are over the repetitions, their spread pooled over "
            f"both arms and with the committed recordings' ({RUN_SPREAD:.0%} at "
            f"{RUN_SPREAD_DF} degrees of freedom)"
            + ("; an arm of one recording is taken to spread as much" if min(na, nb) < 2 else "")
        )
    elif min(na, nb) < 2:
        notes.append(
            f"{arms}: the intervals are over runs of consecutive steps within the "
            "recordings (the run-to-run spread is not in them; two or more recordings per "
            "arm give intervals over repetitions)"
        )
    return notes
