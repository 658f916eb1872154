"""ECN in the transport: EV sockets send ECT(0); a receiver turns CE datagrams into FECN, counts
them (``ce_received``) and the core's BECN echo reaches the sender (``ecn_echoes``).

On loopback nothing marks CE, so the sender's EV sockets are set to send CE themselves (the
traffic class a congested fabric port would have rewritten): the receive path cannot tell.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from typing import Any

import pytest

import mrc
from mrc.core.config import QPConfig
from mrc.transport import ecn, gso
from mrc.transport.sockets import ev_socket

HOST = "::1"


def test_ev_sockets_send_ect0() -> None:
    """What an EV socket sends carries ECT(0) and DSCP 0, as a receiver's cmsg shows."""
    rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    rx.bind((HOST, 0))
    rx.settimeout(2)
    try:
        assert ecn.enable_recv(rx)
        tx = ev_socket(HOST, (HOST, rx.getsockname()[1]))
        try:
            tx.send(b"x" * 40)
            _data, anc, _flags, _addr = rx.recvmsg(100, ecn.CMSG_SPACE)
        finally:
            tx.close()
    finally:
        rx.close()
    tclass = [int.from_bytes(d, "little") for lv, k, d in anc if k == ecn.IPV6_TCLASS]
    assert tclass == [ecn.ECT0], anc
    assert ecn.is_ce(socket.IPPROTO_IPV6, ecn.IPV6_TCLASS, (ecn.CE).to_bytes(4, "little"))
    assert not ecn.is_ce(socket.IPPROTO_IPV6, ecn.IPV6_TCLASS, (ecn.ECT0).to_bytes(4, "little"))
    assert ecn.is_ce(socket.SOL_SOCKET, 1, b"\x03") is None


def _taken(stats: dict[str, Any]) -> int:
    """Datagrams a QP was handed: taken by kind (data, trims, ACKs, NACKs, probes) or dropped
    (QPStats.taken and dropped_by_reason; the endpoint's own drops are in the same dict)."""
    taken: int = (
        stats["packets_received"]
        + stats["trims_seen"]
        + stats["sacks"]
        + stats["nacks"]
        - stats["nacks_ignored"]
        + stats["probes_received"]
        + stats["probes_answered"]
        + sum(stats["dropped_by_reason"].values())
    )
    return taken


async def _transfer(
    ce: bool, config: QPConfig | None = None
) -> tuple[dict[str, Any], dict[str, Any], int]:
    """1 MiB from connect to listener, CE on every datagram if ``ce``; (sender stats,
    receiver stats, receiver's GRO trains)."""
    data = os.urandom(1 << 20)
    inbox = bytearray(len(data))
    listener = await mrc.listen(HOST, 0)
    listener.register(inbox, name="inbox")
    conn = await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=8, qp=config))
    try:
        peer = await listener.accept(timeout=5)
        if ce:
            for s in conn.channel.ev_sockets:
                s.setsockopt(socket.IPPROTO_IPV6, ecn.IPV6_TCLASS, ecn.CE)
        await asyncio.wait_for(conn.write(data, conn.remote["inbox"]), 20)
        assert hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()
        return conn.stats(), peer.stats(), listener.endpoint.gro_trains
    finally:
        await conn.close()
        await listener.close()


async def test_ce_is_counted_and_echoed() -> None:
    snd, rcv, _ = await _transfer(ce=True)
    # every datagram the QP took or dropped carried CE
    assert rcv["ce_received"] == _taken(rcv) > 0, rcv
    # every ACK is about a CE subject: all of them carry BECN back
    assert snd["sacks"] > 0 and snd["ecn_echoes"] == snd["sacks"], snd
    assert snd["ce_received"] == 0  # the receiver's ACKs go out ECT(0), never CE here


async def test_no_ce_no_echo() -> None:
    snd, rcv, _ = await _transfer(ce=False)
    assert rcv["packets_received"] > 0 and rcv["ce_received"] == 0
    assert snd["sacks"] > 0 and snd["ecn_echoes"] == 0


async def test_ce_in_gro_trains(rx_impl: str) -> None:
    """GSO bursts arrive as GRO trains: one cmsg for the train, FECN on each datagram in it
    (and the train kernel, native or Python, reports it for the echo)."""
    # a fixed window sends every burst whole (NSCC sizes them from the rate, and on a busy
    # machine may send them one packet at a time: no trains)
    config = QPConfig(payload_size=8192, burst=8, cc="fixed")
    snd, rcv, trains = await _transfer(ce=True, config=config)
    assert trains > 0
    # every datagram the QP took or dropped carried CE
    assert rcv["ce_received"] == _taken(rcv) > 0, rcv
    assert snd["ecn_echoes"] == snd["sacks"] > 0


async def test_ce_without_gro(monkeypatch: pytest.MonkeyPatch) -> None:
    """The receive path for sockets without GRO reads the traffic class as well."""
    monkeypatch.setattr(gso, "enable_gro", lambda _sock: False)
    snd, rcv, trains = await _transfer(ce=True)
    assert trains == 0
    # every datagram the QP took or dropped carried CE
    assert rcv["ce_received"] == _taken(rcv) > 0, rcv
    assert snd["ecn_echoes"] == snd["sacks"] > 0
