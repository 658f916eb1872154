"""UDP GSO bursts out, GRO trains in: what is coalesced, and that data survives it whole."""

from __future__ import annotations

import hashlib
import os
import socket
from typing import cast

import mrc
from mrc.core.config import QPConfig
from mrc.core.events import Burst
from mrc.transport import gso

HOST = "::1"


def _burst(ev: int, sizes: list[int], hdr: int = 28) -> Burst:
    """A burst of datagrams with ``hdr``-byte headers and payloads of ``sizes``."""
    bufs: list[bytes | memoryview] = []
    for size in sizes:
        bufs += [b"h" * hdr, b"p" * size]
    return (ev, bufs, len(sizes), hdr + sizes[0])


def test_sends_takes_bursts_whole_and_single_datagrams_plain() -> None:
    sends = gso.sends([_burst(1, [100] * 3), _burst(2, [100, 100, 40]), _burst(3, [0])])
    assert [(ev, n) for ev, _b, _c, n in sends] == [(1, 3), (2, 3), (3, 1)]
    ev, bufs, cmsg, n = sends[0]
    assert len(bufs) == 6 and cmsg == [(gso.SOL_UDP, gso.UDP_SEGMENT, (128).to_bytes(2, "little"))]
    assert sends[1][1][-1] == b"p" * 40  # the shorter last datagram ends its send
    assert sends[2][2] == []  # a single datagram goes without a cmsg


def test_sends_respects_the_kernels_limits() -> None:
    many = gso.sends([_burst(0, [100] * 200)])
    assert [n for *_x, n in many] == [64, 64, 64, 8]
    big = gso.sends([_burst(0, [8192] * 20)])
    assert [n for *_x, n in big] == [7, 7, 6]  # 7 x 8220 bytes fit in 65000, 8 do not
    assert all(sum(len(b) for b in bufs) <= gso.MAX_BYTES for _e, bufs, _c, _n in big)
    tail = gso.sends([_burst(0, [8192] * 8)])  # 7 + a lone last one: that one goes plain
    assert [(n, c) for _e, _b, c, n in tail] == [(7, gso._segment(8220)), (1, [])]
    huge = gso.sends([_burst(0, [40000, 40000])])  # not 2 to a send: one by one
    assert [(n, c) for _e, _b, c, n in huge] == [(1, []), (1, [])]
    # every datagram exactly once, in order
    for out, spec in ((many, [100] * 200), (big, [8192] * 20), (huge, [40000] * 2)):
        flat = [b for _e, bufs, _c, _n in out for b in bufs]
        assert flat == _burst(0, spec)[1]


def _gathered(burst: Burst) -> Burst:
    """``burst`` with its datagrams back to back in one buffer (as the core gathers them)."""
    ev, bufs, count, seg = burst
    return (ev, [memoryview(b"".join(bufs))], count, seg)


def _datagrams(sends: list[gso.Send]) -> list[tuple[int, bytes, int]]:
    """(EV, bytes, datagrams) of each send."""
    return [(ev, b"".join(bytes(b) for b in bufs), n) for ev, bufs, _c, n in sends]


def test_a_gathered_burst_is_cut_as_its_pairs_are() -> None:
    """A gathered burst (one buffer) goes out in the same sends, with the same bytes and
    control messages, as the same burst in header and payload pairs, whatever the cut."""
    for spec in ([100] * 200, [8192] * 20, [8192] * 8, [40000] * 2, [100, 100, 40], [7]):
        pairs = _burst(3, spec)
        for cut in (gso.sends, gso.singles):
            want, got = cut([pairs]), cut([_gathered(pairs)])
            assert _datagrams(got) == _datagrams(want)
            assert [c for *_x, c, _n in got] == [c for *_x, c, _n in want]
            assert all(len(bufs) == 1 for _e, bufs, _c, _n in got)


