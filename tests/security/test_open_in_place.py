"""Data packets unsealed in place by the C kernel (``mrc._native.open_in_place``), in
integrity and encrypt mode, against the Python reference (``Opener.unseal`` with ``in_place``
None).

Two openers with the same keys take the same seeded stream of sealed data packets: good ones,
duplicates, counters far behind (a small replay window, so "too old" and wrapped gaps occur),
packets cut short anywhere (to the bare headers, inside the security block, inside the payload
ICV, as a trimming switch leaves one), the S bit cleared, another key id, and bits flipped
anywhere. For every packet both must reach the same verdict (the same drop reason, or the same
unprotected bytes), leave the same bytes in the receive buffer and the same replay window.
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
        pytest.skip(f"mrc._native is not in use here: {describe()}")
    return sec.open_in_place


def _opener(in_place: sec.OpenInPlace | None, window: int, mode: Mode = Mode.INTEGRITY) -> Opener:
    opener = Opener(_KEYS, mode)
    opener.in_place = in_place
    opener.replay = ReplayWindow(window)
    return opener


def _verdict(opener: Opener, packet: bytes, hdr_len: int) -> tuple[str, bytes, bytes]:
    """(drop reason or "ok", the unprotected datagram, the receive buffer afterwards)."""
    buf = bytearray(packet)
    try:
        plain = bytes(opener.unseal(memoryview(buf), hdr_len, True))
    except SecurityDrop as exc:
        return exc.reason, b"", bytes(buf)
    return "ok", plain, bytes(buf)


def _stream(seed: int, count: int, mode: Mode = Mode.INTEGRITY) -> list[tuple[bytes, int]]:
    """Sealed data packets (and the length of their headers), in a hostile order."""
    rng = random.Random(seed)
    sealer, other = Sealer(_KEYS, mode), Sealer(_OTHER, mode)
    sent: list[tuple[bytes, int]] = []
    out: list[tuple[bytes, int]] = []
    for i in range(count):
        imm = rng.randrange(1 << 32) if rng.random() < 0.2 else None
        size = rng.choice((0, 1, 17, 1400, 8192))
        hdr = wire.pack_data(1, i & wire.PSN_MASK, 4096 * i, 9, size, rng.random() < 0.3, imm)
        seal = other if rng.random() < 0.03 else sealer
        if rng.random() < 0.1:
            seal.counter += rng.randint(1, 200)  # counters the receiver never sees
        head, rest = seal.seal_pair(hdr, rng.randbytes(size))
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

    def counted(*args: object) -> tuple[str | None, int, int]:
        calls.append(1)
        return native(*args)  # type: ignore[arg-type]

    opener = _opener(counted, 1 << 14, mode)
    opener._headers = None  # type: ignore[assignment, method-assign]  # must not be needed
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


def test_errors_other_than_a_bad_tag_are_not_verdicts() -> None:
    """An exception from the AES-GCM call that is not InvalidTag propagates (no drop counted,
    nothing accepted), as it does from the reference."""
    native = _native()
    sealer = Sealer(_KEYS, Mode.INTEGRITY)
    head, rest = sealer.seal_pair(wire.pack_data(1, 0, 0, 9, 64, False, None), bytes(64))
    buf = bytearray(head + bytes(rest))
    seen = bytearray(64)

    def broken(*_args: object) -> bytes:
        raise MemoryError("out of memory")

    with pytest.raises(MemoryError):
        native(
            memoryview(buf), 28, (5).to_bytes(4, "big"), broken, broken, ValueError, seen, 0, False
        )
    assert seen == bytearray(64) and bytes(buf) == head + bytes(rest)
    for bad in (
        (memoryview(buf), 28, b"\0\0\0", broken, broken, ValueError, seen, 0, 0),  # 3-byte id
        (memoryview(buf), 28, b"\0\0\0\5", broken, broken, ValueError, bytearray(), 0, 0),
        (memoryview(buf), 4, b"\0\0\0\5", broken, broken, ValueError, seen, 0, 0),
        (memoryview(bytes(buf)), 28, b"\0\0\0\5", broken, broken, ValueError, seen, 0, 0),
        (memoryview(buf), 28, b"\0\0\0\5", broken, broken, ValueError, seen, 0),  # 8 args
    ):
        with pytest.raises((TypeError, ValueError, BufferError)):
            native(*bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(3))
def test_the_sealing_kernel_writes_the_reference_bytes(seed: int) -> None:
    """``seal_data`` (C) and Sealer.seal_pair's Python give the same first part for the same
    data packet and counter (marks in BTH byte 4 kept as they are, authenticated as cleared),
    and what either seals the other side opens."""
    if sec.seal_data is None:
        pytest.skip(f"mrc._native is not in use here: {describe()}")
    rng = random.Random(seed)
    native, reference = Sealer(_KEYS, Mode.INTEGRITY), Sealer(_KEYS, Mode.INTEGRITY)
    reference.seal_data = None
    opener = _opener(None, 1 << 14)
    for i in range(300):
        imm = rng.randrange(1 << 32) if rng.random() < 0.2 else None
        size = rng.choice((0, 1, 1400, 8192))
        hdr = bytearray(wire.pack_data(2, i, 64 * i, 3, size, rng.random() < 0.5, imm))
        hdr[4] |= rng.choice((0, wire.BTH_FECN, wire.BTH_TRIMMED))
        payload = memoryview(rng.randbytes(size))
        got = native.seal_pair(bytes(hdr), payload)
        want = reference.seal_pair(bytes(hdr), payload)
        assert got[0] == want[0] and got[1] is payload
        assert native.counter == reference.counter
        if not hdr[4] & wire.BTH_TRIMMED:
            plain = opener.unseal(memoryview(bytearray(got[0] + bytes(payload))), len(hdr), True)
            assert bytes(plain) == bytes(hdr) + bytes(payload)
    # an ACK (no payload) still takes the Python path, and seals alike
    ack = wire.pack_ack(2, 5, wire.AETH_ACK, 5, 0, 0, 7)
    assert native.seal_pair(ack, None) == reference.seal_pair(ack, None)


def test_the_sealing_kernel_refuses_what_it_is_never_given() -> None:
    if sec.seal_data is None:
        pytest.skip(f"mrc._native is not in use here: {describe()}")
    seal = sec.seal_data
    sealer = Sealer(_KEYS, Mode.INTEGRITY)
    hdr = wire.pack_data(2, 0, 0, 3, 8, False, None)
    args = (hdr, b"x" * 8, b"\0\0\0\5", 1, sealer._hdr, sealer._pay)
    assert len(seal(*args)) == len(hdr) + SEC_BLOCK_LEN + 16
    with pytest.raises(TypeError):
        seal(hdr, b"x", b"\0\0\5", 1, sealer._hdr, sealer._pay)  # 3-byte key id
    with pytest.raises(ValueError):
        seal(hdr[:4], b"x", b"\0\0\0\5", 1, sealer._hdr, sealer._pay)  # no whole BTH
    with pytest.raises(OverflowError):
        seal(hdr, b"x", b"\0\0\0\5", -1, sealer._hdr, sealer._pay)
    with pytest.raises(TypeError):
        seal(hdr, b"x", b"\0\0\0\5", 1, sealer._hdr, lambda *_a: b"short")  # not an ICV
