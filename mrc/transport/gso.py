"""UDP GSO and GRO: many datagrams through the kernel as one.

The kernel's cost per datagram, not Python's, caps a per-datagram loop on these machines (about
100-160k datagrams/s each way, docs/PERFORMANCE.md). With UDP generic segmentation offload one
``sendmsg`` hands the kernel up to 64 datagrams of one size (the last may be shorter) for one
destination as a single buffer, with the segment size in a ``UDP_SEGMENT`` control message; the
stack carries them as one skb as far as it can and cuts them into datagrams at the end. GRO on a
receiving socket is the mirror image: back-to-back datagrams of one flow arrive in one
``recvmsg`` with the segment size in a ``UDP_GRO`` control message.

A burst is the core's (``QPConfig.burst``): consecutive packets it put on the same EV, handed
over whole (``QueuePair.bursts_to_send``, the ``Burst`` shape in mrc/core/events.py) with its
segment size. This module only cuts bursts to the kernel's limits, a slice per send: it never
walks them datagram by datagram.
"""

from __future__ import annotations

import socket
import struct

from mrc.core.config import GSO_MAX_BYTES
from mrc.core.events import Burst, gathered_datagrams, is_gathered

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


def sends(bursts: list[Burst]) -> list[Send]:
    """Each burst as GSO sends of at most ``MAX_SEGMENTS`` datagrams and ``MAX_BYTES`` bytes
    (consecutive slices of it; the last datagram of a burst, the only one that may be shorter,
    ends the last slice), a burst of one as a plain send. A gathered burst (one buffer,
    ``is_gathered``) is sliced by bytes, the others by buffer pairs."""
    out: list[Send] = []
    for ev, bufs, count, seg in bursts:
        if count == 1:
            out.append((ev, bufs, _NONE, 1))
            continue
        per = MAX_BYTES // seg if seg > 0 else 0
        if per > MAX_SEGMENTS:
            per = MAX_SEGMENTS
        if per >= count:
            out.append((ev, bufs, _segment(seg), count))
        elif per < 2:
            out.extend(_singles(ev, bufs, count, seg))
        else:
            cmsg = _segment(seg)
            gathered = is_gathered(bufs, count)
            for i in range(0, count, per):
                n = count - i if count - i < per else per
                part: list[Buffer] = (
                    [memoryview(bufs[0])[i * seg : (i + n) * seg]]
                    if gathered
                    else bufs[2 * i : 2 * (i + n)]
                )
                out.append((ev, part, cmsg if n > 1 else _NONE, n))
    return out


def _singles(ev: int, bufs: list[Buffer], count: int, seg: int) -> list[Send]:
    """One burst's datagrams, each its own send."""
    if is_gathered(bufs, count):
        return [(ev, [d], _NONE, 1) for d in gathered_datagrams(bufs[0], count, seg)]
    return [(ev, bufs[i : i + 2], _NONE, 1) for i in range(0, 2 * count, 2)]


def singles(bursts: list[Burst]) -> list[Send]:
    """Every datagram its own send (no GSO)."""
    return [one for ev, bufs, count, seg in bursts for one in _singles(ev, bufs, count, seg)]


def split(send: Send) -> list[Send]:
    """A GSO send's datagrams, each its own send (where the kernel refused GSO): its segment
    size is its ``UDP_SEGMENT`` control message's."""
    ev, bufs, cmsg, count = send
    seg = struct.unpack("=H", cmsg[0][2])[0] if cmsg else sum(len(b) for b in bufs)
    return _singles(ev, bufs, count, seg)


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
