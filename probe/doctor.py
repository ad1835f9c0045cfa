"""The doctor's checks: known ways a configuration keeps steps off FULL graphs.

Plain functions over the static snapshot (``probe.hooks.snapshot.take_snapshot``: a dict
of facts taken once per process at attach). Each returns findings, ``{"code": ...,
"message": ...}`` dicts; :func:`findings` runs them all. Standard library only, so the
engine side (where the snapshot is taken) and the reader side (``probe doctor`` on a
recording) share them.

    from probe.doctor import findings
    for f in findings(snapshot):
        print(f["code"], f["message"])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Finding = dict[str, str]

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


def full_decode_only_with_chunked_prefill(snap: Mapping[str, Any]) -> list[Finding]:
    """FULL_DECODE_ONLY with chunked prefill: every step that mixes a prefill chunk with
    decodes runs eager (the mode has no graph for mixed batches)."""
    comp = snap.get("compilation") or {}
    if comp.get("cudagraph_mode") != "FULL_DECODE_ONLY" or not snap.get("chunked_prefill"):
        return []
    return [
        {
            "code": "full_decode_only_with_chunked_prefill",
            "message": "cudagraph_mode FULL_DECODE_ONLY with chunked prefill: every step "
            "that mixes a prefill chunk with decodes runs eager (FULL_AND_PIECEWISE gives "
            "them piecewise graphs)",
        }
    ]


CHECKS: tuple[Callable[[Mapping[str, Any]], list[Finding]], ...] = (
    capture_sizes_for_mtp,
    ignored_support_setting,
    reorder_threshold_far_above_decode,
    full_decode_only_with_chunked_prefill,
)


def findings(snap: Mapping[str, Any]) -> list[Finding]:
    """Every check's findings, in the order of :data:`CHECKS`."""
    return [f for check in CHECKS for f in check(snap)]
