"""Malformed, hostile and forged input: dropped with the right reason, never harmful.

During a real transfer in the simulator we inject one datagram of every kind of garbage and
check that the transfer still lands byte for byte, that each drop is counted under its own
reason with exactly the number injected, and that forged NACK-provoking packets cannot fail the
sender. Hypothesis then throws arbitrary bytes and arbitrary headers at an endpoint.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrc import wire
from mrc.core import (
    Access,
    EndpointCore,
    MemoryRegion,
    QPConfig,
    QPFailed,
    QueuePair,
    WCStatus,
    WriteCompleted,
    WriteFailed,
)
from mrc.core.psn import to_psn, to_seq
from mrc.lab.sim import Faults

from .mrcsim_harness import (
    RecordingNetwork,
    Transfer,
    all_drops,
    failures,
    fuzz_settings,
    make_transfer,
    run_until,
    split_stale,
)

FUZZ = fuzz_settings(400)

OP_W = int(wire.Opcode.RDMA_WRITE_ONLY)
OP_WI = int(wire.Opcode.RDMA_WRITE_ONLY_IMM)
EVIL = 0xEE  # payload byte of every injected write: must never show up in a buffer


def _data(
    qpn: int,
    psn: int,
    va: int,
    rkey: int,
    length: int,
    payload: bytes | None = None,
    imm: int | None = None,
    tver: int = 0,
    marks: int = 0,
    secure: bool = False,
    opcode: int | None = None,
) -> bytes:
    hdr = bytearray(wire.pack_data(qpn, psn, va, rkey, length, False, imm))
    hdr[1] = (hdr[1] & 0xF0) | tver
    hdr[4] |= marks
    if secure:
        hdr[8] |= wire.BTH_SECURE
    if opcode is not None:
        hdr[0] = opcode
    return bytes(hdr) + (bytes([EVIL]) * length if payload is None else payload)


def _setup(seed: int, faults: Faults) -> tuple[RecordingNetwork, Transfer]:
    net = RecordingNetwork(seed, faults)
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=1000, max_outstanding=32)
    qa, qb = net.connect(
        "a", "b", evs=8, config=cfg, qpn_a=3, qpn_b=4, psn_a=wire.PSN_MASK - 20, psn_b=1234
    )
    t = make_transfer(net, "a", "b", qa, qb, [200_000, 10_000], seed)
    rng = random.Random(seed)
    t.post(0, 0, rng.randbytes(90_000))
    t.post(1, 0, rng.randbytes(5000), imm=1)
    t.post(0, 100_000, rng.randbytes(99_000))
    t.post(0, 200_000, b"", imm=2)
    return net, t


def _garbage(
    net: RecordingNetwork, t: Transfer
) -> tuple[list[tuple[str, bytes, int]], Counter[str]]:
    """(host, datagram, sport) to inject, and the drops each reason must show."""
    qa, qb = t.qp, t.peer
    mr, small = t.regions
    ip = qa.initial_psn  # the PSN space b receives in
    nxt = qb.responder.received_through + 1
    psn = to_psn(ip, nxt)  # a PSN the receiver has not seen and the sender has outstanding
    pkt = qa.requester._outstanding.get(nxt)
    assert pkt is not None
    # the forger even sends from one of the sender's own EVs, just not the one this PSN used;
    # that EV is denied so a retransmission of this PSN can never land on it before the
    # receiver's NACK comes back (which would make the forged NACK match, as it should)
    spoof_ev = (pkt.ev + 1) % len(qa.evs)
    qa.deny_ev(spoof_ev)
    spoof = qa.evs.values[spoof_ev]
    q = qb.qpn
    other_rkey = (mr.rkey ^ 0x5A5A5A5A) or 1
    assert net.hosts["b"].core.pd.lookup(other_rkey) is None
    window = qb.config.psn_window
    ack = wire.pack_ack(qa.qpn, 0, wire.AETH_ACK, 0, 0, 0, qb.evs.values[0])
    inj: list[tuple[str, bytes, int]] = [
        ("b", b"", 9999),
        ("b", b"\x0a\x00\xff\xff\x00", 9999),
        ("b", _data(q, psn, mr.addr, mr.rkey, 10, tver=1), 9999),
        ("b", _data(0x777777, psn, mr.addr, mr.rkey, 10), 9999),
        ("b", _data(q, psn, mr.addr, mr.rkey, 10, opcode=0x04), 9999),  # RC SEND ONLY
        ("b", _data(q, psn, mr.addr, mr.rkey, 10, opcode=0x0C), 9999),  # RC RDMA READ
        ("b", _data(q, psn, mr.addr, other_rkey, 10), spoof),
        ("b", _data(q, psn, mr.addr - 1, mr.rkey, 10), spoof),  # starts before the region
        ("b", _data(q, psn, mr.addr + mr.length - 9, mr.rkey, 10), 9999),  # runs past its end
        ("b", _data(q, psn, mr.addr + mr.length + 1, mr.rkey, 0, imm=3), 9999),  # 0 B past end
        ("b", _data(q, psn, small.addr + 9000, small.rkey, 2000), 9999),  # past a small region
        ("b", _data(q, to_psn(ip, nxt + window + 1000), mr.addr, mr.rkey, 10), 9999),
        ("b", _data(q, to_psn(ip, nxt + (1 << 22)), mr.addr, mr.rkey, 10, imm=4), 9999),
        ("b", _data(q, psn, mr.addr, mr.rkey, 10, payload=bytes([EVIL]) * 20), 9999),
        ("b", _data(q, psn, mr.addr, mr.rkey, 10, secure=True), 9999),
        ("b", _data(q, psn, mr.addr, mr.rkey, 10)[:20], 9999),  # truncated WRITE header
        ("b", _data(q, psn, mr.addr, mr.rkey, 0, imm=5)[:30], 9999),  # truncated WRITE_IMM
        ("a", ack[:20], 9999),  # truncated ACK to the sender
        ("b", wire.pack_probe(q, 0, 1, 2, False)[:16], 9999),  # truncated probe
    ]
    want = Counter(
        short=2 + 2 + 1 + 1,
        bad_version=1,
        unknown_qp=1,
        bad_opcode=2,
        bad_rkey=1,
        out_of_bounds=4,
        psn_out_of_window=2,
        bad_length=1,
        security_unsupported=1,
    )
    return inj, want


# NACK-provoking injections (out of bounds x4, with a known rkey) that reach the sender; an
# unknown rkey and a PSN beyond the window get no answer at all (nothing to probe with)
PROVOKING = 4


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "faults",
    [Faults(reorder=0.3), Faults(loss=0.03, trim=0.05, reorder=0.3)],
    ids=["reorder", "lossy"],
)
def test_injected_garbage_is_dropped_and_counted(seed: int, faults: Faults) -> None:
    net, t = _setup(seed, faults)
    qa, qb = t.qp, t.peer

    # let a third of the data land, then inject everything at once, mid-transfer, at a
    # moment the receiver's next PSN is in flight (what _garbage forges NACKs about)
    def ready() -> bool:
        nxt = qb.responder.received_through + 1
        return qb.stats.bytes_placed > 60_000 and nxt in qa.requester._outstanding

    assert net.run(ready, max_time=50)
    assert not qa.idle
    inj, want = _garbage(net, t)
    for host, data, sport in inj:
        net.inject(host, data, sport)
    assert run_until(net, [t])
    assert not failures(net)
    t.check_final()  # every byte right, sentinel intact elsewhere, imms in order
    for buf in t.buffers:
        assert bytes([EVIL]) * 10 not in buf
    drops = all_drops(net)
    # the sender's refusals of ACKs/NACKs: the forged NACKs bounced off b, and (with loss)
    # genuine but stale ones, e.g. the NACK of a transmission resent before it came back
    refused = {k: drops.pop(k) for k in list(drops) if k.startswith(("ack_", "nack_"))}
    assert drops == dict(want)
    for sim_host in net.hosts.values():
        assert sim_host.core.unaccounted() == 0
    # the endpoint-level drops are counted there, the rest on the QPs they reached
    assert net.hosts["b"].core.dropped_by_reason == Counter(short=2, bad_version=1, unknown_qp=1)
    assert split_stale(dict(qa.stats.dropped_by_reason))[0] == {"short": 1}
    # forged NACK-provoking packets came back as NACKs the sender ignored: it checks the EV
    nacks = [wire.parse_ack(s.data) for s in net.sent_by("b", qb.qpn) if s.data[0] == 0x11]
    codes = Counter(a.nack_code for a in nacks if a.is_nack)
    assert codes[wire.NackCode.REMOTE_ACCESS_ERROR] == PROVOKING
    assert codes[wire.NackCode.PSN_SEQUENCE_ERROR] == 0
    assert not qa.failed
    if faults.loss == 0 and faults.trim == 0:
        assert qa.stats.nacks == qa.stats.nacks_ignored == PROVOKING
        assert refused.get("nack_wrong_ev", 0) + refused.get("nack_not_in_flight", 0) == PROVOKING
        assert sum(refused.values()) == PROVOKING, refused
    else:
        assert qa.stats.nacks_ignored >= 1
    assert qa.stats.nacks_ignored == sum(n for k, n in refused.items() if k.startswith("nack_"))


def test_not_connected_qp_drops_data() -> None:
    core = EndpointCore()
    buf = bytearray(100)
    mr = core.pd.register(buf)
    core.add(QueuePair(9, core.pd, [1000, 1001]))
    assert core.receive_datagram(memoryview(_data(9, 0, mr.addr, mr.rkey, 10)), 1, 0.0)
    assert core.all_drops() == {"not_connected": 1}
    assert buf == bytearray(100)


# ---- forged NACKs, driven by hand ----------------------------------------------------------


def _pair() -> tuple[QueuePair, QueuePair, EndpointCore, EndpointCore]:
    ca, cb = EndpointCore(), EndpointCore()
    qa = QueuePair(11, ca.pd, [30000 + i for i in range(8)], initial_psn=wire.PSN_MASK - 1)
    qb = QueuePair(22, cb.pd, [40000 + i for i in range(8)], initial_psn=5)
    qa.connect(22, 5)
    qb.connect(11, wire.PSN_MASK - 1)
    ca.add(qa)
    cb.add(qb)
    return qa, qb, ca, cb


def _forge_and_bounce(
    qa: QueuePair, qb: QueuePair, cb: EndpointCore, hdr: bytes, sport: int
) -> wire.Ack:
    """Send a copy of ``hdr`` aimed outside its region to b from ``sport`` (the rkey is known,
    so b answers: an unknown rkey would get no answer at all), and b's NACK back to a."""
    forged = bytearray(hdr)
    forged[12:20] = (1 << 63).to_bytes(8, "big")  # far outside every region
    length = int.from_bytes(hdr[24:28], "big")
    cb.receive_datagram(memoryview(bytes(forged) + bytes([EVIL]) * length), sport, 0.0)
    out = qb.datagrams_to_send(0.0)
    assert len(out) == 1
    nack = wire.parse_ack(out[0][1])
    assert nack.is_nack and nack.nack_code == wire.NackCode.REMOTE_ACCESS_ERROR
    assert nack.ev == sport
    qa.receive_datagram(memoryview(out[0][1]), qb.evs.values[out[0][0]], 0.0)
    return nack


