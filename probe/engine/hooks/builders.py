"""Attention-metadata builds: which builder, how long, what split it made.

Supports vLLM 0.26 to 0.34 and any ``AttentionMetadataBuilder`` subclass: the sparse-MLA
builders (ROCm aiter, FlashMLA sparse, FlashAttn/FlashInfer MLA sparse), the V3.2
indexer, and every other backend. Builder classes are imported lazily by vLLM, so these
targets are resolved late: on the first enabled step, every loaded subclass that defines
``build``, ``build_for_cudagraph_capture`` or ``build_for_drafting`` in its own class
body is wrapped. Nested calls (``FlashMLASparseMetadataBuilder.build`` calling
``super().build``, ``build_for_drafting`` calling ``build``) record once, at the outermost
call, under the class of the instance and the tag of that outer method.

The split (num decodes/prefills and their tokens) is read off the returned metadata, which
is what the builder itself decided. Builders whose metadata carries none (0.26's ROCm
sparse builder) record -1; the reorder record still carries the runner's split.

Inside vLLM the hook reads plain attributes only, no tensor: the real (unpadded) token
and request counts, and the prefill tokens a builder leaves out, are derived by the
reader from the step's dispatch (:func:`probe.reader.assemble.fill_builds`).

Host syncs inside a step (``torch.cuda.Stream.synchronize``, ``torch.cuda.synchronize``:
e.g. the ROCm sparse builder's stream synchronize when its metadata key changes) are
recorded as SYNC_STALL spans, which the reader attributes to the enclosing build.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from probe.engine import accel
from probe.engine.hooks import step
from probe.engine.hooks._base import Family, Hook, Target
from probe.engine.runtime import BOOTTIME, RT
from probe.records import BuildTag, Flag, Phase

_clock = time.clock_gettime_ns
_OUTSIDE = int(Flag.OUTSIDE_STEP)
_DRAFTER = int(Flag.DRAFTER)

BUILDER_BASE = ("vllm.v1.attention.backend", "AttentionMetadataBuilder")
METHODS = {
    "build": BuildTag.STEP,
    "build_for_cudagraph_capture": BuildTag.CAPTURE,
    "build_for_drafting": BuildTag.DRAFTING,
}


def _split(md: Any) -> tuple[int, int, int, int]:
    """(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens), -1 = unknown."""
    nd = getattr(md, "num_decodes", None)
    if nd is None:
        return -1, -1, -1, -1
    npf = getattr(md, "num_prefills", 0)
    ndt = getattr(md, "num_decode_tokens", 0)
    npt = getattr(md, "num_prefill_tokens", None)
    return nd, npf, ndt, npt if npt is not None else -1


def build(tag: BuildTag) -> Callable[[Callable[..., Any], Hook], Any]:
    tag_v = int(tag)

    def factory(orig: Callable[..., Any], hook: Hook) -> Callable[..., Any]:
        def record(md: Any, t0: int, t1: int, self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                cm: Any
                if tag_v:
                    cm = args[0] if args else kwargs["common_attn_metadata"]
                else:
                    cm = args[1] if len(args) > 1 else kwargs["common_attn_metadata"]
                padded_tokens = cm.num_actual_tokens
                padded_reqs = cm.num_reqs
                thr = getattr(self, "reorder_batch_threshold", None)
                if thr is None:
                    thr = getattr(self, "decode_threshold", None)
                nd, npf, ndt, npt = _split(md)
                f = 0 if RT.in_step else _OUTSIDE
                if RT.drafter:
                    f |= _DRAFTER
                t = tag_v if tag_v else (2 if RT.drafter else 0)
                ident = RT.intern(type(self).__name__)
                RT.put.build(
                    RT.step,
                    t,
                    ident if ident < 256 else 0,
                    f,
                    t0,
                    t1,
                    padded_tokens,
                    -1,  # real tokens and requests: the reader's (assemble.fill_builds)
                    padded_reqs,
                    -1,
                    cm.max_query_len,
                    -1 if thr is None else thr,
                    nd,
                    npf,
                    ndt,
                    npt,
                )
            except Exception as exc:
                hook.fail(exc)

        compiled: Callable[..., Any] | None = accel.build_hook(orig, record, RT, tag_v)
        if compiled is not None:  # the common path in C, the rest through ``record``
            return compiled

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not RT.enabled or RT.in_build:
                return orig(self, *args, **kwargs)
            RT.in_build = 1
            t0 = _clock(BOOTTIME)
            try:
                md = orig(self, *args, **kwargs)
            finally:
                t1 = _clock(BOOTTIME)
                RT.in_build = 0
            record(md, t0, t1, self, *args, **kwargs)
            return md

        return wrapper

    return factory


def _subclasses(cls: type) -> Iterator[type]:
    seen: set[type] = set()
    stack = [cls]
    while stack:
        c = stack.pop()
        sub: type
        for sub in c.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                yield sub


def late_targets(runner: Any) -> list[tuple[Target, Any]]:
    """Every loaded builder class that defines a build method in its own body."""
    from probe.engine.hooks._base import resolve_owner

    base = resolve_owner(*BUILDER_BASE)  # LookupError: reported by name as missing
    out: list[tuple[Target, Any]] = []
    for cls in (base, *_subclasses(base)):
        for name, tag in METHODS.items():
            if name in vars(cls):
                hook_id = f"build.{cls.__name__}.{name}"
                out.append(
                    (
                        Target(
                            hook_id, cls.__module__, cls.__qualname__, name, build(tag), gate="on"
                        ),
                        cls,
                    )
                )
    return out


TARGETS: tuple[Target, ...] = (
    Target(
        "sync.stream", "torch.cuda.streams", "Stream", "synchronize", step.span(Phase.SYNC_STALL)
    ),
    Target("sync.device", "torch.cuda", "", "synchronize", step.span(Phase.SYNC_STALL)),
)

FAMILY = Family("builders", "0.26-0.34", TARGETS, late_targets)
TARGETS = FAMILY.targets  # each marked with its family
