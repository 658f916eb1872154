"""Host delay (docs/CONGESTION.md, "Host delay"): the ACK's ACK Delay field, the responder's
measure of it, the requester's host delay sample and the UET law's time basis.

The transport measures how long each receive waited in its socket (kernel timestamps) and
passes it in with the datagram; the core reads no clock. Unknown (None, the simulator), the
field is 0 and nothing changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from mrc import wire
from mrc.core import EndpointCore, ProtectionDomain, QPConfig, QueuePair
from mrc.core.cc import LawContext, UetNscc, UetNsccParams, WindowLaw
from mrc.core.cc.uet import (
    HOST_DELAY_GAIN,
    HOST_DELAY_MAX,
    HOST_DELAY_NET_QUEUE,
    HOST_DELAY_RAMP,
    MAX_CWND_BDP,
)

MSS = 1000


# ---- the wire field ----------------------------------------------------------------------


def test_ack_delay_codes_round_to_8us_and_saturate_and_are_never_zero() -> None:
    assert wire.ACK_DELAY_UNIT == 8e-6 and wire.ACK_DELAY_MAX == 0xFFFF
    assert wire.ack_delay_code(0.0) == 1  # known, however short: 0 means unknown
    assert wire.ack_delay_code(3e-6) == 1
    assert wire.ack_delay_code(12.1e-6) == 2  # rounded
    assert wire.ack_delay_code(600e-6) == 75
    assert wire.ack_delay_code(0.524) == 65500  # the largest: 0.524 s
    assert wire.ack_delay_code(0.52428) == 0xFFFF
    assert wire.ack_delay_code(10.0) == 0xFFFF  # saturated


def test_the_ack_delay_rides_in_bytes_38_and_39() -> None:
    pkt = wire.pack_ack(5, 10, wire.AETH_ACK, 9, 0, 1, 0x1234, 0xFFFF, ack_delay=0x0102)
    assert len(pkt) == wire.ACK_LEN and pkt[38:40] == b"\x01\x02"
    ack = wire.parse_ack(pkt)
    assert ack.ack_delay == 0x0102
    assert ack.ack_delay_seconds == pytest.approx(0x0102 * 8e-6)
    old = wire.parse_ack(wire.pack_ack(5, 10, wire.AETH_ACK, 9, 0, 1, 0x1234))
    assert old.ack_delay == 0 and old.ack_delay_seconds is None  # an old peer: unknown


# ---- the responder and the requester --------------------------------------------------------


def _pair(
    cc: str = "nscc", ack_every: int = 1
) -> tuple[QueuePair, QueuePair, EndpointCore, ProtectionDomain]:
    cfg = QPConfig(payload_size=100, cc=cc, ack_every=ack_every, reverse_probe_interval=0.0)
    qa = QueuePair(0x10, ProtectionDomain(), [40000 + i for i in range(4)], config=cfg)
    pd_b = ProtectionDomain()
    qb = QueuePair(0x20, pd_b, [50000 + i for i in range(4)], config=cfg)
    qa.connect(qb.qpn, 0)
    qb.connect(qa.qpn, 0)
    core_b = EndpointCore(pd_b)
    core_b.add(qb)
    return qa, qb, core_b, pd_b


def _acks(qp: QueuePair, now: float) -> list[wire.Ack]:
    return [wire.parse_ack(d[1]) for d in qp.datagrams_to_send(now) if d[1][0] == 0x11]


def test_the_responder_reports_the_wait_and_its_own_time_until_the_ack() -> None:
    qa, qb, core_b, pd_b = _pair()
    mr = pd_b.register(bytearray(1000))
    qa.post_write(b"x" * 100, mr.addr, mr.rkey)
    ((ev, hdr, payload),) = qa.datagrams_to_send(0.0)
    # it waited 400 us in the socket before the batch that read it began at 1.0; the ACK
    # leaves 200 us into the batch: 600 us in this host, 75 units
    core_b.receive_datagram(memoryview(bytes(hdr) + bytes(payload)), qa.evs.values[ev], 1.0, 4e-4)
    (ack,) = _acks(qb, 1.0002)
    assert ack.ack_delay == 75


def test_an_unknown_wait_sends_zero_as_before() -> None:
    qa, qb, core_b, pd_b = _pair()
    mr = pd_b.register(bytearray(1000))
    qa.post_write(b"x" * 100, mr.addr, mr.rkey)
    ((ev, hdr, payload),) = qa.datagrams_to_send(0.0)
    core_b.receive_datagram(memoryview(bytes(hdr) + bytes(payload)), qa.evs.values[ev], 1.0)
    (ack,) = _acks(qb, 1.5)
    assert ack.ack_delay == 0


class _Recorder(WindowLaw):
    """A fixed window that keeps the host delay samples it is given."""

    def __init__(self, params: object, ctx: object) -> None:
        self.limit = 16
        self.samples: list[tuple[float, float]] = []

    def on_host_delay(self, now: float, delay: float) -> None:
        self.samples.append((now, delay))


def test_the_requester_adds_its_own_wait_to_the_peers_ack_delay() -> None:
    qa, qb, core_b, pd_b = _pair()
    law = qa.requester.cc = _Recorder(None, None)
    mr = pd_b.register(bytearray(1000))
    qa.post_write(b"x" * 300, mr.addr, mr.rkey)
    sent = qa.datagrams_to_send(0.0)
    assert len(sent) == 3
    for i, (ev, hdr, payload) in enumerate(sent):
        core_b.receive_datagram(
            memoryview(bytes(hdr) + bytes(payload)), qa.evs.values[ev], 0.001 * (i + 1), 1e-4
        )
        (ack_dg,) = [d for d in qb.datagrams_to_send(0.001 * (i + 1) + 1e-4) if d[1][0] == 0x11]
        core_a = EndpointCore()
        core_a.add(qa)
        # the first ACK with no wait known here: no sample; then one of 50 us
        wait = None if i == 0 else 5e-5
        core_a.receive_datagram(memoryview(ack_dg[1]), qb.evs.values[ack_dg[0]], 0.01 + i, wait)
    assert [t for t, _ in law.samples] == [1.01, 2.01]
    assert [d for _, d in law.samples] == pytest.approx([25 * 8e-6 + 5e-5] * 2)


def test_a_peer_that_sends_no_ack_delay_gives_no_sample() -> None:
    qa, qb, core_b, pd_b = _pair()
    law = qa.requester.cc = _Recorder(None, None)
    mr = pd_b.register(bytearray(1000))
    qa.post_write(b"x" * 100, mr.addr, mr.rkey)
    ((ev, hdr, payload),) = qa.datagrams_to_send(0.0)
    core_b.receive_datagram(memoryview(bytes(hdr) + bytes(payload)), qa.evs.values[ev], 0.001)
    (ack_dg,) = [d for d in qb.datagrams_to_send(0.002) if d[1][0] == 0x11]
    core_a = EndpointCore()
    core_a.add(qa)
    core_a.receive_datagram(memoryview(ack_dg[1]), qb.evs.values[ack_dg[0]], 0.01, 5e-5)
    assert law.samples == [] and qa.requester.in_flight == 0


# ---- the UET law's time basis ------------------------------------------------------------------


def _law(rate: float | None, **params: Any) -> UetNscc:
    p = dataclasses.replace(UetNsccParams(shared_base=False, host_delay=True), **params)
    return UetNscc(
        p, LawContext.of(QPConfig(payload_size=MSS, max_outstanding=4096, line_rate_bps=rate))
    )


def _deliver(law: UetNscc, windows: int, now: float) -> None:
    """``windows`` ACKs at ``now``, each of a whole window (as it is when the ACK comes)."""
    for _ in range(windows):
        law.on_ack(now, round(law.cwnd), None, False)


def test_the_bound_counts_the_smoothed_host_delay_and_the_target_does_not() -> None:
    law = _law(80e6)  # 10 MB/s
    law.on_ack(0.01, MSS, 0.001, False)  # a base RTT of 1 ms
    assert law.basis == pytest.approx(0.001) and law.line_cap == pytest.approx(15 * MSS)
    law.on_host_delay(0.02, 0.0016)
    assert law.host_delay == pytest.approx(0.0016 * HOST_DELAY_GAIN)  # the average's gain
    for _ in range(200):
        law.on_host_delay(0.02, 0.001)
    assert law.host_delay == pytest.approx(0.001)
    _deliver(law, HOST_DELAY_RAMP, 0.03)  # calm long enough: all of it
    assert law.basis == pytest.approx(0.002, rel=1e-3)
    assert law.line_cap == pytest.approx(MAX_CWND_BDP * 10e6 * 0.002, rel=1e-3)  # 30 packets
    assert law.target == pytest.approx(0.75e-3)  # the network's, as before
    for i in range(200):
        law.on_host_delay(0.03 + i * 1e-3, 0.0005)
    assert law.host_delay == pytest.approx(0.0005, rel=1e-3)  # follows the samples
    law.on_ack(20.0, MSS, None, False)
    # the measured BDP's round trip too: the best rate over base RTT + host delay + target
    law.best_rate = 2e6
    assert law.bdp == pytest.approx(2e6 * (0.001 + law.host_delay + 0.75e-3))


def test_the_bound_earns_the_host_delay_back_after_each_loss() -> None:
    """None of it at the first ACK, a share per window delivered without a loss, all after
    HOST_DELAY_RAMP of them; a loss, a trim or a timeout takes it all away, and it grows back
    the same way."""
    law = _law(80e6)
    law.on_ack(1.0, 0, 0.001, False)  # a base RTT, nothing delivered yet
    for _ in range(100):
        law.on_host_delay(1.0, 0.001)
    assert law.host_delay == pytest.approx(0.001, rel=1e-3)
    assert law.basis == pytest.approx(0.001)
    _deliver(law, HOST_DELAY_RAMP // 4, 1.0)
    assert law.basis == pytest.approx(0.001 + law.host_delay / 4, rel=1e-3)
    _deliver(law, HOST_DELAY_RAMP, 1.0)
    assert law.basis == pytest.approx(0.001 + law.host_delay)  # all of it, and no more
    t = 1.0
    unsettles: tuple[Callable[[float], None], ...] = (
        lambda t: law.on_loss(t),
        lambda t: law.on_trim(t, 0.001),
        lambda t: law.on_timeout(t),
    )
    for unsettle in unsettles:
        t += 1.0
        _deliver(law, HOST_DELAY_RAMP, t)
        assert law.basis == pytest.approx(0.001 + law.host_delay)
        unsettle(t)
        assert law.basis == pytest.approx(0.001)
        _deliver(law, HOST_DELAY_RAMP // 2, t)
        assert law.basis == pytest.approx(0.001 + law.host_delay / 2, rel=1e-3)


def test_time_without_deliveries_earns_no_host_delay() -> None:
    """A QP idle between an all-to-all's steps starts the next with the bound its last
    losses left it: calm is counted in windows delivered, not in seconds."""
    law = _law(80e6)
    law.on_ack(1.0, MSS, 0.001, False)
    for _ in range(100):
        law.on_host_delay(1.0, 0.001)
    law.on_loss(1.0)
    law.on_ack(60.0, MSS, None, False)  # a minute later, one packet
    assert law.basis < 0.001 + law.host_delay / HOST_DELAY_RAMP


def test_host_delay_off_or_never_measured_is_the_law_as_before() -> None:
    assert UetNsccParams().host_delay  # on by default
    off, never = _law(80e6, host_delay=False), _law(80e6)
    for law in (off, never):
        law.on_ack(0.01, MSS, 0.001, False)
    off.on_host_delay(0.02, 0.0016)
    assert off.host_delay == pytest.approx(0.0002)  # kept, to be read, and not used
    assert never.host_delay == 0.0
    for law in (off, never):
        assert law.basis == law.base_rtt
        assert law.line_cap == pytest.approx(15 * MSS)


def test_the_base_law_ignores_host_delay() -> None:
    law = WindowLaw(None, LawContext.of(QPConfig(max_outstanding=8)))
    law.on_host_delay(0.0, 0.001)
    assert law.limit == 8


def test_an_ack_the_delay_timer_sent_carries_no_ack_delay() -> None:
    """Only an ACK that fell due measures the host: one the delayed-ACK timer sent waited by
    the responder's choice (after a loss of the AckReq, mostly)."""
    qa, qb, core_b, pd_b = _pair("fixed", ack_every=16)
    mr = pd_b.register(bytearray(1000))
    qa.post_write(b"x" * 300, mr.addr, mr.rkey)
    sent = qa.datagrams_to_send(0.0)
    ev, hdr, payload = sent[0]
    assert not wire.BTH.unpack_from(hdr)[4] >> 24 & wire.BTH_ACKREQ  # no AckReq on it
    core_b.receive_datagram(memoryview(bytes(hdr) + bytes(payload)), qa.evs.values[ev], 1.0, 1e-4)
    assert _acks(qb, 1.0001) == []  # nothing due yet
    (ack,) = _acks(qb, 1.0 + qb.config.ack_delay)
    assert ack.ack_delay == 0


