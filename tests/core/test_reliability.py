"""Retry budget (giving up cleanly) and NACK-driven recovery from trimmed packets."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest

from mrc import wire
from mrc.core import (
    ImmediateReceived,
    ProbeReplied,
    QPConfig,
    QPFailed,
    QueuePair,
    WriteCompleted,
)
from mrc.core.cc import UetNscc
from mrc.core.memory import ProtectionDomain
from mrc.lab.sim import Faults, SimHost, SimNetwork

from .mrcsim_harness import (
    DATA_OPS,
    RecordingNetwork,
    Sent,
    failures,
    make_transfer,
    run_until,
)

# ---- retry budget --------------------------------------------------------------------------


def _budget_config(retries: int) -> QPConfig:
    return QPConfig(
        payload_size=1000,
        max_outstanding=32,
        initial_rto=0.05,
        min_rto=0.01,
        max_rto=0.4,
        max_timeout_retries=retries,
        cc="fixed",  # the whole write goes out at once: the budget is what is counted
    )


def _give_up_time(cfg: QPConfig) -> float:
    """When a packet sent at t=0 exhausts its budget with exponential backoff capped at max_rto:
    the first tail loss probe, sent at initial_rto / 2 (no RTT sample yet), restarts the RTO,
    as TCP's does, so the first timeout comes initial_rto after it."""
    t = cfg.initial_rto / 2 + cfg.initial_rto
    for k in range(1, cfg.max_timeout_retries + 1):
        t += min(cfg.initial_rto * (1 << k), cfg.max_rto)
    return t


@pytest.mark.parametrize("how", ["dead_evs", "loss"])
@pytest.mark.parametrize("retries", [0, 1, 3, 6])
def test_retry_budget_fails_the_qp_cleanly(how: str, retries: int) -> None:
    cfg = _budget_config(retries)
    net = RecordingNetwork(retries, Faults(loss=1.0 if how == "loss" else 0.0))
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=8, config=cfg, psn_a=wire.PSN_MASK - 3)
    if how == "dead_evs":
        net.faults.dead_evs = set(qa.evs.values)
    t = make_transfer(net, "a", "b", qa, qb, [50_000], retries)
    t.post(0, 0, bytes(range(256)) * 100, imm=1)

    finished = net.run(max_time=1000.0)  # returns once nothing at all is left to do
    assert finished
    fails = failures(net)
    assert len(fails) == 1
    fail = fails[0]
    assert isinstance(fail, QPFailed) and fail.qpn == qa.qpn
    assert "retry budget exhausted" in fail.reason
    assert f"after {retries} timeouts" in fail.reason
    assert qa.failed and not qb.failed
    # bounded virtual time, and not before the budget could have been spent
    fail_time = next(tm for tm, h, e in net.event_times if e is fail)
    expected = _give_up_time(cfg)
    assert retries * cfg.min_rto <= fail_time <= expected + 1e-6, (fail_time, expected)
    assert fail_time == pytest.approx(expected, abs=1e-6)
    # every packet went out at most 1 + retries times, and nothing left after the failure
    txs = net.data_tx[("a", qa.qpn)]
    per_seq: dict[int, int] = {}
    for tx in txs:
        per_seq[tx.seq] = per_seq.get(tx.seq, 0) + 1
    assert len(per_seq) == 26  # the whole 25,600-byte write went out (window not full)
    # ... plus at most tlp_max tail loss probes: resends of the newest packet, not timeouts
    tail = max(per_seq)
    assert max(n for seq, n in per_seq.items() if seq != tail) <= 1 + retries
    assert per_seq[tail] <= 1 + cfg.tlp_max + retries
    assert 1 <= qa.stats.retransmits_tlp <= cfg.tlp_max
    assert per_seq[0] == 1 + retries
    assert all(s.time <= fail_time for s in net.sent_by("a", qa.qpn))
    assert qa.stats.retransmits_timeout + qa.stats.retransmits_tlp == qa.stats.retransmits
    assert qb.stats.packets_received == 0 and t.buffers[0] == t.sentinels[0]
    assert not [e for e in net.hosts["a"].events if isinstance(e, WriteCompleted)]

    # a failed QP stays silent: no timer, no datagrams, even for new work
    assert qa.get_timer() is None
    qa.post_write(b"more", t.regions[0].addr, t.regions[0].rkey)
    assert qa.datagrams_to_send(net.now + 10) == []
    n_sent = len(net.sent)
    net.faults.dead_evs = set()
    net.faults.loss = 0.0
    net.run(max_time=net.now + 100)
    assert len(net.sent) == n_sent
    assert len(failures(net)) == 1  # reported once