def test_forged_remote_access_nack_does_not_fail_sender() -> None:
    qa, qb, ca, cb = _pair()
    buf = bytearray(1000)
    mr = cb.pd.register(buf)
    qa.post_write(bytes(300), mr.addr, mr.rkey)
    out = qa.datagrams_to_send(0.0)  # one packet, outstanding (never delivered)
    assert len(out) == 1
    ev, hdr, _payload = out[0]
    # the forger knows the QP and even a PSN that is really outstanding, but not the EV
    for wrong in range(8):
        if wrong == ev:
            continue
        nack = _forge_and_bounce(qa, qb, cb, hdr, qa.evs.values[wrong])
        assert nack.subject_psn == int.from_bytes(hdr[9:12], "big")
        assert not qa.failed
    assert qa.stats.nacks == qa.stats.nacks_ignored == 7
    assert qa.requester.in_flight == 1  # the real packet is still outstanding
    assert qa.next_event() is None
    # also from a port that is none of the sender's
    _forge_and_bounce(qa, qb, cb, hdr, 9999)
    assert not qa.failed and qa.stats.nacks_ignored == 8
    # from the EV the packet really used (an on-path observer sees it), the NACK is believed
    # but held: without keys one packet must not end the QP; the packet goes out again
    _forge_and_bounce(qa, qb, cb, hdr, qa.evs.values[ev])
    assert not qa.failed and qa.next_event() is None
    assert qa.stats.nacks_unconfirmed == 1 and qa.stats.retransmits_nack == 1
    (again,) = qa.datagrams_to_send(0.0)
    assert again[0] != ev and again[1][9:12] == hdr[9:12]  # the same PSN, on another EV
    # refused on that transmission too, as a real receiver refuses every copy: now it fails,
    # and the reason names the signal
    _forge_and_bounce(qa, qb, cb, again[1], qa.evs.values[again[0]])
    assert qa.failed
    write_failed, failed = qa.next_event(), qa.next_event()
    assert isinstance(write_failed, WriteFailed)
    assert write_failed.status is WCStatus.REMOTE_ACCESS_ERROR
    assert isinstance(failed, QPFailed) and "remote access error" in failed.reason
    psn = int.from_bytes(hdr[9:12], "big")
    assert f"refused PSN {psn} (NAK code 2, REMOTE_ACCESS_ERROR)" in failed.reason
    assert "refused again on its next transmission" in failed.reason
    assert buf == bytearray(1000)


