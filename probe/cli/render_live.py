"""The live view (``probe top``, ``probe attach``): a sink that keeps a window of recent
steps per rank and renders it, as rich panels in a terminal or plain lines elsewhere.

It keeps :class:`~probe.step.Step` objects and renders the one summary of them
(:func:`probe.analysis.steady.summarize_steps`), so the live numbers and ``probe report`` share
one set of definitions: every step is split into steady state and warm-up as it arrives,
by a running :class:`probe.analysis.steady.Classes` (the rules of
:mod:`probe.analysis.rules`), and the
window's figures are over its steady steps, as the report's. A short history per rank
(FULL share and CPU launch overhead in time buckets) is drawn as sparklines.

    >>> stats = LiveStats()
    >>> col = Collector(rings=rings, sinks=[stats])                  # doctest: +SKIP
    >>> col.poll(); console.print(render(stats))                      # doctest: +SKIP
"""

from __future__ import annotations

import textwrap
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from probe.analysis import ranks
from probe.analysis import views as analysis
from probe.analysis.steady import Classes, summarize_steps
from probe.analysis.summary import verdict
from probe.analysis.traps import traps
from probe.reader.collector import ProcessState
from probe.records import Mode
from probe.step import GpuSample, Step

if TYPE_CHECKING:
    from rich.console import RenderableType


@dataclass
class RankView:
    """The window of one process."""

    pid: int
    role: str = "?"
    label: str = "-"
    snapshot: dict[str, Any] | None = None
    steps: deque[Step] = field(default_factory=lambda: deque(maxlen=4096))
    arrivals: deque[int] = field(default_factory=lambda: deque(maxlen=4096))
    steps_total: int = 0
    forward_total: int = 0
    first_arrival: int | None = None
    dropped: int = 0
    faults: int = 0
    #: warm-up step numbers in the window, with why (:data:`probe.analysis.rules.CLASSES`)
    warm: dict[int, str] = field(default_factory=dict)
    history: deque[Bucket] = field(default_factory=deque)


@dataclass
class Bucket:
    """One bar of a rank's history: the forward steps that ended in one time slot."""

    slot: int
    steps: int = 0
    full: int = 0
    #: steady-state CPU launch overhead by step number (warm-up steps leave it)
    launch: dict[int, int] = field(default_factory=dict)