def test_default_budget_gives_up_in_bounded_time() -> None:
    net = RecordingNetwork(3, Faults(loss=1.0))
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=4)
    t = make_transfer(net, "a", "b", qa, qb, [10_000], 3)
    t.post(0, 0, b"x" * 5000)
    assert net.run(max_time=10_000.0)
    (fail,) = failures(net)
    cfg = qa.config
    bound = cfg.initial_rto + cfg.max_timeout_retries * cfg.max_rto
    assert net.now <= bound + 1e-6
    assert "retry budget exhausted" in fail.reason


def test_a_failure_says_whether_the_peer_ever_answered() -> None:
    """Seen on an earlier main: 64 QPs into one busy receiver failed with "peer unreachable
    or gone" while the peer was alive and had acknowledged most of the data. The message now
    says what the QP heard: no ACK ever, or when the last one came and how much it had."""
    net = RecordingNetwork(5, Faults(loss=1.0))
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=4, config=_budget_config(2))
    t = make_transfer(net, "a", "b", qa, qb, [10_000], 5)
    t.post(0, 0, b"x" * 5000)
    assert net.run(max_time=100.0)
    (fail,) = failures(net)
    assert "no ACK ever came back" in fail.reason and "gone" in fail.reason

    net = RecordingNetwork(6, Faults())
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=4, config=_budget_config(2))
    t = make_transfer(net, "a", "b", qa, qb, [200_000], 6)
    t.post(0, 0, b"y" * 100_000)
    assert net.run(until=lambda: qa.requester.acked_packets >= 20, max_time=100.0)
    net.faults.loss = 1.0  # the peer stops answering after 20 packets or more
    t.post(0, 100_000, b"z" * 50_000)
    assert net.run(max_time=net.now + 100.0)
    (fail,) = failures(net)
    assert "no ACK ever" not in fail.reason
    got = re.search(r"the last ACK came ([0-9.]+) s ago \((\d+) packets acknowledged", fail.reason)
    assert got is not None, fail.reason
    assert float(got[1]) > 0 and int(got[2]) == qa.requester.acked_packets >= 20


@pytest.mark.parametrize("seed", range(3))
def test_the_rto_learns_a_round_trip_that_grew_past_it(seed: int) -> None:
    """Seen on an earlier main: 256 QPs into one busy receiver, whose socket queue held tens
    of milliseconds, timed out nearly every packet and resent it, again and again (one run in
    three: 166,000 timeouts for 192,000 packets, 200 s instead of 22). The ACKs that came
    answered the first copies, and Karn's rule took no RTT sample from them, so the RTO stayed
    at what an idle receiver had taught it. An ACK names its copy by the EV it echoes: the
    first copy's round trip is a sample, and the RTO follows the longer round trip."""
    net = RecordingNetwork(seed, Faults())
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=1000, max_outstanding=32, cc="fixed")
    qa, qb = net.connect("a", "b", evs=8, config=cfg)
    t = make_transfer(net, "a", "b", qa, qb, [2_000_000], seed)
    rng = random.Random(seed)
    t.post(0, 0, rng.randbytes(1_000_000))
    assert net.run(until=lambda: qa.requester.acked_packets >= 200, max_time=100)
    assert qa.requester.rtt.rto == cfg.min_rto  # an idle path: the floor
    before = qa.stats.retransmits_timeout
    net.faults.delay = 0.15  # a round trip of 0.3 s: six times the RTO
    t.post(0, 1_000_000, rng.randbytes(300_000))
    assert run_until(net, [t], max_time=1000)
    t.check_final()
    # before: 749-2,067 timeouts for these 300 packets, the RTO at 0.05-0.17 s at the end
    assert qa.stats.retransmits_timeout - before < 100
    assert qa.stats.rtt_earlier_copy > 0
    assert qa.requester.rtt.rto >= 0.3


