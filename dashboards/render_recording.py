"""Plot what each dashboard panel shows, computed from a recording (no Grafana needed).

    python -m dashboards.render_recording [RECORDING] [--out docs/dashboards] [--window 1]

One PNG per dashboard, one subplot per panel, titled as the panel. Each quantity is the
one definition the panel's PromQL is derived from (:data:`probe.analysis.views.RATIOS`, over
the recording's Steps), computed per ``--window``
seconds of the recording's step start times (BOOTTIME, shown relative to the first step)
instead of ``rate(...[$__rate_interval])``. Quantiles here are exact per window; the
dashboards interpolate them from the explicit buckets.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import matplotlib
except ModuleNotFoundError as exc:  # the optional 'plots' extra
    if exc.name != "matplotlib":
        raise
    NEEDS = "the plots need the 'plots' extra (matplotlib is not installed): "
    PIP = "pip install 'vllm-graph-probe[plots]'"
    if __name__ == "__main__":
        sys.exit(f"python -m dashboards.render_recording: error: {NEEDS}{PIP}")
    raise ModuleNotFoundError(NEEDS + PIP, name="matplotlib") from None

matplotlib.use("Agg")
import itertools

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from dashboards.generate import COST_LABELS, DASHBOARDS, R
from exporters.base import ProcessInfo, processes_from_recording
from exporters.metrics import LAUNCH_BUCKETS
from probe.analysis.cost import TIMINGS, cost_key, has_timing, probe_cost
from probe.analysis.ranks import StepRanks, per_step, recording_ranks
from probe.analysis.views import PHASES, RATIOS, percentile
from probe.reader.recording import Recording, default_recording
from probe.records import Build, BuildTag, Reorder
from probe.step import Step


@dataclass(frozen=True)
class At:
    """Something that happened at ``t`` (BOOTTIME ns): a step, a build, a reorder."""

    t: int
    step: Step
    item: Any = None


class Data:
    def __init__(self, rec: Recording, window_s: float) -> None:
        steps = list(rec.iter_steps())
        names = rec.builder_names()
        self.rows = [At(s.t0, s) for s in steps if s.forward]
        self.t_start = min(a.t for a in self.rows)
        self.window_ns = int(window_s * 1e9)
        self.window_s = window_s
        self.procs: list[ProcessInfo] = processes_from_recording(rec)
        self.builds = [
            At(b.t0, s, (names.get(s.pid, {}).get(b.builder_id, "?"), b))
            for s in steps
            for b in s.builds
        ]
        self.reorders = [At(s.t0, s, o) for s in steps for o in s.reorders]
        self.rank_rows = rank_rows(rec)

    def bins(self, rows: Iterable[At]) -> dict[float, list[At]]:
        out: dict[float, list[At]] = defaultdict(list)
        for r in rows:
            k = (r.t - self.t_start) // self.window_ns
            out[k * self.window_s].append(r)
        return dict(sorted(out.items()))

    def series(
        self, rows: Iterable[At], f: Callable[[list[At]], float | None]
    ) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for t, rs in self.bins(rows).items():
            v = f(rs)
            if v is not None:
                xs.append(t)
                ys.append(v)
        return xs, ys


def _ratio(name: str) -> Callable[[list[At]], float | None]:
    """One of :data:`probe.analysis.views.RATIOS` over a window's steps."""
    return lambda rs: RATIOS[name].of(a.step for a in rs)


def _mode(s: Step) -> str:
    return s.mode.name.lower() if s.mode is not None else "none"


def _line(ax: Axes, d: Data, rows: Iterable[At], f: Any, label: str) -> None:
    xs, ys = d.series(list(rows), f)
    ax.plot(xs, ys, marker=".", label=label)


def _stack(ax: Axes, d: Data, rows: Sequence[At], key: Callable[[Step], str]) -> None:
    bins = d.bins(rows)
    keys = sorted({key(r.step) for r in rows})
    xs = list(bins)
    ys = [[sum(1 for r in bins[t] if key(r.step) == k) / d.window_s for t in xs] for k in keys]
    if keys:
        ax.stackplot(xs, ys, labels=keys, alpha=0.8)


def _pct(field: str, q: float) -> Callable[[list[At]], float | None]:
    def f(rs: list[At]) -> float | None:
        return percentile([v / 1e9 for r in rs if (v := getattr(r.step, field)) is not None], q)

    return f


def _text(ax: Axes, lines: Sequence[str]) -> None:
    ax.axis("off")
    ax.text(0, 1, "\n".join(lines) or "(none)", va="top", fontsize=7, wrap=True, family="monospace")