def _boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class LiveStats:
    """A :class:`probe.reader.collector.Sink` holding the last ``window`` steps of every rank."""

    def __init__(
        self,
        *,
        window: int = 2048,
        rate_window_s: float = 10.0,
        clock_ns: Callable[[], int] = _boottime_ns,
        roles: Mapping[int, str] | None = None,
        sample_every: int = 1,
        history: int = 30,
        history_s: float = 2.0,
    ) -> None:
        self.window = window
        self.history = history
        self.history_ns = max(1, int(history_s * 1e9))
        self.sample_every = max(1, sample_every)  # rates are of engine steps: recorded x N
        self.rate_window_ns = int(rate_window_s * 1e9)
        self.clock_ns = clock_ns
        self.roles = dict(roles or {})
        self.ranks: dict[int, RankView] = {}
        self.classes = Classes(keep=max(window, 1) * 2)
        self.closed = False
        #: records the reader has read and not assembled yet (its loop sets it each poll)
        self.behind = 0
        #: processes attached (a reader's loop that attaches sets it; None: not told)
        self.attached: int | None = None
        #: how long the attachment lasted, set at its end by a reader's loop that attaches:
        #: once closed, the rates are the forward steps over it (None: not told)
        self.attached_s: float | None = None

    def _view(self, proc: ProcessState) -> RankView:
        v = self.ranks.get(proc.pid)
        if v is None:
            v = RankView(
                proc.pid,
                role=self.roles.get(proc.pid, "?"),
                steps=deque(maxlen=self.window),
                history=deque(maxlen=self.history),
            )
            self.ranks[proc.pid] = v
        return v

    def on_process(self, proc: ProcessState) -> None:
        v = self._view(proc)
        if proc.snapshot is not None:
            v.snapshot = proc.snapshot
            v.label = proc.rank_label
        v.dropped = proc.dropped
        v.faults = proc.hook_faults

    def on_steps(
        self, proc: ProcessState, steps: Sequence[Step], gpu: Sequence[GpuSample] = ()
    ) -> None:
        v = self._view(proc)
        now = self.clock_ns()
        found = self.classes.classify(steps)
        for pid, n, why in found:
            if pid == v.pid:
                v.warm[n] = why
                for b in v.history:
                    b.launch.pop(n, None)
        for s in steps:
            v.steps.append(s)
            if s.forward:
                v.forward_total += 1
                v.arrivals.append(s.t1 or now)
                if v.first_arrival is None:
                    v.first_arrival = s.t1 or now
                self._add_history(v, s, now)
        if v.steps and len(v.warm) > self.window:
            oldest = v.steps[0].step
            v.warm = {n: w for n, w in v.warm.items() if n >= oldest}
        v.steps_total += len(steps)
        v.dropped = proc.dropped
        v.faults = proc.hook_faults
        if gpu:
            # timings trail their steps by a few: join them from the newest step back
            by_step = {g.step: g for g in gpu}
            for i in range(len(v.steps) - 1, -1, -1):
                g = by_step.pop(v.steps[i].step, None)
                if g is not None:
                    v.steps[i] = v.steps[i].with_gpu(g)
                if not by_step:
                    break

    def _add_history(self, v: RankView, s: Step, now: int) -> None:
        slot = (s.t1 or now) // self.history_ns
        if not v.history or v.history[-1].slot < slot:
            v.history.append(Bucket(slot))
        b = next((b for b in reversed(v.history) if b.slot == slot), None)
        if b is None:
            return  # older than the history kept
        b.steps += 1
        b.full += s.mode == Mode.FULL
        if s.cpu_launch_overhead_ns is not None and s.step not in v.warm:
            b.launch[s.step] = s.cpu_launch_overhead_ns

    def close(self) -> None:
        self.closed = True  # rates from now on: the last window of each rank's own steps

    # -- summaries ------------------------------------------------------------------------

    def step_rate(self, v: RankView) -> float:
        """Engine steps per second over the last ``rate_window_s`` of the engine's own
        time. While the reader is behind (:attr:`behind`: records read and not assembled
        yet) that window ends at the newest step read, not at the reader's clock: on a
        saturated host the reader runs seconds behind the engine, and a window on its
        own clock held none of the steps it had (a rate of 0 while the count rose). While
        every step seen is inside the window (the first seconds of an attach), the rate
        is over their intervals, not diluted by the part of the window before them. Once
        the view is closed after an attachment whose length it was told
        (:attr:`attached_s`): the rank's forward steps over the attachment."""
        if self.closed and self.attached_s:
            return v.forward_total / self.attached_s * self.sample_every
        if not v.arrivals:
            return 0.0
        newest = max(v.arrivals)
        now = newest if self.closed or self.behind else max(self.clock_ns(), newest)
        start = now - self.rate_window_ns
        recent = sum(1 for t in v.arrivals if t > start)
        first = v.first_arrival if v.first_arrival is not None else v.arrivals[0]
        if len(v.arrivals) == v.arrivals.maxlen:  # the deque holds only the newest steps
            first = max(first, v.arrivals[0])
        if first > start:  # every step since the first is in the window: their intervals
            span_ns = newest - first
            per_s = (recent - 1) / (span_ns / 1e9) if span_ns > 0 else float(recent)
        else:
            per_s = recent / (self.rate_window_ns / 1e9)
        return per_s * self.sample_every

    def split(self, v: RankView) -> tuple[list[Step], list[Step]]:
        """The window's (steady-state, warm-up) forward steps."""
        fw = analysis.forward_steps(v.steps)
        return [s for s in fw if s.step not in v.warm], [s for s in fw if s.step in v.warm]

    def trend(self, v: RankView) -> dict[str, Any]:
        """The rank's history, oldest first, one value per ``history_s`` slot up to now
        (None: no step in that slot): FULL share, and median steady-state CPU launch
        overhead (ns)."""
        if self.closed or not v.history:
            last = v.history[-1].slot if v.history else 0
        else:
            last = max(self.clock_ns() // self.history_ns, v.history[-1].slot)
        by_slot = {b.slot: b for b in v.history}
        full: list[float | None] = []
        launch: list[float | None] = []
        for slot in range(last - self.history + 1, last + 1):
            b = by_slot.get(slot)
            full.append(b.full / b.steps if b and b.steps else None)
            launch.append(analysis.percentile(list(b.launch.values()), 50) if b else None)
        return {
            "full_share": full,
            "cpu_launch_overhead_ns": launch,
            "slot_s": self.history_ns / 1e9,
        }

    def _figures(self, views: Sequence[RankView]) -> tuple[Any, dict[str, Any]]:
        steps = [s for v in views for s in v.steps]
        warm = {(v.pid, n): why for v in views for n, why in v.warm.items()}
        cals = {v.pid: analysis.calibration_of(v.snapshot or {}) for v in views}
        summ = summarize_steps(steps, cals, warm=warm)
        return summ, summ.figures()

    def summary(self, v: RankView) -> dict[str, Any]:
        summ, fig = self._figures([v])
        lo = fig["phases"]["all"]
        phases = []
        for name in ["cpu_launch_overhead_ns", *analysis.PHASES]:
            st = lo.get(name) or {}
            if st.get("n") and st.get("p99"):
                phases.append((name.removesuffix("_ns"), st["p50"], st["p99"]))
        snap = v.snapshot or {}
        return {
            "pid": v.pid,
            "role": v.role,
            "rank": v.label,
            "steps_total": v.steps_total,
            "steps_per_s": self.step_rate(v),
            "hit_rates": fig["hit_rates"],
            "miss_reasons": [(r["mode"], r["reason"], r["share"]) for r in fig["miss_reasons"][:3]],
            "launch": phases,
            "warmup": fig["forward_steps"] - fig["steady_steps"],
            "gpu": fig["gpu"],
            "probe_cost": fig["probe_cost"],
            "trend": self.trend(v),
            "reorder": summ.reorder_figures(),
            "traps": [t["message"] for t in traps(snap)["traps"]],
            "verdict": verdict(fig, snap) if fig["forward_steps"] else [],
            "dropped": v.dropped,
            "faults": v.faults,
        }

    def active(self) -> list[RankView]:
        """Processes that ran steps (the ranks), in rank order."""
        return sorted(
            (v for v in self.ranks.values() if v.steps_total),
            key=lambda v: (v.label, v.pid),
        )

    def aggregate(self) -> dict[str, Any]:
        ranks = self.active()
        _, fig = self._figures(ranks)
        snap = next((v.snapshot for v in ranks if v.snapshot), None)
        return {
            "ranks": len(ranks),
            "steps_per_s": sum(self.step_rate(v) for v in ranks),
            "hit_rates": fig["hit_rates"],
            "verdict": verdict(fig, snap)[:1] if fig["forward_steps"] else [],
        }


# -- rendering ------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _us(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e3:,.0f}"


_BARS = "▁▂▃▄▅▆▇█"


def sparkline(
    values: Sequence[float | None], lo: float | None = None, hi: float | None = None
) -> str:
    """One character per value, scaled from ``lo`` to ``hi`` (default: the values' own
    range); a gap for None."""
    xs = [x for x in values if x is not None]
    if not xs:
        return " " * len(values)
    lo = min(xs) if lo is None else lo
    hi = max(xs) if hi is None else hi
    span = hi - lo
    out = []
    for x in values:
        if x is None:
            out.append(" ")
            continue
        i = round((x - lo) / span * (len(_BARS) - 1)) if span > 0 else len(_BARS) // 2
        out.append(_BARS[min(max(i, 0), len(_BARS) - 1)])
    return "".join(out)


def _last(values: Sequence[float | None]) -> float | None:
    return next((x for x in reversed(values) if x is not None), None)


def rank_lines(s: Mapping[str, Any]) -> list[str]:
    """One rank's summary as short lines (under 80 columns but for the verdict)."""
    h = s["hit_rates"]
    out = [
        f"{s['rank']} pid {s['pid']} {s['role']}: {s['steps_per_s']:.1f} steps/s, "
        f"{s['steps_total']:,} steps, {s['dropped']:,} dropped, {s['faults']} faults",
        f"  FULL {_pct(h['full_hit_rate'])}  graph {_pct(h['graph_rate'])}  "
        f"decode FULL {_pct(h['decode_full_hit_rate'])}  (window {h['steps']:,} steady steps)",
    ]
    if s["miss_reasons"]:
        out.append(
            "  modes: "
            + ", ".join(f"{m.upper()} {r} {share:.0%}" for m, r, share in s["miss_reasons"])
        )
    if s["launch"]:
        first, *rest = s["launch"]
        out.append(f"  CPU launch overhead p50 {_us(first[1])} µs, p99 {_us(first[2])} µs")
        top = sorted(rest, key=lambda t: -(t[1] or 0))[:4]
        if top:
            out.append(
                "  phase p50/p99 µs: "
                + ", ".join(f"{n} {_us(p50)}/{_us(p99)}" for n, p50, p99 in top)
            )
    tr = s.get("trend")
    if tr and any(x is not None for x in tr["full_share"]):
        full = tr["full_share"]
        out.append(
            f"  FULL   {_pct(_last(full)):>9}  {sparkline(full, 0.0, 1.0)}  "
            f"{tr['slot_s']:g} s a bar"
        )
        launch = tr["cpu_launch_overhead_ns"]
        ls = [x for x in launch if x is not None]
        if ls:
            out.append(
                f"  launch {_us(_last(launch)):>6} µs  {sparkline(launch)}  "
                f"{_us(min(ls))}-{_us(max(ls))} µs"
            )
    if s.get("warmup"):
        out.append(
            f"  warm-up: {s['warmup']:,} steps apart (captures, profile, pre-replay, "
            "compile/JIT first uses)"
        )
    g = s["gpu"]
    if g["steps_timed"]:
        line = (
            f"  GPU idle share {_pct(g['idle_share'])}; host-bound "
            f"{_pct(g['host_bound_share'])} (idle > {g['host_bound_threshold']:.0%} of step)"
        )
        if g.get("engine_idle_gaps"):
            line += f"; engine idle {g['engine_idle_ns'] / 1e9:,.1f} s"
        if g["host_bound_top_phase"]:
            line += f", top {g['host_bound_top_phase']}"
        out.append(line)
    else:
        out.append("  GPU: no device timings (CPU engine or timing off)")
    ro = s["reorder"]
    if ro["decisions"]:
        out.append(
            f"  reorder: {ro['decisions']:,} decisions, {ro['changed']:,} changed, "
            f"{ro['moved_requests']:,} moved, thresholds {ro['thresholds']}"
        )
    cost = analysis.cost_line(s.get("probe_cost"), short=True)
    if cost:
        out.append(f"  {cost}")
    for t in s["traps"]:  # a trap's message is a sentence: wrapped to the 80 columns
        out.extend(
            textwrap.wrap(f"warning: {t}", 80, initial_indent="  ", subsequent_indent="    ")
        )
    if s["verdict"]:
        out.append(f"  verdict: {s['verdict'][0]}")
    return out


def skew_lines(stats: LiveStats) -> dict[int, str]:
    """Per pid, its line of ranks side by side (:mod:`probe.analysis.ranks`) over the window: how
    often it was last to arrive at the step, its skew p50 then, and the phase behind it.
    Ranks of one engine (data-parallel rank) on this host; none for a single worker."""
    engines: dict[int, list[RankView]] = {}
    for v in stats.active():
        snap = v.snapshot or {}
        if snap.get("role", "worker") == "worker":
            engines.setdefault(int(snap.get("dp_rank") or 0), []).append(v)
    out: dict[int, str] = {}
    for views in engines.values():
        if len(views) < 2:
            continue
        views.sort(key=lambda v: (int((v.snapshot or {}).get("pp_rank") or 0),
                                  int((v.snapshot or {}).get("tp_rank") or 0)))  # fmt: skip
        inputs = [
            ranks.RankInput(
                ranks.RankId(
                    v.pid,
                    int((v.snapshot or {}).get("tp_rank") or 0),
                    int((v.snapshot or {}).get("pp_rank") or 0),
                    int((v.snapshot or {}).get("dp_rank") or 0),
                ),
                list(v.steps),
            )
            for v in views
        ]
        sync = any((v.snapshot or {}).get("platform") == "cpu" for v in views)
        e = ranks.engine_ranks(inputs, sync_launch=sync)
        named = sum(r.last for r in e.ranks)
        for v, r in zip(views, e.ranks, strict=True):
            phase = f" ({r.phases[0][0]})" if r.phases else ""
            out[v.pid] = (
                f"  skew: last on {_pct(r.share)} of {named:,} matched steps, "
                f"p50 {_us(r.skew_p50_ns)} µs when last{phase}"
            )
    return out


def header_line(stats: LiveStats, title: str, agg: Mapping[str, Any] | None = None) -> str:
    """The first line; ``agg``: :meth:`LiveStats.aggregate` when the caller has it."""
    agg = stats.aggregate() if agg is None else agg
    h = agg["hit_rates"]
    return (
        f"{title} | {agg['ranks']} rank(s), {agg['steps_per_s']:.1f} steps/s"
        + (
            f" over the {stats.attached_s:,.1f} s attached"
            if stats.closed and stats.attached_s
            else ""
        )
        + f", FULL {_pct(h['full_hit_rate'])}, graph {_pct(h['graph_rate'])}"
        + (f", 1 step in {stats.sample_every} recorded" if stats.sample_every > 1 else "")
        + (f", {stats.behind:,} records behind" if stats.behind and agg["ranks"] else "")
    )


def waiting_line(stats: LiveStats) -> str | None:
    """What the view waits for, while no rank has a step to show (None once one has):
    the view is never blank."""
    if stats.active():
        return None
    if stats.behind:
        return f"catching up: {stats.behind:,} records read, the first steps being assembled"
    if stats.attached == 0 and not stats.ranks:
        return "waiting for the processes' rings (attaching)"
    if stats.attached and not stats.ranks:
        n = stats.attached
        return f"{n} process(es) attached; waiting for the first engine step (send requests)"
    return "waiting for engine steps (send requests to the server)"


def plain_lines(stats: LiveStats, title: str = "probe") -> list[str]:
    """The view as plain text (stdout not a terminal, ``--no-live`` progress); no rich
    (``attach --no-live`` never imports it: on a saturated host every millisecond of CPU
    at start and exit costs tens of milliseconds of wall time)."""
    agg = stats.aggregate()
    out = [header_line(stats, title, agg)]
    if agg["verdict"]:
        out.append(f"verdict: {agg['verdict'][0]}")
    skews = skew_lines(stats)
    for v in stats.active():
        out.extend(rank_lines(stats.summary(v)))
        if v.pid in skews:
            out.append(skews[v.pid])
    wait = waiting_line(stats)
    if wait:
        out.append(wait)
    return out


def render(stats: LiveStats, title: str = "probe") -> RenderableType:
    """The view as rich panels: a header with the aggregate, then one panel per rank."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    agg = stats.aggregate()
    head = Text(header_line(stats, title, agg), style="bold")
    if agg["verdict"]:
        head.append("\n" + agg["verdict"][0], style="cyan")
    parts: list[RenderableType] = [head]
    skews = skew_lines(stats)
    for v in stats.active():
        s = stats.summary(v)
        lines = rank_lines(s) + ([skews[v.pid]] if v.pid in skews else [])
        grid = Table.grid(padding=(0, 1))
        grid.add_column()
        for line in lines[1:]:
            style = "yellow" if "warning:" in line else "cyan" if "verdict:" in line else None
            grid.add_row(Text(line.strip(), style=style or ""))
        parts.append(Panel(grid, title=lines[0], title_align="left"))
    wait = waiting_line(stats)
    if wait:
        parts.append(Text(wait, style="dim"))
    counts = Counter(v.role for v in stats.ranks.values())
    parts.append(
        Text(
            "processes: " + ", ".join(f"{n} {r}" for r, n in sorted(counts.items())),
            style="dim",
        )
    )
    return Group(*parts)
