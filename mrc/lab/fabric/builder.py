"""Bring a planned topology to life in the kernel: namespaces, veths, addresses, routes, tbf.

Order matters and is the reason this module exists as one sequence:

1. create every namespace and set its sysctls *before* any link exists, so interfaces are
   born with ``keep_addr_on_down=1`` (else ``ip link set down`` deletes static IPv6 addresses),
   ``accept_dad=0`` and ``seg6_enabled=1`` (and ``forwarding=1`` on routers); with
   ``--host-image`` a host's namespace is a container's (:mod:`mrc.lab.fabric.containers`), started
   with no network and attached under /run/netns before any link exists;
2. create each veth pair directly with its two ends in their namespaces (no move, so the
   per-namespace defaults apply), with deterministic MACs and the fabric MTU;
3. set per-interface sysctls explicitly as well (belt and braces: SRv6 is checked on the
   *ingress interface*), add addresses with NODAD, bring links up;
4. shape with tbf (host NICs get a deeper queue: :func:`shaping.tbf_params`; with ``--trim``
   router ports get an htb with a priority band instead, :meth:`kernel.NsHandle.prio_band`),
   install permanent neighbours and static routes; with ``--srv6 usid`` also each router's
   ``sr0`` and uSID routes, each host's mark rules and per-spine encapsulation tables
   (:mod:`.usid_routes`);
5. with ``--trim``, load and attach the trimming program (:mod:`mrc.lab.fabric.trim`);
6. write the topology file last: its presence means "this fabric is complete".
"""

from __future__ import annotations

import dataclasses
import os
import time

from mrc.errors import FabricError, MRCError
from mrc.topology.model import Topology, topology_path

from . import netns, teardown, usid_routes
from .kernel import NsHandle, handles
from .plan import plan
from .routes import node_neighbours, node_routes
from .spec import FabricSpec

_COMMON_SYSCTLS = {
    "keep_addr_on_down": 1,
    "accept_dad": 0,
    "seg6_enabled": 1,
    "accept_ra": 0,
    "router_solicitations": 0,
}


def require_root() -> None:
    if os.geteuid() != 0:
        raise FabricError("must run as root (network namespaces need CAP_SYS_ADMIN)")


def _namespace_sysctls(router: bool) -> None:
    for scope in ("all", "default"):
        for key, value in _COMMON_SYSCTLS.items():
            netns.write_sysctl(f"net.ipv6.conf.{scope}.{key}", value)
        if router:
            netns.write_sysctl(f"net.ipv6.conf.{scope}.forwarding", 1)
    if router:
        # ICMP errors from routers (unreachable, time exceeded) are diagnostics; don't ratelimit.
        netns.write_sysctl("net.ipv6.icmp.ratelimit", 0)


def _interface_sysctls(ifnames: list[str], router: bool) -> None:
    for ifname in ifnames:
        base = f"net.ipv6.conf.{ifname}"
        netns.write_sysctl(f"{base}.keep_addr_on_down", 1)
        netns.write_sysctl(f"{base}.accept_dad", 0)
        netns.write_sysctl(f"{base}.seg6_enabled", 1)
        if router:
            netns.write_sysctl(f"{base}.forwarding", 1)