def test_budget_counts_per_packet_not_per_connection() -> None:
    """Progress resets nothing to fail on: 20% loss over many packets must not exhaust a
    budget of 12 timeouts even though hundreds of timeouts happen in total."""
    net = RecordingNetwork(11, Faults(loss=0.2))
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=500, max_outstanding=32, initial_rto=0.01, min_rto=0.005)
    qa, qb = net.connect("a", "b", evs=8, config=cfg)
    t = make_transfer(net, "a", "b", qa, qb, [400_000], 11)
    t.post(0, 0, random.Random(0).randbytes(400_000), imm=5)
    assert run_until(net, [t], max_time=500)
    t.check_final()
    # SACK-based detection repairs most losses before their timeout; together they are many
    lost = qa.stats.retransmits_timeout + qa.stats.retransmits_sack
    assert lost > cfg.max_timeout_retries * 5 and qa.stats.retransmits_timeout > 0
    assert not failures(net)


# ---- NACK on trim ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_trims_are_recovered_by_nacks_not_timeouts(seed: int) -> None:
    net = RecordingNetwork(seed, Faults(trim=0.2, reorder=0.2))
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=1000, max_outstanding=64)
    qa, qb = net.connect("a", "b", evs=16, config=cfg, psn_a=wire.PSN_MASK - seed)
    t = make_transfer(net, "a", "b", qa, qb, [150_000], seed)
    rng = random.Random(seed)
    t.post(0, 0, rng.randbytes(70_000), imm=1)
    t.post(0, 70_000, b"", imm=2)  # a zero-length WRITE_IMM can be trimmed too
    t.post(0, 80_000, rng.randbytes(70_000), imm=3)
    assert run_until(net, [t])
    t.check_final()
    sa, sb = qa.stats, qb.stats
    assert net.trimmed > 0
    assert sb.trims_seen == net.trimmed  # every trimmed header arrived and was recognised
    # each was NACKed, unless its packet had already been repaired on SACK evidence when the
    # trimmed copy arrived (reordered by more than the window): then nothing is missing
    assert sb.trims_seen - 2 <= sb.nacks_sent <= sb.trims_seen
    assert sa.nacks == sb.nacks_sent
    # a NACK that comes back after its packet was resent on SACK evidence (or acknowledged)
    # is stale: refused and counted, not acted on twice
    assert sa.nacks_ignored == sum(
        n for k, n in sa.dropped_by_reason.items() if k.startswith("nack_")
    )
    assert set(sa.dropped_by_reason) <= {"nack_wrong_ev", "nack_not_in_flight"}
    # a NACK delayed past the reordering window may find its packet already repaired on SACK
    # evidence; either way nothing waits for a timeout
    assert sa.retransmits == sa.retransmits_nack + sa.retransmits_sack
    assert sa.retransmits_nack >= 0.8 * sb.nacks_sent
    assert sa.retransmits_timeout == 0
    # the NACKs on the wire: code TRIMMED, about exactly the PSNs that were trimmed, echoing
    # the EV each trimmed copy travelled on
    nacks = [wire.parse_ack(s.data) for s in net.sent_by("b", qb.qpn) if s.data[0] == 0x11]
    nacks = [a for a in nacks if a.is_nack]
    assert len(nacks) == sb.nacks_sent
    assert {a.nack_code for a in nacks} == {wire.NackCode.TRIMMED}
    assert all(a.qpn == qa.qpn for a in nacks)
    ev_values = set(qa.evs.values)
    assert all(a.ev in ev_values for a in nacks)
    # virtual time stays near the no-fault time: no RTO was ever waited for
    assert net.now < cfg.min_rto


