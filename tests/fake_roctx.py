"""A stand-in for ROCm's roctx module (ROCm is absent here): the real roctx Python API
names (``rangePush``, ``rangePop``, ``mark``, ``rangeStart``, ``rangeStop``, as
rocprofiler-sdk's bindings), each call recorded."""

from __future__ import annotations

import types
from typing import Any


class FakeRoctx(types.ModuleType):
    """A stand-in for ROCm's ``roctx`` module that records each call (``fail_on``: the one
    call that raises)."""

    def __init__(self, fail_on: str | None = None) -> None:
        super().__init__("roctx")
        self.calls: list[tuple[Any, ...]] = []
        self.fail_on = fail_on
        self._next = 0

    def _call(self, *c: Any) -> None:
        if c[0] == self.fail_on:
            raise RuntimeError(f"{c[0]} failed")
        self.calls.append(c)

    def rangePush(self, message: str) -> int:
        self._call("rangePush", message)
        return 0

    def rangePop(self) -> int:
        self._call("rangePop")
        return 0

    def mark(self, message: str) -> None:
        self._call("mark", message)

    def rangeStart(self, message: str) -> int:
        self._next += 1
        self._call("rangeStart", message)
        return self._next

    def rangeStop(self, range_id: int) -> None:
        self._call("rangeStop", range_id)