def _earned() -> UetNscc:
    """A law with a base RTT of 1 ms and 1 ms of host delay, all of it earned."""
    law = _law(80e6)
    law.on_ack(1.0, 0, 0.001, False)
    for _ in range(100):
        law.on_host_delay(1.0, 0.001)
    _deliver(law, HOST_DELAY_RAMP, 1.0)
    assert law.basis == pytest.approx(0.001 + law.host_delay)
    return law


def test_a_queue_in_the_network_earns_no_host_delay() -> None:
    """Where the RTT's network part (less the host delay and the base RTT) stays over
    HOST_DELAY_NET_QUEUE, the queue is a port's, which the hosts' delay does not fill: the
    bound keeps to the network's. Once the network part falls, the host delay is earned again.
    """
    law = _earned()
    for _ in range(40):  # 1 ms in the hosts, 3 ms queued in the network
        law.on_host_delay(1.0, 0.001)
        law.on_ack(1.0, round(law.cwnd), 0.005, False)
    assert law.net_delay > HOST_DELAY_NET_QUEUE
    assert law.basis == pytest.approx(0.001)
    for _ in range(40):  # the network queue drains; the hosts' delay stays
        law.on_host_delay(1.0, 0.001)
        law.on_ack(1.0, round(law.cwnd), 0.002, False)
    assert law.net_delay < HOST_DELAY_NET_QUEUE
    assert 0.001 < law.basis <= 0.001 + law.host_delay


