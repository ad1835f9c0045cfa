"""vLLM's call signatures the hooks read arguments from, declared once for both hot paths.

The Python hooks (:mod:`probe.engine.hooks.dispatch`) read these names; the compiled ones
(``probe/engine/accel/_accel*.h``) read the same names and positions from the generated
header (``probe/engine/accel/_accel_gen.h``, written by
:mod:`probe.engine.gen_header`). A vLLM release that moves an argument changes this
file and the header follows.

    >>> V1_DISPATCH.index("uniform_decode")
    1
"""

from __future__ import annotations

V1_DISPATCH = ("num_tokens", "uniform_decode")
"""V1 ``CudagraphDispatcher.dispatch``: its leading parameters after ``self``, in order."""

V1_RUNNER_PHASE = ("num_reqs", "max_num_scheduled_tokens")
"""V1 ``GPUModelRunner._determine_batch_execution_and_padding``: the batch facts the dispatch
phase reads (positions taken from the signature at install)."""

MRV2_DISPATCH = ("num_reqs", "num_tokens", "uniform_token_count", "max_query_len")
"""The inputs an MRV2 dispatch decision is read with: ``CudaGraphManager.dispatch`` and
``dispatch_cg_and_sync_dp`` name them alike (positions taken from the signature at install)."""

NEED_EAGER = "need_eager"
"""The keyword of ``dispatch_cg_and_sync_dp`` that skips the graph manager: the step runs
eager (``Reason.FORCED_EAGER``)."""


#: Model Runner V2's split graph sizes (vLLM 0.34 on; ``CompilationConfig`` fields):
#: prefill graphs by token count, uniform-decode graphs by request count, and their caps.
#: Every batch that is not a uniform decode pads to a prefill size; a uniform decode
#: batch of ``n`` requests replays the smallest decode graph of at least ``n`` requests.
SPLIT_SIZE_FIELDS = (
    "prefill_cudagraph_capture_token_sizes",
    "max_prefill_cudagraph_capture_tokens",
    "decode_cudagraph_capture_request_sizes",
    "max_decode_cudagraph_capture_requests",
    "max_decode_cudagraph_capture_tokens",
)
