"""IPv6 flow labels: the low half of a 32-bit EV, set per send and read per receive.

Sending: ``IPV6_FLOWINFO_SEND`` on a socket lets each ``sendmsg`` carry its own label in an
``IPV6_FLOWINFO`` control message. The kernel takes it without a label lease (those are only
checked once some socket of the namespace asked for an exclusive one) and keeps the socket's
sticky options (the traffic class with ECT(0), an SRv6 routing header) for that datagram; a
GSO send gives every segment the same label, which is what a burst on one EV needs.

Receiving: ``IPV6_FLOWINFO`` on a socket adds a control message with the first 32 bits of
each datagram's IPv6 header less the version: traffic class and flow label. GRO coalesces
only datagrams whose labels match, so one label stands for a whole train.
"""

from __future__ import annotations

import socket
import struct

IPV6_FLOWINFO = getattr(socket, "IPV6_FLOWINFO", 11)
IPV6_FLOWINFO_SEND = getattr(socket, "IPV6_FLOWINFO_SEND", 33)
#: room for the flow information control message (a 32-bit value)
CMSG_SPACE = socket.CMSG_SPACE(4)
FLOWLABEL_MASK = 0xFFFFF  # the 20-bit label of the IPv6 header
TCLASS_SHIFT = 20

_IPPROTO_IPV6 = socket.IPPROTO_IPV6
_cmsgs: dict[int, tuple[int, int, bytes]] = {}


def enable_send(sock: socket.socket) -> bool:
    """Let ``sock`` label each datagram itself; False if the kernel refused."""
    try:
        sock.setsockopt(_IPPROTO_IPV6, IPV6_FLOWINFO_SEND, 1)
    except OSError:
        return False
    return True


def enable_recv(sock: socket.socket) -> bool:
    """Ask for every IPv6 datagram's flow information as a control message; False if the
    kernel refused (an IPv4 socket)."""
    if sock.family != socket.AF_INET6:
        return False
    try:
        sock.setsockopt(_IPPROTO_IPV6, IPV6_FLOWINFO, 1)
    except OSError:
        return False
    return True


def cmsg(label: int) -> tuple[int, int, bytes]:
    """The control message that sends a datagram with flow label ``label`` (cached)."""
    out = _cmsgs.get(label)
    if out is None:
        out = _cmsgs[label] = (_IPPROTO_IPV6, IPV6_FLOWINFO, struct.pack("!I", label))
    return out


def is_flowinfo(level: int, kind: int) -> bool:
    return level == _IPPROTO_IPV6 and kind == IPV6_FLOWINFO


def tclass_of(data: bytes) -> int:
    """The traffic class of a received flow information value."""
    return int.from_bytes(data[:4], "big") >> TCLASS_SHIFT & 0xFF if len(data) >= 4 else 0