class _LastHopTrimmer:
    """Trims every ``every``-th data packet as the switch port into the receiver would."""

    def __init__(self, every: int, lasthop: bool) -> None:
        self.every = every
        self.lasthop = lasthop
        self.n = 0
        self.trimmed: list[tuple[int, int]] = []  # (psn, sport)

    def __call__(self, s: Sent) -> bytes | None:
        if s.data[0] not in DATA_OPS:
            return s.data
        self.n += 1
        if self.n % self.every:
            return s.data
        hl = wire.DATA_IMM_HDR_LEN if s.data[0] == wire.Opcode.RDMA_WRITE_ONLY_IMM else 28
        cut = bytearray(s.data[:hl])
        cut[4] |= wire.BTH_TRIMMED | (wire.BTH_LASTHOP if self.lasthop else 0)
        self.trimmed.append((int.from_bytes(s.data[9:12], "big"), s.sport))
        return bytes(cut)


@pytest.mark.parametrize("lasthop", [True, False])
def test_lasthop_trim_gets_trimmed_lasthop_nack(lasthop: bool) -> None:
    net = RecordingNetwork(5)
    trimmer = _LastHopTrimmer(every=7, lasthop=lasthop)
    net.tamper = trimmer
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=8, config=QPConfig(payload_size=700), psn_a=0xFFFFF8)
    t = make_transfer(net, "a", "b", qa, qb, [60_000], 5)
    t.post(0, 100, random.Random(5).randbytes(59_900), imm=0xABCD)
    assert run_until(net, [t])
    t.check_final()
    nacks = [wire.parse_ack(s.data) for s in net.sent_by("b", qb.qpn) if s.data[0] == 0x11]
    nacks = [a for a in nacks if a.is_nack]
    want = wire.NackCode.TRIMMED_LASTHOP if lasthop else wire.NackCode.TRIMMED
    assert trimmer.trimmed and len(nacks) == len(trimmer.trimmed)
    assert [a.nack_code for a in nacks] == [want] * len(nacks)
    # each NACK names the trimmed PSN and echoes the EV it arrived on
    assert sorted((a.subject_psn, a.ev) for a in nacks) == sorted(trimmer.trimmed)
    assert qa.stats.retransmits == qa.stats.retransmits_nack == len(nacks)
    assert qa.stats.retransmits_timeout == 0 and not qa.failed


def _qp_pair(cfg: QPConfig | None = None) -> tuple[QueuePair, QueuePair, ProtectionDomain]:
    pd_b = ProtectionDomain()
    qa = QueuePair(
        0xFFFFFF,
        ProtectionDomain(),
        [40000 + i for i in range(4)],
        config=cfg,
        initial_psn=wire.PSN_MASK,
    )
    qb = QueuePair(0x000001, pd_b, [50000 + i for i in range(4)], config=cfg, initial_psn=77)
    qa.connect(qb.qpn, 77)
    qb.connect(qa.qpn, wire.PSN_MASK)
    return qa, qb, pd_b


