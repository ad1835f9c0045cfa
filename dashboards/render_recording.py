"""Plot what each dashboard panel shows, computed from a recording (no Grafana needed).

    python -m dashboards.render_recording [RECORDING] [--out docs/dashboards] [--window 1]

One PNG per dashboard, one subplot per panel, titled as the panel. Each quantity uses the
definitions of the panel's PromQL (:mod:`exporters.metrics`), computed per ``--window``
seconds of the recording's step start times (BOOTTIME, shown relative to the first step)
instead of ``rate(...[$__rate_interval])``. Quantiles here are exact per window; the
dashboards interpolate them from the explicit buckets.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import itertools

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from dashboards.generate import DASHBOARDS
from exporters.base import ProcessInfo, steps_from_recording
from exporters.metrics import LAUNCH_BUCKETS
from probe.analysis import PHASES, is_decode, percentile
from probe.cli import default_recording
from probe.recording import Recording

Row = Mapping[str, Any]


class Data:
    def __init__(self, rec: Recording, window_s: float) -> None:
        self.rows = [s for s in rec.steps() if s["mode"] is not None]
        self.t_start = min(s["t0_ns"] for s in self.rows)
        self.window_ns = int(window_s * 1e9)
        self.window_s = window_s
        self.procs: list[ProcessInfo] = steps_from_recording(rec)[0]
        self.builds = list(rec.rows("builds"))
        self.reorders = list(rec.rows("reorders"))
        starts = {(s["pid"], s["step"]): s["t0_ns"] for s in rec.steps()}
        for b in self.builds:
            b["t"] = b["t0_ns"]
        for o in self.reorders:
            o["t"] = starts.get((o["pid"], o["step"]), o["t0_ns"])
        for s in self.rows:
            s["t"] = s["t0_ns"]

    def bins(self, rows: Iterable[Row]) -> dict[float, list[Row]]:
        out: dict[float, list[Row]] = defaultdict(list)
        for r in rows:
            k = (r["t"] - self.t_start) // self.window_ns
            out[k * self.window_s] = [*out.get(k * self.window_s, []), r]
        return dict(sorted(out.items()))

    def series(
        self, rows: Iterable[Row], f: Callable[[list[Row]], float | None]
    ) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for t, rs in self.bins(rows).items():
            v = f(rs)
            if v is not None:
                xs.append(t)
                ys.append(v)
        return xs, ys


def _ratio(num: Callable[[Row], bool], den: Callable[[Row], bool]) -> Callable[[list[Row]], Any]:
    def f(rs: list[Row]) -> float | None:
        d = sum(1 for r in rs if den(r))
        return sum(1 for r in rs if den(r) and num(r)) / d if d else None

    return f


def _line(ax: Axes, d: Data, rows: Iterable[Row], f: Any, label: str) -> None:
    xs, ys = d.series(list(rows), f)
    ax.plot(xs, ys, marker=".", label=label)


def _stack(ax: Axes, d: Data, rows: Sequence[Row], key: Callable[[Row], str]) -> None:
    bins = d.bins(rows)
    keys = sorted({key(r) for r in rows})
    xs = list(bins)
    ys = [[sum(1 for r in bins[t] if key(r) == k) / d.window_s for t in xs] for k in keys]
    if keys:
        ax.stackplot(xs, ys, labels=keys, alpha=0.8)


def _pct(field: str, q: float) -> Callable[[list[Row]], float | None]:
    return lambda rs: percentile([r[field] / 1e9 for r in rs if r.get(field) is not None], q)


def _text(ax: Axes, lines: Sequence[str]) -> None:
    ax.axis("off")
    ax.text(0, 1, "\n".join(lines) or "(none)", va="top", fontsize=7, wrap=True, family="monospace")


def draw(title: str, ax: Axes, d: Data) -> None:
    rows = d.rows
    graph = ("full", "piecewise")
    if title == "FULL and graph hit rate":
        _line(ax, d, rows, _ratio(lambda r: r["mode"] == "full", lambda r: True), "full_hit_rate")
        _line(ax, d, rows, _ratio(lambda r: r["mode"] in graph, lambda r: True), "graph_rate")
        _line(
            ax,
            d,
            rows,
            _ratio(lambda r: bool(r["replayed"]), lambda r: r["mode"] in graph),
            "replay_confirmed_rate",
        )
        ax.set_ylim(-0.05, 1.05)
    elif title == "Decode FULL hit rate (MTP)":
        for ql in sorted({r["uniform_decode_query_len"] for r in rows if is_decode(r)}):
            sel = [r for r in rows if is_decode(r) and r["uniform_decode_query_len"] == ql]
            _line(
                ax, d, sel, _ratio(lambda r: r["mode"] == "full", lambda r: True), f"query_len {ql}"
            )
        ax.set_ylim(-0.05, 1.05)
    elif title == "Miss reasons (steps/s, stacked)":
        _stack(ax, d, rows, lambda r: f"{r['mode']} / {r['reason']}")
    elif title == "Drafter (MTP) graph modes":
        _stack(
            ax,
            d,
            [r for r in rows if r["draft_mode"]],
            lambda r: f"{r['draft_mode']} / {r['draft_reason']}",
        )
    elif title == "Padding waste":

        def waste(rs: list[Row]) -> float | None:
            g = [r for r in rs if r["mode"] != "none"]
            p = sum(r["padded_tokens"] for r in g)
            return (p - sum(r["num_tokens"] for r in g)) / p if p else None

        _line(ax, d, rows, waste, "padding_waste")
        ax.set_ylim(-0.05, 1.05)
    elif title == "Tokens through graphs (tokens/s)":
        g = [r for r in rows if r["mode"] != "none"]
        _line(ax, d, g, lambda rs: sum(r["padded_tokens"] for r in rs) / d.window_s, "padded")
        _line(ax, d, g, lambda rs: sum(r["num_tokens"] for r in rs) / d.window_s, "real")
    elif title == "FULL hit rate per rank":
        for p in d.procs:
            sel = [r for r in rows if r["pid"] == p.pid]
            _line(
                ax,
                d,
                sel,
                _ratio(lambda r: r["mode"] == "full", lambda r: True),
                f"{p.rank} ({p.pid})",
            )
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
        bins = d.bins([r for r in rows if r["cpu_launch_overhead_ns"] is not None])
        edges = [0.0, *LAUNCH_BUCKETS]
        last = max(bins, default=0.0)
        times = [i * d.window_s for i in range(int(last / d.window_s) + 1)]
        grid = [
            [
                sum(1 for r in bins.get(t, []) if lo < r["cpu_launch_overhead_ns"] / 1e9 <= hi)
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
        for mode in sorted({r["mode"] for r in rows}):
            sel = [r for r in rows if r["mode"] == mode]
            _line(ax, d, sel, _pct("cpu_launch_overhead_ns", 50), f"p50 {mode}")
            _line(ax, d, sel, _pct("cpu_launch_overhead_ns", 99), f"p99 {mode}")
        ax.set_yscale("log")
    elif title == "Host time per step by phase (mean, stacked)":
        bins = d.bins(rows)
        xs = list(bins)
        ys = [
            [sum((r[f"{p}_ns"] or 0) for r in bins[t]) / len(bins[t]) / 1e9 for t in xs]
            for p in PHASES
        ]
        ax.stackplot(xs, ys, labels=PHASES, alpha=0.85)
    elif title == "Step host time p50 by mode":
        for mode in sorted({r["mode"] for r in rows}):
            _line(ax, d, [r for r in rows if r["mode"] == mode], _pct("host_ns", 50), f"p50 {mode}")
        ax.set_yscale("log")
    elif title == "GPU idle before step":
        _line(ax, d, rows, _pct("gpu_idle_before_ns", 50), "p50 idle")
        _line(ax, d, rows, _pct("gpu_idle_before_ns", 99), "p99 idle")
        _line(ax, d, rows, _pct("gpu_busy_ns", 50), "p50 forward busy")
        ax.set_yscale("log")
    elif title == "GPU idle share":

        def share(rs: list[Row]) -> float | None:
            idle = sum(r["gpu_idle_before_ns"] or 0 for r in rs)
            busy = sum(r["gpu_busy_ns"] or 0 for r in rs)
            return idle / (idle + busy) if idle + busy else None

        _line(ax, d, rows, share, "gpu_idle_share")
        ax.set_ylim(-0.05, 1.05)
    elif title == "Metadata build time by builder (mean)":
        builds = [b for b in d.builds if b["tag"] != "capture"]
        for name in sorted({b["builder"] or "?" for b in builds}):
            for dr in (0, 1):
                sel = [b for b in builds if (b["builder"] or "?") == name and b["drafter"] == dr]
                if sel:
                    _line(
                        ax,
                        d,
                        sel,
                        lambda rs: sum(b["t1_ns"] - b["t0_ns"] for b in rs) / len(rs) / 1e9,
                        f"{name} drafter={'true' if dr else 'false'}",
                    )
    elif title == "Reorder decisions":
        for ch in (0, 1):
            sel = [o for o in d.reorders if o["changed"] == ch]
            if sel:
                _line(
                    ax,
                    d,
                    sel,
                    lambda rs: len(rs) / d.window_s,
                    f"changed={'true' if ch else 'false'}",
                )
        _line(
            ax, d, d.reorders, lambda rs: sum(o["moved"] for o in rs) / d.window_s, "moved requests"
        )
    elif title == "CPU launch overhead p50 per rank":
        for p in d.procs:
            _line(
                ax,
                d,
                [r for r in rows if r["pid"] == p.pid],
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
    else:
        raise KeyError(f"no rendering for panel {title!r}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="best")
    ax.set_xlabel("s since first step")
    ax.grid(alpha=0.3)


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
