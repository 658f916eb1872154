"""Per-datagram protection: the security block, the payload tag, and the replay window.

Layout (docs/PROTOCOL.md section 11). A protected datagram has BTH byte 8 bit S set and a
28-byte *security block* right after its fixed headers::

    headers | key id (4) | counter (8) | header ICV (16) | payload | payload ICV (16)

The header ICV is a GMAC over the headers (with the bits a switch may change masked to zero:
FECN, BECN, TRIMMED, LASTHOP) plus key id and counter. It sits *before* the payload so that a
trimming switch, which keeps the headers and the security block and cuts the rest, leaves a
packet the receiver can still authenticate and NACK. Data packets add a payload ICV at the end:
a GMAC of the payload (integrity mode; the payload travels in clear) or the AES-GCM tag of the
encrypted payload (encrypt mode). Both use the packet's counter in the nonce, so a payload
cannot be moved under another header. ACKs and probes have no payload part.

Each direction of each connection has its own keys (see :mod:`mrc.security.handshake`), and
its own 64-bit counter that every protected datagram takes the next value of: the nonce is the
counter, so no (key, nonce) pair is ever used twice. The receiver keeps a window of counters
seen, which drops replays without assuming order (spraying reorders by design).

This module is sans-IO: bytes in, bytes out, no sockets or clocks.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass
from enum import Enum

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mrc.errors import MRCError

SEC_BLOCK = struct.Struct("!IQ16s")  # key id, counter, header ICV
SEC_BLOCK_LEN = SEC_BLOCK.size  # 28
ICV_LEN = 16
#: bytes protection adds to a data packet (security block + payload ICV)
DATA_OVERHEAD = SEC_BLOCK_LEN + ICV_LEN

#: BTH byte 4 bits that switches may set in flight (FECN, BECN, TRIMMED, LASTHOP): not covered.
MUTABLE_BYTE4 = 0xF0
BTH_SECURE = 0x40  # BTH byte 8

#: counters the replay window remembers behind the highest one seen
REPLAY_WINDOW = 1 << 14

_EMPTY = b""


class Mode(Enum):
    """What a key protects: headers and payload authenticated, payload also encrypted or not."""

    INTEGRITY = "integrity"
    ENCRYPT = "encrypt"


@dataclass(frozen=True, slots=True)
class DirectionKeys:
    """The keys of one direction of one connection."""

    key_id: int
    header_key: bytes
    payload_key: bytes


class SecurityDrop(MRCError):
    # a verdict caught on the per-packet path, never shown to a user as an error
    """A datagram failed a check; ``reason`` is the drop counter to bump."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _nonce(counter: int) -> bytes:
    return b"\x00\x00\x00\x00" + counter.to_bytes(8, "big")


def _masked_headers(headers: bytes | memoryview) -> bytes:
    """The headers as authenticated: BTH byte 4's switch-set bits zeroed (a copy of <= 36 B)."""
    h = bytearray(headers)
    h[4] &= ~MUTABLE_BYTE4 & 0xFF
    return bytes(h)


class Sealer:
    """Protects the datagrams one side sends on a connection (one per direction)."""

    def __init__(self, keys: DirectionKeys, mode: Mode) -> None:
        self.key_id = keys.key_id
        self.mode = mode
        self._hdr = AESGCM(keys.header_key)
        self._pay = AESGCM(keys.payload_key)
        self.counter = 0

    def seal(self, headers: bytes, payload: bytes | memoryview | None) -> list[bytes | memoryview]:
        """The buffers of one protected datagram, to send together (``sendmsg``).

        ``payload`` None: an ACK or probe, returned as one buffer (headers with S set and the
        security block). A data packet adds the payload as it lies (integrity mode: no copy)
        and its ICV, or the ciphertext with its tag (encrypt mode).
        """
        self.counter += 1
        ctr = self.counter
        nonce = _nonce(ctr)
        h = bytearray(headers)
        h[8] |= BTH_SECURE
        block = struct.pack("!IQ", self.key_id, ctr)
        prefix = bytes(h) + block
        h[4] &= ~MUTABLE_BYTE4 & 0xFF
        head = prefix + self._hdr.encrypt(nonce, _EMPTY, bytes(h) + block)
        if payload is None:
            return [head]
        if self.mode is Mode.ENCRYPT:
            return [head, self._pay.encrypt(nonce, payload, None)]
        return [head, payload, self._pay.encrypt(nonce, _EMPTY, payload)]


