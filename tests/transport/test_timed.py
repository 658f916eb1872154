"""send_timed (mrc-send --time): rounds into two slots, each checked by the receiver's hash."""

from __future__ import annotations

import asyncio

import pytest
from digests import expected_digest
from transport.requested_pair import requested_pair

import mrc
from mrc.app.checksum import Checksum
from mrc.app.timed import ROTATIONS, Posted, RoundData, send_timed
from mrc.app.transfer import receive_buffer
from mrc.transport.messages import CHECKSUMS

SLOT = 256 << 10


@pytest.mark.parametrize("name", CHECKSUMS)
def test_rounds_are_distinct_rotations_and_the_region_digest_follows_them(name: str) -> None:
    data = RoundData(1024)
    check = Checksum(name)
    rounds = [bytes(data.round(r)) for r in range(ROTATIONS)]
    assert len(set(rounds)) == ROTATIONS  # r and r + 2 (one slot) never carry the same bytes
    digests = [data.digest(r, check) for r in range(ROTATIONS)]
    assert [expected_digest(r, name) for r in rounds] == digests
    region = bytearray(2048)
    assert data.region_digest(0, check) == expected_digest(region, name)
    for r in range(7):  # place the rounds as the receiver would, slot r % 2
        region[(r % 2) * 1024 : (r % 2 + 1) * 1024] = data.round(r)
        assert data.region_digest(r + 1, check) == expected_digest(region, name), r


async def test_timed_transfer_verifies_every_round_on_both_sides() -> None:
    data = RoundData(SLOT)
    listener, conn, peer, buf = await requested_pair(2 * SLOT, evs=16)
    try:
        assert peer.granted is not None
        posted = Posted()
        sent, got = await asyncio.gather(
            send_timed(conn, data, 0.3, posted),
            receive_buffer(peer, peer.granted.view[: 2 * SLOT]),
        )
        assert sent.ok and got.ok, (sent.error, got.error)
        rounds = sent.bytes // SLOT
        assert rounds >= 3 and sent.bytes == rounds * SLOT == posted.bytes
        # the receiver counts the rounds it hashed, not the region
        assert got.bytes == sent.bytes
        assert 0.3 <= sent.seconds < 10
        assert sent.checksum == got.checksum == "blake3"
        assert sent.digest == got.digest == expected_digest(buf[: 2 * SLOT], got.checksum)
        assert sent.digest == data.region_digest(rounds, Checksum(sent.checksum))
        assert sent.peer_stats["bytes_placed"] == sent.bytes
    finally:
        await conn.close()
        await listener.close()


async def test_a_round_whose_hash_differs_fails_both_sides() -> None:
    """The receiver hashes a buffer the data never lands in: round 0 already differs."""
    data = RoundData(SLOT)
    listener, conn, peer, _buf = await requested_pair(2 * SLOT, evs=16)
    try:
        elsewhere = memoryview(bytearray(2 * SLOT))
        sent, got = await asyncio.gather(
            send_timed(conn, data, 5.0),
            receive_buffer(peer, elsewhere),
            return_exceptions=True,
        )
        assert isinstance(sent, mrc.MRCError)
        assert str(sent) == "BLAKE3 mismatch in round 0: data placed differs from sent"
        assert isinstance(got, mrc.MRCError)
        assert str(got) == f"sender gave up: {sent}"
    finally:
        await conn.close()
        await listener.close()


async def test_a_region_too_small_for_two_rounds_is_refused() -> None:
    data = RoundData(SLOT)
    listener, conn, _peer, _buf = await requested_pair(SLOT, evs=16)
    try:
        with pytest.raises(mrc.MRCError, match="large enough for two rounds"):
            await send_timed(conn, data, 1.0)
    finally:
        await conn.close()
        await listener.close()