def test_a_held_remote_access_nack_is_contradicted_by_the_ack_of_its_packet() -> None:
    """The observer's NACK arrives before the real ACK: held, and forgotten (counted) when the
    receiver acknowledges the packet; the write completes, the QP lives."""
    qa, qb, ca, cb = _pair()
    buf = bytearray(1000)
    mr = cb.pd.register(buf)
    qa.post_write(b"\x5a" * 300, mr.addr, mr.rkey)
    ((ev, hdr, payload),) = qa.datagrams_to_send(0.0)
    _forge_and_bounce(qa, qb, cb, hdr, qa.evs.values[ev])
    assert qa.stats.nacks_unconfirmed == 1 and not qa.failed
    # the real packet reaches the receiver and is acknowledged
    cb.receive_datagram(memoryview(bytes(hdr) + bytes(payload)), qa.evs.values[ev], 0.001)
    for out_ev, ack, _ in qb.datagrams_to_send(0.002):
        ca.receive_datagram(memoryview(bytes(ack)), qb.evs.values[out_ev], 0.002)
    assert not qa.failed
    assert qa.stats.nacks_contradicted == 1
    assert isinstance(qa.next_event(), WriteCompleted)
    assert bytes(buf[:300]) == b"\x5a" * 300


def test_a_keyed_qp_believes_a_remote_access_nack_at_once() -> None:
    """With keys every NACK is authenticated before it counts: no second transmission needed."""
    qa, qb, ca, cb = _pair()
    qa.requester.authenticated = True  # what QueuePair.protect sets
    mr = cb.pd.register(bytearray(1000))
    qa.post_write(bytes(300), mr.addr, mr.rkey)
    ((ev, hdr, _),) = qa.datagrams_to_send(0.0)
    _forge_and_bounce(qa, qb, cb, hdr, qa.evs.values[ev])
    assert qa.failed and qa.stats.nacks_unconfirmed == 0


