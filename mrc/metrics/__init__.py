"""Metrics: mrc's counters as OpenMetrics / Prometheus text over HTTP.

Watch listeners and connections with a :class:`MetricsExporter`, then :func:`serve` it (or
do both at once with :func:`serve_metrics`)::

    listener = await mrc.listen("::", 4791)
    server = await mrc.metrics.serve_metrics(listener, port=9464)  # http://[::1]:9464/metrics
    ...
    await server.close()

Every counter is read when a scraper asks, never per packet; docs/METRICS.md lists them.
"""

from __future__ import annotations

from mrc.connection import Connection, Listener
from mrc.metrics.exporter import MetricsExporter
from mrc.metrics.http import DEFAULT_HOST, MetricsServer, serve

__all__ = ["DEFAULT_HOST", "MetricsExporter", "MetricsServer", "serve", "serve_metrics"]


async def serve_metrics(
    *sources: Listener | Connection, host: str = DEFAULT_HOST, port: int = 0
) -> MetricsServer:
    """Watch ``sources`` (listeners: every connection they set up; connections: that one)
    with a new :class:`MetricsExporter` and serve it at ``http://[host]:port/metrics``.
    More can be watched later through the server's ``exporter``."""
    exporter = MetricsExporter()
    for source in sources:
        if isinstance(source, Listener):
            exporter.watch_listener(source)
        else:
            exporter.watch_connection(source)
    return await serve(exporter, host, port)
