"""A tail loss probe that arrives first proves the transmission it probed lost (docs/PROTOCOL.md
3.4, the D flag of the Subject PSN; docs/EV_HEALTH.md, "Evidence of loss").

With a window of a packet or two (NSCC on a slow or congested fabric) a dead path leaves no
SACK evidence: nothing sent after the lost packet arrives until the tail loss probe, which
repeats its PSN. Before the D flag, such a path was never retired and cost a probe timeout on
every packet sprayed over it (mrc-bench's link_down all-to-all: failure steps of 290-370 ms
against 230 for the outage steps after it)."""

from __future__ import annotations

from mrc import wire
from mrc.core import QPConfig, QueuePair
from mrc.core.cc import UetNscc
from mrc.core.events import Event, EVReason, EVStateChanged
from mrc.core.evset import EVState
from mrc.lab.sim import Faults, SimNetwork

SIZE = 200_000


def _pair(
    faults: Faults, dead: str = "", window: int = 1
) -> tuple[SimNetwork, QueuePair, QueuePair]:
    net = SimNetwork(seed=7, faults=faults)
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=1000, max_outstanding=window, cc="fixed", ack_every=1)
    qa, qb = net.connect("a", "b", evs=16, config=cfg)
    if dead == "data":  # a quarter of a's EVs: the packets sprayed on them vanish
        faults.dead_evs.update(qa.evs.values[:4])
    elif dead == "acks":  # a quarter of b's: the ACKs sent on them vanish
        faults.dead_evs.update(qb.evs.values[:4])
    return net, qa, qb


def _transfer(net: SimNetwork, qa: QueuePair, qb: QueuePair) -> bytes:
    buf = bytearray(SIZE)
    mr = qb.pd.register(buf)
    data = bytes((i * 13 + 5) % 251 for i in range(SIZE))
    qa.post_write(data, mr.addr, mr.rkey)
    assert net.run(lambda: qa.idle, max_time=60)
    assert bytes(buf) == data
    return data


def _retired(events: list[Event], reason: EVReason) -> set[int]:
    return {
        e.ev
        for e in events
        if isinstance(e, EVStateChanged) and e.new is EVState.ASSUMED_BAD and e.reason is reason
    }


def test_acks_flag_a_subject_that_had_arrived_before() -> None:
    faults = Faults(duplicate=0.2, delay=0.0001, jitter=0.0)
    net, qa, qb = _pair(faults, window=8)
    arrivals: dict[int, int] = {}
    flagged = clean = 0
    rx_b, rx_a = net.hosts["b"].core.receive_datagram, net.hosts["a"].core.receive_datagram

    def at_b(
        data: memoryview, src_ev: int, now: float, wait: float | None = None
    ) -> QueuePair | None:
        b = bytes(data)
        if b[0] == wire.Opcode.RDMA_WRITE_ONLY:
            psn = int.from_bytes(b[9:12], "big")
            arrivals[psn] = arrivals.get(psn, 0) + 1
        return rx_b(data, src_ev, now, wait)

    def at_a(
        data: memoryview, src_ev: int, now: float, wait: float | None = None
    ) -> QueuePair | None:
        nonlocal flagged, clean
        b = bytes(data)
        if b[0] == wire.Opcode.ACKNOWLEDGE:
            ack = wire.parse_ack(b)
            if ack.subject_dup:
                flagged += 1
                assert arrivals[ack.subject_psn] >= 2  # it had arrived before
            elif arrivals.get(ack.subject_psn) == 1:
                clean += 1
        return rx_a(data, src_ev, now, wait)

    net.hosts["b"].core.receive_datagram = at_b  # type: ignore[method-assign]
    net.hosts["a"].core.receive_datagram = at_a  # type: ignore[method-assign]
    _transfer(net, qa, qb)
    assert flagged > 5 and clean > 50  # (the network duplicates ACKs too: no upper bound)