@pytest.mark.parametrize(
    ("marks", "code"),
    [
        (wire.BTH_TRIMMED | wire.BTH_LASTHOP, wire.NackCode.TRIMMED_LASTHOP),
        (wire.BTH_TRIMMED, wire.NackCode.TRIMMED),
        (0, wire.NackCode.TRIMMED),  # cut without a mark: UDP payload shorter than the RETH says
    ],
)
def test_trim_nack_decoded_from_receiver_output(marks: int, code: int) -> None:
    """Drive two QPs by hand (no simulator) with the largest QPN and a PSN at the wrap."""
    qa, qb, pd_b = _qp_pair(QPConfig(payload_size=100, cc="fixed"))
    buf = bytearray(1000)
    mr = pd_b.register(buf)
    qa.post_write(bytes(range(250)), mr.addr + 10, mr.rkey, imm=9)
    out = qa.datagrams_to_send(0.0)
    assert len(out) == 3
    ev, hdr, payload = out[1]
    cut = bytearray(hdr)
    cut[4] |= marks
    qb.receive_datagram(memoryview(bytes(cut)), qa.evs.values[ev], 0.0)
    assert qb.stats.trims_seen == 1 and qb.stats.bytes_placed == 0
    (nack_dg,) = qb.datagrams_to_send(0.0)
    a = wire.parse_ack(nack_dg[1])
    assert a.is_nack and a.nack_code == code
    assert a.qpn == qa.qpn
    assert a.subject_psn == 0  # the second packet: PSN 0xFFFFFF + 1 wraps to 0
    assert a.ev == qa.evs.values[ev]
    assert buf == bytearray(1000)
    # the sender resends exactly that packet, on another EV, at once
    qa.receive_datagram(memoryview(nack_dg[1]), qb.evs.values[nack_dg[0]], 0.0)
    (retx,) = qa.datagrams_to_send(0.0)
    assert retx[1] == hdr and bytes(retx[2]) == bytes(payload) and retx[0] != ev
    assert qa.stats.retransmits_nack == 1
    # deliver everything intact now: the data lands and the imm completes once
    for _ev, h, p in [out[0], retx, out[2]]:
        qb.receive_datagram(memoryview(bytes(h) + bytes(p)), qa.evs.values[_ev], 0.0)
    assert buf[10:260] == bytes(range(250)) and buf[:10] == bytes(10) and buf[260:] == bytes(740)
    events = []
    while (e := qb.next_event()) is not None:
        events.append(e)
    assert [type(e).__name__ for e in events] == ["ImmediateReceived"]
    assert isinstance(events[0], ImmediateReceived) and events[0].imm == 9


def test_trimmed_duplicate_of_received_packet_is_not_nacked() -> None:
    qa, qb, pd_b = _qp_pair(QPConfig(payload_size=100, cc="fixed"))
    mr = pd_b.register(bytearray(500))
    qa.post_write(b"z" * 200, mr.addr, mr.rkey)
    out = qa.datagrams_to_send(0.0)
    for ev, h, p in out:
        qb.receive_datagram(memoryview(bytes(h) + bytes(p)), qa.evs.values[ev], 0.0)
    qb.datagrams_to_send(1.0)  # drain ACKs
    cut = bytearray(out[0][1])
    cut[4] |= wire.BTH_TRIMMED
    qb.receive_datagram(memoryview(bytes(cut)), qa.evs.values[out[0][0]], 1.0)
    assert qb.stats.trims_seen == 1
    assert qb.stats.nacks_sent == 0
    acks = [d for d in qb.datagrams_to_send(2.0) if d[1][0] == wire.Opcode.ACKNOWLEDGE]
    assert [d for d in acks if wire.parse_ack(d[1]).is_nack] == []


# ---- probes ------------------------------------------------------------------------------


def test_probes_report_rtt_on_live_evs_only() -> None:
    net = RecordingNetwork(1, Faults(delay=0.0003, jitter=0.0))
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=6)
    dead = {1, 4}
    net.faults.dead_evs = {qa.evs.values[i] for i in dead}
    net.now = 2.0
    for ev in range(6):
        qa.send_probe(ev, net.now)
    assert net.run(max_time=10)
    replies = [e for e in net.hosts["a"].events if isinstance(e, ProbeReplied)]
    assert sorted(e.ev for e in replies) == [0, 2, 3, 5]
    for e in replies:
        assert e.qpn == qa.qpn
        assert e.rtt == pytest.approx(0.0006, abs=2e-6)  # two 0.3 ms hops
    assert qa.stats.probes_sent == 6 and qa.stats.probes_answered == 4
    # the probes went out on the EVs they test, and carried no data
    probes = [s for s in net.sent_by("a", qa.qpn) if s.data[0] == wire.Opcode.PROBE]
    assert [s.ev for s in probes] == list(range(6))
    assert qb.stats.packets_received == 0 and not qa.failed


# ---- retransmission timer ----------------------------------------------------------------


