"""The C AES-GCM (``mrc._native_gcm``: OpenSSL's EVP, one context per key, a new nonce per use)
against ``cryptography``'s AESGCM, the reference, on the same vectors.

* ``GcmKey.encrypt``/``decrypt`` alone: the GCM specification's known vectors (AES-128, -192
  and -256, with and without plaintext and additional data: GMAC is AES-GCM without
  plaintext), then random keys, nonces and data of every length that matters (0, 1, 15, 16, 17,
  8192 and more): identical ciphertext and tag, and the same verdict on a wrong tag, key, nonce,
  additional data or a cut-short input. One key used for thousands of nonces in a row, good and
  bad mixed, keeps agreeing (the context is reused, never re-keyed).
* The burst and train kernels (``seal_burst``, ``open_train``) against datagrams sealed by
  ``cryptography`` from the wire format alone.
* The kernels on whole datagrams: every bit of a sealed data packet, ACK and probe flipped in
  turn (headers, key id, counter, ICVs, payload or ciphertext), a wrong key, a replay, each
  opened by the kernel and by the Python reference: identical verdicts, drop reasons, bytes,
  buffers and replay windows.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mrc import wire
from mrc.native import describe
from mrc.security import packet as sec
from mrc.security.packet import (
    SEC_BLOCK_LEN,
    DirectionKeys,
    Mode,
    Opener,
    ReplayWindow,
    Sealer,
    SecurityDrop,
)

if TYPE_CHECKING:
    from mrc._native_gcm import GcmKey
else:
    GcmKey = sec.gcm_key

if sec.gcm_key is None:  # pragma: no cover - only where mrc._native_gcm is not in use
    pytest.skip(f"mrc._native_gcm is not in use here: {describe()}", allow_module_level=True)

_H = bytes.fromhex

#: (key, nonce, plaintext, additional data, ciphertext, tag): test cases 1-4, 7-8 and 13-16 of
#: the GCM specification (McGrew and Viega) with 96-bit IVs, and one of NIST's GMAC vectors
#: (gcmEncryptExtIV128, PTlen 0, AADlen 128, count 0)
_TC3_P = _H(
    "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
    "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255"
)
_TC4_A = _H("feedfacedeadbeeffeedfacedeadbeefabaddad2")
_K128 = _H("feffe9928665731c6d6a8f9467308308")
_IV = _H("cafebabefacedbaddecaf888")
KNOWN = [
    (bytes(16), bytes(12), b"", b"", b"", _H("58e2fccefa7e3061367f1d57a4e7455a")),
    (
        bytes(16),
        bytes(12),
        bytes(16),
        b"",
        _H("0388dace60b6a392f328c2b971b2fe78"),
        _H("ab6e47d42cec13bdf53a67b21257bddf"),
    ),
    (
        _K128,
        _IV,
        _TC3_P,
        b"",
        _H(
            "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e"
            "21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091473f5985"
        ),
        _H("4d5c2af327cd64a62cf35abd2ba6fab4"),
    ),
    (
        _K128,
        _IV,
        _TC3_P[:60],
        _TC4_A,
        _H(
            "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e"
            "21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091"
        ),
        _H("5bc94fbc3221a5db94fae95ae7121a47"),
    ),
    (bytes(24), bytes(12), b"", b"", b"", _H("cd33b28ac773f74ba00ed1f312572435")),
    (
        bytes(24),
        bytes(12),
        bytes(16),
        b"",
        _H("98e7247c07f0fe411c267e4384b0f600"),
        _H("2ff58d80033927ab8ef4d4587514f0fb"),
    ),
    (bytes(32), bytes(12), b"", b"", b"", _H("530f8afbc74536b9a963b4f1c4cb738b")),
    (
        bytes(32),
        bytes(12),
        bytes(16),
        b"",
        _H("cea7403d4d606b6e074ec5d3baf39d18"),
        _H("d0d1c8a799996bf0265b98b5d48ab919"),
    ),
    (
        _K128 * 2,
        _IV,
        _TC3_P[:60],
        _TC4_A,
        _H(
            "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
            "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
        ),
        _H("76fc6ece0f4e1768cddf8853bb2d551b"),
    ),
    (  # GMAC: no plaintext, 16 bytes of additional data
        _H("77be63708971c4e240d1cb79e8d77feb"),
        _H("e0e00f19fed7ba0136a797f3"),
        b"",
        _H("7a43ec1d9c0a5a78a0b16533a6213cab"),
        b"",
        _H("209fcc8d3675ed938e9c7166709dd946"),
    ),
]

LENGTHS = [0, 1, 15, 16, 17, 31, 32, 33, 40, 44, 1400, 8191, 8192, 8193, 65536]


def _reference_open(key: bytes, nonce: bytes, data: bytes, aad: bytes | None) -> bytes | None:
    try:
        return AESGCM(key).decrypt(nonce, data, aad)
    except InvalidTag:
        return None


@pytest.mark.parametrize("case", range(len(KNOWN)))
def test_the_known_vectors(case: int) -> None:
    key, nonce, plain, aad, cipher, tag = KNOWN[case]
    want = cipher + tag
    assert AESGCM(key).encrypt(nonce, plain, aad or None) == want  # the vector is right
    gk = GcmKey(key)
    assert gk.encrypt(nonce, plain, aad or None) == want
    assert gk.encrypt(nonce, plain, aad) == want  # b"" and None are the same additional data
    assert gk.decrypt(nonce, want, aad or None) == plain
    bad = bytearray(want)
    bad[-1] ^= 0x80
    assert gk.decrypt(nonce, bytes(bad), aad or None) is None


@pytest.mark.parametrize("key_len", [16, 24, 32])
def test_random_vectors_of_every_length(key_len: int) -> None:
    rng = random.Random(key_len)
    for plain_len in LENGTHS:
        for aad_len in (0, 1, 16, 17, 44, 8192):
            key, nonce = rng.randbytes(key_len), rng.randbytes(12)
            plain, aad = rng.randbytes(plain_len), rng.randbytes(aad_len)
            ref, gk = AESGCM(key), GcmKey(key)
            sealed = ref.encrypt(nonce, plain, aad or None)
            assert gk.encrypt(nonce, plain, aad or None) == sealed
            assert gk.encrypt(nonce, memoryview(plain), memoryview(aad)) == sealed
            assert gk.decrypt(nonce, sealed, aad or None) == plain


@pytest.mark.parametrize("key_len", [16, 32])
def test_wrong_tag_key_nonce_and_data_are_refused_as_cryptography_refuses_them(
    key_len: int,
) -> None:
    rng = random.Random(100 + key_len)
    for plain_len in LENGTHS:
        key, nonce = rng.randbytes(key_len), rng.randbytes(12)
        plain, aad = rng.randbytes(plain_len), rng.randbytes(rng.choice((0, 13, 44)))
        sealed = AESGCM(key).encrypt(nonce, plain, aad)
        gk = GcmKey(key)
        tries: list[tuple[GcmKey, bytes, bytes, bytes, bytes]] = []
        other = bytearray(key)
        other[rng.randrange(key_len)] ^= 1
        tries.append((GcmKey(bytes(other)), bytes(other), nonce, sealed, aad))  # wrong key
        n2 = bytearray(nonce)
        n2[rng.randrange(12)] ^= 4
        tries.append((gk, key, bytes(n2), sealed, aad))  # wrong nonce (counter)
        for _ in range(8):  # a bit flipped anywhere: ciphertext or tag
            flipped = bytearray(sealed)
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            tries.append((gk, key, nonce, bytes(flipped), aad))
        tries.append((gk, key, nonce, sealed, aad + b"x"))  # other additional data
        tries.append((gk, key, nonce, sealed[:-1], aad))  # cut short
        tries.append((gk, key, nonce, sealed[:15], aad))  # shorter than a tag
        for k, raw, n, data, a in tries:
            assert _reference_open(raw, n, data, a) is None
            assert k.decrypt(n, data, a) is None
        assert gk.decrypt(nonce, sealed, aad) == plain  # still good after all that


def test_one_key_many_nonces_good_and_bad_interleaved() -> None:
    """The context is set up once; thousands of uses with a new nonce each, a failed check
    among them now and then, give cryptography's answers every time."""
    rng = random.Random(7)
    key = rng.randbytes(16)
    ref, gk = AESGCM(key), GcmKey(key)
    for ctr in range(1, 3000):
        nonce = ctr.to_bytes(12, "big")
        plain = rng.randbytes(rng.choice((0, 1, 17, 40, 8192)))
        aad = rng.randbytes(rng.choice((0, 44)))
        sealed = gk.encrypt(nonce, plain, aad)
        assert sealed == ref.encrypt(nonce, plain, aad)
        if ctr % 7 == 0:
            sealed = sealed[:-1] + bytes([sealed[-1] ^ 1])
            assert gk.decrypt(nonce, sealed, aad) is None
        else:
            assert gk.decrypt(nonce, sealed, aad) == plain


