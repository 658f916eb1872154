"""Peers of one listener are kept apart: each connection has its own protection domain.

Seen on an earlier main: every peer shared the listener's domain, so a second sender could
write into the region granted to the first with the first's rkey, and the first region's
address was always 0x100000000.
"""

from __future__ import annotations

import asyncio

import pytest

import mrc
from mrc.core.memory import ProtectionDomain


def _factory(size: int, request: dict[str, object]) -> bytearray:
    return bytearray(size)


async def test_a_peer_cannot_write_into_another_peers_region() -> None:
    listener = await mrc.listen("::1", 0, mrc.ListenerConfig(region_factory=_factory))
    try:
        a = await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=4, request_size=4096))
        peer_a = await listener.accept(timeout=5)
        # (B gives up after a few timeouts: an rkey its QP does not know gets no answer at
        # all, as for an unknown QP, so B fails as it would against a peer that is gone)
        cfg = mrc.QPConfig(max_timeout_retries=2)
        b = await mrc.connect(
            "::1", listener.port, mrc.ConnectConfig(evs=4, request_size=4096, qp=cfg)
        )
        peer_b = await listener.accept(timeout=5)
        assert peer_a.granted is not None and peer_b.granted is not None
        a_region = a.remote[peer_a.granted.name] if peer_a.granted.name else a.requested
        assert a_region is not None
        # B aims at A's region with A's rkey and address: refused, nothing written
        with pytest.raises(mrc.MRCError, match="retry budget exhausted"):
            await asyncio.wait_for(b.write(b"\xff" * 512, a_region, offset=0), 10)
        assert bytes(peer_a.granted.view) == bytes(4096)
        assert peer_b.qp.stats.dropped_by_reason["bad_rkey"] >= 1
        assert peer_b.qp.stats.nacks_sent == 0
        # each peer still writes its own region
        assert b.requested is not None and a.requested is not None
        await a.write(b"\x01" * 512, a.requested, offset=0)
        assert bytes(peer_a.granted.view[:512]) == b"\x01" * 512
        c = await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=4, request_size=4096))
        peer_c = await listener.accept(timeout=5)
        assert c.requested is not None and peer_c.granted is not None
        await c.write(b"\x02" * 100, c.requested, offset=7)
        assert bytes(peer_c.granted.view[7:107]) == b"\x02" * 100
        assert bytes(peer_a.granted.view[:512]) == b"\x01" * 512
        for conn in (a, b, c):
            await conn.close()
    finally:
        await listener.close()


def test_region_addresses_are_random_and_never_overlap() -> None:
    firsts = set()
    for _ in range(20):
        pd = ProtectionDomain()
        regions = [pd.register(bytearray(n)) for n in (1, 70_000, 5, 1 << 20)]
        firsts.add(regions[0].addr)
        spans = sorted((r.addr, r.addr + r.length) for r in regions)
        assert all(end <= nxt for (_s, end), (nxt, _e) in zip(spans, spans[1:], strict=False))
        assert all(r.addr + r.length < 1 << 63 for r in regions)
    assert len(firsts) == 20 and 1 << 32 not in firsts
