"""Which 64-PSN blocks an ACK flush reports (docs/PROTOCOL.md section 6, "What an ACK flush
sends"): a block wholly at or below the cumulative point gets no ACK of its own when another
block of the flush gets one, whose ACK PSN acknowledges it; a duplicate in such a block later
blames the EV of the ACK that did go. Two QPs driven by hand, PSNs across the 24-bit wrap."""

from __future__ import annotations

from mrc import wire
from mrc.core import QPConfig, QueuePair, WriteCompleted
from mrc.core.events import Datagram
from mrc.core.memory import ProtectionDomain

IPSN_B = 77  # the receiver's own; the sender's is at the wrap (below)


def _pair() -> tuple[QueuePair, QueuePair, int, int]:
    """A sender and a receiver whose ACKs fall due only at the end of the WR (AckReq), so
    that one flush sees every arrival; (a, b, region addr, rkey)."""
    cfg = QPConfig(payload_size=100, cc="fixed", ack_every=1000, ack_batch_max=1000)
    pd_b = ProtectionDomain()
    qa = QueuePair(
        5,
        ProtectionDomain(),
        [40000 + i for i in range(4)],
        config=cfg,
        initial_psn=wire.PSN_MASK - 20,
    )
    qb = QueuePair(6, pd_b, [50000 + i for i in range(4)], config=cfg, initial_psn=IPSN_B)
    qa.connect(qb.qpn, IPSN_B)
    qb.connect(qa.qpn, wire.PSN_MASK - 20)
    mr = pd_b.register(bytearray(20_000))
    return qa, qb, mr.addr, mr.rkey


def _send_all(qa: QueuePair, qb: QueuePair, skip: tuple[int, ...] = ()) -> list[Datagram]:
    """Every datagram of what qa has to send, delivered to qb except the indices in
    ``skip``; returns them all."""
    out: list[Datagram] = []
    while batch := qa.datagrams_to_send(0.0):
        out += batch
    for i, (ev, hdr, payload) in enumerate(out):
        if i not in skip:
            qb.receive_datagram(memoryview(bytes(hdr) + bytes(payload)), qa.evs.values[ev], 0.0)
    return out


def _psn(seq: int) -> int:
    return (wire.PSN_MASK - 20 + seq) & wire.PSN_MASK


def test_a_flush_over_two_complete_blocks_sends_one_ack() -> None:
    qa, qb, addr, rkey = _pair()
    data = bytes(range(256)) * 39  # 9984 bytes: 100 packets, sequence numbers 0-99
    qa.post_write(data, addr, rkey)
    out = _send_all(qa, qb)
    assert len(out) == 100
    acks = qb.datagrams_to_send(0.001)
    # blocks 0 (0-63) and 1 (64-99) saw arrivals; block 0 is wholly below the cumulative
    # point (99), so only block 1 is reported (before: one ACK each)
    assert len(acks) == 1 and qb.stats.acks_sent == 1
    a = wire.parse_ack(acks[0][1])
    assert a.ack_psn == _psn(99) and a.subject_psn == _psn(99)
    assert a.sack_base == _psn(64) and a.bitmap == (1 << 36) - 1
    # it acknowledges everything: the write completes
    ev, hdr, _ = acks[0]
    qa.receive_datagram(memoryview(hdr), qb.evs.values[ev], 0.001)
    done = []
    while (e := qa.next_event()) is not None:
        done.append(e)
    assert [type(e) for e in done] == [WriteCompleted]
    assert not qa.requester._outstanding


def test_a_hole_keeps_its_block_reported() -> None:
    qa, qb, addr, rkey = _pair()
    qa.post_write(bytes(9984), addr, rkey)
    _send_all(qa, qb, skip=(70,))
    acks = [wire.parse_ack(hdr) for _ev, hdr, _p in qb.datagrams_to_send(0.001)]
    # cumulative point 69: block 0 is covered by it, block 1 has the hole and is reported
    assert [(a.ack_psn, a.sack_base) for a in acks] == [(_psn(69), _psn(64))]
    assert acks[0].bitmap == ((1 << 36) - 1) & ~(1 << 6)


def test_one_complete_block_alone_is_still_reported() -> None:
    qa, qb, addr, rkey = _pair()
    qa.post_write(bytes(6400), addr, rkey)  # 64 packets: block 0 exactly
    _send_all(qa, qb)
    acks = [wire.parse_ack(hdr) for _ev, hdr, _p in qb.datagrams_to_send(0.001)]
    assert [(a.ack_psn, a.sack_base, a.bitmap) for a in acks] == [(_psn(63), _psn(0), 2**64 - 1)]


def test_a_duplicate_in_a_covered_block_blames_the_ack_that_went() -> None:
    qa, qb, addr, rkey = _pair()
    qa.post_write(bytes(9984), addr, rkey)
    out = _send_all(qa, qb)
    ((ack_ev, _hdr, _p),) = qb.datagrams_to_send(0.001)
    blamed: list[int] = []
    qb.evs.ack_lost = lambda ev, now, span: blamed.append(ev)  # type: ignore[method-assign]
    # packet 10 (block 0, acknowledged only by that ACK's ACK PSN) comes again, well after
    # the ACK left: the ACK is taken for lost, on its own EV
    ev, hdr, payload = out[10]
    later = 0.001 + 10 * qb.config.tlp_min
    qb.receive_datagram(memoryview(bytes(hdr) + bytes(payload)), qa.evs.values[ev], later)
    assert qb.stats.duplicates == 1
    assert blamed == [ack_ev]