def test_keys_and_nonces_of_other_sizes_are_refused() -> None:
    for size in (0, 15, 17, 31, 33, 64):
        with pytest.raises(ValueError):
            GcmKey(bytes(size))
    with pytest.raises(TypeError):
        GcmKey("k" * 16)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        GcmKey()  # type: ignore[call-arg]
    gk = GcmKey(bytes(16))
    for nonce in (b"", bytes(8), bytes(11), bytes(13), bytes(16)):
        with pytest.raises(ValueError):
            gk.encrypt(nonce, b"x", None)
        with pytest.raises(ValueError):
            gk.decrypt(nonce, bytes(17), None)


# ---- the kernels, datagram by datagram --------------------------------------------------

_KEYS = DirectionKeys(0x01020304, bytes(range(16)), bytes(range(100, 116)))
_WRONG = DirectionKeys(0x01020304, bytes(range(1, 17)), bytes(range(100, 116)))


def _pair(mode: Mode, keys: DirectionKeys = _KEYS) -> tuple[Opener, Opener]:
    """(kernel, reference) openers of the same keys."""
    native, reference = Opener(keys, mode), Opener(keys, mode)
    assert native.in_place is not None
    reference.in_place = None
    return native, reference


def _open(opener: Opener, packet: bytes, hdr_len: int, is_data: bool) -> tuple[object, ...]:
    """(verdict, datagram, buffer, replay top, replay ring) of opening ``packet``."""
    buf = bytearray(packet)
    try:
        got: object = bytes(opener.unseal(memoryview(buf), hdr_len, is_data))
    except SecurityDrop as exc:
        got = exc.reason
    return got, bytes(buf), opener.replay.top, bytes(opener.replay.seen)