def test_a_late_host_alone_is_not_a_network_queue() -> None:
    """RTT samples whose excess the host delay explains keep earning it."""
    law = _law(80e6)
    law.on_ack(1.0, 0, 0.001, False)
    for _ in range(2 * HOST_DELAY_RAMP):
        law.on_host_delay(1.0, 0.0015)  # 1.5 ms in the hosts
        law.on_ack(1.0, round(law.cwnd), 0.0025, False)
    assert law.net_delay == pytest.approx(0.0)
    assert law.basis == pytest.approx(0.001 + law.host_delay)


def test_quick_adapt_weighs_the_network_delay_not_the_hosts() -> None:
    """A delay over 4 x the target that the hosts' own delay explains is no queue: with
    cc.host_delay no quick adapt cuts the window for it. Off, the law is UET's: it does."""
    for host_delay in (True, False):
        law = _law(None, host_delay=host_delay)
        law.on_ack(1.0, 0, 0.0001, False)  # a base RTT of 100 us: target 75, threshold 300
        assert law._qa_threshold == pytest.approx(4 * 0.75 * 0.0001)
        t = 1.0
        for _ in range(20):  # 500 us round trips, 400 of them in the hosts; little delivered
            t += 0.001
            law.on_host_delay(t, 0.0004)
            law.on_ack(t, MSS, 0.0005, False)
        assert (law.quick_adapts > 0) == (not host_delay), law.quick_adapts


