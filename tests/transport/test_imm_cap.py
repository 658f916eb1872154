"""The cap on outstanding WRITE_IMMs over real sockets (``max_imm_outstanding``, mrc.h's
MRC_QP_MAX_WIMM): ``Connection.write`` waits for room, ``post_write`` refuses past it. A
receiver's own limit (``max_imm_dest``, MRC_QP_MAX_WIMM_DEST) is announced at set-up, and the
sender keeps to the smaller of the two."""

from __future__ import annotations

import asyncio
import os

import pytest
from transport.test_side_channel import HOST, listening

import mrc
from mrc.core import QPConfig
from mrc.errors import TooManyImmediates

N = 24
SIZE = 20_000


@pytest.mark.parametrize("whose", ["sender", "receiver"])
async def test_writes_beyond_the_cap_wait_and_all_land_in_order(whose: str) -> None:
    """The cap of 2 is the sender's own, or the receiver's, which the sender learns."""
    cfg = QPConfig(max_imm_outstanding=2 if whose == "sender" else 256)
    kw = {"qp": QPConfig(max_imm_dest=2)} if whose == "receiver" else {}
    data = [os.urandom(SIZE) for _ in range(N)]
    async with listening(**kw) as listener:
        conn = await mrc.connect(
            HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=N * SIZE, qp=cfg)
        )
        async with conn:
            peer = await listener.accept(timeout=5)
            assert conn.requested is not None and peer.granted is not None
            assert conn.qp.requester.imm_cap == 2
            highest = 0

            async def watch() -> None:
                nonlocal highest
                while True:
                    highest = max(highest, conn.qp.requester.imms_outstanding)
                    await asyncio.sleep(0)

            watcher = asyncio.create_task(watch())
            sizes = await asyncio.gather(
                *(conn.write(data[i], conn.requested, i * SIZE, imm=i) for i in range(N))
            )
            watcher.cancel()
            assert sizes == [SIZE] * N
            assert 1 <= highest <= 2
            imms = [await peer.next_immediate(timeout=10) for _ in range(N)]
            assert sorted(imms) == list(range(N))
            assert bytes(peer.granted.view[: N * SIZE]) == b"".join(data)


async def test_post_write_past_the_cap_is_refused_with_one_line() -> None:
    cfg = QPConfig(max_imm_outstanding=2, max_imm_dest=5)
    async with listening(qp=QPConfig(max_imm_dest=3)) as listener:
        conn = await mrc.connect(
            HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=3 * SIZE, qp=cfg)
        )
        async with conn:
            peer = await listener.accept(timeout=5)
            assert peer.qp.requester.imm_cap == 5  # the listener learned the sender's limit
            assert conn.requested is not None
            first = conn.post_write(bytes(SIZE), conn.requested, 0, imm=1)
            second = conn.post_write(bytes(SIZE), conn.requested, SIZE, imm=2)
            with pytest.raises(TooManyImmediates, match="max_imm_outstanding"):
                conn.post_write(bytes(SIZE), conn.requested, 2 * SIZE, imm=3)
            assert list(await asyncio.gather(first, second)) == [SIZE, SIZE]
            assert await conn.write(bytes(SIZE), conn.requested, 2 * SIZE, imm=3) == SIZE
