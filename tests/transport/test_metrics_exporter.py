"""mrc.metrics in process: real connections on ::1, scraped over HTTP and parsed as Prometheus
and OpenMetrics text by prometheus_client's parsers.

What must hold: every counter a connection keeps shows up under its labels with the value the
connection reports; drops are counted where they happen (the endpoint's before any QP is
found, a QP's after); limits' refusals are counted; a closed connection's counters stay (and
the oldest are folded, not lost, beyond ``max_finished``); the HTTP side answers a scraper
and nothing else.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable

import pytest
from metrics_scrape import OPENMETRICS, Scrape, get

import mrc
from mrc import wire
from mrc.errors import MRCError, UsageError
from mrc.metrics import MetricsExporter, serve, serve_metrics

KiB = 1 << 10


async def _scrape(port: int, openmetrics: bool = False) -> Scrape:
    status, _ctype, body = await asyncio.to_thread(
        get, port, "/metrics", OPENMETRICS if openmetrics else None
    )
    assert status == 200, body
    return Scrape.parse(body, openmetrics)


async def _until(port: int, ok: Callable[[Scrape], bool], what: str, limit: float = 10) -> Scrape:
    """Scrape until ``ok(scrape)`` (the counters of datagrams still in a socket queue are
    awaited, not slept for)."""
    deadline = time.monotonic() + limit
    while True:
        s = await _scrape(port)
        if ok(s):
            return s
        assert time.monotonic() < deadline, f"{what} never happened"
        await asyncio.sleep(0.01)


async def test_counters_of_both_sides_drops_and_closed_connections() -> None:
    size = 600 * KiB
    data = os.urandom(size)
    inbox = bytearray(size)
    # no reverse probes: their answers, arriving between a scrape and the reads it is
    # compared with, would change the counters in between
    listener = await mrc.listen(
        "::1", 0, mrc.ListenerConfig(qp=mrc.QPConfig(reverse_probe_interval=0.0))
    )
    listener.register(inbox, name="inbox")
    server = await serve_metrics(listener)
    conn: mrc.Connection | None = None
    peer: mrc.Connection | None = None
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        conn = await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=8))
        server.exporter.watch_connection(conn)
        peer = await listener.accept(timeout=5)
        await conn.write(data, conn.remote["inbox"], 0, imm=1)
        assert await peer.next_immediate(timeout=5) == 1
        rx = {"qp": f"0x{peer.qpn:06x}", "side": "listener"}
        tx = {"qp": f"0x{conn.qpn:06x}", "side": "connect"}

        # forgeries: two too short and one for a QP nobody has (the endpoint's drops), one
        # with a wrong rkey (the QP's)
        region = conn.remote["inbox"]
        bad_rkey = wire.pack_data(peer.qpn, 0, region.addr, region.rkey ^ 1, 8, False, None)
        unknown = wire.pack_data(peer.qpn ^ 0x5A5A5A, 0, region.addr, region.rkey, 8, False, None)
        forger.connect(("::1", listener.port))
        for dgram in (b"", b"\x0a\x00", unknown + bytes(8), bad_rkey + bytes(8)):
            forger.send(dgram)
        s = await _until(
            server.port,
            lambda s: (
                s.total("mrc_qp_dropped_datagrams_total", **rx) >= 1
                and s.total("mrc_endpoint_dropped_datagrams_total") >= 3
            ),
            "counting the forged datagrams",
        )
        assert s.value("mrc_qp_dropped_datagrams_total", reason="bad_rkey", **rx) == 1
        assert s.value("mrc_endpoint_dropped_datagrams_total", reason="short") == 2
        assert s.value("mrc_endpoint_dropped_datagrams_total", reason="unknown_qp") == 1
        received = s.value(
            "mrc_endpoint_received_datagrams_total", endpoint=f"[::1]:{listener.port}"
        )
        assert received == listener.endpoint.core.datagrams_received

        # every QP counter as the connections report them
        for who, side in ((rx, peer), (tx, conn)):
            st = side.stats()
            assert s.value("mrc_qp_placed_bytes_total", **who) == st["bytes_placed"]
            assert s.value("mrc_qp_sent_packets_total", **who) == st["packets_sent"]
            assert s.value("mrc_qp_received_packets_total", **who) == st["packets_received"]
            assert s.value("mrc_qp_sent_acks_total", **who) == st["acks_sent"]
            assert s.value("mrc_qp_received_acks_total", **who) == st["sacks"]
            assert s.value("mrc_qp_retransmits_total", **who) == st["retransmits"]
            assert s.value("mrc_qp_trimmed_packets_total", **who) == st["trims_seen"]
            # EVs by state: every EV of the QP in exactly one state
            assert s.total("mrc_qp_evs", **who) == len(side.ev_report())
        assert s.value("mrc_qp_placed_bytes_total", **rx) == size
        assert s.value("mrc_qp_sent_bytes_total", **tx) == size
        assert s.value("mrc_qp_evs", state="good", **tx) == 8  # the rest wait as backups
        assert s.value("mrc_qp_evs", state="backup", **tx) == len(conn.ev_report()) - 8
        assert s.value("mrc_connections_active") == 2
        assert s.value("mrc_listener_connections") == 1
        assert s.value("mrc_listener_granted_bytes") == 0

        # OpenMetrics, as Prometheus asks for it, says the same
        om = await _scrape(server.port, openmetrics=True)
        assert om.value("mrc_qp_placed_bytes_total", **rx) == size

        # closed: the counters stay (a counter never goes down), the gauges go
        await conn.close()
        await peer.close()
        s = await _scrape(server.port)
        assert s.value("mrc_qp_placed_bytes_total", **rx) == size
        assert s.value("mrc_qp_sent_bytes_total", **tx) == size
        assert s.value("mrc_qp_dropped_datagrams_total", reason="bad_rkey", **rx) == 1
        assert s.value("mrc_connections_finished_total") == 2
        assert s.value("mrc_connections_active") == 0
        assert s.series("mrc_qp_evs") == []
        assert s.value("mrc_listener_connections") == 0
    finally:
        forger.close()
        for c in (conn, peer):
            if c is not None:
                await c.close()
        await server.close()
        await listener.close()


async def test_closed_connections_beyond_max_finished_fold_into_retired() -> None:
    """Series stay bounded on a long-running receiver, and no total is lost: the oldest closed
    connections are summed into one ``qp="retired"`` series per side."""
    listener = await mrc.listen("::1", 0)
    inbox = bytearray(64 * KiB)
    listener.register(inbox, name="inbox")
    exporter = MetricsExporter(max_finished=1)
    exporter.watch_listener(listener)
    try:
        for n in range(1, 4):
            conn = await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=2))
            peer = await listener.accept(timeout=5)
            await conn.write(os.urandom(n * KiB), conn.remote["inbox"], 0, imm=n)
            assert await peer.next_immediate(timeout=5) == n
            await conn.close()
            await peer.close()
        body, ctype = exporter.render()
        assert ctype.startswith("text/plain")
        s = Scrape.parse(body.decode())
        placed = s.series("mrc_qp_placed_bytes_total")
        assert len(placed) == 2  # the last connection's own series and the retired one
        assert s.value("mrc_qp_placed_bytes_total", qp="retired") == (1 + 2) * KiB
        assert s.total("mrc_qp_placed_bytes_total") == (1 + 2 + 3) * KiB
        assert s.value("mrc_connections_finished_total") == 3
    finally:
        await listener.close()


async def test_refusals_by_limit_are_counted() -> None:
    listener = await mrc.listen("::1", 0, mrc.ListenerConfig(max_connections=1))
    server = await serve_metrics(listener)
    first = None
    try:
        first = await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=2))
        with pytest.raises(MRCError, match="too many connections"):
            await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=2))
        s = await _scrape(server.port)
        assert s.value("mrc_listener_refused_total", limit="connections") == 1
        assert s.value("mrc_listener_refused_total", limit="setups") == 0
        assert s.value("mrc_listener_connections") == 1
        # the refused one was never set up: only the first counts as a connection
        assert s.value("mrc_connections_total") == 1
    finally:
        if first is not None:
            await first.close()
        await server.close()
        await listener.close()


async def test_the_http_side_answers_scrapers_and_nothing_else() -> None:
    server = await serve(MetricsExporter(), "::1", 0)
    try:
        status, ctype, body = await asyncio.to_thread(get, server.port)
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        assert "mrc_connections_active 0.0" in body.splitlines()
        status, ctype, body = await asyncio.to_thread(get, server.port, "/", OPENMETRICS)
        assert status == 200 and ctype.startswith("application/openmetrics-text")
        assert body.endswith("# EOF\n")
        status, _ctype, body = await asyncio.to_thread(get, server.port, "/metrics", None, "HEAD")
        assert status == 200 and body == ""
        status, _ctype, _body = await asyncio.to_thread(get, server.port, "/other")
        assert status == 404
        status, _ctype, _body = await asyncio.to_thread(get, server.port, "/metrics", None, "POST")
        assert status == 405
        assert server.scrapes == 3
        # a request head that never ends within the limit is dropped unanswered
        reader, writer = await asyncio.open_connection("::1", server.port)
        writer.write(b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"y" * 9000 + b"\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert server.scrapes == 3
    finally:
        await server.close()


async def test_a_port_in_use_is_a_usage_error() -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as busy:
        busy.bind(("::1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UsageError, match=rf"cannot serve metrics on \[::1\]:{port}: .*in use"):
            await serve(MetricsExporter(), "::1", port)
