"""The probe's metric set: one definition for Prometheus, OTLP and the dashboards.

Every name is in the ``vllm_graph_probe_`` namespace and carries its unit
(``_seconds``, ``_tokens_total``, ``_steps_total``). Every series carries the process
labels vLLM's own metrics use (``model_name``, ``engine``: the DP engine index) plus
``pid``, the ranks (``tp_rank``, ``pp_rank``, ``dp_rank``) and ``host`` (the machine it
runs on: a fleet's series apart, and a pid is one process only on its host). Ratios are
never exported: they are two counters and the PromQL in :data:`RATIOS`, which the
dashboards use verbatim.
The series of steps carry ``steady`` (``true``: a steady-state step by the rules of
:mod:`probe.analysis.rules`, as the report splits them; ``false``: warm-up), and the device timings
leave out the step after an engine-idle gap, which ``engine_idle_seconds_total`` counts.

:func:`updates` is the single translation of steps into metric updates; the Prometheus
and OTLP sinks only apply what it yields, so both report the same numbers, with the
definitions of :mod:`probe.analysis.summary` (forward steps only; padding over graph steps)::

    >>> from exporters.metrics import METRICS, RATIOS
    >>> METRICS["vllm_graph_probe_steps_total"].labels
    ('mode', 'reason', 'steady')
    >>> print(RATIOS["decode_full_hit_rate"])  # doctest: +NORMALIZE_WHITESPACE
    sum(rate(vllm_graph_probe_decode_full_steps_total{steady="true"}[5m])
        or 0 * rate(vllm_graph_probe_decode_steps_total{steady="true"}[5m]))
      / sum(rate(vllm_graph_probe_decode_steps_total{steady="true"}[5m]))

OTLP uses the same names without the ``_total`` suffix, the same explicit buckets, and
units the Collector's Prometheus translation adds nothing for (``s`` on names that end in
``_seconds``, ``{step}``-style annotations, ``{info}`` on info gauges); it adds
``_total`` back to monotonic sums, so a dashboard works on either path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from exporters.base import NAMESPACE as NAMESPACE
from exporters.base import ProcessInfo
from exporters.base import process_labels as process_labels
from probe.analysis import views as analysis
from probe.analysis.cost import TIMINGS, has_timing
from probe.analysis.ranks import RankId, StepRanks
from probe.analysis.ranks_live import RankMatcher
from probe.analysis.steady import Classes
from probe.step import GpuSample, Step

PROCESS_LABELS: tuple[str, ...] = (
    "model_name", "engine", "pid", "tp_rank", "pp_rank", "dp_rank", "host",
)  # fmt: skip

Kind = Literal["counter", "histogram", "gauge"]

# An info gauge's unit: a UCUM annotation (dimensionless), which the Collector's
# Prometheus translation drops. Unit "1" would make it append `_ratio` to a gauge
# (pkg/translator/prometheus, normalizeName), and the dashboards' names would not match.
INFO_UNIT = "{info}"

# Explicit buckets, the same on the Prometheus and the OTLP path: the Collector turns OTLP
# exponential histograms into native histograms, which have no `_bucket{le}` series for
# the dashboards' quantiles and heatmap (OTLP can still opt into them). Launch overhead on the
# H200 recording runs 2 ms .. 1.2 s with a median near 3 ms; on MI355X it is expected lower.
LAUNCH_BUCKETS = (
    50e-6, 100e-6, 200e-6, 300e-6, 500e-6, 750e-6, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3, 5e-3,
    7.5e-3, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
PHASE_BUCKETS = (
    1e-6, 5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 0.01,
    0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
# le="0" counts steps whose forward found the GPU already waiting for nothing (not idle)
GPU_BUCKETS = (
    0.0, 10e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
    0.25, 1.0, 5.0,
)  # fmt: skip
BUILD_BUCKETS = PHASE_BUCKETS
# a rank's lead over the others at a step: tens of microseconds (one host, graphs) to a
# step period and more (a rank's host a step behind)
SKEW_BUCKETS = (
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05,
    0.1, 0.25, 1.0,
)  # fmt: skip


@dataclass(frozen=True)
class Metric:
    """One metric. ``name`` is the Prometheus exposition name; ``unit`` is UCUM for OTLP."""

    name: str
    kind: Kind
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def otel_name(self) -> str:
        return self.name.removesuffix("_total")

    @property
    def all_labels(self) -> tuple[str, ...]:
        return PROCESS_LABELS + self.labels


def _m(
    name: str,
    kind: Kind,
    unit: str,
    help: str,
    labels: tuple[str, ...] = (),
    buckets: tuple[float, ...] = (),
) -> Metric:
    return Metric(f"{NAMESPACE}_{name}", kind, unit, help, labels, buckets)


_DEFS = (
    # -- graph decisions: ratios below
    _m(
        "steps_total",
        "counter",
        "{step}",
        "Forward engine steps by dispatched graph mode (full, piecewise, none) and miss "
        "reason (hit, piecewise_only, backend_support_too_low, ...).",
        ("mode", "reason", "steady"),
    ),
    _m(
        "decode_steps_total",
        "counter",
        "{step}",
        "Forward steps that were uniform decode batches; query_len is 1 + speculative tokens.",
        ("query_len", "steady"),
    ),
    _m(
        "decode_full_steps_total",
        "counter",
        "{step}",
        "Uniform decode steps dispatched to a FULL graph (decode_full_hit_rate numerator).",
        ("query_len", "steady"),
    ),
    _m(
        "replays_confirmed_total",
        "counter",
        "{step}",
        "Graph-dispatched steps whose replay was observed (FULL: one replay; PIECEWISE: "
        "at least one piece).",
        ("mode", "steady"),
    ),
    _m(
        "padded_tokens_total",
        "counter",
        "{token}",
        "Tokens the graphs ran with (padded), over graph-dispatched steps.",
        ("steady",),
    ),
    _m(
        "real_tokens_total",
        "counter",
        "{token}",
        "Scheduled (real) tokens, over graph-dispatched steps.",
        ("steady",),
    ),
    _m(
        "scheduled_tokens_total",
        "counter",
        "{token}",
        "Scheduled tokens of every forward step (steady throughput numerator).",
        ("steady",),
    ),
    _m(
        "serving_seconds_total",
        "counter",
        "s",
        "Serving time: each forward step's period (the end of the step before it on the "
        "rank to its own end; the step alone after an engine-idle gap).",
        ("steady",),
    ),
    _m(
        "engine_idle_seconds_total",
        "counter",
        "s",
        "Gaps between two steps of a rank with nothing in flight (the step after it carried "
        "over no request; probe.analysis.rules.engine_idle): not serving time, not host-bound "
        "time.",
    ),
    _m(
        "draft_steps_total",
        "counter",
        "{step}",
        "Steps with an MTP drafter dispatch, by the drafter's graph mode and miss reason.",
        ("mode", "reason"),
    ),
    # -- host time
    _m(
        "cpu_launch_overhead_seconds",
        "histogram",
        "s",
        "Host time from step start until the forward's GPU work is enqueued "
        "(prepare_inputs through forward_launch), per forward step.",
        ("mode", "steady"),
        LAUNCH_BUCKETS,
    ),
    _m(
        "step_host_seconds",
        "histogram",
        "s",
        "Host wall time of execute_model + sample_tokens (and drafting), per forward step.",
        ("mode", "steady"),
        LAUNCH_BUCKETS,
    ),
    _m(
        "phase_host_seconds",
        "histogram",
        "s",
        "Host time per phase per forward step (reorder, prepare_inputs, dispatch, "
        "metadata_build, forward_launch, logits, sample, draft, sync_stall); 0 when absent.",
        ("phase", "steady"),
        PHASE_BUCKETS,
    ),
    _m(
        "metadata_build_seconds",
        "histogram",
        "s",
        "Attention-metadata build time per builder class (capture builds excluded).",
        ("builder", "drafter"),
        BUILD_BUCKETS,
    ),
    # -- GPU side
    _m(
        "gpu_idle_before_step_seconds",
        "histogram",
        "s",
        "GPU idle gap before a step's forward (since the previous step's last event); "
        "above 0 the GPU waited on the host. Steps with a device span, the engine not idle "
        "before them.",
        ("steady",),
        GPU_BUCKETS,
    ),
    _m(
        "forward_gpu_busy_seconds",
        "histogram",
        "s",
        "GPU time of a step's forward, first to last event on the stream.",
        ("steady",),
        GPU_BUCKETS,
    ),
    _m(
        "gpu_step_seconds",
        "histogram",
        "s",
        "A step's span on the device, its first to its last event (forward, sampling and "
        "drafting); with the idle gap before it, the step period. The engine not idle "
        "before the step.",
        ("steady",),
        GPU_BUCKETS,
    ),
    _m(
        "host_bound_steps_total",
        "counter",
        "{step}",
        f"Steps whose GPU sat idle before them for more than {analysis.HOST_BOUND_SHARE:.0%} "
        "of the step period (idle gap + the step's span on the device): the host was late "
        "(probe.analysis.rules; the engine not idle before the step).",
        ("steady",),
    ),
    # -- ranks side by side (probe.analysis.ranks): the series of the rank that was last
    _m(
        "rank_last_steps_total",
        "counter",
        "{step}",
        "Steps at which this rank was the last of its engine's ranks to arrive (finish "
        "enqueuing its forward), by the phase behind it (start, or a phase up to the "
        "forward launch); steps within the clock uncertainty name no rank.",
        ("phase",),
    ),
    _m(
        "rank_skew_seconds",
        "histogram",
        "s",
        "The last rank's lead over the median of its engine's other ranks at a step, "
        "observed on the last rank's series.",
        (),
        SKEW_BUCKETS,
    ),
    # -- reorder
    _m(
        "reorder_decisions_total",
        "counter",
        "{decision}",
        "Batch reorder decisions; changed=true when the batch order changed.",
        ("changed",),
    ),
    _m(
        "reorder_moved_requests_total",
        "counter",
        "{request}",
        "Requests moved by batch reorders.",
    ),
    # -- the probe's own cost: PROBE_COST below
    _m(
        "hooked_calls_total",
        "counter",
        "{call}",
        "Hooked calls the probe made in forward steps, counted from each step's records "
        "(probe.analysis.cost.hooked_calls): kind=span, a plain phase span; kind=hook, "
        "a hook with a "
        "body. Only for processes whose snapshot carries the probe's calibration.",
        ("kind", "steady"),
    ),
    _m(
        "hooked_call_cost_seconds",
        "gauge",
        "s",
        "What one hooked call costs, calibrated at attach in the engine process "
        "(probe.engine.calibrate): timing=warm (a hot loop), cold (data evicted), cold_code (code "
        "evicted too); kind=span or hook.",
        ("kind", "timing"),
    ),
    # -- probe health and static facts
    _m(
        "records_dropped_total",
        "counter",
        "{record}",
        "Records the ring dropped because the reader fell behind (the probe never blocks).",
    ),
    _m(
        "hook_faults_total",
        "counter",
        "{fault}",
        "Faults inside probe hooks (each disables its hook; vLLM is never affected).",
    ),
    _m(
        "process_ended_timestamp_seconds",
        "gauge",
        "s",
        "Unix time at which a process ended (the agent read its ring to the end); absent "
        "while it runs. Its series stay exported, flat, for the agent's --forget minutes.",
    ),
    _m(
        "engine_info",
        "gauge",
        INFO_UNIT,
        "Static facts of a vLLM process, value 1: vLLM version, runner, platform, resolved "
        "cudagraph_mode and the minimum attention-group graph support.",
        ("vllm_version", "runner", "platform", "cudagraph_mode", "min_cg_support"),
    ),
    _m(
        "doctor_warning_info",
        "gauge",
        INFO_UNIT,
        "One series per `probe doctor` trap found in the process's snapshot, value 1 (the "
        "trap's text is in `probe doctor`; a label carries only its code).",
        ("code",),
    ),
)

METRICS: Mapping[str, Metric] = {m.name: m for m in _DEFS}

LIVE_ONLY = frozenset({f"{NAMESPACE}_process_ended_timestamp_seconds"})
"""Metrics only a live sink sets (from the reader's events, not from steps): a recording's
exports have none."""


def ratio_queries(
    window: str = "5m", by: str = "", selector: str = "", guard: bool = False
) -> dict[str, str]:
    """Every ratio of :data:`probe.analysis.views.RATIOS` as PromQL over the counters (``by``:
    e.g. ``"pid"``; ``selector``: label matchers without braces, e.g.
    ``model_name=~"$model_name"``). ``guard``: the denominator is ``> 0``-guarded, so a
    window without traffic gives no sample (a dashboard's "No traffic"), not NaN."""
    out = {name: r.promql(window, by, selector, NAMESPACE) for name, r in analysis.RATIOS.items()}
    if guard:
        out = {name: _guarded(q) for name, q in out.items()}
    return out


def _guarded(q: str) -> str:
    # Ratio.promql writes "numerator\n  / denominator"
    num, sep, den = q.rpartition("\n  / ")
    if not sep:
        raise ValueError(f"not a ratio query: {q!r}")
    return f"{num}\n  / ({den} > 0)"


RATIOS: Mapping[str, str] = ratio_queries()


def probe_cost_queries(window: str = "5m", by: str = "pid", selector: str = "") -> dict[str, str]:
    """The probe's cost per forward step by each timing, as PromQL: the hooked calls per
    second of each kind, each times its calibrated cost per call, over the forward steps
    per second, of steady state; what ``probe report`` computes (:mod:`probe.analysis.summary`).
    ``headline`` is the one figure the report prints (:func:`probe.analysis.cost.
    with_headline`): per process, ``cold_code`` where its calibration has it, else
    ``cold``, else ``warm``."""
    sel = "{" + ", ".join(x for x in (selector, 'steady="true"') if x) + "}"
    out = {}
    for timing in TIMINGS:
        cost_sel = ", ".join(x for x in (selector, f'timing="{timing}"') if x)
        out[timing] = (
            f"sum by ({by}) (rate({NAMESPACE}_hooked_calls_total{sel}[{window}])"
            f" * on (instance, pid, kind) group_left () {NAMESPACE}_hooked_call_cost_seconds"
            f"{{{cost_sel}}})\n  / sum by ({by}) (rate({NAMESPACE}_steps_total{sel}[{window}]))"
        )
    out["headline"] = " or ".join(f"({out[t]})" for t in ("cold_code", "cold", "warm"))
    return out


PROBE_COST: Mapping[str, str] = probe_cost_queries()


# -- steps -> updates ------------------------------------------------------------------------


@dataclass(frozen=True)
class Update:
    """Add ``value`` to a counter, observe it in a histogram, or set a gauge to it."""

    metric: str
    labels: Mapping[str, str]
    value: float


def updates(
    info: ProcessInfo,
    steps: Sequence[Step],
    gpu: Sequence[GpuSample] = (),
    classes: Classes | None = None,
) -> Iterator[Update]:
    """The metric updates a batch of one process's steps (and GPU timings) makes.

    ``classes`` (:class:`probe.analysis.steady.Classes`) splits steps into steady state and
    warm-up and finds the engine-idle gaps, by the rules of :mod:`probe.analysis.rules`; a sink
    keeps one across batches (device timings arrive a few steps after their step), an
    offline export builds it from the recording's summary (the report's split).

    The one translation of steps into updates is over columns
    (:func:`exporters.metrics_columns.column_updates`, which the exports read recordings
    with): the Steps are its columns here (:func:`exporters.metrics_columns.batch_of_steps`),
    each step's updates in its order, then the batch's hooked calls, then each device
    timing's."""
    from exporters.metrics_columns import updates_of_steps

    cl = classes if classes is not None else Classes()
    for metric, labels, value in updates_of_steps(info, steps, gpu, cl):
        yield Update(metric, labels, value)


class RankSeries:
    """The ranks-side-by-side series of a live sink (Prometheus, OTLP): every worker's
    steps, as their batches arrive, into one :class:`probe.analysis.ranks_live.RankMatcher`
    (on the CPU platform if the first worker's is), and each step it matches as
    :func:`rank_updates`. The one computation both sinks apply, each to its own series."""

    def __init__(self) -> None:
        self.matcher: RankMatcher | None = None

    def updates(
        self,
        info: ProcessInfo,
        steps: Sequence[Step],
        infos: Callable[[int], ProcessInfo],
    ) -> Iterator[Update]:
        """The updates of the steps this batch of ``info``'s lets the matcher pair with the
        other workers' steps; ``infos``: a matched rank's process facts by pid. Nothing for
        a process that is no worker."""
        if info.role != "worker":
            return
        if self.matcher is None:
            self.matcher = RankMatcher(sync_launch=info.platform == "cpu")
        rid = RankId(info.pid, info.tp_rank, info.pp_rank, info.dp_rank)
        for members, sr in self.matcher.add(rid, steps):
            yield from rank_updates([infos(r.pid) for r in members], sr)

    def forget(self, pid: int) -> None:
        """Let go of ``pid``'s held steps (a process gone)."""
        if self.matcher is not None:
            self.matcher.forget(pid)


def rank_updates(infos: Sequence[ProcessInfo], matched: StepRanks) -> Iterator[Update]:
    """The metric updates of one step of an engine's ranks side by side
    (:func:`probe.analysis.ranks.compare`; ``infos`` in the order of its tuples): the last rank's
    counter and skew; nothing when no rank is named."""
    if matched.last is None:
        return
    base = process_labels(infos[matched.last])
    yield Update(
        f"{NAMESPACE}_rank_last_steps_total", {**base, "phase": matched.phase or "start"}, 1
    )
    yield Update(f"{NAMESPACE}_rank_skew_seconds", base, matched.skew_ns / 1e9)


def process_updates(info: ProcessInfo, previous: ProcessInfo | None) -> Iterator[Update]:
    """Health counters (as increments since ``previous``) and the static info gauges."""
    base = process_labels(info)
    n = NAMESPACE
    dropped = info.dropped - (previous.dropped if previous else 0)
    if dropped > 0 or previous is None:
        yield Update(f"{n}_records_dropped_total", base, max(dropped, 0))
    faults = info.hook_faults - (previous.hook_faults if previous else 0)
    if faults > 0 or previous is None:
        yield Update(f"{n}_hook_faults_total", base, max(faults, 0))
    if info.vllm_version:
        yield Update(
            f"{n}_engine_info",
            {
                **base,
                "vllm_version": info.vllm_version,
                "runner": info.runner,
                "platform": info.platform,
                "cudagraph_mode": info.cudagraph_mode,
                "min_cg_support": info.min_support,
            },
            1,
        )
    for code in sorted({code for code, _ in info.traps}):
        yield Update(f"{n}_doctor_warning_info", {**base, "code": code}, 1)
    cal = info.calibration or {}
    for timing, suffix in TIMINGS.items():
        if has_timing(cal, suffix):
            for kind in ("span", "hook"):
                yield Update(
                    f"{n}_hooked_call_cost_seconds",
                    {**base, "kind": kind, "timing": timing},
                    float(cal[f"{kind}{suffix}_ns"]) / 1e9,
                )