def test_a_refused_gso_send_splits_into_its_datagrams_either_way() -> None:
    """Where the kernel refuses GSO the transport resends a send datagram by datagram: the
    segment size of a gathered one comes from its control message."""
    pairs = _burst(5, [100] * 6 + [40])
    for burst in (pairs, _gathered(pairs)):
        (send,) = gso.sends([burst])
        one_by_one = gso.split(send)
        assert [n for *_x, n in one_by_one] == [1] * 7
        assert _datagrams(one_by_one) == _datagrams(gso.singles([pairs]))


def test_singles_is_one_send_per_datagram() -> None:
    out = gso.singles([_burst(0, [10, 10]), _burst(1, [5])])
    assert out == [
        (0, [b"h" * 28, b"p" * 10], [], 1),
        (0, [b"h" * 28, b"p" * 10], [], 1),
        (1, [b"h" * 28, b"p" * 5], [], 1),
    ]


async def test_bursts_arrive_whole_through_gso_and_gro() -> None:
    data = os.urandom(24 << 20)
    region = bytearray(len(data))
    listener = await mrc.listen(HOST, 0)
    listener.register(region, name="inbox")
    cfg = QPConfig(payload_size=8192, burst=8)
    conn = await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=16, qp=cfg))
    try:
        await listener.accept(timeout=5)
        await conn.write(data, conn.remote["inbox"])
        assert hashlib.sha256(region).digest() == hashlib.sha256(data).digest()
        assert conn.channel.gso and conn.channel.gso_error is None
        # the receiver took trains of datagrams in single receives
        assert listener.endpoint.gro and listener.endpoint.gro_trains > 0
        # bursts are runs of EVs: every EV still carried a share
        packets = [cast(int, row["packets"]) for row in conn.ev_report()[:16]]
        assert min(packets) > 0, packets
    finally:
        await conn.close()
        await listener.close()


async def test_gathered_bursts_arrive_whole_through_gso_and_gro() -> None:
    """At 1400 bytes (below gather_max) every burst of new data goes out gathered, one buffer
    per GSO send: the data arrives whole in GRO trains, as with pairs of views."""
    data = os.urandom(8 << 20)
    region = bytearray(len(data))
    listener = await mrc.listen(HOST, 0)
    listener.register(region, name="inbox")
    cfg = QPConfig(payload_size=1400, burst=32)
    assert cfg.payload_size <= cfg.gather_max
    conn = await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=16, qp=cfg))
    gathered = 0
    qp = conn.channel.qp
    to_send = qp.bursts_to_send

    def counting(now: float) -> list[Burst]:
        nonlocal gathered
        bursts = to_send(now)
        gathered += sum(len(bufs) == 1 and n > 1 for _ev, bufs, n, _seg in bursts)
        return bursts

    qp.bursts_to_send = counting  # type: ignore[method-assign]
    try:
        await listener.accept(timeout=5)
        await conn.write(data, conn.remote["inbox"])
        assert hashlib.sha256(region).digest() == hashlib.sha256(data).digest()
        assert conn.channel.gso and conn.channel.gso_error is None
        assert gathered > 100
        assert listener.endpoint.gro and listener.endpoint.gro_trains > 0
    finally:
        await conn.close()
        await listener.close()


def test_datagram_room_is_the_path_mtu_less_headers_and_the_srh() -> None:
    """What an EV may send unfragmented (GSO segments cannot be fragmented): loopback's MTU
    less 40 + 8 bytes of IPv6 and UDP headers, less the sticky routing header; None for a
    socket without an IPv6 path MTU."""
    from pathlib import Path

    from mrc.srv6 import encode_srh
    from mrc.transport.sockets import datagram_room, ev_socket

    mtu = int(Path("/sys/class/net/lo/mtu").read_text())
    plain = ev_socket("::1", ("::1", 9))
    srh = encode_srh(["::1"])
    routed = ev_socket("::1", ("::1", 9), srh)
    try:
        assert datagram_room(plain) == mtu - 48
        assert datagram_room(routed) == mtu - 48 - len(srh) and len(srh) == 24
    finally:
        plain.close()
        routed.close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s4:
        assert datagram_room(s4) is None
