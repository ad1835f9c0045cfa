"""What the commands that read rings as they fill (``record``, ``attach``, ``top``,
``agent``) share: ``--sample`` and the live exporter sinks (``--prometheus``, ``--otlp``)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from probe.cli.commands import positive_int
from probe.errors import UsageError


def add_sample_arg(p: argparse.ArgumentParser) -> None:
    """``--sample N``."""
    p.add_argument(
        "--sample",
        type=positive_int,
        default=1,
        metavar="N",
        help="record one engine step in N (the probe's cost per step divides by about N)",
    )


def sample_every(n: int | None) -> int:
    """The value of ``--sample``, checked (None: every step)."""
    if n is None:
        return 1
    if n < 1:
        raise UsageError(f"--sample must be 1 or more (got {n})")
    return int(n)


def hook_families(text: str | None) -> list[str] | None:
    """``--hooks a,b``: the hook families named, each one the hook table knows; ``None``
    (every family) when not given."""
    if not text:
        return None
    hooks = [h.strip() for h in text.split(",")]
    from probe.engine import hooks as hook_table

    unknown = sorted(set(hooks) - set(hook_table.FAMILIES))
    if unknown:
        raise UsageError(
            f"--hooks: unknown hook families {unknown}; known: {', '.join(hook_table.FAMILIES)}"
        )
    return hooks


def exporter_sink(module: str, flag: str, arg: str, sample_every: int = 1) -> Any:
    """``exporters.<module>.make_sink(arg)``, or a UsageError naming what is missing. Under
    ``--sample N`` (``sample_every`` > 1) the sink is told, so its rates and totals estimate
    every step and say they are sampled (the sink's ``sampled(N)``, as the agent does)."""
    try:
        mod = importlib.import_module(f"exporters.{module}")
    except ImportError as exc:
        raise UsageError(
            f"{flag}: exporters.{module} is not available ({exc}); install the "
            f"'{module}' extra: pip install 'vllm-graph-probe[{module}]'"
        ) from None
    make = getattr(mod, "make_sink", None)
    if make is None:
        raise UsageError(f"{flag}: exporters.{module} has no make_sink(); update vllm-graph-probe")
    try:
        sink = make(arg)
    except (ValueError, OSError) as exc:
        raise UsageError(f"{flag} {arg}: {exc}") from None
    sampled = getattr(sink, "sampled", None)
    if sampled is not None and sample_every > 1:
        sampled(sample_every)
    return sink
