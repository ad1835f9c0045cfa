"""NVTX ranges and marks for Nsight Systems, emitted live (off unless asked for).

Uses the ``nvtx`` package from PyPI (``pip install nvtx``, or the ``nvtx`` extra). With no
Nsight Systems attached, ``nvtx`` hands out a dummy domain whose calls return at once;
under ``nsys profile --trace=nvtx,cuda ...`` the ranges appear in the ``vllm-graph-probe``
NVTX domain above the CUDA rows::

    from exporters.nvtx import NvtxEmitter

    nv = NvtxEmitter()                    # NvtxUnavailableError without the nvtx package
    with nv.range("step 12 FULL hit"):
        ...
    nv.mark("reorder: 3 requests moved")

Cost (``benchmarks/nvtx_roctx_overhead.py``, nvtx 0.2.17, no profiler attached): about
0.3 µs per push/pop pair and 0.2 µs per mark for a message seen before (attributes are
cached per message, up to 4096 of them). Like
:class:`exporters.rocprof.RoctxEmitter`, this class adds no locking; calls must come in
push/pop order on one thread.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from exporters.base import MissingExtra

__all__ = ["DEFAULT_DOMAIN", "NvtxEmitter", "NvtxUnavailableError"]

DEFAULT_DOMAIN = "vllm-graph-probe"
"""NVTX domain of every range and mark (Nsight groups rows by domain)."""

_CACHE_LIMIT = 4096


class NvtxUnavailableError(MissingExtra):
    """The ``nvtx`` package is not importable."""

    def __init__(self, missing: str | None = "nvtx") -> None:
        super().__init__("nvtx", "nvtx", missing)
        ImportError.__init__(self, f"{self.args[0]} (or: pip install nvtx)", name=missing)


class NvtxEmitter:
    """Push, pop and mark NVTX ranges in one domain.

    ``importer`` replaces :func:`importlib.import_module` (tests pass a fake ``nvtx``).
    Event attributes are built once per distinct message and cached (up to 4096
    messages; past that they are built each time).
    """

    def __init__(
        self,
        domain: str = DEFAULT_DOMAIN,
        *,
        color: str | None = "green",
        importer: Callable[[str], ModuleType] = importlib.import_module,
    ) -> None:
        try:
            module = importer("nvtx")
        except ImportError as exc:
            raise NvtxUnavailableError(getattr(exc, "name", None) or "nvtx") from exc
        get_domain = getattr(module, "get_domain", None)
        if not callable(get_domain):
            where = getattr(module, "__file__", None) or "<unknown location>"
            raise NvtxUnavailableError(f"nvtx.get_domain (the module at {where} lacks it)")
        self.module = module
        self.domain_name = domain
        self._domain = get_domain(domain)
        self._color = color
        self._attrs: dict[str, Any] = {}
        self._push: Callable[[Any], Any] = self._domain.push_range
        self._pop: Callable[[], Any] = self._domain.pop_range
        self._mark: Callable[[Any], Any] = self._domain.mark

    def _attributes(self, message: str) -> Any:
        a = self._attrs.get(message)
        if a is None:
            a = self._domain.get_event_attributes(message=message, color=self._color)
            if len(self._attrs) < _CACHE_LIMIT:
                self._attrs[message] = a
        return a

    def push(self, message: str) -> None:
        """Open a nested range on this thread (``nvtxDomainRangePushEx``)."""
        self._push(self._attributes(message))

    def pop(self) -> None:
        """Close this thread's innermost range (``nvtxDomainRangePop``)."""
        self._pop()

    def mark(self, message: str) -> None:
        """Record an instant (``nvtxDomainMarkEx``)."""
        self._mark(self._attributes(message))

    @contextlib.contextmanager
    def range(self, message: str) -> Iterator[None]:
        """A range for the duration of a ``with`` block; popped on exceptions too."""
        self.push(message)
        try:
            yield
        finally:
            self._pop()
