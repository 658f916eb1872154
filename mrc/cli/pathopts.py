"""Options mrc-send and mrc-recv share about paths: fabric topologies, denied EVs, EV log,
the UDP port range."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import socket
import time
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

from mrc import wire
from mrc.connection import Connection
from mrc.core.events import EVStateChanged
from mrc.errors import MRCError, UsageError
from mrc.transport.ports import PortRange

if TYPE_CHECKING:
    from mrc.topology.model import Topology


def port_range(text: str) -> PortRange:
    """``--ports LO-HI``."""
    try:
        return PortRange.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_path_args(
    where: argparse._ActionsContainer, paths: argparse._ActionsContainer | None = None
) -> None:
    """``--ports``, ``--fabric`` and ``--fabric-host`` into ``where``; ``--deny`` and
    ``--ev-log`` into ``paths`` (default: ``where`` too): a command's help groups them."""
    paths = where if paths is None else paths
    where.add_argument(
        "--ports",
        type=port_range,
        metavar="LO-HI",
        help="bind every UDP socket of a connection to a port of this range, for a host "
        "firewall: the sender's receive port and the EV sockets' source ports on both ends "
        "(a connection takes one port per route and --qp source_ports, per EV over IPv4, "
        "and a sender one more; docs/CLUSTER.md). Default: ports the kernel picks from its "
        "ephemeral range",
    )
    where.add_argument(
        "--fabric",
        metavar="NAME|FILE",
        help="a fabric: an mrc-fabric name, its topology file, or a real-fabric file written "
        "by hand (docs/FABRIC.md): EVs are spread over its SRv6 paths, every spine of every "
        "plane; this host's plane addresses come from it, and the peer may be named by its "
        "fabric host name (h3)",
    )
    where.add_argument(
        "--fabric-host",
        metavar="NAME",
        help="which host of --fabric this is (default: the one whose addresses are local)",
    )
    paths.add_argument(
        "--deny",
        action="append",
        default=[],
        metavar="ROUTE|EV",
        help="never use these EVs (state DENIED): a route name such as a spine "
        "(p1s0), or an EV number; repeatable",
    )
    paths.add_argument(
        "--ev-log",
        metavar="FILE",
        help="write every EV state change as one JSON object per line",
    )


def load_fabric(name: str | None, host: str | None = None) -> Topology | None:
    """``--fabric``: a running mrc-fabric by name, or a file in either format. ``host`` is
    ``--fabric-host``, which means nothing without a fabric."""
    if name is None:
        if host is not None:
            raise UsageError("--fabric-host needs --fabric")
        return None
    from mrc.topology.realfile import load_fabric as load

    return load(name)


def host_address(topo: Topology | None, name: str) -> str:
    """A fabric host name (h3) -> its plane-0 address; anything else is returned as is."""
    if topo is None:
        return name
    for host in topo.hosts:
        if name in (host.name, host.netns or None):
            return host.nics[0].address
    return name


def local_plane_addrs(topo: Topology | None, name: str | None = None) -> list[str] | None:
    """The plane addresses of the fabric host this process runs on: ``name`` (--fabric-host)
    if given, else the one host of the fabric whose addresses are local here."""
    if topo is None:
        return None
    from mrc.srv6.evroutes import is_local_address, local_fabric_hosts

    if name is not None:
        found = [h for h in topo.hosts if h.name == name]
        if not found:
            known = ", ".join(h.name for h in topo.hosts)
            raise UsageError(f"--fabric-host {name}: no such host in {topo.name!r} ({known})")
        host = found[0]
    else:
        hosts = local_fabric_hosts(topo)
        if not hosts:
            how = (
                "run it with: mrc-fabric exec HOST -- ..."
                if topo.hosts[0].netns
                else "run it on one, or give the addresses with --from / --listen"
            )
            raise MRCError(
                f"this process is not on a host of fabric {topo.name!r}: no host's plane-0 "
                f"address is local here ({how})"
            )
        if len(hosts) > 1:
            names = ", ".join(h.name for h in hosts)
            raise UsageError(
                f"addresses of several hosts of fabric {topo.name!r} are local here ({names}): "
                f"say which this is with --fabric-host NAME"
            )
        host = hosts[0]
    nics = sorted(host.nics, key=lambda n: n.plane)
    for nic in nics:
        if not is_local_address(nic.address):
            raise MRCError(
                f"fabric {topo.name!r}: host {host.name}'s plane-{nic.plane} address "
                f"{nic.address} is not an address of this machine"
            )
    return [nic.address for nic in nics]