def test_a_probe_that_arrives_first_retires_the_dead_evs_it_probed() -> None:
    net, qa, qb = _pair(Faults(delay=0.0001, jitter=0.0), dead="data")
    _transfer(net, qa, qb)
    dead = set(range(4))
    events = net.hosts["a"].events
    by_probe = _retired(events, EVReason.PROBE_LOSS)
    assert by_probe and by_probe <= dead  # only dead EVs, proved by their probes
    assert all(qa.evs.state[ev] != EVState.GOOD or not qa.evs.usable[ev] for ev in dead)
    assert qa.stats.losses_tlp >= len(by_probe)
    # once retired, the dead EVs cost no more probes: a handful each, not one per packet
    assert qa.stats.retransmits_tlp <= 3 * len(dead), qa.stats.retransmits_tlp
    assert qa.stats.retransmits_timeout == 0


def test_a_probe_whose_original_arrived_blames_no_data_ev() -> None:
    """The ACK of the original was lost, not the original: the probe is a duplicate, the
    receiver says so, and the receiver's ACK EV takes the blame, not the data EV."""
    net, qa, qb = _pair(Faults(delay=0.0001, jitter=0.0), dead="acks")
    _transfer(net, qa, qb)
    assert qa.stats.retransmits_tlp > 0  # lost ACKs left silences the probes broke
    assert _retired(net.hosts["a"].events, EVReason.PROBE_LOSS) == set()
    assert qa.stats.losses_tlp == 0
    assert _retired(net.hosts["b"].events, EVReason.ACK_LOST)  # the receiver blamed its own


def test_the_ack_of_a_duplicate_goes_twice_on_two_planes() -> None:
    # a duplicate says our ACKs of its subject are not getting through; with a window of one
    # packet nothing else is in flight to be acknowledged, so its ACK goes twice, the copy
    # on the other plane: a dead reverse path then costs a probe, not the probe's ACK too
    from .mrcsim_harness import RecordingNetwork

    faults = Faults(delay=0.0001, jitter=0.0)
    net = RecordingNetwork(seed=7, faults=faults)
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=1000, max_outstanding=1, cc="fixed", ack_every=1)
    qa, qb = net.connect("a", "b", evs=16, config=cfg, planes=2)
    faults.dead_evs.update(qb.evs.values[:4])  # a quarter of b's ACKs vanish
    _transfer(net, qa, qb)
    acks = [s for s in net.sent if s.host == "b" and s.data[0] == wire.Opcode.ACKNOWLEDGE]
    dup = [s for s in acks if wire.parse_ack(s.data).subject_dup]
    assert len(dup) >= 4 and len(dup) % 2 == 0
    for first, copy in zip(dup[::2], dup[1::2], strict=True):
        assert first.data == copy.data and first.time == copy.time
        assert qb.evs.planes[first.ev] != qb.evs.planes[copy.ev]
    # and ACKs of first arrivals go once
    once = [s for s in acks if not wire.parse_ack(s.data).subject_dup]
    assert len({(s.time, s.data) for s in once}) == len(once)
    assert qa.stats.retransmits_timeout == 0


