"""The sockets of a QP's entropy values (EVs): few sockets, many EVs.

An EV is 32 bits on the wire, MRC's structured format: the UDP source port and the low 16
bits of the IPv6 flow label (``mrc.wire.ev_value``). Switches hash both, so EVs that share a
socket (one source port) still take different paths where they differ in flow label, and
the kernel sets the label per send from a control message (mrc/transport/flowlabel.py).

So a QP opens ``source_ports`` sockets per route (a route: a plane's local and remote address,
and on an SRv6 fabric the sticky routing header of one spine), not one per EV: a default QP of
20 EVs over 4 planes opens 4 sockets where it opened 20. EV i is on plane i mod P, takes that
plane's routes in turn, and the sockets of its route in turn; its flow label is i + 1 (a label
of 0 would ask the kernel to pick one): ``mrc.evlayout``, the rule the simulator follows too.
Over IPv4 there is no flow label: every EV gets a socket of its own there, and the port alone
tells EVs apart, as before MRC's 32-bit EVs.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from mrc import wire
from mrc.errors import MRCError
from mrc.evlayout import ev_label, ev_slot
from mrc.srv6.evroutes import EVRoute
from mrc.transport import flowlabel
from mrc.transport.ports import PortRange, RangeExhausted
from mrc.transport.sockets import ev_socket


@dataclass(slots=True)
class EVSockets:
    """What opening a QP's EVs gave: per EV its socket (shared by the EVs of one route),
    wire value, flow label (0: none), plane and route label; and the distinct sockets."""

    sockets: list[socket.socket]
    per_ev: list[socket.socket]
    values: list[int]
    labels: list[int]
    planes: list[int]
    routes: list[str]
    #: whether every route takes GSO bursts (EVRoute.gso)
    gso: bool = True

    def close(self) -> None:
        for s in self.sockets:
            s.close()


def open_ev_sockets(
    count: int,
    routes: list[list[EVRoute]],
    peer_port: int,
    ports: PortRange | None = None,
    source_ports: int = 1,
) -> EVSockets:
    """``count`` EVs over ``routes`` (per plane, its routes), through ``source_ports``
    sockets per route where the flow label can carry the rest of the EV (IPv6), one per EV
    where it cannot. ``ports``: the source ports from that range (mrc.transport.ports).
    Raises MRCError with a one-line reason."""
    out = EVSockets([], [], [], [], [], [])
    opened: dict[tuple[int, int, int], socket.socket] = {}
    used: set[int] = set()
    per_plane = [len(options) for options in routes]
    try:
        for i in range(count):
            key = ev_slot(i, per_plane, source_ports)
            plane, option, _socket = key
            route = routes[plane][option]
            sock = opened.get(key)
            if sock is None or sock.family != socket.AF_INET6:
                sock = _distinct_port_socket(route, peer_port, ports, used)
                opened[key] = sock
                out.sockets.append(sock)
            label = ev_label(i) if sock.family == socket.AF_INET6 else 0
            out.per_ev.append(sock)
            out.values.append(wire.ev_value(sock.getsockname()[1], label))
            out.labels.append(label)
            out.planes.append(plane)
            out.routes.append(route.label)
            out.gso = out.gso and route.gso
    except RangeExhausted:
        out.close()
        raise MRCError(
            f"cannot open EV sockets: no free UDP port in the range {ports} for socket "
            f"{len(out.sockets) + 1} (a connection takes a port per route and plane, and per EV "
            "over IPv4, and a sender one more: widen --ports, or use fewer QPs)"
        ) from None
    except OSError as exc:
        out.close()
        if exc.errno == errno.EADDRINUSE:
            raise MRCError(
                f"cannot open EV sockets: no free local UDP port for socket "
                f"{len(out.sockets) + 1} (use fewer QPs at once)"
            ) from None
        raise MRCError(f"cannot open EV sockets: {exc.strerror or exc}") from None
    return out


def _distinct_port_socket(
    route: EVRoute, peer_port: int, ports: PortRange | None, used: set[int]
) -> socket.socket:
    """An EV socket for ``route`` whose source port no other socket of the QP has (the same
    port on another plane's address would make two EVs one value). A route with ports of its
    own (a real uSID fabric's, whose port picks its spine) takes them instead of ``ports``."""
    ports = PortRange(*route.ports) if route.ports is not None else ports
    for _attempt in range(64):
        sock = ev_socket(route.local, (route.remote, peer_port), route.srh, ports, used, route.mark)
        sport = sock.getsockname()[1]
        if sport not in used:
            break
        sock.close()
    else:
        raise OSError("could not find distinct source ports for every EV socket")
    if sock.family == socket.AF_INET6 and not flowlabel.enable_send(sock):
        sock.close()
        raise OSError("the kernel refused IPV6_FLOWINFO_SEND (per-datagram flow labels)")
    used.add(sport)
    return sock
