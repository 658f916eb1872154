"""How many EVs a QP opens, and where its EV number i goes: its plane, its route in that plane,
its socket on that route, and its flow label.

One rule for the transport, which opens the sockets (mrc/transport/evsockets.py), and for the
seeded simulator, which pins each EV to the spine of its route with it (mrc/lab/sim.py): the
simulator is only worth its results if its EVs take the paths the transport's would. Pure
arithmetic, so that the simulator loads it without the I/O layer.

EV i of P planes is on plane i mod P (planes get equal shares), takes its plane's R routes in
turn (route (i div P) mod R: on an SRv6 fabric one per spine, so every spine gets an equal
share), and its route's sockets in turn (socket ((i div P) div R) mod ``source_ports``). Its
IPv6 flow label is i + 1: a label of 0 would ask the kernel to choose one (docs/PROTOCOL.md,
"How an EV maps to a path"). Beside its ``active`` EVs a QP opens ``backup_count`` backups, EVs
active .. active + backups - 1 laid out by the same rule, so that a backup of the plane (and, on
a fabric, of another route) is there to replace an EV retired as bad (mrc/core/evset.py).
"""

from __future__ import annotations

from collections.abc import Sequence


def ev_slot(i: int, routes: Sequence[int], source_ports: int = 1) -> tuple[int, int, int]:
    """(plane, route, socket) of EV ``i``, with ``routes[p]`` routes in plane p (at least one)
    and ``source_ports`` sockets per route."""
    plane = i % len(routes)
    turn = i // len(routes)
    return plane, turn % routes[plane], (turn // routes[plane]) % source_ports


def ev_label(i: int) -> int:
    """The IPv6 flow label of EV ``i`` (its low 16 bits are the EV's low half)."""
    return i + 1


def backup_count(active: int, planes: int) -> int:
    """Backup EVs opened beside ``active`` ones: a quarter more, at least one per plane (so
    that every plane has one to replace its first EV retired)."""
    return max(planes, active // 4)
