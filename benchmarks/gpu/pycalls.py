"""Count the calls the compiled hooks hand to Python in a variant (benchmark only).

On the compiled hot path a hook writes its record from C when vLLM's objects are of
the types it reads in place (exact dicts, lists, str ids, ints); anything else goes to
the hook's Python ``record`` or ``impl``, at several µs a call inside the engine. A
variant with ``"count_python_calls": true`` wraps, while its hooks are built, the Python
callables each compiled hook is given (``probe.engine.accel.*_hook``'s ``record``/``impl``), so
every call from C into Python is counted by hook and role: ``{"build_hook.record
FlashMLASparseMetadataBuilder.build": 1536}`` over 1,536 on steps says that build never
took its C path. What C does itself is untouched (the packers, the ring); the counter
adds a Python call to each fallback only, so the variant is named apart (``... counted``).
"""

from __future__ import annotations

import collections
import functools
import inspect
from collections.abc import Callable
from typing import Any

ROLES = {
    "gate": ("impl",),
    "step_hook": ("impl",),
    "dispatch_hook": ("record",),
    "build_hook": ("record",),
    "reorder_hook": ("record", "impl"),
    "phase_hook": ("record", "impl"),
    "forward_hook": ("impl", "record"),
    "replay_hook": ("impl", "record", "fwd_record"),
}
"""``probe.engine.accel``'s compiled-hook builders and their Python callables, by parameter."""


class PythonCalls:
    """:meth:`patch` before the variant installs its hooks (late targets are built at
    their first enabled step, so keep it patched for the whole variant), :meth:`unpatch`
    after; :meth:`result` gives the counts with the variant's on steps."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._plain: dict[str, Callable[..., Any]] = {}

    def _counted(self, key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        counts = self.counts

        @functools.wraps(fn)
        def counted(*a: Any, **k: Any) -> Any:
            counts[key] += 1
            return fn(*a, **k)

        return counted

    def patch(self) -> None:
        from probe.engine import accel

        for name, roles in ROLES.items():
            plain = getattr(accel, name, None)
            if plain is None or name in self._plain:
                continue
            self._plain[name] = plain
            setattr(accel, name, self._builder(name, plain, roles))

    def _builder(
        self, name: str, plain: Callable[..., Any], roles: tuple[str, ...]
    ) -> Callable[..., Any]:
        sig = inspect.signature(plain)

        def build(*a: Any, **k: Any) -> Any:
            bound = sig.bind(*a, **k)
            orig = bound.arguments.get("orig")
            what = getattr(orig, "__qualname__", type(orig).__name__)
            given: dict[int, Any] = {}
            for role in roles:
                fn = bound.arguments.get(role)
                if callable(fn):
                    counted = self._counted(f"{name}.{role} {what}", fn)
                    given[id(counted)] = fn
                    bound.arguments[role] = counted
            made = plain(*bound.args, **bound.kwargs)
            # on the Python path ``gate`` returns ``impl`` itself: no C path to leave, and
            # the counter would count every call, dormant ones too
            return given.get(id(made), made)

        return build

    def unpatch(self) -> None:
        from probe.engine import accel

        for name, plain in self._plain.items():
            setattr(accel, name, plain)
        self._plain.clear()

    def result(self, on_steps: int) -> dict[str, Any]:
        return {"calls": dict(self.counts), "on_steps": on_steps}
