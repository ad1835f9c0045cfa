"""Traps: known ways a configuration keeps steps off FULL graphs, from one function.

:func:`traps` runs every check of :data:`CHECKS` over one process's static snapshot
(``probe.engine.hooks.snapshot.take_snapshot``: a dict of facts taken once per process at attach)
and, where a recording has them, that process's steps. ``probe report`` and ``probe
doctor`` (on a recording or live) and the live view call it, so they print the same traps;
the engine stores only the facts. A check whose facts the snapshot does
not hold (an older recording, a hook that did not see the moment) is **not checked**, and
says why, instead of passing silently. Each check returns findings, ``{"code": ...,
"message": ...}`` dicts. Standard library and the shared declarations only, so the engine
side and the reader side share them.

    from probe.analysis.traps import traps
    got = traps(snapshot)
    for f in got["traps"]:
        print(f["code"], f["message"])
    for f in got["not_checked"]:
        print("not checked:", f["code"], f["message"])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from probe.records import Reason

Finding = dict[str, str]


class NotChecked(Exception):
    """A check cannot run on this snapshot; the message says why."""


# A reorder threshold this many times the decode query length or more counts prefills
# of up to that many tokens as decodes (FlashMLA sparse on Hopper: 256 against 1 + k).
FAR_ABOVE_FACTOR = 4


def _uq(snap: Mapping[str, Any]) -> int:
    return int(snap.get("uniform_decode_query_len") or 1)


def capture_sizes_for_mtp(snap: Mapping[str, Any]) -> list[Finding]:
    """Capture sizes that make MTP decode batches pad or miss.

    A decode batch of ``n`` requests has ``n * (1 + k)`` tokens. A capture size that is
    not a multiple of ``1 + k`` never fits a decode batch exactly (it pads, or under
    V1's FULL keys gets no decode key at all), and a largest size below
    ``max_num_seqs * (1 + k)`` leaves the biggest decode batches without a FULL graph.
    """
    uq = _uq(snap)
    comp = snap.get("compilation") or {}
    if _by_requests(snap):
        return decode_graphs_by_requests(snap)
    sizes = sorted(int(s) for s in comp.get("cudagraph_capture_sizes") or [])
    out: list[Finding] = []
    if uq <= 1 or not sizes:
        return out
    odd = [s for s in sizes if s >= uq and s % uq]  # smaller ones never hold a decode batch
    if odd:
        shown = ", ".join(map(str, odd[:8])) + (", ..." if len(odd) > 8 else "")
        out.append(
            {
                "code": "capture_sizes_not_multiple_of_decode_len",
                "message": f"{len(odd)} of {len(sizes)} capture sizes are not multiples of "
                f"the decode query length {uq} ({shown}): decode batches padded to them "
                "waste tokens",
            }
        )
    largest = int(comp.get("max_cudagraph_capture_size") or sizes[-1])
    mns = snap.get("max_num_seqs")
    if mns and int(mns) * uq > largest:
        fits = largest // uq
        out.append(
            {
                "code": "decode_batches_above_largest_capture_size",
                "message": f"the largest capture size {largest} is below max_num_seqs x "
                f"{uq} = {int(mns) * uq}: decode batches above {fits} requests will not "
                "replay FULL",
            }
        )
    return out


def _by_requests(snap: Mapping[str, Any]) -> bool:
    """Model Runner V2 with decode graphs by request count (vLLM 0.34 on)."""
    comp = snap.get("compilation") or {}
    # only Model Runner V2 reads them, and a release that has them has no other runner
    return comp.get("decode_cudagraph_capture_request_sizes") is not None


def largest_decode_graph(snap: Mapping[str, Any]) -> tuple[int, str] | None:
    """The most requests a uniform decode graph holds (vLLM 0.34 on), and what caps it;
    None where the snapshot is not of such a vLLM or its mode has no FULL decode graphs.

    vLLM captures request counts ``decode_cudagraph_capture_request_sizes`` up to a limit
    of ``max_num_seqs`` requests and ``T // q`` (``T``: ``max_cudagraph_capture_size``
    within ``max_decode_cudagraph_capture_tokens`` and ``max_num_batched_tokens``), the
    first size past the limit captured at the limit. The live table, where the snapshot
    has it (``decode_graphs``), is what the manager built."""
    if not _by_requests(snap):
        return None
    comp = snap.get("compilation") or {}
    if comp.get("cudagraph_mode") not in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"):
        return None
    q = _uq(snap)
    live = (snap.get("decode_graphs") or {}).get(str(q))
    if live:
        return int(max(live)), "the graph manager's decode table"
    sizes = sorted(int(n) for n in comp.get("decode_cudagraph_capture_request_sizes") or ())
    if not sizes:
        return 0, "decode_cudagraph_capture_request_sizes is empty"
    mns = int(snap.get("max_num_seqs") or sizes[-1])
    caps = [
        (int(v), name)
        for name, v in (
            ("max_cudagraph_capture_size", comp.get("max_cudagraph_capture_size")),
            (
                "max_decode_cudagraph_capture_tokens",
                comp.get("max_decode_cudagraph_capture_tokens"),
            ),
            ("max_num_batched_tokens", snap.get("max_num_batched_tokens")),
        )
        if v
    ]
    tokens, token_cap = min(caps) if caps else (mns * q, "")
    limit = min(mns, tokens // q)
    if sizes[-1] < limit:
        return sizes[-1], f"decode_cudagraph_capture_request_sizes ends at {sizes[-1]}"
    if limit < mns:
        return limit, f"{token_cap}={tokens} holds {limit} requests of {q} tokens"
    return limit, "max_num_seqs"


def decode_graphs_by_requests(snap: Mapping[str, Any]) -> list[Finding]:
    """vLLM 0.34 on: uniform decode batches replay FULL graphs keyed by request count,
    captured up to ``max_num_seqs`` unless a size list or token cap stops them earlier;
    a decode batch above the largest one takes a prefill graph (PIECEWISE or none)."""
    got = largest_decode_graph(snap)
    mns = snap.get("max_num_seqs")
    if got is None or not mns:
        return []
    largest, why = got
    if largest >= int(mns):
        return []
    if largest == 0:
        message = (
            f"no FULL decode graphs ({why}): every uniform decode batch takes a prefill "
            "graph (prefill_cudagraph_capture_token_sizes)"
        )
    else:
        message = (
            f"the decode graphs stop at {largest} requests ({why}), below max_num_seqs="
            f"{int(mns)}: decode batches above {largest} requests will not replay FULL "
            "(they take a prefill graph)"
        )
    return [{"code": "decode_batches_above_largest_capture_size", "message": message}]


def ignored_support_setting(snap: Mapping[str, Any]) -> list[Finding]:
    """``_cudagraph_support`` set where vLLM does not read it.

    vLLM asks each builder's ``get_cudagraph_support()``. A class whose method decides
    by itself (the V3.2 indexer) ignores the attribute, and an attribute on the backend
    or impl class is never read at all.
    """
    out: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for g in snap.get("groups", []) or []:
        builder = str(g.get("builder"))
        if g.get("support_set_on_class") and g.get("support_follows_attribute") is False:
            key = ("ignored", builder)
            if key not in seen:
                seen.add(key)
                out.append(
                    {
                        "code": "support_attribute_ignored",
                        "message": f"{builder}._cudagraph_support is "
                        f"{g.get('declared_support')}, but its get_cudagraph_support() "
                        f"ignores it and returns {g.get('support')}: patch the method",
                    }
                )
        for where in g.get("support_on_non_builder", []) or []:
            key = ("elsewhere", str(where))
            if key not in seen:
                seen.add(key)
                out.append(
                    {
                        "code": "support_set_on_backend_not_builder",
                        "message": f"{where}._cudagraph_support is never read: vLLM asks "
                        f"the metadata builder ({builder}, {g.get('support')})",
                    }
                )
    return out


def reorder_threshold_far_above_decode(snap: Mapping[str, Any]) -> list[Finding]:
    """A reorder threshold far above the decode query length: short prefills are
    reordered and built as decodes."""
    uq = _uq(snap)
    out: list[Finding] = []
    seen: set[tuple[str, int]] = set()
    for g in snap.get("groups", []) or []:
        thr = g.get("reorder_batch_threshold")
        if not isinstance(thr, int) or thr < FAR_ABOVE_FACTOR * uq:
            continue
        key = (str(g.get("builder")), thr)
        if key in seen:
            continue
        seen.add(key)
        out.append(
            {
                "code": "reorder_threshold_far_above_decode",
                "message": f"{g.get('builder')} ({g.get('backend')}) reorders requests of up "
                f"to {thr} tokens as decodes, against a decode query length of {uq}: "
                f"prefills of <= {thr} tokens take the decode path",
            }
        )
    return out


def misspelled_support_attribute(snap: Mapping[str, Any]) -> list[Finding]:
    """A builder sets a misspelled attribute (``cudagraph_support``): vLLM never reads
    it, and the builder keeps the support it inherits."""
    out: list[Finding] = []
    for g in snap.get("groups", []) or []:
        for attr in g.get("misspelled", []) or []:
            out.append(
                {
                    "code": "misspelled_support_attribute",
                    "message": f"{attr} is not read by vLLM; the builder's support is "
                    f"{g.get('support')} (set _cudagraph_support or get_cudagraph_support)",
                }
            )
    return out


def one_group_limits_engine(snap: Mapping[str, Any]) -> list[Finding]:
    """One attention group of the target model has a lower support than the others and
    sets the whole engine's graph mode."""
    target = [g for g in snap.get("groups", []) or [] if g.get("role") == "target"]
    values = {g.get("support_value") for g in target if "support_value" in g}
    if snap.get("min_support_value") is None or len(values) <= 1:
        return []
    lim = snap.get("limiting_group") or {}
    return [
        {
            "code": "one_group_limits_engine",
            "message": f"{lim.get('builder')} ({lim.get('backend')}) has "
            f"{snap.get('min_support')}, the lowest of {len(target)} attention groups: "
            "it sets the engine's graph mode",
        }
    ]


