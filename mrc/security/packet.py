"""Per-datagram protection: the security block, the payload tag, and the replay window.

Layout (docs/PROTOCOL.md section 11). A protected datagram has BTH byte 8 bit S set and a
28-byte *security block* right after its fixed headers::

    headers | key id (4) | counter (8) | header ICV (16) | payload ICV (16) | payload
                                                          (integrity mode)
    headers | key id (4) | counter (8) | header ICV (16) | ciphertext | payload ICV (16)
                                                          (encrypt mode)

The header ICV is a GMAC over the headers (with the bits a switch may change masked to zero:
FECN, TRIMMED, LASTHOP) plus key id and counter. It sits *before* the payload so that a
trimming switch, which keeps the headers and the security block and cuts the rest, leaves a
packet the receiver can still authenticate and NACK. Data packets add a payload ICV: a GMAC of
the payload right after the security block (integrity mode; the payload travels in clear, and
is sent from where it lies, no copy to append a tag), or the AES-GCM tag after the ciphertext
(encrypt mode). Both use the packet's counter in the nonce, so a payload
cannot be moved under another header. ACKs and probes have no payload part.

Each direction of each connection has its own keys (see :mod:`mrc.security.handshake`), and
its own 64-bit counter that every protected datagram takes the next value of: the nonce is the
counter, so no (key, nonce) pair is ever used twice. The receiver keeps a window of counters
seen, which drops replays without assuming order (spraying reorders by design).

The per-packet work (sealing, and unsealing in the receive buffer) is done by
``mrc._native_gcm``'s kernels where that extension is in use (:mod:`mrc.native`), with AES-GCM
from OpenSSL and each key's context made once; the Python below, with ``cryptography``'s
AESGCM, is the reference they are tested against and the fallback (not built, no OpenSSL
headers, ``MRC_NATIVE=0``).

This module is sans-IO: bytes in, bytes out, no sockets or clocks.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mrc import native
from mrc.errors import MRCError
from mrc.security import trains

SEC_BLOCK = struct.Struct("!IQ16s")  # key id, counter, header ICV
SEC_BLOCK_LEN = SEC_BLOCK.size  # 28
ICV_LEN = 16
#: bytes protection adds to a data packet (security block + payload ICV)
DATA_OVERHEAD = SEC_BLOCK_LEN + ICV_LEN

#: BTH byte 4 bits that switches may set in flight (FECN, TRIMMED, LASTHOP): not covered.
#: BECN (0x40) is covered: only the receiver sets it (the ECN echo in its ACKs), and a forged
#: echo would make the sender slow down for nothing.
MUTABLE_BYTE4 = 0xB0
BTH_SECURE = 0x40  # BTH byte 8

#: counters the replay window remembers behind the highest one seen
REPLAY_WINDOW = 1 << 14

_EMPTY = b""

if TYPE_CHECKING:
    from mrc._native_gcm import GcmKey

    OpenInPlace = Callable[
        [memoryview, int, bytes, GcmKey, GcmKey, bytearray, int, bool, bool],
        tuple[str | None, int, int, int],
    ]
    SealPacket = Callable[
        [bytes, bytes | memoryview | None, bytes, int, GcmKey, GcmKey, bool],
        tuple[bytes, bytes | memoryview],
    ]
    SealBurst = Callable[
        [list[bytes | memoryview], int, bytes, int, GcmKey, GcmKey, bool],
        tuple[list[bytes | memoryview], int],
    ]
    OpenTrain = Callable[
        [memoryview, int, int, int, int, bytes, GcmKey, GcmKey, "ReplayWindow", bool],
        tuple[int, str | None, int, int],
    ]

#: keyed mode's per-packet work in C, AES-GCM included (``mrc._native_gcm``): a datagram
#: unsealed in its receive buffer (reference: Opener.unseal's Python path) and a datagram
#: sealed (reference: Sealer.seal_pair's Python path), in both modes. None when
#: mrc.native.gcm is None (not built, stale, no OpenSSL headers, or MRC_NATIVE=0); each Opener
#: and Sealer takes what these are when it is made (tests may swap them)
open_in_place: OpenInPlace | None = None
seal_packet: SealPacket | None = None
#: the same a burst (reference: mrc.security.trains.seal_burst) and a train's run of WRITEs
#: (reference: mrc.security.trains.open_train) at a time, in one call each
seal_burst: SealBurst | None = None
open_train: OpenTrain | None = None
#: a key's AES-GCM contexts for those kernels (``GcmKey(key)``), made once per key
gcm_key: Callable[[bytes], GcmKey] | None = None
if native.gcm is not None:
    open_in_place = native.gcm.open_in_place
    seal_packet = native.gcm.seal_packet
    seal_burst = native.gcm.seal_burst
    open_train = native.gcm.open_train
    gcm_key = native.gcm.GcmKey


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
    # 4 zero bytes, then the 64-bit counter
    return counter.to_bytes(12, "big")


_KEEP_BYTE4 = ~MUTABLE_BYTE4 & 0xFF
_CLEAR_SECURE = ~BTH_SECURE & 0xFF


class Sealer:
    """Protects the datagrams one side sends on a connection (one per direction).

    Every datagram is sealed by ``mrc._native_gcm.seal_packet`` where it is in use, with this
    direction's keys' AES-GCM contexts (made here, once); ``seal_packet`` None takes the Python
    path below, the reference (tests/security/test_open_in_place.py and test_native_gcm.py
    compare them).
    """

    def __init__(self, keys: DirectionKeys, mode: Mode) -> None:
        self.key_id = keys.key_id
        self.mode = mode
        self._kid = keys.key_id.to_bytes(4, "big")
        self._hdr = AESGCM(keys.header_key).encrypt
        self._pay = AESGCM(keys.payload_key).encrypt
        self._encrypt = mode is Mode.ENCRYPT
        self.counter = 0
        #: the kernel that seals every datagram (the same bytes as the Python below, the
        #: reference and the fallback: None), and the keys it takes
        self.seal_packet = seal_packet if gcm_key is not None else None
        #: the kernel that seals a burst in one call (None: mrc.security.trains's twin)
        self.burst = seal_burst if gcm_key is not None else None
        if gcm_key is not None:
            self._hkey = gcm_key(keys.header_key)
            self._pkey = gcm_key(keys.payload_key)

    def seal_pair(
        self, headers: bytes, payload: bytes | memoryview | None
    ) -> tuple[bytes, bytes | memoryview]:
        """(headers with S set + security block [+ payload ICV], payload part) of a datagram.

        ``payload`` None: an ACK or probe (empty payload part). Integrity mode: the payload
        ICV ends the first part and the payload is the second, as given (no copy). Encrypt
        mode: the second part is the ciphertext followed by its tag.
        """
        self.counter = ctr = self.counter + 1
        if self.seal_packet is not None:
            return self.seal_packet(
                headers, payload, self._kid, ctr, self._hkey, self._pkey, self._encrypt
            )
        return self.seal_py(headers, payload, ctr)

    def seal_py(
        self, headers: bytes | memoryview, payload: bytes | memoryview | None, ctr: int
    ) -> tuple[bytes, bytes | memoryview]:
        """:meth:`seal_pair`'s Python, the reference, with counter ``ctr`` (taken already)."""
        nonce = ctr.to_bytes(12, "big")
        h = bytearray(headers)
        byte4 = h[4]
        h[4] = byte4 & _KEEP_BYTE4  # authenticated as a switch may leave it
        h[8] |= BTH_SECURE
        h += self._kid
        h += nonce[4:]
        h += self._hdr(nonce, _EMPTY, h)
        h[4] = byte4
        if payload is None:
            return bytes(h), _EMPTY
        if self._encrypt:
            return bytes(h), self._pay(nonce, payload, None)  # ciphertext, then its tag
        # integrity: the payload ICV goes before the payload, so the payload is sent from
        # where it lies (a copy to append the ICV cost more than the GMAC itself)
        h += self._pay(nonce, _EMPTY, payload)
        return bytes(h), payload

    def seal_burst(
        self, bufs: list[bytes | memoryview], count: int
    ) -> tuple[list[bytes | memoryview], int]:
        """A burst's ``count`` datagrams ((headers, payload) each in ``bufs``; WRITEs are data
        packets, anything else headers alone) sealed, each taking the next counter: (the
        sealed (head, payload part) list, the segment size if they still make one GSO burst,
        else -1). One kernel call for the whole burst where it is in use."""
        ctr = self.counter
        self.counter = ctr + count
        if self.burst is not None:
            return self.burst(bufs, count, self._kid, ctr, self._hkey, self._pkey, self._encrypt)
        return trains.seal_burst(self, bufs, count, ctr)

    def seal(self, headers: bytes, payload: bytes | memoryview | None) -> list[bytes | memoryview]:
        """The buffers of one protected datagram, to send together (``sendmsg``)."""
        head, rest = self.seal_pair(headers, payload)
        return [head, rest] if payload is not None else [head]