def test_timer_is_armed_at_the_earliest_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    late: list[float] = []
    net = RecordingNetwork(3, Faults(loss=0.2))
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=8, config=QPConfig(payload_size=1000, max_outstanding=64))
    t = make_transfer(net, "a", "b", qa, qb, [300_000], 3)
    t.post(0, 0, random.Random(3).randbytes(300_000), imm=1)
    pump = net.pump

    def checked_pump(host: SimHost, qp: QueuePair) -> None:
        pump(host, qp)
        if qp is qa and qa.requester.in_flight:
            earliest = min(p.deadline for p in qa.requester._outstanding.values())
            armed = qa.get_timer()
            if armed is not None and armed > earliest + 1e-9:
                late.append(armed - earliest)

    monkeypatch.setattr(net, "pump", checked_pump)
    assert run_until(net, [t], max_time=500)
    t.check_final()
    assert late == []


# ---- tail loss probes in a row ---------------------------------------------------------------


def _outage_run(tlp_max: int) -> tuple[float, QueuePair, bytes, bytearray]:
    """16 MiB over 4 planes at 200 Mbit/s each; every plane's last hop into the receiver
    swallows everything from 100 ms to 115 ms (the receiver starved, say): the whole window,
    and the first tail loss probe with it. Returns the largest gap between deliveries."""
    from mrc.lab.sim_links import Fabric, LinkSpec

    size = 16 << 20
    fab = Fabric(lasthop=LinkSpec(rate=25e6, queue=250_000), spines=2)
    net = SimNetwork(seed=1, faults=Faults(delay=0.0001, jitter=0.00005), fabric=fab)
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=8192, max_outstanding=64, psn_window=16384, tlp_max=tlp_max)
    qa, qb = net.connect("a", "b", evs=128, config=cfg, planes=4)
    buf = bytearray(size)
    mr = net.hosts["b"].core.pd.register(buf)
    data = bytes((i * 7 + (i >> 13)) % 251 for i in range(size))
    qa.post_write(data, mr.addr, mr.rkey)
    names = [f"last:b/p{p}" for p in range(4)]  # links exist once first used
    marks: list[tuple[float, int]] = []

    def sample() -> None:
        marks.append((net.now, qb.stats.bytes_placed))
        if not qa.idle:
            net._at(net.now + 0.0002, sample)

    def outage(down: bool) -> None:
        for name in names:
            fab.link(name).down = down

    net._at(0.0, sample)
    net._at(0.100, lambda: outage(True))
    net._at(0.115, lambda: outage(False))
    assert net.run(lambda: qa.idle, max_time=30)
    assert sum(fab.link(name).stats.lost_down for name in names) > 0
    gap, last_t, last_v = 0.0, 0.0, -1
    for t, v in marks:
        if v > last_v:
            gap = max(gap, t - last_t) if last_v >= 0 else gap
            last_t, last_v = t, v
    return gap, qa, data, buf


def test_a_second_tail_loss_probe_repairs_an_outage_the_first_one_fell_into() -> None:
    gap, qa, data, buf = _outage_run(tlp_max=3)
    assert bytes(buf) == data
    assert qa.stats.retransmits_timeout == 0 and qa.stats.retransmits_tlp >= 2
    assert gap < 0.6 * qa.config.min_rto, gap  # measured: 17.8 ms for a 15 ms outage
    # the control: a single probe, lost in the outage, leaves the repair to the RTO
    gap1, qa1, data1, buf1 = _outage_run(tlp_max=1)
    assert bytes(buf1) == data1
    assert qa1.stats.retransmits_timeout > 0 and gap1 >= qa1.config.min_rto * 0.9, gap1


