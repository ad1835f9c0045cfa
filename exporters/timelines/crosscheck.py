"""The per-step cross-check: what a GPU profile saw in each probe step.

    from exporters.timelines.crosscheck import format_step_table, step_table

    table = step_table(recording, profile, alignment)
    print(format_step_table(table))

Each host call is attributed to the probe step whose host interval holds its start (same
pid), each kernel to the step of the call that launched it (correlation id). Per step:
graph launches and eager kernel launches, those inside the probe's forward span, kernels,
GPU busy/idle over the step period (from this step's start to the next one's, the HTA union
of kernel intervals), launch delays (HTA's definition, extended to graph launches: see
:class:`exporters.timelines.analyses.LaunchDelay`) and the probe's own numbers beside them
(FULL replays, piecewise pieces, forward GPU time).
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from typing import Any

from exporters.timelines.align import Alignment, profile_range, shift_profile
from exporters.timelines.analyses import gpu_busy_idle, launch_delays
from exporters.timelines.model import GpuKernel, HostCall, Profile, is_graph_launch
from probe.reader.recording import Recording
from probe.records import Flag, Mode, Phase, ReplayKind
from probe.step import Step

__all__ = ["StepRow", "StepTable", "format_step_table", "is_eager_launch", "step_table"]

_EAGER_LAUNCH = ("LaunchKernel", "LaunchCooperativeKernel", "ModuleLaunchKernel", "cuLaunch")


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def is_eager_launch(name: str) -> bool:
    """A kernel launch that is not a graph replay (``cudaLaunchKernel``, ``hipLaunchKernel``,
    ``hipExtModuleLaunchKernel``, ``cuLaunchKernelEx``...)."""
    return not is_graph_launch(name) and any(t in name for t in _EAGER_LAUNCH)


@dataclass(frozen=True)
class StepRow:
    """One probe step with what the profile saw in it (times in ns)."""

    pid: int
    step: int
    t0_ns: int
    t1_ns: int
    mode: str | None
    reason: str | None
    probe_full_replays: int
    probe_piecewise_pieces: int
    probe_forward_ns: int
    probe_gpu_busy_ns: int | None
    graph_launches: int
    graph_launches_in_forward: int
    eager_launches: int
    kernels: int
    gpu_busy_ns: int
    gpu_idle_ns: int
    forward_gpu_ns: int | None
    graph_launch_delay_ns: int | None
    eager_launch_delay_median_ns: int | None

    @property
    def launches_agree(self) -> bool:
        """The probe's target replays equal the graph launches inside its forward span."""
        return (
            self.probe_full_replays + self.probe_piecewise_pieces == self.graph_launches_in_forward
        )


@dataclass(frozen=True)
class StepTable:
    """Per-step rows and their totals; ``alignment`` is how the profile was placed."""

    rows: tuple[StepRow, ...]
    alignment: Alignment
    unattributed_calls: int
    totals: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "alignment": {
                "offset_ns": self.alignment.offset_ns,
                "method": self.alignment.method,
                "detail": self.alignment.detail,
                "forward_pairs": self.alignment.forward_pairs,
                "forward_residual_ns": self.alignment.forward_residual_ns,
                "clock_pair_offset_ns": self.alignment.clock_pair_offset_ns,
                "forward_offset_ns": self.alignment.forward_offset_ns,
            },
            "totals": self.totals,
            "unattributed_calls": self.unattributed_calls,
            "steps": [
                {
                    **{f: getattr(r, f) for f in r.__dataclass_fields__},
                    "launches_agree": r.launches_agree,
                }
                for r in self.rows
            ],
        }