def _datagrams(mode: Mode, sealer: Sealer) -> list[tuple[bytes, int, bool]]:
    """A data packet with and without ImmDt, a zero-length one, an ACK and a probe, sealed."""
    rng = random.Random(3)
    out = []
    for hdr, payload in (
        (wire.pack_data(9, 77, 4096, 5, 17, False, None), rng.randbytes(17)),
        (wire.pack_data(9, 78, 8192, 5, 16, True, 0xDEADBEEF), rng.randbytes(16)),
        (wire.pack_data(9, 79, 0, 5, 0, True, None), b""),
        (wire.pack_ack(9, 80, wire.AETH_ACK, 80, 80, rng.getrandbits(64), 7), None),
        (wire.pack_probe(9, 81, 3, rng.getrandbits(40), reply=False), None),
    ):
        head, rest = sealer.seal_pair(hdr, payload)
        out.append((head + bytes(rest), len(hdr), payload is not None))
    return out


@pytest.mark.parametrize("mode", [Mode.INTEGRITY, Mode.ENCRYPT])
def test_every_bit_flipped_gets_the_same_verdict(mode: Mode) -> None:
    """Each bit of each datagram flipped in turn, each opened afresh by both: tampered headers
    (the switch-settable marks aside, which are not covered), key id, counter, header ICV,
    payload ICV and payload or ciphertext all reach the reference's verdict and bytes."""
    native_sealer, reference_sealer = Sealer(_KEYS, mode), Sealer(_KEYS, mode)
    reference_sealer.seal_packet = None
    sent = _datagrams(mode, native_sealer)
    assert sent == _datagrams(mode, reference_sealer)  # sealed alike
    verdicts: dict[str, int] = {}
    for packet, hdr_len, is_data in sent:
        for bit in range(8 * len(packet)):
            flipped = bytearray(packet)
            flipped[bit // 8] ^= 0x80 >> (bit % 8)
            native, reference = _pair(mode)
            got = _open(native, bytes(flipped), hdr_len, is_data)
            want = _open(reference, bytes(flipped), hdr_len, is_data)
            assert got == want, (hdr_len, is_data, bit)
            key = want[0] if isinstance(want[0], str) else "ok"
            verdicts[key] = verdicts.get(key, 0) + 1
    # a flip passes only in byte 4's marks (F, T, L: not covered), the S bit is "missing",
    # the key id is another's, a counter flipped to 0 is a replay, and all else is a bad tag
    assert set(verdicts) == {
        "ok",
        "security_missing",
        "security_key_id",
        "security_replay",
        "security_bad_tag",
    }
    assert verdicts["ok"] == 3 * len(sent)


@pytest.mark.parametrize("mode", [Mode.INTEGRITY, Mode.ENCRYPT])
def test_a_wrong_key_a_replay_and_a_tampered_counter(mode: Mode) -> None:
    sealer = Sealer(_KEYS, mode)
    sent = _datagrams(mode, sealer)
    # a key that differs (same key id): every datagram is a bad tag, for both
    native, reference = _pair(mode, _WRONG)
    for packet, hdr_len, is_data in sent:
        got = _open(native, packet, hdr_len, is_data)
        assert got == _open(reference, packet, hdr_len, is_data)
        assert got[0] == "security_bad_tag"
    # the right key: each opens once, then is a replay; then a counter rewritten to a new
    # value (its ICVs no longer match) is a bad tag, and one rewritten to 0 a replay
    native, reference = _pair(mode)
    for packet, hdr_len, is_data in sent:
        for again in (False, True):
            got = _open(native, packet, hdr_len, is_data)
            assert got == _open(reference, packet, hdr_len, is_data)
            assert (got[0] == "security_replay") is again
        for ctr, reason in ((1000, "security_bad_tag"), (0, "security_replay")):
            moved = bytearray(packet)
            moved[hdr_len + 4 : hdr_len + 12] = ctr.to_bytes(8, "big")
            got = _open(native, bytes(moved), hdr_len, is_data)
            assert got == _open(reference, bytes(moved), hdr_len, is_data)
            assert got[0] == reason
    assert native.replay.top == reference.replay.top == len(sent)


def test_the_window_ring_is_shared_with_the_python_window() -> None:
    """The kernel reads and sets the ReplayWindow's own ring: a counter the Python accepted is
    a replay to the kernel, and the reverse."""
    sealer = Sealer(_KEYS, Mode.INTEGRITY)
    sent = _datagrams(Mode.INTEGRITY, sealer)
    opener = Opener(_KEYS, Mode.INTEGRITY)
    opener.replay = ReplayWindow(64)
    kernel = opener.in_place
    for i, (packet, hdr_len, is_data) in enumerate(sent):
        opener.in_place = kernel if i % 2 else None
        opener.unseal(memoryview(bytearray(packet)), hdr_len, is_data)
        opener.in_place = None if i % 2 else kernel
        with pytest.raises(SecurityDrop) as drop:
            opener.unseal(memoryview(bytearray(packet)), hdr_len, is_data)
        assert drop.value.reason == "security_replay"
    assert opener.replay.top == len(sent)


def test_a_trimmed_packet_unseals_to_its_headers_in_place() -> None:
    """A trimming switch keeps headers and security block: both leave the headers (marks as
    the switch set them, S cleared) where the security block ended."""
    sealer = Sealer(_KEYS, Mode.ENCRYPT)
    hdr = wire.pack_data(9, 5, 0, 5, 8192, False, None)
    head, _rest = sealer.seal_pair(hdr, bytes(8192))
    trimmed = bytearray(head)
    trimmed[4] |= wire.BTH_TRIMMED
    for in_place in (True, False):
        native, reference = _pair(Mode.ENCRYPT)
        opener = native if in_place else reference
        buf = bytearray(trimmed)
        plain = opener.unseal(memoryview(buf), len(hdr), True)
        assert plain.obj is buf and len(plain) == len(hdr)
        assert bytes(plain[:4]) == hdr[:4] and plain[4] == hdr[4] | wire.BTH_TRIMMED
        assert bytes(plain[5:]) == hdr[5:]
        assert bytes(buf[SEC_BLOCK_LEN : SEC_BLOCK_LEN + len(hdr)]) == bytes(plain)


# ---- the burst and train kernels against cryptography directly --------------------------


def _by_cryptography(mode: Mode, hdr: bytes, payload: bytes | None, ctr: int) -> bytes:
    """A datagram sealed with ``cryptography``'s AESGCM from the wire format alone
    (docs/PROTOCOL.md section 11), not through mrc's Python."""
    nonce = ctr.to_bytes(12, "big")
    h = bytearray(hdr)
    h[8] |= wire.BTH_SECURE
    kid_ctr = _KEYS.key_id.to_bytes(4, "big") + nonce[4:]
    aad = bytearray(h) + kid_ctr
    aad[4] &= ~0xB0 & 0xFF  # FECN, TRIMMED, LASTHOP as a switch may leave them
    out = bytes(h) + kid_ctr + AESGCM(_KEYS.header_key).encrypt(nonce, b"", bytes(aad))
    if payload is None:
        return out
    pay = AESGCM(_KEYS.payload_key)
    if mode is Mode.ENCRYPT:
        return out + pay.encrypt(nonce, payload, None)
    return out + pay.encrypt(nonce, b"", payload) + payload


@pytest.mark.parametrize("mode", [Mode.INTEGRITY, Mode.ENCRYPT])
def test_bursts_sealed_and_trains_opened_agree_with_cryptography(mode: Mode) -> None:
    """``seal_burst`` gives, datagram by datagram, what ``cryptography`` seals from the wire
    format (counters following on); ``open_train`` opens a train ``cryptography`` sealed (and
    refuses one sealed with another key) with the plaintext where it belongs."""
    if sec.seal_burst is None or sec.open_train is None:
        pytest.skip(f"mrc._native_gcm is not in use here: {describe()}")
    rng = random.Random(11)
    sealer = Sealer(_KEYS, mode)
    sealer.counter = 1000
    for size in (0, 1, 15, 16, 17, 1400, 8192):
        count = rng.randint(1, 16)
        bufs: list[bytes | memoryview] = []
        for k in range(count):
            marked = bytearray(wire.pack_data(9, k, 0, 5, size, False, None if k % 3 else 7))
            marked[4] |= rng.choice((0, wire.BTH_FECN))
            bufs += (bytes(marked), rng.randbytes(size))
        ack = wire.pack_ack(9, 1, wire.AETH_ACK, 1, 1, rng.getrandbits(64), 7)
        first = sealer.counter
        parts, _seg = sealer.seal_burst(bufs, count)
        for k in range(count):
            hdr, payload = bytes(bufs[2 * k]), bytes(bufs[2 * k + 1])
            got = bytes(parts[2 * k]) + bytes(parts[2 * k + 1])
            assert got == _by_cryptography(mode, hdr, payload, first + 1 + k)
        parts, seg = sealer.seal_burst([ack, b""], 1)
        assert parts == [_by_cryptography(mode, ack, None, first + count + 1), b""]
        assert seg == len(parts[0])
    # a train of 8 sealed by cryptography; then the same with another key
    payloads = [rng.randbytes(1024) for _ in range(8)]
    hdrs = [wire.pack_data(9, k, 0, 5, 1024, False, None) for k in range(8)]
    train = b"".join(
        _by_cryptography(mode, h, p, 50 + k)
        for k, (h, p) in enumerate(zip(hdrs, payloads, strict=True))
    )
    seg = len(train) // 8
    opener = Opener(_KEYS, mode)
    view = memoryview(bytearray(train))
    assert opener.open_train(view, 0, seg, 64, 9) == (8, None, 0, 0)
    for k in range(8):
        dgram = bytes(view[k * seg + 44 : (k + 1) * seg])
        assert dgram == hdrs[k] + payloads[k]
    assert opener.replay.top == 57
    wrong = Opener(_WRONG, mode)  # another header key: the first header ICV fails
    assert wrong.open_train(memoryview(bytearray(train)), 0, seg, 64, 9) == (
        0,
        "security_bad_tag",
        0,
        0,
    )
    assert wrong.replay.top == 0