def build(topo: Topology) -> float:
    """Create ``topo`` in the kernel; return seconds taken.  Caller handles cleanup on error."""
    t0 = time.monotonic()
    routers = {r.name for r in topo.routers}
    nodes = topo.nodes()
    ns_of = {n: topo.netns_of(n) for n in nodes}

    containers = {h.name: h.container for h in topo.hosts if h.container}
    for node in nodes:
        if node in containers:
            from . import containers as ct

            pid = ct.start_host(
                topo.engine, topo.host_image or "", topo.name, containers[node], node
            )
            netns.attach(ns_of[node], pid)
        else:
            netns.create(ns_of[node])
        with netns.entered(ns_of[node]):
            _namespace_sysctls(node in routers)

    with handles(ns_of[n] for n in nodes) as hs:
        h = {node: hs[ns_of[node]] for node in nodes}
        for node in nodes:
            h[node].set_state("lo", True)

        for link in topo.links:
            fd = os.open(netns.netns_path(ns_of[link.b]), os.O_RDONLY | os.O_CLOEXEC)
            try:
                h[link.a].ipr.link(
                    "add",
                    ifname=link.a_ifname,
                    kind="veth",
                    address=link.a_mac,
                    mtu=link.mtu,
                    peer={
                        "ifname": link.b_ifname,
                        "address": link.b_mac,
                        "mtu": link.mtu,
                        "net_ns_fd": fd,
                    },
                )
            finally:
                os.close(fd)

        ports: dict[str, list[str]] = {n: [] for n in nodes}
        for link in topo.links:
            ports[link.a].append(link.a_ifname)
            ports[link.b].append(link.b_ifname)
        for node in nodes:
            h[node].refresh()
            with netns.entered(ns_of[node]):
                _interface_sysctls(ports[node], node in routers)

        for link in topo.links:
            for node, ifname, addr in (
                (link.a, link.a_ifname, link.a_address),
                (link.b, link.b_ifname, link.b_address),
            ):
                h[node].add_address(ifname, addr, 64)
        for r in topo.routers:
            h[r.name].add_address("lo", r.sid, 128)

        for link in topo.links:
            h[link.a].set_state(link.a_ifname, True)
            h[link.b].set_state(link.b_ifname, True)
            if link.rate_bps:
                # ``a`` of a host-leaf link is the host: its NIC gets a host's queue
                host = link.kind == "host-leaf"
                for node, ifname, is_host in (
                    (link.a, link.a_ifname, host),
                    (link.b, link.b_ifname, False),
                ):
                    if topo.trim and not is_host:  # router port: priority band for trimmed headers
                        h[node].prio_band(ifname, link.rate_bps, link.mtu)
                    else:
                        h[node].shape(ifname, link.rate_bps, link.mtu, host=is_host)

        if topo.srv6 == "usid":
            for node in nodes:
                h[node].ip_batch(usid_routes.node_setup(topo, node))
        for node in nodes:
            configure_node(topo, node, h[node])
    return time.monotonic() - t0


def configure_node(topo: Topology, node: str, handle: NsHandle) -> None:
    """(Re)install ``node``'s permanent neighbours and static routes; idempotent."""
    handle.apply_neighbours(node_neighbours(topo, node))
    handle.apply_routes(node_routes(topo, node))
    if topo.srv6 == "usid":
        handle.ip_batch(usid_routes.node_routes(topo, node))


def up(spec: FabricSpec) -> Topology:
    """Validate, plan, build and record a fabric; on any failure remove what was built."""
    spec.validate()
    require_root()
    existing = teardown.fabric_namespaces(spec.name)
    if existing or topology_path(spec.name).exists():
        raise FabricError(
            f"fabric {spec.name!r} already exists ({len(existing)} namespaces);"
            f" run: mrc-fabric down --name {spec.name}"
        )
    obj = None
    if spec.trim:
        from . import trim

        obj = trim.prepare()  # tools, compile, bpffs: fail before building anything
    topo = plan(spec)
    if spec.host_image:
        from . import containers as ct

        engine = ct.pick_engine()
        ct.check_image(engine, spec.host_image)
        topo = dataclasses.replace(topo, engine=engine, share_dir=str(ct.share_dir(spec.name)))
    try:
        build(topo)
        if obj is not None:
            from . import trim

            trim.install(topo, obj)
        topo.save()
    except BaseException as e:
        teardown.down(spec.name)
        if isinstance(e, MRCError | KeyboardInterrupt):  # already says what went wrong
            raise
        raise FabricError(f"building fabric {spec.name!r} failed: {e}") from e
    return topo
