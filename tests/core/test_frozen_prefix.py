"""A region frozen below a point (MemoryRegion.freeze): nothing new is placed there any more.

The receiver of a transfer hashes the prefix its sender marked written while the rest still
arrives (mrc/app/transfer.py), so a byte below the point must never change after it: a WRITE of
new data starting there is refused as one to a closed region is (``region_closed``, a
REMOTE_ACCESS_ERROR NACK), whoever sent it and whichever PSN it carries, through the train
kernel (native and Python) and through ``on_data`` alike; a retransmission of what was placed
there is still a duplicate, acknowledged as before; the rest of the region is written as
before.
"""

from __future__ import annotations

import pytest

from mrc import wire
from mrc.core import Access, EndpointCore, ProtectionDomain, QPConfig, QueuePair
from mrc.core.memory import MemoryRegion
from mrc.core.psn import to_psn

P = 64  # payload of a segment; seq s writes slot s unless told otherwise
S = wire.DATA_HDR_LEN + P
QPN, PEER_QPN = 7, 0x123
IPSN = wire.PSN_MASK - 3  # sequence numbers cross the 24-bit wrap
SLOTS = 32
EVIL = b"\xee" * P


def _segment(
    mr: MemoryRegion, seq: int, slot: int, payload: bytes, imm: int | None = None
) -> bytes:
    hdr = wire.pack_data(
        QPN, to_psn(IPSN, seq), mr.addr + slot * P, mr.rkey, len(payload), False, imm
    )
    return hdr + payload


def _receiver() -> tuple[EndpointCore, QueuePair, MemoryRegion, bytearray]:
    pd = ProtectionDomain()
    region = bytearray(SLOTS * P)
    mr = pd.register(region, Access.REMOTE_WRITE, "r")
    core = EndpointCore(pd)
    cfg = QPConfig(payload_size=P, ack_every=1, reverse_probe_interval=0.0)
    qp = QueuePair(QPN, pd, list(range(5000, 5008)), None, cfg)
    qp.connect(PEER_QPN, IPSN)
    core.add(qp)
    return core, qp, mr, region


def _feed(core: EndpointCore, segments: list[bytes], mode: str) -> None:
    """One receive of ``segments`` as a train, or each alone through receive_datagram."""
    if mode == "train":
        core.receive_train(memoryview(b"".join(segments)), S, 1, 0.0)
    else:
        for seg in segments:
            core.receive_datagram(memoryview(seg), 1, 0.0)


def _nacks(qp: QueuePair) -> list[tuple[int, int]]:
    """(code, subject sequence number) of the NACKs the receiver sends now."""
    acks = [wire.parse_ack(d[1]) for d in qp.datagrams_to_send(1.0)]
    return [(a.nack_code, (a.subject_psn - IPSN) & wire.PSN_MASK) for a in acks if a.is_nack]


@pytest.mark.parametrize("mode", ["train", "single"])
def test_new_data_below_the_frozen_point_is_refused_and_the_rest_is_placed(
    rx_impl: str, mode: str
) -> None:
    core, qp, mr, region = _receiver()
    first = [bytes([s + 1]) * P for s in range(8)]
    _feed(core, [_segment(mr, s, s, first[s]) for s in range(8)], mode)
    assert qp.responder.received_through == 7
    mr.freeze(5 * P)
    assert (mr.frozen, len(mr.open_view), mr.open_addr) == (5 * P, (SLOTS - 5) * P, mr.addr + 5 * P)
    _nacks(qp)  # (the ACKs of what came before)
    # new PSNs: one into the frozen prefix between two above it; a retransmission of seq 3
    # (placed at slot 3, below the point) between them too
    _feed(
        core,
        [
            _segment(mr, 8, 8, b"a" * P),
            _segment(mr, 9, 2, EVIL),
            _segment(mr, 3, 3, first[3]),
            _segment(mr, 10, 9, b"b" * P),
        ],
        mode,
    )
    assert bytes(region[: 8 * P]) == b"".join(first)  # nothing below the point changed
    assert bytes(region[8 * P : 10 * P]) == b"a" * P + b"b" * P
    assert core.all_drops() == {"region_closed": 1}
    assert qp.stats.duplicates == 1
    assert _nacks(qp) == [(wire.NackCode.REMOTE_ACCESS_ERROR, 9)]
    # seq 9 was not taken: its genuine copy, above the point, is placed when it comes
    _feed(core, [_segment(mr, 9, 10, b"c" * P)], mode)
    assert bytes(region[10 * P : 11 * P]) == b"c" * P
    assert qp.responder.received_through == 10
    assert qp.responder.fast_placed == (11 if mode == "train" else 0)  # the kernel took part
    assert core.unaccounted() == 0


def test_a_write_straddling_the_point_and_an_empty_one_below_it() -> None:
    """A write that starts below the point is refused even if it ends above it; one of no
    bytes changes nothing, so it is taken (a WRITE_IMM that only says something)."""
    core, qp, mr, region = _receiver()
    mr.freeze(2 * P)
    straddling = wire.pack_data(QPN, to_psn(IPSN, 0), mr.addr + P, mr.rkey, 2 * P, False, None)
    core.receive_datagram(memoryview(straddling + EVIL * 2), 1, 0.0)
    assert core.all_drops() == {"region_closed": 1} and region == bytes(SLOTS * P)
    core.receive_datagram(memoryview(_segment(mr, 1, 0, b"", imm=0x1234)), 1, 0.0)
    assert qp.stats.bytes_placed == 0 and qp.responder.received_through == -1  # 0 is missing
    core.receive_datagram(memoryview(_segment(mr, 0, 4, b"d" * P)), 1, 0.0)
    assert qp.responder.received_through == 1
    assert region[4 * P : 5 * P] == b"d" * P


def test_freeze_only_rises_and_deregistering_lets_go_of_the_buffer() -> None:
    pd = ProtectionDomain()
    buf = bytearray(100)
    mr = pd.register(buf)
    mr.freeze(40)
    mr.freeze(10)  # lower: nothing changes
    assert mr.frozen == 40 and mr.open_addr == mr.addr + 40 and len(mr.open_view) == 60
    mr.freeze(100)
    assert len(mr.open_view) == 0
    with pytest.raises(ValueError):
        mr.freeze(101)
    pd.deregister(mr)
    buf.append(0)  # no view of it is left (a BufferError otherwise)
