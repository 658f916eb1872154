"""Keyed mode a burst and a train at a time: the pure-Python twins of ``mrc._native_gcm``'s
``seal_burst`` and ``open_train``.

A queue pair seals every burst it sends and opens every GRO train it receives. Done datagram
by datagram from Python, the loop around each AES-GCM call cost about as much as the AES-GCM
itself, so the C kernels take a whole burst (``Sealer.seal_burst``) or the run of a train's
WRITEs to one QP (``Opener.open_train``) in one call. These twins do exactly what the kernels
do, with the per-datagram Python of :class:`~mrc.security.packet.Sealer` and
:class:`~mrc.security.packet.Opener` (``cryptography``'s AES-GCM): they are the reference the
kernels are tested against (tests/security/test_trains_native.py: the same bytes, returns,
drop reasons and replay window) and the fallback where the kernels are not in use.

Sans-IO: buffers in, buffers out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mrc import wire
from mrc.errors import MRCError

if TYPE_CHECKING:
    from mrc.security.packet import Opener, Sealer

_OP_WRITE = int(wire.Opcode.RDMA_WRITE_ONLY)
_OP_WRITE_IMM = int(wire.Opcode.RDMA_WRITE_ONLY_IMM)
_DATA_HDR_LEN = wire.DATA_HDR_LEN
#: where a whole data packet's datagram lies once opened in place (packet.DATA_OVERHEAD:
#: the security block and payload ICV before it); not imported, packet imports this module
_SKIP = 28 + 16


def seal_burst(
    sealer: Sealer, bufs: list[bytes | memoryview], count: int, counter: int
) -> tuple[list[bytes | memoryview], int]:
    """``mrc._native_gcm.seal_burst``: the ``count`` datagrams of a burst's ``bufs``
    ((headers, payload) each) sealed with counters ``counter + 1`` on; (parts, seg), the
    sealed list and its segment size if the datagrams still make one GSO burst, else -1."""
    if not 1 <= count <= len(bufs) // 2:
        raise ValueError("count must be 1 to len(bufs) // 2")
    seal = sealer.seal_py
    parts: list[bytes | memoryview] = []
    sizes = []
    for i in range(count):
        headers = bufs[2 * i]
        if not 9 <= len(headers) <= 64:
            raise ValueError("the headers must be 9 to 64 bytes")
        payload = bufs[2 * i + 1] if headers[0] in (_OP_WRITE, _OP_WRITE_IMM) else None
        head, body = seal(headers, payload, counter + 1 + i)
        parts += (head, body)
        sizes.append(len(head) + len(body))
    first, last = sizes[0], sizes[-1]
    if count == 1 or (all(size == first for size in sizes[1:-1]) and last <= first):
        return parts, first
    return parts, -1


def open_train(
    opener: Opener, view: memoryview, off: int, seg: int, cap: int, qpn: int
) -> tuple[int, str | None, int, int]:
    """``mrc._native_gcm.open_train``: the segments of ``view`` from ``off`` that are WRITEs
    naming ``qpn``, opened in place (at most ``cap``), stopping at the first that is not one,
    does not open, or opens to something other than a whole data packet; (opened, drop reason
    of the one that stopped them or None, and where that one lies unsealed if it opened to
    another form, else 0, 0)."""
    if seg < 1 or off < 0 or cap < 0:
        raise ValueError("seg must be positive, off and cap not negative")
    n = len(view)
    if off > n:
        raise ValueError("off is past the train's end")
    open_py = opener.open_in_place_py
    o = off
    opened = 0
    while o < n and opened < cap:
        end = min(o + seg, n)
        if (
            end - o < _SKIP + _DATA_HDR_LEN
            or view[o] != _OP_WRITE
            or view[o + 1] & 0x0F != wire.MRC_TVER
            or (view[o + 5] << 16) | (view[o + 6] << 8) | view[o + 7] != qpn
        ):
            break
        try:
            start, stop = open_py(view[o:end], _DATA_HDR_LEN, True)
        except MRCError as exc:  # packet.SecurityDrop (packet imports this module)
            return opened, getattr(exc, "reason", "security_error"), 0, 0
        if stop - start != end - o - _SKIP:
            return opened, None, o + start, o + stop
        o = end
        opened += 1
    return opened, None, 0, 0