def test_the_requester_adds_the_send_lag_the_transport_measured() -> None:
    """A pump stamps its bursts with one ``now`` and sends them one after another: the
    transport says how late they left (QueuePair.sent_after), and the requester adds that,
    smoothed, to the host delay samples it gives the law."""
    qa, qb, core_b, pd_b = _pair()
    law = qa.requester.cc = _Recorder(None, None)
    assert qa.requester.tx_lag == 0.0
    for _ in range(100):
        qa.sent_after(4e-4)
    assert qa.requester.tx_lag == pytest.approx(4e-4, rel=1e-4)
    mr = pd_b.register(bytearray(1000))
    qa.post_write(b"x" * 100, mr.addr, mr.rkey)
    ((ev, hdr, payload),) = qa.datagrams_to_send(0.0)
    core_b.receive_datagram(memoryview(bytes(hdr) + bytes(payload)), qa.evs.values[ev], 0.001, 1e-4)
    (ack_dg,) = [d for d in qb.datagrams_to_send(0.0011) if d[1][0] == 0x11]
    core_a = EndpointCore()
    core_a.add(qa)
    core_a.receive_datagram(memoryview(ack_dg[1]), qb.evs.values[ack_dg[0]], 0.01, 5e-5)
    # the peer's 200 us (25 units), this host's 50 us wait and its 400 us send lag
    assert [d for _, d in law.samples] == pytest.approx([25 * 8e-6 + 5e-5 + 4e-4], rel=1e-3)


