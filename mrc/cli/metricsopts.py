"""``--metrics-port`` / ``--metrics-addr``: serve a command's counters to Prometheus.

Shared by mrc-recv (every transfer its listener sets up) and mrc-send (its connection). The
metrics package (and prometheus_client with it) is imported only when asked for, so commands
run without it start as fast as before.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mrc.cli.common import int_at_least

if TYPE_CHECKING:
    from mrc.metrics import MetricsServer

DEFAULT_METRICS_ADDR = "::1"


def _port(text: str) -> int:
    port = int_at_least(0)(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"must be a port (0..65535), not {port}")
    return port


def add_metrics_args(p: argparse._ActionsContainer, what: str) -> None:
    p.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="PORT",
        help=f"serve {what} as OpenMetrics / Prometheus text at http://[ADDR]:PORT/metrics "
        "while running (0: any free port, logged with -v); see docs/METRICS.md",
    )
    p.add_argument(
        "--metrics-addr",
        default=DEFAULT_METRICS_ADDR,
        metavar="ADDR",
        help=f"address to serve --metrics-port on (default {DEFAULT_METRICS_ADDR}: this host "
        "only; :: for every address)",
    )


def check_metrics_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.metrics_addr != DEFAULT_METRICS_ADDR and args.metrics_port is None:
        parser.error("--metrics-addr needs --metrics-port")


async def start_metrics(args: argparse.Namespace) -> MetricsServer | None:
    """The metrics server ``--metrics-port`` asks for (None without it): watching nothing
    yet (the caller adds its listener or connection to ``server.exporter``). A port in use is
    a one-line usage error (exit status 2)."""
    if args.metrics_port is None:
        return None
    from mrc.metrics import MetricsExporter, serve

    return await serve(MetricsExporter(), args.metrics_addr.strip("[]"), args.metrics_port)
