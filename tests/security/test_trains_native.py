"""Keyed mode a burst and a train at a time (issue 38, item 4): ``mrc._native_gcm``'s
``seal_burst`` and ``open_train`` against their pure-Python twins (mrc/security/trains.py, with
``cryptography``'s AES-GCM), and the twins against the datagram-by-datagram calls they replace.

Sealing: seeded random bursts (WRITEs and WRITE_IMMs of equal sizes with a shorter last, mixed
sizes and kinds that no longer make one burst, ACKs and probes alone, marks in BTH byte 4) give
the same parts byte for byte (integrity: the payload object itself), the same segment size, the
same counters; and they are what ``seal_pair`` gives one by one.

Opening: seeded random trains of sealed WRITEs to one QP with, among them, a wrong key, a wrong
key id, tampered bytes, replays, counters behind a small window, a cleared S bit, short and
trimmed segments, another QP, WRITE_IMMs and ACKs, opened from successive offsets with random
caps, in both modes: every call returns the same (opened, reason, start, stop), leaves the same
train bytes and the same replay window, and the twin matches opening each segment alone.
"""

from __future__ import annotations

import random
import sys

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
_WRONG = DirectionKeys(5, bytes(range(1, 17)), bytes(range(101, 117)))  # same id, other keys
_OTHER_ID = DirectionKeys(6, bytes(range(16)), bytes(range(100, 116)))  # same keys, other id
QPN = 0x1234
OTHER_QPN = 0x4321
MODES = [Mode.INTEGRITY, Mode.ENCRYPT]


def _need_native() -> None:
    if sec.seal_burst is None or sec.open_train is None:
        pytest.skip(f"mrc._native_gcm is not in use here: {describe()}")


def _sealers(mode: Mode) -> tuple[Sealer, Sealer]:
    """(the kernel's, the twin's), the same keys and counter."""
    native, twin = Sealer(_KEYS, mode), Sealer(_KEYS, mode)
    twin.burst = None
    twin.seal_packet = None
    return native, twin


def _openers(mode: Mode, window: int) -> tuple[Opener, Opener]:
    """(the kernel's, the twin's): same keys, each its own replay window of ``window``."""
    native, twin = Opener(_KEYS, mode), Opener(_KEYS, mode)
    twin.train = None
    twin.in_place = None
    for opener in (native, twin):
        opener.replay = ReplayWindow(window)
    return native, twin


# ---- sealing ------------------------------------------------------------------------------


