"""``probe export``: a finished recording into OTLP, a Prometheus textfile, or Perfetto.

    probe export run.probe.db --otlp http://127.0.0.1:4318
    probe export run.probe.db --otlp 127.0.0.1:4317 --otlp-protocol grpc --sampling 0.1
    probe export run.probe.db --prometheus-textfile /var/lib/node_exporter/probe.prom
    probe export run.probe.db --perfetto run.perfetto-trace
    probe export run.probe.db --openmetrics run.om      # then: promtool tsdb create-blocks-from
    probe export --to list                              # every registered exporter
    probe export run.probe.db --to rocpd --out probe_results.db

Each target needs its extra (``pip install 'vllm-graph-probe[otlp]'`` and so on); a
missing one is named in the error.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any

from probe.commands import open_recording
from probe.errors import UsageError


def _sink_module(name: str) -> Any:
    from exporters.base import MissingExtra, load_sink

    try:
        return load_sink(name)
    except MissingExtra as exc:
        raise UsageError(f"export: {exc}") from None


def _check_out(path: str, flag: str) -> Path:
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"export: {flag} {p} is a directory")
    if not p.parent.exists():
        raise UsageError(f"export: {flag}: directory {p.parent} does not exist")
    return p


def _run_exporter(args: argparse.Namespace) -> int:
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
    rec = open_recording(args.recording)
    try:
        exp.write(rec, args.out)
    except (MissingExtra, FileExistsError, ValueError) as exc:
        raise UsageError(f"export: --to {exp.name}: {exc}") from None
    print(f"probe: {exp.name} -> {args.out}", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.to:
        return _run_exporter(args)
    if not (
        args.otlp or args.prometheus_textfile or args.perfetto or args.openmetrics or args.rocpd
    ):
        raise UsageError(
            "export: give at least one of --otlp, --prometheus-textfile, --perfetto, "
            "--openmetrics, --rocpd, --to"
        )
    if not 0.0 <= args.sampling <= 1.0:
        raise UsageError(f"export: --sampling must be within 0..1, got {args.sampling}")
    textfile = (
        _check_out(args.prometheus_textfile, "--prometheus-textfile")
        if args.prometheus_textfile
        else None
    )
    perfetto_out = _check_out(args.perfetto, "--perfetto") if args.perfetto else None
    rocpd_out = _check_out(args.rocpd, "--rocpd") if args.rocpd else None
    om_out = _check_out(args.openmetrics, "--openmetrics") if args.openmetrics else None
    rec = open_recording(args.recording)
    from exporters.base import replay

    err = sys.stderr
    if om_out is not None:
        from exporters.openmetrics import write as write_openmetrics

        n = write_openmetrics(rec, om_out)
        print(f"probe: {n} timestamped samples -> {om_out}", file=err)
    if textfile is not None:
        prom = _sink_module("prometheus")
        sink = prom.PrometheusSink()
        n = replay(rec, sink)
        prom.write_textfile(sink, textfile)
        print(f"probe: {n} steps -> {textfile}", file=err)
    if args.otlp:
        otlp = _sink_module("otlp")
        # one line at the end says what failed; the SDK's per-batch retry warnings do not
        logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
        try:
            # spans, and metric points at the recording's own time
            w = otlp.write(
                rec, args.otlp, args.otlp_protocol, sampling=args.sampling, timeout_s=args.timeout
            )
        except ValueError as exc:
            raise UsageError(f"export: --otlp {exc}") from None
        if w.spans_failed or w.metric_exports_failed:
            raise UsageError(
                f"export: {args.otlp} refused or did not answer: "
                f"{w.spans_failed} span(s) not exported ({w.spans_exported} exported), "
                f"{w.metric_exports_failed} of {w.metric_exports} metric exports failed"
            )
        print(
            f"probe: {w.steps} steps -> {w.spans_exported} spans and {w.metric_exports} "
            f"metric samples -> {args.otlp} ({args.otlp_protocol})",
            file=err,
        )
    if perfetto_out is not None:
        if importlib.util.find_spec("exporters.perfetto") is None:
            raise UsageError("export: --perfetto is unavailable (no exporters.perfetto module)")
        mod = _sink_module("perfetto")
        write = getattr(mod, "write_recording", None)
        if write is None:
            raise UsageError(
                "export: --perfetto is unavailable (exporters.perfetto has no write_recording)"
            )
        write(rec, perfetto_out)
        print(f"probe: timeline -> {perfetto_out}", file=err)
    if rocpd_out is not None:
        from exporters.rocprof_sidecar import write_sidecar

        try:
            n = write_sidecar(rec, rocpd_out, args.rocpd_version)
        except (ValueError, FileExistsError, OSError) as exc:
            raise UsageError(f"export: --rocpd {rocpd_out}: {exc}") from None
        print(f"probe: {n} spans -> rocpd side-car {rocpd_out}", file=err)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="export a recording: OTLP, Prometheus textfile, Perfetto")
    p.add_argument("recording", nargs="?", help="recording (default: the bundled one)")
    p.add_argument("--otlp", metavar="ENDPOINT", help="OTLP endpoint, e.g. http://127.0.0.1:4318")
    p.add_argument(
        "--otlp-protocol",
        choices=("http/protobuf", "grpc"),
        default="http/protobuf",
        help="OTLP transport",
    )
    p.add_argument(
        "--sampling", type=float, default=1.0, help="share of steps exported as spans (0..1)"
    )
    p.add_argument("--timeout", type=float, default=10.0, help="OTLP export timeout, s")
    p.add_argument("--prometheus-textfile", metavar="PATH", help="write a .prom textfile")
    p.add_argument("--perfetto", metavar="PATH", help="write a Perfetto trace")
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
        "create-blocks-from openmetrics PATH DIR backfills it)",
    )
    p.add_argument("--to", metavar="NAME", help="run one registered exporter ('list': list them)")
    p.add_argument("--out", metavar="TARGET", help="the target of --to (a file or an endpoint)")
    p.set_defaults(func=cmd_export)
