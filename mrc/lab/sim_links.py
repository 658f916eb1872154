"""Congestion in the simulator: links with a service rate, finite queues, trimming and ECN.

``SimNetwork`` alone gives every datagram an independent delay, so nothing in it ever queues and
congestion control has nothing to react to.  A :class:`Fabric` attached to a network
(``SimNetwork(fabric=...)`` or ``net.set_fabric(...)``) sends every datagram through a chain of
:class:`Link` objects instead, each serving packets one at a time at its rate, so that a sender
faster than its bottleneck builds a queue, the queue overflows, and several senders into one
receiver contend for one queue, exactly the situations MRC's trimming, NACKs and (later)
congestion control exist for.  Without a fabric nothing queues, as before links existed: an
ideal fabric (no rates) whose QPs get one route per plane gives the very same events.

Topology (one copy per plane, two tiers, hosts on leaves; every host is its own leaf unless
``Fabric.leaves`` says otherwise)::

    src --nic:src/pP--> leaf(src) --up:leaf/pP/sS--> spine S of plane P
        --down:leaf(dst)/pP/sS--> leaf(dst) --last:dst/pP--> dst

EVs are 32 bits, as on the wire (``mrc.wire.ev_value``: the UDP source port in the high 16, the
flow label in the low 16), and ``SimNetwork.connect`` lays a QP's EVs out as the transport does
(``mrc.evlayout``): EV ``i`` is on plane ``i % planes`` and its datagrams, and ACKs echoing it,
stay in that plane; within a plane, how an EV finds its spine is the fabric's kind:

* **SRv6 (the default, ``ecmp=False``): what runs on an mrc-fabric.** Each EV is pinned to the
  spine of its route (``Fabric.pin``): EV ``i`` takes its plane's ``spines`` routes in turn,
  route ``(i // planes) % spines``, one source port per route and plane, and the QP is told its
  routes as the transport tells it (``EVSet.set_routes``), so route fate and route-alive
  evidence (docs/EV_HEALTH.md) work as on the netns fabric. Hosts on one leaf still go through
  the spine of the route (the spine hairpins the packet back down, docs/FABRIC.md), so
  spraying covers every spine. A datagram whose EV is pinned to nothing (``inject``, a QP built
  by hand) takes the plane's default path, as the fabric's static routes send it: through
  spine 0, or straight through a shared leaf.
* **A plain network (``ecmp=True``).** No source routes: a QP has one route per plane (one
  source port per plane; its EVs differ in flow label) and is told nothing of its paths, and a
  switch hashes each EV onto a spine, ``crc32(EV as 4 big-endian bytes) % spines``, so two EVs
  can collide on one spine. Hosts on the same leaf skip the spines: ``nic`` then ``last``. For
  studies of MRC on a network without SRv6 (``Fabric.spine_of`` tells the spine of an EV).
* ``last:dst/pP`` is the last hop into a receiver: every sender to ``dst`` in plane ``P`` shares
  its queue (incast N->1); a trim there also sets LASTHOP, like ``mrc/lab/fabric/trim`` on a port
  that faces the destination host.  ``nic:src/pP`` is the sender's own NIC port, which by
  default is infinitely fast (the host paces itself; a NIC queue cannot trim).
* Every link of one role gets that role's :class:`LinkSpec`; ``Fabric.overrides`` replaces the
  spec of single links by name (a slow plane, a slow spine).

Each link is FIFO with two bands, served with strict (non-preemptive) priority: the *priority*
band holds trimmed headers and every non-data packet (ACK/SACK/NACK, probes), the *data* band
holds untrimmed RDMA WRITE packets.  A data packet that would take the bytes waiting in the data
band over ``queue`` is trimmed if the link trims and the packet has payload to cut
(headers kept: BTH + RETH [+ ImmDt] [+ the security block when S is set], BTH byte 4 TRIMMED,
plus LASTHOP on a last hop, the same cut ``mrc/lab/fabric/trim`` makes), and the header joins the
priority band, ahead of the data it was cut to avoid; otherwise it is tail-dropped.  Sizes are
UDP payload bytes; "waiting" never counts the packet being serialized.  ``priority=False``
gives plain FIFO (the header waits behind the data), the control case for the priority band.

The network's seeded ``Faults`` (loss, trim, duplicates, delay, jitter, reorder) still apply,
at the sender, before a datagram enters the fabric: ``Faults(delay=0.0, jitter=0.0)`` leaves
only the fabric's own timing.

ECN: the simulator carries no IP header, so Congestion Experienced is modelled with the BTH
FECN bit (byte 4, 0x80), which docs/PROTOCOL.md section 3.1 reserves for congestion control and
which receivers ignore today.  A data packet is marked when it joins the data band behind more
than ``ecn`` bytes (marking at enqueue, as a DCTCP-style instantaneous threshold).

No randomness is used here: a run is fully determined by the network's seed.

Usage (one QP into a 100 Mbit/s last hop that trims and marks; run by the tests)::

    from mrc.core import QPConfig
    from mrc.lab.sim import Faults, SimNetwork
    from mrc.lab.sim_links import Fabric, LinkSpec

    fab = Fabric(lasthop=LinkSpec(rate=12.5e6, queue=20_000, ecn=8_000, trim=True))
    net = SimNetwork(seed=1, faults=Faults(delay=0.0, jitter=0.0), fabric=fab)
    net.add_host("a"), net.add_host("b")
    cfg = QPConfig(max_outstanding=48, cc="fixed")  # a fixed window, so that the queue overflows
    qa, qb = net.connect("a", "b", evs=16, config=cfg, planes=2)
    mr = net.hosts["b"].core.pd.register(buf := bytearray(1 << 18))
    qa.post_write(b"x" * len(buf), mr.addr, mr.rkey)
    assert net.run(lambda: qa.idle) and buf == b"x" * len(buf)
    last = fab.link("last:b/p0")  # also last:b/p1, nic:a/p0, ...; fab.total("trimmed")
    print(last.stats.trimmed, last.stats.ecn_marked, last.stats.max_queue, last.utilization())
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from mrc import wire

#: key id + counter + header ICV (mrc.security.packet.SEC_BLOCK_LEN, not imported so that the
#: simulator loads without the cryptography package, like the core)
SEC_BLOCK_LEN = 28

_WRITE = int(wire.Opcode.RDMA_WRITE_ONLY)
_WRITE_IMM = int(wire.Opcode.RDMA_WRITE_ONLY_IMM)

#: schedule(when, fn): run ``fn`` at virtual time ``when`` (the network's event heap)
Schedule = Callable[[float, Callable[[], None]], None]
#: deliver(dst host, datagram, EV): hand a datagram to the receiving endpoint
Deliver = Callable[[str, bytes, int], None]


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """How one link behaves.  The defaults are an ideal wire: infinitely fast, no queue."""

    rate: float | None = None  # bytes per second; None: no serialization and no queue
    queue: int | None = None  # data-band limit, bytes waiting; None: unlimited
    delay: float = 0.0  # propagation delay after serialization, seconds
    ecn: int | None = None  # mark CE (FECN) on data joining behind more than this many bytes
    trim: bool = False  # cut data packets that do not fit instead of dropping them
    priority: bool = True  # trimmed headers and control packets overtake queued data
    priority_queue: int | None = None  # limit of the priority band, bytes; None: unlimited

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 bytes/s, not {self.rate}")
        for name in ("queue", "ecn", "priority_queue"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 bytes, not {value}")
        if self.delay < 0:
            raise ValueError(f"delay must be >= 0 s, not {self.delay}")


@dataclass(slots=True)
class LinkStats:
    """What happened on one link.  Packets, bytes (UDP payload) and seconds."""

    enqueued: int = 0  # packets admitted, either band (a trimmed header counts here too)
    enqueued_bytes: int = 0
    dropped: int = 0  # tail drops
    dropped_bytes: int = 0
    lost_down: int = 0  # packets that arrived while the link was down (``Link.down``)
    trimmed: int = 0  # data packets cut to their headers
    trimmed_bytes: int = 0  # payload bytes cut off
    ecn_marked: int = 0
    max_queue: int = 0  # most bytes ever waiting in the data band
    max_priority_queue: int = 0  # most bytes ever waiting in the priority band
    served: int = 0  # packets fully serialized (none on a link without a rate)
    served_bytes: int = 0
    busy_time: float = 0.0  # seconds spent serializing
    first_arrival: float | None = None
    last_departure: float | None = None
    #: per served packet, seconds between its arrival and the start of its serialization
    queue_delays: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """One step of one packet, recorded when ``Fabric.trace`` is on (for tests and plots).

    ``kind``: ``enqueue`` (admitted untrimmed), ``trim`` (cut and admitted to the priority
    band), ``drop``, ``depart`` (serialization done) on a link; ``deliver`` with ``link`` =
    ``host:NAME`` when it reaches the receiver.  ``queued``: bytes waiting in the band the
    packet joined (the data band for ``drop`` and ``trim``) just before it arrived.
    """

    time: float
    link: str
    kind: str
    pid: int
    ev: int  # the datagram's 32-bit EV (UDP source port and flow label)
    data: bytes
    queued: int = 0
    marked: bool = False


@dataclass(slots=True)
class Packet:
    """A datagram on its way through the fabric."""

    pid: int
    data: bytes
    dst: str
    ev: int
    path: tuple[Link, ...]
    hop: int = 0
    arrived: float = 0.0  # when it reached path[hop]


def trim_datagram(data: bytes, lasthop: bool) -> bytes | None:
    """``data`` cut to its MRC headers and marked TRIMMED (+ LASTHOP), or None if it has no
    payload to cut (not an MRC WRITE, or a zero-length one: a switch would drop those)."""
    if not data or data[0] not in (_WRITE, _WRITE_IMM):
        return None
    keep = wire.DATA_IMM_HDR_LEN if data[0] == _WRITE_IMM else wire.DATA_HDR_LEN
    if len(data) > 8 and data[8] & wire.BTH_SECURE:
        keep += SEC_BLOCK_LEN  # its header ICV lets the receiver authenticate the header
    if len(data) <= keep:
        return None
    cut = bytearray(data[:keep])
    cut[4] |= wire.BTH_TRIMMED | (wire.BTH_LASTHOP if lasthop else 0)
    return bytes(cut)


def _is_data(data: bytes) -> bool:
    """An untrimmed MRC WRITE: the only kind of packet that waits in the data band."""
    return len(data) > 4 and data[0] in (_WRITE, _WRITE_IMM) and not data[4] & wire.BTH_TRIMMED


class Link:
    """One direction of one link: a two-band queue in front of a transmitter of fixed rate."""

    def __init__(self, fabric: Fabric, name: str, spec: LinkSpec, lasthop: bool) -> None:
        self.fabric = fabric
        self.name = name
        self.spec = spec
        self.lasthop = lasthop
        self.stats = LinkStats()
        self._data: deque[Packet] = deque()
        self._prio: deque[Packet] = deque()
        self._data_bytes = 0
        self._prio_bytes = 0
        self._busy = False
        #: a failed link: every packet that arrives is lost (queued ones still leave), the way
        #: a spine port that lost its carrier swallows what routing still sends it
        self.down = False

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self.spec})"

    @property
    def queued(self) -> int:
        """Bytes waiting now, both bands (not counting the packet being serialized)."""
        return self._data_bytes + self._prio_bytes

    def utilization(self, start: float | None = None, end: float | None = None) -> float:
        """Bytes served / (rate x (end - start)); by default from the first arrival to the last
        departure, i.e. how well the traffic kept this link busy while it had any."""
        st = self.stats
        if self.spec.rate is None:
            raise ValueError(f"{self.name} has no rate")
        t0 = st.first_arrival if start is None else start
        t1 = st.last_departure if end is None else end
        if t0 is None or t1 is None or t1 <= t0:
            return 0.0
        return st.served_bytes / (self.spec.rate * (t1 - t0))

    def arrive(self, now: float, pkt: Packet) -> None:
        st = self.stats
        if st.first_arrival is None:
            st.first_arrival = now
        pkt.arrived = now
        if self.down:
            st.lost_down += 1
            self._trace(now, "drop", pkt, self._data_bytes, False)
            return
        spec = self.spec
        if spec.rate is None:  # an ideal wire: no queue, no serialization
            st.enqueued += 1
            st.enqueued_bytes += len(pkt.data)
            self._trace(now, "enqueue", pkt, 0, False)
            self._finish(now, pkt)
            return
        size = len(pkt.data)
        if spec.priority and not _is_data(pkt.data):
            self._admit(now, pkt, priority=True, trace="enqueue")
            return
        waiting = self._data_bytes
        if spec.queue is None or waiting + size <= spec.queue:
            marked = spec.ecn is not None and waiting > spec.ecn and _is_data(pkt.data)
            if marked:
                buf = bytearray(pkt.data)
                buf[4] |= wire.BTH_FECN
                pkt.data = bytes(buf)
                st.ecn_marked += 1
            self._trace(now, "enqueue", pkt, waiting, marked)
            self._admit(now, pkt, priority=False, trace=None)
            return
        cut = trim_datagram(pkt.data, self.lasthop) if spec.trim else None
        if cut is None:
            st.dropped += 1
            st.dropped_bytes += size
            self._trace(now, "drop", pkt, waiting, False)
            return
        st.trimmed += 1
        st.trimmed_bytes += size - len(cut)
        pkt.data = cut
        self._trace(now, "trim", pkt, waiting, False)
        # without a priority band the header waits behind the data it was cut to avoid (it is
        # admitted even over the limit: a switch keeps room for headers)
        self._admit(now, pkt, priority=spec.priority, trace=None)

    def _admit(self, now: float, pkt: Packet, priority: bool, trace: str | None) -> None:
        st = self.stats
        size = len(pkt.data)
        if priority:
            limit = self.spec.priority_queue
            if limit is not None and self._prio_bytes + size > limit:
                st.dropped += 1
                st.dropped_bytes += size
                self._trace(now, "drop", pkt, self._prio_bytes, False)
                return
            if trace is not None:
                self._trace(now, trace, pkt, self._prio_bytes, False)
            self._prio.append(pkt)
            self._prio_bytes += size
        else:
            self._data.append(pkt)
            self._data_bytes += size
        st.enqueued += 1
        st.enqueued_bytes += size
        if not self._busy:
            self._start(now)
        st.max_queue = max(st.max_queue, self._data_bytes)
        st.max_priority_queue = max(st.max_priority_queue, self._prio_bytes)

    def _start(self, now: float) -> None:
        """Take the next packet, priority band first, and serialize it."""
        if self._prio:
            pkt = self._prio.popleft()
            self._prio_bytes -= len(pkt.data)
        else:
            pkt = self._data.popleft()
            self._data_bytes -= len(pkt.data)
        assert self.spec.rate is not None
        service = len(pkt.data) / self.spec.rate
        self._busy = True
        self.stats.queue_delays.append(now - pkt.arrived)
        self.stats.busy_time += service
        done = now + service
        self.fabric.schedule(done, partial(self._done, pkt, done))

    def _done(self, pkt: Packet, now: float) -> None:
        st = self.stats
        st.served += 1
        st.served_bytes += len(pkt.data)
        st.last_departure = now
        self._trace(now, "depart", pkt, 0, False)
        self._busy = False
        self._finish(now, pkt)
        if self._prio or self._data:
            self._start(now)

    def _finish(self, now: float, pkt: Packet) -> None:
        """The packet is on the wire: it reaches the next hop after the propagation delay."""
        self.fabric.forward(now + self.spec.delay, pkt)

    def _trace(self, now: float, kind: str, pkt: Packet, queued: int, marked: bool) -> None:
        trace = self.fabric.trace
        if trace is not None:
            trace.append(LinkEvent(now, self.name, kind, pkt.pid, pkt.ev, pkt.data, queued, marked))


@dataclass
class Fabric:
    """Per-plane two-tier fabric of :class:`Link`\\ s (see the module docstring for the map).

    Links are created when first used, named ``nic:HOST/pP``, ``up:LEAF/pP/sS``,
    ``down:LEAF/pP/sS`` and ``last:HOST/pP``; ``links`` holds them all after a run.
    """

    nic: LinkSpec = field(default_factory=LinkSpec)  # host -> its leaf, per (host, plane)
    up: LinkSpec = field(default_factory=LinkSpec)  # leaf -> spine, per (leaf, plane, spine)
    down: LinkSpec = field(default_factory=LinkSpec)  # spine -> leaf, per (leaf, plane, spine)
    lasthop: LinkSpec = field(default_factory=LinkSpec)  # leaf -> host, per (host, plane)
    spines: int = 1  # per plane
    #: a plain network: switches hash EVs onto spines; False: SRv6, each EV pinned to its route
    ecmp: bool = False
    leaves: dict[str, str] = field(default_factory=dict)  # host -> leaf; default: its own
    overrides: dict[str, LinkSpec] = field(default_factory=dict)  # link name -> spec
    record: bool = False  # keep a LinkEvent per packet step in ``trace``
    links: dict[str, Link] = field(default_factory=dict, init=False)
    trace: list[LinkEvent] | None = field(default=None, init=False)
    _schedule: Schedule | None = field(default=None, init=False, repr=False)
    _deliver: Deliver | None = field(default=None, init=False, repr=False)
    _routes: dict[tuple[str, str, int, int], tuple[Link, ...]] = field(
        default_factory=dict, init=False, repr=False
    )
    _pins: dict[int, int] = field(default_factory=dict, init=False, repr=False)  # EV -> spine
    _pids: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.spines < 1:
            raise ValueError(f"spines must be >= 1, not {self.spines}")
        if self.record:
            self.trace = []

    def attach(self, schedule: Schedule, deliver: Deliver) -> None:
        """Bind to one network's event heap and endpoints (``SimNetwork.set_fabric`` does)."""
        if self._schedule is not None:
            raise ValueError("this Fabric already belongs to a network")
        self._schedule = schedule
        self._deliver = deliver

    def schedule(self, when: float, fn: Callable[[], None]) -> None:
        if self._schedule is None:
            raise ValueError("the Fabric is not attached to a network")
        self._schedule(when, fn)

    # ---- topology ----------------------------------------------------------------------

    @property
    def routes_per_plane(self) -> int:
        """How many routes a QP has in each plane, as the transport would open them: one per
        spine on an SRv6 fabric (between hosts on one leaf too), one on a plain network."""
        return 1 if self.ecmp else self.spines

    def pin(self, ev: int, spine: int) -> None:
        """Send EV ``ev``'s datagrams through ``spine`` of their plane: its SRv6 route."""
        if self.ecmp:
            raise ValueError("a plain (ecmp) fabric has no source routes to pin EVs to")
        if not 0 <= spine < self.spines:
            raise ValueError(f"spine {spine} of {self.spines}")
        self._pins[ev] = spine

    def spine_of(self, ev: int) -> int:
        """The spine EV ``ev``'s datagrams cross between two leaves: its route's, if pinned;
        else the ECMP hash of its 32 bits on a plain fabric, spine 0 (the default path of the
        static routes) on an SRv6 one."""
        spine = self._pins.get(ev)
        if spine is not None:
            return spine
        return zlib.crc32(ev.to_bytes(4, "big")) % self.spines if self.ecmp else 0

    def link(self, name: str) -> Link:
        """The link called ``name`` (KeyError if no packet has used it yet)."""
        return self.links[name]

    def _link(self, name: str, spec: LinkSpec, lasthop: bool = False) -> Link:
        link = self.links.get(name)
        if link is None:
            link = Link(self, name, self.overrides.get(name, spec), lasthop)
            self.links[name] = link
        return link

    def route(self, src: str, dst: str, ev: int, plane: int) -> tuple[Link, ...]:
        key = (src, dst, ev, plane)
        path = self._routes.get(key)
        if path is None:
            src_leaf = self.leaves.get(src, src)
            dst_leaf = self.leaves.get(dst, dst)
            hops = [self._link(f"nic:{src}/p{plane}", self.nic)]
            if src_leaf != dst_leaf or ev in self._pins:  # a pinned route hairpins at its spine
                s = self.spine_of(ev)
                hops.append(self._link(f"up:{src_leaf}/p{plane}/s{s}", self.up))
                hops.append(self._link(f"down:{dst_leaf}/p{plane}/s{s}", self.down))
            hops.append(self._link(f"last:{dst}/p{plane}", self.lasthop, lasthop=True))
            path = tuple(hops)
            self._routes[key] = path
        return path

    # ---- moving packets ----------------------------------------------------------------

    def send(self, now: float, src: str, dst: str, ev: int, plane: int, data: bytes) -> None:
        """A datagram leaves ``src`` on EV ``ev`` (of plane ``plane``) towards ``dst``."""
        self._pids += 1
        path = self.route(src, dst, ev, plane)
        path[0].arrive(now, Packet(self._pids, data, dst, ev, path))

    def forward(self, when: float, pkt: Packet) -> None:
        """``pkt`` left ``pkt.path[pkt.hop]``; at ``when`` it reaches the next hop or the host."""
        pkt.hop += 1
        if pkt.hop < len(pkt.path):
            self.schedule(when, partial(pkt.path[pkt.hop].arrive, when, pkt))
        else:
            self.schedule(when, partial(self._arrive_host, when, pkt))

    def _arrive_host(self, now: float, pkt: Packet) -> None:
        if self.trace is not None:
            self.trace.append(
                LinkEvent(now, f"host:{pkt.dst}", "deliver", pkt.pid, pkt.ev, pkt.data)
            )
        assert self._deliver is not None
        self._deliver(pkt.dst, pkt.data, pkt.ev)

    # ---- reading the results -----------------------------------------------------------

    def total(self, counter: str) -> int:
        """A LinkStats counter summed over every link (e.g. ``total("trimmed")``)."""
        return sum(int(getattr(link.stats, counter)) for link in self.links.values())

    def matching(self, prefix: str) -> list[Link]:
        """Links whose name starts with ``prefix`` (``"last:b/"``: every plane into b)."""
        return [link for name, link in sorted(self.links.items()) if name.startswith(prefix)]
