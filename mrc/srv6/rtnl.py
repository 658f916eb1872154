"""Just enough rtnetlink for a host's uSID routes: add and delete routes and rules, ask a route.

Why not pyroute2: it is not a dependency of the transport (only of the lab), and it cannot
express what a uSID host needs most, ``seg6 mode encap.red`` (an outer IPv6 header and no
routing header: its seg6 modes are inline and encap, which adds an SRH). Why not ``ip``:
mrc-send and mrc-recv ask the kernel, unprivileged, whether the routes are in place, and a
subprocess per question would cost more than the question. The messages are the ones iproute2
sends for the equivalent ``ip -6 route``/``ip -6 rule`` lines (:mod:`mrc.srv6.hostroutes`
prints those), so ``ip`` shows exactly what this module installed.

Only IPv6, only the attributes used here; numbers from linux/rtnetlink.h, fib_rules.h,
lwtunnel.h, seg6_iptunnel.h and seg6_local.h.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

from .srh import decode_srh, encode_srh

NETLINK_ROUTE = 0

RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RTM_NEWRULE, RTM_DELRULE = 32, 33
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400
NLA_F_NESTED = 0x8000

RTA_DST, RTA_SRC, RTA_OIF, RTA_GATEWAY, RTA_METRICS, RTA_TABLE = 1, 2, 4, 5, 8, 15
RTA_ENCAP_TYPE, RTA_ENCAP, RTA_IP_PROTO, RTA_SPORT = 21, 22, 27, 28
RTAX_MTU = 2
FRA_PRIORITY, FRA_TABLE, FRA_IP_PROTO, FRA_SPORT_RANGE = 6, 15, 22, 23

RT_TABLE_MAIN, RT_TABLE_LOCAL, RT_TABLE_COMPAT = 254, 255, 252
RTPROT_BOOT = 3  # what ``ip route add`` says when not told a protocol
RT_SCOPE_UNIVERSE = 0
RTN_UNICAST = 1
FR_ACT_TO_TBL = 1

LWTUNNEL_ENCAP_SEG6, LWTUNNEL_ENCAP_SEG6_LOCAL = 5, 7
SEG6_IPTUNNEL_SRH = 1
SEG6_IPTUN_MODE_ENCAP_RED = 3
SEG6_LOCAL_ACTION, SEG6_LOCAL_TABLE = 1, 3
SEG6_LOCAL_ACTION_END_DT6 = 7

_NLMSG = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_RTMSG = struct.Struct(
    "=BBBBBBBBI"
)  # family, dst_len, src_len, tos, table, proto, scope, type, flags
_FIBRULE = struct.Struct(
    "=BBBBBBBBI"
)  # family, dst_len, src_len, tos, table, res1, res2, action, flags
_RTA = struct.Struct("=HH")
_ERR = struct.Struct("=i")


def _attr(kind: int, data: bytes) -> bytes:
    body = _RTA.pack(_RTA.size + len(data), kind) + data
    return body + b"\0" * (-len(body) % 4)


def _u32(kind: int, value: int) -> bytes:
    return _attr(kind, struct.pack("=I", value))


def _addr(kind: int, address: str) -> bytes:
    return _attr(kind, ipaddress.IPv6Address(address).packed)


def _attrs(data: bytes) -> dict[int, bytes]:
    """Type -> payload of each attribute in ``data`` (the last one wins; flags stripped)."""
    out: dict[int, bytes] = {}
    off = 0
    while off + _RTA.size <= len(data):
        length, kind = _RTA.unpack_from(data, off)
        if length < _RTA.size:
            break
        out[kind & ~NLA_F_NESTED] = data[off + _RTA.size : off + length]
        off += (length + 3) & ~3
    return out


def _uint(found: dict[int, bytes], kind: int, fmt: str, default: int) -> int:
    data = found.get(kind)
    if data is None or len(data) < struct.calcsize(fmt):
        return default
    value: int = struct.unpack_from(fmt, data)[0]
    return value


@dataclass(frozen=True)
class Route:
    """One IPv6 route: ``dst`` a prefix; ``encap_segs`` a uSID container to encapsulate toward
    (``encap seg6 mode encap.red segs C``) or ``decap`` (``encap seg6local action End.DT6
    table local``); ``mtu``: the route's MTU metric (0: none)."""

    dst: str
    dev: str
    gateway: str | None = None
    table: int = RT_TABLE_MAIN
    encap_segs: str | None = None
    decap: bool = False
    mtu: int = 0


@dataclass(frozen=True)
class Rule:
    """``from all ipproto udp sport LO-HI lookup TABLE`` at ``priority``."""

    priority: int
    table: int
    sport: tuple[int, int]


@dataclass(frozen=True)
class Answer:
    """What the kernel said of a route lookup (``ip -6 route get``): the route's table, its
    output interface (0: none), its encapsulation type (0: none) and, for a seg6
    encapsulation, the uSID container it sends to."""

    table: int
    oif: int
    encap: int
    encap_segs: str | None


