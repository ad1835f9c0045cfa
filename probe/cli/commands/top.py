"""``probe top``: the live view of a running ``vllm serve``, per rank (``probe attach``
without a recording). In a terminal it redraws in place; otherwise it prints plain lines
every few seconds. It takes the same CPU share as ``probe attach`` (``--session-nice``,
:mod:`probe.reader.session`).

    probe top --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from typing import Any


def cmd_top(args: argparse.Namespace) -> int:
    from probe.cli.commands.attach import run_session, take_share

    take_share(args)
    args.record = None
    args.no_live = False
    return run_session(args, title="probe top", live_default=True)


def add_parser(sub: Any) -> None:
    from probe.cli.commands.attach import add_session_args, add_share_arg

    p = sub.add_parser("top", help="live per-rank view of a running vLLM server")
    add_session_args(p)
    add_share_arg(p)
    p.set_defaults(func=cmd_top)
