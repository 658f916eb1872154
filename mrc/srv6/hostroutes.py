"""A real uSID fabric's host set-up: the routes that let an unprivileged mrc pick its spine.

On a uSID fabric a datagram leaves inside an outer IPv6 header whose destination is the path's
container (mrc.srv6.usid); the host's kernel adds that header, by an encapsulating route per
destination. Which spine a datagram turns at is which route it takes, so the host keeps one
table per spine index, and a rule per table that sends into it the UDP sockets bound to that
spine's source ports (the real-fabric file's ``usid.ports``, cut into one block per spine).
Binding a port needs no privilege, where the socket mark the namespace lab uses needs
CAP_NET_ADMIN: so this set-up is the one step that needs root, done once per host by
``mrc-host-setup``, and mrc-send and mrc-recv then run as any user.

Per host, for each of its NICs (plane ``p``, interface ``dev``, next hop ``gw``):

* ``<block>:<its leaf's uSID>::/48 via gw dev dev``: every container it builds in plane ``p``
  starts with its own leaf, so they all leave through the NIC of that plane;
* ``<block>:<the NIC's uSID>::/48 encap seg6local action End.DT6 table local dev dev``: what
  ends with its own micro-SID is decapsulated and delivered;
* per other host and spine ``s`` of the plane, in table ``table + s``: ``<the other host's
  address>/128 encap seg6 mode encap.red segs <container> via gw dev dev mtu <MTU + 24>``;

and per spine index ``s``: ``rule priority P ipproto udp sport <block s> table <table + s>``.

:func:`plan` computes them (pure: ``--dry-run`` prints them as ``ip`` lines), :func:`apply`
installs or removes them with netlink (:mod:`mrc.srv6.rtnl`), idempotently, and
:func:`problem` asks the kernel, as any user may, whether they are in place.
"""

from __future__ import annotations

import errno
import fcntl
import socket
import struct
from collections.abc import Callable, Sequence

from mrc.topology.realfile import UsidTopology

from .rtnl import LWTUNNEL_ENCAP_SEG6_LOCAL, RT_TABLE_MAIN, Answer, Netlink, Route, Rule

#: An encapsulating route's path MTU, as a socket reads it (IPV6_MTU), is the route's MTU less
#: room for the outer header *and* a one-segment SRH (64 bytes), which encap.red leaves out:
#: the MTU metric gives those 24 bytes back, so a socket sees what an inner datagram may have
#: (the same as mrc-fabric's routes, mrc/lab/fabric/usid_routes.py).
UNUSED_SRH_ROOM = 24

Step = Route | Rule

_SIOCGIFMTU = 0x8921


def plan(topo: UsidTopology, host: str) -> list[Step]:
    """Every route and rule ``host`` needs, in the order to add them: routes first, rules
    last, so no socket is sent into a table that is still being filled."""
    layout = topo.layout
    me = topo.host(host)
    steps: list[Step] = []
    for nic in me.nics:
        p = nic.plane
        steps.append(Route(layout.locator(layout.routers[nic.leaf]), nic.nic, nic.gateway))
        steps.append(Route(layout.locator(layout.nics[me.name, p]), nic.nic, decap=True))
        for other in topo.hosts:
            if other.name == me.name:
                continue
            dst = other.nic(p)
            for spine in topo.spines(p):
                steps.append(
                    Route(
                        f"{dst.address}/128",
                        nic.nic,
                        nic.gateway,
                        table=layout.table(spine.index),
                        encap_segs=layout.path_container(
                            p, nic.leaf, spine.name, dst.leaf, other.name
                        ),
                        mtu=layout.mtu + UNUSED_SRH_ROOM,
                    )
                )
    for s, ports in enumerate(layout.spine_ports):
        steps.append(Rule(layout.rule_priority, layout.table(s), ports))
    return steps


