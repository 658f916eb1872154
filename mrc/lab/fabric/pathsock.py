"""Open a socket on one source-routed path from inside its source host's namespace (the
namespace fabric's ping and traffic tests use it; the transport opens its own sockets)."""

from __future__ import annotations

import socket

from mrc.srv6.paths import Path
from mrc.srv6.srh import IPV6_RTHDR

from . import netns


def open_path_socket(
    path: Path,
    *,
    port: int = 0,
    dst_port: int | None = None,
    blocking: bool = True,
    proto: int = socket.IPPROTO_UDP,
) -> socket.socket:
    """A UDP/IPv6 socket in the source host's namespace, bound to its plane address, with the
    path's SRH set as a sticky ``IPV6_RTHDR`` (on a uSID fabric, its mark instead).

    Send to ``path.dst_address`` (the kernel takes the first segment from the header and puts
    the socket's destination into Segment List[0], see :mod:`mrc.srv6.srh`).  If ``dst_port``
    is given the socket is connected, so plain ``send`` works.  ``proto`` may be
    ``IPPROTO_ICMPV6`` for a raw ICMPv6 socket (used by ping).
    """
    kind = socket.SOCK_DGRAM if proto == socket.IPPROTO_UDP else socket.SOCK_RAW
    with netns.entered(path.src_netns):
        sock = socket.socket(socket.AF_INET6, kind, proto)
    try:
        sock.bind((path.src_address, port if kind == socket.SOCK_DGRAM else 0))
        srh = path.srh
        if srh is not None:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RTHDR, srh)
        if path.mark:  # a uSID fabric: the mark picks the table that encapsulates
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, path.mark)
        if dst_port is not None:
            sock.connect((path.dst_address, dst_port))
        sock.setblocking(blocking)
    except BaseException:
        sock.close()
        raise
    return sock
