"""Emit roctx ranges and marks from Python, so ``rocprofv3 --marker-trace`` records them.

This module runs inside vLLM (the live roctx output, :mod:`exporters.roctx_live`), so it
imports only the standard library and nothing else of :mod:`exporters`. The ``roctx``
module ships with ROCm's rocprofiler-sdk (``/opt/rocm/lib/pythonX.Y/site-packages``), not
on PyPI; it is imported only when an emitter is created::

    from exporters.roctx_emit import RoctxEmitter

    emitter = RoctxEmitter()            # RoctxUnavailableError without ROCm's roctx
    with emitter.range("step 12 FULL bs=64"):
        ...
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

__all__ = ["RoctxEmitter", "RoctxUnavailableError"]

_ROCTX_HELP = (
    "the 'roctx' Python module is not importable. It ships with ROCm's rocprofiler-sdk "
    "(not on PyPI): add /opt/rocm/lib/python{major}.{minor}/site-packages to PYTHONPATH, "
    "or build rocprofiler-sdk with ROCPROFILER_PYTHON_VERSIONS including this interpreter. "
    "Ranges are recorded by 'rocprofv3 --marker-trace' (or --sys-trace)."
)
_ROCTX_API = ("rangePush", "rangePop", "mark", "rangeStart", "rangeStop")


class RoctxUnavailableError(ImportError):
    """The ROCm ``roctx`` module (from rocprofiler-sdk) cannot be imported or is incomplete."""


class RoctxEmitter:
    """Emit roctx ranges and marks from Python so rocprofv3 records them.

    Uses rocprofiler-sdk's ``roctx`` module (``rangePush``/``rangePop`` for nested
    per-thread ranges, ``rangeStart``/``rangeStop`` for ranges that may end on another
    thread, ``mark`` for instants), imported when the emitter is created. With no profiler
    attached the calls are near no-ops. ``importer`` replaces :func:`importlib.import_module`
    (tests pass a fake module)::

        emitter = RoctxEmitter()            # RoctxUnavailableError without ROCm's roctx
        with emitter.range("step 12 FULL bs=64"):
            ...
        emitter.mark("reorder: 3 requests moved")

    Calls go straight to roctx; this class adds no locking or buffering, so put it behind
    the probe's own fault handling on a hot path.
    """

    def __init__(self, *, importer: Callable[[str], ModuleType] = importlib.import_module) -> None:
        try:
            module = importer("roctx")
        except ImportError as exc:
            raise RoctxUnavailableError(
                _ROCTX_HELP.format(major=sys.version_info.major, minor=sys.version_info.minor)
            ) from exc
        missing = [name for name in _ROCTX_API if not callable(getattr(module, name, None))]
        if missing:
            where = getattr(module, "__file__", None) or "<unknown location>"
            raise RoctxUnavailableError(
                f"the 'roctx' module at {where} lacks {', '.join(missing)}; expected ROCm "
                "rocprofiler-sdk's roctx Python bindings"
            )
        self.module = module
        self._push: Callable[[str], Any] = module.rangePush
        self._pop: Callable[[], Any] = module.rangePop
        self._mark: Callable[[str], Any] = module.mark
        self._start: Callable[[str], Any] = module.rangeStart
        self._stop: Callable[[int], Any] = module.rangeStop

    def push(self, message: str) -> None:
        """Open a nested range on this thread (``roctxRangePushA``)."""
        self._push(message)

    def pop(self) -> None:
        """Close this thread's innermost range (``roctxRangePop``)."""
        self._pop()

    def mark(self, message: str) -> None:
        """Record an instant (``roctxMarkA``)."""
        self._mark(message)

    def start(self, message: str) -> int:
        """Open a range that any thread may close; returns its id (``roctxRangeStartA``)."""
        return int(self._start(message))

    def stop(self, range_id: int) -> None:
        """Close a range opened by :meth:`start` (``roctxRangeStop``)."""
        self._stop(range_id)

    @contextlib.contextmanager
    def range(self, message: str) -> Iterator[None]:
        """Push a range for the duration of a ``with`` block; it is popped on exceptions too."""
        self._push(message)
        try:
            yield
        finally:
            self._pop()
