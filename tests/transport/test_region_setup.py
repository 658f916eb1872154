"""Region set-up never stops the listener's event loop: a region that takes long to make (a
large file reserved and faulted in) is made in a worker thread while other connections move,
and one made for a set-up cancelled meanwhile is released."""

from __future__ import annotations

import asyncio
import os
import threading

import mrc
from mrc.app.transfer import receive_buffer, send_buffer

MiB = 1 << 20


async def test_a_slow_region_set_up_does_not_stall_other_connections() -> None:
    """One sender's region takes long to make (a large file faulted in); meanwhile another
    connection of the same listener sets up and completes a verified transfer."""
    making = threading.Event()
    release = threading.Event()
    waited_out: list[bool] = []

    def factory(n: int, request: dict[str, object]) -> bytearray:
        if request["name"] == "slow":
            making.set()
            waited_out.append(not release.wait(20))  # what the loop could not stop
        return bytearray(max(n, 1))

    listener = await mrc.listen(
        "::1", 0, mrc.ListenerConfig(region_factory=factory, setup_timeout=60)
    )
    cfg = mrc.QPConfig(payload_size=8192)
    slow = asyncio.ensure_future(
        mrc.connect(
            "::1",
            listener.port,
            mrc.ConnectConfig(request_size=1 << 20, request_name="slow", timeout=60, qp=cfg),
        )
    )
    conn = slow_conn = None
    try:
        assert await asyncio.to_thread(making.wait, 30)
        size = 8 * MiB
        conn = await mrc.connect(
            "::1", listener.port, mrc.ConnectConfig(evs=16, request_size=size, qp=cfg)
        )
        peer = await listener.accept(timeout=30)
        assert peer.granted is not None  # the listener made the region requested
        sent, got = await asyncio.gather(
            send_buffer(conn, memoryview(os.urandom(size))),
            receive_buffer(peer, peer.granted.view),
        )
        assert sent.ok and got.ok
        assert not release.is_set() and not slow.done()  # all while the slow one was made
        release.set()
        slow_conn = await slow
        assert slow_conn.requested is not None and slow_conn.requested.length == 1 << 20
        assert waited_out == [False]
    finally:
        release.set()
        for c in (conn, slow_conn):
            if c is not None:
                await c.close()
        if not slow.done():
            slow.cancel()
        await asyncio.gather(slow, return_exceptions=True)
        await listener.close()


async def test_a_region_made_after_its_set_up_was_cancelled_is_released() -> None:
    made: list[bytearray] = []
    freed: list[object] = []
    making = threading.Event()
    release = threading.Event()

    def factory(n: int, _request: dict[str, object]) -> bytearray:
        making.set()
        release.wait(30)
        made.append(bytearray(n))
        return made[-1]

    listener = await mrc.listen(
        "::1",
        0,
        mrc.ListenerConfig(region_factory=factory, region_release=freed.append, setup_timeout=60),
    )
    pending = asyncio.ensure_future(
        mrc.connect("::1", listener.port, mrc.ConnectConfig(request_size=4096))
    )
    try:
        assert await asyncio.to_thread(making.wait, 30)
        closing = asyncio.ensure_future(listener.close())
        await asyncio.sleep(0)  # one turn of the loop: close() has cancelled the set-up
        release.set()  # and only now is its region made
        await asyncio.wait_for(closing, 30)
        assert len(made) == 1 and freed == made  # released once made, before close() returned
        assert isinstance((await asyncio.gather(pending, return_exceptions=True))[0], Exception)
    finally:
        release.set()
        await asyncio.gather(pending, return_exceptions=True)
        await listener.close()