def _burst(rng: random.Random, i: int) -> tuple[list[bytes | memoryview], int]:
    """A burst as the requester makes them, or one it never makes (kinds and sizes mixed)."""
    kind = rng.random()
    if kind < 0.1:  # a control datagram alone: an ACK or a probe (payload part b"")
        if rng.random() < 0.5:
            hdr = wire.pack_ack(QPN, i, wire.AETH_ACK, i, i, rng.getrandbits(64), 7)
        else:
            hdr = wire.pack_probe(QPN, i & wire.PSN_MASK, 3, rng.getrandbits(40), reply=False)
        return [hdr, b""], 1
    count = rng.randint(1, 16)
    size = rng.choice((0, 1, 15, 16, 17, 1400, 8192))
    mixed = kind < 0.3  # sizes and kinds that no longer make one burst
    bufs: list[bytes | memoryview] = []
    for k in range(count):
        n = size if k < count - 1 or mixed else rng.randint(0, size)
        if mixed and rng.random() < 0.5:
            n = rng.choice((0, 17, 1400, 8192))
        imm = rng.getrandbits(32) if (mixed and rng.random() < 0.3) or kind < 0.35 else None
        marked = bytearray(wire.pack_data(QPN, (i + k) & wire.PSN_MASK, 64 * k, 3, n, False, imm))
        marked[4] |= rng.choice((0, 0, wire.BTH_FECN, wire.BTH_TRIMMED))
        payload = rng.randbytes(n)
        bufs += (bytes(marked), memoryview(payload) if rng.random() < 0.5 else payload)
    return bufs, count


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(3))
def test_the_burst_kernel_and_its_twin_seal_the_same_bytes(mode: Mode, seed: int) -> None:
    _need_native()
    rng = random.Random(seed)
    native, twin = _sealers(mode)
    one_by_one = Sealer(_KEYS, mode)
    one_by_one.seal_packet = None
    opener = Opener(_KEYS, mode)
    opener.in_place = None
    shapes = {True: 0, False: 0}
    for i in range(200):
        if rng.random() < 0.1:  # counters that skip (another burst sealed in between)
            jump = rng.randint(1, 1000)
            native.counter += jump
            twin.counter += jump
            one_by_one.counter += jump
        bufs, count = _burst(rng, i)
        got, seg = native.seal_burst(bufs, count)
        want, want_seg = twin.seal_burst(bufs, count)
        assert [bytes(p) for p in got] == [bytes(p) for p in want]
        assert seg == want_seg and native.counter == twin.counter
        assert len(got) == 2 * count
        # the twin is what sealing each datagram alone gave (QueuePair._seal before)
        sizes = []
        for k in range(count):
            hdr, payload = bufs[2 * k], bufs[2 * k + 1]
            is_data = hdr[0] in (wire.Opcode.RDMA_WRITE_ONLY, wire.Opcode.RDMA_WRITE_ONLY_IMM)
            head, body = one_by_one.seal_pair(bytes(hdr), payload if is_data else None)
            assert (bytes(want[2 * k]), bytes(want[2 * k + 1])) == (head, bytes(body))
            if is_data and mode is Mode.INTEGRITY:
                assert got[2 * k + 1] is payload  # sent from where it lies, no copy
            sizes.append(len(head) + len(body))
            if not hdr[4] & wire.BTH_TRIMMED:
                plain = opener.unseal(memoryview(bytearray(head + bytes(body))), len(hdr), is_data)
                assert bytes(plain) == bytes(hdr) + (bytes(payload) if is_data else b"")
        one_burst = count == 1 or (len(set(sizes[:-1])) == 1 and sizes[-1] <= sizes[0])
        assert seg == (sizes[0] if one_burst else -1)
        shapes[one_burst] += 1
    assert shapes[True] > 50 and shapes[False] > 5  # both outcomes were exercised


def test_the_burst_kernel_refuses_what_it_is_never_given_and_leaks_nothing() -> None:
    _need_native()
    assert sec.seal_burst is not None
    seal = sec.seal_burst
    sealer = Sealer(_KEYS, Mode.ENCRYPT)
    hk, pk = sealer._hkey, sealer._pkey
    kid = b"\0\0\0\5"
    hdr = wire.pack_data(QPN, 0, 0, 3, 8, False, None)
    payload = bytes(8) + b"unique-payload-object"
    good: list[bytes | memoryview] = [hdr, payload]
    cases: list[tuple[tuple[object, ...], type[Exception]]] = [
        ((good, 0, kid, 1, hk, pk, True), ValueError),  # no datagram
        ((good, 2, kid, 1, hk, pk, True), ValueError),  # more than the list holds
        ((tuple(good), 1, kid, 1, hk, pk, True), TypeError),  # not a list
        (([hdr[:8], payload], 1, kid, 1, hk, pk, True), ValueError),  # no whole BTH
        (([hdr * 3, payload], 1, kid, 1, hk, pk, True), ValueError),  # too long for headers
        (([hdr, "text"], 1, kid, 1, hk, pk, True), TypeError),  # a payload that is no buffer
        ((good, 1, b"\0\5", 1, hk, pk, True), TypeError),  # 2-byte key id
        ((good, 1, kid, -1, hk, pk, True), OverflowError),
        ((good, 1, kid, (1 << 64) - 1, hk, pk, True), OverflowError),  # would wrap
        ((good, 1, kid, 1, hk, b"k" * 16, True), TypeError),  # not a GcmKey
        ((good, 1, kid, 1, hk, pk), TypeError),  # 6 arguments
    ]
    for bad, err in cases:
        refs = sys.getrefcount(payload), sys.getrefcount(hdr)
        with pytest.raises(err):
            seal(*bad)  # type: ignore[arg-type]
        assert (sys.getrefcount(payload), sys.getrefcount(hdr)) == refs
    # a failure part-way through a burst leaves no reference behind either
    bufs: list[bytes | memoryview] = [hdr, payload, hdr[:4], payload]
    before = sys.getrefcount(payload)
    with pytest.raises(ValueError):
        seal(bufs, 2, kid, 1, hk, pk, False)
    assert sys.getrefcount(payload) == before
    parts, seg = seal(good, 1, kid, 1, hk, pk, False)
    assert parts[1] is payload and seg == len(parts[0]) + len(payload)
    del parts
    assert sys.getrefcount(payload) == before


