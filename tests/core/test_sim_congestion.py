"""The simulator's congestion model (mrc/lab/sim_links.py): queue law, trimming with priority, ECN,
incast through a shared last hop, determinism, and the default model left exactly as it was."""

from __future__ import annotations

import hashlib
import re
import textwrap
from collections import defaultdict
from collections.abc import Callable

import pytest

from mrc import wire
from mrc.core import QPConfig, QueuePair
from mrc.lab import sim_links
from mrc.lab.sim import Faults, SimNetwork
from mrc.lab.sim_links import Fabric, LinkEvent, LinkSpec, trim_datagram
from mrc.security import packet

from .mrcsim_harness import DATA_OPS, RecordingNetwork, Transfer, make_transfer, run_until

RATE = 12.5e6  # bytes/s: 100 Mbit/s
PAYLOAD = 1000
QUEUE = 20_000  # bytes: 19 full packets waiting behind the one being sent


def _config(window: int) -> QPConfig:
    return QPConfig(
        payload_size=PAYLOAD,
        max_outstanding=window,
        ack_every=4,
        min_rto=0.005,
        initial_rto=0.01,
        cc="fixed",  # what the queue does to a fixed window is the point here
    )


def _pattern(n: int, salt: int) -> bytes:
    return bytes((i * 31 + salt * 7 + (i >> 8)) % 251 for i in range(n))


def _one_flow(
    spec: LinkSpec, window: int, size: int, seed: int = 7
) -> tuple[RecordingNetwork, Fabric, Transfer]:
    """One QP a -> b, everything ideal but the last hop into b, which is ``spec``."""
    net = RecordingNetwork(seed, Faults(delay=0.0, jitter=0.0))
    fab = Fabric(lasthop=spec, record=True)
    net.set_fabric(fab)
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=16, config=_config(window))
    t = make_transfer(net, "a", "b", qa, qb, [size + 3000], seed)
    t.post(0, 1000, _pattern(size, seed), imm=0xC0FFEE)
    assert run_until(net, [t])
    t.check_final()  # every byte in place, completions in order, nothing placed twice
    return net, fab, t


def _events(fab: Fabric, link: str) -> list[LinkEvent]:
    assert fab.trace is not None
    return [e for e in fab.trace if e.link == link]


# ---- the queue law ------------------------------------------------------------------------


@pytest.mark.parametrize("trim", [True, False])
def test_queue_fills_to_its_limit_then_trims_or_drops_and_serves_at_the_rate(trim: bool) -> None:
    # a window of 24 packets bursts into a link that holds 20: the queue fills, then overflows
    net, fab, t = _one_flow(LinkSpec(rate=RATE, queue=QUEUE, delay=10e-6, trim=trim), 24, 200_000)
    link = fab.link("last:b/p0")
    st = link.stats
    assert QUEUE - PAYLOAD < st.max_queue <= QUEUE
    if trim:
        assert st.trimmed > 0 and st.dropped == 0
        assert st.trimmed_bytes == st.trimmed * PAYLOAD  # exactly the payload was cut
        assert t.qp.stats.retransmits_nack == st.trimmed  # every trim NACKed and resent once
        assert t.qp.stats.retransmits_timeout == 0
    else:
        assert st.dropped > 0 and st.trimmed == 0
        assert st.dropped_bytes == st.dropped * (PAYLOAD + wire.DATA_HDR_LEN)
    # every packet that arrived was enqueued, trimmed or dropped; everything enqueued was served
    arrivals = [e for e in _events(fab, "last:b/p0") if e.kind in ("enqueue", "trim", "drop")]
    assert len(arrivals) == st.enqueued + st.dropped
    assert st.served == st.enqueued
    # a queued packet waits at most a full data band plus whatever priority traffic overtook it
    delays = st.queue_delays
    assert max(delays) >= 0.9 * QUEUE / RATE
    # work conserving at exactly the rate: while packets wait, departures are back to back
    departs = [e for e in _events(fab, "last:b/p0") if e.kind == "depart"]
    backlogged = 0
    for prev, nxt in zip(departs, departs[1:], strict=False):
        gap = nxt.time - prev.time
        assert gap >= len(nxt.data) / RATE - 1e-12  # never faster than the rate
        if gap <= len(nxt.data) / RATE + 1e-12:
            backlogged += 1
    assert backlogged > len(departs) // 2
    # the flow keeps the bottleneck busy from its first packet to its last (NACKs after trims,
    # SACK-based recovery after drops): bytes served / time = the rate
    util = link.utilization()
    assert 0.97 <= util <= 1 + 1e-9, util
    assert st.served_bytes / st.busy_time == pytest.approx(RATE, rel=1e-9)
    # the other links are ideal: nothing queued, trimmed or dropped anywhere else
    for other in fab.links.values():
        if other is not link:
            assert other.stats.trimmed == other.stats.dropped == other.stats.max_queue == 0


