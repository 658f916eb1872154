"""NSCC windows below one packet (``MrcNsccParams.min_window``, ``--qp cc.min_window``): the law's
units, pacing in the requester, RTT samples after a trim, and many flows into one last hop in the
simulator."""

from __future__ import annotations

import pytest

from mrc.core import QPConfig, QueuePair
from mrc.core.cc import MrcNscc
from mrc.lab.sim import Faults
from mrc.lab.sim_links import Fabric, LinkSpec, trim_datagram

from .law_helpers import nscc_window
from .mrcsim_harness import DATA_OPS, RecordingNetwork, Sent, Transfer, make_transfer, run_until

MSS = 1000


def _window(min_packets: float = 0.125) -> MrcNscc:
    """Base RTT 1 ms, target 0.5 ms, a history of ACKs over 50 ms (one packet per ms)."""
    w = nscc_window(
        mss=MSS, cap_packets=64, initial_packets=4, target_delay=0.0005, min_window=min_packets
    )
    for i in range(50):
        w.on_ack(i * 0.001, MSS, 0.001, False)
    assert w.base_rtt == 0.001 and w.target == 0.0005
    return w


def test_quick_adapt_goes_below_a_packet_when_little_was_delivered() -> None:
    w = _window()
    # 60 ms later, nothing delivered: quick adapt cuts to the floor, an eighth of a packet
    w.on_congestion_loss(0.11)
    assert w.cwnd == pytest.approx(0.125 * MSS) and w.limit == 1
    # one packet per mss / cwnd round trips at the target: 8 x (1 + 0.5) ms
    assert w.pace_gap() == pytest.approx(8 * 0.0015)


def test_quick_adapt_below_a_packet_counts_over_the_paced_span() -> None:
    w = _window()
    w.on_congestion_loss(0.11)  # floor: 1/8 packet, a packet per 12 ms
    # one packet delivered in the last 12 ms: the rate over that span, scaled to one round
    # trip (1.5 ms), is 1/8 of a packet; nothing in the last 1.5 ms would have said 0
    w.on_ack(0.115, MSS, None, False)
    t = 0.115 + 0.0015 * 8 * 0.9
    w.on_congestion_loss(t)
    assert w.cwnd == pytest.approx(MSS * 0.0015 / (0.0015 * MSS / w.cwnd), rel=0.01)


def test_the_first_window_trimmed_stays_at_one_packet() -> None:
    # no ACK yet: "nothing delivered" says nothing about the path, only that it just started
    w = nscc_window(
        mss=MSS, cap_packets=64, initial_packets=16, target_delay=0.0005, min_window=0.125
    )
    w.on_congestion_loss(0.002, rtt_hint=0.0005)
    assert w.cwnd == MSS and w.pace_gap() == 0.0


def test_delay_alone_never_takes_the_window_below_a_packet() -> None:
    # where one packet takes longer than the target to cross the bottleneck, any queue reads
    # as over target: only trims and CE may go below one packet
    w = _window()
    w.on_congestion_loss(0.11)
    for i in range(4):  # grow back above one packet: each ACK at most doubles
        w.on_ack(0.2 + i * 0.01, MSS, 0.001, False)
    assert w.cwnd > MSS
    for i in range(4):  # 19 ms of queue: the largest cuts, once per RTT, not below a packet
        w.on_ack(0.3 + i * 0.03, MSS, 0.02, False)
    assert w.decreases >= 2 and w.cwnd == MSS
    w.on_ack(0.5, MSS, 0.001, True)  # CE (delay fine): the small ECN cut goes below
    assert w.cwnd == pytest.approx(MSS * (1 - w.ce_md))


def test_an_ack_at_most_doubles_a_window_below_a_packet() -> None:
    w = _window()
    w.on_congestion_loss(0.11)
    sizes = []
    for i in range(4):
        w.on_ack(0.2 + i * 0.02, MSS, 0.001, False)
        sizes.append(w.cwnd / MSS)
    # the additive term alone would add 8 packets for the first ACK
    assert sizes == pytest.approx([0.25, 0.5, 1.0, sizes[3]]) and 1.0 < sizes[3] <= 2.5


