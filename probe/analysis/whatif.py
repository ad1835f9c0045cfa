"""What-if: a recording's batch shapes replayed through the installed vLLM's own graph dispatch.

Each recorded forward step of the target model is one batch shape (tokens, requests,
longest query, uniform decode or not). :func:`whatif` builds, from the recording's static
snapshot, the engine's graph settings (the requested ``cudagraph_mode``, capture sizes,
``max_num_seqs``, each attention group's graph support, 1 + k), changes the ones a
:class:`Setting` names, and hands them to vLLM's own code:

1. ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` on a real ``VllmConfig``, with
   the minimum support over the attention groups (V1: every group, as
   ``_check_and_update_cudagraph_mode`` takes them; MRV2: the target model's groups, as
   ``init_attn_backend`` does): the resolved mode and, on V1 with FULL decode graphs and
   MTP, the capture sizes rounded to multiples of 1 + k;
2. the runner's real dispatcher built from that mode: V1's ``CudagraphDispatcher`` with
   ``initialize_cudagraph_keys``; MRV2's ``ModelCudaGraphManager`` (its own ``__init__``
   and ``_init_candidates``, on ``device="cpu"``, inside a one-rank gloo group it needs
   for ``get_pp_group()``; the graphs are marked captured, as ``capture()`` ends);
3. its ``dispatch`` for every recorded shape, and the miss reason from
   :mod:`probe.reasons`, as the probe's hooks compute it in a live engine.

Steps whose reason is not decided by the batch shape (``warmup_or_profile``,
``forced_eager``, ``cascade_attention``, ``lora_mismatch``) keep their recorded mode and
reason (:data:`KEPT`). Every derived number comes from :mod:`probe.analysis.views` over the
replayed :class:`~probe.step.Step` objects. Nothing here imports vLLM at import time.

The capture sizes suggested for the recorded shapes come from
:func:`probe.analysis.capture_sizes.suggest_capture_sizes`, checked by a replay of their own.

    >>> from probe.analysis.whatif import Setting
    >>> Setting(support=(("FlashMLASparseMetadataBuilder", "UNIFORM_SINGLE_TOKEN_DECODE"),)).label
    '--support FlashMLASparseMetadataBuilder=UNIFORM_SINGLE_TOKEN_DECODE'
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from probe.analysis import costmodel
from probe.analysis import views as analysis
from probe.analysis.capture_sizes import padding_of, suggest_capture_sizes
from probe.analysis.whatif_settings import (
    KEPT,
    Applied,
    Engine,
    Setting,
    VllmError,
    WhatIfError,
    apply,
    parse_sizes,
    parse_support,
)
from probe.analysis.whatif_vllm import (
    Graphs,
    Vllm,
    build,
    has_module,
    has_split_sizes,
    load_vllm,
    mrv2_context,
    one_line,
    select_platform,
)
from probe.progress import SILENT, Progress
from probe.reasons import SUPPORT_NAMES
from probe.records import Mode, Reason
from probe.step import Step, new_step

__all__ = [
    "KEPT",
    "Engine",
    "Replayer",
    "Setting",
    "Vllm",
    "VllmError",
    "WhatIfError",
    "has_module",
    "has_split_sizes",
    "load_vllm",
    "parse_sizes",
    "parse_support",
    "select_platform",
    "whatif",
]


# -- input ------------------------------------------------------------------------------------


# -- vLLM --------------------------------------------------------------------------------------


# -- the replay ------------------------------------------------------------------------------------


def _key(s: Step) -> str:
    return f"{s.mode.name.lower() if s.mode is not None else 'none'} {_label(s.reason)}"


def _label(r: Reason | None) -> str:
    return r.label if r is not None else "unknown"


def summary(steps: Sequence[Step]) -> dict[str, Any]:
    """The numbers each column shows, from :mod:`probe.analysis.views`."""
    rates = analysis.hit_rates(steps)
    return {
        "steps": rates["steps"],
        "full_share": rates["full_hit_rate"],
        "graph_share": rates["graph_rate"],
        "decode_full_share": rates["decode_full_hit_rate"],
        "padding_waste": rates["padding_waste"],
        "padded_tokens": rates["padded_tokens"],
        "real_tokens": rates["real_tokens"],
        "reasons": dict(Counter(_key(s) for s in steps).most_common()),
    }


def _changes(before: Sequence[Step], after: Sequence[Step]) -> list[dict[str, Any]]:
    moved = Counter(
        (_key(a), _key(b)) for a, b in zip(before, after, strict=True) if _key(a) != _key(b)
    )
    return [{"from": a, "to": b, "steps": n} for (a, b), n in moved.most_common()]


def _column(
    name: str, setting: str, graphs: Mapping[int, Graphs], steps: list[Step]
) -> dict[str, Any]:
    g = next(iter(graphs.values()))
    return {
        "column": name,
        "setting": setting,
        "resolved_mode": g.resolved_mode,
        "capture_sizes": list(g.capture_sizes),
        "max_capture_size": g.max_capture_size,
        "vllm_messages": sorted({m for x in graphs.values() for m in x.messages}),
        **summary(steps),
    }


class Replayer:
    """A recording's forward steps with a batch shape, and each rank's :class:`Engine`.

    Raises :class:`WhatIfError` for steps with no shape or no snapshot. Use
    :meth:`session` around :meth:`graphs` and :meth:`replay`::

        r = Replayer(rec.iter_steps(), snapshots)
        with r.session(load_vllm()):
            steps = r.replay(r.graphs(r.applied(Setting(mode="PIECEWISE"))))
    """

    def __init__(self, steps: Iterable[Step], snapshots: Mapping[int, Mapping[str, Any]]) -> None:
        self.steps = [s for s in analysis.forward_steps(steps) if s.num_tokens > 0]
        if not self.steps:
            raise WhatIfError("no forward step with a batch shape to replay")
        self.engines: dict[int, Engine] = {}
        for pid in sorted({s.pid for s in self.steps}):
            snap = snapshots.get(pid)
            if not snap:
                raise WhatIfError(f"pid {pid} has steps but no static snapshot")
            self.engines[pid] = Engine.of(snap, f"pid {pid}")
        self.vl: Vllm | None = None
        self._cache: dict[tuple[Engine, Applied], Graphs] = {}

    def applied(self, setting: Setting) -> dict[int, Applied]:
        return {pid: apply(e, setting) for pid, e in self.engines.items()}

    @contextlib.contextmanager
    def session(self, vl: Vllm) -> Iterator[None]:
        """vLLM's log lines to stderr, and what MRV2's manager needs (:func:`mrv2_context`)."""
        mrv2 = any(e.runner == "mrv2" for e in self.engines.values())
        with (
            contextlib.redirect_stdout(sys.stderr),
            mrv2_context(vl) if mrv2 else contextlib.nullcontext(),
        ):
            self.vl = vl
            try:
                yield
            finally:
                self.vl = None
                self._cache.clear()

    def graphs(self, applied: Mapping[int, Applied]) -> dict[int, Graphs]:
        if self.vl is None:
            raise RuntimeError("Replayer.graphs outside Replayer.session")
        out = {}
        for pid, e in self.engines.items():
            key = (e, applied[pid])
            if key not in self._cache:
                try:
                    self._cache[key] = build(self.vl, e, applied[pid])
                except (WhatIfError, VllmError):
                    raise
                except Exception as exc:  # vLLM's own code failed on these settings
                    raise VllmError(
                        f"vLLM {self.vl.version} could not build the {e.runner} dispatcher "
                        f"for these settings: {one_line(exc)}"
                    ) from None
            out[pid] = self._cache[key]
        return out

    def replay(self, graphs: Mapping[int, Graphs]) -> list[Step]:
        """The steps as these graphs would dispatch them (:data:`KEPT` ones as recorded)."""
        out = []
        for s in self.steps:
            if s.reason in KEPT:
                out.append(s)
                continue
            got = graphs[s.pid](s)
            if got == (s.mode, s.reason, s.padded_tokens, s.padded_reqs):
                out.append(s)  # dispatched as recorded: the step itself, not a copy
                continue
            mode, reason, padded, padded_reqs = got
            # dataclasses.replace without __init__'s setattr per field (new_step)
            out.append(
                new_step(
                    **{
                        **s.__dict__,
                        "mode": mode,
                        "reason": reason,
                        "padded_tokens": padded,
                        "padded_reqs": padded_reqs,
                    }
                )
            )
        return out


def whatif(
    steps: Iterable[Step],
    snapshots: Mapping[int, Mapping[str, Any]],
    setting: Setting,
    *,
    suggest_count: int | None = None,
    vl: Vllm | None = None,
    costs_from: costmodel.Costs | None = None,
    progress: Progress = SILENT,
) -> dict[str, Any]:
    """Replay ``steps`` (a recording's) under its own settings and under ``setting``.

    ``snapshots``: each pid's static snapshot. Returns plain data: the recorded and the
    replayed columns (:func:`summary` each), the per-step reproduction check of the
    recording's own settings, the what-if's changes against the recording, and the
    suggested capture sizes. Each column's ``worth`` is its steady host time per step and
    CPU launch overhead, predicted by :mod:`probe.analysis.costmodel` from the costs measured in
    the recording (then in ``costs_from``, another recording's; the recorded column:
    measured). Raises :class:`WhatIfError` for input it cannot use (before vLLM is
    imported) and :class:`VllmError` when vLLM is not importable. ``progress`` hears each
    stage: loading vLLM (seconds: most of the command's time), then each replay.
    """
    steps = list(steps)
    r = Replayer(steps, snapshots)
    fw, engines = r.steps, r.engines
    own_a, target_a = r.applied(Setting()), r.applied(setting)
    first = next(iter(engines.values()))
    if vl is None:
        progress.stage("loading the installed vLLM", None, "")
        vl = load_vllm()
    r_platform = vl.platform
    gone = settings_not_in(vl, engines.values())
    with r.session(vl):
        progress.stage("replaying the recording's own settings", len(fw))
        own = r.graphs(own_a)
        own_steps = r.replay(own)
        progress.advance(len(fw))
        columns = [
            {
                "column": "recorded",
                "setting": "as recorded",
                "resolved_mode": first.resolved_mode,
                "capture_sizes": list(first.capture_sizes),
                "max_capture_size": first.max_capture_size,
                "vllm_messages": [],
                **summary(fw),
            },
            _column("replay", "the recording's settings", own, own_steps),
        ]
        replayed = {"recorded": fw, "replay": own_steps}
        target, target_steps = own, own_steps
        if not setting.empty:
            progress.stage(f"replaying the what-if ({setting.label})", len(fw))
            target = r.graphs(target_a)
            target_steps = r.replay(target)
            progress.advance(len(fw))
            columns.append(_column("what-if", setting.label, target, target_steps))
            replayed["what-if"] = target_steps
        on = "what-if" if not setting.empty else "recorded"
        suggestion = _suggest(engines, target, target_steps, suggest_count, on)
        if suggestion.get("sizes"):
            sizes = tuple(suggestion["sizes"])
            split = suggestion.get("split")
            sized = {
                p: (
                    replace(a, split=_with(a.split, split), legacy=False)
                    if split
                    else replace(a, capture_sizes=sizes, max_capture_size=sizes[-1])
                )
                for p, a in (target_a if not setting.empty else own_a).items()
            }
            progress.stage("checking the suggested capture sizes", len(fw))
            got = r.graphs(sized)
            sug_steps = r.replay(got)
            progress.advance(len(fw))
            col = _column("suggested", "suggested capture sizes", got, sug_steps)
            base = columns[-1]
            suggestion["verified"] = (
                col["padded_tokens"] - col["real_tokens"]
                <= base["padded_tokens"] - base["real_tokens"]
                and _count(sug_steps, Mode.FULL) >= _count(target_steps, Mode.FULL)
                and sum(s.graph for s in sug_steps) >= sum(s.graph for s in target_steps)
            )
            if suggestion["verified"]:
                columns.append(col)
                replayed["suggested"] = sug_steps
    pairs = list(zip(fw, own_steps, strict=True))
    same = [(a, b) for a, b in pairs if (a.mode, a.reason) == (b.mode, b.reason)]
    mismatched = [
        {"pid": a.pid, "step": a.step, "recorded": _key(a), "replayed": _key(b),
         "num_tokens": a.num_tokens, "num_reqs": a.num_reqs, "max_query_len": a.max_query_len,
         "uniform": a.uniform}
        for a, b in pairs
        if (a.mode, a.reason) != (b.mode, b.reason)
    ]  # fmt: skip
    sources = _worth(steps, columns, replayed, costs_from)
    return {
        "vllm_installed": next(iter(own.values())).vllm_version,
        "vllm_platform": r_platform,
        "not_in_installed_vllm": gone,
        "vllm_recorded": sorted({e.vllm_version for e in engines.values()}),
        "runner": sorted({e.runner for e in engines.values()}),
        "ranks": len(engines),
        "requested_mode": first.requested_mode,
        "what_if_requested_mode": next(iter(target_a.values())).requested_mode,
        "min_support": {
            "recorded": SUPPORT_NAMES[first.min_support],
            "what_if": SUPPORT_NAMES[next(iter(target_a.values())).min_support],
        },
        "kept_as_recorded": sum(1 for s in fw if s.reason in KEPT),
        "reproduction": {
            "steps": len(fw),
            "mode_and_reason_match": len(same),
            "padding_match": sum(
                (a.padded_tokens, a.padded_reqs) == (b.padded_tokens, b.padded_reqs)
                for a, b in same
            ),
            "mismatches": mismatched[:10],
        },
        "columns": columns,
        "changes": _changes(fw, target_steps) if not setting.empty else [],
        "suggestion": suggestion,
        "costs": sources,
    }


def _worth(
    steps: Sequence[Step],
    columns: list[dict[str, Any]],
    replayed: Mapping[str, Sequence[Step]],
    costs_from: costmodel.Costs | None,
) -> list[dict[str, Any]]:
    """Each column's ``worth`` (see :func:`whatif`); returns the cost sources used."""
    keys = costmodel.steady_keys(steps)
    line = costmodel.timeline(steps)
    own = costmodel.Costs.of(steps, "the recording", keys, line)
    costs = [own] if costs_from is None else [own, costs_from]
    was = replayed["recorded"]
    base = costmodel.measured(was, keys, line, own)
    for c in columns:
        if c["column"] == "recorded":
            w = {**base, "measured": True, "priced": {}, "no_cost": []}
        else:
            got = costmodel.predict(replayed[c["column"]], keys, costs, was, line)
            w = {**got, "measured": False}
        for k in ("host_ns_per_step", "cpu_launch_overhead_ns", "tokens_per_s"):
            a, b = base[k], w[k]
            w[f"{k}_vs_recorded"] = b / a if a and b is not None else None
        c["worth"] = w
    return [
        {"source": c.source, "shapes": c.shapes, "between_steps_ns": c.between_ns} for c in costs
    ]


def _with(
    split: Iterable[tuple[str, Any]], lists: Mapping[str, Sequence[int]]
) -> tuple[tuple[str, Any], ...]:
    """``split`` with these size lists (and each list's cap dropped: the sizes set it)."""
    caps = {
        "prefill_cudagraph_capture_token_sizes": "max_prefill_cudagraph_capture_tokens",
        "decode_cudagraph_capture_request_sizes": "max_decode_cudagraph_capture_requests",
    }
    out = {k: v for k, v in split if k not in {caps[n] for n in lists}}
    out.update({k: tuple(v) for k, v in lists.items()})
    return tuple(sorted(out.items()))


def settings_not_in(vl: Vllm, engines: Iterable[Engine]) -> list[dict[str, str]]:
    """The recorded settings the installed vLLM no longer has (or took over otherwise),
    each with what the replay does about it; read off the installed vLLM's classes."""
    fields = getattr(vl.config.CompilationConfig, "__dataclass_fields__", None) or {}
    split = has_split_sizes(vl)
    out: dict[str, str] = {}
    for e in engines:
        if e.runner == "v1" and not has_module("vllm.v1.worker.gpu_model_runner"):
            out["the classic model runner (V1)"] = (
                f"vLLM {vl.version} has Model Runner V2 only: a V1 recording does not replay"
            )
        for name in e.settings:
            if name == "breakable_cudagraph":
                if "use_breakable_cudagraph" in fields:
                    out["VLLM_USE_BREAKABLE_CUDAGRAPH"] = (
                        f"vLLM {vl.version} keeps breakable graphs in "
                        "compilation_config.use_breakable_cudagraph (the variable, where "
                        "set, still decides it)"
                    )
                continue
            if name not in fields:
                out[f"compilation_config.{name}"] = (
                    f"not in vLLM {vl.version}: the replay goes without it"
                )
        if split and not e.split and e.runner == "mrv2":
            out["compilation_config.cudagraph_capture_sizes"] = (
                f"deprecated for Model Runner V2 in vLLM {vl.version}, which sizes prefill "
                "graphs by prefill_cudagraph_capture_token_sizes and decode graphs by "
                "decode_cudagraph_capture_request_sizes: the replay derives both from the "
                "recorded sizes, as vLLM does"
            )
    return [{"setting": k, "note": v} for k, v in out.items()]


def _count(steps: Iterable[Step], mode: Mode) -> int:
    return sum(1 for s in steps if s.mode == mode)


def _suggest(
    engines: Mapping[int, Engine],
    graphs: Mapping[int, Graphs],
    steps: Sequence[Step],
    limit: int | None,
    on: str,
) -> dict[str, Any]:
    """Capture sizes for the graph-dispatched, shape-decided steps of one column."""
    g = next(iter(graphs.values()))
    e = next(iter(engines.values()))
    if len({(x.capture_sizes, x.max_capture_size, x.split) for x in graphs.values()}) > 1:
        return {"sizes": None, "why": "the ranks have different capture sizes"}
    if g.split and e.runner == "mrv2":
        return _suggest_split(e, g, steps, limit, on)
    tokens = Counter(s.num_tokens for s in steps if s.graph and s.reason not in KEPT)
    limit = limit or len(g.capture_sizes)
    if not tokens or not g.capture_sizes:
        return {"sizes": None, "limit": limit, "why": "no step was graph-dispatched"}
    # V1 rounds every size to 1 + k when FULL decode graphs run with MTP
    rounds = e.runner == "v1" and g.resolved_mode in (
        "FULL",
        "FULL_DECODE_ONLY",
        "FULL_AND_PIECEWISE",
    )
    multiple = e.uq if rounds and e.uq > 1 else 1
    sizes = suggest_capture_sizes(tokens, g.max_capture_size, limit, multiple)
    return {
        "sizes": list(sizes),
        "limit": limit,
        "largest": g.max_capture_size,
        "multiple_of": multiple,
        "padding_tokens": padding_of(tokens, sizes),
        "padding_tokens_now": padding_of(tokens, g.capture_sizes),
        "settings": on,
    }


def _suggest_split(
    e: Engine, g: Graphs, steps: Sequence[Step], limit: int | None, on: str
) -> dict[str, Any]:
    """Model Runner V2 with split graph sizes (vLLM 0.34 on): uniform decode batches
    replay graphs keyed by request count (``decode_cudagraph_capture_request_sizes``,
    padding whole requests) when the mode has a separate decode routine; every other
    batch pads to ``prefill_cudagraph_capture_token_sizes``. Each list is suggested for
    its own batches, keeping its largest size."""
    split = dict(g.split)
    prefill_now = sorted(split.get("prefill_cudagraph_capture_token_sizes") or ())
    decode_now = sorted(split.get("decode_cudagraph_capture_request_sizes") or ())
    separate = g.resolved_mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    shaped = [s for s in steps if s.graph and s.reason not in KEPT]
    decode = [s for s in shaped if separate and s.uniform and s.num_reqs <= (decode_now or [0])[-1]]
    tokens = Counter(s.num_tokens for s in shaped if s not in decode)
    reqs = Counter(s.num_reqs for s in decode)
    lists: dict[str, list[int]] = {}
    now = 0
    padding = 0
    if tokens and prefill_now:
        n = limit or len(prefill_now)
        got = suggest_capture_sizes(tokens, prefill_now[-1], n)
        lists["prefill_cudagraph_capture_token_sizes"] = list(got)
        padding += padding_of(tokens, got)
        now += padding_of(tokens, prefill_now)
    if reqs and decode_now:
        n = limit or len(decode_now)
        got = suggest_capture_sizes(reqs, decode_now[-1], n)
        lists["decode_cudagraph_capture_request_sizes"] = list(got)
        padding += e.uq * padding_of(reqs, got)
        now += e.uq * padding_of(reqs, decode_now)
    if not lists:
        return {"sizes": None, "limit": limit, "why": "no step was graph-dispatched"}
    union = sorted(
        set(lists.get("prefill_cudagraph_capture_token_sizes", prefill_now))
        | {n * e.uq for n in lists.get("decode_cudagraph_capture_request_sizes", ())}
    )
    return {
        "sizes": union,
        "split": lists,
        "limit": limit or max(len(prefill_now), len(decode_now)),
        "largest": g.max_capture_size,
        "multiple_of": 1,
        "padding_tokens": padding,
        "padding_tokens_now": now,
        "settings": on,
    }