def step_table(
    recording: Recording, profile: Profile, alignment: Alignment, *, drafter: bool = False
) -> StepTable:
    """Attribute the profile's launches and kernels to the recording's steps.

    Only steps that overlap the profile's time range are listed. ``drafter`` also counts
    the drafter's replays on the probe side (the forward span is the target's).
    """
    prof = shift_profile(profile, alignment.offset_ns)
    pr = profile_range(prof)
    steps = [s for s in recording.iter_steps() if pr is not None and _overlaps((s.t0, s.t1), pr)]
    by_pid: dict[int, list[Step]] = {}
    for s in steps:
        by_pid.setdefault(s.pid, []).append(s)
    starts = {pid: [s.t0 for s in ss] for pid, ss in by_pid.items()}
    single_pid = next(iter(by_pid)) if len(by_pid) == 1 else None

    def step_of(pid: int, t: int) -> tuple[int, int] | None:
        key = pid if pid in by_pid else single_pid
        if key is None:
            return None
        i = bisect.bisect_right(starts[key], t) - 1
        if i < 0 or t > by_pid[key][i].t1:
            return None
        return key, by_pid[key][i].step

    calls: dict[tuple[int, int], list[HostCall]] = {}
    unattributed = 0
    step_of_corr: dict[int, tuple[int, int]] = {}
    for c in prof.host_calls:
        at = step_of(c.pid, c.start_ns)
        if at is None:
            unattributed += is_graph_launch(c.name) or is_eager_launch(c.name)
            continue
        calls.setdefault(at, []).append(c)
        if c.correlation_id is not None:
            step_of_corr.setdefault(c.correlation_id, at)
    kernels: dict[tuple[int, int], list[GpuKernel]] = {}
    for kern in prof.kernels:
        if kern.correlation_id is not None and kern.correlation_id in step_of_corr:
            kernels.setdefault(step_of_corr[kern.correlation_id], []).append(kern)
    delays: dict[tuple[int, int], list[Any]] = {}
    for d in launch_delays(prof):
        at = step_of_corr.get(d.correlation_id)
        if at is not None:
            delays.setdefault(at, []).append(d)

    rows: list[StepRow] = []
    for pid, ss in sorted(by_pid.items()):
        periods = [(s.t0, ss[i + 1].t0 if i + 1 < len(ss) else s.t1) for i, s in enumerate(ss)]
        busy = gpu_busy_idle(prof, periods)
        for s, bi in zip(ss, busy, strict=True):
            k = (pid, s.step)
            cs = calls.get(k, [])
            spans = [
                (sp.t0, sp.t1)
                for sp in s.spans
                if sp.phase == Phase.FORWARD_LAUNCH and not sp.flags & Flag.DRAFTER
            ]
            replays = [
                r
                for r in s.replays
                if r.kind == ReplayKind.REPLAY and (drafter or not r.flags & Flag.DRAFTER)
            ]

            def in_fwd(c: HostCall, spans: list[tuple[int, int]] = spans) -> bool:
                return any(a <= c.start_ns <= b for a, b in spans)

            graph = [c for c in cs if is_graph_launch(c.name)]
            eager = [c for c in cs if is_eager_launch(c.name)]
            fwd_corr = {c.correlation_id for c in cs if in_fwd(c) and c.correlation_id}
            fk = [x for x in kernels.get(k, []) if x.correlation_id in fwd_corr]
            ds = delays.get(k, [])
            g_delays = [d.start_to_start_ns for d in ds if d.is_graph_launch]
            e_delays = [d.end_to_start_ns for d in ds if not d.is_graph_launch]
            rows.append(
                StepRow(
                    pid=pid,
                    step=s.step,
                    t0_ns=s.t0,
                    t1_ns=s.t1,
                    mode=s.mode.name.lower() if s.mode is not None else None,
                    reason=s.reason.name.lower() if s.reason is not None else None,
                    probe_full_replays=sum(1 for r in replays if r.mode == Mode.FULL),
                    probe_piecewise_pieces=sum(1 for r in replays if r.mode == Mode.PIECEWISE),
                    probe_forward_ns=sum(b - a for a, b in spans),
                    probe_gpu_busy_ns=s.gpu_busy_ns,
                    graph_launches=len(graph),
                    graph_launches_in_forward=sum(1 for c in graph if in_fwd(c)),
                    eager_launches=len(eager),
                    kernels=len(kernels.get(k, [])),
                    gpu_busy_ns=bi.busy_ns,
                    gpu_idle_ns=bi.idle_ns,
                    forward_gpu_ns=(max(x.end_ns for x in fk) - min(x.start_ns for x in fk))
                    if fk
                    else None,
                    graph_launch_delay_ns=g_delays[0] if g_delays else None,
                    eager_launch_delay_median_ns=int(statistics.median(e_delays))
                    if e_delays
                    else None,
                )
            )
    totals = {
        "steps": len(rows),
        "probe_full_replays": sum(r.probe_full_replays for r in rows),
        "probe_piecewise_pieces": sum(r.probe_piecewise_pieces for r in rows),
        "graph_launches": sum(r.graph_launches for r in rows),
        "graph_launches_in_forward": sum(r.graph_launches_in_forward for r in rows),
        "eager_launches": sum(r.eager_launches for r in rows),
        "kernels": sum(r.kernels for r in rows),
        "steps_agreeing": sum(1 for r in rows if r.launches_agree),
    }
    return StepTable(tuple(rows), alignment, unattributed, totals)


def format_step_table(table: StepTable) -> str:
    """The per-step table as plain text (``probe merge --report``)."""

    def us(v: int | None) -> str:
        return "-" if v is None else f"{v / 1000:.1f}"

    head = (
        f"{'step':>6} {'mode/reason':<24} {'probe FULL':>10} {'graph':>5} {'in fwd':>6} "
        f"{'eager':>5} {'kernels':>7} {'GPU busy µs':>11} {'idle µs':>9} "
        f"{'fwd GPU µs':>10} {'probe GPU µs':>12} {'graph delay µs':>14} {'eager delay µs':>14} ok"
    )
    lines = [f"alignment: {table.alignment.describe()}", head]
    for r in table.rows:
        mr = f"{r.mode or '-'}/{r.reason or '-'}"
        lines.append(
            f"{r.step:>6} {mr:<24} {r.probe_full_replays + r.probe_piecewise_pieces:>10} "
            f"{r.graph_launches:>5} {r.graph_launches_in_forward:>6} {r.eager_launches:>5} "
            f"{r.kernels:>7} {us(r.gpu_busy_ns):>11} {us(r.gpu_idle_ns):>9} "
            f"{us(r.forward_gpu_ns):>10} {us(r.probe_gpu_busy_ns):>12} "
            f"{us(r.graph_launch_delay_ns):>14} {us(r.eager_launch_delay_median_ns):>14} "
            f"{'yes' if r.launches_agree else 'NO'}"
        )
    t = table.totals
    lines.append(
        f"total: {t['steps']} steps; probe target replays {t['probe_full_replays']} FULL + "
        f"{t['probe_piecewise_pieces']} piecewise; graph launches {t['graph_launches']} "
        f"({t['graph_launches_in_forward']} inside the forward); eager launches "
        f"{t['eager_launches']}; kernels {t['kernels']}; steps agreeing "
        f"{t['steps_agreeing']}/{t['steps']}; launches outside any step "
        f"{table.unattributed_calls}"
    )
    return "\n".join(lines)