def test_a_window_below_the_queue_never_overflows_it() -> None:
    _net, fab, _t = _one_flow(LinkSpec(rate=RATE, queue=QUEUE, trim=True), 12, 60_000)
    st = fab.link("last:b/p0").stats
    assert st.trimmed == st.dropped == 0
    assert 0 < st.max_queue <= 12 * (PAYLOAD + wire.DATA_HDR_LEN)


# ---- priority of trimmed headers ----------------------------------------------------------


def _overtakes(fab: Fabric, link: str) -> tuple[int, int]:
    """(pairs where a trimmed header left before data that was waiting when it was cut,
    pairs where it left after such data)."""
    evs = _events(fab, link)
    depart = {e.pid: e.time for e in evs if e.kind == "depart"}
    start = {e.pid: e.time - len(e.data) / RATE for e in evs if e.kind == "depart"}
    delivered = {e.pid: e.time for e in fab.trace or [] if e.kind == "deliver"}
    enq_data = [e for e in evs if e.kind == "enqueue" and e.data[0] in DATA_OPS]
    ahead = behind = 0
    for cut in (e for e in evs if e.kind == "trim"):
        assert cut.data[4] & wire.BTH_TRIMMED and cut.data[4] & wire.BTH_LASTHOP
        waiting = [d.pid for d in enq_data if d.time < cut.time and start[d.pid] > cut.time]
        for pid in waiting:
            if depart[cut.pid] < depart[pid]:
                assert delivered[cut.pid] < delivered[pid]
                ahead += 1
            else:
                behind += 1
    return ahead, behind


def test_a_trimmed_header_overtakes_the_data_queued_before_it() -> None:
    _net, fab, _t = _one_flow(LinkSpec(rate=RATE, queue=QUEUE, trim=True), 24, 60_000)
    ahead, behind = _overtakes(fab, "last:b/p0")
    assert ahead > 100 and behind == 0, (ahead, behind)
    st = fab.link("last:b/p0").stats
    assert st.max_priority_queue > 0
    # a trimmed header waits for the packet being sent and other headers, never for the data
    assert _max_header_wait(fab, "last:b/p0") < 0.2 * QUEUE / RATE


def _max_header_wait(fab: Fabric, link: str) -> float:
    evs = _events(fab, link)
    depart = {e.pid: e.time for e in evs if e.kind == "depart"}
    return max(depart[e.pid] - e.time for e in evs if e.kind == "trim")


def test_without_the_priority_band_a_trimmed_header_waits_behind_the_data() -> None:
    # the control for the test above: plain FIFO makes the very same check come out the other way
    spec = LinkSpec(rate=RATE, queue=QUEUE, trim=True, priority=False)
    _net, fab, _t = _one_flow(spec, 24, 60_000)
    ahead, behind = _overtakes(fab, "last:b/p0")
    assert ahead == 0 and behind > 20, (ahead, behind)
    assert _max_header_wait(fab, "last:b/p0") > 0.5 * QUEUE / RATE


# ---- ECN ----------------------------------------------------------------------------------