def test_a_network_part_within_the_hosts_own_delay_is_no_queue() -> None:
    """What the hosts' delay does not explain is a port's queue only when it is more than
    the hosts' delay itself: below it, it is what the host measures miss (its batches, its
    sends), and a veth's 0.1-0.5 ms of it took the host delay out of the bound ten times a
    transfer. A queue longer than the hosts' delay still takes it out."""
    law = _law(80e6)
    law.on_ack(1.0, 0, 0.001, False)  # a base RTT of 1 ms
    for _ in range(2 * HOST_DELAY_RAMP):  # 2 ms in the hosts, 0.8 ms unexplained
        law.on_host_delay(1.0, 0.002)
        law.on_ack(1.0, round(law.cwnd), 0.0038, False)
    assert HOST_DELAY_NET_QUEUE < law.net_delay < law.host_delay
    assert law.basis == pytest.approx(0.001 + law.host_delay)
    for _ in range(40):  # 2 ms in the hosts, 4 ms queued in the network
        law.on_host_delay(1.0, 0.002)
        law.on_ack(1.0, round(law.cwnd), 0.007, False)
    assert law.net_delay > law.host_delay
    assert law.basis == pytest.approx(0.001)


def test_a_ce_mark_takes_the_host_delay_out_of_the_bound() -> None:
    """A marked queue (a fabric port's, or the receiving host's socket queue, which the
    transport marks over half its room) is one that QPs fill together: each counted its
    host delay, and 256 QPs into one host overran its receive buffer. A CE echo makes the
    bound the network's again, to be earned back as after a loss."""
    law = _earned()
    law.on_host_delay(1.0, 0.001)
    law.on_ack(1.0, MSS, 0.0021, True)  # the hosts explain the delay, but it was marked
    assert law.basis == pytest.approx(0.001)
    _deliver(law, HOST_DELAY_RAMP, 1.1)
    assert law.basis == pytest.approx(0.001 + law.host_delay)


def test_a_host_delay_beyond_its_most_is_a_queue() -> None:
    """Part of a host delay sample is the receiver's socket queue, which every QP into that
    host fills (256 QPs on loopback: 30-50 ms of it). Beyond HOST_DELAY_MAX a sample counts
    as a queue: the bound counts no more than that, the excess is the network part (no host
    delay earned while it lasts), and quick adapt weighs it."""
    law = _law(80e6)
    law.on_ack(1.0, 0, 0.001, False)  # a base RTT of 1 ms
    for _ in range(2 * HOST_DELAY_RAMP):
        law.on_host_delay(1.0, 0.040)  # "40 ms in the hosts"
        law.on_ack(1.0, round(law.cwnd), 0.041, False)
    assert law.host_delay == pytest.approx(HOST_DELAY_MAX, rel=1e-3)
    assert law.net_delay > 0.030  # 38 ms a queue
    assert law.basis == pytest.approx(0.001)
    law.on_host_delay(2.0, 0.040)
    # what quick adapt weighs: the delay less the host delay that counts, 38 ms
    assert law._network_delay(0.040, 0.041, law._host_sample) == pytest.approx(0.038)