def check_host_routes(topo: Topology | None, local: Sequence[str] | None) -> None:
    """On a real uSID fabric, the routes that carry each path are the host's one-time set-up
    (``mrc-host-setup``, as root): without them every datagram would leave unencapsulated, by
    plain routing, so refuse to start in one line that says what to run. Anything else (no
    fabric, another kind, addresses not of a fabric host) has nothing to check."""
    from mrc.topology.realfile import UsidTopology

    if not isinstance(topo, UsidTopology) or not local:
        return
    from mrc.srv6 import hostroutes
    from mrc.srv6.evroutes import host_of_address

    found = host_of_address(topo, local[0])
    if found is None:
        return
    name = found[0].name
    problem = hostroutes.problem(topo, name)
    if problem is not None:
        raise MRCError(
            f"fabric {topo.name!r}: this host's uSID routes are not set up ({problem}); run, "
            f"once, as root: mrc-host-setup --fabric {topo.layout.source} --host {name}"
        )


def local_address_problem(addr: str, peers: list[str]) -> str | None:
    """What is wrong with ``addr`` as this host's address on a plane (``--from``), checked
    before the network: it must be an address (or a name for one) of this host, which binding
    a UDP socket to it tells, and of the family of ``peers`` (``--to``'s ``HOST[:PORT]``s;
    names among them count when they resolve to no address of that family). None: fine."""
    try:
        infos = socket.getaddrinfo(addr.strip("[]"), 0, type=socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        return f"not an address of this host (cannot resolve it: {exc.strerror})"
    family, _type, _proto, _name, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind(sockaddr[:1] + (0,) + sockaddr[2:])
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return "not an address of this host (no interface here has it)"
            return f"cannot use it as a local address: {exc.strerror}"
    from mrc.cli.common import parse_endpoint

    for text in peers:
        host = parse_endpoint(text)[0].strip("[]")
        if not _of_family(host, family):
            ours = "IPv4" if family == socket.AF_INET else "IPv6"
            theirs = "IPv6" if family == socket.AF_INET else "IPv4"
            return (
                f"an {ours} address, but --to {text} is {theirs}: give --from addresses of "
                "--to's family"
            )
    return None


def _of_family(host: str, family: int) -> bool:
    """``host`` (an address, or a name) is or has an address of ``family`` (a name that does
    not resolve is left to the connection to report)."""
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, 0, type=socket.SOCK_DGRAM)
        except socket.gaierror:
            return True
        return any(info[0] == family for info in infos)
    return (ip.version == 4) == (family == socket.AF_INET)


def apply_denies(conn: Connection, denies: list[str]) -> int:
    """Deny every EV whose number or route label matches; returns how many were denied."""
    if not denies:
        return 0
    wanted = set(denies)
    n = 0
    for ev, row in enumerate(conn.ev_report()):  # rows in EV order
        if str(ev) in wanted or str(row["route"]) in wanted:
            conn.deny_ev(ev)
            n += 1
    if n == 0:
        raise MRCError(f"--deny {', '.join(denies)} matches no EV of this connection")
    return n


class EVLog:
    """JSON lines, one per EV transition: time since start, EV (index, 32-bit value, its port
    and flow label bits), plane, route, states."""

    def __init__(self, path: str | None) -> None:
        self.start = time.monotonic()
        self._fh: IO[str] | None = None
        if path is not None:
            try:
                self._fh = open(path, "w", buffering=1)  # noqa: SIM115 - closed in close()
            except OSError as exc:
                raise MRCError(f"cannot write the EV log {path}: {exc.strerror}") from None

    def attach(self, conn: Connection, role: str) -> None:
        if self._fh is None:
            return
        fh = self._fh
        routes = conn.routes
        loop_start = time.monotonic()  # the transport's clock
        wall = time.time()

        def write(ev: EVStateChanged) -> None:
            fh.write(
                json.dumps(
                    {
                        "t": round(wall + (ev.time - loop_start), 6),
                        "role": role,
                        "qpn": ev.qpn,
                        "ev": ev.ev,
                        "value": ev.value,
                        "sport": ev.value >> wire.EV_LABEL_BITS,
                        "label": ev.value & wire.EV_LABEL_MASK,
                        "plane": ev.plane,
                        "route": routes[ev.ev] if routes else "direct",
                        "from": ev.old_label,
                        "to": ev.new_label,
                        "reason": ev.reason_text,
                    }
                )
                + "\n"
            )

        conn.on_ev_change(write)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
