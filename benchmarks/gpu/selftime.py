"""The probe's own time inside a real engine, hook by hook ("self time").

The stepwise measure says how much longer an engine step takes with the hooks on; this
says where inside the probe that time is spent. Installed before the hooks (benchmark
only: it patches ``Installer.install_on``), it builds every wrapper around a timed copy
of the original and times the wrapper too:

    outer  = time from entering the probe's wrapper to leaving it
    inner  = time spent in vLLM's original inside it
    self   = outer - inner          (the wrapper's prologue, epilogue and record)

Nested hooks (every phase inside ``execute_model``) sit inside the outer hook's
``inner``, so selves do not double count. Ring writes are timed separately (``RT.write``
wrapped), and MRV2's forward-context manager (whose enter/exit run outside its factory's
call) is timed on its own, vLLM's part included, and left out of the totals. Only calls
entered while the probe is enabled count. The timers add their own cost (two
``perf_counter_ns`` and a closure call per layer): ``floor_ns`` measures one pass-
through wrapper timed the same way, in the same process, so it can be subtracted.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

_pc = time.perf_counter_ns
EXTRA = "~"  # reported, not summed


class SelfTime:
    def __init__(self) -> None:
        self.acc: dict[str, list[int]] = {}  # hook id -> [calls, outer ns, inner ns]
        self.ring = [0, 0]  # writes, ns
        self._undo: list[Callable[[], None]] = []

    # -- install ------------------------------------------------------------------------

    def patch(self) -> None:
        from probe.engine.hooks import step
        from probe.engine.hooks._base import Installer

        st = self
        plain = Installer.install_on

        def install_on(inst: Any, target: Any, owner: Any, report: Any = None) -> bool:
            timed = dataclasses.replace(target, factory=st.timed_factory(target))
            return plain(inst, timed, owner, report)

        Installer.install_on = install_on  # type: ignore[method-assign]
        self._undo.append(lambda: setattr(Installer, "install_on", plain))

        cls = step._TimedContext
        enter, exit_ = cls.__enter__, cls.__exit__
        # not in the totals: it includes vLLM's own forward-context enter and exit
        a = self.acc.setdefault(EXTRA + "phase.mrv2.forward_context.enter_exit", [0, 0, 0])
        from probe.engine.runtime import RT

        def t_enter(ctx: Any) -> Any:
            t0 = _pc()
            try:
                return enter(ctx)
            finally:
                if RT.enabled:
                    a[0] += 1
                    a[1] += _pc() - t0

        def t_exit(ctx: Any, *exc: Any) -> Any:
            t0 = _pc()
            try:
                return exit_(ctx, *exc)
            finally:
                if RT.enabled:
                    a[1] += _pc() - t0

        cls.__enter__ = t_enter  # type: ignore[method-assign]
        cls.__exit__ = t_exit  # type: ignore[method-assign]
        self._undo.append(
            lambda: (setattr(cls, "__enter__", enter), setattr(cls, "__exit__", exit_))
        )

    def time_ring(self, stand_in: str | None = None) -> None:
        """Wrap ``RT.write`` (call after the writer is attached). ``stand_in`` (diagnosis
        only, the records are lost): ``"local"`` packs each record into a private buffer
        instead of the shared ring (no lock, no shared memory), ``"noop"`` drops it."""
        from probe.engine.runtime import RT
        from probe.records import RECORD

        write = RT.write
        if stand_in == "local":
            buf = bytearray(64 * 1024)
            pack = RECORD.pack_into
            slot = [0]

            def write(*fields: int) -> bool:
                i = slot[0] = (slot[0] + 1) & 1023
                pack(buf, i * 64, *fields)
                return True

        elif stand_in == "noop":

            def write(*fields: int) -> bool:
                return True

        r = self.ring

        def timed_write(*fields: int) -> bool:
            t0 = _pc()
            ok = write(*fields)
            r[1] += _pc() - t0
            r[0] += 1
            return ok

        RT.write = timed_write

    def unpatch(self) -> None:
        while self._undo:
            self._undo.pop()()

    def timed_factory(self, target: Any) -> Callable[[Callable[..., Any], Any], Any]:
        from probe.engine.runtime import RT

        a = self.acc.setdefault(target.hook_id, [0, 0, 0])
        factory = target.factory

        def make(orig: Callable[..., Any], hook: Any) -> Any:
            @functools.wraps(orig)  # the factory reads the original's signature
            def inner(*args: Any, **kwargs: Any) -> Any:
                if not RT.enabled:
                    return orig(*args, **kwargs)
                t0 = _pc()
                try:
                    return orig(*args, **kwargs)
                finally:
                    a[2] += _pc() - t0

            wrapper = factory(inner, hook)

            @functools.wraps(orig)
            def outer(*args: Any, **kwargs: Any) -> Any:
                if not RT.enabled:
                    return wrapper(*args, **kwargs)
                t0 = _pc()
                try:
                    return wrapper(*args, **kwargs)
                finally:
                    a[1] += _pc() - t0
                    a[0] += 1

            return outer

        return make

    # -- results ------------------------------------------------------------------------

    def reset(self) -> None:
        for v in self.acc.values():
            v[:] = [0, 0, 0]
        self.ring[:] = [0, 0]

    def result(self, steps: int) -> dict[str, Any]:
        """Per hook: calls and self µs per recorded step; totals; the timer floor."""
        steps = max(1, steps)
        floor = floor_ns()
        hooks = {}
        total = calls = 0
        for hid, (n, outer, inner) in sorted(self.acc.items()):
            if not n:
                continue
            own = outer - inner
            if not hid.startswith(EXTRA):
                total += own
                calls += n
            hooks[hid] = {
                "calls_per_step": n / steps,
                "self_us_per_step": own / steps / 1e3,
                "self_ns_per_call": own / n,
            }
        return {
            "steps": steps,
            "hooks": hooks,
            "self_us_per_step": total / steps / 1e3,
            "calls_per_step": calls / steps,
            "timer_floor_ns_per_call": floor,
            "self_minus_floor_us_per_step": (total - calls * floor) / steps / 1e3,
            "ring_writes_per_step": self.ring[0] / steps,
            "ring_ns_per_write": self.ring[1] / self.ring[0] if self.ring[0] else None,
        }


def floor_ns(n: int = 20000) -> float:
    """Self time the two timing layers report around a wrapper that does nothing."""
    st = SelfTime()
    from probe.engine.hooks._base import Target
    from probe.engine.runtime import RT

    def passthrough(orig: Callable[..., Any], hook: Any) -> Callable[..., Any]:
        def w(*args: Any, **kwargs: Any) -> Any:
            return orig(*args, **kwargs)

        return w

    fn = st.timed_factory(Target("floor", "", "", "f", passthrough))(lambda x: x, None)
    was, RT.enabled = RT.enabled, True
    try:
        for i in range(n):
            fn(i)
    finally:
        RT.enabled = was
    calls, outer, inner = st.acc["floor"]
    return (outer - inner) / calls