def test_ecn_marks_data_only_above_the_threshold() -> None:
    threshold = 8 * (PAYLOAD + wire.DATA_HDR_LEN)  # exactly 8 full packets: not yet "above"
    spec = LinkSpec(rate=RATE, queue=None, ecn=threshold)  # no limit: nothing trimmed or lost
    _net, fab, t = _one_flow(spec, 24, 120_000)
    st = fab.link("last:b/p0").stats
    enq = [e for e in _events(fab, "last:b/p0") if e.kind == "enqueue"]
    data = [e for e in enq if e.data[0] in DATA_OPS]
    for e in data:
        assert e.marked == (e.queued > threshold), e
        assert bool(e.data[4] & wire.BTH_FECN) == e.marked
    marked = sum(e.marked for e in data)
    assert marked == st.ecn_marked
    assert 0 < marked < len(data)
    assert any(e.queued == 0 for e in data) and max(e.queued for e in data) > 2 * threshold
    assert any(e.queued == threshold and not e.marked for e in data)  # the edge: not above
    # control packets are never marked, whatever the queue
    assert all(not e.marked and not e.data[4] & wire.BTH_FECN for e in enq if e not in data)
    # the mark reaches the receiver (as FECN: the simulator has no IP header); the core ignores
    # it today, and the transfer is intact
    fecn_delivered = sum(
        1 for e in fab.trace or [] if e.kind == "deliver" and e.data[4] & wire.BTH_FECN
    )
    assert fecn_delivered == marked
    assert st.trimmed == st.dropped == 0
    assert t.qp.stats.retransmits == 0


# ---- incast through a shared last hop ------------------------------------------------------

_LINK = re.compile(r"^\w+:[^/]+/p(\d+)(?:/s(\d+))?$")