def ip_line(step: Step, remove: bool = False) -> str:
    """The iproute2 command equivalent to adding (or removing) ``step``."""
    if isinstance(step, Rule):
        verb = "del" if remove else "add"
        lo, hi = step.sport
        return (
            f"ip -6 rule {verb} priority {step.priority} ipproto udp sport {lo}-{hi}"
            f" table {step.table}"
        )
    words = ["ip", "-6", "route", "del" if remove else "replace", step.dst]
    if not remove:
        if step.encap_segs is not None:
            words += ["encap", "seg6", "mode", "encap.red", "segs", step.encap_segs]
        elif step.decap:
            words += ["encap", "seg6local", "action", "End.DT6", "table", "local"]
    if step.gateway is not None:
        words += ["via", step.gateway]
    words += ["dev", step.dev]
    if step.table != RT_TABLE_MAIN:
        words += ["table", str(step.table)]
    if step.mtu and not remove:
        words += ["mtu", str(step.mtu)]
    return " ".join(words)


def ip_lines(steps: Sequence[Step], remove: bool = False) -> list[str]:
    """What :func:`apply` does, as ``ip`` commands in its order (removal: the reverse)."""
    return [ip_line(s, remove) for s in (reversed(steps) if remove else steps)]


def interface_mtu(dev: str) -> int | None:
    """``dev``'s MTU in this network namespace, None if there is no such interface."""
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        try:
            out = fcntl.ioctl(sock, _SIOCGIFMTU, struct.pack("16si", dev.encode(), 0))
        except OSError:
            return None
    mtu: int = struct.unpack("16si", out)[1]
    return mtu


def apply(
    steps: Sequence[Step],
    remove: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> None:
    """Install ``steps`` (``ip route replace``, rules only when not there yet) or remove them
    (what is already gone is skipped), so running either twice changes nothing the second
    time. OSError on the first step the kernel refuses, with its ``ip`` line as filename."""
    ifindex: dict[str, int] = {}
    with Netlink() as nl:
        for step in reversed(steps) if remove else steps:
            line = ip_line(step, remove)
            try:
                if isinstance(step, Rule):
                    nl.rule(step, add=not remove)
                else:
                    if step.dev not in ifindex:
                        ifindex[step.dev] = socket.if_nametoindex(step.dev)
                    nl.route(step, add=not remove, ifindex=ifindex[step.dev])
            except OSError as exc:
                gone = remove and exc.errno in (errno.ENOENT, errno.ESRCH)
                there = not remove and isinstance(step, Rule) and exc.errno == errno.EEXIST
                if not (gone or there):
                    raise OSError(exc.errno, exc.strerror, line) from None
            if on_step is not None:
                on_step(line)


def problem(topo: UsidTopology, host: str) -> str | None:
    """What is missing of ``host``'s set-up here, asked of the kernel (unprivileged), or None.

    Checks that each route a socket in a spine's ports takes to every other host encapsulates
    toward that path's container, that each plane's containers leave through that plane's
    NIC, and that the NICs' own micro-SIDs are decapsulated."""
    layout = topo.layout
    me = topo.host(host)
    with Netlink() as nl:
        for nic in me.nics:
            p = nic.plane
            try:
                index = socket.if_nametoindex(nic.nic)
            except OSError:
                return f"no interface {nic.nic} (plane {p})"
            own = _address(layout.locator(layout.nics[me.name, p]))
            leaf = _address(layout.locator(layout.routers[nic.leaf]))
            if _ask(nl, own).encap != LWTUNNEL_ENCAP_SEG6_LOCAL:
                return f"its plane-{p} micro-SID {own} is not decapsulated"
            if _ask(nl, leaf).oif != index:
                return f"the containers of plane {p} do not leave through {nic.nic}"
            for other in topo.hosts:
                if other.name == me.name:
                    continue
                dst = other.nic(p)
                for spine in topo.spines(p):
                    box = layout.path_container(p, nic.leaf, spine.name, dst.leaf, other.name)
                    where = f"to {other.name} in plane {p} via {spine.name}"
                    sport = layout.spine_ports[spine.index][0]
                    try:
                        got = nl.get_route(dst.address, nic.address, sport)
                    except OSError as exc:
                        return f"no route {where}: {exc.strerror}"
                    if got.encap_segs != box:
                        return f"no uSID route {where} (it would go {_said(got.encap_segs)})"
    return None


def _ask(nl: Netlink, dst: str) -> Answer:
    """The route to ``dst``; no route at all reads as one that does nothing for it."""
    try:
        return nl.get_route(dst)
    except OSError:
        return Answer(0, 0, 0, None)


def _address(prefix: str) -> str:
    return prefix.split("/")[0]


def _said(segs: str | None) -> str:
    return "unencapsulated" if segs is None else f"to container {segs}"
