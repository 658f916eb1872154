"""Serving an exporter's metrics over HTTP from the event loop itself.

prometheus_client's own server runs in a thread; here the counters belong to objects the event
loop mutates, so scrapes are answered on the loop instead: each one is a consistent snapshot,
taken between two packets, with no lock on any packet path. The server speaks just enough
HTTP/1.1 for a scraper (``GET`` or ``HEAD`` of ``/metrics`` or ``/``, one request per
connection) and bounds what a client can make it hold: a request head of at most 8 KiB, read
within 5 seconds, and at most 16 scrapes being answered at once (more are closed unanswered).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket

from mrc.errors import MRCError, UsageError
from mrc.metrics.exporter import MetricsExporter

log = logging.getLogger(__name__)

#: where metrics are served unless told otherwise: this host only
DEFAULT_HOST = "::1"
MAX_HEAD = 8192
REQUEST_TIMEOUT = 5.0
MAX_CLIENTS = 16
PATHS = ("/metrics", "/")


class MetricsServer:
    """A running metrics endpoint (from :meth:`serve`/:func:`serve_metrics`); ``close()``
    stops it. ``url`` is where to scrape it."""

    def __init__(self, exporter: MetricsExporter, server: asyncio.Server) -> None:
        self.exporter = exporter
        self.server = server
        self.scrapes = 0  # scrapes answered (200) so far
        self._clients = 0

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.sockets[0].getsockname()[:2]
        return host, port

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"

    async def close(self) -> None:
        self.server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.server.wait_closed(), 1.0)

    async def __aenter__(self) -> MetricsServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._clients >= MAX_CLIENTS:
            writer.close()
            return
        self._clients += 1
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
                status, body, ctype = self._answer(head)
                writer.write(_response(status, body, ctype, head.startswith(b"HEAD ")))
                await writer.drain()
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
            TimeoutError,
            ConnectionError,
        ):
            pass  # a client that hung up, sent junk or dawdled: nothing to answer
        finally:
            self._clients -= 1
            writer.close()

    def _answer(self, head: bytes) -> tuple[str, bytes, str]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "400 Bad Request", b"bad request\n", "text/plain"
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", b"only GET and HEAD\n", "text/plain"
        if target.split("?", 1)[0] not in PATHS:
            return "404 Not Found", b"metrics are at /metrics\n", "text/plain"
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        body, ctype = self.exporter.render(accept)
        self.scrapes += 1
        return "200 OK", body, ctype


def _response(status: str, body: bytes, ctype: str, head_only: bool) -> bytes:
    header = (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1")
    return header if head_only else header + body


async def serve(
    exporter: MetricsExporter, host: str = DEFAULT_HOST, port: int = 0
) -> MetricsServer:
    """Serve ``exporter`` at ``http://[host]:port/metrics`` (port 0: any free port; see
    ``MetricsServer.port``). A port already in use, or an address that is not this host's,
    raises :class:`~mrc.errors.UsageError` with one line: the caller chose them."""
    holder: list[MetricsServer] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await holder[0]._handle(r, w)

    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        server = await asyncio.start_server(handler, host, port, limit=MAX_HEAD, reuse_address=True)
    except socket.gaierror as exc:
        raise UsageError(f"cannot serve metrics on {where}: {exc.strerror}") from None
    except OSError as exc:
        # (asyncio words its bind errors as a sentence around the address; say it once)
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise UsageError(f"cannot serve metrics on {where}: {why}") from None
        raise MRCError(f"cannot serve metrics on {where}: {why}") from None
    holder.append(MetricsServer(exporter, server))
    log.info("serving metrics at %s", holder[0].url)
    return holder[0]
