"""Forged datagrams do not count as a silent sender's start.

Seen on an earlier main: any datagram addressed to a welcomed connection's QP marked it as
started, so a stranger spraying junk at the listener's port could keep a silent sender's slot,
QP and region past the start timeout. Now only a datagram the QP takes counts (with a key:
only one the peer sealed).
"""

from __future__ import annotations

import asyncio
import socket

import mrc
from mrc import wire
from mrc.security.keys import generate_key

HOST = "::1"


async def test_junk_at_a_silent_keyed_sender_does_not_keep_its_slot() -> None:
    key = generate_key()
    listener = await mrc.listen(HOST, 0, mrc.ListenerConfig(key=key, start_timeout=0.4))
    listener.register(bytearray(1 << 16), name="inbox")
    conn = await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=4, key=key))
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        (qpn,) = listener.endpoint.core.qps  # the silent sender's QP at the listener
        inbox = conn.remote["inbox"]
        junk = wire.pack_data(qpn, 0, inbox.addr, inbox.rkey, 16, False, None) + b"!" * 16
        stop = asyncio.Event()

        async def spray() -> None:
            while not stop.is_set():
                forger.sendto(junk, (HOST, listener.port))
                await asyncio.sleep(0.01)

        sprayer = asyncio.ensure_future(spray())
        abort = await conn.recv_message(timeout=5)  # the listener's Abort, at start_timeout
        stop.set()
        await sprayer
        assert abort is not None and "no data from the sender" in str(abort.get("error"))
        assert listener.endpoint.core.qps == {} and listener.connections == []
    finally:
        forger.close()
        await conn.close()
        await listener.close()