class ReplayWindow:
    """Which counters were accepted: anything at or below ``top - size`` is too old.

    One byte per counter in a ring of ``size``: checking and accepting the next counter in
    order touches one byte (a big-integer bitmap shifted per packet cost more than the AES).
    """

    def __init__(self, size: int = REPLAY_WINDOW) -> None:
        self.size = size
        self.top = 0
        #: slot c % size: counter c (within the window) accepted (the native kernel that
        #: unseals data packets in place reads and sets it too)
        self.seen = bytearray(size)

    def check(self, counter: int) -> str | None:
        """None if ``counter`` is new (and may be accepted), else the drop reason."""
        if counter > self.top:
            return None
        if counter == 0:
            return "security_replay"
        if self.top - counter >= self.size:
            return "security_too_old"
        return "security_replay" if self.seen[counter % self.size] else None

    def accept(self, counter: int) -> None:
        top, size, seen = self.top, self.size, self.seen
        if counter > top:
            gap = counter - top
            if gap >= size:
                seen[:] = bytes(size)
            elif gap > 1:  # the counters skipped are in the window now, not seen yet
                lo, hi = (top + 1) % size, counter % size
                if lo < hi:
                    seen[lo:hi] = bytes(hi - lo)
                else:
                    seen[lo:] = bytes(size - lo)
                    seen[:hi] = bytes(hi)
            self.top = counter
        seen[counter % size] = 1