def test_a_probe_sends_a_resend_that_the_window_holds_back() -> None:
    # the newest packet is already queued for a resend but NSCC's window, shrunk to one
    # packet, holds it behind two in flight that are lost: the tail loss probe must be that
    # resend, sent past the window. It used to do nothing and not arm again, and the silence
    # lasted until the RTO (the failover demo's 50 ms stalls)
    from .mrcsim_harness import DATA_OPS, RecordingNetwork, Sent

    faults = Faults(delay=0.0005, jitter=0.0)
    net = RecordingNetwork(seed=3, faults=faults)
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=8, config=QPConfig(payload_size=1000))
    warm = bytearray(1000)
    wmr = qb.pd.register(warm)
    qa.post_write(bytes(1000), wmr.addr, wmr.rkey)  # one round trip first: srtt ~1 ms
    assert net.run(lambda: qa.idle)
    firsts: set[bytes] = set()

    def drop_first_copies(sent: Sent) -> bytes | None:
        if sent.data[0] in DATA_OPS and sent.data[9:12] not in firsts:
            firsts.add(sent.data[9:12])  # the PSN: every packet's first transmission vanishes
            return None
        return sent.data

    net.tamper = drop_first_copies
    start = net.now
    buf = bytearray(3000)
    mr = qb.pd.register(buf)
    data = bytes(range(250)) * 12
    qa.post_write(data, mr.addr, mr.rkey)
    key = ("a", qa.qpn)
    assert net.run(lambda: len(net.data_tx[key]) >= 4)
    req = qa.requester
    cc = req.cc
    assert isinstance(cc, UetNscc) and sorted(req._outstanding) == [1, 2, 3]
    # the newest (seq 3) queued for a resend, the window one packet: 1 and 2 fill it
    cc._set(net.now, 1000.0)
    pkt = req._outstanding[3]
    pkt.deadline = float("inf")
    req._retransmit.append(3)
    req._waiting += 1
    assert net.run(lambda: qa.idle, max_time=1.0)
    assert bytes(buf) == data
    assert qa.stats.retransmits_timeout == 0
    assert net.now - start < qa.config.min_rto / 2  # done long before any RTO could fire


def test_the_ack_of_a_probe_goes_twice_on_two_planes() -> None:
    """The failover demo's longest stalls (issue 20): a packet is lost on a route that just
    died, its tail loss probe arrives (the first copy to), but the ACK of it is lost too (the
    failed link carried the receiver's ACKs as well): the sender waited for a second probe
    (10 ms more) and, as that one went back onto the dead route, a third (20 ms more). A
    probe now carries P, and its ACK goes twice, the copy on another plane: one probe."""
    from .mrcsim_harness import DATA_OPS, RecordingNetwork, Sent

    net = RecordingNetwork(seed=3, faults=Faults(delay=0.0001, jitter=0.0))
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=1000, max_outstanding=1, cc="fixed")
    qa, qb = net.connect("a", "b", evs=8, config=cfg, planes=2)
    buf = bytearray(4000)
    mr = qb.pd.register(buf)
    qa.post_write(bytes(1000), mr.addr, mr.rkey)  # PSN 0: a round trip to warm srtt
    assert net.run(lambda: qa.idle)
    target = (1).to_bytes(3, "big")  # PSN 1
    copies: list[bytes] = []
    acks: list[Sent] = []

    def tamper(sent: Sent) -> bytes | None:
        if sent.host == "a" and sent.data[0] in DATA_OPS and sent.data[9:12] == target:
            copies.append(sent.data)
            if len(copies) == 1:
                return None  # the original, lost on its route
        ours = sent.host == "b" and sent.data[0] == wire.Opcode.ACKNOWLEDGE
        if ours and wire.parse_ack(sent.data).subject_psn == 1:
            acks.append(sent)
            if len(acks) == 1:
                return None  # the ACK of the probe, lost on the way back
        return sent.data

    net.tamper = tamper
    start = net.now
    data = bytes(range(250)) * 12
    qa.post_write(data, mr.addr + 1000, mr.rkey)  # PSNs 1-3
    assert net.run(lambda: qa.idle, max_time=1.0)
    assert bytes(buf[1000:]) == data
    assert len(copies) == 2 and copies[1][8] & wire.BTH_TLP and not copies[0][8] & wire.BTH_TLP
    assert qa.stats.retransmits_tlp == 1  # the probe's second ACK got through
    first, second = acks[0], acks[1]
    assert first.data == second.data and first.time == second.time
    assert qb.evs.planes[first.ev] != qb.evs.planes[second.ev]
    assert net.now - start < 2 * qa.config.tlp_min
