"""Reshape the installed hooks for a diagnostic variant (benchmark only).

Two questions the per-family ablations leave open:

- ``exclude``: the cost of everything *but* some hooks (a leave-one-out, where "X alone"
  can mislead: without the step bracket most hooks record nothing worth assembling).
  Hook ids or prefixes (``"sync."``, ``"build."``, ``"reorder.mrv2"``) are not installed.
- ``wrap_only``: every hook installed, each body replaced by the plainest compiled
  phase span (two timestamps and one 64-byte record), the step bracket kept. Against
  "all hooks" it splits the cost of wrapping, staging and publishing from the cost of
  what the bodies read.

Patches ``Installer.install_on`` like ``selftime.SelfTime`` (late targets go through it
too, on the first enabled step), so it must stay patched for the whole variant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

KEEP = ("step.v1.execute_model", "step.v1.sample_tokens", "step.mrv2.execute_model",
        "step.mrv2.sample_tokens", "static.")  # fmt: skip


class Reshape:
    def __init__(self, exclude: Iterable[str] = (), wrap_only: bool = False) -> None:
        self.exclude = tuple(exclude)
        self.wrap_only = wrap_only
        self.skipped: list[str] = []
        self.plain: list[str] = []
        self._undo: Callable[[], None] | None = None

    @property
    def active(self) -> bool:
        return bool(self.exclude) or self.wrap_only

    def patch(self) -> None:
        from probe.engine.hooks import step
        from probe.engine.hooks._base import Installer
        from probe.records import Phase

        plain = Installer.install_on
        me = self

        def install_on(inst: Any, target: Any, owner: Any, report: Any = None) -> bool:
            hid = target.hook_id
            if any(hid == e or (e.endswith(".") and hid.startswith(e)) for e in me.exclude):
                me.skipped.append(hid)
                return False
            if me.wrap_only and not hid.startswith(KEEP):
                me.plain.append(hid)
                target = dataclasses.replace(target, factory=step.span(Phase.SYNC_STALL))
            return plain(inst, target, owner, report)

        Installer.install_on = install_on  # type: ignore[method-assign]

        def undo() -> None:
            Installer.install_on = plain  # type: ignore[method-assign]

        self._undo = undo

    def unpatch(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None

    def summary(self) -> dict[str, Any]:
        return {"exclude": list(self.exclude), "skipped": sorted(set(self.skipped)),
                "wrap_only": self.wrap_only, "plain": sorted(set(self.plain))}  # fmt: skip