class Opener:
    """Checks and unprotects the datagrams a connection receives (one per direction).

    A datagram in a writable receive buffer (every one a transfer receives) is checked and
    unprotected by ``mrc._native_gcm.open_in_place`` where it was received: the same checks in
    the same order, the same result, with AES-GCM in the same call (this direction's keys'
    contexts, made here, once). The Python below, with ``cryptography``, is the reference and the
    fallback (``in_place`` None: no extension, ``MRC_NATIVE=0``, or a test);
    tests/security/test_open_in_place.py holds the two to the same verdicts, bytes, buffer and
    replay state.
    """

    def __init__(self, keys: DirectionKeys, mode: Mode) -> None:
        self.key_id = keys.key_id
        self.mode = mode
        self._kid = keys.key_id.to_bytes(4, "big")
        self._hdr = AESGCM(keys.header_key).decrypt
        self._pay = AESGCM(keys.payload_key).decrypt
        self._encrypt = mode is Mode.ENCRYPT
        self.replay = ReplayWindow()
        self.in_place = open_in_place if gcm_key is not None else None
        #: the kernel that opens a train's WRITEs in one call (None: mrc.security.trains's
        #: twin, which opens each with the Python below)
        self.train = open_train if gcm_key is not None else None
        if gcm_key is not None:
            self._hkey = gcm_key(keys.header_key)
            self._pkey = gcm_key(keys.payload_key)

    def _headers(self, data: memoryview, hdr_len: int) -> tuple[int, bytearray]:
        """Authenticate headers and security block: (counter, headers + key id + counter
        with BTH byte 4 masked, as authenticated). Raises :class:`SecurityDrop`."""
        end = hdr_len + SEC_BLOCK_LEN
        if len(data) < end or not data[8] & BTH_SECURE:
            raise SecurityDrop("security_missing")
        if data[hdr_len : hdr_len + 4] != self._kid:
            raise SecurityDrop("security_key_id")
        ctr = int.from_bytes(data[hdr_len + 4 : hdr_len + 12], "big")
        verdict = self.replay.check(ctr)
        if verdict is not None:
            raise SecurityDrop(verdict)
        aad = bytearray(data[: hdr_len + 12])
        aad[4] &= _KEEP_BYTE4
        try:
            self._hdr(ctr.to_bytes(12, "big"), data[hdr_len + 12 : end], aad)
        except InvalidTag:
            raise SecurityDrop("security_bad_tag") from None
        return ctr, aad

    def open_headers(self, data: memoryview, hdr_len: int) -> int:
        """Authenticate the headers and security block of ``data``; returns its counter.

        Raises :class:`SecurityDrop`. The counter is not yet marked seen: call
        :meth:`accept` once the datagram is taken (after :meth:`open_payload` for data).
        """
        return self._headers(data, hdr_len)[0]

    def open_payload(self, data: memoryview, hdr_len: int, counter: int) -> memoryview:
        """The payload of an authenticated data packet (decrypted in encrypt mode).

        ``data`` must be whole (not trimmed): headers, security block, payload and its ICV
        (before the payload in integrity mode, after the ciphertext in encrypt mode).
        """
        start = hdr_len + SEC_BLOCK_LEN
        if len(data) < start + ICV_LEN:
            raise SecurityDrop("security_short")
        nonce = counter.to_bytes(12, "big")
        try:
            if self._encrypt:
                return memoryview(self._pay(nonce, data[start:], None))
            payload = data[start + ICV_LEN :]
            self._pay(nonce, data[start : start + ICV_LEN], payload)  # the tag; payload as AAD
        except InvalidTag:
            raise SecurityDrop("security_bad_tag") from None
        return payload

    def accept(self, counter: int) -> None:
        self.replay.accept(counter)

    def unseal(self, data: memoryview, hdr_len: int, is_data: bool) -> memoryview:
        """The datagram as the unprotected protocol would have carried it (headers with S
        cleared, then the payload; an ACK, a probe or a trimmed data packet: the headers alone).

        Raises :class:`SecurityDrop`. The counter is recorded as seen only on success. In a
        writable buffer (a receive buffer of ours) the result is made where the datagram lies,
        over its security block, and is a view of it.
        """
        if not data.readonly:
            if self.in_place is None:
                start, stop = self.open_in_place_py(data, hdr_len, is_data)
                return data[start:stop]
            replay = self.replay
            reason, top, start, stop = self.in_place(
                data,
                hdr_len,
                self._kid,
                self._hkey,
                self._pkey,
                replay.seen,
                replay.top,
                self._encrypt,
                is_data,
            )
            if reason is not None:
                raise SecurityDrop(reason)
            replay.top = top
            return data[start:stop]
        ctr, head = self._headers(data, hdr_len)
        del head[hdr_len:]
        head[4] = data[4]  # the switch-set marks (trimmed, last hop) count
        head[8] &= _CLEAR_SECURE
        if is_data and len(data) > hdr_len + SEC_BLOCK_LEN:
            head += self.open_payload(data, hdr_len, ctr)
        self.replay.accept(ctr)
        return memoryview(head)

    def open_in_place_py(self, data: memoryview, hdr_len: int, is_data: bool) -> tuple[int, int]:
        """:meth:`unseal` in a writable buffer, in Python (the reference of the kernels): where
        the datagram lies once unsealed, ``data[start:stop]``. Raises :class:`SecurityDrop`."""
        ctr, head = self._headers(data, hdr_len)
        del head[hdr_len:]
        head[4] = data[4]  # the switch-set marks (trimmed, last hop) count
        head[8] &= _CLEAR_SECURE
        end = hdr_len + SEC_BLOCK_LEN
        if is_data and len(data) > end:
            payload = self.open_payload(data, hdr_len, ctr)
            # in a receive buffer of ours, the datagram ends where the packet ends: the
            # headers right before the payload (integrity: where it lies, over the security
            # block and ICV, no payload copy; encrypt: the plaintext over the ciphertext's
            # end and tag). So a whole data packet always unseals DATA_OVERHEAD bytes into its
            # segment, in either mode (the train kernel's skip, Protection.in_place_skip)
            n = len(data)
            start = n - len(payload) - hdr_len
            if self._encrypt:
                data[n - len(payload) :] = payload
            data[start : start + hdr_len] = head
            self.replay.accept(ctr)
            return start, n
        # headers alone: they end where the security block ended (as the kernel leaves them,
        # so that both leave the same buffer)
        data[SEC_BLOCK_LEN:end] = head
        self.replay.accept(ctr)
        return SEC_BLOCK_LEN, end

    def open_train(
        self, view: memoryview, off: int, seg: int, cap: int, qpn: int
    ) -> tuple[int, str | None, int, int]:
        """The run of WRITEs naming ``qpn`` in a writable GRO train ``view`` from byte ``off``
        (``seg`` bytes each), opened in place as :meth:`unseal` opens each, at most ``cap``:
        (how many opened whole; the drop reason of the segment that stopped them, or None;
        where that segment lies unsealed if it opened to another form, else 0, 0). One kernel
        call for the run where it is in use (:func:`mrc.security.trains.open_train`)."""
        if self.train is not None:
            return self.train(
                view,
                off,
                seg,
                cap,
                qpn,
                self._kid,
                self._hkey,
                self._pkey,
                self.replay,
                self._encrypt,
            )
        return trains.open_train(self, view, off, seg, cap, qpn)


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
        #: a whole data packet unseals in place, DATA_OVERHEAD bytes into its segment, in
        #: either mode (Opener.unseal): trains of them go to the train kernel
        #: (QueuePair.receive_train)
        self.in_place_skip = DATA_OVERHEAD

    def seal(
        self, headers: bytes, payload: bytes | memoryview, is_data: bool
    ) -> tuple[bytes, bytes | memoryview]:
        """(headers with S set + security block, payload part) of one datagram to send."""
        return self.sealer.seal_pair(headers, payload if is_data else None)

    def unseal(self, data: memoryview, hdr_len: int, is_data: bool) -> memoryview:
        """See :meth:`Opener.unseal`."""
        return self.opener.unseal(data, hdr_len, is_data)

    def seal_burst(
        self, bufs: list[bytes | memoryview], count: int
    ) -> tuple[list[bytes | memoryview], int]:
        """See :meth:`Sealer.seal_burst`."""
        return self.sealer.seal_burst(bufs, count)

    def open_train(
        self, view: memoryview, off: int, seg: int, cap: int, qpn: int
    ) -> tuple[int, str | None, int, int]:
        """See :meth:`Opener.open_train`."""
        return self.opener.open_train(view, off, seg, cap, qpn)