class ReplayWindow:
    """Which counters were accepted: anything at or below ``top - REPLAY_WINDOW`` is too old."""

    def __init__(self, size: int = REPLAY_WINDOW) -> None:
        self.size = size
        self.top = 0
        self._bits = 0  # bit i: counter top - i was accepted
        self._mask = (1 << size) - 1

    def check(self, counter: int) -> str | None:
        """None if ``counter`` is new (and may be accepted), else the drop reason."""
        if counter == 0:
            return "security_replay"
        if counter > self.top:
            return None
        back = self.top - counter
        if back >= self.size:
            return "security_too_old"
        return "security_replay" if (self._bits >> back) & 1 else None

    def accept(self, counter: int) -> None:
        if counter > self.top:
            shift = counter - self.top
            self._bits = ((self._bits << shift) | 1) & self._mask if shift < self.size else 1
            self.top = counter
        else:
            self._bits |= 1 << (self.top - counter)


class Opener:
    """Checks and unprotects the datagrams a connection receives (one per direction)."""

    def __init__(self, keys: DirectionKeys, mode: Mode) -> None:
        self.key_id = keys.key_id
        self.mode = mode
        self._hdr = AESGCM(keys.header_key)
        self._pay = AESGCM(keys.payload_key)
        self.replay = ReplayWindow()

    def open_headers(self, data: memoryview, hdr_len: int) -> int:
        """Authenticate the headers and security block of ``data``; returns its counter.

        Raises :class:`SecurityDrop`. The counter is not yet marked seen: call
        :meth:`accept` once the datagram is taken (after :meth:`open_payload` for data).
        """
        if len(data) < hdr_len + SEC_BLOCK_LEN or not data[8] & BTH_SECURE:
            raise SecurityDrop("security_missing")
        key_id, ctr, hicv = SEC_BLOCK.unpack_from(data, hdr_len)
        if key_id != self.key_id:
            raise SecurityDrop("security_key_id")
        verdict = self.replay.check(ctr)
        if verdict is not None:
            raise SecurityDrop(verdict)
        aad = _masked_headers(data[:hdr_len]) + bytes(data[hdr_len : hdr_len + 12])
        try:
            self._hdr.decrypt(_nonce(ctr), hicv, aad)
        except InvalidTag:
            raise SecurityDrop("security_bad_tag") from None
        return int(ctr)

    def open_payload(self, data: memoryview, hdr_len: int, counter: int) -> memoryview:
        """The payload of an authenticated data packet (decrypted in encrypt mode).

        ``data`` must be whole (not trimmed): headers, security block, payload and ICV.
        """
        start = hdr_len + SEC_BLOCK_LEN
        if len(data) < start + ICV_LEN:
            raise SecurityDrop("security_short")
        nonce = _nonce(counter)
        try:
            if self.mode is Mode.ENCRYPT:
                return memoryview(self._pay.decrypt(nonce, data[start:], None))
            payload = data[start : len(data) - ICV_LEN]
            tag = self._pay.encrypt(nonce, _EMPTY, payload)
        except InvalidTag:
            raise SecurityDrop("security_bad_tag") from None
        if not hmac.compare_digest(tag, data[len(data) - ICV_LEN :]):
            raise SecurityDrop("security_bad_tag")
        return payload

    def accept(self, counter: int) -> None:
        self.replay.accept(counter)


class Protection:
    """Both directions of one connection's protection, in the shape a queue pair calls.

    :class:`mrc.core.qp.QueuePair` takes one of these (``qp.protect``) without importing this
    module, so the core stays free of ``cryptography``: it hands every datagram it sends to
    :meth:`seal` and every one it receives to :meth:`unseal`, and counts a
    :class:`SecurityDrop` by its ``reason``.
    """

    def __init__(self, send: DirectionKeys, receive: DirectionKeys, mode: Mode) -> None:
        self.mode = mode
        self.sealer = Sealer(send, mode)
        self.opener = Opener(receive, mode)

    def seal(
        self, headers: bytes, payload: bytes | memoryview, is_data: bool
    ) -> tuple[bytes, bytes | memoryview]:
        """(headers with S set + security block, payload part) of one datagram to send.

        The payload part of a data packet is its payload and ICV (integrity mode: one copy
        of the payload, so the datagram stays two buffers) or ciphertext and tag.
        """
        bufs = self.sealer.seal(headers, payload if is_data else None)
        head = bufs[0]
        assert isinstance(head, bytes)  # seal() builds the headers part
        if len(bufs) == 1:
            return head, _EMPTY
        if len(bufs) == 2:
            return head, bufs[1]
        return head, b"".join((bufs[1], bufs[2]))

    def unseal(self, data: memoryview, hdr_len: int, is_data: bool) -> memoryview:
        """The datagram as the unprotected protocol would have carried it (headers with S
        cleared, then the payload; a trimmed data packet: the headers alone).

        Raises :class:`SecurityDrop`. The counter is recorded as seen only on success.
        """
        opener = self.opener
        ctr = opener.open_headers(data, hdr_len)
        head = bytearray(data[:hdr_len])
        head[8] &= ~BTH_SECURE & 0xFF
        if is_data and len(data) > hdr_len + SEC_BLOCK_LEN:
            head += opener.open_payload(data, hdr_len, ctr)
        opener.accept(ctr)
        return memoryview(head)
