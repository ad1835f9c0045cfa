"""``probe top``: the live view of a running ``vllm serve``, per rank (``probe attach``
without a recording). In a terminal it redraws in place; otherwise it prints plain lines
every few seconds. It takes the same CPU share as ``probe attach`` (``--session-nice``,
:mod:`probe.reader.session`).

    probe top --url http://127.0.0.1:8000
    probe top --url http://127.0.0.1:8000 --record top.probe   # and keep what it saw
"""

from __future__ import annotations

import argparse
from typing import Any

from probe.cli.attach_session import (
    SessionOptions,
    add_session_args,
    add_share_arg,
    run_session,
    take_share,
)


def cmd_top(args: argparse.Namespace) -> int:
    take_share(args.session_nice, args.cmd)
    opts = SessionOptions.from_args(args, no_live=False)
    return run_session(opts, title="probe top", live_default=True)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "top",
        help="live per-rank view of a running vLLM server",
        description="Enable the probe in a running vLLM server (no restart) and show its "
        "steps live, one row per rank: graph modes, miss reasons, CPU launch overhead. In a "
        "terminal it redraws in place, otherwise it prints plain lines every few seconds; "
        "Ctrl-C detaches and the hooks go dormant again.",
    )
    add_session_args(p)
    p.add_argument("--record", metavar="FILE", help="also write a recording of what it shows")
    p.add_argument("--force", action="store_true", help="overwrite --record")
    add_share_arg(p)
    p.set_defaults(func=cmd_top)
