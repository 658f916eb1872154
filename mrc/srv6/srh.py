"""IPv6 Segment Routing Header (RFC 8754, routing type 4): encode and decode.

Layout (8 fixed bytes, then 16 bytes per segment, then optional TLVs)::

    0: Next Header   1: Hdr Ext Len (8-octet units, not counting the first 8)
    2: Routing Type = 4                 3: Segments Left
    4: Last Entry    5: Flags           6-7: Tag
    8: Segment List[0] ... Segment List[Last Entry]

The segment list is stored **in reverse travel order**: ``Segment List[0]`` is the *final*
destination and ``Segment List[Last Entry]`` is the *first* segment.  ``Segments Left`` indexes
the segment currently being travelled to, so a fresh packet has ``Segments Left = n - 1`` and
its IPv6 destination is ``Segment List[n - 1]``.  This module takes and returns segments in
**travel order** (first hop first) and does the reversal itself, so callers never have to.

Using it as a sticky socket option (``setsockopt(IPPROTO_IPV6, IPV6_RTHDR, header)``), verified
on the wire on this kernel (6.18) with an AF_PACKET capture, see tests/fabric/test_srv6.py and
``ipv6_push_rthdr4()`` in net/ipv6/exthdrs.c:

* the kernel sends the packet to ``Segment List[Segments Left]`` (the first segment): that
  becomes the IPv6 destination address and is what the route lookup uses;
* it **overwrites** ``Segment List[0]`` on the wire with the socket's destination (the
  ``sendto``/``connect`` address).  So always send to the *final* destination, and encode the
  final destination as the last travel-order segment too (as :func:`encode_srh` does) so the
  header you read back with :func:`decode_srh` matches what was sent;
* Next Header is filled in by the kernel (we write 0); UDP/ICMPv6 checksums are computed
  against the final destination, as RFC 8200 requires;
* the same header as a per-packet ancillary message (``IPV6_RTHDR`` cmsg) is rejected with
  EINVAL here; only the sticky option works, hence one socket per path.

Routers and the final host must have ``seg6_enabled=1`` (all and the ingress interface) or
they drop SRH packets addressed to them.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Sequence
from dataclasses import dataclass

IPV6_RTHDR = 57  # setsockopt/cmsg option number (linux/in6.h)
IPV6_RECVRTHDR = 56
ROUTING_TYPE_SRH = 4

_FIXED = struct.Struct("!BBBBBBH")

Address = str | ipaddress.IPv6Address


@dataclass(frozen=True)
class SegmentRoutingHeader:
    """A decoded SRH.  ``segments`` are in *travel order* (first segment first)."""

    segments: tuple[str, ...]
    segments_left: int
    next_header: int = 0
    flags: int = 0
    tag: int = 0
    tlvs: bytes = b""

    @property
    def last_entry(self) -> int:
        return len(self.segments) - 1

    @property
    def wire_segments(self) -> tuple[str, ...]:
        """Segments in on-the-wire order (``[0]`` = final destination)."""
        return tuple(reversed(self.segments))

    @property
    def active_segment(self) -> str:
        """The segment the packet is currently travelling to (``Segment List[Segments Left]``)."""
        return self.wire_segments[self.segments_left]

    def encode(self) -> bytes:
        n = len(self.segments)
        if n == 0:
            raise ValueError("an SRH needs at least one segment")
        if n > 127:
            raise ValueError("an SRH holds at most 127 segments (Hdr Ext Len is one byte)")
        if not 0 <= self.segments_left <= n - 1:
            raise ValueError(f"segments_left {self.segments_left} out of range for {n} segments")
        if len(self.tlvs) % 8:
            raise ValueError("SRH TLVs must pad the header to a multiple of 8 bytes")
        hdr_ext_len = 2 * n + len(self.tlvs) // 8
        if hdr_ext_len > 255:
            raise ValueError("SRH too long")
        fixed = _FIXED.pack(
            self.next_header,
            hdr_ext_len,
            ROUTING_TYPE_SRH,
            self.segments_left,
            n - 1,
            self.flags,
            self.tag,
        )
        body = b"".join(ipaddress.IPv6Address(s).packed for s in self.wire_segments)
        return fixed + body + self.tlvs


def encode_srh(
    segments: Sequence[Address],
    *,
    next_header: int = 0,
    flags: int = 0,
    tag: int = 0,
) -> bytes:
    """Encode a fresh SRH for ``segments`` given in travel order, final destination last.

    ``Segments Left`` is ``len(segments) - 1``: the packet starts out towards the first segment.
    The result is what to pass to ``setsockopt(IPPROTO_IPV6, IPV6_RTHDR, ...)``.
    """
    segs = tuple(str(ipaddress.IPv6Address(s)) for s in segments)
    return SegmentRoutingHeader(
        segments=segs,
        segments_left=len(segs) - 1,
        next_header=next_header,
        flags=flags,
        tag=tag,
    ).encode()


def decode_srh(data: bytes) -> SegmentRoutingHeader:
    """Decode an SRH (e.g. from a capture or ``IPV6_RECVRTHDR``); ``data`` may run past it."""
    if len(data) < 8:
        raise ValueError("truncated SRH: fewer than 8 bytes")
    next_header, hdr_ext_len, rtype, seg_left, last_entry, flags, tag = _FIXED.unpack_from(data)
    if rtype != ROUTING_TYPE_SRH:
        raise ValueError(f"not an SRH: routing type {rtype}")
    total = 8 + 8 * hdr_ext_len
    if len(data) < total:
        raise ValueError(f"truncated SRH: need {total} bytes, have {len(data)}")
    n = last_entry + 1
    if 16 * n > 8 * hdr_ext_len:
        raise ValueError(f"SRH last entry {last_entry} does not fit in {total} bytes")
    if seg_left > last_entry:
        raise ValueError(f"SRH segments left {seg_left} > last entry {last_entry}")
    wire = [str(ipaddress.IPv6Address(data[8 + 16 * i : 24 + 16 * i])) for i in range(n)]
    return SegmentRoutingHeader(
        segments=tuple(reversed(wire)),
        segments_left=seg_left,
        next_header=next_header,
        flags=flags,
        tag=tag,
        tlvs=bytes(data[8 + 16 * n : total]),
    )
