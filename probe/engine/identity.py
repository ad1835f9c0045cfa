"""Who this vLLM process is: its role (``api``, ``engine``, ``worker``), its TP/PP/DP ranks
and its model, from the process title, argv and the snapshot (engine side; the control
server's ``status`` reports them, ``probe ps`` shows them).

    >>> ranks_of({}, ["VLLM::Worker_PP1_TP0"])["pp_rank"]
    1
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any


def cmdline(pid: int | str = "self") -> list[str]:
    """The argv of ``pid`` as ``/proc/<pid>/cmdline`` shows it (after ``setproctitle``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


_RANK_IN_TITLE = {"tp_rank": r"_TP(\d+)", "pp_rank": r"_PP(\d+)", "dp_rank": r"_DP(\d+)"}


def ranks_of(snap: Mapping[str, Any], title: Sequence[str]) -> dict[str, int | None]:
    """TP/PP/DP ranks: the snapshot's (written at the first probed step); before that,
    vLLM's parallel state when this process has initialized it, then the process title
    (``VLLM::Worker_PP1_TP0``, ``VLLM::EngineCore_DP2``), so ``probe ps`` shows ranks
    before anything was attached."""
    ranks: dict[str, int | None] = {k: snap.get(k) for k in _RANK_IN_TITLE}
    if all(v is not None for v in ranks.values()):
        return ranks
    live: dict[str, Any] = {}
    if "vllm.distributed.parallel_state" in sys.modules:  # never import vLLM from here
        live = live_ranks()
    text = " ".join(title)
    for key, pattern in _RANK_IN_TITLE.items():
        if ranks[key] is None and isinstance(live.get(key), int):
            ranks[key] = live[key]
        if ranks[key] is None and (m := re.search(pattern, text)):
            ranks[key] = int(m.group(1))
    return ranks


def stack_modules() -> list[str]:
    """The module names on the caller's stack, innermost first."""
    out = []
    f = sys._getframe(1)
    while f is not None:
        out.append(str(f.f_globals.get("__name__", "")))
        f = f.f_back  # type: ignore[assignment]
    return out


def model_from_argv(argv: Sequence[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--model" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--model="):
            return a.split("=", 1)[1]
        if a == "serve" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def model_name(model: str) -> str:
    """The model as the recording keeps it: a Hub id as it is, a local folder by its name
    (the recording machine's directories are not the reader's business).

    >>> model_name("/home/me/models/tinyv32/"), model_name("deepseek-ai/DeepSeek-V3.2")
    ('tinyv32', 'deepseek-ai/DeepSeek-V3.2')
    """
    if model.startswith(("/", "~", "./", "../")):
        return model.rstrip("/").rsplit("/", 1)[-1] or model
    return model


def live_ranks() -> dict[str, Any]:
    """TP/PP/DP ranks from vLLM's parallel state (None where it is not initialized)."""
    out: dict[str, Any] = {}
    try:
        from vllm.distributed import parallel_state as ps

        for key, fn in (
            ("tp_rank", "get_tensor_model_parallel_rank"),
            ("pp_rank", "get_pp_group"),
            ("dp_rank", "get_dp_group"),
        ):
            try:
                v = getattr(ps, fn)()
                out[key] = v if isinstance(v, int) else getattr(v, "rank_in_group", None)
            except Exception:
                out[key] = None
    except Exception:
        pass
    return out
