"""Transfers of any size in bounded memory: a generated stream, and a window the sender writes
through in rounds, every round checked."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from digests import expected_digest

import mrc
from mrc.app.checksum import Checksum
from mrc.app.rounds import Posted, send_stream
from mrc.app.stream import BLOCK, GeneratedSource, StreamHasher
from mrc.app.transfer import receive_buffer

MiB = 1 << 20


def _bytes(source: GeneratedSource, start: int = 0, end: int | None = None) -> bytes:
    return b"".join(source.pieces(start, source.size if end is None else end))


def test_a_generated_stream_holds_one_block_whatever_its_size() -> None:
    huge = GeneratedSource(1 << 44)  # 16 TiB: made as fast as 16 MiB, and no larger
    assert huge.resident == 2 * BLOCK
    ends = [BLOCK - 3, BLOCK + 5, 3 * BLOCK + 1]
    assert sum(len(p) for p in huge.pieces(ends[0], ends[2])) == ends[2] - ends[0]
    small = GeneratedSource(5 * 1024 + 7, block=1024)
    whole = _bytes(small)
    assert len(whole) == small.size
    # any split reads the same bytes: the stream is one sequence, not per call
    for cut in (1, 1023, 1024, 1025, 4099):
        assert _bytes(small, 0, cut) + _bytes(small, cut) == whole
    blocks = [whole[k * 1024 : (k + 1) * 1024] for k in range(5)]
    assert len(set(blocks)) == 5  # every block a rotation of its own


async def test_the_hasher_gives_every_prefix_in_order() -> None:
    source = GeneratedSource(3 * MiB + 11, block=MiB)
    data = _bytes(source)
    hasher = StreamHasher(source, Checksum())
    first, second = hasher.hash_to(MiB), hasher.hash_to(2 * MiB + 5)
    assert await second == hashlib.sha256(data[: 2 * MiB + 5]).hexdigest()
    assert await first == hashlib.sha256(data[:MiB]).hexdigest()
    assert await hasher.digest() == hashlib.sha256(data).hexdigest()


async def _window_pair(size: int, window: int) -> tuple[Any, Any, Any, list[bytearray]]:
    """A listener that grants at most ``window`` bytes, and one connection asking for
    ``size``."""
    made: list[bytearray] = []

    def factory(n: int, _request: dict[str, object]) -> bytearray:
        made.append(bytearray(max(min(n, window), 1)))
        return made[-1]

    listener = await mrc.listen("::1", 0, mrc.ListenerConfig(region_factory=factory))
    conn = await mrc.connect(
        "::1",
        listener.port,
        mrc.ConnectConfig(evs=16, request_size=size, qp=mrc.QPConfig(payload_size=8192)),
    )
    peer = await listener.accept(timeout=30)
    return listener, conn, peer, made


async def test_a_transfer_larger_than_the_region_goes_through_it_in_rounds() -> None:
    size, window = 40 * MiB + 12345, 4 * MiB
    source = GeneratedSource(size, block=3 * MiB)
    listener, conn, peer, made = await _window_pair(size, window)
    try:
        assert conn.requested.length == window < size
        posted = Posted()
        sent, got = await asyncio.gather(
            send_stream(conn, source, posted=posted),
            receive_buffer(peer, peer.granted.view),
        )
        assert sent.ok and got.ok, (sent.error, got.error)
        digest = expected_digest(_bytes(source), got.checksum)
        assert sent.checksum == got.checksum == "blake3"
        assert sent.digest == sent.peer_digest == got.digest == got.peer_digest == digest
        assert sent.bytes == got.bytes == posted.bytes == size
        assert sent.peer_stats["bytes_placed"] == size
        assert len(made) == 1 and len(made[0]) == window
        # the last round's tail is where the stream ends in its slot
        rounds = -(-size // (window // 2))
        last = size - (rounds - 1) * (window // 2)
        base = ((rounds - 1) % 2) * (window // 2)
        assert bytes(made[0][base : base + last]) == _bytes(source, size - last)
    finally:
        await conn.close()
        await listener.close()


async def test_a_round_placed_elsewhere_fails_both_sides() -> None:
    """The receiver hashes a window the data never lands in: round 0 already differs."""
    size, window = 16 * MiB, 4 * MiB
    listener, conn, peer, _made = await _window_pair(size, window)
    try:
        elsewhere = memoryview(bytearray(window))
        sent, got = await asyncio.gather(
            send_stream(conn, GeneratedSource(size)),
            receive_buffer(peer, elsewhere, size=size),
            return_exceptions=True,
        )
        assert isinstance(sent, mrc.MRCError)
        assert str(sent) == "BLAKE3 mismatch in round 0: data placed differs from sent"
        assert isinstance(got, mrc.MRCError) and str(got) == f"sender gave up: {sent}"
    finally:
        await conn.close()
        await listener.close()
