"""Added cost per call of the reorder and dispatch-phase hooks, warm and with caches evicted.

    python benchmarks/phase_hooks.py [--n 2000] [--cold 300] [--reqs 64] [--json PATH]

Four targets (five cases), each on both hot paths (probe.engine.accel ``compiled`` and
``python``), enabled
and inside a step, recording into a real shared-memory ring that never fills:

- MRV2 ``sort_batch_req_ids`` (the installed vLLM's own function) over ``--reqs`` decode
  requests;
- V1 ``_may_reorder_batch`` on a stand-in runner whose original does nothing (vLLM's needs
  a model), ``--reqs`` requests, nothing moves;
- the MRV2 dispatch phase: ``dispatch_cg_and_sync_dp`` (a stand-in with vLLM's shape)
  around a stand-in ``ModelCudaGraphManager`` with a FULL hit, both hooks installed (as
  under DP > 1), and the phase hook alone (DP 1: it reads the decision from the result;
  on a tree before that it writes a plain span);
- the V1 dispatch phase: a stand-in ``_determine_batch_execution_and_padding`` around the
  installed vLLM's real ``CudagraphDispatcher`` with a FULL hit, both hooks installed.

``warm``: interleaved rounds of ``--n`` back-to-back calls of the unhooked original and
of the hooked call, the best hooked round minus the best original one (ns per call).
``cold``: pairs of single calls (original, hooked), each after evicting the caches (a
64 MB array summed and a little torch work, as inside a real engine step where the hooks
run between other work), the lower quartile of the hooked minus the original's over
``--cold`` pairs. Uses only APIs that predate the compiled phase hooks, so the same script
measures an older tree: ``PYTHONPATH=/path/to/old/tree python benchmarks/phase_hooks.py``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _timing import evictor, per_call


def _warm(fn: Callable[[], Any], orig: Callable[[], Any], n: int, rounds: int = 21) -> float:
    """Interleaved rounds (original, hooked) of ``n`` calls: best hooked minus best original
    (a shared host preempts rounds; the best of each is what the code costs)."""
    a, b = [], []
    for _ in range(rounds):
        a.append(per_call(orig, n, 1))
        b.append(per_call(fn, n, 1))
    return min(b) - min(a)


def _cold(
    fn: Callable[[], Any], orig: Callable[[], Any], calls: int, evict: Callable[[], None]
) -> float:
    """Pairs (original, hooked), each call alone after an eviction: the lower quartile of
    the hooked calls minus that of the originals (robust to preempted calls)."""
    clock = time.perf_counter_ns
    a, b = [], []
    for _ in range(calls):
        evict()
        t0 = clock()
        orig()
        a.append(clock() - t0)
        evict()
        t0 = clock()
        fn()
        b.append(clock() - t0)
    q = statistics.quantiles
    return q(b, n=4)[0] - q(a, n=4)[0]


def _cases(reqs: int) -> list[tuple[str, Any, Callable[[], Any], Callable[[], Any]]]:
    """(label, install(installer), hooked call, original call) per target."""
    from vllm.config import CompilationMode, CUDAGraphMode, VllmConfig
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.worker.gpu import model_runner

    from probe.engine.hooks import dispatch, reorder
    from probe.engine.hooks._base import Target

    out = []
    ids = [f"req-{i}" for i in range(reqs)]
    num = dict.fromkeys(ids, 2)
    sort = vars(model_runner)["sort_batch_req_ids"]
    mr = types.ModuleType("bench_model_runner")
    mr.sort_batch_req_ids = sort  # type: ignore[attr-defined]
    nparams = len(inspect.signature(sort).parameters)
    sort_args: tuple[Any, ...] = (num, {r: [0] for r in ids}, 2) if nparams == 3 else (num, 2)
    out.append((
        "MRV2 sort_batch_req_ids",
        lambda i: i.install_on(Target("reorder.mrv2", "", "", "sort_batch_req_ids",
                                      reorder.mrv2_sort), mr),
        lambda: mr.sort_batch_req_ids(*sort_args),  # type: ignore[attr-defined]
        lambda: sort(*sort_args),
    ))  # fmt: skip

    class Runner:
        reorder_batch_threshold = 2
        uniform_decode_query_len = 2

        def __init__(self) -> None:
            self.input_batch = types.SimpleNamespace(req_ids=list(ids))

        def _may_reorder_batch(self, scheduler_output: Any) -> None:
            return None

    runner, so = Runner(), types.SimpleNamespace(num_scheduled_tokens=dict(num))
    orig_reorder = vars(Runner)["_may_reorder_batch"]
    out.append((
        "V1 _may_reorder_batch",
        lambda i: i.install_on(Target("reorder.v1", "", "", "_may_reorder_batch",
                                      reorder.v1_may_reorder), Runner),
        lambda: runner._may_reorder_batch(so),
        lambda: orig_reorder(runner, so),
    ))  # fmt: skip

    full = CUDAGraphMode.FULL
    desc = types.SimpleNamespace(cg_mode=full, num_tokens=2 * reqs, num_reqs=reqs)

    class ModelCudaGraphManager:
        decode_query_len = 2

        def dispatch(
            self, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
            max_query_len: int | None = None, num_active_loras: int = 0,
        ) -> Any:  # fmt: skip
            return desc

    def sync_dp(
        cudagraph_manager: Any, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
        dp_size: int, dp_rank: int, max_query_len: int | None = None, need_eager: bool = False,
        num_active_loras: int = 0,
    ) -> Any:  # fmt: skip
        d = cudagraph_manager.dispatch(
            num_reqs, num_tokens, uniform_token_count, max_query_len,
            num_active_loras=num_active_loras,
        )  # fmt: skip
        return d, None

    mgr = ModelCudaGraphManager()
    mr.dispatch_cg_and_sync_dp = sync_dp  # type: ignore[attr-defined]
    orig_mgr = vars(ModelCudaGraphManager)["dispatch"]

    def base_sync(m: Any, num_reqs: int, num_tokens: int, utc: int, *a: Any, **k: Any) -> Any:
        """The phase with neither hook: vLLM's call into the unhooked manager."""
        return orig_mgr(m, num_reqs, num_tokens, utc, k["max_query_len"], num_active_loras=0), None

    def sync_dp_hook(i: Any) -> None:
        i.install_on(Target("dispatch.mrv2.sync_dp", "", "", "dispatch_cg_and_sync_dp",
                            dispatch.mrv2_sync_dp), mr)  # fmt: skip

    def install_mrv2(i: Any) -> None:  # the manager hooked too (DP > 1)
        i.install_on(Target("dispatch.mrv2.manager", "", "", "dispatch", dispatch.mrv2_dispatch),
                     ModelCudaGraphManager)  # fmt: skip
        sync_dp_hook(i)

    n_tok = 2 * reqs
    cases = (("MRV2 dispatch phase (FULL hit)", install_mrv2),
             ("MRV2 dispatch phase alone (DP 1, FULL hit)", sync_dp_hook))  # fmt: skip
    for label, install in cases:
        out.append((
            label,
            install,
            lambda: mr.dispatch_cg_and_sync_dp(  # type: ignore[attr-defined]
                mgr, reqs, n_tok, 2, 1, 0, max_query_len=2, need_eager=False, num_active_loras=0
            ),
            lambda: base_sync(mgr, reqs, n_tok, 2, 1, 0, max_query_len=2, need_eager=False),
        ))  # fmt: skip

    vc = VllmConfig()
    cc = vc.compilation_config
    cc.mode = CompilationMode.NONE
    cc.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    cc.cudagraph_capture_sizes = [2, 4, 8, 16, 32, 64, 128, 256]
    cc.max_cudagraph_capture_size = 256
    d = CudagraphDispatcher(vc)
    d.uniform_decode_query_len = 2
    d.initialize_cudagraph_keys(CUDAGraphMode.FULL_DECODE_ONLY, uniform_decode_query_len=2)

    class V1Runner:
        def _determine_batch_execution_and_padding(
            self, num_tokens: int, num_reqs: int, num_scheduled_tokens_np: Any,
            max_num_scheduled_tokens: int, use_cascade_attn: bool = False,
            allow_microbatching: bool = True, force_eager: bool = False,
        ) -> Any:  # fmt: skip
            return d.dispatch(num_tokens, uniform_decode=True)

    v1r = V1Runner()

    def install_v1(i: Any) -> None:
        i.install_on(Target("dispatch.v1.dispatcher", "", "", "dispatch", dispatch.v1_dispatch),
                     CudagraphDispatcher)  # fmt: skip
        i.install_on(Target("dispatch.v1.runner", "", "", "_determine_batch_execution_and_padding",
                            dispatch.v1_runner_dispatch), V1Runner)  # fmt: skip

    kw = dict(num_tokens=n_tok, num_reqs=reqs, num_scheduled_tokens_np=None,
              max_num_scheduled_tokens=2, use_cascade_attn=False)  # fmt: skip
    orig_dispatch = vars(CudagraphDispatcher)["dispatch"]

    def base_v1(self: Any, num_tokens: int, **k: Any) -> Any:
        """The phase with neither hook: vLLM's call into the unhooked dispatcher."""
        return orig_dispatch(d, num_tokens, uniform_decode=True)

    out.append((
        "V1 dispatch phase (FULL hit)",
        install_v1,
        lambda: v1r._determine_batch_execution_and_padding(**kw),
        lambda: base_v1(v1r, **kw),
    ))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--cold", type=int, default=300)
    ap.add_argument("--reqs", type=int, default=64)
    ap.add_argument("--json")
    a = ap.parse_args()
    from probe.engine import accel
    from probe.engine.hooks._base import Installer
    from probe.engine.ring_writer import RingWriter
    from probe.engine.runtime import RT

    evict = evictor()
    tmp = Path(tempfile.mkdtemp(prefix="probe-bench-", dir="/dev/shm"))
    results: dict[str, Any] = {}
    paths = ["compiled", "python"] if accel.COMPILED else ["python"]
    for path in paths:
        with accel.use(path):
            for label, install, hooked, orig in _cases(a.reqs):
                RT.reset()
                writer = RingWriter.create(tmp / f"ring-{path}", 1 << 20)
                inst = Installer()
                install(inst)
                RT.attach(writer)
                RT.enabled = True
                RT.in_step = 1
                warm = _warm(hooked, orig, a.n)
                cold = _cold(hooked, orig, a.cold, evict)
                RT.in_step = 0  # flushes the step buffer
                RT.enabled = False
                RT.detach()
                inst.uninstall()
                writer.close()
                results[f"{label} [{path}]"] = {"warm_ns": warm, "cold_ns": cold}
    print(f"{'hook':50} {'warm':>7} {'cold':>7}  (added ns/call, {a.reqs} requests)")
    for k, v in results.items():
        print(f"{k:50} {v['warm_ns']:7.0f} {v['cold_ns']:7.0f}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