# ---- opening -----------------------------------------------------------------------------

#: a train's segment size: a sealed WRITE of 1024 bytes
PAYLOAD = 1024
SEG = wire.DATA_HDR_LEN + PAYLOAD + DATA_OVERHEAD


def _segment(
    rng: random.Random, i: int, sealer: Sealer, wrong: Sealer, other_id: Sealer, sent: list[bytes]
) -> tuple[bytes, str]:
    """One segment of a train (SEG bytes but for short ones) and what it is."""
    fate = rng.random()
    psn = i & wire.PSN_MASK
    hdr = wire.pack_data(QPN, psn, 64 * i, 3, PAYLOAD, False, None)
    payload = rng.randbytes(PAYLOAD)
    if fate < 0.04:
        head, body = wrong.seal_pair(hdr, payload)
        return head + bytes(body), "wrong key"
    if fate < 0.06:
        head, body = other_id.seal_pair(hdr, payload)
        return head + bytes(body), "wrong key id"
    if fate < 0.12 and sent:
        return rng.choice(sent), "replay"
    if fate < 0.15:
        back = rng.choice((1, 70, 200))  # behind the window, or a replay of one
        sealer.counter = max(0, sealer.counter - back)
        head, body = sealer.seal_pair(hdr, payload)
        sealer.counter += 300
        return head + bytes(body), "old counter"
    if fate < 0.17:
        hdr = wire.pack_data(OTHER_QPN, psn, 64 * i, 3, PAYLOAD, False, None)
        head, body = sealer.seal_pair(hdr, payload)
        return head + bytes(body), "foreign QP"
    if fate < 0.19:
        imm = wire.pack_data(QPN, psn, 64 * i, 3, PAYLOAD - 4, False, 7)
        head, body = sealer.seal_pair(imm, payload[:-4])
        return head + bytes(body), "WRITE_IMM"
    if fate < 0.2:
        ack = wire.pack_ack(QPN, psn, wire.AETH_ACK, psn, psn, rng.getrandbits(64), 7)
        head, _ = sealer.seal_pair(ack, None)
        return head.ljust(SEG, b"\0"), "ACK"
    head, body = sealer.seal_pair(hdr, payload)
    packet = head + bytes(body)
    sent.append(packet)
    if fate < 0.26:
        flipped = bytearray(packet)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(flipped))
            flipped[pos] ^= 1 << rng.randrange(8)
        return bytes(flipped), "tampered"
    if fate < 0.27:
        flipped = bytearray(packet)
        flipped[8] &= ~wire.BTH_SECURE
        return bytes(flipped), "S cleared"
    if fate < 0.29:
        trimmed = bytearray(packet[: wire.DATA_HDR_LEN + SEC_BLOCK_LEN])
        trimmed[4] |= wire.BTH_TRIMMED
        return bytes(trimmed), "trimmed"
    if fate < 0.31:
        return packet[: rng.randrange(len(packet))], "short"
    return packet, "good"


