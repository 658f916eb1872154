"""A deterministic, seeded, in-memory network for driving the sans-IO core.

Two or more endpoints exchange datagrams through per-EV paths that add delay and jitter and can
lose, trim, duplicate or reorder packets according to a seeded fault schedule. Time is virtual:
``run()`` jumps from one event to the next, so a simulated second costs only the work done.
Tests use it to check invariants over hundreds of seeds; researchers can use it to try ideas
without sockets.

EVs are what the transport opens (``connect``): 32 bits, a UDP source port and a flow label
(``mrc.wire.ev_value``), laid out by the transport's own rule (``mrc.evlayout``: EV i on plane
i mod P, its plane's routes in turn, flow label i + 1), one source port per route and plane,
unique in the whole simulation so that a datagram's EV names the host and plane it left from.
As many as the transport opens, too: beside the ``evs`` active ones a pool of
``mrc.evlayout.backup_count`` backups (EVs evs .. evs + backups - 1, the same rule), so that an
EV retired as bad is replaced by a backup of its plane as it is on a real connection
(``backups=0``: the model before issue 39, where retired EVs were never replaced).

Congestion is opt-in: with a :class:`~mrc.lab.sim_links.Fabric` (``SimNetwork(fabric=...)`` or
``set_fabric``, before ``connect``) each datagram, after the seeded ``Faults`` (applied at the
sender), crosses that fabric's links, which serialize at a rate, queue, trim or drop, and mark
ECN. By default the fabric is what runs on an mrc-fabric: one SRv6 route per spine, each EV
pinned to its route's spine, and each QP told its routes (``EVSet.set_routes``) as the
transport tells it, so that route fate works here as it does there; ``Fabric(ecmp=True)`` is a
plain network instead, where switches hash EVs onto spines and QPs know no routes. The module
``mrc.lab.sim_links`` documents both. Without a fabric every datagram is delivered after its
own delay and a plane has one route (its paths are unknown to the QP, as on plain routing).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from mrc import wire
from mrc.core.config import QPConfig
from mrc.core.endpoint import EndpointCore
from mrc.core.events import Event
from mrc.core.qp import QueuePair
from mrc.evlayout import backup_count, ev_label, ev_slot
from mrc.lab.sim_links import Fabric


@dataclass(slots=True)
class Faults:
    """Per-datagram fault probabilities and path timing (seconds)."""

    loss: float = 0.0
    trim: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0  # probability of an extra random delay of up to reorder_delay
    reorder_delay: float = 0.002
    delay: float = 0.0001
    jitter: float = 0.00002
    dead_evs: set[int] = field(default_factory=set)  # EVs (32-bit values) whose path drops all


@dataclass(slots=True)
class SimHost:
    """One endpoint in the simulation and the QPs it owns."""

    name: str
    core: EndpointCore
    events: list[Event] = field(default_factory=list)


class SimNetwork:
    def __init__(
        self, seed: int = 0, faults: Faults | None = None, fabric: Fabric | None = None
    ) -> None:
        self.rng = random.Random(seed)
        self.faults = faults or Faults()
        self.now = 0.0
        self.hosts: dict[str, SimHost] = {}
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._n = 0
        # (host, qpn) -> (peer host, peer qpn)
        self._links: dict[tuple[str, int], tuple[str, int]] = {}
        self._next_port = 1024
        self.lost = 0
        self.trimmed = 0
        # EV -> (host, plane) of the QP that owns it: where a datagram enters a fabric
        self._ev_owner: dict[int, tuple[str, int]] = {}
        self.fabric: Fabric | None = None
        if fabric is not None:
            self.set_fabric(fabric)

    def set_fabric(self, fabric: Fabric) -> None:
        """Send every datagram through ``fabric``'s links from now on (see mrc.lab.sim_links).
        Before ``connect``: a QP's EVs and routes are laid out for the fabric it will cross."""
        if self.fabric is not None:
            raise ValueError("this network already has a fabric")
        if self._links:
            raise ValueError("set the fabric before connecting QPs: their EVs follow its routes")
        fabric.attach(self._at, self._deliver)
        self.fabric = fabric

    def _ports(self, n: int) -> list[int]:
        """``n`` fresh source ports, unique across the whole simulation, so that an EV names
        the host it left from (real hosts each have ports of their own)."""
        if self._next_port + n > 65536:
            raise ValueError("the simulation ran out of 16-bit source ports")
        ports = list(range(self._next_port, self._next_port + n))
        self._next_port += n
        return ports

    def add_host(self, name: str) -> SimHost:
        host = SimHost(name, EndpointCore())
        self.hosts[name] = host
        return host

    def connect(
        self,
        a: str,
        b: str,
        evs: int = 16,
        config: QPConfig | None = None,
        qpn_a: int = 1,
        qpn_b: int = 1,
        psn_a: int = 0,
        psn_b: int = 0,
        planes: int = 1,
        routes: bool | None = None,
        backups: int | None = None,
    ) -> tuple[QueuePair, QueuePair]:
        """A connected QP pair between hosts ``a`` and ``b``, each with ``evs`` EVs in rotation
        and ``backups`` more in the pool (None: as many as the transport opens,
        ``backup_count(evs, planes)``; 0: none), EVs laid out as the transport lays them out.

        ``routes``: whether the QPs are told each EV's route (``EVSet.set_routes``; EVs of one
        route share its fate, docs/EV_HEALTH.md). None: as the transport would, i.e. on an SRv6
        fabric (the default kind) and nowhere else. True on an ``ecmp`` fabric: the spine each
        EV hashes to, which no real host knows (for studies). False: never."""
        cfg = config or QPConfig()
        if backups is None:
            backups = backup_count(evs, planes)
        qa = self._queue_pair(a, qpn_a, evs, backups, planes, cfg, psn_a, routes)
        qb = self._queue_pair(b, qpn_b, evs, backups, planes, cfg, psn_b, routes)
        qa.connect(qpn_b, psn_b)
        qb.connect(qpn_a, psn_a)
        self.hosts[a].core.add(qa)
        self.hosts[b].core.add(qb)
        self._links[(a, qpn_a)] = (b, qpn_b)
        self._links[(b, qpn_b)] = (a, qpn_a)
        return qa, qb

    def _queue_pair(
        self,
        host: str,
        qpn: int,
        active: int,
        backups: int,
        planes: int,
        config: QPConfig,
        psn: int,
        told: bool | None,
    ) -> QueuePair:
        """A QP of ``host``, its EVs opened (ports, flow labels, routes) as
        ``mrc.transport.evsockets.open_ev_sockets`` opens them."""
        fab = self.fabric
        pinned = fab is not None and not fab.ecmp
        per_plane = [fab.routes_per_plane if fab is not None else 1] * planes
        ports: dict[tuple[int, int, int], int] = {}
        values: list[int] = []
        plane_of: list[int] = []
        route_of: list[int] = []
        for i in range(active + backups):
            slot = ev_slot(i, per_plane, config.source_ports)
            if slot not in ports:
                ports[slot] = self._ports(1)[0]
            values.append(wire.ev_value(ports[slot], ev_label(i)))
            plane_of.append(slot[0])
            route_of.append(slot[1])
        for ev, plane in zip(values, plane_of, strict=True):
            self._ev_owner[ev] = (host, plane)
        ids: list[int] | None = None
        if pinned:
            assert fab is not None
            for ev, spine in zip(values, route_of, strict=True):
                fab.pin(ev, spine)
            if told is not False:
                # what mrc.connection.handshake.route_ids makes of the routes' labels (a
                # spine's name, distinct per plane): a number per (plane, spine), in EV order
                labels: dict[tuple[int, int], int] = {}
                ids = [
                    labels.setdefault(pr, len(labels))
                    for pr in zip(plane_of, route_of, strict=True)
                ]
        elif told and fab is not None:
            ids = [fab.spine_of(ev) for ev in values]
        return QueuePair(
            qpn, self.hosts[host].core.pd, values, plane_of, config, psn, active, ev_routes=ids
        )

    # ---- scheduling --------------------------------------------------------------------

    def _at(self, when: float, fn: Callable[[], None]) -> None:
        self._n += 1
        heapq.heappush(self._heap, (when, self._n, fn))

    def pump(self, host: SimHost, qp: QueuePair) -> None:
        """Collect what ``qp`` wants to send and put it on the wire; re-arm its timer."""
        peer_name, _peer_qpn = self._links[(host.name, qp.qpn)]
        for ev, hdr, payload in qp.datagrams_to_send(self.now):
            self._transmit(bytes(hdr) + bytes(payload), qp.evs.values[ev], peer_name)
        while (event := qp.next_event()) is not None:
            host.events.append(event)
        deadline = qp.get_timer()
        if deadline is not None:
            self._at(max(deadline, self.now), lambda: self._fire_timer(host, qp))

    def _fire_timer(self, host: SimHost, qp: QueuePair) -> None:
        deadline = qp.get_timer()
        if deadline is not None and deadline <= self.now:
            qp.handle_timer(self.now)
            self.pump(host, qp)

    def _transmit(self, data: bytes, ev: int, dst: str) -> None:
        f = self.faults
        r = self.rng
        if ev in f.dead_evs or r.random() < f.loss:
            self.lost += 1
            return
        if data[0] in (wire.Opcode.RDMA_WRITE_ONLY, wire.Opcode.RDMA_WRITE_ONLY_IMM) and (
            r.random() < f.trim
        ):
            hl = (
                wire.DATA_IMM_HDR_LEN
                if data[0] == wire.Opcode.RDMA_WRITE_ONLY_IMM
                else (wire.DATA_HDR_LEN)
            )
            cut = bytearray(data[:hl])
            cut[4] |= wire.BTH_TRIMMED
            data = bytes(cut)
            self.trimmed += 1
        copies = 2 if r.random() < f.duplicate else 1
        for _ in range(copies):
            delay = f.delay + r.random() * f.jitter
            if r.random() < f.reorder:
                delay += r.random() * f.reorder_delay
            if self.fabric is None:
                self._at(self.now + delay, partial(self._deliver, dst, data, ev))
            else:
                self._at(self.now + delay, partial(self._enter_fabric, dst, data, ev))

    def _enter_fabric(self, dst: str, data: bytes, ev: int) -> None:
        assert self.fabric is not None
        src, plane = self._ev_owner.get(ev, ("?", 0))
        self.fabric.send(self.now, src, dst, ev, plane, data)

    def _deliver(self, dst: str, data: bytes, ev: int) -> None:
        host = self.hosts[dst]
        qp = host.core.receive_datagram(memoryview(data), ev, self.now)
        if qp is not None:
            self.pump(host, qp)

    def inject(self, dst: str, data: bytes, ev: int = 9999) -> None:
        """Deliver a raw datagram to ``dst`` now (for malformed-input tests)."""
        self._at(self.now, lambda: self._deliver(dst, data, ev))

    def kick(self) -> None:
        """Pump every QP once (after posting work)."""
        for host in self.hosts.values():
            for qp in list(host.core.qps.values()):
                self.pump(host, qp)

    def run(self, until: Callable[[], bool] | None = None, max_time: float = 60.0) -> bool:
        """Advance virtual time until ``until()`` holds (True) or nothing is left (False)."""
        self.kick()
        while self._heap:
            if until is not None and until():
                return True
            when, _n, fn = heapq.heappop(self._heap)
            if when > max_time:
                return False
            self.now = max(self.now, when)
            fn()
        return until() if until is not None else True