@pytest.mark.parametrize(
    "code",
    [
        wire.NackCode.PSN_SEQUENCE_ERROR,
        wire.NackCode.INVALID_REQUEST,
        wire.NackCode.REMOTE_OPERATIONAL_ERROR,
    ],
)
def test_nack_codes_mrc_never_sends_are_refused_even_on_the_right_ev(code: int) -> None:
    """Codes 0, 1 and 3 (and any other an mrc responder never sends): dropped and counted,
    whatever EV they echo; once they failed the QP (six forged packets ended a transfer)."""
    qa, qb, ca, cb = _pair()
    mr = cb.pd.register(bytearray(5000))
    qa.post_write(bytes(3000), mr.addr, mr.rkey)
    out = qa.datagrams_to_send(0.0)
    ev, hdr, _ = out[1]
    psn = int.from_bytes(hdr[9:12], "big")
    base = to_psn(qa.initial_psn, -1)

    def nack(echo: int) -> bytes:
        return wire.pack_ack(qa.qpn, base, wire.AETH_NAK_BASE | code, psn, 0, 0, echo)

    ca.receive_datagram(memoryview(nack(qa.evs.values[(ev + 1) % 8])), 1, 0.0)
    ca.receive_datagram(memoryview(nack(12345)), 1, 0.0)
    for _ in range(6):
        ca.receive_datagram(memoryview(nack(qa.evs.values[ev])), 1, 0.0)
    assert not qa.failed and qa.next_event() is None
    assert qa.stats.nacks_ignored == 8
    assert qa.stats.dropped_by_reason["nack_code_unused"] == 8
    assert qa.stats.retransmits == 0 and qa.requester.in_flight == len(out)
    assert ca.unaccounted() == 0