def test_the_pace_uses_a_nack_round_trip_below_a_base_rtt_taken_in_a_queue() -> None:
    # a flow that started into a full queue took that queue for its base RTT (40 ms); the
    # trimmed headers' NACKs come back in 1 ms, and the pace follows them
    w = nscc_window(
        mss=MSS, cap_packets=64, initial_packets=16, target_delay=0.0005, min_window=0.125
    )
    w.on_ack(0.0, MSS, 0.04, False)
    for i in range(20):
        w.on_ack(0.04 + i * 0.01, MSS, 0.045, False)
    w.on_congestion_loss(0.5, rtt_hint=0.001)
    assert w.nack_rtt == 0.001 and w.base_rtt == 0.04
    assert w.cwnd < MSS
    assert w.pace_gap() == pytest.approx((0.001 + w.target) * MSS / w.cwnd)


def test_a_whole_packet_floor_never_paces() -> None:
    w = _window(min_packets=1.0)
    w.on_congestion_loss(0.11)
    assert w.cwnd == MSS and w.pace_gap() == 0.0


def test_config_rejects_a_floor_out_of_range() -> None:
    for bad in (0.0, -1.0, 1.5):
        with pytest.raises(ValueError, match="cc.min_window"):
            QPConfig(cc="nscc-mrc", cc_params={"min_window": bad}).validate()
    QPConfig(cc="nscc-mrc", cc_params={"min_window": 1.0}).validate()


# ---- the requester paces, and samples RTTs after trims ---------------------------------------

RATE = 6.25e6  # bytes/s: 50 Mbit/s
PAYLOAD = 8192
WIRE = PAYLOAD + 60


def _nscc(qp: QueuePair) -> MrcNscc:
    """``qp``'s window law (cc="nscc-mrc": MrcNscc)."""
    cc = qp.requester.cc
    assert isinstance(cc, MrcNscc)
    return cc


def _incast(
    n: int, min_window: float, queue_packets: int = 4
) -> tuple[RecordingNetwork, Fabric, list[Transfer]]:
    """``n`` hosts write 256 KiB each into one host over one plane whose last hop (50 Mbit/s)
    trims above ``queue_packets``: n windows of one packet are more than that queue."""
    net = RecordingNetwork(3, Faults(delay=0.0, jitter=50e-6))
    last = LinkSpec(rate=RATE, queue=queue_packets * WIRE, delay=20e-6, trim=True)
    nic = LinkSpec(rate=RATE, queue=60 * WIRE, delay=100e-6)
    fab = Fabric(nic=nic, lasthop=last)
    net.set_fabric(fab)
    net.add_host("r")
    transfers = []
    size = 256 << 10
    for i in range(n):
        host = f"s{i}"
        net.add_host(host)
        cfg = QPConfig(
            payload_size=PAYLOAD,
            max_outstanding=64,
            cc="nscc-mrc",
            cc_params={"min_window": min_window},
        )
        qa, qb = net.connect(host, "r", evs=8, config=cfg, qpn_a=i + 1, qpn_b=i + 1, planes=1)
        t = make_transfer(net, host, "r", qa, qb, [size + 4096], 40 + i)
        t.post(0, 0, bytes((j * 7 + i) % 251 for j in range(size)), imm=i)
        transfers.append(t)
    assert run_until(net, transfers, max_time=30)
    for t in transfers:
        t.check_final()  # every byte in place, once
    return net, fab, transfers


def test_many_flows_into_one_last_hop_pace_below_a_packet_and_trim_far_less() -> None:
    n = 15
    ideal = n * (256 << 10) / (RATE * PAYLOAD / WIRE)
    results = {}
    for floor in (1.0, 0.125):
        net, fab, transfers = _incast(n, floor)
        data = sum(t.qp.stats.data_packets_sent for t in transfers)
        assert sum(t.qp.stats.retransmits_timeout for t in transfers) == 0
        assert net.violations == []
        paced_lows = [_nscc(t.qp).nack_rtt for t in transfers]
        results[floor] = (net.now / ideal, fab.total("trimmed") / data, paced_lows)
    whole, frac = results[1.0], results[0.125]
    # fifteen one-packet windows overflow a four-packet queue again and again: every packet
    # is trimmed about three times. Below a packet they share it
    assert whole[1] > 2.5
    assert frac[1] < 0.5 * whole[1]
    assert frac[0] <= 1.15, frac  # and the last hop stays busy
    assert all(x < 0.05 for x in frac[2])  # trims' NACKs measured the path


