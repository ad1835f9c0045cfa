"""``probe attach``: turn the probe on in a running ``vllm serve``, watch, turn it off.

    probe attach --url http://127.0.0.1:8000                      # live view until Ctrl-C
    probe attach --url http://127.0.0.1:8000 --duration 60 --record run.probe --no-live
    probe attach --pid 4242 --prometheus 127.0.0.1:9464 --otlp http://127.0.0.1:4318

It asks every armed process of the server (``probe ps``) to enable its hooks, reads their
rings, and on exit (Ctrl-C, ``--duration``, the server going away) disables everything it
enabled; how, and how it keeps up on a busy host: :mod:`probe.cli.attach_session`.
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


def cmd_attach(args: argparse.Namespace) -> int:
    take_share(args.session_nice, args.cmd)
    opts = SessionOptions.from_args(args, no_live=args.no_live)
    rc = run_session(opts, title="probe attach", live_default=not args.no_live)
    # the recording, rings and sockets are closed by now; an exporter may still have
    # work for the interpreter's exit (its threads, atexit), so only without one
    args.exit_at_once = not (opts.prometheus or opts.otlp)
    return rc


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "attach",
        help="enable the probe in a running vLLM server and watch it",
        description="Enable the probe in a running vLLM server (no restart) for --duration "
        "seconds or until Ctrl-C, show its steps live, optionally record them (--record) or "
        "serve them to Prometheus/OTLP, then detach: the hooks go dormant again.",
    )
    add_session_args(p)
    p.add_argument("--record", metavar="FILE", help="also write a recording")
    p.add_argument("--force", action="store_true", help="overwrite --record")
    p.add_argument("--no-live", action="store_true", help="no live view (a summary at the end)")
    add_share_arg(p)
    p.set_defaults(func=cmd_attach)