def test_genuine_out_of_bounds_write_fails_the_sender() -> None:
    """A write that really runs past the region: the receiver refuses the packets outside it,
    and the sender (whose EV the NACK echoes) fails with a clear reason."""
    net = RecordingNetwork(1, Faults(reorder=0.2))
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=4, config=QPConfig(payload_size=100))
    t = make_transfer(net, "a", "b", qa, qb, [1000, 1000], 1)
    t.post(0, 0, b"ok" * 50)
    bad = t.regions[0]
    qa.post_write(b"\xee" * 250, bad.addr + 900, bad.rkey)  # bytes 900..1150 of a 1000 B region
    net.run(max_time=100)
    (fail,) = failures(net)
    assert fail.qpn == qa.qpn and "remote access error" in fail.reason
    assert f"{bad.rkey:#x}" in fail.reason
    assert t.buffers[0][:100] == b"ok" * 50  # the good write before it landed
    # the WRITE is cut into 100-byte packets: the one at 900..1000 is in bounds and may land
    # (RDMA leaves the target of a failed WRITE undefined); the rest was refused
    assert t.buffers[0][100:900] == t.sentinels[0][100:900]
    assert t.buffers[0][900:] in (t.sentinels[0][900:], b"\xee" * 100)
    assert t.buffers[1] == t.sentinels[1]
    assert qb.stats.dropped_by_reason["out_of_bounds"] >= 1


# ---- fuzzing -------------------------------------------------------------------------------


def _fuzz_target() -> tuple[
    EndpointCore, QueuePair, list[bytearray], list[bytes], list[MemoryRegion]
]:
    core = EndpointCore()
    rng = random.Random(0)
    bufs: list[bytearray] = []
    fills: list[bytes] = []
    mrs: list[MemoryRegion] = []
    for n in (300, 1, 4096):
        fill = rng.randbytes(n)
        buf = bytearray(fill)
        bufs.append(buf)
        fills.append(fill)
        mrs.append(core.pd.register(buf))
    qp = QueuePair(
        7,
        core.pd,
        [6000 + i for i in range(4)],
        config=QPConfig(payload_size=64, max_outstanding=64, psn_window=64),
        initial_psn=0xFFFFF0,
    )
    qp.connect(8, wire.PSN_MASK - 3)
    core.add(qp)
    # give the requester some outstanding packets so ACK parsing has state to work on
    qp.post_write(bytes(500), 1 << 40, 1234, imm=1)
    qp.datagrams_to_send(0.0)
    return core, qp, bufs, fills, mrs


_opcodes = st.sampled_from([OP_W, OP_WI, 0x11, 0xC0, 0xC1, 0x04, 0x00, 0xFF])


@st.composite
def _bth_prefixed(draw: st.DrawFn) -> bytes:
    """Bytes that get past the endpoint's demux (TVer 0, QPN 7) more often than pure noise."""
    op = draw(_opcodes)
    rest = draw(st.binary(min_size=0, max_size=120))
    return (
        bytes([op, draw(st.sampled_from([0, 0x10, 0x80]))])
        + b"\xff\xff"
        + bytes([draw(st.integers(0, 255)), 0, 0, 7])
        + rest
    )