def test_a_paced_requester_holds_data_until_its_pace_and_asks_the_timer_for_it() -> None:
    # a round trip of 4 ms against a base RTT of 1 ms; the window is set to 1/8 packet. Each
    # ACK doubles it, and each packet is paced by the window it leaves under: the second
    # leaves at the first ACK (4 ms, window 1/4: next one 4 x 1.5 ms later), its ACK comes
    # back at 8 ms, and the third waits for 10 ms
    net = RecordingNetwork(1, Faults(delay=0.002, jitter=0.0))
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(
        payload_size=1000,
        max_outstanding=64,
        cc="nscc-mrc",
        cc_params={"initial_window": 1, "min_window": 0.125},
    )
    qa, qb = net.connect("a", "b", evs=8, config=cfg)
    t = make_transfer(net, "a", "b", qa, qb, [40_000], 9)
    t.post(0, 0, bytes(range(200)) * 100)
    key = ("a", qa.qpn)
    assert net.run(lambda: len(net.data_tx[key]) >= 1)
    req = qa.requester
    cc = _nscc(qa)
    cc.base_rtt = 0.001
    cc._set(net.now, 125.0)
    assert cc.pace_gap() == pytest.approx(0.012)
    assert net.run(lambda: len(net.data_tx[key]) >= 2)  # at the first ACK: not paced yet
    second = net.data_tx[key][1].time
    assert second == pytest.approx(0.004) and cc.cwnd == 250.0
    assert net.run(lambda: net.now >= second + 0.0039)  # its ACK is in
    assert cc.cwnd == 500.0
    assert len(net.data_tx[key]) == 2  # the pace holds the third packet
    assert req.get_timer() == pytest.approx(second + 0.006)  # and the timer wakes the QP then
    assert run_until(net, [t])
    t.check_final()
    sends = [d.time for d in net.data_tx[key]]
    assert sends[2] == pytest.approx(second + 0.006)
    assert len(sends) == 20  # nothing was sent twice


def test_a_retransmission_after_a_trim_gives_an_rtt_sample() -> None:
    # the trimmed copy's payload is gone; only the retransmission can be acknowledged, so its
    # ACK is a fair sample (Karn's rule is about copies that may both arrive). Here the only
    # packet of the transfer is trimmed the first time: its retransmission's ACK is the only
    # round trip there is to measure
    net = RecordingNetwork(5, Faults(delay=0.0002, jitter=0.0))
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=8, config=QPConfig(payload_size=1000))
    t = make_transfer(net, "a", "b", qa, qb, [2000], 11)
    trimmed: list[Sent] = []

    def trim_first(sent: Sent) -> bytes | None:
        if sent.data[0] in DATA_OPS and not trimmed:
            trimmed.append(sent)
            return trim_datagram(sent.data, lasthop=True)
        return sent.data

    net.tamper = trim_first
    t.post(0, 0, bytes(range(250)) * 2)
    assert run_until(net, [t])
    t.check_final()
    assert len(trimmed) == 1 and qa.stats.retransmits_nack == 1
    assert qa.stats.retransmits == 1  # nothing else was resent
    assert qa.requester.rtt.srtt == pytest.approx(0.0004)  # two one-way delays


def test_a_probe_leaves_its_packet_ambiguous() -> None:
    # a tail loss probe repeats a packet whose first copy may still arrive: no sample
    net = RecordingNetwork(5, Faults(delay=0.0002, jitter=0.0))
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=8, config=QPConfig(payload_size=1000, tlp_min=0.001))
    t = make_transfer(net, "a", "b", qa, qb, [2000], 12)
    dropped: list[Sent] = []

    def drop_first(sent: Sent) -> bytes | None:
        if sent.data[0] in DATA_OPS and not dropped:
            dropped.append(sent)
            return None
        return sent.data

    net.tamper = drop_first
    t.post(0, 0, bytes(range(250)) * 2)
    assert run_until(net, [t])
    t.check_final()
    assert qa.stats.retransmits_tlp == 1
    assert qa.requester.rtt.srtt is None  # the probe's ACK might have answered the original


def test_new_work_after_an_idle_spell_starts_at_a_packet_at_least() -> None:
    # a window cut below a packet described a queue that has drained since; and what was
    # delivered while there was nothing to send says nothing about the path
    w = _window()
    w.on_congestion_loss(0.11)
    assert w.cwnd < MSS
    w.on_resume(0.5)
    assert w.cwnd == MSS and w.pace_gap() == 0.0
    w.on_congestion_loss(0.501)  # a trim right away: not below a packet on idle history
    assert w.cwnd == MSS
