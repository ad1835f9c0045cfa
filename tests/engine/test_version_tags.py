"""Attach and detach on and off without a restart must not wear out vLLM's classes.

From CPython 3.13 a class may use at most 1,000 type-version tags, and every write of one
of its attributes (each hook installed or removed) can spend one; past the cap the class
is never cached or specialized on again (``benchmarks/reattach_cost.py``: 3.7x slower
``self.x`` loops after ~500 install/uninstall cycles on 3.13.0). The probe counts its own
writes per class and, past :data:`probe.engine.hooks.TAG_BUDGET`, a detach leaves that class's
hooks in place, dormant. The cap is switched on here whatever Python runs the tests."""

from __future__ import annotations

from typing import Any

import pytest

from probe.engine import hooks
from probe.engine.hooks._base import Installer, Target
from probe.engine.ring_writer import RingWriter
from probe.records import Dispatch

pytestmark = pytest.mark.usefixtures("clean_probe")


def _capped(monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    monkeypatch.setattr(hooks, "VERSION_TAG_CAP", 1000)
    monkeypatch.setattr(hooks, "TAG_BUDGET", budget)
    monkeypatch.setattr(hooks.INSTALLER, "modified", {})


def test_cycles_stop_writing_the_class_at_the_budget(
    ring: RingWriter, kit: Any, v1_dispatcher: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 attach/detach cycles with a budget of 9 writes: the dispatcher class is written
    at most 9 times; once parked, its wrapper stays the same object, detached calls record
    nothing and attached ones record; uninstall restores vLLM's function by identity."""
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    _capped(monkeypatch, 9)
    original = vars(CudagraphDispatcher)["dispatch"]
    seen: list[Any] = []
    for _ in range(20):
        hooks.attach(ring, families=["dispatch"], gpu_timing=False)
        v1_dispatcher.dispatch(6, uniform_decode=True)
        hooks.detach()
        v1_dispatcher.dispatch(6, uniform_decode=True)  # detached: no record
        seen.append(vars(CudagraphDispatcher)["dispatch"])
    assert hooks.INSTALLER.writes_felt_by(CudagraphDispatcher) <= 9
    assert seen[0] is original  # removed while the budget allowed
    parked = seen[-1]
    assert parked is not original and all(w is parked for w in seen[5:])
    from probe.engine.control_server import ProbeHost

    assert ProbeHost({}).parked_hooks() == len(hooks.PARKED) > 0  # probe ps --json
    records, _ = kit.drain(ring)
    assert [type(r) for r in records] == [Dispatch] * 20
    hooks.uninstall()
    assert vars(CudagraphDispatcher)["dispatch"] is original
    assert not hooks.PARKED


def test_without_a_cap_every_detach_removes_the_hooks(
    ring: RingWriter, v1_dispatcher: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.12 and earlier have no cap: a detached process keeps no wrapper at all."""
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    monkeypatch.setattr(hooks, "VERSION_TAG_CAP", None)
    monkeypatch.setattr(hooks.INSTALLER, "modified", {})
    original = vars(CudagraphDispatcher)["dispatch"]
    for _ in range(10):
        hooks.attach(ring, families=["dispatch"], gpu_timing=False)
        hooks.detach()
        assert vars(CudagraphDispatcher)["dispatch"] is original
    assert not hooks.PARKED
    assert hooks.INSTALLER.writes_felt_by(CudagraphDispatcher) == 20


def test_a_later_attach_of_fewer_families_drops_the_parked_others(
    ring: RingWriter, kit: Any, v1_dispatcher: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parked hooks of a family the next attach does not ask for are removed, not run."""
    import vllm.v1.worker.gpu_model_runner  # noqa: F401

    _capped(monkeypatch, 0)  # park everything at the first detach
    hooks.attach(ring, gpu_timing=False)
    hooks.detach()
    assert {"step", "dispatch"} <= {h.family for h in hooks.INSTALLER.hooks.values()}
    hooks.attach(ring, families=["dispatch"], gpu_timing=False)
    assert {h.family for h in hooks.INSTALLER.hooks.values()} <= {"dispatch", "static"}
    v1_dispatcher.dispatch(6, uniform_decode=True)
    records, _ = kit.drain(ring)
    assert [type(r) for r in records] == [Dispatch]


def test_a_write_to_a_base_class_counts_for_its_subclasses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hook on a base class clears its subclasses' tags too: the budget of the base's
    hooks is checked against the subclass that has felt the most writes."""

    class Base:
        def f(self) -> int:
            return 1

    class Derived(Base):
        def g(self) -> int:
            return 2

    def factory(orig: Any, hook: Any) -> Any:
        return lambda *a, **k: orig(*a, **k)

    inst = Installer()
    monkeypatch.setattr(hooks, "INSTALLER", inst)
    monkeypatch.setattr(hooks, "VERSION_TAG_CAP", 1000)
    monkeypatch.setattr(hooks, "TAG_BUDGET", 10)
    tg = Target("x.g", __name__, "", "g", factory)
    for _ in range(3):  # 6 writes on Derived, none on Base
        inst.install_on(tg, Derived)
        inst.remove(next(iter(inst.hooks.values())))
    assert inst.writes_felt_by(Derived) == 6 and inst.writes_felt_by(Base) == 0
    assert not hooks._parks(Derived, 1)  # 6 + 2 <= 10
    assert hooks._parks(Derived, 3)  # 6 + 6 > 10
    assert not hooks._parks(Base, 1)  # Derived has felt 6: 6 + 2 <= 10
    assert hooks._parks(Base, 3)  # Derived has felt 6: 6 + 6 > 10
    monkeypatch.setattr(hooks, "VERSION_TAG_CAP", None)
    assert not hooks._parks(Base, 3)
    assert not hooks._parks(object(), 3)  # a module or instance owner has no version tag
