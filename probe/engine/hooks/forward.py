"""What a forward launch is: the one question the step bracket and the replay family share.

:func:`launches` tells whether a model's FULL ``CUDAGraphWrapper`` carries the replay
family's hook, so that hook is the step's forward launch. The step family asks it for its
late targets; the replay family installs the hook it looks for.
"""

from __future__ import annotations

import inspect
from typing import Any

from probe.engine.hooks import dispatch

__all__ = ["launches"]


def launches(model: Any) -> bool:
    """Whether ``model`` (V1's ``runner.model``) is a FULL ``CUDAGraphWrapper`` whose
    ``__call__`` is this family's hook: then that hook is the target's forward launch (a
    step's model call with no forward open) and ``_model_forward`` needs none of its own."""
    call = inspect.getattr_static(type(model), "__call__", None)
    full = dispatch._mode_members()[0]
    return (
        getattr(call, "__probe_hook__", None) == "replay.wrapper"
        and full is not None
        and getattr(model, "runtime_mode", None) is full
    )
