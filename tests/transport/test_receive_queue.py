"""A host's receive queue, which every QP into it fills, as a congested port.

Two mechanisms keep many QPs into one host from overrunning its receive socket (which, unlike
a fabric port, neither trims nor marks, so what overflows it is lost and blamed on the EVs):

* the listener's welcome grants each new QP a share of that buffer (``start_bytes``,
  ``Endpoint.start_share``), and the sender's window law starts within it
  (``WindowLaw.start_within``);
* a receive queue over half of what the kernel lets it hold marks what is read from it CE
  (``queue_mark_at``, counted as ``queue_marks``, not as CE received).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

import pytest
from transport.test_side_channel import HOST, listening

import mrc
from mrc.core import EndpointCore, QPConfig
from mrc.transport.endpoint import Endpoint, queue_mark_at
from mrc.transport.sockets import receive_queue_bytes, udp_socket


async def _read_all(ep: Endpoint, count: int) -> None:
    """Let the endpoint's loop read until its core has seen ``count`` datagrams."""
    deadline = time.monotonic() + 30
    while ep.core.datagrams_received < count:
        assert time.monotonic() < deadline, f"read {ep.core.datagrams_received} of {count}"
        await asyncio.sleep(0.001)


async def test_a_deep_receive_queue_marks_what_is_read_from_it() -> None:
    sock = udp_socket(HOST, 0)
    ep = Endpoint(EndpointCore(), [sock])
    tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        mark_at = queue_mark_at(sock)
        assert mark_at == sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2
        junk = os.urandom(8192)  # no QP takes these: the core drops them, counted
        for _ in range(8):  # a shallow queue: nothing marked
            tx.sendto(junk, sock.getsockname())
        await _read_all(ep, 8)
        assert ep.queue_marks == 0
        # the loop cannot read while this coroutine runs: the queue fills past the mark
        sent = 8
        while receive_queue_bytes(sock) <= mark_at:
            tx.sendto(junk, sock.getsockname())
            sent += 1
            assert sent < 100_000
        deep = sent - 8
        await _read_all(ep, sent)
        # the batches read while the queue was over the mark are marked, the rest not
        assert 0 < ep.queue_marks <= deep
        assert ep.ce_received == 0  # marked here, not on the way
        assert ep.core.dropped_by_reason and sum(ep.core.dropped_by_reason.values()) == sent
    finally:
        tx.close()
        ep.close()


async def test_the_share_of_the_receive_buffer_falls_with_the_qps_attached() -> None:
    sock = udp_socket(HOST, 0)
    ep = Endpoint(EndpointCore(), [sock])
    try:
        room = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        assert ep.start_share() == room // 4
        ep.channels.update({qpn: None for qpn in range(1, 9)})  # type: ignore[misc]
        assert ep.start_share() == room // 4 // 8
    finally:
        ep.channels.clear()
        ep.close()


@pytest.mark.parametrize("cc", ["nscc", "nscc-mrc", "fixed"])
async def test_the_sender_starts_within_the_share_its_welcome_grants(
    cc: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A welcome granting 3 packets and a bit: NSCC's laws start at 3 packets instead of
    their 16, a fixed window stays what it was asked to be."""
    payload = 8192
    monkeypatch.setattr(Endpoint, "start_share", lambda _self: 3 * payload + 100)
    cfg = QPConfig(payload_size=payload, cc=cc, max_outstanding=64)
    size = 1 << 20
    async with listening() as listener:
        conn = await mrc.connect(
            HOST, listener.port, mrc.ConnectConfig(evs=4, qp=cfg, request_size=size)
        )
        async with conn:
            law = conn.qp.requester.cc
            assert law.limit == (64 if cc == "fixed" else 3)
            # the largest window the law opened (on a busy machine the delay it reads at the
            # end may have brought it back down by then)
            peak = [law.limit]
            on_ack = type(law).on_ack

            def watched(self: Any, *args: Any) -> None:
                on_ack(self, *args)
                peak[0] = max(peak[0], self.limit)

            monkeypatch.setattr(type(law), "on_ack", watched)
            # and it grows from there: a transfer through that first window completes
            peer = await listener.accept(timeout=5)
            data = os.urandom(size)
            assert conn.requested is not None
            await conn.write(data, conn.requested, 0, imm=1)
            assert await peer.next_immediate(timeout=10) == 1
            assert peer.granted is not None and bytes(peer.granted.view[:size]) == data
            if cc != "fixed":
                assert peak[0] > 3