def spec_decode_needs_uniform_batch(snap: Mapping[str, Any]) -> list[Finding]:
    """MTP decode batches (query length 1 + k) with a minimum support below
    UNIFORM_BATCH: no FULL decode graph."""
    low = snap.get("min_support_value")
    if _uq(snap) <= 1 or low is None or low >= 2:
        return []
    return [
        {
            "code": "spec_decode_needs_uniform_batch",
            "message": f"decode batches have query length {_uq(snap)} (MTP) but the minimum "
            f"support is {snap.get('min_support')}: FULL decode graphs are unavailable "
            "(needs UNIFORM_BATCH)",
        }
    ]


def mode_downgraded(snap: Mapping[str, Any]) -> list[Finding]:
    """vLLM resolved a lower ``cudagraph_mode`` than the one asked for."""
    res = snap.get("resolve") or {}
    if res.get("requested_mode") == res.get("resolved_mode"):
        return []
    return [
        {
            "code": "mode_downgraded",
            "message": f"cudagraph_mode {res.get('requested_mode')} was resolved to "
            f"{res.get('resolved_mode')} (min support {res.get('min_cg_support')} from "
            f"{res.get('min_cg_attn_backend')})",
        }
    ]


def max_num_batched_tokens_outside_capture_sizes(snap: Mapping[str, Any]) -> list[Finding]:
    """``max_num_batched_tokens`` below the largest capture size but not one of them: a
    full batch pads to the next size up."""
    comp = snap.get("compilation") or {}
    max_size = comp.get("max_cudagraph_capture_size")
    mnbt = snap.get("max_num_batched_tokens")
    sizes = comp.get("cudagraph_capture_sizes") or []
    if max_size and mnbt and sizes and mnbt < max_size and mnbt not in sizes:
        return [
            {
                "code": "max_num_batched_tokens_outside_capture_sizes",
                "message": f"max_num_batched_tokens={mnbt} is not a capture size",
            }
        ]
    return []


