"""The verdict means what it says: nothing is placed into a region once it is being hashed.

Without a key, whoever sees the traffic knows the receiver's QP number, the region's rkey and
address and the next PSN, so it can forge a WRITE. Landing on bytes the receiver has already
hashed, it would change what is kept after both sides agreed on the hash. The receiver closes
the region before it hashes it: a late WRITE is dropped and counted (``region_closed``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from typing import cast

import pytest
from digests import expected_digest
from transport.requested_pair import requested_pair

import mrc
from mrc import wire
from mrc.app.checksum import PrefixHasher
from mrc.app.transfer import receive_buffer, send_buffer

FORGED = b"\xee" * 64


async def _handled(peer: mrc.Connection, before: tuple[int, int], limit: float) -> None:
    """Wait until the receiver took one more datagram for its QP: placed or dropped."""
    deadline = time.monotonic() + limit
    while (
        peer.bytes_placed,
        sum(cast("dict[str, int]", peer.stats()["dropped_by_reason"]).values()),
    ) == before:
        assert time.monotonic() < deadline, "the forged WRITE never reached the receiver"
        await asyncio.sleep(0.01)


async def test_a_write_forged_while_the_receiver_hashes_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    size = 4 << 20
    data = os.urandom(size)
    listener, conn, peer, buf = await requested_pair(size)
    assert conn.requested is not None and peer.granted is not None  # requested_pair made both
    loop = asyncio.get_running_loop()
    hashed = loop.create_future()
    forged = threading.Event()
    real_update = PrefixHasher._update

    def update(hasher: PrefixHasher, start: int, stop: int) -> None:
        """A step of the receiver's hash of its region; the forgery lands after the last."""
        real_update(hasher, start, stop)
        if hasher._view.obj is buf and stop == len(hasher._view):
            loop.call_soon_threadsafe(hashed.set_result, None)
            assert forged.wait(30)

    monkeypatch.setattr(PrefixHasher, "_update", update)
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        region = conn.requested
        receiving = asyncio.ensure_future(receive_buffer(peer, peer.granted.view[:size]))
        sending = asyncio.ensure_future(send_buffer(conn, memoryview(data)))
        await asyncio.wait_for(asyncio.shield(hashed), 60)
        # what an observer saw: the receiver's QP, the region, the PSN after the last one
        psn = (conn.qp.initial_psn + conn.qp.requester._next_seq) & wire.PSN_MASK
        header = wire.pack_data(peer.qpn, psn, region.addr, region.rkey, len(FORGED), False, None)
        before = (
            peer.bytes_placed,
            sum(cast("dict[str, int]", peer.stats()["dropped_by_reason"]).values()),
        )
        forger.sendto(header + FORGED, ("::1", listener.port))
        await _handled(peer, before, 30)
        forged.set()
        sent, got = await asyncio.gather(sending, receiving)
        assert sent.ok and got.ok, (sent.error, got.error)
        assert sent.digest == got.digest == expected_digest(data, got.checksum)
        # what was kept is what both sides verified
        assert expected_digest(buf[:size], got.checksum) == got.digest
        assert peer.stats()["dropped_by_reason"] == {"region_closed": 1}
        assert peer.bytes_placed == size
    finally:
        forged.set()
        forger.close()
        await conn.close()
        await listener.close()


async def test_a_closed_region_still_acknowledges_what_it_already_holds() -> None:
    """A retransmission after the region closed (its ACK was lost) is answered, not refused:
    the sender would otherwise fail a transfer the receiver has completely."""
    size = 1 << 20
    data = os.urandom(size)
    listener, conn, peer, buf = await requested_pair(size)
    assert conn.requested is not None and peer.granted is not None  # requested_pair made both
    try:
        region = conn.requested
        assert await conn.write(memoryview(data), region, 0) == size
        peer.close_region(peer.granted)
        before = peer.stats()["duplicates"]
        # the first packet again, as the sender would resend it
        payload = 4096
        header = wire.pack_data(
            peer.qpn, conn.qp.initial_psn, region.addr, region.rkey, payload, False, None
        )
        forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        try:
            forger.sendto(header + data[:payload], ("::1", listener.port))
            deadline = time.monotonic() + 30
            while peer.stats()["duplicates"] == before:
                assert time.monotonic() < deadline, peer.stats()["dropped_by_reason"]
                await asyncio.sleep(0.01)
        finally:
            forger.close()
        assert "region_closed" not in cast("dict[str, int]", peer.stats()["dropped_by_reason"])
        # and a WRITE of new data is refused: nothing changes in the region
        with pytest.raises(mrc.MRCError, match="remote access error|REMOTE_ACCESS"):
            await asyncio.wait_for(conn.write(b"\x01" * 100, region, 0), 30)
        # (refused twice: without a key the sender believes the refusal on a second copy)
        assert peer.stats()["dropped_by_reason"] == {"region_closed": 2}
        assert bytes(buf[:size]) == data
    finally:
        await conn.close()
        await listener.close()
