"""ECN on the wire: senders mark ECT(0), receivers read the IP ECN field of every datagram.

Why in the transport and not the core: the ECN field is in the IP header, which only the
socket layer sees. A fabric port whose queue is above its threshold rewrites ECT to CE
(mrc/lab/fabric/trim/mrc_trim.bpf.c); the receiving endpoint turns a CE datagram into a BTH FECN
mark before the core sees it, and the core already echoes FECN as BECN in its ACKs
(docs/PROTOCOL.md 3.1). FECN is one of the BTH bits switches may change in flight, so the
header ICV of a protected packet does not cover it (mrc/security/packet.py MUTABLE_BYTE4).

Costs: the sender pays nothing per packet (a sticky socket option). The receiver asks for the
traffic class as a control message on every receive: one more small cmsg per ``recvmsg``
(measured in docs/PERFORMANCE.md, "ECN"); ``Endpoint(ecn=False)`` turns it off.
"""

from __future__ import annotations

import socket
import sys

#: The two-bit ECN field (RFC 3168): the low bits of the IPv6 traffic class / IPv4 TOS.
ECN_MASK = 0x03
NOT_ECT = 0x00
ECT1 = 0x01
ECT0 = 0x02
CE = 0x03

IPV6_TCLASS = getattr(socket, "IPV6_TCLASS", 67)
IPV6_RECVTCLASS = getattr(socket, "IPV6_RECVTCLASS", 66)
IP_TOS = getattr(socket, "IP_TOS", 1)
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)

#: room for the traffic class control message (an int for IPv6, one byte for IPv4)
CMSG_SPACE = socket.CMSG_SPACE(4)

_IPPROTO_IPV6 = socket.IPPROTO_IPV6
_IPPROTO_IP = socket.IPPROTO_IP
_TCLASS_CMSGS = frozenset({(_IPPROTO_IPV6, IPV6_TCLASS), (_IPPROTO_IP, IP_TOS)})


def mark_ect0(sock: socket.socket) -> bool:
    """Send every datagram of ``sock`` with ECT(0) (DSCP 0); False if the kernel refused."""
    try:
        if sock.family == socket.AF_INET6:
            sock.setsockopt(_IPPROTO_IPV6, IPV6_TCLASS, ECT0)
        else:
            sock.setsockopt(_IPPROTO_IP, IP_TOS, ECT0)
    except OSError:
        return False
    return True


def enable_recv(sock: socket.socket, tclass: bool = True) -> bool:
    """Ask for the traffic class (IPv6) and TOS (IPv4 and v4-mapped) of every datagram as a
    control message; False if the kernel offers neither. ``tclass`` False: the caller reads
    the IPv6 traffic class from the flow information (mrc/transport/flowlabel.py), so only
    the TOS is asked for here."""
    ok = False
    if sock.family == socket.AF_INET6 and not tclass:
        ok = True
    elif sock.family == socket.AF_INET6:
        try:
            sock.setsockopt(_IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
            ok = True
        except OSError:
            pass
    try:  # a dual-stack socket receives IPv4 datagrams too: their TOS comes as IP_TOS
        sock.setsockopt(_IPPROTO_IP, IP_RECVTOS, 1)
        ok = True
    except OSError:
        pass
    return ok


def is_ce(level: int, kind: int, data: bytes) -> bool | None:
    """CE or not, if this control message is the traffic class / TOS; None otherwise."""
    if (level, kind) in _TCLASS_CMSGS:
        return bool(data) and int.from_bytes(data, sys.byteorder) & ECN_MASK == CE
    return None
