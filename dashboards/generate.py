"""Grafana dashboards for the probe's Prometheus metrics, generated from plain dicts.

    python -m dashboards.generate            # write dashboards/*.json
    python -m dashboards.generate --check    # fail when the JSON is stale or a panel
                                             # queries a metric exporters.metrics lacks

Every PromQL expression here is built from :mod:`exporters.metrics` (the ratios come from
:func:`exporters.metrics.ratio_queries`), and ``--check`` parses the metric names back
out of each expression (``_bucket``/``_sum``/``_count`` tolerated on histograms) and
compares them with the metric set, as vLLM's own generator does for ``vllm:*``.
Grafana >= 10.4; datasource variable ``${datasource}``; ``$__rate_interval``. As vLLM's
own dashboards (``examples/observability``): ``job``, ``instance``, ``engine``,
``model_name`` and rank variables (two scrape paths of one engine would otherwise double
every count); ratio denominators guarded with ``> 0`` and no data, null and NaN shown
as "No traffic"; stat panels for the headline ratios. ``tests/exporters/test_dashboards_schema.py``
type-checks the JSON against Grafana's published ``@grafana/schema`` with ``tsc --strict``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from exporters.base import AGENT_METRICS
from exporters.metrics import METRICS, NAMESPACE, probe_cost_queries, ratio_queries

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
#: the dashboard variables, in the order they chain (each one's values under the previous)
VARIABLES: tuple[tuple[str, str], ...] = (
    ("job", "Job"),
    ("instance", "Instance"),
    ("engine", "Engine"),
    ("model_name", "Model"),
    ("tp_rank", "TP rank"),
    ("pp_rank", "PP rank"),
    ("dp_rank", "DP rank"),
)
SEL = ", ".join(f'{v}=~"${v}"' for v, _ in VARIABLES)
NO_TRAFFIC = "No traffic"
NO_CALIBRATION = "No calibration in these processes (or no traffic)"
NO_DEVICE_TIMING = "No device timings (a CPU engine, or timing off)"
N = NAMESPACE
#: the agents' own series carry no process labels: only job and instance select them
AGENT_SEL = 'job=~"$job", instance=~"$instance"'


def m(name: str, extra: str = "") -> str:
    """A series selector with the dashboard's variables (and ``extra`` matchers); a
    series of steps is read for steady-state steps (``steady="true"``), as the report
    figures them (:mod:`probe.analysis.rules`)."""
    base = name
    for suffix in ("_bucket", "_sum", "_count"):
        base = base.removesuffix(suffix)
    metric = METRICS.get(f"{N}_{base}")
    split = 'steady="true"' if metric is not None and "steady" in metric.labels else ""
    inner = ", ".join(x for x in (extra, split, SEL) if x)
    return f"{N}_{name}{{{inner}}}"


def rate(name: str, extra: str = "", by: str = "", window: str = RI) -> str:
    agg = f"sum by ({by})" if by else "sum"
    return f"{agg}(rate({m(name, extra)}[{window}]))"


def quantile(q: float, hist: str, by: str = "") -> str:
    keys = ", ".join(["le", *(by.split(", ") if by else [])])
    return f"histogram_quantile({q}, sum by ({keys}) (rate({m(hist + '_bucket')}[{RI}])))"


def mean(hist: str, by: str) -> str:
    return f"{rate(hist + '_sum', by=by)}\n  / ({rate(hist + '_count', by=by)} > 0)"


R = ratio_queries(window=RI, selector=SEL, guard=True)
COST = probe_cost_queries(window=RI, by="pid", selector=SEL)
#: the probe cost panel's series, in its order, as its legend names them: the one figure
#: the report prints (code evicted where calibrated), then the others by what they are
COST_LABELS = {
    "headline": "probe cost",
    "cold": "data evicted (a floor)",
    "warm": "hot loop (a lower bound)",
}
LEGEND = {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []}


def no_data(text: str) -> list[dict[str, Any]]:
    """Value mappings: null and NaN (a quantile over an empty window) read ``text``."""
    return [
        {"type": "special", "options": {"match": m, "result": {"text": text, "index": i}}}
        for i, m in enumerate(("null", "nan"))
    ]


#: no data, null and NaN read "No traffic"
NO_TRAFFIC_MAPPINGS: list[dict[str, Any]] = no_data(NO_TRAFFIC)

#: forward steps counted, per agent and in all: each process's series at its last value in
#: the time range. A restarted engine is a new series (its pid), never a reset of one, so
#: the sum over series is every step the agents counted, restarts included.
STEPS_BY_INSTANCE = f"sum by (job, instance) (last_over_time({m('steps_total')}[$__range]))"
STEPS_TOTAL = f"sum(last_over_time({m('steps_total')}[$__range]))"


#: the stat panels that show a count, not a ratio
COUNT_STATS = ("Forward steps counted", "Engine restarts", "Processes attached")


def concrete(expr: str, window: str = "1h", rate_window: str = "1m") -> str:
    """A dashboard query as Grafana sends it with every variable at "All" (``$__range``
    as ``window``, ``$__rate_interval`` as ``rate_window``)."""
    expr = expr.replace("$__range", window).replace("$__rate_interval", rate_window)
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def target(expr: str, legend: str = "", ref: str = "A", **kw: Any) -> dict[str, Any]:
    return {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend, **kw}


def panel(
    title: str,
    description: str,
    targets: Sequence[dict[str, Any]],
    *,
    kind: str = "timeseries",
    unit: str = "short",
    stacked: bool = False,
    ratio: bool = False,
    options: Mapping[str, Any] | None = None,
    transformations: Sequence[dict[str, Any]] = (),
    w: int = 12,
    h: int = 8,
    no_value: str = NO_TRAFFIC,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": "percentunit" if ratio else unit,
        "noValue": no_value,
        "mappings": no_data(no_value),
    }
    if ratio:
        defaults.update(min=0, max=1)
    if kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "fillOpacity": 30 if stacked else 0,
            "stacking": {"mode": "normal" if stacked else "none", "group": "A"},
            "lineWidth": 1,
        }
    refs = "ABCDEFGH"
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"w": w, "h": h},
        "targets": [dict(t, refId=refs[i]) for i, t in enumerate(targets)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": dict(options or {"legend": LEGEND}),
        "transformations": list(transformations),
    }


def table(
    title: str,
    description: str,
    expr: str,
    keep: Sequence[str],
    w: int = 24,
    *,
    show_value: bool = False,
) -> dict[str, Any]:
    hide = {"Time": True, "Value": not show_value, "__name__": True}
    return panel(
        title,
        description,
        [target(expr, instant=True, format="table")],
        kind="table",
        options={"showHeader": True, "cellHeight": "sm"},
        transformations=[
            {
                "id": "organize",
                "options": {
                    "excludeByName": hide,
                    "indexByName": {k: i for i, k in enumerate(keep)},
                },
            }
        ],
        w=w,
        h=6,
    )


def stat(
    title: str,
    description: str,
    expr: str,
    *,
    ratio: bool = True,
    unit: str = "s",
    no_value: str = NO_TRAFFIC,
) -> dict[str, Any]:
    """A headline number: the ratio over the dashboard's time range end (last value)."""
    return panel(
        title,
        description,
        [target(expr, title)],
        kind="stat",
        ratio=ratio,
        unit=unit,
        no_value=no_value,
        options={
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "textMode": "auto",
            "orientation": "auto",
        },
        w=4,
        h=4,
    )


