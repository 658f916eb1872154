"""send_buffer / receive_buffer: the end-to-end checksum verdict both sides agree on."""

from __future__ import annotations

import asyncio
import os

import pytest
from digests import expected_digest
from transport.requested_pair import requested_pair

import mrc
from mrc.app.transfer import receive_buffer, send_buffer


async def test_verified_transfer_both_sides_agree() -> None:
    size = 5 * (1 << 20) + 3
    data = os.urandom(size)
    listener, conn, peer, buf = await requested_pair(size)
    assert conn.requested is not None and peer.granted is not None  # requested_pair made both
    try:
        assert conn.requested is not None and conn.requested.length == size
        assert peer.granted is not None and peer.granted.length == size
        progress: list[int] = []
        sent, got = await asyncio.gather(
            send_buffer(conn, memoryview(data)),
            receive_buffer(peer, peer.granted.view[:size], progress.append),
        )
        assert sent.checksum == got.checksum == "blake3"  # the default both sides agree on
        digest = expected_digest(data, sent.checksum)
        assert sent.ok and got.ok
        assert sent.digest == sent.peer_digest == got.digest == got.peer_digest == digest
        assert bytes(buf[:size]) == data
        assert sent.bytes == got.bytes == size
        assert progress and progress[-1] == size
        # the receiver's counters travel back with its verdict
        assert sent.peer_stats["bytes_placed"] == size
        assert sent.peer_stats["dropped_by_reason"] == {}
    finally:
        await conn.close()
        await listener.close()


async def test_mismatch_is_detected_on_both_sides() -> None:
    """The receiver hashes something other than what was placed: both verdicts say no."""
    size = 1 << 20
    data = os.urandom(size)
    listener, conn, peer, _buf = await requested_pair(size)
    assert conn.requested is not None and peer.granted is not None  # requested_pair made both
    try:
        elsewhere = memoryview(bytearray(size))  # not the region the data lands in
        sent, got = await asyncio.gather(
            send_buffer(conn, memoryview(data)), receive_buffer(peer, elsewhere)
        )
        assert not sent.ok and not got.ok
        assert "BLAKE3 mismatch" in (sent.error or "")
        assert "BLAKE3 mismatch" in (got.error or "")
        assert sent.digest == expected_digest(data, sent.checksum)
        assert sent.peer_digest == got.digest == expected_digest(bytes(size), got.checksum)
    finally:
        await conn.close()
        await listener.close()


async def test_receiver_sees_sender_vanish() -> None:
    size = 1 << 20
    listener, conn, peer, _buf = await requested_pair(size)
    assert conn.requested is not None and peer.granted is not None  # requested_pair made both
    try:
        # part of the data, no DONE_IMM, then the sender goes away
        await conn.write(os.urandom(1000), conn.requested, 0)
        task = asyncio.ensure_future(receive_buffer(peer, peer.granted.view[:size]))
        await conn.close()
        with pytest.raises(mrc.MRCError, match="sender went away"):
            await asyncio.wait_for(task, 5)
    finally:
        await conn.close()
        await listener.close()
