"""UDP GSO and GRO: many datagrams through the kernel as one.

The kernel's cost per datagram, not Python's, caps a per-datagram loop on these machines (about
100-160k datagrams/s each way, docs/PERFORMANCE.md). With UDP generic segmentation offload one
``sendmsg`` hands the kernel up to 64 datagrams of one size (the last may be shorter) for one
destination as a single buffer, with the segment size in a ``UDP_SEGMENT`` control message; the
stack carries them as one skb as far as it can and cuts them into datagrams at the end. GRO on a
receiving socket is the mirror image: back-to-back datagrams of one flow arrive in one
``recvmsg`` with the segment size in a ``UDP_GRO`` control message.

A burst is the core's (``QPConfig.burst``): consecutive packets it put on the same EV. This
module only finds them in what the core returns and says how to send them.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence

from mrc.core.config import GSO_MAX_BYTES

SOL_UDP = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)
UDP_GRO = getattr(socket, "UDP_GRO", 104)
MAX_SEGMENTS = 64  # UDP_MAX_SEGMENTS in the kernel
MAX_BYTES = GSO_MAX_BYTES  # one IPv6 payload (65535) less UDP header and room for an SRH
GRO_CMSG_SPACE = socket.CMSG_SPACE(4)

Buffer = bytes | memoryview
Ancillary = list[tuple[int, int, bytes]]
#: one sendmsg: EV, buffers, control messages, datagrams it carries
Send = tuple[int, list[Buffer], Ancillary, int]

_NONE: Ancillary = []
_segment_cmsg: dict[int, Ancillary] = {}


def _segment(size: int) -> Ancillary:
    cmsg = _segment_cmsg.get(size)
    if cmsg is None:
        cmsg = _segment_cmsg[size] = [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", size))]
    return cmsg


def one_by_one(datagrams: Sequence[tuple[int, bytes, Buffer]]) -> list[Send]:
    """Every datagram its own send (no GSO)."""
    return [(ev, [hdr, payload], _NONE, 1) for ev, hdr, payload in datagrams]


def coalesce(datagrams: Sequence[tuple[int, bytes, Buffer]]) -> list[Send]:
    """Runs of consecutive datagrams on one EV, of one size (the last of a run may be
    shorter), as GSO sends; anything else as a plain send."""
    out: list[Send] = []
    n = len(datagrams)
    i = 0
    while i < n:
        ev, hdr, payload = datagrams[i]
        size = len(hdr) + len(payload)
        bufs: list[Buffer] = [hdr, payload]
        total = size
        j = i + 1
        while j < n and j - i < MAX_SEGMENTS:
            ev2, hdr2, payload2 = datagrams[j]
            size2 = len(hdr2) + len(payload2)
            if ev2 != ev or size2 > size or total + size2 > MAX_BYTES or size2 == 0:
                break
            bufs.append(hdr2)
            bufs.append(payload2)
            total += size2
            j += 1
            if size2 < size:
                break  # only the last segment may be shorter
        out.append((ev, bufs, _segment(size) if j - i > 1 else _NONE, j - i))
        i = j
    return out


def enable_gro(sock: socket.socket) -> bool:
    """Ask for GRO on a receiving socket; False where the kernel does not offer it."""
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
    except OSError:
        return False
    return True


def gro_segment(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The segment size of a coalesced receive (0: a single datagram)."""
    for level, kind, data in ancillary:
        if level == SOL_UDP and kind == UDP_GRO:
            return segment_size(data)
    return 0


def segment_size(data: bytes) -> int:
    """The value of a ``UDP_GRO`` control message (an int; 2 bytes on some kernels)."""
    if len(data) >= 4:
        return int(struct.unpack_from("=i", data)[0])
    if len(data) >= 2:
        return int(struct.unpack_from("=H", data)[0])
    return 0