class Netlink:
    """A NETLINK_ROUTE socket of the calling thread's namespace; requests one at a time, each
    acknowledged (or answered) before the next."""

    def __init__(self) -> None:
        self.sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE
        )
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Netlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, kind: int, flags: int, body: bytes) -> list[tuple[int, bytes]]:
        """Send one request and return the messages it got back, (type, payload), ending at
        the acknowledgement; a refusal raises OSError with the kernel's errno."""
        self.seq += 1
        seq = self.seq
        msg = _NLMSG.pack(_NLMSG.size + len(body), kind, NLM_F_REQUEST | flags, seq, 0) + body
        self.sock.send(msg)
        out: list[tuple[int, bytes]] = []
        while True:
            data = self.sock.recv(1 << 16)
            off = 0
            while off + _NLMSG.size <= len(data):
                length, mtype, _flags, mseq, _pid = _NLMSG.unpack_from(data, off)
                payload = data[off + _NLMSG.size : off + length]
                off += (length + 3) & ~3
                if mseq != seq:
                    continue
                if mtype == NLMSG_ERROR:
                    (code,) = _ERR.unpack_from(payload)
                    if code:
                        raise OSError(-code, os.strerror(-code))
                    return out
                if mtype == NLMSG_DONE:
                    return out
                out.append((mtype, payload))
                if not flags & NLM_F_ACK:
                    return out

    def route(self, route: Route, add: bool, ifindex: int) -> None:
        """``ip -6 route replace`` (``add``) or ``ip -6 route del`` of ``route``."""
        net = ipaddress.IPv6Network(route.dst)
        table8 = route.table if route.table < 256 else RT_TABLE_COMPAT
        head = _RTMSG.pack(
            socket.AF_INET6,
            net.prefixlen,
            0,
            0,
            table8,
            RTPROT_BOOT if add else 0,
            RT_SCOPE_UNIVERSE,
            RTN_UNICAST,
            0,
        )
        attrs = [_addr(RTA_DST, str(net.network_address)), _u32(RTA_TABLE, route.table)]
        attrs.append(_u32(RTA_OIF, ifindex))
        if route.gateway is not None:
            attrs.append(_addr(RTA_GATEWAY, route.gateway))
        if add:
            if route.mtu:
                attrs.append(_attr(RTA_METRICS | NLA_F_NESTED, _u32(RTAX_MTU, route.mtu)))
            if route.encap_segs is not None:
                tunnel = struct.pack("=i", SEG6_IPTUN_MODE_ENCAP_RED) + encode_srh(
                    [route.encap_segs]
                )
                attrs.append(_attr(RTA_ENCAP_TYPE, struct.pack("=H", LWTUNNEL_ENCAP_SEG6)))
                attrs.append(_attr(RTA_ENCAP | NLA_F_NESTED, _attr(SEG6_IPTUNNEL_SRH, tunnel)))
            elif route.decap:
                local = _u32(SEG6_LOCAL_ACTION, SEG6_LOCAL_ACTION_END_DT6) + _u32(
                    SEG6_LOCAL_TABLE, RT_TABLE_LOCAL
                )
                attrs.append(_attr(RTA_ENCAP_TYPE, struct.pack("=H", LWTUNNEL_ENCAP_SEG6_LOCAL)))
                attrs.append(_attr(RTA_ENCAP | NLA_F_NESTED, local))
        if add:
            self.request(
                RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, head + b"".join(attrs)
            )
        else:
            self.request(RTM_DELROUTE, NLM_F_ACK, head + b"".join(attrs))

    def rule(self, rule: Rule, add: bool) -> None:
        """``ip -6 rule add`` (refused with EEXIST when the same rule is there) or ``del``."""
        table8 = rule.table if rule.table < 256 else RT_TABLE_COMPAT
        head = _FIBRULE.pack(socket.AF_INET6, 0, 0, 0, table8, 0, 0, FR_ACT_TO_TBL, 0)
        attrs = (
            _u32(FRA_PRIORITY, rule.priority)
            + _u32(FRA_TABLE, rule.table)
            + _attr(FRA_IP_PROTO, bytes([socket.IPPROTO_UDP]))
            + _attr(FRA_SPORT_RANGE, struct.pack("=HH", *rule.sport))
        )
        if add:
            self.request(RTM_NEWRULE, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, head + attrs)
        else:
            self.request(RTM_DELRULE, NLM_F_ACK, head + attrs)

    def get_route(self, dst: str, src: str | None = None, sport: int | None = None) -> Answer:
        """The route a UDP socket bound to ``[src]:sport`` takes to ``dst`` (``ip -6 route
        get DST from SRC ipproto udp sport SPORT``); any user may ask. OSError if none."""
        head = _RTMSG.pack(socket.AF_INET6, 128, 128 if src else 0, 0, 0, 0, 0, 0, 0)
        attrs = _addr(RTA_DST, dst)
        if src is not None:
            attrs += _addr(RTA_SRC, src)
        if sport is not None:
            attrs += _attr(RTA_IP_PROTO, bytes([socket.IPPROTO_UDP]))
            attrs += _attr(RTA_SPORT, struct.pack("!H", sport))
        for mtype, payload in self.request(RTM_GETROUTE, 0, head + attrs):
            if mtype != RTM_NEWROUTE:
                continue
            found = _attrs(payload[_RTMSG.size :])

            kind = _uint(found, RTA_ENCAP_TYPE, "=H", 0)
            segs = None
            if kind == LWTUNNEL_ENCAP_SEG6:
                tunnel = _attrs(found.get(RTA_ENCAP, b"")).get(SEG6_IPTUNNEL_SRH, b"")
                if len(tunnel) > 4:
                    segs = decode_srh(tunnel[4:]).segments[0]
            table = _uint(found, RTA_TABLE, "=I", payload[4])
            return Answer(table, _uint(found, RTA_OIF, "=I", 0), kind, segs)
        raise OSError(errno.ENETUNREACH, "no route")
