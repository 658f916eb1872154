"""mrc.scapy_layers: scapy decodes what mrc.wire and the Sealer pack, field for field, and
builds byte-identical datagrams from fields.

Real datagrams made by the project's own packers (and sealed by ``Sealer``) go through
IPv6/UDP, a pcap file and back; truncated ones must decode what is there without raising.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrc import wire
from mrc.security.packet import SEC_BLOCK_LEN, DirectionKeys, Mode, Sealer

scapy_layers = pytest.importorskip("mrc.scapy_layers")
from scapy.layers.inet import UDP  # noqa: E402
from scapy.layers.inet6 import IPv6  # noqa: E402
from scapy.packet import Raw  # noqa: E402
from scapy.utils import rdpcap, wrpcap  # noqa: E402

L = scapy_layers
QPN = 0x1A2B3C
BITMAP = 0xF0F0_0000_FFFF_0001
SACK_BASE = 0xFFFFF0
TOKEN = (0xA1B2C3 << 40) | 0x12_3456_789A
KEYS = DirectionKeys(key_id=0xC001D00D, header_key=bytes(range(16)), payload_key=bytes(16))
#: 32-bit EVs whose two halves (UDP source port, flow label bits) differ
EV1 = wire.ev_value(50001, 0xBEEF)
EV2 = wire.ev_value(50002, 0x0001)


def _frame(datagram: bytes, sport: int = 50001, dport: int = wire.DEFAULT_PORT) -> IPv6:
    """The datagram as it would be captured, decoded again from bytes."""
    return IPv6(
        bytes(IPv6(src="fd00::1", dst="fd00::2") / UDP(sport=sport, dport=dport) / datagram)
    )


def test_write_with_immediate_and_its_payload() -> None:
    payload = bytes(range(64))
    d = wire.pack_data(QPN, 0xABCDEF, 0x1_0000_2000, 0xDEADBEEF, 64, True, 0xCAFEBABE) + payload
    p = _frame(d)
    bth = p[L.MRCBTH]
    assert (bth.opcode, bth.dqpn, bth.psn, bth.ackreq, bth.secure) == (0x0B, QPN, 0xABCDEF, 1, 0)
    assert bth.tlp == 0
    probe = bytearray(d)
    probe[8] |= wire.BTH_TLP  # a tail loss probe's copy
    assert _frame(bytes(probe))[L.MRCBTH].tlp == 1
    assert "[P]" in _frame(bytes(probe))[L.MRCBTH].mysummary()
    assert (p[L.MRCRETH].va, p[L.MRCRETH].rkey, p[L.MRCRETH].dma_len) == (
        0x1_0000_2000,
        0xDEADBEEF,
        64,
    )
    assert p[L.MRCImmDt].imm == 0xCAFEBABE
    assert p[Raw].load == payload
    assert "RDMA_WRITE_ONLY_IMM" in p.summary()


def test_trimmed_header_keeps_its_marks_and_dma_length() -> None:
    cut = bytearray(wire.pack_data(QPN, 0x42, 0x1_0000_0000, 0x1234_5678, 1400, False, None))
    cut[4] |= wire.BTH_TRIMMED | wire.BTH_LASTHOP | wire.BTH_FECN
    p = _frame(bytes(cut))
    bth = p[L.MRCBTH]
    assert (bth.trimmed, bth.lasthop, bth.fecn, bth.becn) == (1, 1, 1, 0)
    assert p[L.MRCRETH].dma_len == 1400 and Raw not in p
    assert "[TL]" in p.summary()


@pytest.mark.parametrize("code", [None, *wire.NackCode])
def test_ack_and_every_nak_code_from_the_receiver(code: wire.NackCode | None) -> None:
    syndrome = wire.AETH_ACK if code is None else wire.AETH_NAK_BASE | code
    d = bytearray(wire.pack_ack(QPN, 0x123, syndrome, 0x125, SACK_BASE, BITMAP, EV1, 0xFFFD))
    d[4] |= wire.BTH_BECN
    p = _frame(bytes(d), sport=wire.DEFAULT_PORT, dport=50001)  # ACKs come from the port
    ack = p[L.MRCAck]
    assert p[L.MRCBTH].psn == 0x123 and p[L.MRCBTH].becn == 1
    assert (ack.subject_psn, ack.sack_base, ack.bitmap, ack.ev, ack.port_state) == (
        0x125,
        SACK_BASE,
        BITMAP,
        EV1,
        0xFFFD,
    )
    assert (ack.ev_port, ack.ev_label, ack.ack_delay) == (50001, 0xBEEF, 0)
    assert bytes(d)[32:36] == EV1.to_bytes(4, "big") and Raw not in p  # all 40 bytes decoded
    assert "ev=50001/0xbeef" in ack.mysummary()
    assert ack.is_nak is (code is not None) and ack.nak_code == code
    assert len(ack) == wire.ACK_LEN - wire.BTH_LEN
    want = [(SACK_BASE + i) % (1 << 24) for i in range(64) if BITMAP >> i & 1]
    assert ack.sacked_psns() == want and ack.sacked_psns()[1] == 0  # wrapped at 2**24
    parsed = wire.parse_ack(bytes(d))
    assert (parsed.syndrome, parsed.nack_code if parsed.is_nack else None) == (
        ack.syndrome,
        ack.nak_code,
    )


@pytest.mark.parametrize("reply", [False, True])
def test_probe_and_reply(reply: bool) -> None:
    p = _frame(wire.pack_probe(QPN, 7, EV2, TOKEN, reply=reply))
    assert p[L.MRCBTH].opcode == (0xC1 if reply else 0xC0) and p[L.MRCBTH].psn == 7
    probe = p[L.MRCProbe]
    assert (probe.ev, probe.token, probe.tag, probe.time_us) == (
        EV2,
        TOKEN,
        0xA1B2C3,
        0x12_3456_789A,
    )
    assert (probe.ev_port, probe.ev_label, probe.flags, probe.reserved) == (50002, 1, 0, 0)
    assert len(probe) == wire.PROBE_LEN - wire.BTH_LEN and Raw not in p


@pytest.mark.parametrize("mode", list(Mode))
def test_sealed_data_carries_its_security_block(mode: Mode) -> None:
    sealer = Sealer(KEYS, mode)
    sealer.counter = 41
    payload = bytes(range(48))
    head, rest = sealer.seal_pair(
        wire.pack_data(QPN, 0x50, 0x1_0000_8000, 0xFEED, 48, True, None), payload
    )
    whole = head + bytes(rest)
    p = _frame(whole)
    assert p[L.MRCBTH].secure == 1
    sec = p[L.MRCSecurity]
    hdr = wire.DATA_HDR_LEN
    assert (sec.key_id, sec.counter, sec.header_icv) == (
        0xC001D00D,
        42,
        whole[hdr + 12 : hdr + SEC_BLOCK_LEN],
    )
    assert p[Raw].load == whole[hdr + SEC_BLOCK_LEN :]  # payload and its ICV, either order


def test_sealed_ack_and_probe() -> None:
    head, _ = Sealer(KEYS, Mode.ENCRYPT).seal_pair(
        wire.pack_ack(QPN, 0x77, wire.AETH_ACK, 0x78, SACK_BASE, BITMAP, EV1, 0xFFFE), None
    )
    p = _frame(head)
    assert (p[L.MRCAck].ev, p[L.MRCAck].port_state) == (EV1, 0xFFFE)
    assert p[L.MRCSecurity].counter == 1
    assert p[L.MRCSecurity].header_icv == head[wire.ACK_LEN + 12 : wire.ACK_LEN + SEC_BLOCK_LEN]
    head, _ = Sealer(KEYS, Mode.INTEGRITY).seal_pair(
        wire.pack_probe(QPN, 3, EV2, TOKEN, reply=False), None
    )
    p = _frame(head)
    assert (p[L.MRCProbe].ev, p[L.MRCProbe].token) == (EV2, TOKEN)
    assert p[L.MRCSecurity].key_id == 0xC001D00D
    assert p[L.MRCSecurity].header_icv == head[wire.PROBE_LEN + 12 : wire.PROBE_LEN + SEC_BLOCK_LEN]


def test_every_truncation_decodes_what_is_there() -> None:
    sealer = Sealer(KEYS, Mode.INTEGRITY)
    head, rest = sealer.seal_pair(
        wire.pack_data(QPN, 0x51, 0x1_0000_9000, 0xFEED, 32, False, 0x1234), bytes(32)
    )
    whole = head + bytes(rest)
    for n in range(len(whole) + 1):
        p = _frame(whole[:n])
        if n >= wire.BTH_LEN:
            assert p[L.MRCBTH].dqpn == QPN and p[L.MRCBTH].psn == 0x51
        if n >= wire.DATA_IMM_HDR_LEN:
            assert p[L.MRCImmDt].imm == 0x1234
        if n >= wire.DATA_IMM_HDR_LEN + SEC_BLOCK_LEN:
            assert p[L.MRCSecurity].key_id == 0xC001D00D


def test_a_pcap_round_trip_and_another_port(tmp_path: Path) -> None:
    L.bind_port(18515)
    frames = [
        _frame(wire.pack_probe(QPN, 1, EV1, TOKEN, reply=False)),
        _frame(wire.pack_probe(QPN, 2, EV2, TOKEN, reply=True), dport=18515),
    ]
    path = tmp_path / "mrc.pcap"
    wrpcap(str(path), frames)
    back = rdpcap(str(path))
    assert [p[L.MRCProbe].ev for p in back] == [EV1, EV2]
    assert [p[L.MRCBTH].psn for p in back] == [1, 2]


psn24 = st.integers(0, (1 << 24) - 1)


@given(
    qpn=psn24,
    psn=psn24,
    va=st.integers(0, (1 << 64) - 1),
    rkey=st.integers(0, (1 << 32) - 1),
    length=st.integers(0, (1 << 32) - 1),
    ackreq=st.booleans(),
    imm=st.none() | st.integers(0, (1 << 32) - 1),
)
def test_data_headers_built_by_scapy_equal_mrc_wire(
    qpn: int, psn: int, va: int, rkey: int, length: int, ackreq: bool, imm: int | None
) -> None:
    op = wire.Opcode.RDMA_WRITE_ONLY if imm is None else wire.Opcode.RDMA_WRITE_ONLY_IMM
    pkt = L.MRCBTH(opcode=op, dqpn=qpn, psn=psn, ackreq=int(ackreq)) / L.MRCRETH(
        va=va, rkey=rkey, dma_len=length
    )
    if imm is not None:
        pkt = pkt / L.MRCImmDt(imm=imm)
    assert bytes(pkt) == wire.pack_data(qpn, psn, va, rkey, length, ackreq, imm)


@given(
    qpn=psn24,
    ack_psn=psn24,
    syndrome=st.integers(0, 255),
    subject=st.integers(0, (1 << 32) - 1),
    base=st.integers(0, (1 << 32) - 1),
    bitmap=st.integers(0, (1 << 64) - 1),
    ev=st.integers(0, (1 << 32) - 1),
    ports=st.integers(0, 65535),
)
def test_acks_built_by_scapy_equal_mrc_wire(
    qpn: int, ack_psn: int, syndrome: int, subject: int, base: int, bitmap: int, ev: int, ports: int
) -> None:
    pkt = L.MRCBTH(dqpn=qpn, psn=ack_psn) / L.MRCAck(
        syndrome=syndrome,
        subject_dup=subject >> 31,  # the D flag (wire.ACK_SUBJECT_DUP)
        subject_zero=(subject >> 24) & 0x7F,
        subject_psn=subject & 0xFFFFFF,
        sack_base=base,
        bitmap=bitmap,
        ev=ev,
        port_state=ports,
    )
    assert bytes(pkt) == wire.pack_ack(qpn, ack_psn, syndrome, subject, base, bitmap, ev, ports)


@given(
    qpn=psn24,
    seq=psn24,
    ev=st.integers(0, (1 << 32) - 1),
    token=st.integers(0, (1 << 64) - 1),
    reply=st.booleans(),
)
def test_probes_built_by_scapy_equal_mrc_wire(
    qpn: int, seq: int, ev: int, token: int, reply: bool
) -> None:
    op = wire.Opcode.PROBE_REPLY if reply else wire.Opcode.PROBE
    pkt = L.MRCBTH(opcode=op, dqpn=qpn, psn=seq) / L.MRCProbe(ev=ev, token=token)
    assert bytes(pkt) == wire.pack_probe(qpn, seq, ev, token, reply=reply)