def _stat_ratios() -> dict[str, str]:
    """Each stat panel's title and the ratio of :data:`probe.analysis.views.RATIOS` its PromQL
    is (:data:`dashboards.generate.R`, matched by text)."""
    by_expr = {q: name for name, q in R.items()}
    return {
        p["title"]: by_expr[p["targets"][0]["expr"]]
        for build in DASHBOARDS.values()
        for p in build()["panels"]
        if p["type"] == "stat" and p["targets"][0]["expr"] in by_expr
    }


STAT_RATIOS = _stat_ratios()


def _stat(ax: Axes, d: Data, name: str) -> None:
    """A stat panel: the ratio over the whole recording, as the panel's number, with its
    line per window beneath (the panel's sparkline)."""
    ratio = RATIOS[name]
    v = ratio.of(r.step for r in d.rows)
    if v is None:
        text = "No traffic"
    elif name == "cpu_launch_overhead_mean":
        text = f"{v / 1e6:.2f} ms"
    else:
        text = f"{v:.1%}"
    per_window = _ratio(name)
    _line(ax, d, d.rows, lambda rs: _scaled(per_window(rs), ratio.promql_scale), name)
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=18)


def _scaled(v: float | None, scale: float) -> float | None:
    return None if v is None else v * scale


def draw(title: str, ax: Axes, d: Data) -> None:
    rows = d.rows
    if title in STAT_RATIOS:
        _stat(ax, d, STAT_RATIOS[title])
        return
    if title == "Forward steps counted":
        _text(ax, [f"{len(d.rows):,} forward steps"])
    elif title in ("Engine restarts", "Processes attached"):
        _text(ax, ["No probe agent (a recording)"])
    elif title == "Forward steps counted per instance":
        per: dict[int, int] = defaultdict(int)
        for r in d.rows:
            per[r.step.pid] += 1
        _text(ax, [f"pid {pid}: {n:,}" for pid, n in sorted(per.items())])
    elif title == "FULL and graph hit rate":
        for name in ("full_hit_rate", "graph_rate", "replay_confirmed_rate"):
            _line(ax, d, rows, _ratio(name), name)
        ax.set_ylim(-0.05, 1.05)
    elif title == "Decode FULL hit rate (MTP)":
        for ql in sorted({r.step.uniform_decode_query_len for r in rows if r.step.decode}):
            sel = [r for r in rows if r.step.decode and r.step.uniform_decode_query_len == ql]
            _line(ax, d, sel, _ratio("decode_full_hit_rate"), f"query_len {ql}")
        ax.set_ylim(-0.05, 1.05)
    elif title == "Miss reasons (steps/s, stacked)":
        _stack(ax, d, rows, lambda s: f"{_mode(s)} / {s.reason.label if s.reason else None}")
    elif title == "Drafter (MTP) graph modes":
        _stack(
            ax,
            d,
            [r for r in rows if r.step.draft_mode is not None],
            lambda s: (
                f"{s.draft_mode.name.lower() if s.draft_mode is not None else None} / "
                f"{s.draft_reason.label if s.draft_reason else None}"
            ),
        )
    elif title == "Padding waste":
        _line(ax, d, rows, _ratio("padding_waste"), "padding_waste")
        ax.set_ylim(-0.05, 1.05)
    elif title == "Tokens through graphs (tokens/s)":
        g = [r for r in rows if r.step.graph]
        _line(ax, d, g, lambda rs: sum(r.step.padded_tokens for r in rs) / d.window_s, "padded")
        _line(ax, d, g, lambda rs: sum(r.step.num_tokens for r in rs) / d.window_s, "real")
    elif title == "FULL hit rate per rank":
        for p in d.procs:
            sel = [r for r in rows if r.step.pid == p.pid]
            _line(ax, d, sel, _ratio("full_hit_rate"), f"{p.rank} ({p.pid})")
        ax.set_ylim(-0.05, 1.05)
    elif title == "Doctor warnings":
        _text(ax, [f"{p.pid} {code}: {msg}" for p in d.procs for code, msg in p.traps])
    elif title == "Engines":
        _text(
            ax,
            [
                f"{p.pid} {p.rank} vLLM {p.vllm_version} {p.runner} {p.platform} "
                f"cudagraph_mode={p.cudagraph_mode} min_cg_support={p.min_support}"
                for p in d.procs
            ],
        )
    elif title == "CPU launch overhead (heatmap)":
        bins = d.bins([r for r in rows if r.step.cpu_launch_overhead_ns is not None])
        edges = [0.0, *LAUNCH_BUCKETS]
        last = max(bins, default=0.0)
        times = [i * d.window_s for i in range(int(last / d.window_s) + 1)]
        grid = [
            [
                sum(
                    1
                    for r in bins.get(t, [])
                    if lo < (r.step.cpu_launch_overhead_ns or 0) / 1e9 <= hi
                )
                for t in times
            ]
            for lo, hi in itertools.pairwise(edges)
        ]
        ax.imshow(
            grid,
            aspect="auto",
            origin="lower",
            cmap="Oranges",
            interpolation="nearest",
            extent=(0, last + d.window_s, 0, len(LAUNCH_BUCKETS)),
        )
        ticks = list(range(len(LAUNCH_BUCKETS)))[::3]
        ax.set_yticks([t + 0.5 for t in ticks], [f"≤{LAUNCH_BUCKETS[t] * 1e3:g} ms" for t in ticks])
        ax.set_xlabel("s since first step")
        return
    elif title == "CPU launch overhead p50 / p99 by mode":
        for mode in sorted({_mode(r.step) for r in rows}):
            sel = [r for r in rows if _mode(r.step) == mode]
            _line(ax, d, sel, _pct("cpu_launch_overhead_ns", 50), f"p50 {mode}")
            _line(ax, d, sel, _pct("cpu_launch_overhead_ns", 99), f"p99 {mode}")
        ax.set_yscale("log")
    elif title == "Host time per step by phase (mean, stacked)":
        bins = d.bins(rows)
        xs = list(bins)
        ys = [
            [sum(r.step.phases.get(p, 0) for r in bins[t]) / len(bins[t]) / 1e9 for t in xs]
            for p in PHASES
        ]
        ax.stackplot(xs, ys, labels=PHASES, alpha=0.85)
    elif title == "Step host time p50 by mode":
        for mode in sorted({_mode(r.step) for r in rows}):
            sel = [r for r in rows if _mode(r.step) == mode]
            _line(ax, d, sel, _pct("host_ns", 50), f"p50 {mode}")
        ax.set_yscale("log")
    elif title == "GPU idle before step":
        _line(ax, d, rows, _pct("gpu_idle_before_ns", 50), "p50 idle")
        _line(ax, d, rows, _pct("gpu_idle_before_ns", 99), "p99 idle")
        _line(ax, d, rows, _pct("gpu_busy_ns", 50), "p50 forward busy")
        ax.set_yscale("log")
    elif title == "GPU idle share":
        _line(ax, d, rows, _ratio("gpu_idle_share"), "gpu_idle_share")
        _line(ax, d, rows, _ratio("host_bound_share"), "host_bound_share")
        ax.set_ylim(-0.05, 1.05)
    elif title == "Metadata build time by builder (mean)":
        builds = [b for b in d.builds if b.item[1].tag != BuildTag.CAPTURE]
        for name in sorted({b.item[0] for b in builds}):
            for dr in (False, True):
                sel = [b for b in builds if b.item[0] == name and bool(b.item[1].flags & 1) == dr]
                if sel:
                    _line(
                        ax,
                        d,
                        sel,
                        lambda rs: sum(_build(b).dur_ns for b in rs) / len(rs) / 1e9,
                        f"{name} drafter={'true' if dr else 'false'}",
                    )
    elif title == "Reorder decisions":
        for ch in (False, True):
            sel = [o for o in d.reorders if _reorder(o).changed == ch]
            if sel:
                _line(
                    ax,
                    d,
                    sel,
                    lambda rs: len(rs) / d.window_s,
                    f"changed={'true' if ch else 'false'}",
                )
        _line(
            ax,
            d,
            d.reorders,
            lambda rs: sum(_reorder(o).moved for o in rs) / d.window_s,
            "moved requests",
        )
    elif title == "CPU launch overhead p50 per rank":
        for p in d.procs:
            _line(
                ax,
                d,
                [r for r in rows if r.step.pid == p.pid],
                _pct("cpu_launch_overhead_ns", 50),
                p.rank,
            )
    elif title == "Probe health":
        _text(
            ax,
            [
                f"{p.pid} {p.rank}: records dropped {p.dropped}, hook faults {p.hook_faults}"
                for p in d.procs
            ],
        )
        return
    elif title == "Probe cost per step (calibrated)":
        cals = [p for p in d.procs if p.calibration is not None]
        if not cals:
            _text(ax, ["no calibration in this recording (recorded before the probe took one)"])
            return
        for p in cals:
            cal = dict(p.calibration or {})
            mine = [r for r in rows if r.step.pid == p.pid]
            for name, label in COST_LABELS.items():
                if name == "headline" or has_timing(cal, TIMINGS[name]):
                    key = "per_step_ns" if name == "headline" else cost_key(TIMINGS[name])
                    _line(ax, d, mine, _probe_cost(p.pid, cal, key), f"{label} {p.pid}")
    elif title in RANK_PANELS:
        _draw_ranks(title, ax, d)
    else:
        raise KeyError(f"no rendering for panel {title!r}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="best")
    ax.set_xlabel("s since first step")
    ax.grid(alpha=0.3)


RANK_PANELS = ("Who holds the step: last rank by phase", "Rank skew when last (p50, p99)")


def rank_rows(rec: Recording) -> list[tuple[int, str, StepRanks]]:
    """Each matched step that names a last rank (:mod:`probe.analysis.ranks`): its first rank's
    start (BOOTTIME ns), the last rank's label, the comparison."""
    rr = recording_ranks(rec)
    out: list[tuple[int, str, StepRanks]] = []
    for e in rr.engines:
        labels = [r.rank.label for r in e]
        it, _ = per_step(e, sync_launch=rr.sync_launch)
        out.extend((sr.start_ns[0], labels[sr.last], sr) for sr in it if sr.last is not None)
    return out


def _draw_ranks(title: str, ax: Axes, d: Data) -> None:
    """The ranks panels: per window, each (last rank, phase)'s share of the steps that
    name a last rank; each last rank's skew p50 and p99."""
    if not d.rank_rows:
        _text(ax, ["one worker per engine: no ranks side by side"])
        return
    bins: dict[float, list[tuple[str, StepRanks]]] = defaultdict(list)
    for t, label, sr in d.rank_rows:
        bins[((t - d.t_start) // d.window_ns) * d.window_s].append((label, sr))
    xs = sorted(bins)
    if title == RANK_PANELS[0]:
        keys = sorted({(lab, sr.phase or "start") for lab, sr in (r[1:] for r in d.rank_rows)})
        ys = [
            [sum(1 for lab, sr in bins[t] if (lab, sr.phase or "start") == k) / len(bins[t])
             for t in xs]
            for k in keys
        ]  # fmt: skip
        ax.stackplot(xs, ys, labels=[f"{lab} {ph}" for lab, ph in keys], alpha=0.8)
        ax.set_ylim(0, 1.05)
        return
    for lab in sorted({r[1] for r in d.rank_rows}):
        for q in (50, 99):
            pts = [
                (t, percentile([sr.skew_ns / 1e9 for la, sr in bins[t] if la == lab], q))
                for t in xs
            ]
            ax.plot(
                [t for t, v in pts if v is not None],
                [v for _, v in pts if v is not None],
                marker=".",
                label=f"p{q} {lab}",
            )


def _probe_cost(pid: int, cal: dict[str, Any], key: str) -> Callable[[Sequence[At]], float | None]:
    """Seconds per forward step the probe's hooks cost in a window, one figure (``key``) of
    :func:`probe.analysis.cost.probe_cost` over the window's steps, what the panel's PromQL
    computes (:data:`exporters.metrics.PROBE_COST`)."""

    def f(rs: Sequence[At]) -> float | None:
        c = probe_cost((r.step for r in rs), {pid: cal})
        v = c.get(key) if c else None
        return None if v is None else v / 1e9

    return f


def _build(a: At) -> Build:
    b: Build = a.item[1]
    return b


def _reorder(a: At) -> Reorder:
    o: Reorder = a.item
    return o


def render(rec: Recording, out: Path, window_s: float = 1.0) -> list[Path]:
    d = Data(rec, window_s)
    written = []
    for fname, build in DASHBOARDS.items():
        dash = build()
        panels = dash["panels"]
        cols = 2
        nrows = -(-len(panels) // cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(14, 3.2 * nrows))
        flat = list(axes.flat)
        for ax, p in zip(flat, panels, strict=False):
            draw(p["title"], ax, d)
            ax.set_title(p["title"], fontsize=9)
        for ax in flat[len(panels) :]:
            ax.axis("off")
        fig.suptitle(f"{dash['title']}: {rec.path.name}", fontsize=11)
        fig.tight_layout()
        path = out / fname.replace(".json", ".png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dashboards.render_recording", description=__doc__)
    ap.add_argument("recording", nargs="?", default=str(default_recording()))
    ap.add_argument("--out", type=Path, default=Path("docs/dashboards"))
    ap.add_argument("--window", type=float, default=1.0, help="seconds per point")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for p in render(Recording.open(args.recording), args.out, args.window):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
