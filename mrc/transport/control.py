"""The out-of-band side channel: JSON lines over TCP, as RDMA tools exchange QP numbers.

perftest's ``ib_write_bw`` swaps QP numbers, PSNs and memory keys over a TCP socket before any
RDMA traffic flows; MRC does the same. Messages are one JSON object per line; this module
only frames them. Their schema is mrc/transport/messages.py (docs/PROTOCOL.md, "Connection
setup", documents it).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json

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


class ControlError(MRCError):
    """The side channel broke or the peer said something we cannot accept (one line)."""


class ControlChannel:
    """One TCP connection carrying JSON objects, one per line."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer_host: str = peer[0] if peer else ""
        self.peer_port: int = peer[1] if peer else 0
        # set by authenticate(): message keys and counts of each direction
        self._send_key: bytes | None = None
        self._recv_key: bytes | None = None
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

    @property
    def authenticated(self) -> bool:
        return self._send_key is not None

    @staticmethod
    def _mac(key: bytes, seq: int, obj: dict[str, object]) -> str:
        body = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
        return hmac.new(key, seq.to_bytes(8, "big") + body, hashlib.sha256).hexdigest()

    async def send(self, obj: dict[str, object]) -> None:
        if self._send_key is not None:
            obj = {**obj, "mac": self._mac(self._send_key, self._sent, obj)}
            self._sent += 1
        self.writer.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
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
        if self._recv_key is not None:
            return self._check(obj)
        return obj

    def _check(self, obj: dict[str, object]) -> dict[str, object]:
        assert self._recv_key is not None
        mac = obj.pop("mac", None)
        if mac is None and self._received == 0 and obj.get("ok") is False:
            return obj  # an unauthenticated refusal (see authenticate)
        want = self._mac(self._recv_key, self._received, obj)
        if not isinstance(mac, str) or not hmac.compare_digest(mac, want):
            raise ControlError(
                "a side-channel message failed authentication (forged, replayed or altered)"
            )
        self._received += 1
        return obj

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
