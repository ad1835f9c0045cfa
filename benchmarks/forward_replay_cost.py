"""Cost per call of the forward-launch and graph-replay hooks, warm and with caches evicted.

    PYTHONPATH=$PWD python benchmarks/forward_replay_cost.py [--n 300] [--evict-mb 64]

Stand-ins named like vLLM's classes (the hooks read ``type(self).__name__``) carry the
real hook factories of probe.engine.hooks.step and probe.engine.hooks.replay, on each hot path
(probe.engine.accel): ``compiled`` and ``python``. The shapes timed, each a whole call from the
caller's side (hook + a no-op original), minus the same call unwrapped:

- ``mrv2 FULL step``: ``ModelCudaGraphManager.run_fullgraph`` (vLLM's own, unhooked)
  calling ``CudaGraphManager.run_fullgraph`` inside it, in a step: that hooked replay is
  the forward launch, with itself counted into it; plus the drafter's ``run_fullgraph``
  (its own REPLAY record);
- ``v1 FULL step``: ``GPUModelRunner._model_forward`` around a ``CUDAGraphWrapper``
  whose forward context says FULL and whose entry holds a graph; and the same with
  ``_model_forward`` unhooked, the wrapper's hook being the launch (what
  ``probe.engine.hooks.step.late_targets`` installs when the model is such a wrapper);
- ``mrv2 PIECEWISE``: a forward launch (``step.forward``, standing in for MRV2's
  ``set_forward_context`` body) around ``run_pw_graph`` and 4 piecewise
  ``CUDAGraphWrapper`` pieces.

The forward context holds vLLM's own ``CUDAGraphMode`` members and a ``BatchDescriptor``
(a frozen dataclass: its hash and equality run in Python), each wrapper's entries are
keyed by an equal descriptor of its own, as in vLLM.

Warm: back-to-back calls. Cold: before each call ~``--evict-mb`` MB of memory are touched
and some torch code runs (the trick of /tmp/x/cold.py: in-engine each hooked call runs
with its caches evicted by the model's own host work). Median ns over ``--n`` calls.
Records go to a real shared-memory ring, recreated every 100 calls so it never fills.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _timing import evictor, median_ns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--evict-mb", type=int, default=64)
    a = ap.parse_args()
    from probe.engine import accel

    evict = evictor(a.evict_mb)

    paths = ["compiled", "python"] if accel.COMPILED else ["python"]
    with tempfile.TemporaryDirectory() as tmp:
        rows: dict[str, dict[str, float]] = {}
        for path in paths:
            with accel.use(path):
                for name, (hooked, plain) in cases(Path(tmp) / path).items():
                    for cold in (False, True):
                        h = timed(hooked, a.n, evict if cold else None)
                        p = timed(plain, a.n, evict if cold else None)
                        key = f"{name} [{path}]"
                        rows.setdefault(key, {})["cold" if cold else "warm"] = h - p
                teardown()
    print(f"{'shape':40} {'warm':>8} {'cold':>8}  (ns added per call, median)")
    for key, v in rows.items():
        print(f"{key:40} {v['warm']:8.0f} {v['cold']:8.0f}")


_STATE: dict[str, Any] = {}


def timed(fn: Callable[[], Any], n: int, evict: Callable[[], None] | None) -> float:
    return median_ns(fn, n, evict, every=100, between=lambda: _STATE["renew"]())


def teardown() -> None:
    from probe.engine.runtime import RT

    RT.enabled = False
    if RT.faults:
        print("faults:", RT.faults, file=sys.stderr)
    RT.detach()
    _STATE["inst"].uninstall()
    _STATE["writer"].close()
    RT.reset()


def cases(ring: Path) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    import vllm.forward_context as fcm
    from vllm.config import CUDAGraphMode

    from probe.engine.hooks import replay, step
    from probe.engine.hooks._base import Installer, Target
    from probe.engine.ring_writer import RingWriter
    from probe.engine.runtime import RT

    RT.reset()
    inst = Installer()
    desc = types.SimpleNamespace(num_tokens=64)

    class CudaGraphManager:
        use_breakable_cg = False

        def run_fullgraph(self, desc: Any) -> Any:
            return desc

        def run_pw_graph(self, model: Any, inputs: Any) -> Any:
            return model(inputs)

    class ModelCudaGraphManager(CudaGraphManager):
        def run_fullgraph(self, desc: Any) -> Any:
            return super().run_fullgraph(desc)

        def run_pw(self, model: Any, inputs: Any) -> Any:
            return self.run_pw_graph(model, inputs)

    class SpeculatorCudaGraphManager(CudaGraphManager):
        pass

    full, pw = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE
    bd = fcm.BatchDescriptor(num_tokens=64)

    class CUDAGraphWrapper:
        def __init__(self, mode: Any) -> None:
            self.runtime_mode = mode
            entry = types.SimpleNamespace(cudagraph=object())
            self.concrete_cudagraph_entries = {fcm.BatchDescriptor(num_tokens=64): entry}

        def __call__(self, x: Any) -> Any:
            return x

    class GPUModelRunner:
        def __init__(self, model: Any) -> None:
            self.model = model

        def _model_forward(self, x: Any) -> Any:
            return self.model(x)

    class Pieces:
        def __init__(self) -> None:
            self.pieces = [CUDAGraphWrapper(pw) for _ in range(4)]

        def __call__(self, x: Any) -> Any:
            for p in self.pieces:
                p(x)
            return x

    def t(hid: str, name: str, fac: Any) -> Target:
        return Target(hid, __name__, "", name, fac)

    inst.install_on(t("replay.mrv2.run_fullgraph", "run_fullgraph", replay.run_fullgraph),
                    CudaGraphManager)  # fmt: skip
    inst.install_on(t("replay.mrv2.run_pw_graph", "run_pw_graph", replay.run_pw_graph),
                    CudaGraphManager)  # fmt: skip
    inst.install_on(t("phase.mrv2.forward_pw", "run_pw", step.forward), ModelCudaGraphManager)
    inst.install_on(t("replay.wrapper", "__call__", replay.wrapper_call(False)), CUDAGraphWrapper)
    inst.install_on(t("phase.v1.forward_launch", "_model_forward", step.forward), GPUModelRunner)

    def renew() -> None:
        RT.enabled = False
        RT.detach()
        _STATE["writer"].close()
        _STATE["writer"] = RingWriter.create(ring, capacity=1 << 16)
        RT.attach(_STATE["writer"])
        RT.on_first_step = []
        RT.in_step = 1
        RT.enabled = True

    _STATE.update(inst=inst, renew=renew, writer=RingWriter.create(ring, capacity=1 << 16))
    RT.attach(_STATE["writer"])
    RT.in_step, RT.enabled = 1, True
    m, s = ModelCudaGraphManager(), SpeculatorCudaGraphManager()
    v1 = GPUModelRunner(CUDAGraphWrapper(full))

    class LaunchRunner:  # _model_forward left unhooked: the model's FULL wrapper launches
        def __init__(self, model: Any) -> None:
            self.model = model

        def _model_forward(self, x: Any) -> Any:
            return self.model(x)

    v1w = LaunchRunner(CUDAGraphWrapper(full))
    pwr = Pieces()
    ctx_full = types.SimpleNamespace(cudagraph_runtime_mode=full, batch_descriptor=bd)
    ctx_pw = types.SimpleNamespace(cudagraph_runtime_mode=pw, batch_descriptor=bd)

    # the same call shapes on unwrapped classes of the same cost
    class Plain:
        def run_fullgraph(self, desc: Any) -> Any:
            return self.inner(desc)

        def inner(self, desc: Any) -> Any:
            return desc

        def run_pw(self, model: Any, inputs: Any) -> Any:
            return self.run_pw_graph(model, inputs)

        def run_pw_graph(self, model: Any, inputs: Any) -> Any:
            return model(inputs)

    class PlainWrapper:
        def __call__(self, x: Any) -> Any:
            return x

    class PlainPieces:
        def __init__(self) -> None:
            self.pieces = [PlainWrapper() for _ in range(4)]

        def __call__(self, x: Any) -> Any:
            for p in self.pieces:
                p(x)
            return x

    class PlainRunner:
        model = PlainWrapper()

        def _model_forward(self, x: Any) -> Any:
            return self.model(x)

    plain, pp, pv1 = Plain(), PlainPieces(), PlainRunner()

    def mrv2_full() -> None:
        m.run_fullgraph(desc)
        RT.drafter += 1
        s.run_fullgraph(desc)
        RT.drafter -= 1

    def mrv2_full_plain() -> None:
        plain.run_fullgraph(desc)
        RT.drafter += 1
        plain.inner(desc)
        RT.drafter -= 1

    def v1_full() -> None:
        fcm._forward_context = ctx_full
        v1._model_forward(64)

    def v1_full_plain() -> None:
        fcm._forward_context = ctx_full
        pv1._model_forward(64)

    def v1_launch() -> None:
        fcm._forward_context = ctx_full
        v1w._model_forward(64)

    def mrv2_pw() -> None:
        fcm._forward_context = ctx_pw
        m.run_pw(pwr, 64)

    def mrv2_pw_plain() -> None:
        fcm._forward_context = ctx_pw
        plain.run_pw(pp, 64)

    return {
        "mrv2 FULL step (fwd+replay+drafter)": (mrv2_full, mrv2_full_plain),
        "v1 FULL step (fwd+wrapper)": (v1_full, v1_full_plain),
        "v1 FULL step (the wrapper launches)": (v1_launch, v1_full_plain),
        "mrv2 PIECEWISE (fwd+pw+4 pieces)": (mrv2_pw, mrv2_pw_plain),
    }


if __name__ == "__main__":
    sys.exit(main())
