"""UDP GSO bursts out, GRO trains in: what is coalesced, and that data survives it whole."""

from __future__ import annotations

import hashlib
import os

import mrc
from mrc.core.config import QPConfig
from mrc.transport import gso

HOST = "::1"


def _dgrams(spec: list[tuple[int, int]]) -> list[tuple[int, bytes, bytes]]:
    """(ev, payload size) -> datagrams with a 28-byte header."""
    return [(ev, b"h" * 28, b"p" * size) for ev, size in spec]


def test_coalesce_groups_runs_of_one_ev_and_one_size() -> None:
    sends = gso.coalesce(_dgrams([(1, 100)] * 3 + [(2, 100), (2, 100), (2, 40), (2, 100), (3, 0)]))
    assert [(ev, n) for ev, _b, _c, n in sends] == [(1, 3), (2, 3), (2, 1), (3, 1)]
    ev, bufs, cmsg, n = sends[0]
    assert len(bufs) == 6 and cmsg == [(gso.SOL_UDP, gso.UDP_SEGMENT, (128).to_bytes(2, "little"))]
    assert sends[2][2] == [] and sends[3][2] == []  # single datagrams go without a cmsg


def test_coalesce_respects_the_kernels_limits() -> None:
    many = gso.coalesce(_dgrams([(0, 100)] * 200))
    assert [n for *_x, n in many] == [64, 64, 64, 8]
    big = gso.coalesce(_dgrams([(0, 8192)] * 20))
    assert [n for *_x, n in big] == [7, 7, 6]  # 7 x 8220 bytes fit in 65000, 8 do not
    assert all(sum(len(b) for b in bufs) <= gso.MAX_BYTES for _e, bufs, _c, _n in big)
    larger = gso.coalesce(_dgrams([(0, 10), (0, 20)]))  # a longer one never follows
    assert [n for *_x, n in larger] == [1, 1]


def test_one_by_one_is_todays_per_datagram_send() -> None:
    d = _dgrams([(0, 10), (0, 10)])
    assert gso.one_by_one(d) == [(0, [b"h" * 28, b"p" * 10], [], 1)] * 2


async def test_bursts_arrive_whole_through_gso_and_gro() -> None:
    data = os.urandom(24 << 20)
    region = bytearray(len(data))
    listener = await mrc.listen(HOST, 0)
    listener.register(region, name="inbox")
    cfg = QPConfig(payload_size=8192, burst=8)
    conn = await mrc.connect(HOST, listener.port, evs=16, config=cfg)
    try:
        await listener.accept(timeout=5)
        await conn.write(data, conn.remote["inbox"])
        assert hashlib.sha256(region).digest() == hashlib.sha256(data).digest()
        assert conn.channel.gso and conn.channel.gso_error is None
        # the receiver took trains of datagrams in single receives
        assert listener.endpoint.gro and listener.endpoint.gro_trains > 0
        # bursts are runs of EVs: every EV still carried a share
        packets = [row["packets"] for row in conn.ev_report()[:16]]
        assert min(packets) > 0, packets
    finally:
        await conn.close()
        await listener.close()
