"""NVTX emitter: the real ``nvtx`` package (no Nsight attached: its no-op domain) and a
recorded stand-in with nvtx's domain API, and the missing-package message."""

from __future__ import annotations

import types
from typing import Any

import pytest

from probe.engine.markers import DEFAULT_DOMAIN, NvtxEmitter, NvtxUnavailableError


class FakeDomain:
    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.calls = calls
        self.built = 0

    def get_event_attributes(self, message: str | None = None, color: Any = None) -> Any:
        self.built += 1
        return ("attrs", message, color)

    def push_range(self, attributes: Any = None) -> None:
        self.calls.append(("push", attributes[1]))

    def pop_range(self) -> None:
        self.calls.append(("pop",))

    def mark(self, attributes: Any = None) -> None:
        self.calls.append(("mark", attributes[1]))


def fake_nvtx() -> tuple[types.ModuleType, list[tuple[Any, ...]], dict[str, FakeDomain]]:
    calls: list[tuple[Any, ...]] = []
    domains: dict[str, FakeDomain] = {}
    mod = types.ModuleType("nvtx")
    mod.get_domain = lambda name: domains.setdefault(name, FakeDomain(calls))  # type: ignore[attr-defined]
    return mod, calls, domains


def test_push_pop_mark_in_the_probe_domain() -> None:
    mod, calls, domains = fake_nvtx()
    nv = NvtxEmitter(importer=lambda name: mod)
    with nv.range("step 1"):
        nv.push("forward_launch")
        nv.pop()
        nv.mark("dispatch FULL hit")
    with pytest.raises(ValueError), nv.range("step 2"):
        raise ValueError("inside")
    nv.push("step 1")
    nv.pop()
    assert calls == [
        ("push", "step 1"),
        ("push", "forward_launch"),
        ("pop",),
        ("mark", "dispatch FULL hit"),
        ("pop",),
        ("push", "step 2"),
        ("pop",),
        ("push", "step 1"),
        ("pop",),
    ]
    assert list(domains) == [DEFAULT_DOMAIN]
    assert domains[DEFAULT_DOMAIN].built == 4  # attributes cached per message


def test_missing_nvtx_names_the_install() -> None:
    def missing(name: str) -> types.ModuleType:
        raise ImportError(f"No module named {name!r}", name=name)

    with pytest.raises(NvtxUnavailableError) as info:
        NvtxEmitter(importer=missing)
    assert isinstance(info.value, ImportError) and info.value.extra == "nvtx"
    assert "pip install nvtx" in str(info.value)
    assert "vllm-graph-probe[nvtx]" in str(info.value)
    with pytest.raises(NvtxUnavailableError, match="get_domain"):
        NvtxEmitter(importer=lambda name: types.ModuleType("nvtx"))


def test_real_nvtx_without_nsight() -> None:
    nvtx = pytest.importorskip("nvtx", reason="the nvtx extra is not installed")
    nv = NvtxEmitter()
    # the real package's domain, and its event attributes, one per message (cached)
    assert nv.module is nvtx and nv.domain_name == DEFAULT_DOMAIN
    for i in range(3):
        with nv.range(f"step {i}"):
            nv.mark("decision")
    assert set(nv._attrs) == {"step 0", "step 1", "step 2", "decision"}
    assert nv._attrs["decision"] is nv._attributes("decision")
    # a range is popped when its block raises, and the exception goes through
    with pytest.raises(KeyError), nv.range("failing step"):
        raise KeyError("inside")
