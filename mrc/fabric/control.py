"""Operate a running fabric: fail/heal links and read per-link status and counters."""

from __future__ import annotations

from . import netns
from .builder import configure_node, require_root
from .errors import FabricError
from .kernel import NsHandle, handles
from .topology import Link, Topology


def set_link(topo: Topology, x: str, y: str, up: bool) -> Link:
    """Set the link between nodes ``x`` and ``y`` admin down (or up) at *both* ends.

    Both ends, so that neither side keeps sending into a dead veth.  Going down, the kernel
    drops routes and neighbour entries through those interfaces (addresses stay, thanks to
    keep_addr_on_down); coming up, we re-install both nodes' static routes and neighbours so
    the fabric returns exactly to its planned state.
    """
    require_root()
    link = topo.link_between(x, y)
    ends = ((link.a, link.a_ifname), (link.b, link.b_ifname))
    namespaces = [topo.netns_of(node) for node, _ in ends]
    for ns in namespaces:
        if not netns.exists(ns):
            raise FabricError(f"namespace {ns} is missing: fabric {topo.name!r} is broken")
    with handles(namespaces) as hs:
        for node, ifname in ends:
            hs[topo.netns_of(node)].set_state(ifname, up)
        if up:
            for node, _ in ends:
                configure_node(topo, node, hs[topo.netns_of(node)])
    return link


def _end_status(h: NsHandle | None, ifname: str, cache: dict) -> dict:
    if h is None:
        return {"ifname": ifname, "present": False}
    if h.ns not in cache:
        cache[h.ns] = ({i["ifname"]: i for i in h.links()}, h.qdisc_drops())
    links, drops = cache[h.ns]
    info = links.get(ifname)
    if info is None:
        return {"ifname": ifname, "present": False}
    out = {"present": True, **info}
    out["qdisc_drops"] = drops.get(info["index"], 0)
    del out["index"]
    return out


def status(topo: Topology) -> dict:
    """Per-link state and counters at both ends, as a JSON-able dict.

    A link is ``up`` when both ends are present, admin up and have carrier.  (Carrier, not
    operstate: the kernel updates operstate lazily, so right after ``up`` or a heal it can
    still read "down" or "unknown" while packets already flow.)
    """
    require_root()
    present = [n for n in topo.nodes() if netns.exists(topo.netns_of(n))]
    cache: dict = {}
    with handles(topo.netns_of(n) for n in present) as hs:
        by_node = {n: hs[topo.netns_of(n)] for n in present}
        links = []
        for lk in topo.links:
            a = _end_status(by_node.get(lk.a), lk.a_ifname, cache)
            b = _end_status(by_node.get(lk.b), lk.b_ifname, cache)
            is_up = all(e.get("present") and e["admin_up"] and e["carrier"] for e in (a, b))
            links.append(
                {
                    "a": lk.a,
                    "b": lk.b,
                    "plane": lk.plane,
                    "kind": lk.kind,
                    "up": is_up,
                    "a_end": a,
                    "b_end": b,
                }
            )
    missing = sorted(set(topo.nodes()) - set(present))
    return {"name": topo.name, "missing_nodes": missing, "links": links}


def interface_counters(ns: str) -> dict[str, dict]:
    """{ifname: counters} for one namespace; handy for tests and tools."""
    h = NsHandle(ns)
    try:
        return {i["ifname"]: i for i in h.links()}
    finally:
        h.close()