def mtp_decodes_split_as_prefills(snap: Mapping[str, Any]) -> list[Finding]:
    """MTP with a builder whose reorder threshold is below 1 + k: a decode of query
    length 1 + k is reordered and built as a prefill (the builder asked for a threshold
    of 1 without counting speculative tokens as decodes, ``supports_spec_as_decode``
    false, or a smaller one outright). A builder with no threshold (None: it does not
    split decodes from prefills by one, e.g. the V3.2 indexer) is not a finding; one that
    asked without counting speculative tokens but for a threshold of 1 + k or more is not
    either (nothing is split wrong)."""
    uq = _uq(snap)
    out: list[Finding] = []
    if uq <= 1:
        return out
    seen: set[tuple[str, str, int]] = set()
    for g in snap.get("groups", []) or []:
        thr = g.get("reorder_batch_threshold")
        if not isinstance(thr, int) or thr >= uq:
            continue
        key = (str(g.get("role")), str(g.get("builder")), thr)
        if key in seen:
            continue
        seen.add(key)
        why = (
            f" (it asked for {g.get('reorder_threshold_requested')} with speculative tokens "
            "not counted as decodes: supports_spec_as_decode false)"
            if g.get("spec_as_decode") is False
            else ""
        )
        out.append(
            {
                "code": "mtp_decodes_split_as_prefills",
                "message": f"{g.get('builder')} ({g.get('backend')}, {g.get('role')}) has "
                f"reorder threshold {thr}, below the decode query length {uq} (1 + k){why}: "
                "MTP decodes are reordered and built as prefills",
            }
        )
    return out


