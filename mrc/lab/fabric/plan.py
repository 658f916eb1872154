"""Plan a namespace fabric: every name, address, MAC and link of a spec, before anything
touches the kernel. Pure; the builder, the route plan and the CLI all read its result."""

from __future__ import annotations

import time

from mrc.topology.model import Host, HostNic, Link, Router, Topology

from . import addressing as A
from .shaping import ECN_FRACTION
from .spec import FabricSpec


def plan(spec: FabricSpec) -> Topology:
    """Compute the full topology (names, addresses, MACs, links) of ``spec``; pure."""
    spec.validate()
    fab = spec.name
    hosts = []
    for h in range(spec.hosts):
        nics = []
        for p in range(spec.planes):
            nics.append(
                HostNic(
                    plane=p,
                    nic=A.host_nic(p),
                    address=A.host_address(p, h),
                    prefix=A.host_link_prefix(p, h),
                    gateway=A.host_gateway(p, h),
                    leaf=A.leaf_name(p, spec.leaf_of(h)),
                    mac=A.mac(A.KIND_HOST_LEAF, p, h >> 8, h & 0xFF, 0),
                )
            )
        hosts.append(
            Host(
                name=A.host_name(h),
                netns=A.netns_name(fab, A.host_name(h)),
                index=h,
                nics=tuple(nics),
                container=A.netns_name(fab, A.host_name(h)) if spec.host_image else "",
            )
        )

    routers: list[Router] = []
    links: list[Link] = []
    rate_bps = spec.rate_bps
    for p in range(spec.planes):
        for leaf in range(spec.leaves):
            name = A.leaf_name(p, leaf)
            routers.append(
                Router(name, A.netns_name(fab, name), p, "leaf", leaf, A.leaf_sid(p, leaf))
            )
        for s in range(spec.spines):
            name = A.spine_name(p, s)
            routers.append(Router(name, A.netns_name(fab, name), p, "spine", s, A.spine_sid(p, s)))
        for h in range(spec.hosts):
            leaf = spec.leaf_of(h)
            links.append(
                Link(
                    a=A.host_name(h),
                    b=A.leaf_name(p, leaf),
                    a_ifname=A.host_nic(p),
                    b_ifname=A.leaf_port_to_host(h),
                    a_address=A.host_address(p, h),
                    b_address=A.host_gateway(p, h),
                    a_mac=A.mac(A.KIND_HOST_LEAF, p, h >> 8, h & 0xFF, 0),
                    b_mac=A.mac(A.KIND_HOST_LEAF, p, h >> 8, h & 0xFF, 1),
                    prefix=A.host_link_prefix(p, h),
                    plane=p,
                    kind=A.KIND_HOST_LEAF,
                    rate=spec.rate,
                    rate_bps=rate_bps,
                    mtu=spec.mtu,
                )
            )
        for leaf in range(spec.leaves):
            for s in range(spec.spines):
                links.append(
                    Link(
                        a=A.leaf_name(p, leaf),
                        b=A.spine_name(p, s),
                        a_ifname=A.leaf_port_to_spine(s),
                        b_ifname=A.spine_port_to_leaf(leaf),
                        a_address=A.leaf_spine_leaf_addr(p, leaf, s),
                        b_address=A.leaf_spine_spine_addr(p, leaf, s),
                        a_mac=A.mac(A.KIND_LEAF_SPINE, p, leaf, s, 0),
                        b_mac=A.mac(A.KIND_LEAF_SPINE, p, leaf, s, 1),
                        prefix=A.leaf_spine_prefix(p, leaf, s),
                        plane=p,
                        kind=A.KIND_LEAF_SPINE,
                        rate=spec.rate,
                        rate_bps=rate_bps,
                        mtu=spec.mtu,
                    )
                )
    return Topology(
        name=fab,
        planes=spec.planes,
        spines_per_plane=spec.spines,
        leaves_per_plane=spec.leaves,
        rate=spec.rate,
        mtu=spec.mtu,
        hosts=tuple(hosts),
        routers=tuple(routers),
        links=tuple(links),
        created=time.time(),
        trim=spec.trim,
        ecn_threshold=_ecn_threshold(spec),
        prio_band=spec.trim and spec.prio_band,
        srv6=spec.srv6,
        host_image=spec.host_image,
    )


def _ecn_threshold(spec: FabricSpec) -> float:
    if not spec.trim:
        return 0.0
    if spec.ecn_threshold is not None:
        return spec.ecn_threshold
    return ECN_FRACTION
