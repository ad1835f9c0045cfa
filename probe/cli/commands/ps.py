"""``probe ps``: the armed vLLM processes of this user (from their control sockets).

probe ps                           # every armed process
probe ps --url http://127.0.0.1:8000 --json
probe ps --pid 4242                # that process and its children
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from probe.cli.commands import process_id
from probe.errors import UsageError


def run_dir(args: argparse.Namespace) -> Path:
    from probe.ring_dir import UnsafeRingDirError, default_ring_dir

    try:
        if getattr(args, "run_dir", None):
            from probe.ring_dir import check_ring_dir

            return check_ring_dir(args.run_dir)
        return default_ring_dir()
    except (UnsafeRingDirError, FileNotFoundError, NotADirectoryError) as exc:
        raise UsageError(str(exc)) from None


def run_dirs(args: argparse.Namespace) -> list[Path]:
    """``--run-dir``, or every safe place a server of ours may have its socket in (the
    shared default and the fallbacks a server uses when that one is not safe)."""
    if getattr(args, "run_dir", None):
        return [run_dir(args)]
    from probe.ring_dir import candidate_run_dirs

    return candidate_run_dirs() or [run_dir(args)]


def discover(args: argparse.Namespace) -> list[Any]:
    from probe.reader.discover import DiscoveryError, find_processes

    out: dict[int, Any] = {}
    try:
        for d in run_dirs(args):
            for a in find_processes(
                d,
                pids=[args.pid] if getattr(args, "pid", None) else None,
                url=getattr(args, "url", None),
            ):
                out.setdefault(a.pid, a)
    except DiscoveryError as exc:
        raise UsageError(str(exc)) from None
    return list(out.values())


def add_target_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--url", help="the server's URL: its listening process and children")
    g.add_argument("--pid", type=process_id, help="a process id: it and its children")
    p.add_argument("--run-dir", help="where the control sockets are (default: PROBE_RUN_DIR)")


def cmd_ps(args: argparse.Namespace) -> int:
    procs = discover(args)
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
    p = sub.add_parser("ps", help="list armed vLLM processes (role, rank, model, attached?)")
    add_target_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_ps)
