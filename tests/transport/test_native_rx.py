"""GRO trains over real loopback sockets, placed by the C train kernel and by its Python twin.

The sender bursts 8 packets at a time with GSO; the receiving socket has GRO, so they arrive
as trains, which the core takes whole (EndpointCore.receive_train). The data must land byte for
byte with either kernel, most of it placed by the kernel, every datagram accounted for.
"""

from __future__ import annotations

import hashlib
import os

import mrc
from mrc.core.config import QPConfig

HOST = "::1"


async def test_burst_transfer_through_the_train_kernel(rx_impl: str) -> None:
    data = os.urandom(16 << 20)
    region = bytearray(len(data) + 4096)
    listener = await mrc.listen(HOST, 0)
    listener.register(region, name="inbox")
    cfg = QPConfig(payload_size=8192, burst=8)
    conn = await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=8, qp=cfg))
    try:
        peer = await listener.accept(timeout=5)
        await conn.write(data, conn.remote["inbox"], 4096, imm=7)
        assert await peer.next_immediate(timeout=5) == 7
        assert hashlib.sha256(region[4096:]).digest() == hashlib.sha256(data).digest()
        assert region[:4096] == bytes(4096)
        ep = listener.endpoint
        assert ep.gro and ep.gro_trains > 0
        stats = peer.qp.stats
        packets = -(-len(data) // cfg.payload_size)
        # trains were placed by the kernel: most packets, not just the odd one
        placed = peer.qp.responder.fast_placed
        assert placed > packets // 2, (placed, packets, ep.gro_trains)
        assert stats.packets_received - stats.duplicates == packets
        assert ep.core.unaccounted() == 0
    finally:
        await conn.close()
        await listener.close()
