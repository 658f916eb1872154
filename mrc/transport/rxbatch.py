"""The receive batch: many receives from one socket in one call, with what each one's control
messages said.

A receive of a GRO train costs the kernel its copy (about 10 µs for seven 8 KiB datagrams on
these machines); in Python, ``recvmsg_into`` adds a few µs more: the result tuple, the
sender's address formatted as a string, a list of control messages as bytes, and reading
them (docs/PERFORMANCE.md, "The receive loop"). ``recv_batch(sock, buf, slot, most, ecn,
space)`` receives up to ``most`` times into consecutive ``slot``-byte slots of ``buf``, in C
without the GIL (``mrc._native.recv_batch``) or in Python (:func:`py_recv_batch`, the
reference and the fallback: ``MRC_NATIVE=0``, no compiler).

Returns ``(metas, tries, empty)``. ``metas[i]``, for the receive in slot ``i`` (from byte ``i
* slot`` of ``buf``), is ``(nbytes, seg, ce, label, port, stamp)``: bytes received; the GRO
segment size its control message gave (0: none; the caller decides whether the receive is a
train); whether it came with CE (``ecn`` False: not read from the flow information); the EV
bits of its flow label; its source port; when the kernel received it, CLOCK_REALTIME seconds
as ``SCM_TIMESTAMPNS`` said (0.0: no such message; the caller takes the difference to
``time.time()`` for how long the receive waited in the socket, :func:`enable_timestamps`).
``tries``: attempts used (a receive that fails with a
pending socket error, such as an ICMP error, uses one and reads nothing); ``empty``: the
socket had nothing more (``EAGAIN``). It stops after ``most`` attempts or when the slots are
full (``MAX_SLOTS`` at most).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from mrc import native, wire
from mrc.transport import ecn as _ecn
from mrc.transport import flowlabel, gso

#: receives per call at most, whatever the buffer holds
MAX_SLOTS = 64

_SOL_UDP = gso.SOL_UDP
_UDP_GRO = gso.UDP_GRO
_IPPROTO_IPV6 = socket.IPPROTO_IPV6
_FLOWINFO = flowlabel.IPV6_FLOWINFO
_LABEL_MASK = wire.EV_LABEL_MASK
_CE_IN_FLOWINFO = _ecn.CE << flowlabel.TCLASS_SHIFT
_SOL_SOCKET = socket.SOL_SOCKET
#: SO_TIMESTAMPNS, and the control message it adds (SCM_TIMESTAMPNS, the same number)
SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
#: a struct timespec (tv_sec, tv_nsec) as the kernel writes it
_TIMESPEC = struct.Struct("@qq")
#: room for one SCM_TIMESTAMPNS message
TIMESTAMP_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)
_NO_META = (0, False, 0, 0.0)

if TYPE_CHECKING:
    Meta = tuple[int, int, bool, int, int, float]
    RecvBatch = Callable[
        [socket.socket, bytearray, int, int, bool, int], tuple[list[Meta], int, bool]
    ]


def enable_timestamps(sock: socket.socket) -> bool:
    """Ask ``sock`` for each receive's kernel timestamp (``SO_TIMESTAMPNS``): how long a
    datagram waited in the socket is host delay, not the network's (docs/PROTOCOL.md, the
    ACK's ACK Delay). False where the kernel refuses."""
    try:
        sock.setsockopt(_SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def rx_meta(
    ancillary: list[tuple[int, int, bytes]], ecn: bool = True
) -> tuple[int, bool, int, float]:
    """(GRO segment size or 0, CE, the flow label's EV bits, the kernel timestamp or 0.0)
    from the control messages of one receive. The flow information carries the traffic
    class too: its ECN field is read from it where it came (IPv6), from the traffic class /
    TOS message elsewhere; ``ecn`` False: CE is never reported from the flow information."""
    seg = 0
    ce = False
    label = 0
    stamp = 0.0
    for level, kind, data in ancillary:
        if level == _SOL_UDP and kind == _UDP_GRO:
            seg = gso.segment_size(data)
        elif level == _IPPROTO_IPV6 and kind == _FLOWINFO:
            info = int.from_bytes(data, "big")
            label = info & _LABEL_MASK
            ce = ce or (ecn and info & _CE_IN_FLOWINFO == _CE_IN_FLOWINFO)
        elif level == _SOL_SOCKET and kind == SO_TIMESTAMPNS:
            if len(data) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(data)
                # as the C kernel adds them (the same float, bit for bit)
                stamp = float(sec) + nsec * 1e-9 if sec or nsec else 0.0
        else:
            ce = _ecn.is_ce(level, kind, data) or ce
    return seg, ce, label, stamp


def py_recv_batch(
    sock: socket.socket,
    buf: bytearray,
    slot: int,
    most: int,
    ecn: bool,
    space: int,
) -> tuple[list[Meta], int, bool]:
    """The reference (see the module docstring); ``mrc._native.recv_batch`` mirrors it, with
    room of its own for the control messages (``space`` is what this one asks for)."""
    if slot < 1:
        raise ValueError("a slot holds at least one byte")
    view = memoryview(buf)
    slots = min(len(view) // slot, MAX_SLOTS)
    recv = sock.recvmsg_into
    metas: list[Meta] = []
    tries = 0
    while tries < most and len(metas) < slots:
        at = len(metas) * slot
        try:
            n, anc, _flags, addr = recv([view[at : at + slot]], space)
        except BlockingIOError:
            return metas, tries, True
        except OSError:
            tries += 1  # a pending socket error (e.g. from ICMP): nothing was read
            continue
        tries += 1
        seg, ce, label, stamp = rx_meta(anc, ecn) if anc else _NO_META
        metas.append((n, seg, ce, label, addr[1], stamp))
    return metas, tries, False


#: the C kernel (mrc.native.module's), or None where it was not built (or MRC_NATIVE=0, or a
#: stale build)
native_recv_batch: RecvBatch | None = None if native.module is None else native.module.recv_batch
#: what the endpoint calls for every readable socket (tests may swap it)
recv_batch: RecvBatch = native_recv_batch or py_recv_batch