def _layout(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        g = p["gridPos"]
        if x + g["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        g.update(x=x, y=y)
        x += g["w"]
        row_h = max(row_h, g["h"])
        p["id"] = i
    return panels


def _templating() -> dict[str, Any]:
    def var(i: int, name: str, label: str) -> dict[str, Any]:
        # chained as vLLM's dashboards chain theirs: each under the ones before it
        under = ", ".join(f'{v}=~"${v}"' for v, _ in VARIABLES[:i])
        q = (
            f"label_values({N}_steps_total{{{under}}}, {name})"
            if under
            else (f"label_values({N}_steps_total, {name})")
        )
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DS,
            "query": {"query": q, "refId": "var"},
            "includeAll": True,
            "allValue": ".*",
            "multi": True,
            "current": {"text": "All", "value": "$__all"},
            "refresh": 2,
            "sort": 1,
        }

    return {
        "list": [
            {
                "name": "datasource",
                "label": "Prometheus",
                "type": "datasource",
                "query": "prometheus",
            },
            *(var(i, name, label) for i, (name, label) in enumerate(VARIABLES)),
        ]
    }


def dashboard(
    uid: str, title: str, description: str, panels: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["vllm", "vllm-graph-probe", "cuda-graphs"],
        "editable": True,
        "schemaVersion": 39,
        "graphTooltip": 1,
        "time": {"from": "now-30m", "to": "now"},
        "refresh": "10s",
        "templating": _templating(),
        "annotations": {
            "list": [
                {
                    "name": "Doctor warnings",
                    "datasource": DS,
                    "enable": True,
                    "iconColor": "orange",
                    "target": {
                        "refId": "Anno",
                        "expr": f"max by (instance, code) ({m('doctor_warning_info')})",
                        "interval": "1m",
                    },
                }
            ]
        },
        "panels": _layout(panels),
    }


def graph_path() -> dict[str, Any]:
    panels = [
        stat("FULL hit rate", "FULL / forward steps.", R["full_hit_rate"]),
        stat(
            "Decode FULL hit rate",
            "FULL / uniform decode steps: the MTP headline.",
            R["decode_full_hit_rate"],
        ),
        stat("Graph rate", "FULL or PIECEWISE / forward steps.", R["graph_rate"]),
        stat(
            "Replays confirmed",
            "Graph-dispatched steps whose replay was observed.",
            R["replay_confirmed_rate"],
        ),
        stat("Padded tokens wasted", "(padded - real) / padded tokens.", R["padding_waste"]),
        stat(
            "Reorder changed",
            "Batch reorder decisions that changed the order.",
            R["reorder_changed_share"],
        ),
        stat(
            "Forward steps counted",
            "Every forward step the agents counted in the time range, over the selected "
            "instances, restarts included (each process is its own series).",
            STEPS_TOTAL,
            ratio=False,
            unit="short",
        ),
        stat(
            "Engine restarts",
            "Processes that took the place of one that ended (probe agent), over the "
            "selected instances.",
            f"round(sum(increase({N}_agent_restarts_total{{{AGENT_SEL}}}[$__range])))",
            ratio=False,
            unit="short",
            no_value="No probe agent",
        ),
        stat(
            "Processes attached",
            "Processes the selected agents are attached to now.",
            f"sum({N}_agent_attached{{{AGENT_SEL}}})",
            ratio=False,
            unit="short",
            no_value="No probe agent",
        ),
        table(
            "Forward steps counted per instance",
            "Forward steps each agent (instance) counted in the time range, restarts "
            "included: the figures add up to the total above.",
            STEPS_BY_INSTANCE,
            ["job", "instance", "Value"],
            show_value=True,
        ),
        panel(
            "FULL and graph hit rate",
            "full_hit_rate = FULL / forward steps; graph_rate = FULL or PIECEWISE / forward "
            "steps; replay_confirmed_rate = observed replays / graph-dispatched steps.",
            [
                target(R["full_hit_rate"], "full_hit_rate"),
                target(R["graph_rate"], "graph_rate"),
                target(R["replay_confirmed_rate"], "replay_confirmed_rate"),
            ],
            ratio=True,
        ),
        panel(
            "Decode FULL hit rate (MTP)",
            "decode_full_hit_rate = FULL / uniform decode steps, by decode query length "
            "(1 + speculative tokens). Below 1 with query_len > 1: the UNIFORM_BATCH trap.",
            [
                target(
                    ratio_queries(RI, by="query_len", selector=SEL, guard=True)[
                        "decode_full_hit_rate"
                    ],
                    "query_len {{query_len}}",
                ),
                target(R["decode_full_hit_rate"], "all decode"),
            ],
            ratio=True,
        ),
        panel(
            "Miss reasons (steps/s, stacked)",
            "Forward steps per second by dispatched mode and reason (hit = FULL).",
            [target(rate("steps_total", by="mode, reason"), "{{mode}} / {{reason}}")],
            unit="ops",
            stacked=True,
        ),
        panel(
            "Drafter (MTP) graph modes",
            "Steps with a drafter dispatch, by the drafter's mode and reason.",
            [target(rate("draft_steps_total", by="mode, reason"), "{{mode}} / {{reason}}")],
            unit="ops",
            stacked=True,
        ),
        panel(
            "Padding waste",
            "padding_waste = (padded - real) / padded tokens over graph-dispatched steps.",
            [target(R["padding_waste"], "padding_waste")],
            ratio=True,
        ),
        panel(
            "Tokens through graphs (tokens/s)",
            "Padded and real tokens per second of graph-dispatched steps.",
            [
                target(rate("padded_tokens_total"), "padded"),
                target(rate("real_tokens_total"), "real"),
            ],
            unit="short",
        ),
        panel(
            "FULL hit rate per rank",
            "full_hit_rate per process: one rank dragging the engine off FULL shows here.",
            [
                target(
                    ratio_queries(
                        RI, by="instance, pid, tp_rank, pp_rank, dp_rank", selector=SEL, guard=True
                    )["full_hit_rate"],
                    "tp{{tp_rank}} pp{{pp_rank}} dp{{dp_rank}} ({{pid}})",
                )
            ],
            ratio=True,
            w=24,
        ),
        table(
            "Doctor warnings",
            "Traps `probe doctor` found in each process's static snapshot (the code; "
            "`probe doctor` explains each).",
            f"max by (instance, pid, tp_rank, code) ({m('doctor_warning_info')})",
            ["instance", "pid", "tp_rank", "code"],
        ),
        table(
            "Engines",
            "vLLM version, runner, resolved cudagraph_mode and the minimum graph support.",
            "max by (instance, engine, pid, tp_rank, pp_rank, dp_rank, vllm_version, runner, "
            f"platform, cudagraph_mode, min_cg_support) ({m('engine_info')})",
            [
                "instance",
                "engine",
                "pid",
                "tp_rank",
                "pp_rank",
                "dp_rank",
                "vllm_version",
                "runner",
                "platform",
                "cudagraph_mode",
                "min_cg_support",
            ],
        ),
    ]
    return dashboard(
        "vllm-graph-probe-graphs",
        "vLLM graph probe: graph path",
        "Did each step replay a graph, and if not, why not (vllm-graph-probe).",
        panels,
    )


def rank_panels(rank: str) -> list[dict[str, Any]]:
    """Ranks side by side (probe.analysis.ranks): which rank arrives last at the step, why, and by
    how much; empty for an engine with one worker."""
    last = f"sum by ({rank}, phase) (rate({m('rank_last_steps_total')}[{RI}]))"
    per_engine = f"sum by (dp_rank) (rate({m('rank_last_steps_total')}[{RI}]))"
    return [
        panel(
            "Who holds the step: last rank by phase",
            "Share of an engine's steps at which each rank was the last to finish enqueuing "
            "its forward (the others' GPUs wait for it in the step's collectives), by the "
            "phase whose time differed most on it (start: it began the step later). A "
            "rank well above 1/n of the steps holds the engine back.",
            [
                target(
                    f"{last}\n  / on (dp_rank) group_left () ({per_engine} > 0)",
                    "tp{{tp_rank}} pp{{pp_rank}} dp{{dp_rank}} {{phase}}",
                )
            ],
            ratio=True,
            stacked=True,
        ),
        panel(
            "Rank skew when last (p50, p99)",
            "The last rank's lead over the median of the other ranks of its engine, on the "
            "steps it was last; skew within the clock uncertainty names no rank.",
            [
                target(
                    quantile(0.5, "rank_skew_seconds", rank),
                    "p50 tp{{tp_rank}} pp{{pp_rank}} dp{{dp_rank}}",
                ),
                target(
                    quantile(0.99, "rank_skew_seconds", rank),
                    "p99 tp{{tp_rank}} pp{{pp_rank}} dp{{dp_rank}}",
                ),
            ],
            unit="s",
        ),
    ]


def host_overhead() -> dict[str, Any]:
    rank = "tp_rank, pp_rank, dp_rank"
    panels = [
        stat(
            "CPU launch overhead (mean)",
            "Host time from step start until the forward's GPU work is enqueued.",
            R["cpu_launch_overhead_mean"],
            ratio=False,
        ),
        stat(
            "GPU idle",
            "GPU idle before steps / the step periods (gpu_idle_share).",
            R["gpu_idle_share"],
            no_value=NO_DEVICE_TIMING,
        ),
        stat(
            "Host-bound steps",
            "Steps whose GPU idled for over 10% of the step period.",
            R["host_bound_share"],
            no_value=NO_DEVICE_TIMING,
        ),
        panel(
            "CPU launch overhead (heatmap)",
            "Host time from step start until the forward's GPU work is enqueued, per step.",
            [
                target(
                    f"sum by (le) (increase({m('cpu_launch_overhead_seconds_bucket')}[{RI}]))",
                    "{{le}}",
                    format="heatmap",
                )
            ],
            kind="heatmap",
            options={
                "calculate": False,
                "yAxis": {"unit": "s"},
                "color": {
                    "mode": "scheme",
                    "scheme": "Oranges",
                    "steps": 64,
                    "exponent": 0.5,
                    "fill": "dark-orange",
                    "reverse": False,
                },
                "cellGap": 1,
            },
        ),
        panel(
            "CPU launch overhead p50 / p99 by mode",
            "Quantiles from the explicit buckets.",
            [
                target(quantile(0.5, "cpu_launch_overhead_seconds", "mode"), "p50 {{mode}}"),
                target(quantile(0.99, "cpu_launch_overhead_seconds", "mode"), "p99 {{mode}}"),
            ],
            unit="s",
        ),
        panel(
            "Host time per step by phase (mean, stacked)",
            "Mean host seconds per forward step in each phase; the rest of the step is "
            "the gap to the step's host time.",
            [
                target(mean("phase_host_seconds", "phase"), "{{phase}}"),
            ],
            unit="s",
            stacked=True,
        ),
        panel(
            "Step host time p50 by mode",
            "Host wall time of execute_model + sample_tokens (and drafting).",
            [target(quantile(0.5, "step_host_seconds", "mode"), "p50 {{mode}}")],
            unit="s",
        ),
        panel(
            "GPU idle before step",
            "How long the GPU waited for the host before each forward (p50, p99), and the "
            "idle share of GPU time: the step is CPU-bound when this is high.",
            [
                target(quantile(0.5, "gpu_idle_before_step_seconds"), "p50 idle"),
                target(quantile(0.99, "gpu_idle_before_step_seconds"), "p99 idle"),
                target(quantile(0.5, "forward_gpu_busy_seconds"), "p50 forward busy"),
            ],
            unit="s",
            no_value=NO_DEVICE_TIMING,
        ),
        panel(
            "GPU idle share",
            "gpu_idle_share = idle before steps / the step periods (idle + the step's span "
            "on the device); host_bound_share = steps whose GPU idled for over 10% of the "
            "step period / timed steps (probe.analysis.views.RATIOS).",
            [
                target(R["gpu_idle_share"], "gpu_idle_share"),
                target(R["host_bound_share"], "host_bound_share"),
            ],
            ratio=True,
            no_value=NO_DEVICE_TIMING,
        ),
        panel(
            "Metadata build time by builder (mean)",
            "Mean attention-metadata build seconds per build, per builder class.",
            [
                target(
                    mean("metadata_build_seconds", "builder, drafter"),
                    "{{builder}} drafter={{drafter}}",
                )
            ],
            unit="s",
        ),
        panel(
            "Reorder decisions",
            "Batch reorder decisions per second (changed = the order changed), and moved "
            "requests per second.",
            [
                target(rate("reorder_decisions_total", by="changed"), "changed={{changed}}"),
                target(rate("reorder_moved_requests_total"), "moved requests"),
            ],
            unit="ops",
        ),
        panel(
            "CPU launch overhead p50 per rank",
            "Per-rank comparison: a slow rank holds every collective back.",
            [
                target(
                    quantile(0.5, "cpu_launch_overhead_seconds", rank),
                    "tp{{tp_rank}} pp{{pp_rank}} dp{{dp_rank}}",
                )
            ],
            unit="s",
        ),
        *rank_panels(rank),
        panel(
            "Probe health",
            "Records dropped by the rings (reader behind) and hook faults; both should be 0.",
            [
                target(
                    f"sum by (pid) (increase({m('records_dropped_total')}[{RI}]))",
                    "dropped {{pid}}",
                ),
                target(
                    f"sum by (pid) (increase({m('hook_faults_total')}[{RI}]))", "faults {{pid}}"
                ),
            ],
            unit="short",
        ),
        panel(
            "Probe cost per step (calibrated)",
            "What the probe's own hooks add to each forward step: the hooked calls per step "
            "times each call's cost, calibrated at attach in the engine process. probe cost "
            "is the one figure `probe report` prints: calibrated with code and data evicted, "
            "which matches the cost measured end to end (benchmarks/evidence/overhead.md); "
            "data evicted alone reads about half of it, a hot loop a tenth. Set it against the "
            "CPU launch overhead, which it inflates. Empty for processes recorded without a "
            "calibration.",
            [target(COST[name], f"{label} {{{{pid}}}}") for name, label in COST_LABELS.items()],
            unit="s",
            no_value=NO_CALIBRATION,
        ),
    ]
    return dashboard(
        "vllm-graph-probe-overhead",
        "vLLM graph probe: host overhead",
        "CPU launch overhead, phases, GPU idle, metadata builds and reorder (vllm-graph-probe).",
        panels,
    )


DASHBOARDS = {
    "vllm_graph_probe_graphs.json": graph_path,
    "vllm_graph_probe_overhead.json": host_overhead,
}


def render(d: Mapping[str, Any]) -> str:
    return json.dumps(d, indent=2, sort_keys=False) + "\n"


# -- checks -----------------------------------------------------------------------------------

_METRIC_RE = re.compile(rf"\b{NAMESPACE}_[a-zA-Z0-9_]+")
_HIST_SUFFIXES = ("_bucket", "_sum", "_count")


def queries(d: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and annotation of a dashboard."""
    for p in d.get("panels", []):
        for t in p.get("targets", []):
            yield f"panel {p.get('title')!r} {t.get('refId')}", t["expr"]
    for a in d.get("annotations", {}).get("list", []):
        if a.get("target", {}).get("expr"):
            yield f"annotation {a.get('name')!r}", a["target"]["expr"]
    for v in d.get("templating", {}).get("list", []):
        if isinstance(v.get("query"), dict):
            yield f"variable {v.get('name')!r}", v["query"]["query"]


def metric_names(expr: str) -> set[str]:
    return set(_METRIC_RE.findall(expr))


def known(name: str) -> bool:
    if name in METRICS or name in {a[0] for a in AGENT_METRICS}:
        return True
    for suffix in _HIST_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and base in METRICS and METRICS[base].kind == "histogram":
            return True
    return False


def check_metrics(name: str, d: Mapping[str, Any]) -> list[str]:
    problems = []
    for where, expr in queries(d):
        for metric in sorted(metric_names(expr)):
            if not known(metric):
                problems.append(f"{name}: {where} queries {metric}, which exporters.metrics lacks")
    return problems


def check(out_dir: Path = HERE) -> list[str]:
    problems: list[str] = []
    for fname, build in DASHBOARDS.items():
        d = build()
        problems += check_metrics(fname, d)
        path = out_dir / fname
        if not path.exists():
            problems.append(f"{path}: missing; run python -m dashboards.generate")
        elif path.read_text() != render(d):
            problems.append(f"{path}: stale; run python -m dashboards.generate")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dashboards.generate", description=__doc__)
    ap.add_argument("--check", action="store_true", help="verify, do not write")
    ap.add_argument("--dir", type=Path, default=HERE, help="where the JSON files live")
    args = ap.parse_args(argv)
    if args.check:
        problems = check(args.dir)
        for p in problems:
            print(p, file=sys.stderr)
        if not problems:
            print(f"{len(DASHBOARDS)} dashboards fresh; every queried metric exists")
        return 1 if problems else 0
    for fname, build in DASHBOARDS.items():
        d = build()
        problems = check_metrics(fname, d)
        if problems:
            for p in problems:
                print(p, file=sys.stderr)
            return 1
        (args.dir / fname).write_text(render(d))
        print(f"wrote {args.dir / fname}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
