"""Protected datagrams: round trips, every kind of tampering, trimming, replays."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrc import wire
from mrc.security.handshake import new_nonce, session_keys, transcript
from mrc.security.packet import (
    ICV_LEN,
    SEC_BLOCK_LEN,
    DirectionKeys,
    Mode,
    Opener,
    ReplayWindow,
    Sealer,
    SecurityDrop,
)

KEY = bytes(range(32))


def _keys() -> DirectionKeys:
    fwd, _ = session_keys(KEY, transcript(new_nonce(), new_nonce(), b"qp"))
    return fwd


def _data_headers(psn: int = 5, length: int = 64) -> bytes:
    return wire.pack_data(0x123456, psn, 0x1000, 0xABCD, length, False, None)


def _seal(sealer: Sealer, payload: bytes | None, headers: bytes | None = None) -> bytearray:
    hdr = headers if headers is not None else _data_headers(length=len(payload or b""))
    return bytearray(b"".join(bytes(b) for b in sealer.seal(hdr, payload)))


@pytest.mark.parametrize("mode", list(Mode))
def test_data_round_trip(mode: Mode) -> None:
    keys = _keys()
    sealer, opener = Sealer(keys, mode), Opener(keys, mode)
    payload = os.urandom(8192)
    pkt = _seal(sealer, payload)
    hlen = wire.DATA_HDR_LEN
    assert len(pkt) == hlen + SEC_BLOCK_LEN + len(payload) + ICV_LEN
    assert pkt[8] & wire.BTH_SECURE
    # integrity: the payload ICV right after the security block, then the payload in clear;
    # encrypt: the ciphertext there, its tag at the end
    clear_at = hlen + SEC_BLOCK_LEN + ICV_LEN
    assert (bytes(pkt[clear_at : clear_at + 64]) == payload[:64]) is (mode is Mode.INTEGRITY)
    assert payload[:64] not in bytes(pkt) or mode is Mode.INTEGRITY
    ctr = opener.open_headers(memoryview(pkt), hlen)
    assert bytes(opener.open_payload(memoryview(pkt), hlen, ctr)) == payload
    opener.accept(ctr)
    with pytest.raises(SecurityDrop) as exc:
        opener.open_headers(memoryview(pkt), hlen)
    assert exc.value.reason == "security_replay"


@pytest.mark.parametrize("mode", list(Mode))
def test_every_flipped_byte_is_caught(mode: Mode) -> None:
    """Flip the lowest bit of each byte: the header or the payload check fails."""
    keys = _keys()
    sealer = Sealer(keys, mode)
    pkt = _seal(sealer, os.urandom(48))
    hlen = wire.DATA_HDR_LEN
    for i in range(len(pkt)):
        bad = bytearray(pkt)
        bad[i] ^= 0x01  # BTH byte 4: only its high bits are left to switches
        opener = Opener(keys, mode)
        with pytest.raises(SecurityDrop) as exc:
            ctr = opener.open_headers(memoryview(bad), hlen)
            opener.open_payload(memoryview(bad), hlen, ctr)
        assert exc.value.reason.startswith("security_"), i


def test_switch_marks_and_trimming_keep_headers_authentic() -> None:
    keys = _keys()
    sealer, opener = Sealer(keys, Mode.INTEGRITY), Opener(keys, Mode.INTEGRITY)
    pkt = _seal(sealer, os.urandom(1000))
    hlen = wire.DATA_HDR_LEN
    trimmed = pkt[: hlen + SEC_BLOCK_LEN]  # what a trimming switch forwards
    trimmed[4] |= wire.BTH_TRIMMED | wire.BTH_LASTHOP | wire.BTH_FECN  # what switches set
    ctr = opener.open_headers(memoryview(trimmed), hlen)
    assert ctr == 1
    with pytest.raises(SecurityDrop, match="security_short"):
        opener.open_payload(memoryview(trimmed), hlen, ctr)
    # a trimmed header whose security block was cut as well is not authentic
    with pytest.raises(SecurityDrop, match="security_missing"):
        opener.open_headers(memoryview(trimmed[:-1]), hlen)


def test_payload_cannot_move_under_another_header() -> None:
    keys = _keys()
    sealer, opener = Sealer(keys, Mode.INTEGRITY), Opener(keys, Mode.INTEGRITY)
    hlen = wire.DATA_HDR_LEN
    a, b = _seal(sealer, os.urandom(64)), _seal(sealer, os.urandom(64))
    spliced = a[: hlen + SEC_BLOCK_LEN] + b[hlen + SEC_BLOCK_LEN :]
    ctr = opener.open_headers(memoryview(spliced), hlen)
    with pytest.raises(SecurityDrop, match="security_bad_tag"):
        opener.open_payload(memoryview(spliced), hlen, ctr)


def test_control_packets_and_wrong_keys() -> None:
    keys = _keys()
    ack = wire.pack_ack(0x42, 10, wire.AETH_ACK, 10, 0, 0, 7)
    pkt = _seal(Sealer(keys, Mode.ENCRYPT), None, headers=ack)
    assert len(pkt) == wire.ACK_LEN + SEC_BLOCK_LEN
    assert Opener(keys, Mode.ENCRYPT).open_headers(memoryview(pkt), wire.ACK_LEN) == 1
    other = _keys()
    with pytest.raises(SecurityDrop, match="security_key_id"):
        Opener(other, Mode.ENCRYPT).open_headers(memoryview(pkt), wire.ACK_LEN)
    same_id = DirectionKeys(keys.key_id, other.header_key, other.payload_key)
    with pytest.raises(SecurityDrop, match="security_bad_tag"):
        Opener(same_id, Mode.ENCRYPT).open_headers(memoryview(pkt), wire.ACK_LEN)
    plain = bytearray(ack) + bytes(SEC_BLOCK_LEN)  # S bit clear: not protected at all
    with pytest.raises(SecurityDrop, match="security_missing"):
        Opener(keys, Mode.ENCRYPT).open_headers(memoryview(plain), wire.ACK_LEN)


def test_replay_window_edges() -> None:
    w = ReplayWindow(size=8)
    assert w.check(0) == "security_replay"
    for c in (1, 3, 2):
        assert w.check(c) is None
        w.accept(c)
    assert w.check(2) == "security_replay"
    w.accept(100)
    assert w.check(92) == "security_too_old"
    assert w.check(93) is None and w.check(100) == "security_replay"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=300), max_size=200))
def test_replay_window_matches_a_set(counters: list[int]) -> None:
    """Accepted exactly when never seen and within the window of the highest accepted."""
    w, seen, top = ReplayWindow(size=64), set(), 0
    for c in counters:
        expect_ok = c not in seen and c > top - 64
        assert (w.check(c) is None) is expect_ok, (c, top)
        if expect_ok:
            w.accept(c)
            seen.add(c)
            top = max(top, c)


def test_the_receivers_ecn_echo_is_authenticated() -> None:
    """BECN in an ACK is the receiver's ECN echo (congestion control slows down on it): a
    switch never sets it, so it is covered, and a forged echo fails the header ICV."""
    keys = _keys()
    ack = wire.pack_ack(0x42, 10, wire.AETH_ACK, 10, 0, 0, 7)
    pkt = _seal(Sealer(keys, Mode.INTEGRITY), None, headers=ack)
    forged = bytearray(pkt)
    forged[4] |= wire.BTH_BECN
    with pytest.raises(SecurityDrop, match="security_bad_tag"):
        Opener(keys, Mode.INTEGRITY).open_headers(memoryview(forged), wire.ACK_LEN)
    marked = bytearray(pkt)
    marked[4] |= wire.BTH_FECN  # a switch's mark: allowed
    assert Opener(keys, Mode.INTEGRITY).open_headers(memoryview(marked), wire.ACK_LEN) == 1
