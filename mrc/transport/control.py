"""The out-of-band side channel: JSON lines over TCP, as RDMA tools exchange QP numbers.

perftest's ``ib_write_bw`` swaps QP numbers, PSNs and memory keys over a TCP socket before any
RDMA traffic flows; MRC does the same. Messages are one JSON object per line; this module
only frames them. Their schema is mrc/transport/messages.py (docs/PROTOCOL.md, "Connection
setup", documents it).
"""

from __future__ import annotations

import asyncio
import json

from mrc.errors import MRCError

MAX_LINE = 1 << 20  # bytes of one message, line end included: pass as the StreamReader limit


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

    async def send(self, obj: dict[str, object]) -> None:
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
        try:
            obj = json.loads(line)
        except ValueError:
            raise ControlError("peer is not speaking the MRC side-channel protocol") from None
        if not isinstance(obj, dict):
            raise ControlError("peer is not speaking the MRC side-channel protocol")
        return obj

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
