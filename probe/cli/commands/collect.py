"""``probe collect``: the reader alone, for rings some other process armed.

PROBE_ENABLE=1 PROBE_RUN_DIR=/dev/shm/run1 vllm serve MODEL &
probe collect --run-dir /dev/shm/run1 --out run.probe
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probe import config
from probe.cli import progress
from probe.cli.commands import boottime_ns, positive_float, probe_version, storage_guard
from probe.engine.identity import model_name
from probe.errors import RuntimeFailure, UsageError

if TYPE_CHECKING:
    from probe.reader.collector import ProcessState


def cmd_collect(args: argparse.Namespace) -> int:
    """Reader only: record the rings in --run-dir until their writers have exited."""
    from probe.reader.collector import Collector, RecordingSink
    from probe.reader.recording_target import new_writer

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"collect: --run-dir {run_dir} is not a directory")
    writer = new_writer(args.out, force=args.force, flag="--out", who="collect")
    out = writer.path
    writer.set_meta(
        command=["probe", *(model_name(a) if a.startswith("/") else a for a in sys.argv[1:])],
        host=socket.gethostname(),
        probe_version=probe_version(),
        started_epoch_ns=time.time_ns(),
    )
    col = Collector(run_dir, [RecordingSink(writer)], now_ns=boottime_ns)
    config.lower_reader_priority()
    stop = {"now": False}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    seen_writer = False
    failed: str | None = None
    junk_since: float | None = None  # when rings were found and none could be read
    try:
        with progress.display_for(args.progress, bar=False) as status:
            status.stage(f"collect: waiting for rings in {run_dir}", None, "")
            while not stop["now"] and failed is None:
                failed = storage_guard(col.poll, out)
                alive = [p for p in col.procs.values() if p.reader.writer_alive()]
                if status.on:
                    status.describe(status_line(col.procs.values(), len(alive)))
                seen_writer = seen_writer or bool(col.procs)
                if seen_writer and not alive:
                    failed = failed or storage_guard(col.poll, out)
                    break
                # ring files none of which opens: a writer that was starting would have
                # made its ring readable within JUNK_WAIT_S; these never will
                if col.skipped and not col.procs:
                    junk_since = junk_since or time.monotonic()
                    if time.monotonic() - junk_since > JUNK_WAIT_S:
                        break
                else:
                    junk_since = None
                time.sleep(args.interval)
    finally:

        def finish() -> None:
            writer.set_meta(ended_epoch_ns=time.time_ns())
            col.close()

        failed = failed or storage_guard(finish, out)
    if failed is not None:
        print(f"probe: error: {failed}; what was committed before is readable", file=sys.stderr)
        return 1
    skipped = "; ".join(
        f"{p.name} ({why.removeprefix(f'{p}: ')})" for p, why in sorted(col.skipped.items())
    )
    if col.skipped and not col.procs:
        for suffix in ("", "-wal", "-shm", "-journal"):  # nothing was recorded: no recording
            Path(f"{out}{suffix}").unlink(missing_ok=True)
        raise RuntimeFailure(f"collect: no readable ring in {run_dir}; skipped {skipped}")
    if col.skipped:
        print(f"probe: warning: collect: skipped {skipped}", file=sys.stderr)
    return 0


#: how long ring files that cannot be read, and no other, are waited on
JUNK_WAIT_S = 2.0


def status_line(procs: Iterable[ProcessState], alive: int) -> str:
    """``collect: 1,204 steps · 2 processes (2 running) · 0 dropped``."""
    ps = list(procs)
    steps = sum(p.steps_seen for p in ps)
    dropped = sum(p.dropped for p in ps)
    return (
        f"collect: {steps:,} steps · {len(ps)} process{'es' if len(ps) != 1 else ''} "
        f"({alive} running) · {dropped:,} dropped"
    )


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "collect",
        help="read the rings of a run directory into a recording",
        description="Read what the rings of a run directory still hold (the processes "
        "of a run that wrote them, alive or ended) into one recording file (--out).",
    )
    c.add_argument("--run-dir", required=True, help="the directory the rings are in")
    c.add_argument(
        "--out", "-o", required=True,
        help="recording to write: NAME.probe (columnar), or NAME.probe.db (SQLite)",
    )  # fmt: skip
    c.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    c.add_argument("--interval", type=positive_float, default=0.05, help="ring poll interval, s")
    progress.add_flag(c, "steps, processes, drops, elapsed")
    c.set_defaults(func=cmd_collect)
