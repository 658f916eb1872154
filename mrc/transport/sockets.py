"""UDP socket set-up for MRC: listen sockets and one socket per entropy value (EV).

An EV is a distinct UDP source port, so each EV gets its own socket bound to the local address
of its plane and connected to the peer's address in that plane. Connected sockets make the
per-packet send a plain ``sendmsg`` without an address to parse.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
from collections.abc import Container

from mrc.srv6.srh import IPV6_RTHDR
from mrc.transport.ecn import mark_ect0
from mrc.transport.ports import PortRange, RangeExhausted, bind_in_range

SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # kernel receive times (the lab's probes)
IPV6_MTU = getattr(socket, "IPV6_MTU", 24)  # the path MTU of a connected IPv6 socket (Linux)
IPV6_UDP_HEADERS = 40 + 8  # an IPv6 header without extensions, and UDP's

RCVBUF = 16 << 20
SNDBUF = 4 << 20
#: An EV socket's send buffer: what one socket may have queued below it, in its NIC's queue
#: included (the kernel frees a datagram's memory only once the NIC takes it, and doubles the
#: figure for overhead). It plays the part of kernel TCP's small queues: a window law that
#: grows fast (a doubling start) made the sender's own NIC tail-drop whole runs of datagrams
#: that only a timeout repaired, where a bounded socket says EAGAIN and the rest waits in the
#: transport's backlog. 256 KiB keeps one socket's share under a 64-frame NIC queue at MTU
#: 9000 (docs/FABRIC.md, "Host queues") and, at 2.5 Gbit/s, still holds about 1 ms of sending.
EV_SNDBUF = 256 << 10


def udp6_counters() -> dict[str, int]:
    """The Udp6 counters of the calling thread's network namespace ({} if unreadable):
    thread-self, so a thread that entered another namespace reads that one's."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/thread-self/net/snmp6") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[0].startswith("Udp6"):
                out[parts[0]] = int(parts[1])
    return out


# SO_MEMINFO (linux/sock_diag.h): a socket's memory counters, u32 each; the first is what its
# receive queue holds, as the kernel charges it against SO_RCVBUF
_SO_MEMINFO = 55


def receive_queue_bytes(sock: socket.socket) -> int:
    """What ``sock``'s receive queue holds now, in the bytes the kernel charges against its
    ``SO_RCVBUF`` (about twice a datagram's payload on loopback). Raises OSError where the
    kernel has no ``SO_MEMINFO``."""
    return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, _SO_MEMINFO, 4), "little")


def receive_room(sock: socket.socket) -> int:
    """What ``sock``'s receive queue may hold, as the kernel reports ``SO_RCVBUF`` (twice what
    was asked for), in the units of :func:`receive_queue_bytes`; :data:`RCVBUF` if it will
    not say."""
    try:
        room: int = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    except OSError:
        return RCVBUF
    return room


def rcvbuf_drops() -> int | None:
    """Datagrams this namespace's kernel dropped for lack of room in a UDP socket's receive
    buffer, all sockets together (None: unknown). A QP that fails reports how many more there
    were meanwhile: evidence of a host too busy to read, not of a peer gone."""
    return udp6_counters().get("Udp6RcvbufErrors")