def test_a_tail_loss_probe_goes_out_past_a_window_shrunk_below_what_is_in_flight() -> None:
    """NSCC may cut its window below the packets in flight (a delay sample, a quick adapt).
    If the receiver then falls silent, the probe that should break the silence must still go
    out: held back by the window, it would leave the repair to the RTO (this happened: the
    outage above ended in 12 timeouts once the window had shrunk)."""
    net = SimNetwork(seed=4, faults=Faults(delay=0.0001, jitter=0.0))
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=1000, max_outstanding=64)
    qa, qb = net.connect("a", "b", evs=16, config=cfg)
    buf = bytearray(400_000)
    mr = net.hosts["b"].core.pd.register(buf)
    data = bytes(i * 11 % 251 for i in range(400_000))
    qa.post_write(data, mr.addr, mr.rkey)
    req = qa.requester
    assert isinstance(req.cc, UetNscc)
    assert net.run(lambda: req.acked_packets > 50 and req.in_flight >= 8)  # an RTT is known
    silent = True
    for host in ("a", "b"):  # nothing arrives anywhere: no ACK can reopen the window
        core = net.hosts[host].core
        real_rx = core.receive_datagram

        def starved(
            data: memoryview,
            src_ev: int,
            now: float,
            wait: float | None = None,
            *,
            rx: Callable[..., QueuePair | None] = real_rx,
        ) -> QueuePair | None:
            return None if silent else rx(data, src_ev, now, wait)

        core.receive_datagram = starved  # type: ignore[method-assign]
    req.cc.cwnd = float(cfg.payload_size)
    req.cc.limit = 1  # the window, cut below what is in flight
    sent_before = qa.stats.packets_sent
    t0 = net.now
    assert net.run(lambda: qa.stats.retransmits_tlp >= 1, max_time=t0 + cfg.min_rto / 2)
    assert net.run(lambda: qa.stats.packets_sent > sent_before, max_time=t0 + cfg.min_rto / 2)
    assert qa.stats.retransmits_timeout == 0  # the probe went out before any RTO
    silent = False
    assert net.run(lambda: qa.idle, max_time=30)
    assert bytes(buf) == data


def test_a_tail_loss_probe_restarts_the_rto_so_its_answer_repairs_the_loss() -> None:
    """A window sent all at once loses its first packet and its last: SACK cannot find the
    first (nothing went much later), the tail loss probe must. It resends the last one 2 srtt
    after the last ACK, late in the first one's RTO, and its answer (whose SACK proves the
    first lost) comes a round trip later: after that RTO had fired, a timeout where SACK
    would have done. The probe now restarts the RTO, as TCP's does (RFC 8985 7.3). In the
    simulator's all-to-all: 17-24 timeouts in 24 runs before, 5-14 after."""
    net = RecordingNetwork(2, Faults(delay=0.0075, jitter=0.0))  # srtt 15 ms, RTO 50 ms
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=1000, max_outstanding=64, cc="fixed", min_rto=0.05)
    qa, _qb = net.connect("a", "b", evs=8, config=cfg)
    buf = bytearray(40_000)
    mr = net.hosts["b"].core.pd.register(buf)
    data = bytes(i * 13 % 251 for i in range(40_000))
    qa.post_write(data[:20_000], mr.addr, mr.rkey)
    assert net.run(lambda: qa.idle) and qa.requester.rtt.srtt == pytest.approx(0.015)
    lose = {(qa.requester.initial_psn + seq) & wire.PSN_MASK for seq in (20, 39)}
    lost: list[int] = []

    def first_copies_of_two(sent: Sent) -> bytes | None:
        psn = int.from_bytes(sent.data[9:12], "big")
        if sent.data[0] in DATA_OPS and psn in lose and psn not in lost:
            lost.append(psn)
            return None
        return sent.data

    net.tamper = first_copies_of_two
    qa.post_write(data[20_000:], mr.addr + 20_000, mr.rkey)
    assert net.run(lambda: qa.idle, max_time=5)
    assert len(lost) == 2 and bytes(buf) == data
    st = qa.stats
    assert st.retransmits_tlp == 1 and st.losses_tlp == 1  # the probe resent the last one
    assert st.retransmits_timeout == 0, "the RTO overtook the probe's answer"
    assert st.retransmits_sack == 1  # ... whose SACK found the first one lost
