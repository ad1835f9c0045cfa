"""``probe env``: every ``PROBE_*`` variable, its value here and what it does."""

from __future__ import annotations

import argparse
from typing import Any

from probe import config


def cmd_env(args: argparse.Namespace) -> int:
    print(config.describe())
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "env",
        help="list PROBE_* environment variables",
        description="List every PROBE_* environment variable the probe reads: its value "
        "here, its default and what it does.",
    )
    p.set_defaults(func=cmd_env)