def _train(
    rng: random.Random, i: int, sealers: tuple[Sealer, Sealer, Sealer], sent: list[bytes]
) -> tuple[bytes, list[str]]:
    """A GRO train: segments of SEG bytes, the last possibly shorter (a short or trimmed one
    ends it, as GRO would); and what each segment is."""
    parts: list[bytes] = []
    kinds: list[str] = []
    for k in range(rng.randint(1, 40)):
        seg, kind = _segment(rng, i * 64 + k, *sealers, sent)
        parts.append(seg)
        kinds.append(kind)
        if len(seg) < SEG:
            break
    return b"".join(parts), kinds


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("window", [64, 1 << 14])
def test_the_train_kernel_and_its_twin_open_the_same_trains(
    mode: Mode, seed: int, window: int
) -> None:
    _need_native()
    rng = random.Random(seed * 31 + window)
    native, twin = _openers(mode, window)
    alone = Opener(_KEYS, mode)  # each segment opened by itself, as the QP did before
    alone.in_place = None
    alone.replay = ReplayWindow(window)
    sealers = (Sealer(_KEYS, mode), Sealer(_WRONG, mode), Sealer(_OTHER_ID, mode))
    sent: list[bytes] = []
    reasons: dict[str | None, int] = {}
    kinds_seen: set[str] = set()
    for i in range(60):
        data, kinds = _train(rng, i, sealers, sent)
        kinds_seen.update(kinds)
        a, b, c = bytearray(data), bytearray(data), bytearray(data)
        off = 0
        while off < len(data):
            cap = rng.choice((1, 3, 64, 64))
            got = native.open_train(memoryview(a), off, SEG, cap, QPN)
            want = twin.open_train(memoryview(b), off, SEG, cap, QPN)
            assert got == want
            assert a == b
            assert native.replay.top == twin.replay.top
            assert native.replay.seen == twin.replay.seen
            opened, reason, start, stop = got
            assert (start, stop) == (0, 0)  # a whole-length WRITE never opens to headers alone
            reasons[reason] = reasons.get(reason, 0) + 1
            # the same as each segment opened alone, in order
            for k in range(opened + (reason is not None)):
                o = off + k * SEG
                seg_view = memoryview(c)[o : o + SEG]
                try:
                    plain = alone.unseal(seg_view, wire.DATA_HDR_LEN, True)
                except SecurityDrop as exc:
                    assert k == opened and exc.reason == reason
                else:
                    assert k < opened and len(plain) == len(seg_view) - DATA_OVERHEAD
            assert alone.replay.top == native.replay.top
            assert alone.replay.seen == native.replay.seen
            stopped = opened < cap and off + opened * SEG < len(data)
            off += (opened + stopped) * SEG
        assert bytes(c) == bytes(a)
    assert {"security_bad_tag", "security_replay", "security_key_id", "security_missing"} <= set(
        reasons
    )
    if window == 64:
        assert "security_too_old" in reasons
    assert {"trimmed", "short", "foreign QP", "WRITE_IMM", "ACK"} <= kinds_seen


def _sealed_writes(mode: Mode, count: int, qpn: int = QPN) -> tuple[bytearray, list[bytes]]:
    sealer = Sealer(_KEYS, mode)
    sealer.seal_packet = None
    payloads = [bytes([k]) * PAYLOAD for k in range(count)]
    data = bytearray()
    for k, payload in enumerate(payloads):
        head, body = sealer.seal_pair(wire.pack_data(qpn, k, 0, 3, PAYLOAD, False, None), payload)
        data += head + bytes(body)
    return data, payloads


@pytest.mark.parametrize("mode", MODES)
def test_a_good_train_opens_whole_in_one_call_and_reads_as_sent(mode: Mode) -> None:
    """Every segment opened in place: each datagram DATA_OVERHEAD bytes into its segment, the
    plaintext as sent, the counters 1..n taken; the cap is honoured; a train ending in a
    trimmed segment stops there with no verdict (it takes the general path)."""
    openers = _openers(mode, 1 << 14)
    for opener in openers:
        data, payloads = _sealed_writes(mode, 8)
        trimmed = bytearray(data[-SEG:][: wire.DATA_HDR_LEN + SEC_BLOCK_LEN])
        data = data[:-SEG] + trimmed
        view = memoryview(data)
        assert opener.open_train(view, 0, SEG, 3, QPN) == (3, None, 0, 0)
        assert opener.open_train(view, 3 * SEG, SEG, 64, QPN) == (4, None, 0, 0)
        assert opener.replay.top == 7
        for k in range(7):
            o = k * SEG + DATA_OVERHEAD
            dgram = view[o : (k + 1) * SEG]
            assert dgram[0] == wire.Opcode.RDMA_WRITE_ONLY and not dgram[8] & wire.BTH_SECURE
            assert bytes(dgram[wire.DATA_HDR_LEN :]) == payloads[k]
        # the trimmed one is left as it is, for the general path
        assert bytes(view[7 * SEG :]) == bytes(trimmed)
        assert opener.open_train(view, 7 * SEG, SEG, 64, QPN) == (0, None, 0, 0)
        # the same train again: every segment a replay, the first stops it
        again, _ = _sealed_writes(mode, 2)
        assert opener.open_train(memoryview(again), 0, SEG, 64, QPN) == (
            0,
            "security_replay",
            0,
            0,
        )
        assert bytes(again) == bytes(_sealed_writes(mode, 2)[0])  # a drop changes nothing


