"""Datagrams unsealed in place by the C kernel (``mrc._native_gcm.open_in_place``, AES-GCM
included), in integrity and encrypt mode, against the Python reference (``Opener.unseal`` with
``in_place`` None, ``cryptography``'s AES-GCM); and datagrams sealed by ``seal_packet`` against
``Sealer.seal_pair``'s Python.

Two openers with the same keys take the same seeded stream of sealed data packets (and ACKs):
good ones, duplicates, counters far behind (a small replay window, so "too old" and wrapped gaps
occur), packets cut short anywhere (to the bare headers, inside the security block, inside the
payload ICV, as a trimming switch leaves one), the S bit cleared, another key id, and bits
flipped anywhere. For every packet both must reach the same verdict (the same drop reason, or
the same unprotected bytes), leave the same bytes in the receive buffer and the same replay
window.
"""

from __future__ import annotations

import random

import pytest

from mrc import wire
from mrc.native import describe
from mrc.security import packet as sec
from mrc.security.packet import (
    DATA_OVERHEAD,
    SEC_BLOCK_LEN,
    DirectionKeys,
    Mode,
    Opener,
    ReplayWindow,
    Sealer,
    SecurityDrop,
)

_KEYS = DirectionKeys(5, bytes(range(16)), bytes(range(100, 116)))
_OTHER = DirectionKeys(6, bytes(range(16)), bytes(range(100, 116)))  # same keys, another id


def _native() -> sec.OpenInPlace:
    if sec.open_in_place is None:
        pytest.skip(f"mrc._native_gcm is not in use here: {describe()}")
    return sec.open_in_place


def _opener(in_place: sec.OpenInPlace | None, window: int, mode: Mode = Mode.INTEGRITY) -> Opener:
    opener = Opener(_KEYS, mode)
    opener.in_place = in_place
    opener.replay = ReplayWindow(window)
    return opener


def _verdict(
    opener: Opener, packet: bytes, hdr_len: int, is_data: bool = True
) -> tuple[str, bytes, bytes]:
    """(drop reason or "ok", the unprotected datagram, the receive buffer afterwards)."""
    buf = bytearray(packet)
    try:
        plain = bytes(opener.unseal(memoryview(buf), hdr_len, is_data))
    except SecurityDrop as exc:
        return exc.reason, b"", bytes(buf)
    return "ok", plain, bytes(buf)


