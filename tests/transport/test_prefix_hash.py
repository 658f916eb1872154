"""The receiver hashes a transfer's region as its sender marks it written (issue 38).

The sender posts a ``MARK_IMM`` after the WRITEs of every hash step; the receiver freezes its
region below each mark and hashes that much in a worker thread while the rest arrives, so at
the ``DONE_IMM`` only the tail is left. The digest must be the one of the whole region hashed
at once, for every checksum (checked against the hash libraries themselves, tests/digests.py);
a WRITE forged into the frozen prefix must change nothing that was verified; and a transfer that
ends early must not leave a hash step reading the buffer its owner is about to let go of.
Real connections on ::1.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from digests import expected_digest
from transport.requested_pair import requested_pair

import mrc
from mrc import wire
from mrc.app.checksum import STEP, PrefixHasher
from mrc.app.stream import BufferSource
from mrc.app.transfer import (
    MARK_IMM,
    MARK_UNIT,
    Stall,
    agreed,
    conclude,
    mark_spacing,
    post_range,
    receive_buffer,
    send_buffer,
)
from mrc.security.keys import generate_key

HOST = "::1"
SIZE = 2 * STEP + 12345  # marks after 1 and 2 steps, then a short tail
FORGED = b"\xee" * 64


@contextlib.asynccontextmanager
async def pair(size: int, name: str, key: bytes | None) -> AsyncIterator[tuple[Any, Any, Any]]:
    """(connection, the listener's side of it, the region it made for ``size``), verified
    with checksum ``name`` under ``key``."""
    made: list[bytearray] = []

    def factory(n: int, _request: dict[str, object]) -> bytearray:
        made.append(bytearray(max(n, 1)))
        return made[-1]

    listener = await mrc.listen(
        HOST, 0, mrc.ListenerConfig(region_factory=factory, key=key, checksums=(name,))
    )
    try:
        conn = await mrc.connect(
            HOST,
            listener.port,
            mrc.ConnectConfig(
                evs=16,
                request_size=size,
                key=key,
                checksums=(name,),
                qp=mrc.QPConfig(payload_size=8192),
            ),
        )
        try:
            peer = await listener.accept(timeout=5)
            yield conn, peer, made[0]
        finally:
            await conn.close()
    finally:
        await listener.close()


@pytest.mark.parametrize(
    ("name", "keyed"),
    [("blake3", False), ("blake3", True), ("xxh3-128", False), ("sha256", False)],
)
async def test_the_digest_is_the_whole_regions_and_most_was_hashed_before_the_end(
    name: str, keyed: bool
) -> None:
    data = os.urandom(SIZE)
    key = generate_key() if keyed else None
    async with pair(SIZE, name, key) as (conn, peer, buf):
        sent, got = await asyncio.gather(
            send_buffer(conn, memoryview(data)),
            receive_buffer(peer, peer.granted.view[:SIZE]),
        )
        assert sent.ok and got.ok, (sent.error, got.error)
        hash_key = None
        if key is not None:
            hash_key = hashlib.sha256(b"mrc end-to-end checksum key\0" + key).digest()
        digest = expected_digest(data, name, hash_key)
        assert sent.digest == got.digest == sent.peer_digest == got.peer_digest == digest
        assert bytes(buf[:SIZE]) == data
        # two of the three steps were marked, frozen and handed to the hash worker before
        # the DONE_IMM: only the short tail was left for after the last byte
        assert got.hashed_early == 2 * STEP
        assert peer.granted.frozen == 2 * STEP and peer.granted.closed
        assert not peer.stats()["dropped_by_reason"]


def test_marks_keep_within_the_immediates_that_may_be_outstanding() -> None:
    assert mark_spacing(STEP, 256) == 0  # one step: the DONE_IMM says it all
    assert mark_spacing(STEP + 1, 256) == STEP
    assert mark_spacing(SIZE, 256) == STEP
    # 999 marks wanted, 10 may be outstanding beside the DONE_IMM: one every 100 steps
    assert mark_spacing(1000 * STEP, 11) == 100 * STEP
    assert mark_spacing(1000 * STEP, 1) == 0  # room for the DONE_IMM only
    assert mark_spacing(MARK_UNIT << 24, 256) > 0  # the last mark still fits in 24 bits
    assert mark_spacing((MARK_UNIT << 24) + 1, 256) == 0
    assert all(mark_spacing(n, r) % MARK_UNIT == 0 for n in (SIZE, 77 * STEP) for r in (3, 9))


async def _handled(peer: mrc.Connection, before: tuple[int, int], limit: float) -> None:
    """Wait until the receiver took one more datagram for its QP: placed or dropped (no event
    says so)."""
    deadline = time.monotonic() + limit
    while (
        peer.bytes_placed,
        sum(cast("dict[str, int]", peer.stats()["dropped_by_reason"]).values()),
    ) == before:
        assert time.monotonic() < deadline, "the forged WRITE never reached the receiver"
        await asyncio.sleep(0.01)


async def test_a_write_forged_into_the_frozen_prefix_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a key an observer knows the rkey and the next PSN: a WRITE it forges over bytes
    the receiver hashed already is dropped (``region_closed``), so what is kept is what both
    sides verified, and the genuine packet of that PSN still lands where it belongs."""
    data = os.urandom(SIZE)
    listener, conn, peer, buf = await requested_pair(SIZE)
    assert conn.requested is not None and peer.granted is not None  # requested_pair made both
    frozen = asyncio.Event()
    real_freeze = peer.freeze_region

    def freeze(region: Any, upto: int) -> None:
        real_freeze(region, upto)
        frozen.set()

    monkeypatch.setattr(peer, "freeze_region", freeze)
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        region = conn.requested
        source = BufferSource(memoryview(data))
        receiving = asyncio.ensure_future(receive_buffer(peer, peer.granted.view[:SIZE]))
        # the first step and its mark, as send_buffer sends them; the mark completing means
        # the receiver placed all before it
        post_range(conn, source, 0, STEP, 0)
        await conn.write(b"", region, STEP, imm=MARK_IMM | STEP // MARK_UNIT)
        await asyncio.wait_for(frozen.wait(), 30)
        assert peer.granted.frozen == STEP
        # an overwrite of the first bytes under the PSN the sender uses next
        psn = (conn.qp.initial_psn + conn.qp.requester._next_seq) & wire.PSN_MASK
        header = wire.pack_data(peer.qpn, psn, region.addr, region.rkey, len(FORGED), False, None)
        before = (
            peer.bytes_placed,
            sum(cast("dict[str, int]", peer.stats()["dropped_by_reason"]).values()),
        )
        forger.sendto(header + FORGED, (HOST, listener.port))
        await _handled(peer, before, 30)
        assert peer.stats()["dropped_by_reason"] == {"region_closed": 1}
        # the rest, then the end every transfer has
        post_range(conn, source, STEP, SIZE, STEP)
        check = agreed(conn)
        sent = await conclude(
            conn,
            asyncio.ensure_future(conn.recv_message()),
            lambda: asyncio.to_thread(check.of, memoryview(data)),
            SIZE,
            time.perf_counter(),
            Stall(30, "nothing acknowledged"),
        )
        got = await receiving
        assert sent.ok and got.ok, (sent.error, got.error)
        assert sent.digest == got.digest == expected_digest(data, got.checksum)
        assert bytes(buf[:SIZE]) == data  # what was kept is what both sides verified
        assert got.hashed_early == STEP
        assert peer.stats()["dropped_by_reason"] == {"region_closed": 1}
        assert peer.bytes_placed == SIZE
    finally:
        forger.close()
        await conn.close()
        await listener.close()


@pytest.mark.parametrize("how", ["sender vanishes", "cancelled"])
async def test_a_transfer_that_ends_early_waits_for_its_hash_step(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A receiver that fails, or is cancelled, while a step hashes its region returns only
    once that step is over, and starts no other: then nothing reads the buffer any more, and
    its owner can let go of it (an mmap could not be closed otherwise)."""
    listener, conn, peer, buf = await requested_pair(SIZE)
    assert conn.requested is not None and peer.granted is not None  # requested_pair made both
    loop = asyncio.get_running_loop()
    started = loop.create_future()
    release = threading.Event()
    steps: list[tuple[int, int]] = []
    real_update = PrefixHasher._update

    def update(hasher: PrefixHasher, start: int, stop: int) -> None:
        steps.append((start, stop))
        if len(steps) == 1:
            loop.call_soon_threadsafe(started.set_result, None)
            assert release.wait(30)
        real_update(hasher, start, stop)

    monkeypatch.setattr(PrefixHasher, "_update", update)
    view = peer.granted.view[:SIZE]
    try:
        receiving = asyncio.ensure_future(receive_buffer(peer, view))
        post_range(conn, BufferSource(memoryview(os.urandom(2 * STEP))), 0, 2 * STEP, 0)
        conn.post_write(b"", conn.requested, STEP, imm=MARK_IMM | STEP // MARK_UNIT)
        conn.post_write(b"", conn.requested, 2 * STEP, imm=MARK_IMM | 2 * STEP // MARK_UNIT)
        await asyncio.wait_for(started, 30)  # the first step is hashing, held
        if how == "cancelled":
            receiving.cancel()
        else:
            await conn.close()
        done, _ = await asyncio.wait({receiving}, timeout=0.3)
        assert not done  # still waiting for the step
        release.set()
        with pytest.raises((mrc.MRCError, asyncio.CancelledError)):
            await asyncio.wait_for(receiving, 30)
        assert steps == [(0, STEP)]  # no step after the one running
        view.release()
        peer.deregister(peer.granted)
        buf.append(0)  # no view of the buffer is left anywhere (a BufferError otherwise)
    finally:
        release.set()
        await conn.close()
        await listener.close()
