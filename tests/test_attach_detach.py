"""Zero-cost detach: while no reader is attached only the always-on hooks are in place."""

from __future__ import annotations

from typing import Any

import pytest

from probe import hooks
from probe.records import Dispatch
from probe.ring import RingWriter

pytestmark = pytest.mark.usefixtures("clean_probe")


def _installed_families() -> set[str]:
    return {h.hook_id.split(".", 1)[0] for h in hooks.INSTALLER.hooks.values()}


def test_detached_process_has_only_always_on_hooks(ring: RingWriter, kit: Any) -> None:
    import vllm.v1.worker.gpu_model_runner  # noqa: F401  (a worker has it imported)
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    original = vars(CudagraphDispatcher)["dispatch"]
    hooks.install(list(hooks.ALWAYS_ON), lazy=False)
    assert _installed_families() == {"static"}
    assert vars(CudagraphDispatcher)["dispatch"] is original

    hooks.attach(ring, gpu_timing=False)
    assert {"step", "dispatch", "replay", "reorder", "static"} <= _installed_families()
    assert vars(CudagraphDispatcher)["dispatch"] is not original

    hooks.detach()
    assert _installed_families() == {"static"}
    assert vars(CudagraphDispatcher)["dispatch"] is original

    hooks.attach(ring, gpu_timing=False)
    assert vars(CudagraphDispatcher)["dispatch"] is not original
    hooks.detach()


def test_attached_dispatch_is_recorded_and_detached_is_not(
    ring: RingWriter, kit: Any, v1_dispatcher: Any
) -> None:
    hooks.attach(ring, families=["dispatch"], gpu_timing=False)
    v1_dispatcher.dispatch(6, uniform_decode=True)
    hooks.detach()
    v1_dispatcher.dispatch(6, uniform_decode=True)
    records, _ = kit.drain(ring)
    assert [type(r) for r in records] == [Dispatch]
