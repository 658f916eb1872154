"""Wire format: header sizes, pack/parse round trips, and 24-bit PSN arithmetic."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrc import wire
from mrc.core.psn import to_psn, to_seq

from .mrcsim_harness import fuzz_settings

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u24 = st.integers(0, wire.PSN_MASK)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, (1 << 64) - 1)
qpns = st.integers(1, wire.QPN_MASK)


def test_header_sizes() -> None:
    assert wire.BTH_LEN == 12
    assert wire.DATA_HDR_LEN == 28
    assert wire.DATA_IMM_HDR_LEN == 32
    assert wire.ACK_LEN == 40
    assert wire.PROBE_LEN == 28
    assert len(wire.pack_data(1, 0, 0, 0, 0, False, None)) == 28
    assert len(wire.pack_data(1, 0, 0, 0, 0, False, 5)) == 32
    assert len(wire.pack_ack(1, 0, wire.AETH_ACK, 0, 0, 0, 0)) == 40
    assert len(wire.pack_probe(1, 0, 0, 0, False)) == 28


def test_constants_match_roce() -> None:
    assert wire.DEFAULT_PORT == 4791
    assert int(wire.Opcode.RDMA_WRITE_ONLY) == 0x0A
    assert int(wire.Opcode.RDMA_WRITE_ONLY_IMM) == 0x0B
    assert int(wire.Opcode.ACKNOWLEDGE) == 0x11
    assert wire.PSN_MASK == 0xFFFFFF
    # NAK syndromes are 0b011xxxxx; every NACK code fits the five low bits
    for code in wire.NackCode:
        syn = wire.AETH_NAK_BASE | code
        assert syn >> 5 == 0b011 and syn & 0x1F == code
    assert wire.AETH_ACK >> 5 == 0  # an ACK syndrome is never mistaken for a NAK


def test_data_header_known_bytes() -> None:
    hdr = wire.pack_data(0x123456, 0xABCDEF, 0x0102030405060708, 0xDEADBEEF, 1400, True, None)
    assert hdr == bytes.fromhex(
        "0a00ffff"  # opcode WRITE ONLY, TVer 0, pkey
        "00123456"  # marks 0, dest QP
        "80abcdef"  # AckReq, PSN
        "0102030405060708"  # RETH VA
        "deadbeef"  # rkey
        "00000578"  # DMA length 1400
    )
    imm = wire.pack_data(1, 2, 3, 4, 0, False, 0xCAFEBABE)
    assert imm[0] == wire.Opcode.RDMA_WRITE_ONLY_IMM
    assert imm[8] == 0  # no AckReq
    assert imm[-4:] == bytes.fromhex("cafebabe")


@fuzz_settings()
@given(qpn=qpns, psn=u24, va=u64, rkey=u32, length=u32, ackreq=st.booleans())
def test_data_round_trip(qpn: int, psn: int, va: int, rkey: int, length: int, ackreq: bool) -> None:
    hdr = wire.pack_data(qpn, psn, va, rkey, length, ackreq, None)
    op, f1, pkey, qpw, psnw, va2, rkey2, len2 = wire.DATA_HDR.unpack(hdr)
    assert op == wire.Opcode.RDMA_WRITE_ONLY
    assert f1 & 0x0F == wire.MRC_TVER and pkey == wire.DEFAULT_PKEY
    assert qpw & wire.QPN_MASK == qpn and qpw >> 24 == 0
    assert psnw & wire.PSN_MASK == psn
    assert bool(psnw & (wire.BTH_ACKREQ << 24)) == ackreq
    assert not psnw & (wire.BTH_SECURE << 24)
    assert (va2, rkey2, len2) == (va, rkey, length)


@fuzz_settings()
@given(qpn=qpns, psn=u24, va=u64, rkey=u32, length=u32, ackreq=st.booleans(), imm=u32)
def test_data_imm_round_trip(
    qpn: int, psn: int, va: int, rkey: int, length: int, ackreq: bool, imm: int
) -> None:
    hdr = wire.pack_data(qpn, psn, va, rkey, length, ackreq, imm)
    op, _f1, _pk, qpw, psnw, va2, rkey2, len2, imm2 = wire.DATA_IMM_HDR.unpack(hdr)
    assert op == wire.Opcode.RDMA_WRITE_ONLY_IMM
    assert qpw & wire.QPN_MASK == qpn
    assert psnw & wire.PSN_MASK == psn
    assert bool(psnw >> 31) == ackreq
    assert (va2, rkey2, len2, imm2) == (va, rkey, length, imm)


@fuzz_settings()
@given(
    qpn=qpns,
    ack_psn=u24,
    code=st.sampled_from([None, *wire.NackCode]),
    subj=u24,
    base=u24,
    bitmap=u64,
    ev=u32,
    ports=u16,
)
def test_ack_nack_round_trip(
    qpn: int,
    ack_psn: int,
    code: int | None,
    subj: int,
    base: int,
    bitmap: int,
    ev: int,
    ports: int,
) -> None:
    syndrome = wire.AETH_ACK if code is None else wire.AETH_NAK_BASE | code
    pkt = wire.pack_ack(qpn, ack_psn, syndrome, subj, base, bitmap, ev, ports)
    assert pkt[0] == wire.Opcode.ACKNOWLEDGE and len(pkt) == wire.ACK_LEN
    a = wire.parse_ack(pkt)
    assert a == wire.Ack(qpn, ack_psn, syndrome, subj, base, bitmap, ev, ports)
    assert a.is_nack == (code is not None)
    if code is not None:
        assert a.nack_code == code
    # the parser reads only the first ACK_LEN bytes and accepts memoryviews
    assert wire.parse_ack(memoryview(pkt + b"trailing")) == a


def test_ack_default_port_state_and_short_parse() -> None:
    pkt = wire.pack_ack(7, 1, wire.AETH_ACK, 1, 0, 1, 4242)
    assert wire.parse_ack(pkt).port_state == 0xFFFF
    for n in (0, 12, 39):
        with pytest.raises(struct.error):
            wire.parse_ack(pkt[:n])


@fuzz_settings()
@given(qpn=qpns, seq=st.integers(0, (1 << 32) - 1), ev=u32, token=u64, reply=st.booleans())
def test_probe_round_trip(qpn: int, seq: int, ev: int, token: int, reply: bool) -> None:
    pkt = wire.pack_probe(qpn, seq, ev, token, reply)
    assert len(pkt) == wire.PROBE_LEN
    op, f1, _pk, qpw, psnw, ev2, flags, reserved, token2 = wire.PROBE_PKT.unpack(pkt)
    assert op == (wire.Opcode.PROBE_REPLY if reply else wire.Opcode.PROBE)
    assert f1 & 0x0F == wire.MRC_TVER
    assert qpw == qpn
    assert psnw == seq & wire.PSN_MASK  # masked to 24 bits; no flag bits leak in
    assert (ev2, flags, reserved, token2) == (ev, 0, 0, token)


# ---- PSN arithmetic ------------------------------------------------------------------------


def test_to_psn_wraps() -> None:
    assert to_psn(0xFFFFFF, 0) == 0xFFFFFF
    assert to_psn(0xFFFFFF, 1) == 0
    assert to_psn(0xFFFFF0, 0x20) == 0x10
    assert to_psn(5, -6) == 0xFFFFFF  # seq -1 relative: "nothing received yet"
    assert to_psn(0, 1 << 24) == 0


def test_to_seq_examples_across_wrap() -> None:
    ip = 0xFFFFF0
    assert to_seq(ip, 0xFFFFF0, 0) == 0
    assert to_seq(ip, 0x00000F, 0) == 0x1F  # after the wrap
    assert to_seq(ip, 0xFFFFEF, 0) == -1  # just before the first PSN
    assert to_seq(ip, 0x00000F, 1 << 24) == (1 << 24) + 0x1F  # second lap
    # the half-way boundary: exactly -2^23 is behind, 2^23 - 1 ahead
    assert to_seq(0, 1 << 23, 0) == -(1 << 23)
    assert to_seq(0, (1 << 23) - 1, 0) == (1 << 23) - 1


@fuzz_settings()
@given(
    ip=u24,
    near=st.integers(0, 1 << 40),
    delta=st.integers(-(1 << 23), (1 << 23) - 1),
)
def test_to_seq_inverts_to_psn_within_half_space(ip: int, near: int, delta: int) -> None:
    seq = near + delta
    psn = to_psn(ip, seq)
    assert 0 <= psn <= wire.PSN_MASK
    assert to_seq(ip, psn, near) == seq


@fuzz_settings()
@given(ip=u24, near=st.integers(0, 1 << 30), psn=u24)
def test_to_seq_is_closest_representative(ip: int, near: int, psn: int) -> None:
    seq = to_seq(ip, psn, near)
    assert to_psn(ip, seq) == psn
    assert -(1 << 23) <= seq - near < (1 << 23)


@fuzz_settings()
@given(ip=u24, start=st.integers(0, 1 << 30), n=st.integers(1, 5000))
def test_consecutive_psns_across_wrap(ip: int, start: int, n: int) -> None:
    """Sequence numbers map to consecutive PSNs mod 2^24 and back, whatever the start."""
    first = to_psn(ip, start)
    for seq in range(start + 1, start + n, max(1, n // 50)):
        psn = to_psn(ip, seq)
        assert psn == (first + (seq - start)) & wire.PSN_MASK
        assert to_seq(ip, psn, seq - 1) == seq
        assert to_seq(ip, psn, start) == seq
    assert to_psn(ip, start + n) == (to_psn(ip, start) + n) & wire.PSN_MASK