def _stream(
    seed: int, count: int, mode: Mode = Mode.INTEGRITY, acks: bool = False
) -> list[tuple[bytes, int]]:
    """Sealed data packets (``acks``: ACKs and probes) and the length of their headers, in a
    hostile order."""
    rng = random.Random(seed)
    sealer, other = Sealer(_KEYS, mode), Sealer(_OTHER, mode)
    sent: list[tuple[bytes, int]] = []
    out: list[tuple[bytes, int]] = []
    for i in range(count):
        payload: bytes | None
        if acks:
            if rng.random() < 0.8:
                hdr = wire.pack_ack(1, i, wire.AETH_ACK, i, i, rng.getrandbits(64), 7)
            else:
                hdr = wire.pack_probe(1, i & wire.PSN_MASK, 3, rng.getrandbits(40), reply=True)
            payload = None
        else:
            imm = rng.randrange(1 << 32) if rng.random() < 0.2 else None
            size = rng.choice((0, 1, 17, 1400, 8192))
            hdr = wire.pack_data(1, i & wire.PSN_MASK, 4096 * i, 9, size, rng.random() < 0.3, imm)
            payload = rng.randbytes(size)
        seal = other if rng.random() < 0.03 else sealer
        if rng.random() < 0.1:
            seal.counter += rng.randint(1, 200)  # counters the receiver never sees
        head, rest = seal.seal_pair(hdr, payload)
        packet = head + bytes(rest)
        hdr_len = len(hdr)
        sent.append((packet, hdr_len))
        fate = rng.random()
        if fate < 0.1 and sent:  # a copy of an earlier one: a replay, or too old
            out.append(rng.choice(sent))
            continue
        if fate < 0.2:  # cut short anywhere around the security block and ICV, or the bare BTH
            cut = rng.choice((hdr_len + SEC_BLOCK_LEN, hdr_len, 9, 0)) + rng.randint(0, 20)
            packet = packet[:cut]
        elif fate < 0.25:
            flipped = bytearray(packet)
            flipped[8] &= ~0x40  # S cleared
            packet = bytes(flipped)
        elif fate < 0.45:
            flipped = bytearray(packet)
            for _ in range(rng.randint(1, 3)):
                pos = rng.randrange(len(flipped))
                flipped[pos] ^= 1 << rng.randrange(8)
            packet = bytes(flipped)
        out.append((packet, hdr_len))
    rng.shuffle(out[len(out) // 2 :])  # the second half reordered: gaps, old and new
    return out


@pytest.mark.parametrize("mode", [Mode.INTEGRITY, Mode.ENCRYPT])
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("window", [64, 1 << 14])
def test_acks_and_probes_reach_the_same_verdicts_in_place(
    seed: int, window: int, mode: Mode
) -> None:
    """Headers alone (ACKs, probes) unseal in the receive buffer too, to where the security
    block ends, with the same verdicts, bytes, buffer and replay window either way."""
    native, reference = _opener(_native(), window, mode), _opener(None, window, mode)
    reasons: set[str] = set()
    for packet, hdr_len in _stream(seed, 400, mode, acks=True):
        got = _verdict(native, packet, hdr_len, False)
        want = _verdict(reference, packet, hdr_len, False)
        assert got == want
        if want[0] == "ok":
            assert want[2][SEC_BLOCK_LEN : SEC_BLOCK_LEN + hdr_len] == want[1]
            assert len(want[1]) == hdr_len and not want[1][8] & 0x40
        assert native.replay.top == reference.replay.top
        assert native.replay.seen == reference.replay.seen
        reasons.add(want[0])
    assert {"ok", "security_missing", "security_key_id", "security_replay"} <= reasons
    assert "security_bad_tag" in reasons


@pytest.mark.parametrize("mode", [Mode.INTEGRITY, Mode.ENCRYPT])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("window", [64, 1 << 14])
def test_the_kernel_and_the_reference_reach_the_same_verdicts(
    seed: int, window: int, mode: Mode
) -> None:
    native, reference = _opener(_native(), window, mode), _opener(None, window, mode)
    reasons: set[str] = set()
    for packet, hdr_len in _stream(seed, 600, mode):
        got = _verdict(native, packet, hdr_len)
        want = _verdict(reference, packet, hdr_len)
        assert got == want
        assert native.replay.top == reference.replay.top
        assert native.replay.seen == reference.replay.seen
        reasons.add(want[0])
    # the stream really reached every verdict the comparison claims to cover
    assert {
        "ok",
        "security_missing",
        "security_key_id",
        "security_replay",
        "security_bad_tag",
        "security_short",
    } <= reasons
    if window == 64:
        assert "security_too_old" in reasons


@pytest.mark.parametrize("mode", [Mode.INTEGRITY, Mode.ENCRYPT])
def test_good_packets_take_the_kernel_and_come_out_as_sent(mode: Mode) -> None:
    """The kernel really is the path taken (the reference's header check never runs for a
    whole data packet), and what comes out is the unprotected datagram, ending where the
    packet ends: DATA_OVERHEAD bytes into it, in either mode (the train kernel's skip)."""
    native = _native()
    calls = []

    def counted(*args: object) -> tuple[str | None, int, int, int]:
        calls.append(1)
        return native(*args)  # type: ignore[arg-type]

    opener = _opener(counted, 1 << 14, mode)
    opener._headers = None  # type: ignore[assignment, method-assign]  # must not be needed
    opener._hdr = opener._pay = None  # type: ignore[assignment]  # nor cryptography
    sealer = Sealer(_KEYS, mode)
    for i in range(50):
        hdr = wire.pack_data(1, i, 8192 * i, 9, 8192, False, None)
        payload = bytes([i]) * 8192
        head, rest = sealer.seal_pair(hdr, payload)
        assert head[8] & 0x40
        buf = bytearray(head + bytes(rest))
        out = opener.unseal(memoryview(buf), len(hdr), True)
        assert bytes(out) == hdr + payload
        assert bytes(buf[DATA_OVERHEAD:]) == hdr + payload
    assert len(calls) == 50 and opener.replay.top == 50


def test_what_the_kernel_is_never_given_raises_and_changes_nothing() -> None:
    """Arguments the Opener never passes are errors (no drop counted, nothing accepted, the
    buffer as it was), as the reference's would be."""
    native = _native()
    opener = Opener(_KEYS, Mode.INTEGRITY)
    sealer = Sealer(_KEYS, Mode.INTEGRITY)
    head, rest = sealer.seal_pair(wire.pack_data(1, 0, 0, 9, 64, False, None), bytes(64))
    buf = bytearray(head + bytes(rest))
    seen = bytearray(64)
    hk, pk, kid = opener._hkey, opener._pkey, (5).to_bytes(4, "big")
    view = memoryview(buf)
    for bad in (
        (view, 28, b"\0\0\0", hk, pk, seen, 0, False, True),  # a 3-byte key id
        (view, 28, kid, hk, pk, bytearray(), 0, False, True),  # no replay window
        (view, 4, kid, hk, pk, seen, 0, False, True),  # headers shorter than a BTH
        (view, 65, kid, hk, pk, seen, 0, False, True),  # longer than any
        (memoryview(bytes(buf)), 28, kid, hk, pk, seen, 0, False, True),  # read-only
        (view, 28, kid, b"k" * 16, pk, seen, 0, False, True),  # not a GcmKey
        (view, 28, kid, hk, None, seen, 0, False, True),
        (view, 28, kid, hk, pk, seen, -1, False, True),  # a negative top
        (view, 28, kid, hk, pk, seen, 0, False),  # 8 arguments
    ):
        with pytest.raises((TypeError, ValueError, BufferError, OverflowError)):
            native(*bad)
    assert seen == bytearray(64) and bytes(buf) == head + bytes(rest)
    assert native(view, 28, kid, hk, pk, seen, 0, False, True) == (None, 1, 44, len(buf))


@pytest.mark.parametrize("mode", [Mode.INTEGRITY, Mode.ENCRYPT])
@pytest.mark.parametrize("seed", range(3))
def test_the_sealing_kernel_writes_the_reference_bytes(seed: int, mode: Mode) -> None:
    """``seal_packet`` (C) and Sealer.seal_pair's Python give the same two parts for the same
    datagram and counter (marks in BTH byte 4 kept as they are, authenticated as cleared):
    data packets of every size in both modes (integrity: the payload itself as the second
    part, not a copy), ACKs and probes; and what either seals the other side opens."""
    if sec.seal_packet is None:
        pytest.skip(f"mrc._native_gcm is not in use here: {describe()}")
    rng = random.Random(seed)
    native, reference = Sealer(_KEYS, mode), Sealer(_KEYS, mode)
    reference.seal_packet = None
    opener = _opener(None, 1 << 14, mode)
    for i in range(300):
        kind = rng.random()
        payload: memoryview | None = None
        if kind < 0.15:
            hdr = bytearray(wire.pack_ack(2, i, wire.AETH_ACK, i, i, rng.getrandbits(64), 7))
        elif kind < 0.2:
            hdr = bytearray(wire.pack_probe(2, i, 3, rng.getrandbits(40), reply=False))
        else:
            imm = rng.randrange(1 << 32) if rng.random() < 0.2 else None
            size = rng.choice((0, 1, 15, 16, 17, 1400, 8192))
            hdr = bytearray(wire.pack_data(2, i, 64 * i, 3, size, rng.random() < 0.5, imm))
            payload = memoryview(rng.randbytes(size))
        hdr[4] |= rng.choice((0, wire.BTH_FECN, wire.BTH_TRIMMED))
        got = native.seal_pair(bytes(hdr), payload)
        want = reference.seal_pair(bytes(hdr), payload)
        assert (got[0], bytes(got[1])) == (want[0], bytes(want[1]))
        if payload is not None and mode is Mode.INTEGRITY:
            assert got[1] is payload
        assert native.counter == reference.counter
        if not hdr[4] & wire.BTH_TRIMMED:
            plain = opener.unseal(
                memoryview(bytearray(got[0] + bytes(got[1]))), len(hdr), payload is not None
            )
            assert bytes(plain) == bytes(hdr) + (b"" if payload is None else bytes(payload))


def test_the_sealing_kernel_refuses_what_it_is_never_given() -> None:
    if sec.seal_packet is None:
        pytest.skip(f"mrc._native_gcm is not in use here: {describe()}")
    seal = sec.seal_packet
    sealer = Sealer(_KEYS, Mode.INTEGRITY)
    hk, pk = sealer._hkey, sealer._pkey
    hdr = wire.pack_data(2, 0, 0, 3, 8, False, None)
    kid = b"\0\0\0\5"
    head, body = seal(hdr, b"x" * 8, kid, 1, hk, pk, False)
    assert len(head) == len(hdr) + SEC_BLOCK_LEN + 16 and body == b"x" * 8
    head, body = seal(hdr, b"x" * 8, kid, 1, hk, pk, True)
    assert len(head) == len(hdr) + SEC_BLOCK_LEN and len(body) == 8 + 16
    head, body = seal(hdr, None, kid, 1, hk, pk, False)
    assert len(head) == len(hdr) + SEC_BLOCK_LEN and body == b""
    for bad, err in (
        ((hdr, b"x", b"\0\0\5", 1, hk, pk, False), TypeError),  # 3-byte key id
        ((hdr[:4], b"x", kid, 1, hk, pk, False), ValueError),  # no whole BTH
        ((hdr * 3, b"x", kid, 1, hk, pk, False), ValueError),  # longer than any headers
        ((hdr, b"x", kid, -1, hk, pk, False), OverflowError),
        ((hdr, b"x", kid, 1 << 64, hk, pk, False), OverflowError),
        ((hdr, b"x", kid, 1, hk, b"k" * 16, False), TypeError),  # not a GcmKey
        ((hdr, "x", kid, 1, hk, pk, False), TypeError),  # not a buffer
        ((hdr, b"x", kid, 1, hk, pk), TypeError),  # 6 arguments
    ):
        with pytest.raises(err):
            seal(*bad)