def full_decode_only_eager_mixed_steps(
    snap: Mapping[str, Any], counts: Mapping[tuple[str, str], int] | None
) -> list[Finding]:
    """FULL_DECODE_ONLY where steps mix a prefill chunk with decodes: they run eager (the
    mode has no graph for mixed batches). Fires on the snapshot's chunked prefill, or on
    the recording's own eager mixed steps (``mixed_batch_in_full_decode_only``, counted in
    ``counts``: steps by (mode, miss reason)); not checked where the snapshot does not say
    whether chunked prefill is on and no counts are given."""
    comp = snap.get("compilation") or {}
    if comp.get("cudagraph_mode") != "FULL_DECODE_ONLY":
        return []
    chunked = snap.get("chunked_prefill")
    eager = None
    if counts is not None:
        eager = int(counts.get(("none", Reason.MIXED_BATCH_IN_FULL_DECODE_ONLY.label), 0))
    if chunked is None and eager is None:
        raise NotChecked(
            "the snapshot does not record whether chunked prefill is on (taken before the "
            "probe kept it), and no steps were given to count eager mixed steps"
        )
    if not chunked and not eager:
        return []
    because = "with chunked prefill" if chunked else "with mixed prefill/decode batches"
    seen = f": {eager} eager mixed steps in this recording" if eager else ""
    return [
        {
            "code": "full_decode_only_with_chunked_prefill",
            "message": f"cudagraph_mode FULL_DECODE_ONLY {because}: every step that mixes "
            "a prefill chunk with decodes runs eager (FULL_AND_PIECEWISE gives them "
            f"piecewise graphs){seen}",
        }
    ]


@dataclass(frozen=True)
class Check:
    """One check: its function, the code it is known by, and the snapshot facts it needs
    (``a.b``: key ``b`` of mapping ``a``; ``groups[].x``: key ``x`` on at least one
    attention group). ``steps``: the function also takes the process's steps (or None)."""

    fn: Callable[..., list[Finding]]
    code: str
    needs: tuple[str, ...] = ()
    steps: bool = False


CHECKS: tuple[Check, ...] = (
    Check(misspelled_support_attribute, "misspelled_support_attribute", ("groups[].misspelled",)),
    Check(
        one_group_limits_engine,
        "one_group_limits_engine",
        ("min_support_value", "groups[].support_value"),
    ),
    Check(
        spec_decode_needs_uniform_batch,
        "spec_decode_needs_uniform_batch",
        ("uniform_decode_query_len", "min_support_value"),
    ),
    Check(mode_downgraded, "mode_downgraded", ("resolve.requested_mode", "resolve.resolved_mode")),
    Check(
        max_num_batched_tokens_outside_capture_sizes,
        "max_num_batched_tokens_outside_capture_sizes",
        (
            "max_num_batched_tokens",
            "compilation.cudagraph_capture_sizes",
            "compilation.max_cudagraph_capture_size",
        ),
    ),
    Check(
        capture_sizes_for_mtp,
        "capture_sizes_for_mtp",
        ("uniform_decode_query_len", "compilation.cudagraph_capture_sizes", "max_num_seqs"),
    ),
    Check(
        ignored_support_setting,
        "support_attribute_ignored",
        ("groups[].support_follows_attribute", "groups[].support_on_non_builder"),
    ),
    Check(
        reorder_threshold_far_above_decode,
        "reorder_threshold_far_above_decode",
        ("uniform_decode_query_len", "groups[].reorder_batch_threshold"),
    ),
    Check(
        mtp_decodes_split_as_prefills,
        "mtp_decodes_split_as_prefills",
        ("uniform_decode_query_len", "groups[].reorder_batch_threshold"),
    ),
    Check(
        full_decode_only_eager_mixed_steps,
        "full_decode_only_with_chunked_prefill",
        ("compilation.cudagraph_mode",),
        steps=True,
    ),
)


