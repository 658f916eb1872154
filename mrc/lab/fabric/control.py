"""Operate a running fabric: fail/heal links and read per-link status and counters."""

from __future__ import annotations

from typing import Any

from mrc.errors import FabricError
from mrc.topology.model import Link, Topology

from . import netns
from .builder import configure_node, require_root
from .kernel import NsHandle, handles


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


def _end_status(
    h: NsHandle | None,
    ifname: str,
    cache: dict[str, tuple[dict[str, Any], dict[int, int]]],
    trim_ports: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:
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
    if trim_ports is not None and info["index"] in trim_ports:
        out["trim"] = trim_ports[info["index"]]
    del out["index"]
    return out


def _trim_status(
    topo: Topology, present: list[str]
) -> tuple[dict[str, Any], dict[str, dict[int, dict[str, Any]]]]:
    """({router: router-wide counters}, {router: {ifindex: port counters}}) from the pins."""
    if not topo.trim:
        return {}, {}
    from . import trim

    routers: dict[str, Any] = {}
    ports: dict[str, dict[int, dict[str, Any]]] = {}
    for r in topo.routers:
        if r.name not in present:
            continue
        try:
            got = trim.read_router(topo.name, r.name)
        except (OSError, FabricError) as e:
            routers[r.name] = {"error": str(e)}
            continue
        if got is not None:
            routers[r.name] = got["router"]
            ports[r.name] = got["ports"]
    return routers, ports


def status(topo: Topology) -> dict[str, Any]:
    """Per-link state and counters at both ends, as a JSON-able dict.

    A link is ``up`` when both ends are present, admin up and have carrier.  (Carrier, not
    operstate: the kernel updates operstate lazily, so right after ``up`` or a heal it can
    still read "down" or "unknown" while packets already flow.)

    On a ``--trim`` fabric every router end also has ``trim``: the virtual queue constants and
    counters of that port *as an egress* (packets the router sends into the link), and
    ``trim_routers`` has each router's program-wide counters.
    """
    require_root()
    present = [n for n in topo.nodes() if netns.exists(topo.netns_of(n))]
    cache: dict[str, tuple[dict[str, Any], dict[int, int]]] = {}
    trim_routers, trim_ports = _trim_status(topo, present)
    with handles(topo.netns_of(n) for n in present) as hs:
        by_node = {n: hs[topo.netns_of(n)] for n in present}
        links = []
        for lk in topo.links:
            a = _end_status(by_node.get(lk.a), lk.a_ifname, cache, trim_ports.get(lk.a))
            b = _end_status(by_node.get(lk.b), lk.b_ifname, cache, trim_ports.get(lk.b))
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
    out = {"name": topo.name, "missing_nodes": missing, "links": links, "trim": topo.trim}
    if topo.trim:
        out["trim_routers"] = trim_routers
    return out


def interface_counters(ns: str) -> dict[str, dict[str, Any]]:
    """{ifname: counters} for one namespace; handy for tests and tools."""
    h = NsHandle(ns)
    try:
        return {i["ifname"]: i for i in h.links()}
    finally:
        h.close()
