"""A connection that fails reports it once, as one line: no asyncio noise for the rest.

Seen on an earlier main: when the retry budget ran out, mrc-send printed "Future exception was
never retrieved" with a traceback for every write still pending, then its one-line error.
"""

from __future__ import annotations

import asyncio
import gc

import pytest

import mrc
from mrc.core.config import QPConfig

HOST = "::1"


async def _impatient_pair() -> tuple[mrc.Listener, mrc.Connection]:
    """A listener with an "inbox" and a QP to it that gives up after two short timeouts."""
    listener = await mrc.listen(HOST, 0)
    listener.register(bytearray(1 << 20), name="inbox")
    cfg = QPConfig(
        payload_size=1024, initial_rto=0.01, min_rto=0.01, max_rto=0.02, max_timeout_retries=2
    )
    return listener, await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=4, qp=cfg))


async def test_retry_budget_exhausted_is_one_error_and_no_asyncio_warnings() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
    listener, conn = await _impatient_pair()
    try:
        peer = await listener.accept(timeout=5)
        # the receiver's QP goes away (as if its process froze): nothing is acknowledged again
        listener.endpoint.detach(peer.qpn)
        region = conn.remote["inbox"]
        futures = [conn.post_write(b"x" * 4096, region, offset=i * 4096) for i in range(16)]
        with pytest.raises(mrc.MRCError, match="retry budget exhausted") as err:
            await conn.write(b"y" * 4096, region, offset=1 << 19)
        assert "\n" not in str(err.value)
        assert conn.error is not None and "retry budget exhausted" in conn.error
        assert all(f.done() for f in futures)
    finally:
        await conn.close()
        await listener.close()
    del futures
    gc.collect()
    await asyncio.sleep(0)  # let Future.__del__ reports (scheduled on the loop) run
    assert reported == [], reported


def _overflow_a_socket() -> int:
    """Make this host's kernel drop datagrams for lack of receive-buffer room: a socket with
    the smallest buffer, sent more than it holds and never read. Returns how many were sent."""
    import socket

    sink = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    src = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        sink.bind((HOST, 0))
        for _ in range(200):
            src.sendto(b"z" * 1000, sink.getsockname())
    finally:
        sink.close()
        src.close()
    return 200


async def test_a_failure_names_the_kernel_drops_seen_meanwhile() -> None:
    """Seen on an earlier main: 64 QPs into one receiver failed blaming a peer that was alive
    while the kernel dropped 152,753 datagrams for lack of receive-buffer room. A QP that
    fails now says how many the kernel dropped while it ran (and what it heard)."""
    listener, conn = await _impatient_pair()
    try:
        peer = await listener.accept(timeout=5)
        region = conn.remote["inbox"]
        await conn.write(b"w" * 4096, region)  # the peer answers at first
        listener.endpoint.detach(peer.qpn)
        _overflow_a_socket()
        with pytest.raises(mrc.MRCError, match="retry budget exhausted") as err:
            await conn.write(b"y" * 4096, region, offset=1 << 19)
    finally:
        await conn.close()
        await listener.close()
    msg = str(err.value)
    assert "no ACK ever came back" not in msg and "packets acknowledged in all" in msg, msg
    assert "this host's kernel dropped" in msg and "receive-buffer room" in msg, msg
