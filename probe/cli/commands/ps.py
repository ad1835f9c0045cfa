"""``probe ps``: the armed vLLM processes of this user (from their control sockets).

probe ps                           # every armed process
probe ps --url http://127.0.0.1:8000 --json
probe ps --pid 4242                # that process and its children
probe ps --clean                   # first remove what processes killed while attached left
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from probe.cli.targets import Target, add_target_args, discover, run_dirs


def cmd_ps(args: argparse.Namespace) -> int:
    target = Target.from_args(args)
    if args.clean:
        from probe.reader.discover import clean_run_dir

        socks = rings = 0
        for d in run_dirs(target):
            s, r = clean_run_dir(d)
            socks, rings = socks + s, rings + r
        print(
            f"removed {rings} ring(s) and {socks} control socket(s) of processes that are gone",
            file=sys.stderr,
        )
    procs = discover(target)
    if args.json:
        print(
            json.dumps(
                [
                    {"pid": a.pid, "socket": str(a.socket), "error": a.error, **a.status}
                    for a in procs
                ],
                indent=2,
                default=str,
            )
        )
        return 0
    if not procs:
        print("no armed vLLM process found (is vllm-graph-probe installed in vLLM's environment?)")
        return 1 if (args.url or args.pid) else 0
    print(f"{'PID':>7} {'ROLE':<7} {'RANK':<9} {'VLLM':<8} {'RUNNER':<6} {'ATTACHED':<9} MODEL")
    for a in procs:
        st = a.status
        if a.error:
            print(f"{a.pid:>7} {'?':<7} {'-':<9} error: {a.error}")
            continue
        attached = str(st.get("attached_by")) if st.get("attached_by") else "no"
        print(
            f"{a.pid:>7} {a.role:<7} {a.rank_label:<9} {st.get('vllm_version') or '-':<8} "
            f"{st.get('runner') or '-':<6} {attached:<9} {st.get('model') or '-'}"
        )
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "ps",
        help="list armed vLLM processes (role, rank, model, attached?)",
        description="List the vLLM processes on this host that loaded the probe's plugin "
        "(those of the server at --url, or all under the run directory): pid, role, rank, "
        "model, and whether a reader is attached. A server started before the probe was "
        "installed is not listed: restart it once.",
    )
    add_target_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--clean",
        action="store_true",
        help="first remove the rings and control sockets of processes that are gone "
        "(killed while attached: each ring holds 4 MiB of shared memory)",
    )
    p.set_defaults(func=cmd_ps)
