"""Batch reorder decisions.

Supports vLLM 0.26 to 0.34 (0.34: Model Runner V2 only; the V1 target is not in it).

- V1: ``GPUModelRunner._may_reorder_batch`` calls ``reorder_batch_to_split_decodes_and_
  prefills`` with the runner's ``reorder_batch_threshold`` (the minimum over the
  builders; the sparse-MLA builders raise it to 1 + k when spec tokens count as decodes).
  The hook records the threshold, how many requests are decodes under it, and whether
  the order changed (request ids diffed before and after).
- MRV2 ignores the threshold: ``sort_batch_req_ids`` (module level in the runner, called
  by name) orders verify/decode requests first; the hook records the same facts with the
  decode query length as the threshold.

One REORDER record per decision; its t0/t1 are the step's reorder phase. On the compiled
path (:mod:`probe.engine.accel`) both hooks record in C; any input the C code does not read
(not an exact dict, list, str id or int, an error) goes to the Python ``record``, so the
records and the faults are the same on both paths.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from operator import eq, ge
from typing import Any

from probe.engine import accel
from probe.engine.hooks._base import Family, Hook, Target, timed
from probe.engine.runtime import BOOTTIME, RT
from probe.records import Flag

_clock = time.clock_gettime_ns
_OUTSIDE = int(Flag.OUTSIDE_STEP)
_MRV2 = int(Flag.MRV2)


def _moved(before: Any, after: Any) -> int:
    """Positions whose request changed."""
    return sum(1 for x, y in zip(before, after, strict=False) if x != y)


def v1_may_reorder(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    def record(
        before: list[Any], t0: int, t1: int, /, self: Any, scheduler_output: Any, *a: Any, **k: Any
    ) -> None:
        try:
            after = self.input_batch.req_ids
            # the common case (nothing moved) is one C-level list comparison
            moved = 0 if before == after else _moved(before, after)
            thr = self.reorder_batch_threshold
            uq = getattr(self, "uniform_decode_query_len", 1)
            counts = scheduler_output.num_scheduled_tokens.values()
            if thr is None:
                nd = ndt = 0
            else:
                dec = list(filter(partial(ge, thr), counts))  # C-level, O(requests)
                nd, ndt = len(dec), sum(dec)
            f = 0 if RT.in_step else _OUTSIDE
            RT.put.reorder(
                RT.step,
                moved > 0,
                f,
                t0,
                t1,
                -1 if thr is None else thr,
                len(before),
                nd,
                ndt,
                moved,
                bool(thr is not None and uq > 1 and thr >= uq),  # numpy ints give numpy bools
            )
        except Exception as exc:
            hook.fail(exc)

    def _may_reorder_batch(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if not RT.enabled:
            return orig(self, scheduler_output, *args, **kwargs)
        try:
            before = list(self.input_batch.req_ids)
        except Exception as exc:
            hook.fail(exc)
            return orig(self, scheduler_output, *args, **kwargs)
        t0 = _clock(BOOTTIME)
        try:
            return orig(self, scheduler_output, *args, **kwargs)
        finally:
            t1 = _clock(BOOTTIME)
            record(before, t0, t1, self, scheduler_output, *args, **kwargs)

    # exact lists, dicts, str ids and ints are recorded in C; everything else by ``record``
    compiled = accel.reorder_hook(orig, record, _may_reorder_batch, RT, 0)
    return compiled if compiled is not None else _may_reorder_batch


def mrv2_sort(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
    def record(
        result: Any, t0: int, t1: int, num_tokens_per_req: Any, /, *a: Any, **k: Any
    ) -> None:
        try:
            dql = k["decode_query_len"] if "decode_query_len" in k else a[-1] if a else 1
            before = list(num_tokens_per_req)
            moved = 0 if before == result else _moved(before, result)
            dec = list(filter(partial(eq, dql), num_tokens_per_req.values()))
            f = _MRV2 | (0 if RT.in_step else _OUTSIDE)
            RT.put.reorder(
                RT.step,
                moved > 0,
                f,
                t0,
                t1,
                dql,
                len(before),
                len(dec),
                sum(dec),
                moved,
                bool(dql > 1),
            )
        except Exception as exc:
            hook.fail(exc)

    sort_batch_req_ids = timed(orig, record)

    compiled = accel.reorder_hook(orig, record, sort_batch_req_ids, RT, 1)
    return compiled if compiled is not None else sort_batch_req_ids


TARGETS: tuple[Target, ...] = (
    Target(
        "reorder.v1",
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        "_may_reorder_batch",
        v1_may_reorder,
        gate="on",
    ),
    Target(
        "reorder.mrv2",
        "vllm.v1.worker.gpu.model_runner",
        "",
        "sort_batch_req_ids",
        mrv2_sort,
        gate="on",
    ),
)

FAMILY = Family("reorder", "0.26-0.34", TARGETS)
TARGETS = FAMILY.targets  # each marked with its family
