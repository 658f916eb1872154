"""The uSID forwarding plan of a fabric built with ``--srv6 usid`` (:mod:`mrc.srv6.usid`), as
iproute2 batch lines: pyroute2 cannot express the ``next-csid`` flavour or ``encap.red``.

Per plane ``p``:

* every router: its own locator ``fcbb:bb00:<uN>::/48`` as seg6local End with the next-csid
  flavour, on a device of its own (``sr0``, an ifb that never goes down: a seg6local route
  through ``lo`` is a reject route to the kernel, one through a port dies with the port);
* leaf: each spine's locator via that spine, each of its hosts' downlink locators via the host;
* spine: each leaf's locator via that leaf;
* host: its leaf uSIDs' /40 via its leaf, its downlink locator as End.DT6 (decapsulate, then
  deliver from the local table), and per spine index ``s`` a table, chosen by the socket mark
  ``usid.mark(s)``, that encapsulates toward every other host over spine ``s``.

:func:`node_setup` runs once at build time (devices, rules); :func:`node_routes` is
re-applied when a link heals, like :mod:`.routes` (the kernel drops routes through a port
that goes down).
"""

from __future__ import annotations

from mrc.srv6 import usid
from mrc.topology.model import Topology

from .routes import via

#: The device every router's seg6local routes hang on.
SR_DEVICE = "sr0"

#: An encapsulating route's path MTU, as sockets read it (IPV6_MTU), is its mtu less the room
#: the kernel keeps for the outer header *and* a one-segment SRH (64 bytes), which encap.red
#: with one segment leaves out. The route's mtu metric gives those 24 bytes back, so a socket
#: sees exactly what an inner datagram may have (link MTU - 40) and sizes its payload to fit.
UNUSED_SRH_ROOM = 24


def _end(u: int) -> str:
    return (
        f"route replace {usid.locator(u)} encap seg6local action End"
        f" flavors next-csid lblen {usid.BLOCK_BITS} nflen {usid.USID_BITS} dev {SR_DEVICE}"
    )


def node_setup(topo: Topology, node: str) -> list[str]:
    """Build-time lines: a router's ``sr0``; a host's mark -> table rules."""
    node = topo.canonical(node)
    if node in {h.name for h in topo.hosts}:
        return [
            f"rule add fwmark {usid.mark(s)} table {usid.table(s)} priority {usid.RULE_PRIORITY}"
            for s in range(topo.spines_per_plane)
        ]
    return [f"link add {SR_DEVICE} type ifb", f"link set {SR_DEVICE} up"]


def node_routes(topo: Topology, node: str) -> list[str]:
    """Every uSID route of ``node`` (idempotent: ``replace``)."""
    node = topo.canonical(node)
    if node in {h.name for h in topo.hosts}:
        return _host_routes(topo, node)
    r = topo.router(node)
    p = r.plane
    lines = []
    if r.tier == "leaf":
        lines.append(_end(usid.leaf_usid(p, r.index)))
        for s in topo.spines(p):
            gw, dev = via(topo, node, s.name)
            lines.append(
                f"route replace {usid.locator(usid.spine_usid(p, s.index))} via {gw} dev {dev}"
            )
        for h in topo.hosts:
            if h.nic(p).leaf == node:
                gw, dev = via(topo, node, h.name)
                port = usid.locator(usid.downlink_usid(p, h.index))
                lines.append(f"route replace {port} via {gw} dev {dev}")
        return lines
    lines.append(_end(usid.spine_usid(p, r.index)))
    for leaf in topo.leaves(p):
        gw, dev = via(topo, node, leaf.name)
        lines.append(
            f"route replace {usid.locator(usid.leaf_usid(p, leaf.index))} via {gw} dev {dev}"
        )
    return lines


def _host_routes(topo: Topology, node: str) -> list[str]:
    host = topo.host(node)
    lines = []
    for nic in host.nics:
        p = nic.plane
        lines.append(f"route replace {usid.leaf_prefix(p)} via {nic.gateway} dev {nic.nic}")
        lines.append(
            f"route replace {usid.locator(usid.downlink_usid(p, host.index))}"
            f" encap seg6local action End.DT6 table local dev {nic.nic}"
        )
        src_leaf = topo.router(nic.leaf).index
        for other in topo.hosts:
            if other.name == host.name:
                continue
            dst = other.nic(p)
            dst_leaf = topo.router(dst.leaf).index
            for s in range(topo.spines_per_plane):
                segs = usid.path_container(p, src_leaf, s, dst_leaf, other.index)
                lines.append(
                    f"route replace {dst.address}/128 encap seg6 mode encap.red segs {segs}"
                    f" via {nic.gateway} dev {nic.nic} table {usid.table(s)}"
                    f" mtu {topo.mtu + UNUSED_SRH_ROOM}"
                )
    return lines