@pytest.mark.parametrize("trim", [True, False])
def test_incast_3_to_1_contends_for_the_last_hop_and_completes(trim: bool) -> None:
    senders = ["a", "c", "d"]
    net = RecordingNetwork(11, Faults(delay=0.0, jitter=0.0))
    last = LinkSpec(rate=RATE, queue=16_000, delay=5e-6, trim=trim)
    fabric_links = LinkSpec(rate=4 * RATE, queue=64_000, delay=2e-6, trim=True)
    fab = Fabric(up=fabric_links, down=fabric_links, lasthop=last, spines=2, record=True)
    net.set_fabric(fab)
    for h in ["b", *senders]:
        net.add_host(h)
    plane_of: dict[int, int] = {}  # EV -> its plane
    spine_of: dict[int, int] = {}  # EV -> the spine its SRv6 route turns at
    transfers = []
    for i, src in enumerate(senders):
        # each window (16 packets) alone fits the 16 kB queue; three of them do not
        qa, qb = net.connect(
            src, "b", evs=8, config=_config(16), qpn_a=i + 1, qpn_b=i + 1, planes=2
        )
        for q in (qa, qb):
            for i, ev in enumerate(q.evs.values):
                plane_of[ev] = i % 2
                spine_of[ev] = (i // 2) % 2  # the plane's routes in turn, as the transport
            # told its routes as the transport tells them: a route per (plane, spine), the
            # two backups (one a plane) on the routes that come next
            assert q.evs.routes == [0, 1, 2, 3] * 2 + [0, 1]
        t = make_transfer(net, src, "b", qa, qb, [100_000], 100 + i)
        t.post(0, 0, _pattern(60_000, i), imm=i)
        t.post(0, 70_000, _pattern(20_000, i + 10))
        transfers.append(t)
    assert run_until(net, transfers)
    for t in transfers:
        t.check_final()
    last_hops = fab.matching("last:b/")
    assert [lk.name for lk in last_hops] == ["last:b/p0", "last:b/p1"]  # one queue per plane
    for lk in last_hops:
        st = lk.stats
        assert st.max_queue > 12_000  # the shared queue filled (well past what any one window does)
        if trim:
            assert st.trimmed > 0 and st.dropped == 0
        else:
            assert st.dropped > 0 and st.trimmed == 0
        assert lk.utilization() > 0.5
    contention = fab.total("trimmed") + fab.total("dropped")
    assert contention == sum(lk.stats.trimmed + lk.stats.dropped for lk in last_hops) > 0
    if trim:
        # NACKs say "last hop": incast at the receiver, not a broken path
        cuts = [e for e in fab.trace or [] if e.kind == "trim"]
        assert cuts and all(e.data[4] & wire.BTH_LASTHOP for e in cuts)
        assert sum(t.qp.stats.retransmits_nack for t in transfers) == fab.total("trimmed")
    # the fabric links (4x faster) never queued much; the senders' NICs are ideal
    for lk in fab.matching("up:") + fab.matching("down:"):
        assert lk.stats.trimmed == lk.stats.dropped == 0 and lk.stats.max_queue < 16_000
    # EV -> path: the EV's plane, then the spine of its route; both spines used
    spines_used = set()
    for e in fab.trace or []:
        m = _LINK.match(e.link)
        if m is None:
            continue
        assert int(m.group(1)) == plane_of[e.ev], e
        if m.group(2) is not None:
            assert int(m.group(2)) == spine_of[e.ev] == fab.spine_of(e.ev), e
            spines_used.add(int(m.group(2)))
    assert spines_used == {0, 1}


def test_incast_deep_last_hop_queues_retire_no_ev() -> None:
    """Three fixed windows of 64 into one host whose last hop queues 64 kB per plane: packets
    wait there longer than the reordering window, so SACKs from the other plane (or from the
    plane's shallower moments) make them look lost. The last-hop trims say why: incast, which
    no path is to blame for. Before they counted, this run retired 36 healthy EVs."""
    senders = ["a", "c", "d"]
    net = RecordingNetwork(0, Faults(delay=0.0, jitter=0.0))
    last = LinkSpec(rate=RATE, queue=64_000, delay=5e-6, trim=True)
    fabric_links = LinkSpec(rate=4 * RATE, queue=64_000, delay=2e-6, trim=True)
    fab = Fabric(up=fabric_links, down=fabric_links, lasthop=last, spines=2)
    net.set_fabric(fab)
    for h in ["b", *senders]:
        net.add_host(h)
    transfers = []
    for i, src in enumerate(senders):
        qa, qb = net.connect(
            src, "b", evs=8, config=_config(64), qpn_a=i + 1, qpn_b=i + 1, planes=2
        )
        t = make_transfer(net, src, "b", qa, qb, [400_000], 200 + i)
        t.post(0, 0, _pattern(400_000, i))
        transfers.append(t)
    assert run_until(net, transfers)
    for t in transfers:
        t.check_final()
    assert fab.total("trimmed") > 1000 and fab.total("dropped") == 0  # deep, trimming queues
    stats = [t.qp.stats for t in transfers]
    assert sum(s.retransmits_sack for s in stats) > 0  # the queues did fool loss detection
    counters = [t.qp.evs.counters() for t in transfers]
    assert sum(c["evs_assumed_bad"] for c in counters) == 0, counters
    assert sum(t.qp.evs.losses_congested for t in transfers) > 0


# ---- determinism, and the default model unchanged -----------------------------------------


def _trace_digest(seed: int, fabric: Fabric | None = None) -> str:
    """A digest of every datagram delivered (time, host, EV, headers, payload) and every event,
    in order.  Addresses, rkeys and probe tokens are random by design (mrc/core/memory.py), so
    only the BTH and the payload of data packets go in."""
    net = SimNetwork(seed, Faults(loss=0.02, trim=0.03, duplicate=0.02, reorder=0.05), fabric)
    for name in ("a", "b", "c"):
        net.add_host(name)
    h = hashlib.sha256()
    for name, host in net.hosts.items():
        orig = host.core.receive_datagram

        def rec(
            data: memoryview,
            src_ev: int,
            now: float,
            wait: float | None = None,
            *,
            _orig: Callable[..., QueuePair | None] = orig,
            _name: str = name,
        ) -> QueuePair | None:
            b = bytes(data)
            h.update(f"{now!r} {_name} {src_ev} {len(b)} ".encode() + b[:12])
            if b[0] in DATA_OPS:
                h.update(b[28 if b[0] == 0x0A else 32 :])
            return _orig(data, src_ev, now, wait)

        host.core.receive_datagram = rec  # type: ignore[method-assign]
    # the fixed window the digests were computed with
    cfg = QPConfig(
        payload_size=1000,
        max_outstanding=32,
        ack_every=4,
        min_rto=0.01,
        initial_rto=0.02,
        cc="fixed",
    )
    qa, _qb = net.connect("a", "b", evs=8, config=cfg, planes=2)
    qc, _qb2 = net.connect("c", "b", evs=8, config=cfg, qpn_a=2, qpn_b=2, planes=2)
    pd = net.hosts["b"].core.pd
    buf1, buf2 = bytearray(200_000), bytearray(200_000)
    m1, m2 = pd.register(buf1), pd.register(buf2)
    d1 = bytes(i * 7 % 251 for i in range(150_000))
    d2 = bytes(i * 13 % 253 for i in range(120_000))
    qa.post_write(d1, m1.addr, m1.rkey, imm=5)
    qc.post_write(d2, m2.addr + 100, m2.rkey)
    net.run(lambda: qa.idle and qc.idle, max_time=30.0)
    assert buf1[:150_000] == d1 and buf2[100:120_100] == d2
    assert net.lost > 0 and net.trimmed > 0
    for host in net.hosts.values():
        for e in host.events:
            h.update(repr(e).encode())
    h.update(f"{net.now!r} {net.lost} {net.trimmed}".encode())
    return h.hexdigest()


#: computed on the simulator before the congestion model existed (commit 106b72c), and
#: recomputed when the responder began to report the block of its oldest hole in every flush
#: (more ACKs: a different trace), and again when trims became congestion evidence against
#: blaming a loss on its path (fewer EVs retired), and when a tail loss probe that arrives
#: first began to prove the probed transmission lost, and when the ACK of a copy sent before a
#: resend began to be believed and a duplicate soon after its SACK to retire no ACK EV, and when
#: tail loss probes began to carry P (their ACKs go twice), and when receivers began to probe
#: their reverse EVs (replies on a cursor of their own), and when EVs became 32 bits (ACKs of
#: 40 bytes, probes of 28) and a second tail loss probe in a row began to leave the plane of
#: the first, and when a loss after its plane's delay rose stopped retiring its EV, and when
#: the simulator's EVs became the transport's (a source port per plane and flow label i + 1,
#: where every EV had a port of its own: the same times, losses and counts, other EV values),
#: when it began to open the transport's backup EVs (seed 1: a backup takes the place of
#: an EV retired; seed 2 is unchanged), and (seed 1) when a flush stopped sending an ACK for
#: a block wholly below its cumulative point (fewer ACKs). What they guard: the default network
#: and an ideal fabric give one and the same trace, and it changes only with the protocol
_DEFAULT_DIGESTS = {
    1: "ef9036d9661683597b8f4b26e2b37a74c8cd3889056bb4a3300f9857330bff50",
    2: "24916a7ce7fa59e798582cc8be1add3b99cbab3a3dd2ee99047841cf36bbe49f",
}


@pytest.mark.parametrize("seed", sorted(_DEFAULT_DIGESTS))
def test_the_default_network_is_exactly_the_old_one(seed: int) -> None:
    assert _trace_digest(seed) == _DEFAULT_DIGESTS[seed]


@pytest.mark.parametrize("seed", sorted(_DEFAULT_DIGESTS))
@pytest.mark.parametrize("kind", ["ecmp", "srv6"])
def test_an_ideal_fabric_changes_nothing(seed: int, kind: str) -> None:
    # links with no rate and no delay: every datagram still arrives when Faults says. Where
    # the QPs have one route per plane, as without a fabric: any spines hashed onto (ecmp), or
    # one spine (srv6: more would give a QP more routes, so other ports and route fate)
    fab = Fabric(spines=3, ecmp=True) if kind == "ecmp" else Fabric(spines=1)
    assert _trace_digest(seed, fab) == _DEFAULT_DIGESTS[seed]
    assert fab.links and fab.total("served") == 0 and fab.total("enqueued") > 0


def test_same_seed_same_events_with_a_fabric() -> None:
    def run() -> list[tuple[float, str, str, int, bytes]]:
        spec = LinkSpec(rate=RATE, queue=QUEUE, ecn=5_000, trim=True)
        _net, fab, _t = _one_flow(spec, 24, 40_000, seed=3)
        return [(e.time, e.link, e.kind, e.pid, e.data[:12]) for e in fab.trace or []]

    first = run()
    assert len(first) > 500 and first == run()


# ---- small pieces ---------------------------------------------------------------------------


def test_the_usage_example_in_the_docstring_runs(capsys: pytest.CaptureFixture[str]) -> None:
    doc = sim_links.__doc__ or ""
    block = doc.split("Usage", 1)[1].split("::\n\n", 1)[1]
    code = textwrap.dedent(block)
    exec(compile(code, "sim_links usage", "exec"), {})
    trimmed, marked, max_queue, util = capsys.readouterr().out.split()
    assert int(trimmed) > 0 and int(marked) > 0 and 0 < int(max_queue) <= 20_000
    assert 0.9 < float(util) <= 1.0


def test_trim_datagram_matches_the_fabric_program() -> None:
    hdr = wire.DATA_HDR.pack(wire.Opcode.RDMA_WRITE_ONLY, 0, 0xFFFF, 7, 5, 1 << 32, 9, 100)
    pkt = hdr + bytes(100)
    cut = trim_datagram(pkt, lasthop=False)
    assert cut is not None and len(cut) == wire.DATA_HDR_LEN
    assert cut[4] == wire.BTH_TRIMMED and cut[5:] == hdr[5:] and cut[:4] == hdr[:4]
    last = trim_datagram(pkt, lasthop=True)
    assert last is not None and last[4] == wire.BTH_TRIMMED | wire.BTH_LASTHOP
    assert trim_datagram(hdr, lasthop=False) is None  # nothing to cut: a switch drops it
    ack = bytes([wire.Opcode.ACKNOWLEDGE]) + bytes(35)
    assert trim_datagram(ack, lasthop=False) is None
    # with a security block (S bit) the block survives the cut, as in mrc_trim.bpf.c
    assert sim_links.SEC_BLOCK_LEN == packet.SEC_BLOCK_LEN
    sec = bytearray(pkt + bytes(packet.SEC_BLOCK_LEN + packet.ICV_LEN))
    sec[8] |= wire.BTH_SECURE
    cut = trim_datagram(bytes(sec), lasthop=False)
    assert cut is not None and len(cut) == wire.DATA_HDR_LEN + packet.SEC_BLOCK_LEN


def test_link_spec_rejects_nonsense() -> None:
    for bad in ({"rate": 0.0}, {"queue": -1}, {"ecn": -5}, {"delay": -1e-6}):
        with pytest.raises(ValueError):
            LinkSpec(**bad)
    with pytest.raises(ValueError):
        Fabric(spines=0)
    fab = Fabric()
    SimNetwork(fabric=fab)
    with pytest.raises(ValueError):
        SimNetwork(fabric=fab)  # one fabric, one network


def test_overrides_make_one_plane_the_bottleneck() -> None:
    net = SimNetwork(5, Faults(delay=0.0, jitter=0.0))
    slow = LinkSpec(rate=RATE / 4, queue=QUEUE, trim=True)
    fab = Fabric(lasthop=LinkSpec(rate=RATE, queue=QUEUE, trim=True), overrides={"last:b/p1": slow})
    net.set_fabric(fab)
    net.add_host("a")
    net.add_host("b")
    qa, _qb = net.connect("a", "b", evs=8, config=_config(32), planes=2)
    pd = net.hosts["b"].core.pd
    buf = bytearray(100_000)
    mr = pd.register(buf)
    data = _pattern(100_000, 1)
    qa.post_write(data, mr.addr, mr.rkey)
    assert net.run(lambda: qa.idle)
    assert buf == data
    fast, slow_link = fab.link("last:b/p0"), fab.link("last:b/p1")
    assert slow_link.spec == slow and fast.spec.rate == RATE
    per_link: dict[str, float] = defaultdict(float)
    for lk in (fast, slow_link):
        per_link[lk.name] = max(lk.stats.queue_delays)
    # the slow plane queues four times longer per byte
    assert per_link["last:b/p1"] > 2 * per_link["last:b/p0"]
