"""The static routing plan: which routes and neighbour entries every node gets.

Pure functions of the topology, so they can be applied at build time *and* re-applied when a
link is healed (the kernel deletes routes through an interface that goes admin-down, even
though keep_addr_on_down keeps its addresses).

Per plane ``p`` (``P = fd00:p::/32``):

* host: ``P via <leaf> dev p<p>`` (the connected /64 comes with the address);
* leaf: ``P via spine 0`` (the default path), plus each spine's SID /128 via that spine; its
  own hosts' /64s are connected;
* spine: each host /64 via that host's leaf, each leaf SID via that leaf, each other spine's
  SID via leaf 0, and each other leaf-spine link /64 via its leaf.

So plain destination routing between hosts of different leaves goes leaf -> spine 0 -> leaf,
every SID is reachable from everywhere in its plane, and nothing routes between planes.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrc.topology.model import Topology

from . import addressing as A


@dataclass(frozen=True)
class Route:
    dst: str  # prefix, e.g. "fd00:0:1:3::/64"
    gateway: str
    ifname: str


@dataclass(frozen=True)
class Neighbour:
    ifname: str
    address: str
    mac: str


def via(topo: Topology, node: str, peer: str) -> tuple[str, str]:
    """(gateway address, local ifname) to reach directly connected ``peer`` from ``node``."""
    link = topo.link_between(node, peer)
    ifname, _ = link.end(node)
    _, peer_addr, _ = link.peer(node)
    return peer_addr, ifname


def node_routes(topo: Topology, node: str) -> list[Route]:
    node = topo.canonical(node)
    routes: list[Route] = []
    if node in {h.name for h in topo.hosts}:
        for nic in topo.host(node).nics:
            routes.append(Route(A.plane_prefix(nic.plane), nic.gateway, nic.nic))
        return routes

    r = topo.router(node)
    p = r.plane
    spines = topo.spines(p)
    leaves = topo.leaves(p)
    if r.tier == "leaf":
        gw, dev = via(topo, node, spines[0].name)
        routes.append(Route(A.plane_prefix(p), gw, dev))
        for s in spines:
            gw, dev = via(topo, node, s.name)
            routes.append(Route(f"{s.sid}/128", gw, dev))
        return routes

    # spine
    for h in topo.hosts:
        gw, dev = via(topo, node, h.nic(p).leaf)
        routes.append(Route(h.nic(p).prefix, gw, dev))
    for leaf in leaves:
        gw, dev = via(topo, node, leaf.name)
        routes.append(Route(f"{leaf.sid}/128", gw, dev))
        for other in spines:
            if other.index != r.index:
                routes.append(Route(A.leaf_spine_prefix(p, leaf.index, other.index), gw, dev))
    gw0, dev0 = via(topo, node, leaves[0].name)
    for other in spines:
        if other.index != r.index:
            routes.append(Route(f"{other.sid}/128", gw0, dev0))
    return routes


def node_neighbours(topo: Topology, node: str) -> list[Neighbour]:
    """Permanent neighbour entries for every directly connected peer.

    Static entries mean the first packet on a path does not wait for neighbour discovery, and
    fit the fabric's "static everything" design.  (An admin-down flushes them; healing a link
    re-applies them.)
    """
    node = topo.canonical(node)
    out = []
    for link in topo.links_of(node):
        ifname, _ = link.end(node)
        _, addr, mac = link.peer(node)
        out.append(Neighbour(ifname, addr, mac))
    return out