def _grow_buffer(sock: socket.socket, force: int, plain: int, size: int) -> None:
    """Ask for a big buffer; as root the FORCE variant ignores net.core.[rw]mem_max."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)
    except OSError:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, plain, size)


def family_of(host: str) -> socket.AddressFamily:
    """AF_INET6 for IPv6 literals and names, AF_INET for IPv4 literals."""
    try:
        return socket.AF_INET if ipaddress.ip_address(host).version == 4 else socket.AF_INET6
    except ValueError:
        return socket.AF_INET6


def udp_socket(
    host: str,
    port: int,
    rcvbuf: int = RCVBUF,
    sndbuf: int = SNDBUF,
    ports: PortRange | None = None,
    avoid: Container[int] = (),
) -> socket.socket:
    """A non-blocking UDP socket bound to (host, port); raises OSError with the reason.
    Port 0 with ``ports``: a free port of that range other than those in ``avoid``
    (:class:`~mrc.transport.ports.RangeExhausted` if there is none)."""
    fam = family_of(host)
    sock = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        if fam == socket.AF_INET6 and host in ("::", ""):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        _grow_buffer(sock, SO_RCVBUFFORCE, socket.SO_RCVBUF, rcvbuf)
        _grow_buffer(sock, SO_SNDBUFFORCE, socket.SO_SNDBUF, sndbuf)
        if port == 0 and ports is not None:
            bind_in_range(sock, host, ports, avoid)
        else:
            sock.bind((host, port))
        sock.setblocking(False)
    except (OSError, RangeExhausted):
        sock.close()
        raise
    return sock


def ev_socket(
    local: str,
    peer: tuple[str, int],
    srh: bytes | None = None,
    ports: PortRange | None = None,
    avoid: Container[int] = (),
    mark: int = 0,
) -> socket.socket:
    """A socket with its own source port, connected to ``peer``: one EV.

    ``srh``: a Segment Routing Header to put on every packet (sticky IPV6_RTHDR, the only way
    the kernel accepts an SRH from a UDP socket), so the EV's packets follow its path.

    Every datagram leaves with ECT(0) in the IP ECN field (DSCP 0), so fabric ports can mark
    congestion as CE instead of only trimming or dropping (docs/PROTOCOL.md 3.1). Always on:
    a sticky option costs nothing per packet, and a window that ignores BECN (``cc="fixed"``)
    loses nothing by it.

    ``ports``: its source port from that range, none of ``avoid`` (mrc.transport.ports).

    ``mark``: an SO_MARK for the host's policy routing (needs CAP_NET_ADMIN); on a
    ``--srv6 usid`` fabric it picks the table that encapsulates toward the route's spine.
    """
    sock = udp_socket(local, 0, rcvbuf=1 << 16, sndbuf=EV_SNDBUF, ports=ports, avoid=avoid)
    try:
        mark_ect0(sock)
        if srh is not None:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RTHDR, srh)
        if mark:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
            except PermissionError:
                raise PermissionError(
                    errno.EPERM,
                    "a uSID fabric's routes pick their spine by socket mark (SO_MARK),"
                    " which needs CAP_NET_ADMIN",
                ) from None
        sock.connect(peer)
    except OSError:
        sock.close()
        raise
    return sock


def path_room(host: str, port: int, local: str | None = None) -> int | None:
    """:func:`datagram_room` of the route to ``(host, port)`` (from ``local``, if given),
    asked of a socket connected for the purpose: no datagram is sent. None where the kernel
    does not say, or there is no route."""
    family = family_of(host)
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            if local is not None:
                sock.bind((local, 0))
            sock.connect((host, port))
            return datagram_room(sock)
    except OSError:
        return None


def datagram_room(sock: socket.socket) -> int | None:
    """The largest UDP payload a connected EV socket sends without IP fragmentation: its path
    MTU less the IPv6 and UDP headers and its sticky routing header (SRH), if any; None where
    the kernel does not say (not IPv6, not connected).

    It matters for GSO: the kernel fragments an oversized datagram sent alone, but cannot
    fragment the segments of a GSO send, and an SRH that makes them exceed the MTU got them
    dropped without any counter moving (MTU 1500, 1400-byte payloads, an SRH of two segments:
    1516 bytes).
    """
    if sock.family != socket.AF_INET6:
        return None
    try:
        mtu = sock.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU)
        rthdr = len(sock.getsockopt(socket.IPPROTO_IPV6, IPV6_RTHDR, 1024))
    except OSError:
        return None
    return int(mtu) - IPV6_UDP_HEADERS - rthdr
