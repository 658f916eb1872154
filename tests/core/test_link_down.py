"""A plane whose NIC lost its link (QueuePair.link_down), in the seeded simulator.

The transport calls ``link_down`` when the kernel reports that a plane's NIC lost its link
(mrc/transport/linkstate.py; tests/transport/test_linkstate.py does it with a real veth).
Here, without a race: the plane is out at once, everything in flight on it is resent on the
other plane at once (not after SACK evidence, a probe or a timeout), nothing is blamed on
congestion, and the peer, told through the port-state bitmap of the next ACKs, does the same
for what it had in flight on that plane.
"""

from __future__ import annotations

from mrc import wire
from mrc.core import QPConfig, QueuePair
from mrc.core.events import Event, EVReason, EVStateChanged
from mrc.core.evset import EVState
from mrc.core.psn import to_seq
from mrc.lab.sim import Faults, SimNetwork

SIZE = 400_000


def _setup() -> tuple[SimNetwork, QueuePair, QueuePair, bytearray, bytes, list[tuple[int, bytes]]]:
    net = SimNetwork(seed=11, faults=Faults(delay=0.002, jitter=0.0))
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=1000, max_outstanding=32, cc="fixed")
    qa, qb = net.connect("a", "b", evs=16, config=cfg, planes=2)
    buf = bytearray(SIZE)
    mr = qb.pd.register(buf)
    data = bytes((i * 7 + 3) % 251 for i in range(SIZE))
    sent: list[tuple[int, bytes]] = []
    transmit = net._transmit

    def record(data: bytes, ev: int, dst: str) -> None:
        sent.append((ev, data))
        transmit(data, ev, dst)

    net._transmit = record  # type: ignore[method-assign]
    qa.post_write(data, mr.addr, mr.rkey)
    return net, qa, qb, buf, data, sent


def _plane_ports(qp: QueuePair, plane: int) -> set[int]:
    return {p for i, p in enumerate(qp.evs.values) if qp.evs.planes[i] == plane}


def _data_seqs(qp: QueuePair, sent: list[tuple[int, bytes]]) -> list[tuple[int, int]]:
    """(source port, sequence number) of every data packet in ``sent``."""
    out = []
    for sport, raw in sent:
        if raw[0] == wire.Opcode.RDMA_WRITE_ONLY:
            psn = int.from_bytes(raw[9:12], "big")
            out.append((sport, to_seq(qp.requester.initial_psn, psn, 0)))
    return out


def _reasons(events: list[Event], plane: int) -> set[EVReason]:
    return {
        e.reason
        for e in events
        if isinstance(e, EVStateChanged) and e.plane == plane and e.new is EVState.ASSUMED_BAD
    }


def test_our_link_down_resends_what_was_in_flight_on_its_plane_at_once() -> None:
    net, qa, qb, buf, data, sent = _setup()
    assert net.run(lambda: qa.requester.in_flight >= 32, max_time=5)
    planes = qa.evs.planes
    in_flight = {s for s, pkt in qa.requester._outstanding.items() if planes[pkt.ev] == 1}
    assert len(in_flight) >= 8  # a spray over two planes: about half
    net.faults.dead_evs.update(_plane_ports(qa, 1))  # from now on plane 1 carries nothing
    mark = len(sent)
    assert qa.link_down(1, net.now)
    assert qa.stats.retransmits_link == len(in_flight)
    net.pump(net.hosts["a"], qa)
    resent = _data_seqs(qa, sent[mark:])
    # all of them at once, each on plane 0, and nothing else yet
    assert {s for _p, s in resent} == in_flight and len(resent) == len(in_flight)
    assert {p for p, _s in resent} <= _plane_ports(qa, 0)
    assert not qa.link_down(1, net.now)  # nothing left to do: told twice, done once

    assert net.run(lambda: qa.idle, max_time=30)
    assert bytes(buf) == data
    st = qa.stats
    assert st.retransmits_timeout == st.retransmits_sack == st.retransmits_tlp == 0
    assert st.retransmits == len(in_flight)
    assert qa.evs.planes_lost == 1
    events = net.hosts["a"].events
    assert _reasons(events, 1) == {EVReason.LINK_DOWN}
    assert _reasons(events, 0) == set()
    assert all(p in _plane_ports(qa, 0) for p, _s in _data_seqs(qa, sent[mark:]))


def test_the_peer_told_of_a_link_down_resends_its_plane_on_the_first_loss_there() -> None:
    """The port-state bits steer at once; what is in flight on the plane is resent when a
    loss there confirms them (a bitmap is unverifiable without keys: issue 36)."""
    net, qa, qb, buf, data, sent = _setup()
    assert net.run(lambda: qa.requester.in_flight >= 32, max_time=5)
    # the receiver's plane-1 NIC lost its link: what it receives there, and its ACKs there,
    # vanish; it says so in the port-state bitmap of its next ACKs (on plane 0), a moment
    # after packets sent on plane 1 began to vanish
    net.faults.dead_evs.update(_plane_ports(qb, 1) | _plane_ports(qa, 1))
    mark = qa.stats.packets_sent
    assert net.run(lambda: qa.stats.packets_sent >= mark + 16, max_time=5)
    assert qb.link_down(1, net.now)
    assert qb.evs.port_state() & 0b10 == 0
    assert net.run(lambda: qa.evs.peer_plane_down[1], max_time=5)
    told_at, told_sent = net.now, len(sent)
    assert qa.stats.retransmits_link == 0  # not on the bitmap's word alone
    assert net.run(lambda: qa.stats.retransmits_link >= 1, max_time=5)
    # confirmed by a loss the SACKs of what went on plane 0 showed
    assert qa.stats.retransmits_sack >= 1
    assert net.now - told_at < 0.02  # a few round trips of 4 ms
    # nothing new went on plane 1 after the bitmap said it is down
    assert not {p for p, _s in _data_seqs(qa, sent[told_sent:])} & _plane_ports(qa, 1)

    assert net.run(lambda: qa.idle, max_time=30)
    assert bytes(buf) == data
    st = qa.stats
    assert st.retransmits_timeout == 0
    assert _reasons(net.hosts["b"].events, 1) == {EVReason.LINK_DOWN}
    # packets sent on plane 1 before the fault arrived, their ACKs on plane 1 did not: the
    # plane's resend brings them again on plane 0, which the receiver may take for an ACK
    # lost on the way back; no other evidence against plane 0
    assert _reasons(net.hosts["b"].events, 0) <= {EVReason.ACK_LOST}
