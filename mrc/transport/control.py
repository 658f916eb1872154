"""The out-of-band side channel: JSON lines over TCP, as RDMA tools exchange QP numbers.

perftest's ``ib_write_bw`` swaps QP numbers, PSNs and memory keys over a TCP socket before any
RDMA traffic flows; MRC does the same. Messages are one JSON object per line; this module
only frames them. Their schema is mrc/transport/messages.py (docs/PROTOCOL.md, "Connection
setup", documents it). After a key exchange each message is either authenticated (a MAC
field) or sealed (encrypted whole, one ``{"sealed": ...}`` line), under keys of the exchange.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import json

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mrc.errors import MRCError

MAX_LINE = 1 << 20  # bytes of one message, line end included: pass as the StreamReader limit
#: how deep objects and lists may nest in one message; the protocol's own go 3 levels deep, and
#: a hostile line of nested brackets would otherwise take the parser into a RecursionError
MAX_DEPTH = 16


def _depth(obj: object) -> int:
    """How deep lists and objects nest in a parsed message (a scalar: 0), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(obj, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[object] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if depth <= MAX_DEPTH:  # past the limit the answer is known: stop walking
            stack.extend((child, depth) for child in children)
    return deepest


def _parse(line: bytes) -> dict[str, object]:
    """One message: a JSON object of bounded depth, or :class:`ControlError`."""
    too_deep = f"peer sent a side-channel message nested deeper than {MAX_DEPTH} levels"
    try:
        obj = json.loads(line)
    except RecursionError:
        raise ControlError(too_deep) from None
    except ValueError:
        raise ControlError("peer is not speaking the MRC side-channel protocol") from None
    if _depth(obj) > MAX_DEPTH:
        raise ControlError(too_deep)
    if not isinstance(obj, dict):
        raise ControlError("peer is not speaking the MRC side-channel protocol")
    return obj


class ControlError(MRCError):
    """The side channel broke or the peer said something we cannot accept (one line)."""


_FORGED = "a side-channel message failed authentication (forged, replayed or altered)"


def _canonical(obj: dict[str, object]) -> bytes:
    """The bytes a MAC or a seal covers: keys sorted, no spaces, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _nonce(seq: int) -> bytes:
    """A sealed message's AES-GCM nonce: 4 zero bytes, then its number (8 bytes, big-endian).
    Each direction has its own key and numbers its messages from 0, so none repeats."""
    return bytes(4) + seq.to_bytes(8, "big")


class ControlChannel:
    """One TCP connection carrying JSON objects, one per line."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer_host: str = peer[0] if peer else ""
        self.peer_port: int = peer[1] if peer else 0
        # set by authenticate() or seal(): each direction's key, how it protects messages
        # ("mac" or "sealed"), and the messages counted so far
        self._send_key: bytes | None = None
        self._recv_key: bytes | None = None
        self._protection = ""
        self._sent = 0
        self._received = 0

    def authenticate(self, send_key: bytes, receive_key: bytes) -> None:
        """From now on every message carries ``mac``: HMAC-SHA256 under the direction's key
        (from the key handshake) of its number in the exchange and its canonical JSON.

        A message without a valid one is refused, except a refusal (``"ok": false``) before
        the first authentic message: a receiver that rejects our proof cannot MAC its reason,
        and forging one only denies service, which anyone on the path can do anyway.
        """
        self._send_key = send_key
        self._recv_key = receive_key
        self._protection = "mac"

    def seal(self, send_key: bytes, receive_key: bytes) -> None:
        """From now on every message travels sealed: the line ``{"sealed": B}``, B the base64
        of the AES-256-GCM ciphertext and tag of its canonical JSON under the direction's
        32-byte key, with the message's number in the exchange as the nonce (:func:`_nonce`).
        Nothing of it is readable on the way, and a message replayed, reordered, cut or
        altered fails to open (the number it was sealed with is not the one expected). The
        one exception is that of :meth:`authenticate`: a clear refusal before the first
        authentic message."""
        self._send_key = send_key
        self._recv_key = receive_key
        self._protection = "sealed"

    @property
    def authenticated(self) -> bool:
        return self._send_key is not None

    def keys(self) -> tuple[bytes, bytes, bool] | None:
        """This channel's sending and receiving keys and whether it seals (None: no key),
        from which the side channel's further paths derive theirs (mrc.transport.sidechannel)."""
        if self._send_key is None or self._recv_key is None:
            return None
        return self._send_key, self._recv_key, self._protection == "sealed"

    @staticmethod
    def _mac(key: bytes, seq: int, obj: dict[str, object]) -> str:
        body = _canonical(obj)
        return hmac.new(key, seq.to_bytes(8, "big") + body, hashlib.sha256).hexdigest()

    def _encode(self, obj: dict[str, object]) -> bytes:
        """The line that carries ``obj``: as it is, with its MAC, or sealed."""
        seq = self._sent
        if self._send_key is not None:
            if self._protection == "sealed":
                blob = AESGCM(self._send_key).encrypt(_nonce(seq), _canonical(obj), None)
                obj = {"sealed": base64.b64encode(blob).decode()}
            else:
                obj = {**obj, "mac": self._mac(self._send_key, seq, obj)}
        line = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        if len(line) > MAX_LINE:  # the peer would refuse it: say so here, numbers unchanged
            raise ControlError(f"side-channel message of {len(line)} bytes (limit {MAX_LINE})")
        if self._send_key is not None:
            self._sent = seq + 1
        return line

    def post(self, obj: dict[str, object]) -> None:
        """Queue ``obj`` for sending without waiting for room (a path of the side channel:
        a blackholed one must not hold up the others; :meth:`unsent` tells how much waits)."""
        if self.writer.is_closing():
            raise ControlError("side channel to the peer is closed")
        self.writer.write(self._encode(obj))

    def unsent(self) -> int:
        """Bytes queued on this channel and not yet taken by the kernel."""
        return self.writer.transport.get_write_buffer_size()

    async def send(self, obj: dict[str, object]) -> None:
        self.writer.write(self._encode(obj))
        try:
            await self.writer.drain()
        except (ConnectionError, OSError) as exc:
            raise ControlError(f"side channel to the peer broke: {exc}") from None

    async def recv(self, timeout: float | None = None) -> dict[str, object] | None:
        """The next message, or None when the peer closed the channel."""
        try:
            line = await asyncio.wait_for(self.reader.readline(), timeout)
        except TimeoutError:
            raise ControlError("peer did not answer on the side channel in time") from None
        except (ConnectionError, OSError) as exc:
            raise ControlError(f"side channel to the peer broke: {exc}") from None
        except ValueError:  # readline: no line end within the reader's limit (MAX_LINE)
            raise ControlError(
                f"peer sent a side-channel message over {MAX_LINE} bytes long"
            ) from None
        if not line:
            return None
        obj = _parse(line)
        if self._recv_key is None:
            return obj
        if self._protection == "sealed":
            return self._open(obj)
        return self._check(obj)

    def _unauthenticated_refusal(self, obj: dict[str, object]) -> bool:
        """A clear refusal before the first authentic message (see :meth:`authenticate`)."""
        return self._received == 0 and obj.get("ok") is False

    def _check(self, obj: dict[str, object]) -> dict[str, object]:
        assert self._recv_key is not None
        mac = obj.pop("mac", None)
        if mac is None and self._unauthenticated_refusal(obj):
            return obj
        want = self._mac(self._recv_key, self._received, obj)
        if not isinstance(mac, str) or not hmac.compare_digest(mac, want):
            raise ControlError(_FORGED)
        self._received += 1
        return obj

    def _open(self, obj: dict[str, object]) -> dict[str, object]:
        assert self._recv_key is not None
        sealed = obj.get("sealed")
        if sealed is None and self._unauthenticated_refusal(obj):
            return obj
        if not isinstance(sealed, str) or len(obj) != 1:
            raise ControlError(_FORGED)
        try:
            blob = base64.b64decode(sealed, validate=True)
            plain = AESGCM(self._recv_key).decrypt(_nonce(self._received), blob, None)
        except (binascii.Error, ValueError, InvalidTag):
            raise ControlError(_FORGED) from None
        self._received += 1
        return _parse(plain)

    def peer_closed(self) -> bool:
        """Whether the peer's close (its FIN) has arrived, lines it sent before it may still
        be unread. (``StreamReader.at_eof`` also wants them read; a reset that follows the
        FIN is raised before them.)"""
        return bool(getattr(self.reader, "_eof", False))

    def close(self) -> None:
        """Close: our FIN first (``write_eof``, once what is buffered is sent), then the
        socket. Closed with bytes unread (the peer's acknowledgement of our last message,
        come before the loop read it), the kernel sends a reset instead of the FIN, and the
        peer takes the path for broken: mrc-send warned "plane 0 lost" after a good
        transfer. After a FIN, a reset is a close (:meth:`peer_closed`)."""
        writer = self.writer
        if writer.is_closing():
            return
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
        writer.close()
