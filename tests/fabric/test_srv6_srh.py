"""SRH encode/decode (RFC 8754) round trips and wire layout; no root needed."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest

from mrc.srv6.srh import SegmentRoutingHeader, decode_srh, encode_srh

SEGS = ["fd00:0:4::1", "fd00:0:3:1::1", "fd00:0:1:3::2"]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 127])
def test_round_trip(n: int) -> None:
    segs = [str(ipaddress.IPv6Address(0xFD00 << 112 | i + 1)) for i in range(n)]
    raw = encode_srh(segs)
    assert len(raw) == 8 + 16 * n
    srh = decode_srh(raw)
    assert srh.segments == tuple(segs)
    assert srh.segments_left == n - 1
    assert srh.last_entry == n - 1
    assert srh.active_segment == segs[0]
    assert srh.encode() == raw


def test_wire_layout_is_reversed() -> None:
    raw = encode_srh(SEGS, tag=0xBEEF)
    assert raw[0] == 0  # next header: the kernel fills it in
    assert raw[1] == 2 * len(SEGS)  # hdr ext len, 8-octet units past the first 8
    assert raw[2] == 4  # routing type: SRH
    assert raw[3] == len(SEGS) - 1  # segments left
    assert raw[4] == len(SEGS) - 1  # last entry
    assert raw[6:8] == b"\xbe\xef"
    # Segment List[0] is the final destination, the last entry the first segment
    assert raw[8:24] == ipaddress.IPv6Address(SEGS[-1]).packed
    assert raw[-16:] == ipaddress.IPv6Address(SEGS[0]).packed


def test_decode_mid_path_and_tlvs() -> None:
    srh = SegmentRoutingHeader(
        segments=tuple(SEGS),
        segments_left=1,
        next_header=17,
        flags=0,
        tag=7,
        tlvs=b"\x01\x06" + bytes(6),
    )
    back = decode_srh(srh.encode() + b"trailing payload")
    assert back == srh
    assert back.active_segment == SEGS[1]
    assert back.wire_segments == tuple(reversed(SEGS))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b[:7], "truncated"),
        (lambda b: b[:2] + b"\x00" + b[3:], "routing type"),
        (lambda b: b[:-1], "truncated"),
        (lambda b: b[:3] + b"\x05" + b[4:], "segments left"),
        (lambda b: b[:4] + b"\x09" + b[5:], "last entry"),
    ],
)
def test_decode_rejects_garbage(mutate: Callable[[bytes], bytes], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_srh(mutate(encode_srh(SEGS)))


def test_encode_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        encode_srh([])
    with pytest.raises(ValueError):
        encode_srh(["not-an-address"])
    with pytest.raises(ValueError):
        SegmentRoutingHeader(segments=tuple(SEGS), segments_left=3).encode()
    with pytest.raises(ValueError):
        SegmentRoutingHeader(segments=tuple(SEGS), segments_left=0, tlvs=b"\x01").encode()


def test_agrees_with_scapy() -> None:
    inet6 = pytest.importorskip("scapy.layers.inet6")
    ours = encode_srh(SEGS)
    theirs = inet6.IPv6ExtHdrSegmentRouting(ours)
    assert theirs.type == 4
    assert theirs.segleft == len(SEGS) - 1
    assert theirs.lastentry == len(SEGS) - 1
    assert [str(a) for a in theirs.addresses] == list(reversed(SEGS))
    built = bytes(
        inet6.IPv6ExtHdrSegmentRouting(
            nh=17, addresses=list(reversed(SEGS)), segleft=2, lastentry=2
        )
    )
    back = decode_srh(built)
    assert back.segments == tuple(SEGS)
    assert back.next_header == 17


def test_too_many_segments() -> None:
    with pytest.raises(ValueError, match="127"):
        encode_srh([f"fd00::{i + 1:x}" for i in range(128)])