def test_what_the_train_kernel_is_never_given_raises_and_changes_nothing() -> None:
    _need_native()
    native, twin = _openers(Mode.INTEGRITY, 64)
    data, _ = _sealed_writes(Mode.INTEGRITY, 2)
    for opener in (native, twin):
        for args, err in (
            ((memoryview(bytearray(data)), 0, 0, 64, QPN), ValueError),  # no segment size
            ((memoryview(bytearray(data)), -1, SEG, 64, QPN), ValueError),
            ((memoryview(bytearray(data)), len(data) + 1, SEG, 64, QPN), ValueError),
            ((memoryview(bytearray(data)), 0, SEG, -1, QPN), ValueError),
        ):
            with pytest.raises(err):
                opener.open_train(*args)
            assert opener.replay.top == 0 and not any(opener.replay.seen)
    train = sec.open_train
    assert train is not None
    kid, hk, pk = native._kid, native._hkey, native._pkey
    window = native.replay
    view = memoryview(bytearray(data))
    cases: list[tuple[tuple[object, ...], type[Exception]]] = [
        ((memoryview(bytes(data)), 0, SEG, 64, QPN, kid, hk, pk, window, False), BufferError),
        ((view, 0, SEG, 64, QPN, b"\0\0\5", hk, pk, window, False), TypeError),
        ((view, 0, SEG, 64, QPN, kid, hk, b"k" * 16, window, False), TypeError),
        ((view, 0, SEG, 64, QPN, kid, hk, pk, object(), False), AttributeError),
        ((view, 0, SEG, 64, QPN, kid, hk, pk, ReplayWindow(0), False), ValueError),
        ((view, 0, SEG, 64, QPN, kid, hk, pk, window), TypeError),  # 9 arguments
    ]
    for bad, error in cases:
        with pytest.raises(error):
            train(*bad)  # type: ignore[arg-type]
        assert bytes(view) == bytes(data) and window.top == 0 and not any(window.seen)
    frozen = ReplayWindow(64)
    frozen.seen = bytes(64)  # type: ignore[assignment]
    with pytest.raises(BufferError):
        train(view, 0, SEG, 64, QPN, kid, hk, pk, frozen, False)
    # and a good call after all that: both open, the window follows
    assert train(view, 0, SEG, 64, QPN, kid, hk, pk, window, False) == (2, None, 0, 0)
    assert window.top == 2 and window.seen[1] == window.seen[2] == 1


@pytest.mark.parametrize("mode", MODES)
def test_qp_trains_count_drops_by_reason_the_same_with_the_kernel_or_the_twin(mode: Mode) -> None:
    """Through QueuePair.receive_train: a train with a forged segment in the middle counts one
    security_bad_tag and places the others, with the kernel and with the twin alike."""
    _need_native()
    from mrc.core import Access, ProtectionDomain, QueuePair
    from mrc.security.packet import Protection

    results = []
    for use_twin in (False, True):
        pd = ProtectionDomain()
        region = bytearray(8 * PAYLOAD)
        mr = pd.register(region, Access.REMOTE_WRITE, "r")
        qp = QueuePair(QPN, pd, list(range(1, 9)))
        qp.connect(OTHER_QPN, 0)
        protection = Protection(_OTHER_ID, _KEYS, mode)
        if use_twin:
            protection.opener.train = None
            protection.opener.in_place = None
        qp.protect(protection)
        sealer = Sealer(_KEYS, mode)
        data = bytearray()
        for k in range(8):
            hdr = wire.pack_data(QPN, k, mr.addr + k * PAYLOAD, mr.rkey, PAYLOAD, False, None)
            head, body = sealer.seal_pair(hdr, bytes([k + 1]) * PAYLOAD)
            packet = bytearray(head + bytes(body))
            if k == 3:
                packet[-1] ^= 1  # forged
            data += packet
        view = memoryview(data)
        off = 0
        while off < len(data):
            off += qp.receive_train(view, off, SEG, 0, 1.0) * SEG
        drops = dict(qp.stats.dropped_by_reason)
        results.append((bytes(region), {k: v for k, v in drops.items() if v}))
    assert results[0] == results[1]
    region_bytes, drops = results[0]
    assert drops == {"security_bad_tag": 1}
    for k in range(8):
        want = bytes(PAYLOAD) if k == 3 else bytes([k + 1]) * PAYLOAD
        assert region_bytes[k * PAYLOAD : (k + 1) * PAYLOAD] == want