def _missing(snap: Mapping[str, Any], need: str) -> bool:
    if need.startswith("groups[]."):
        key = need.removeprefix("groups[].")
        return not any(key in g for g in snap.get("groups", []) or [])
    cur: Any = snap
    for part in need.split("."):
        if not isinstance(cur, Mapping) or cur.get(part) is None:
            return True
        cur = cur[part]
    return False


def _fact(need: str) -> str:
    if need.startswith("groups[]."):
        return f"{need.removeprefix('groups[].')} on any attention group"
    return need


def traps(
    snap: Mapping[str, Any],
    steps: Iterable[Any] | None = None,
    counts: Mapping[tuple[str, str], int] | None = None,
) -> dict[str, list[Finding]]:
    """Every check of :data:`CHECKS` over one process's snapshot (and, where a recording
    has them, its steps by (mode, miss reason): ``counts``, as the one summary gives them,
    or counted here from ``steps``): ``{"traps": [...], "not_checked": [...]}``, each a
    list of ``{"code", "message"}`` in the order of :data:`CHECKS`; a not-checked entry's
    code is the check's and its message says why."""
    rows = counts
    if rows is None and steps is not None:
        rows = step_counts(steps)
    found: list[Finding] = []
    skipped: list[Finding] = []
    for c in CHECKS:
        try:
            absent = [_fact(n) for n in c.needs if _missing(snap, n)]
        except (TypeError, AttributeError) as exc:  # a snapshot of the wrong shape
            skipped.append({"code": c.code, "message": f"the snapshot is malformed ({exc})"})
            continue
        if absent:
            skipped.append(
                {
                    "code": c.code,
                    "message": f"the snapshot has no {', '.join(absent)} (taken by a probe "
                    "that did not record it, or before the moment it is read)",
                }
            )
            continue
        try:
            found += c.fn(snap, rows) if c.steps else c.fn(snap)
        except NotChecked as exc:
            skipped.append({"code": c.code, "message": str(exc)})
        except (TypeError, AttributeError, ValueError, KeyError) as exc:
            skipped.append(
                {"code": c.code, "message": f"the snapshot is malformed ({type(exc).__name__})"}
            )
    return {"traps": found, "not_checked": skipped}


def step_counts(steps: Iterable[Any]) -> dict[tuple[str, str], int]:
    """Steps by (mode, miss reason), named as the summary names them (``none`` for a step
    with no mode)."""
    out: dict[tuple[str, str], int] = {}
    for s in steps:
        key = (
            s.mode.name.lower() if s.mode is not None else "none",
            s.reason.label if s.reason is not None else "unknown",
        )
        out[key] = out.get(key, 0) + 1
    return out


def findings(snap: Mapping[str, Any]) -> list[Finding]:
    """The traps :func:`traps` finds on the snapshot alone."""
    return traps(snap)["traps"]


def over_processes(
    procs: Iterable[tuple[Mapping[str, Any], Mapping[tuple[str, str], int] | None]],
) -> dict[str, list[Finding]]:
    """:func:`traps` of several processes (snapshot, steps by (mode, miss reason)), each
    finding once, in order: what ``probe report`` shows for a whole recording."""
    out: dict[str, list[Finding]] = {"traps": [], "not_checked": []}
    for snap, counts in procs:
        for kind, rows in traps(snap, counts=counts).items():
            out[kind] += [f for f in rows if f not in out[kind]]
    return out
