"""A deterministic, seeded, in-memory network for driving the sans-IO core.

Two or more endpoints exchange datagrams through per-EV paths that add delay and jitter and can
lose, trim, duplicate or reorder packets according to a seeded fault schedule. Time is virtual:
``run()`` jumps from one event to the next, so a simulated second costs only the work done.
Tests use it to check invariants over hundreds of seeds; researchers can use it to try ideas
without sockets.

Congestion is opt-in: with a :class:`~mrc.lab.sim_links.Fabric` (``SimNetwork(fabric=...)`` or
``set_fabric``) each datagram, after the seeded ``Faults`` (applied at the sender, as today),
crosses that fabric's links, which serialize at a rate, queue, trim or drop, and mark ECN; the
module ``mrc.lab.sim_links`` documents the topology and how EVs map onto it. Without one, every
datagram is delivered after its own delay, exactly as before the fabric existed (same seed, same
events).
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
    dead_evs: set[int] = field(default_factory=set)  # EV source ports whose path drops all


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
        # source port -> (host, plane) of the EV that owns it: where a datagram enters a fabric
        self._port_owner: dict[int, tuple[str, int]] = {}
        self.fabric: Fabric | None = None
        if fabric is not None:
            self.set_fabric(fabric)

    def set_fabric(self, fabric: Fabric) -> None:
        """Send every datagram through ``fabric``'s links from now on (see mrc.lab.sim_links)."""
        if self.fabric is not None:
            raise ValueError("this network already has a fabric")
        fabric.attach(self._at, self._deliver)
        self.fabric = fabric

    def _ports(self, n: int) -> list[int]:
        """``n`` fresh source ports: unique across the whole simulation, like real EVs."""
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
        routes: bool = False,
    ) -> tuple[QueuePair, QueuePair]:
        """A connected QP pair between hosts ``a`` and ``b``, each with ``evs`` EVs.

        ``routes``: label each EV with the spine its port hashes to on the fabric, as SRv6
        route labels do for real QPs (EVs of one route share its fate; docs/EV_HEALTH.md)."""
        ports_a = self._ports(evs)
        ports_b = self._ports(evs)
        plane_of = [i % planes for i in range(evs)]
        # with a fabric, each EV's route is the spine it hashes to (what SRv6 labels give real QPs)
        fab = self.fabric if routes else None
        routes_a = [fab.spine_of(p) for p in ports_a] if fab is not None else None
        routes_b = [fab.spine_of(p) for p in ports_b] if fab is not None else None
        pd_a, pd_b = self.hosts[a].core.pd, self.hosts[b].core.pd
        qa = QueuePair(qpn_a, pd_a, ports_a, plane_of, config, psn_a, ev_routes=routes_a)
        qb = QueuePair(qpn_b, pd_b, ports_b, plane_of, config, psn_b, ev_routes=routes_b)
        for host, ports in ((a, ports_a), (b, ports_b)):
            for port, plane in zip(ports, plane_of, strict=True):
                self._port_owner[port] = (host, plane)
        qa.connect(qpn_b, psn_b)
        qb.connect(qpn_a, psn_a)
        self.hosts[a].core.add(qa)
        self.hosts[b].core.add(qb)
        self._links[(a, qpn_a)] = (b, qpn_b)
        self._links[(b, qpn_b)] = (a, qpn_a)
        return qa, qb

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

    def _transmit(self, data: bytes, sport: int, dst: str) -> None:
        f = self.faults
        r = self.rng
        if sport in f.dead_evs or r.random() < f.loss:
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
                self._at(self.now + delay, partial(self._deliver, dst, data, sport))
            else:
                self._at(self.now + delay, partial(self._enter_fabric, dst, data, sport))

    def _enter_fabric(self, dst: str, data: bytes, sport: int) -> None:
        assert self.fabric is not None
        src, plane = self._port_owner.get(sport, ("?", 0))
        self.fabric.send(self.now, src, dst, sport, plane, data)

    def _deliver(self, dst: str, data: bytes, sport: int) -> None:
        host = self.hosts[dst]
        qp = host.core.receive_datagram(memoryview(data), sport, self.now)
        if qp is not None:
            self.pump(host, qp)

    def inject(self, dst: str, data: bytes, sport: int = 9999) -> None:
        """Deliver a raw datagram to ``dst`` now (for malformed-input tests)."""
        self._at(self.now, lambda: self._deliver(dst, data, sport))

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
