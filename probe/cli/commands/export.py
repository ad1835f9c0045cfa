"""``probe export``: a finished recording into OTLP, a Prometheus textfile, or Perfetto.

    probe export run.probe --otlp http://127.0.0.1:4318
    probe export run.probe --otlp 127.0.0.1:4317 --otlp-protocol grpc --sampling 0.1
    probe export run.probe --prometheus-textfile /var/lib/node_exporter/probe.prom
    probe export run.probe --perfetto run.perfetto-trace
    probe export run.probe --openmetrics run.om      # then: promtool tsdb create-blocks-from
    probe export run.probe --rocpd probe_results.db  # a rocpd side-car
    probe export run.probe --parquet pq/             # Parquet, by host and day
    probe export 'ranks/*.probe' --perfetto all.pftrace  # several recordings as one
    probe export --to list                              # every registered exporter
    probe export run.probe --to rocpd --out probe_results.db

Several recordings (or a glob) are read as one: their processes side by side, their
steps in (pid, step) order (:class:`probe.reader.recording_set.RecordingSet`). Each target needs its
extra (``pip install 'vllm-graph-probe[otlp]'`` and so on); a missing one is named in the
error.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from probe.cli import progress
from probe.cli.commands import endpoint, open_recording, positive_float
from probe.errors import RuntimeFailure, UsageError
from probe.reader.output import Outputs, check_target, path_for, together, write_bytes


def _sink_module(name: str) -> Any:
    from exporters.base import MissingExtra, load_sink

    try:
        return load_sink(name)
    except MissingExtra as exc:
        raise UsageError(f"export: {exc}") from None


def check_reachable(endpoint: str, protocol: str, timeout_s: float) -> None:
    """Fail fast: a TCP connection to the endpoint within ``timeout_s``, or one error line.

    The OTLP exporters retry a refused or silent endpoint with backoff for much longer
    than their timeout; this check makes ``--timeout`` the bound a user sees.
    """
    from urllib.parse import urlsplit

    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    parts = urlsplit(url)
    default = 4317 if protocol == "grpc" else (443 if parts.scheme == "https" else 4318)
    host, port = parts.hostname or "localhost", parts.port or default
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise RuntimeFailure(
            f"export: --otlp {endpoint}: cannot connect to {host}:{port} "
            f"within --timeout {timeout_s:g} s ({why}); nothing exported"
        ) from None


def _run_exporter(args: argparse.Namespace) -> int:
    """``--to NAME --out TARGET``: the same guarded path as the named flags (the target
    checked first, written through :func:`probe.reader.output.path_for`, ``--force`` to replace,
    ``-`` for stdout where the format can stream); ``--to otlp`` is ``--otlp TARGET``."""
    from exporters import registry
    from exporters.base import MissingExtra

    if args.to == "list":
        print(registry.listing())
        return 0
    try:
        exp = registry.get(args.to)
    except registry.UnknownExporter as exc:
        raise UsageError(f"export: --to: {exc}") from None
    if not args.out:
        raise UsageError(f"export: --to {exp.name} needs --out {exp.target}")
    if exp.name in ("otlp", "perfetto", "openmetrics", "rocpd") or (
        exp.name == "prometheus" and exp.module == "exporters.prometheus"
    ):
        if exp.target == "FILE":  # named by the flag the user gave
            check_target(args.out, force=args.force, flag="--out")
        named = "prometheus_textfile" if exp.name == "prometheus" else exp.name
        setattr(args, named, args.out)
        if exp.name == "otlp":
            args.otlp = endpoint(args.out)
        args.to = None
        return _export(args)
    if exp.target != "FILE":
        raise UsageError(
            f"export: --to {exp.name}: its target is {exp.target}, not a file; "
            "run it from Python (exporters.registry)"
        )
    out = check_target(args.out, force=args.force, flag="--out")
    if out is None and not exp.streams:
        raise UsageError(f"export: --to {exp.name} writes a database file; - (stdout) is not one")
    rec = _open(args.recording)
    with progress.display_for(args.progress, plain=out is None) as bars:
        bars.section(exp.name)
        if not exp.reports_progress:
            bars.stage("writing", None, "")
        try:
            with path_for(out, create=False) as tmp:
                exp.write(rec, os.fspath(tmp), bars)
        except (MissingExtra, FileExistsError, ValueError) as exc:
            raise UsageError(f"export: --to {exp.name}: {exc}") from None
    print(f"probe: {exp.name} -> {out or 'standard output'}", file=sys.stderr)
    return 0


def _open(names: list[str] | None) -> Any:
    """The recordings named (globs expanded), one or several read as one; none: the
    bundled one."""
    if not names:
        return open_recording(None)
    from probe.reader.recording import RecordingError
    from probe.reader.recording_set import open_many

    try:
        return open_many(names)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None


def _write_db(target: Path, write: Any) -> Any:
    """``write(path)`` makes a new database file, in a private folder next to the target,
    renamed onto it: nothing partial is left, no planted name is used, and a full or
    read-only disk is one line (:func:`probe.reader.output.path_for`)."""
    with path_for(target, create=False) as tmp:
        return write(tmp)


def cmd_export(args: argparse.Namespace) -> int:
    from probe.reader.recording import RecordingError

    try:
        return _export(args)
    except RecordingError as exc:  # a damaged row met while writing: nothing is left
        raise UsageError(str(exc)) from None


def _export(args: argparse.Namespace) -> int:
    if args.to:
        return _run_exporter(args)
    if not (
        args.otlp
        or args.prometheus_textfile
        or args.perfetto
        or args.openmetrics
        or args.rocpd
        or args.parquet
    ):
        raise UsageError(
            "export: give at least one of --otlp, --prometheus-textfile, --perfetto, "
            "--openmetrics, --rocpd, --parquet, --to"
        )
    if not 0.0 <= args.sampling <= 1.0:
        raise UsageError(f"export: --sampling must be within 0..1, got {args.sampling}")
    # None: standard output (-)
    textfile: Path | None = None
    perfetto_out: Path | None = None
    if args.prometheus_textfile:
        textfile = check_target(
            args.prometheus_textfile, force=args.force, flag="--prometheus-textfile"
        )
    if args.perfetto:
        perfetto_out = check_target(args.perfetto, force=args.force, flag="--perfetto")
    om_out: Path | None = None
    rocpd_out: Path | None = None
    if args.openmetrics:
        om_out = check_target(args.openmetrics, force=args.force, flag="--openmetrics")
    if args.rocpd:
        if args.rocpd == "-":
            raise UsageError("export: --rocpd writes a database file; - (stdout) is not one")
        rocpd_out = check_target(args.rocpd, force=args.force, flag="--rocpd")
    dashes = [a for a in (args.prometheus_textfile, args.perfetto, args.openmetrics) if a == "-"]
    if len(dashes) > 1:
        raise UsageError(
            "export: only one of --prometheus-textfile, --perfetto and --openmetrics can be -"
        )
    if args.parquet:
        if args.parquet == "-":
            raise UsageError("export: --parquet writes a folder; - (stdout) is not one")
        if Path(args.parquet).exists() and not Path(args.parquet).is_dir():
            raise UsageError(f"export: --parquet {args.parquet}: not a folder")
        _sink_module("parquet")  # a missing extra is named before anything is read
    rec = _open(args.recording)
    with progress.display_for(args.progress, plain=bool(dashes)) as bars:
        # every output or none: renamed onto their targets once all are written
        with together() as outs:
            _write_targets(args, rec, bars, outs, textfile, perfetto_out, om_out, rocpd_out)
        for line in outs.lines:
            bars.echo(line)
    return 0


def _write_targets(
    args: argparse.Namespace,
    rec: Any,
    bars: progress.Display,
    outs: Outputs,
    textfile: Path | None,
    perfetto_out: Path | None,
    om_out: Path | None,
    rocpd_out: Path | None,
) -> None:

    say = outs.lines.append
    if args.otlp:
        _sink_module("otlp")  # a missing extra is named before anything else
        check_reachable(args.otlp, args.otlp_protocol, args.timeout)
    if args.openmetrics:
        from exporters.openmetrics import write as write_openmetrics

        bars.section("openmetrics")
        with path_for(om_out) as tmp:
            n = write_openmetrics(rec, tmp, progress=bars)
        say(f"probe: {n} timestamped samples -> {om_out or 'standard output'}")
    if args.prometheus_textfile:
        prom = _sink_module("prometheus")
        bars.section("prometheus textfile")
        sink, n = prom.replayed(rec, progress=bars)
        write_bytes(textfile, sink.exposition())
        say(f"probe: {n:,} engine steps -> {textfile or 'standard output'}")
    if args.otlp:
        otlp = _sink_module("otlp")
        # one line at the end says what failed; the SDK's per-batch retry warnings do not
        logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
        bars.section("otlp")
        try:
            # spans, and metric points at the recording's own time
            w = otlp.write(
                rec,
                args.otlp,
                args.otlp_protocol,
                sampling=args.sampling,
                timeout_s=args.timeout,
                progress=bars,
            )
        except ValueError as exc:
            raise UsageError(f"export: --otlp {exc}") from None
        if w.spans_failed or w.metric_exports_failed:
            raise RuntimeFailure(
                f"export: {args.otlp} refused or did not answer: "
                f"{w.spans_failed} span(s) not exported ({w.spans_exported} exported), "
                f"{w.metric_exports_failed} of {w.metric_exports} metric exports failed"
            )
        outs.left(f"--otlp {args.otlp} (sent)")
        say(
            f"probe: {w.steps:,} engine steps -> {w.spans_exported:,} spans and "
            f"{w.metric_exports:,} metric samples -> {args.otlp} ({args.otlp_protocol})"
        )
    if args.perfetto:
        if importlib.util.find_spec("exporters.perfetto") is None:
            raise UsageError("export: --perfetto is unavailable (no exporters.perfetto module)")
        mod = _sink_module("perfetto")
        write = getattr(mod, "write_recording", None)
        if write is None:
            raise UsageError(
                "export: --perfetto is unavailable (exporters.perfetto has no write_recording)"
            )
        protos = getattr(mod, "protos", None)
        if protos is not None:  # the extra's library, before anything is written
            from exporters.base import MissingExtra

            try:
                protos()
            except MissingExtra as exc:
                raise UsageError(f"export: {exc}") from None
        bars.section("perfetto")
        with path_for(perfetto_out) as tmp:
            write(rec, tmp, progress=bars)
        say(f"probe: timeline -> {perfetto_out or 'standard output'}")
    if rocpd_out is not None:
        from exporters.rocprof_sidecar import write_sidecar

        bars.section("rocpd")
        try:
            n = _write_db(
                rocpd_out, lambda p: write_sidecar(rec, p, args.rocpd_version, progress=bars)
            )
        except (ValueError, FileExistsError) as exc:
            raise UsageError(f"export: --rocpd {rocpd_out}: {exc}") from None
        say(f"probe: {n} spans -> rocpd side-car {rocpd_out}")
    if args.parquet:
        pq = _sink_module("parquet")
        bars.section("parquet")
        try:
            n = pq.write(rec, args.parquet, progress=bars, force=args.force)
        except (FileExistsError, ValueError) as exc:
            raise UsageError(f"export: --parquet {args.parquet}: {exc}") from None
        except OSError as exc:
            raise RuntimeFailure(f"export: --parquet {args.parquet}: {exc}") from None
        outs.left(f"--parquet {args.parquet}")
        say(f"probe: {n} rows -> Parquet in {args.parquet}")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="export a recording: OTLP, Prometheus textfile, Perfetto",
        description="Write a recording (or several as one) into other tools' formats: the "
        "metric set as a Prometheus textfile or OpenMetrics, spans and metrics over OTLP, "
        "a Perfetto timeline, an AMD rocpd side-car, Parquet. Every writer streams.",
    )
    p.add_argument(
        "recording",
        nargs="*",
        help="recordings or globs, read as one (default: the bundled recording)",
    )
    p.add_argument(
        "--otlp",
        metavar="ENDPOINT",
        type=endpoint,
        help="OTLP endpoint, e.g. http://127.0.0.1:4318",
    )
    p.add_argument(
        "--otlp-protocol",
        choices=("http/protobuf", "grpc"),
        default="http/protobuf",
        help="OTLP transport",
    )
    p.add_argument(
        "--sampling", type=float, default=1.0, help="share of steps exported as spans (0..1)"
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=10.0,
        help="OTLP: connect and export within S seconds, else fail",
    )
    p.add_argument(
        "--prometheus-textfile", metavar="PATH", help="write a .prom textfile (-: stdout)"
    )
    p.add_argument("--perfetto", metavar="PATH", help="write a Perfetto trace (-: stdout)")
    p.add_argument("--rocpd", metavar="PATH", help="write a rocpd side-car database (.db)")
    p.add_argument(
        "--rocpd-version",
        default="3",
        help="rocpd schema version of --rocpd (default: %(default)s, ROCm 7.0's)",
    )
    p.add_argument(
        "--openmetrics",
        metavar="PATH",
        help="write OpenMetrics with the recording's timestamps (promtool tsdb "
        "create-blocks-from openmetrics PATH DIR backfills it; -: stdout)",
    )
    p.add_argument(
        "--parquet",
        metavar="DIR",
        help="write the tables as Parquet under DIR/<table>/host=<host>/date=<day>/",
    )
    p.add_argument("--to", metavar="NAME", help="run one registered exporter ('list': list them)")
    p.add_argument("--out", metavar="TARGET", help="the target of --to (a file or an endpoint)")
    p.add_argument("--force", action="store_true", help="overwrite existing output files")
    progress.add_flag(p, "steps done of the total, per exporter")
    p.set_defaults(func=cmd_export)