@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=200), _bth_prefixed()), min_size=1, max_size=8))
def test_fuzz_arbitrary_bytes_never_raise_or_write(datagrams: list[bytes]) -> None:
    core, qp, bufs, fills, _mrs = _fuzz_target()
    for i, d in enumerate(datagrams):
        core.receive_datagram(memoryview(d), 6000 + (i % 5), float(i))
        qp.datagrams_to_send(float(i))
        while qp.next_event() is not None:
            pass
    # random bytes cannot name a registered rkey (32 random bits), so nothing was written
    assert bufs == [bytearray(f) for f in fills]
    assert qp.stats.bytes_placed == 0


@st.composite
def _write_pkt(draw: st.DrawFn, mrs: list[MemoryRegion]) -> tuple[bytes, dict[str, Any]]:
    mr = draw(st.sampled_from(mrs))
    # near the region: drawn as an offset, since region addresses are random per registration
    near = st.integers(-70, mr.length + 70).map(lambda off: mr.addr + off)
    va = draw(st.one_of(near, st.integers(0, (1 << 64) - 1)))
    length = draw(st.one_of(st.integers(0, 80), st.integers(0, (1 << 32) - 1)))
    real = min(length, 100)
    extra = draw(st.sampled_from([0, 0, 0, -1, 1, -real]))  # trimmed or overlong payloads
    payload = draw(st.binary(min_size=max(0, real + extra), max_size=max(0, real + extra)))
    imm = draw(st.one_of(st.none(), st.integers(0, (1 << 32) - 1)))
    seq = draw(st.integers(-80, 80))
    psn = to_psn(wire.PSN_MASK - 3, seq)
    marks = draw(st.sampled_from([0, 0, 0, wire.BTH_TRIMMED, wire.BTH_FECN]))
    secure = draw(st.booleans()) and draw(st.booleans())
    rkey = mr.rkey if draw(st.integers(0, 9)) else (mr.rkey ^ 1) or 2
    pkt = _data(7, psn, va, rkey, length, payload=payload, imm=imm, marks=marks, secure=secure)
    return pkt, dict(
        mr=mr, va=va, length=length, payload=payload, seq=seq, marks=marks, secure=secure, rkey=rkey
    )


@FUZZ
@given(st.data())
def test_fuzz_writes_only_land_inside_their_region(data: st.DataObject) -> None:
    """Headers with the real rkeys and arbitrary addresses, lengths, PSNs, marks and payloads:
    a write either lands exactly where an in-bounds, untrimmed, in-window, first-seen packet
    says, or not at all; other regions and bytes are never touched."""
    core, qp, bufs, fills, mrs = _fuzz_target()
    expect = [bytearray(f) for f in fills]
    seen: set[int] = set()
    window = qp.config.psn_window
    cum = -1
    placed = 0
    for _ in range(data.draw(st.integers(1, 6))):
        pkt, f = data.draw(_write_pkt(mrs))
        core.receive_datagram(memoryview(pkt), 6001, 0.0)
        qp.datagrams_to_send(0.0)
        region = core.pd.lookup(f["rkey"])
        seq = to_seq(wire.PSN_MASK - 3, to_psn(wire.PSN_MASK - 3, f["seq"]), cum + 1)
        ok = (
            not f["secure"]
            and cum - window < seq <= cum + window
            and not f["marks"] & wire.BTH_TRIMMED
            and len(f["payload"]) == f["length"]
            and region is not None
            and f["va"] - region.addr >= 0
            and f["va"] - region.addr + f["length"] <= region.length
            and seq > cum
            and seq not in seen
        )
        if ok:
            assert region is not None
            off = f["va"] - region.addr
            expect[mrs.index(region)][off : off + f["length"]] = f["payload"]
            placed += f["length"]
            seen.add(seq)
            while cum + 1 in seen:
                cum += 1
        assert bufs == expect
    assert qp.stats.bytes_placed == placed
    assert qp.responder.received_through == cum


# ---- registered memory ---------------------------------------------------------------------


