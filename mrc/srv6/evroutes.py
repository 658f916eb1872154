"""The route of each entropy value: which local address, remote address and SRH it uses.

An EV is (plane, path, UDP source port). On an ordinary network a plane has one path (whatever
the routers choose) and EVs differ by source port only. On an mrc-fabric topology every plane
has one source-routed path per spine, and a QP's EVs are spread evenly over planes first and
over the paths within each plane second, so that every plane and every spine carries an equal
share (MRC keeps equal EVs per plane).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from mrc.srv6.paths import list_paths
from mrc.topology.model import Host, Topology

IPV6_HEADER = 40


@dataclass(frozen=True, slots=True)
class EVRoute:
    plane: int
    local: str
    remote: str
    srh: bytes | None  # sticky IPV6_RTHDR value; None = plain destination routing
    label: str  # for reports: "plane 0 direct", "p0s1"
    #: SO_MARK of the route's sockets: on a ``--srv6 usid`` fabric it picks the host's
    #: encapsulation table for the route's spine (mrc.srv6.usid); 0 = none
    mark: int = 0
    #: whether the route takes GSO bursts: not a uSID route on a --trim fabric, whose hosts'
    #: NICs have checksum offload off (trimmed packets carry real checksums) and whose kernel
    #: then drops an IPv6-in-IPv6 GSO packet it must segment in software (tx_dropped)
    gso: bool = True
    #: the source ports (first, last) the route's sockets bind to: on a real uSID fabric the
    #: port, not a mark, picks the host's table for the route's spine (mrc.srv6.hostroutes),
    #: so no privilege is needed; None = any (``--ports``, else the kernel's choice)
    ports: tuple[int, int] | None = None


def plain_routes(pairs: list[tuple[str, str]]) -> list[list[EVRoute]]:
    """One destination-routed path per plane."""
    return [
        [EVRoute(p, local, remote, None, f"plane {p} direct")]
        for p, (local, remote) in enumerate(pairs)
    ]


def host_of_address(topo: Topology, address: str) -> tuple[Host, int] | None:
    """The fabric host owning ``address`` and the plane of that NIC, if any."""
    want = _norm(address)
    for host in topo.hosts:
        for nic in host.nics:
            if _norm(nic.address) == want:
                return host, nic.plane
    return None


def fabric_routes(topo: Topology, pairs: list[tuple[str, str]]) -> list[list[EVRoute]]:
    """Per plane pair, every source-routed path through the fabric (one per spine).

    Pairs whose addresses are not both fabric host NICs of the same plane fall back to plain
    routing, so a fabric file never makes a connection fail that would work without it.
    """
    out: list[list[EVRoute]] = []
    for p, (local, remote) in enumerate(pairs):
        src, dst = host_of_address(topo, local), host_of_address(topo, remote)
        if src is None or dst is None or src[1] != dst[1] or src[0].name == dst[0].name:
            out.append(plain_routes([(local, remote)])[0])
            continue
        routes = [
            EVRoute(
                p,
                local,
                remote,
                path.srh,
                path.spine or f"plane {src[1]} direct",
                path.mark,
                gso=not (topo.trim and path.usid is not None),
                ports=path.ports,
            )
            for path in list_paths(topo, src[0].name, dst[0].name, planes=[src[1]])
            if path.spine is not None
        ]
        out.append(routes or plain_routes([(local, remote)])[0])
    return out


def local_fabric_hosts(topo: Topology) -> list[Host]:
    """Every fabric host whose plane-0 address is local here: one in a fabric host's namespace
    or on a real host; several only if one machine holds the addresses of several hosts."""
    return [host for host in topo.hosts if is_local_address(host.nics[0].address)]


def is_local_address(address: str) -> bool:
    """Whether this process can bind to ``address`` (it is configured on a local interface)."""
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def _norm(address: str) -> str:
    try:
        return socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, address))
    except OSError:
        return address


def route_overhead(topo: Topology) -> int:
    """Bytes a path of the fabric adds to a datagram on the wire: its longest routing header
    (0: none), or the outer IPv6 header of a uSID fabric's IPv6-in-IPv6. What the path MTU
    must leave room for on top of a datagram."""
    if topo.srv6 == "usid":
        return IPV6_HEADER
    names = [h.name for h in topo.hosts]
    return max(
        (len(p.srh or b"") for a in names for b in names if a != b for p in list_paths(topo, a, b)),
        default=0,
    )
