"""The command-line flags of metrics and tracing every server shares (servers/METRICS.md), so the
gateway, the on-prem server and `python -m conformance serve` take the same names."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from arctic_sdk import tracing

from ..protocol.config import parse_tokens

__all__ = ["add_observability_arguments", "observability_from_args"]


def add_observability_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("metrics and tracing (servers/METRICS.md)")
    g.add_argument("--metrics-port", type=int, default=None,
                   help="also serve /metrics, without auth, on this port (0 = a free port) of "
                   "--metrics-host: for a network only the operator reaches")  # fmt: skip
    g.add_argument("--metrics-host", default="127.0.0.1", help="the --metrics-port listener's host")
    g.add_argument("--metrics-token-file", type=Path, default=None,
                   help="operator tokens for /metrics on the main listener, one a line: a "
                   "token or sha256:<hex> (a server with tokens serves /metrics to these "
                   "only)")  # fmt: skip
    g.add_argument("--tracing", action="store_true",
                   help="OpenTelemetry spans (the otel extra; exporter from OTEL_* variables; "
                   "ARCTIC_TRACING=1 does the same); workers inherit it")  # fmt: skip


def observability_from_args(args: argparse.Namespace, service_name: str) -> dict[str, Any]:
    """The `ProtocolConfig` fields the flags give; `--tracing` turns tracing on (here and in the
    workers this server starts)."""
    if args.tracing:
        os.environ[tracing.ENV] = "1"
        os.environ.setdefault("OTEL_SERVICE_NAME", service_name)
        tracing.enable(setup=True, service_name=service_name)
    digests: frozenset[str] = frozenset()
    if args.metrics_token_file is not None:
        digests = parse_tokens(args.metrics_token_file.read_text().splitlines())
    return {
        "metrics_port": args.metrics_port,
        "metrics_host": args.metrics_host,
        "metrics_token_sha256": digests,
    }