def test_access_rights_and_deregistration_are_enforced() -> None:
    core = EndpointCore()
    qp = QueuePair(9, core.pd, [1000, 1001])
    qp.connect(10, 0)
    core.add(qp)
    ro = bytearray(b"r" * 64)
    gone = bytearray(b"g" * 64)
    ok = bytearray(b"o" * 64)
    mr_ro = core.pd.register(ro, access=Access.LOCAL)
    mr_gone = core.pd.register(gone)
    mr_ok = core.pd.register(ok)
    core.pd.deregister(mr_gone)
    assert core.pd.lookup(mr_gone.rkey) is None
    for i, mr in enumerate((mr_ro, mr_gone, mr_ok)):
        core.receive_datagram(memoryview(_data(9, i, mr.addr, mr.rkey, 8)), 1000, 0.0)
    assert core.all_drops() == {"no_access": 1, "bad_rkey": 1}
    assert ro == b"r" * 64 and gone == b"g" * 64
    assert ok == bytes([EVIL]) * 8 + b"o" * 56
    # the region without write access is refused out loud; the deregistered rkey is unknown
    # now, and an unknown rkey gets no answer (it could be probed otherwise)
    nacks = [wire.parse_ack(d[1]) for d in qp.datagrams_to_send(1.0)]
    assert [a.nack_code for a in nacks if a.is_nack] == [wire.NackCode.REMOTE_ACCESS_ERROR]
    assert core.unaccounted() == 0


def test_unknown_rkey_is_dropped_like_an_unknown_qp() -> None:
    """A WRITE with an rkey the domain does not know leaves no trace but its counter: no
    NACK, no ACK, no PSN or SACK state, no EV evidence, whatever else it says (a trimmed
    header, a duplicate PSN, the next PSN, one far out of the window)."""
    qa, qb, ca, cb = _pair()
    mr = cb.pd.register(bytearray(1000))
    qa.post_write(bytes(100), mr.addr, mr.rkey)
    (ev, hdr, payload) = qa.datagrams_to_send(0.0)[0]
    cb.receive_datagram(memoryview(hdr + bytes(payload)), qa.evs.values[ev], 0.0)
    qb.datagrams_to_send(1.0)  # the ACK of the genuine packet
    qb.datagrams_to_send(1.5)  # and the reverse probe of its EV, a round later
    state = (qb.responder.received_through, dict(qb.responder._blocks), qb.stats.as_dict())
    events = []
    bad = (mr.rkey ^ 0x00010000) or 1
    for psn_off, marks, imm in [(1, 0, None), (0, 0, None), (1, wire.BTH_TRIMMED, 3), (9000, 0, 4)]:
        psn = to_psn(qa.initial_psn, psn_off)
        pkt = _data(qb.qpn, psn, mr.addr, bad, 10, marks=marks, imm=imm)
        cb.receive_datagram(memoryview(pkt), qa.evs.values[0], 2.0)
        assert qb.datagrams_to_send(3.0) == []
        while (e := qb.next_event()) is not None:
            events.append(e)
    assert events == []
    after = qb.stats.as_dict()
    assert after.pop("dropped_by_reason") == {"bad_rkey": 4}
    before = state[2]
    before.pop("dropped_by_reason")
    assert after == before
    assert (qb.responder.received_through, qb.responder._blocks) == state[:2]
    assert cb.unaccounted() == 0


def test_register_rejects_unwritable_buffers_and_accepts_numpy() -> None:
    np = pytest.importorskip("numpy")
    core = EndpointCore()
    with pytest.raises(ValueError):
        core.pd.register(b"read-only bytes")
    with pytest.raises(ValueError):
        core.pd.register(np.zeros((8, 8), dtype=np.uint8)[:, ::2])
    with pytest.raises(TypeError):
        core.pd.register(12345)
    arr = np.zeros(16, dtype=np.float64)
    mr = core.pd.register(arr)
    assert mr.length == 128
    other = core.pd.register(bytearray(10))
    assert other.addr >= mr.addr + mr.length  # address ranges never overlap
    qp = QueuePair(9, core.pd, [1000])
    qp.connect(10, 0)
    core.add(qp)
    payload = np.arange(4, dtype=np.float64).tobytes()
    core.receive_datagram(memoryview(_data(9, 0, mr.addr + 64, mr.rkey, 32, payload)), 1000, 0)
    assert arr.tolist() == [0.0] * 8 + [0.0, 1.0, 2.0, 3.0] + [0.0] * 4
