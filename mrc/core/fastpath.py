"""The batch kernels of the data path, each native (``mrc._native``) or Python.

* :func:`place_train` (receiver): the common case of a GRO train, placed in one call.
* :func:`note_arrivals` (receiver): the SACK bits of what a train placed, set in one call
  (see its docstring below).
* :func:`note_runs` (receiver): all of a train's arrivals recorded in one call: the SACK bits,
  the cumulative point and the ACK counters, run by run, back to Python only where an ACK must
  go at once (see its docstring below).
* :func:`pack_burst` (sender): the headers of a burst of data packets, written in one call
  (see its docstring below).
* :class:`Packet`, :func:`record_burst` and :func:`take_acked` (sender): the record of a
  packet in flight, the records and send buffers of a burst made in one call, and the records
  an ACK acknowledged removed in one call (see :class:`PyPacket` and the two functions'
  docstrings below); :func:`take_ack` (sender): what an ACK acknowledges, read from its
  fields, taken, and the cumulative point moved, in one call; :func:`gather_burst` (sender):
  a burst's datagrams copied back to back into one send buffer (see its docstring below).

Keyed mode's C kernels (``open_in_place``, ``seal_packet``: sealing and unsealing, AES-GCM
included, from ``mrc._native_gcm``) are :mod:`mrc.security.packet`'s, beside their Python
reference; every C kernel comes from :mod:`mrc.native`, which uses the extensions together or
not at all (``mrc._native`` alone where the AES-GCM one was not built).

A receiver spends most of its time on plain data packets that are exactly what it expects:
an untrimmed, unprotected RDMA WRITE ONLY to this QP, under the rkey of the region being
written, in bounds, new and inside the PSN window. :func:`place_train` walks a train of such
segments, copies each payload into the region and reports its sequence number and marks; it
stops at the first segment that is anything else, so the caller hands that one to the general
path (``Responder.on_data``, which counts, drops and NACKs it) and resumes after it. Nothing
here counts or answers: a segment is either placed and reported, or left alone.

Two implementations with one signature and identical results, byte for byte: the C kernel in
``mrc/_native.c`` (built by ``pip install``, optional) and :func:`py_place_train` below, the
reference and the fallback. ``MRC_NATIVE=0`` in the environment forces the Python one (as a
stale build does: :mod:`mrc.native`); :data:`NATIVE` says which one :data:`place_train` is.

Arguments of ``place_train(view, off, seg, qpn, rkey, region, region_addr, initial_psn, cum,
hi, window, blocks, seqs, marks[, skip])``:

* ``view``: the received bytes; the train's segments are ``seg`` bytes each from byte ``off``
  (``seg`` > 0; the last segment may be shorter).
* ``skip`` (default 0): each segment's datagram starts this many bytes into it. A protected
  train unsealed in place (integrity mode) has each datagram's headers moved up to its
  payload, over the security block and payload ICV: ``skip`` is their length.
* ``qpn``, ``rkey``: the destination QP and the rkey a segment must carry; ``region`` and
  ``region_addr``: the writable buffer of that rkey and its virtual address.
* ``initial_psn``, ``cum``, ``window``: the peer's initial PSN, the responder's cumulative
  sequence number and its PSN window: a segment's sequence number must be in
  ``(cum, cum + window]``.
* ``hi``: no sequence number above it has arrived; ``blocks``: the responder's SACK bitmaps
  (block number -> 64-bit map) of what has arrived above ``cum``. A segment at or below ``hi``
  is placed only if neither ``blocks`` nor this call already has it.
* ``seqs`` (``array('q')``) and ``marks`` (``bytearray``): outputs, one entry per placed
  segment: its sequence number, and ``MARK_FECN | MARK_ACKREQ`` as the BTH carried them. Their
  length bounds how many segments one call places.

Returns ``(stop, placed, nbytes)``: the offset of the first segment not placed (``len(view)``
once the train is done), how many were placed, and their payload bytes.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from itertools import chain
from typing import TYPE_CHECKING, Any

from mrc import native, wire

MARK_FECN = 1
MARK_ACKREQ = 2

_HDR = wire.DATA_HDR
_HDR_LEN = wire.DATA_HDR_LEN
_IMM_HDR = wire.DATA_IMM_HDR
_OP_WRITE = int(wire.Opcode.RDMA_WRITE_ONLY)
_OP_WRITE_IMM = int(wire.Opcode.RDMA_WRITE_ONLY_IMM)
_PKEY = wire.DEFAULT_PKEY
_FLAGS1 = wire.MRC_TVER & 0x0F
_ACKREQ = wire.BTH_ACKREQ << 24
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
_PSN_MASK = wire.PSN_MASK
_HALF = 1 << 23
_INF = float("inf")
# BTH byte 4 marks that take a segment off the common path: trimmed (and last hop)
_TRIM = wire.BTH_TRIMMED
_SECURE = wire.BTH_SECURE

if TYPE_CHECKING:  # array is generic only for type checkers before Python 3.12
    from typing import Protocol

    class PlaceTrain(Protocol):
        """Either kernel's signature: ``skip`` may be left out (0), as in both of them."""

        def __call__(
            self,
            view: memoryview,
            off: int,
            seg: int,
            qpn: int,
            rkey: int,
            region: memoryview,
            region_addr: int,
            initial_psn: int,
            cum: int,
            hi: int,
            window: int,
            blocks: dict[int, int],
            seqs: array[int],
            marks: bytearray,
            skip: int = 0,
            /,
        ) -> tuple[int, int, int]: ...

    NoteRuns = Callable[
        [
            array[int],
            bytearray,
            int,
            int,
            dict[int, int],
            set[int],
            int,
            int,
            int,
            int,
            bool,
            int,
            int,
        ],
        tuple[int, int, int, int, int, int],
    ]
    PackBurst = Callable[
        [bytearray | memoryview, int, int, int, int, int, int, int, int, bool, int], int
    ]
    NoteArrivals = Callable[
        [array[int], bytearray, int, int, dict[int, int], set[int], int], tuple[int, int, bool]
    ]
    RecordBurst = Callable[
        [
            dict[int, Any],
            array[int],
            Any,
            memoryview,
            memoryview,
            int,
            int,
            int,
            int,
            int,
            int,
            int,
            int,
            bool,
            int,
            float,
            float,
            list[bytes | memoryview] | None,
        ],
        None,
    ]
    GatherBurst = Callable[
        [memoryview, int, memoryview, int, memoryview, int, int, int, int, int], int
    ]
    TakeAck = Callable[
        [
            dict[int, Any],
            int,
            int,
            int,
            int,
            int,
            int,
            list[int],
            list[float],
            list[int] | None,
            list[float],
            Callable[[int, float], None] | None,
        ],
        tuple[int, int, int, int, int, bool],
    ]
    TakeAcked = Callable[
        [
            dict[int, Any],
            int,
            int,
            list[int],
            list[int],
            list[float],
            list[int] | None,
            list[float],
            Callable[[int, float], None] | None,
        ],
        tuple[int, int],
    ]


def py_place_train(
    view: memoryview,
    off: int,
    seg: int,
    qpn: int,
    rkey: int,
    region: memoryview,
    region_addr: int,
    initial_psn: int,
    cum: int,
    hi: int,
    window: int,
    blocks: dict[int, int],
    seqs: array[int],
    marks: bytearray,
    skip: int = 0,
) -> tuple[int, int, int]:
    """The reference implementation (see the module docstring); ``mrc._native`` mirrors it."""
    if seg <= 0 or off < 0 or skip < 0:
        raise ValueError("segment size must be positive and the offset and skip not negative")
    n = len(view)
    cap = min(len(seqs), len(marks))
    region_len = len(region)
    unpack = _HDR.unpack_from
    near_psn = (initial_psn + cum + 1) & _PSN_MASK
    placed = 0
    nbytes = 0
    o = off
    while o < n and placed < cap:
        end = min(o + seg, n)
        size = end - o - skip
        if size < _HDR_LEN:
            break
        (op, flags, _pkey, qpw, psnw, va, key, length) = unpack(view, o + skip)
        if (
            op != _OP_WRITE
            or flags & 0x0F != wire.MRC_TVER
            or qpw & wire.QPN_MASK != qpn
            or (qpw >> 24) & _TRIM
            or (psnw >> 24) & _SECURE
            or key != rkey
            or length != size - _HDR_LEN
        ):
            break
        offset = va - region_addr
        if offset < 0 or offset + length > region_len:
            break
        seq = cum + 1 + (((psnw & _PSN_MASK) - near_psn + _HALF) & _PSN_MASK) - _HALF
        if seq <= cum or seq > cum + window:
            break
        if seq <= hi:
            # not beyond everything seen: new only if neither the bitmaps nor this call has it
            if (blocks.get(seq >> 6, 0) >> (seq & 63)) & 1:
                break
            if seq in seqs[:placed]:
                break
        else:
            hi = seq
        region[offset : offset + length] = view[o + skip + _HDR_LEN : end]
        seqs[placed] = seq
        marks[placed] = (MARK_FECN if qpw & (wire.BTH_FECN << 24) else 0) | (
            MARK_ACKREQ if psnw & (wire.BTH_ACKREQ << 24) else 0
        )
        placed += 1
        nbytes += length
        o = end
    return min(o, n), placed, nbytes


def py_note_arrivals(
    seqs: array[int],
    marks: bytearray,
    start: int,
    stop: int,
    blocks: dict[int, int],
    dirty: set[int],
    hi: int,
) -> tuple[int, int, bool]:
    """Set the SACK bits of the arrivals ``seqs[start:stop]``, in order, and stop after the
    first whose mark asks for an ACK (``MARK_ACKREQ``); ``mrc._native.note_arrivals`` mirrors
    it. Returns ``(end, hi, force)``: the index after the last arrival taken, the highest
    sequence number seen (``hi`` or above) and whether one asked for an ACK.

    For each arrival, bit ``seq & 63`` of ``blocks[seq >> 6]`` is set and the block number
    added to ``dirty`` (the blocks the next ACK reports), exactly as the responder records a
    single arrival. This is what the responder does with what :func:`place_train` reports,
    once per run of a train; per packet in Python it cost about as much as the placement copy
    (docs/PERFORMANCE.md). ``stop`` past the end of ``seqs`` or ``marks`` is cut to it; a
    negative ``start`` raises ValueError."""
    if start < 0:
        raise ValueError("start must not be negative")
    stop = min(stop, len(seqs), len(marks))
    force = False
    j = start
    while j < stop:
        seq = seqs[j]
        j += 1
        b = seq >> 6
        blocks[b] = blocks.get(b, 0) | (1 << (seq & 63))
        dirty.add(b)
        if seq > hi:
            hi = seq
        if marks[j - 1] & MARK_ACKREQ:
            force = True
            break
    return j, hi, force


#: :func:`note_runs` flags: an ACK fell due (the responder's ACK deadline is now)
RUN_DUE = 1
#: the last run's ACK goes at once (CE on its subject, or ``ack_batch_max`` arrivals owed):
#: the caller flushes before it calls again
RUN_FLUSH = 2
#: the last run's last arrival carried CE (the mark its ACK echoes)
RUN_CE = 4
#: bound of the counters :func:`note_runs` takes (so that none overflows 64 bits in C)
_RUN_LIMIT = 1 << 62


def py_note_runs(
    seqs: array[int],
    marks: bytearray,
    start: int,
    count: int,
    blocks: dict[int, int],
    dirty: set[int],
    hi: int,
    cum: int,
    pending: int,
    next_due: int,
    ack_due: bool,
    ack_every: int,
    ack_batch_max: int,
) -> tuple[int, int, int, int, int, int]:
    """Record the arrivals ``seqs[start:count]`` (with ``marks``) as ``Responder._arrived``
    does, run by run, without its Python per run; ``mrc._native.note_runs`` mirrors it.
    Returns ``(end, hi, cum, pending, next_due, flags)``.

    A run ends where an arrival makes an ACK due (the ``next_due``-th arrival owed, or
    ``ack_batch_max`` of them while one is due already, or an AckReq): its SACK bits are set
    (:func:`py_note_arrivals`), the cumulative point ``cum`` moves over every contiguous
    arrival (a block it passes whole leaves ``blocks``), and ``pending`` (arrivals not yet
    acknowledged), ``next_due`` and ``ack_due`` are updated as ``Responder._note_arrival``
    updates them. It stops after ``count`` arrivals, or after the first run whose ACK must go
    at once (``RUN_FLUSH``: CE on its last arrival, or ``ack_batch_max`` owed), so that the
    caller's ACK reports exactly what a lone arrival's would. ``end``: the index after the last
    arrival taken (``seqs[end - 1]``, the latest run's last, is the ACK's subject); ``flags``:
    ``RUN_DUE`` if an ACK fell due, ``RUN_CE`` if the latest run's last arrival had CE.

    Per train, in Python, this was about as dear as placing the train (docs/PERFORMANCE.md).
    Out-of-range arguments raise ValueError and change nothing."""
    if not 0 <= start <= count <= min(len(seqs), len(marks)):
        raise ValueError("start and count must lie within the arrivals")
    lim = _RUN_LIMIT
    if not (
        -lim < hi < lim
        and -lim < cum < lim
        and 0 <= pending < lim
        and 0 <= next_due < lim
        and 0 < ack_every < lim
        and 0 < ack_batch_max < lim
    ):
        raise ValueError("a counter is out of range")
    flags = 0
    i = start
    while i < count:
        owed = next_due
        if ack_due and ack_batch_max < owed:
            owed = ack_batch_max
        stop = min(count, i + max(owed - pending, 1))
        j, hi, force = py_note_arrivals(seqs, marks, i, stop, blocks, dirty, hi)
        nxt = cum + 1
        while True:  # over every contiguous arrival, as Responder._advance
            b = nxt >> 6
            bm = blocks.get(b, 0) >> (nxt & 63)
            if not bm & 1:
                break
            cum += (~bm & (bm + 1)).bit_length() - 1  # its trailing ones
            if (cum & 63) == 63:
                blocks.pop(b, None)
            nxt = cum + 1
        flags = (flags & RUN_DUE) | (RUN_CE if marks[j - 1] & MARK_FECN else 0)
        pending += j - i
        i = j
        if force or pending >= next_due:
            next_due = pending + ack_every
            if flags & RUN_CE or pending >= ack_batch_max:
                return i, hi, cum, pending, next_due, flags | RUN_FLUSH
            ack_due = True
            flags |= RUN_DUE
        elif ack_due and pending >= ack_batch_max:
            return i, hi, cum, pending, next_due, flags | RUN_FLUSH
    return i, hi, cum, pending, next_due, flags


def py_pack_burst(
    buf: bytearray | memoryview,
    off: int,
    qpn: int,
    psn: int,
    va: int,
    rkey: int,
    size: int,
    count: int,
    last_size: int,
    last: bool,
    imm: int,
) -> int:
    """Write the headers of ``count`` consecutive data packets back to back into ``buf`` from
    byte ``off``; return the offset just past them. ``mrc._native.pack_burst`` mirrors it.

    Packet ``i`` is an RDMA WRITE ONLY of PSN ``(psn + i) mod 2^24`` at ``va + i * size`` under
    ``rkey``, ``size`` bytes long, except the last: ``last_size`` bytes, AckReq set when
    ``last`` (the end of a work request) and, when ``imm`` is not -1, a WRITE ONLY with
    immediate ``imm`` (32 header bytes instead of 28). Byte for byte what ``wire.pack_data``
    gives for each packet, in one call per burst instead of one per packet: a burst's headers
    differ only in those fields. A value out of range raises ValueError and writes nothing.
    """
    if count < 1:
        raise ValueError("a burst has at least one packet")
    if not (
        0 <= qpn <= wire.QPN_MASK
        and 0 <= psn <= _PSN_MASK
        and 0 <= rkey <= _U32
        and 0 <= size <= _U32
        and 0 <= last_size <= _U32
        and -1 <= imm <= _U32
        and va >= 0
        and va + (count - 1) * size <= _U64
    ):
        raise ValueError("a header field is out of range")
    end = off + (count - 1) * _HDR_LEN + (_HDR_LEN if imm < 0 else wire.DATA_IMM_HDR_LEN)
    if off < 0 or end > len(buf):
        raise ValueError("the headers do not fit the buffer")
    pack = _HDR.pack_into
    o = off
    for i in range(count - 1):
        pack(buf, o, _OP_WRITE, _FLAGS1, _PKEY, qpn, (psn + i) & _PSN_MASK, va, rkey, size)
        va += size
        o += _HDR_LEN
    psnw = ((psn + count - 1) & _PSN_MASK) | (_ACKREQ if last else 0)
    if imm < 0:
        pack(buf, o, _OP_WRITE, _FLAGS1, _PKEY, qpn, psnw, va, rkey, last_size)
    else:
        _IMM_HDR.pack_into(
            buf, o, _OP_WRITE_IMM, _FLAGS1, _PKEY, qpn, psnw, va, rkey, last_size, imm
        )
    return end


class PyPacket:
    """The record of a packet in flight (``Requester._outstanding``): the reference of
    ``mrc._native.Packet``, which has these attributes and this constructor."""

    __slots__ = (
        "wr",
        "offset",
        "length",
        "last",
        "ev",
        "sent_at",
        "deadline",
        "timeouts",
        "nacks",
        "nacked",
        "retransmitted",
        "ambiguous",
        "probed",
        "silenced",
    )

    def __init__(
        self,
        wr: Any,
        offset: int,
        length: int,
        last: bool,
        ev: int,
        sent_at: float,
        deadline: float,
    ) -> None:
        self.wr = wr  # its work request (Requester's _WorkRequest)
        self.offset = offset  # its first byte in the request
        self.length = length
        self.last = last  # the request's last packet
        self.ev = ev  # the EV (index) of its latest transmission
        self.sent_at = sent_at
        self.deadline = deadline
        self.timeouts = 0
        self.nacks = 0
        self.nacked = False  # a NACK of its latest transmission was acted on
        self.retransmitted = False
        # an earlier transmission may still arrive, so an ACK does not say which one it
        # answers (Karn's rule: no RTT sample). Not so after a trim: the trimmed copy's
        # payload is gone, and only the NACK of its header came back
        self.ambiguous = False
        # a tail loss probe's transmissions before it, as (ev, sent_at), until an ACK of the
        # probe tells whether they were lost (docs/EV_HEALTH.md, "Evidence of loss"); None
        self.probed: list[tuple[int, float]] | None = None
        # this transmission timed out in a silence of the whole peer and was left to wait
        # for the oldest one's resend (``LossTimers._time_out_silence``): its loss is no evidence
        # against its EV or plane, however it is found later
        self.silenced = False


def py_record_burst(
    outstanding: dict[int, Any],
    ring: array[int],
    wr: Any,
    hview: memoryview,
    view: memoryview,
    seq: int,
    n: int,
    ev: int,
    ev_value: int,
    h: int,
    off: int,
    payload: int,
    last_len: int,
    last: bool,
    final_hdr: int,
    now: float,
    deadline: float,
    bufs: list[bytes | memoryview] | None,
) -> None:
    """Record a burst of ``n`` packets sent on EV ``ev`` (its value ``ev_value``) and append
    their send buffers to ``bufs`` (unless None: the burst was gathered, :func:`py_gather_burst`);
    ``mrc._native.record_burst`` mirrors it.

    Packet ``seq + i`` carries ``payload`` bytes of ``wr``'s ``view`` from ``off + i *
    payload``, its header ``HDR_LEN`` bytes of ``hview`` from ``h + i * HDR_LEN``, except the
    last: ``last_len`` bytes and a ``final_hdr``-byte header, and ``last`` (the end of the
    request). Each gets a :class:`PyPacket` in ``outstanding`` (sent ``now``, due at
    ``deadline``), ``(seq << 32) | ev_value`` at ``ring[seq % len(ring)]`` (an ``array('q')``
    of a power of two: set in place, without an int object per packet, in C),
    and two buffers, header then payload. The per-packet part of a burst's send: in Python
    about as dear as a packet's kernel send (docs/PERFORMANCE.md)."""
    if not isinstance(ring, array) or ring.typecode != "q":
        raise TypeError("the ring must be an array('q')")
    mask = len(ring) - 1
    if len(ring) < 1 or len(ring) & mask:
        raise ValueError("the ring's length must be a power of two")
    if n < 1:
        raise ValueError("a burst's field is out of range")
    o = off
    for s in range(seq, seq + n - 1):
        outstanding[s] = PyPacket(wr, o, payload, False, ev, now, deadline)
        ring[s & mask] = (s << 32) | ev_value
        if bufs is not None:
            bufs.append(hview[h : h + _HDR_LEN])
            bufs.append(view[o : o + payload])
        h += _HDR_LEN
        o += payload
    s = seq + n - 1
    outstanding[s] = PyPacket(wr, o, last_len, last, ev, now, deadline)
    ring[s & mask] = (s << 32) | ev_value
    if bufs is not None:
        bufs.append(hview[h : h + final_hdr])
        bufs.append(view[o : o + last_len])


def py_gather_burst(
    dst: memoryview,
    pos: int,
    hview: memoryview,
    h: int,
    view: memoryview,
    off: int,
    n: int,
    payload: int,
    last_len: int,
    final_hdr: int,
) -> int:
    """Copy a burst's ``n`` datagrams back to back into ``dst`` from ``pos`` and return where
    they end; ``mrc._native.gather_burst`` mirrors it. Each is its header (``HDR_LEN`` bytes
    of ``hview`` from ``h``, consecutive; the last ``final_hdr`` bytes) then its payload
    (``payload`` bytes of ``view`` from ``off``, consecutive; the last ``last_len``).

    One buffer for the burst's GSO send instead of two views a datagram: the kernel takes it
    in less time, and no view is made per packet (docs/PERFORMANCE.md, "Fewer objects per
    packet at the sender"). Out-of-range fields raise ValueError, and so does a burst that does
    not fit its buffers; nothing is written then."""
    if not (
        1 <= n <= 1024
        and pos >= 0
        and h >= 0
        and off >= 0
        and 0 <= payload <= 1 << 20
        and 0 <= last_len <= payload
        and _HDR_LEN <= final_hdr <= 64
    ):
        raise ValueError("a burst's field is out of range")
    if dst.readonly:  # (as the C kernel's request for a writable buffer fails)
        raise BufferError("memoryview: underlying buffer is not writable")
    total = (n - 1) * (_HDR_LEN + payload) + final_hdr + last_len
    if (
        pos + total > len(dst)
        or h + (n - 1) * _HDR_LEN + final_hdr > len(hview)
        or off + (n - 1) * payload + last_len > len(view)
    ):
        raise ValueError("a burst does not fit its buffers")
    d = pos
    for _ in range(n - 1):
        dst[d : d + _HDR_LEN] = hview[h : h + _HDR_LEN]
        d += _HDR_LEN
        dst[d : d + payload] = view[off : off + payload]
        d += payload
        h += _HDR_LEN
        off += payload
    dst[d : d + final_hdr] = hview[h : h + final_hdr]
    d += final_hdr
    dst[d : d + last_len] = view[off : off + last_len]
    return d + last_len


def py_take_acked(
    outstanding: dict[int, Any],
    start: int,
    stop: int,
    sacked: list[int],
    planes: list[int],
    delivered: list[float],
    route_ix: list[int] | None,
    route_alive: list[float],
    judge: Callable[[int, float], None] | None,
) -> tuple[int, int]:
    """Remove the records of ``range(start, stop)`` then ``sacked`` (those still in
    ``outstanding``), in that order, and note what each delivered; ``mrc._native.take_acked``
    mirrors it. Returns ``(newly, cancelled)``: records removed, and of them those queued for a
    resend (deadline infinite) that is no longer needed.

    For each: ``delivered[planes[ev]]`` and, unless ``route_ix`` is None,
    ``route_alive[route_ix[ev]]`` rise to its send time if that is later; ``judge(ev,
    sent_at)`` is called unless None (EVSet.route_delivered, while retirements are judged)."""
    newly = cancelled = 0
    for seq in chain(range(start, stop), sacked):
        pkt = outstanding.pop(seq, None)
        if pkt is None:
            continue
        newly += 1
        ev = pkt.ev
        sent_at = pkt.sent_at
        if route_ix is not None:
            r = route_ix[ev]
            if sent_at > route_alive[r]:
                route_alive[r] = sent_at
        if judge is not None:
            judge(ev, sent_at)
        if pkt.deadline == _INF:
            cancelled += 1
        plane = planes[ev]
        if sent_at > delivered[plane]:
            delivered[plane] = sent_at
    return newly, cancelled


def py_take_ack(
    outstanding: dict[int, Any],
    initial_psn: int,
    una: int,
    nxt: int,
    psnw: int,
    base: int,
    bitmap: int,
    planes: list[int],
    delivered: list[float],
    route_ix: list[int] | None,
    route_alive: list[float],
    judge: Callable[[int, float], None] | None,
) -> tuple[int, int, int, int, int, bool]:
    """What an ACK acknowledges, taken: its cumulative PSN (``psnw``) and its SACK bitmap of
    the 64 PSNs from ``base``, read against the sender's cumulative point ``una`` and next
    sequence number ``nxt`` (``initial_psn``: ours), their records removed as
    :func:`py_take_acked` removes them (the cumulative range, then the SACKed ones above the
    new cumulative point, in order; ``planes`` .. ``judge`` as there), and the cumulative
    point moved over what is no longer outstanding (``Requester._advance``);
    ``mrc._native.take_ack`` mirrors it.

    Returns ``(cum_una, base_seq, una, newly, cancelled, beyond)``: the cumulative point the
    ACK's own PSN gives, the sequence number of the bitmap's first PSN, the cumulative point
    after the SACKs too, records removed and of them those queued for a resend, and whether
    the ACK reported PSNs beyond what was sent (they count for nothing). The per-ACK
    bookkeeping between an ACK's fields and its news, in one call instead of four Python
    steps (``Requester.on_ack``). Out-of-range arguments raise ValueError and change nothing."""
    if not (
        0 <= initial_psn <= _PSN_MASK
        and 0 <= una <= nxt < _RUN_LIMIT
        and 0 <= psnw <= _U32
        and 0 <= base <= _U32
        and 0 <= bitmap <= _U64
    ):
        raise ValueError("an ACK field or sequence number is out of range")
    near = (initial_psn + una) & _PSN_MASK
    cum = una + (((psnw & _PSN_MASK) - near + _HALF) & _PSN_MASK) - _HALF
    beyond = cum >= nxt
    if beyond:
        cum = nxt - 1  # what the receiver has beyond that, it did not get from us
    start = una
    if cum >= una:
        una = cum + 1
    cum_una = una
    near = (initial_psn + una) & _PSN_MASK
    base_seq = una + (((base & _PSN_MASK) - near + _HALF) & _PSN_MASK) - _HALF
    if bitmap and base_seq + 64 > nxt:
        keep = nxt - base_seq  # bits for PSNs we sent
        mask = (1 << keep) - 1 if keep > 0 else 0
        if bitmap & ~mask:
            beyond = True
            bitmap &= mask
    sacked: list[int] = []
    if bitmap and base_seq + 64 > una:
        if base_seq < una:
            bitmap &= -1 << (una - base_seq)
        while bitmap:
            low = bitmap & -bitmap
            sacked.append(base_seq + low.bit_length() - 1)
            bitmap ^= low
    newly, cancelled = py_take_acked(
        outstanding, start, cum + 1, sacked, planes, delivered, route_ix, route_alive, judge
    )
    while una < nxt and una not in outstanding:
        una += 1
    return cum_una, base_seq, una, newly, cancelled, beyond


#: the C kernels (the extension's: mrc.native.module), or None where it is not in use (not
#: built, stale or MRC_NATIVE=0: mrc.native.describe() says which)
native_place_train: PlaceTrain | None = None
native_pack_burst: PackBurst | None = None
native_note_arrivals: NoteArrivals | None = None
native_note_runs: NoteRuns | None = None
#: the sender's records in C: their type and the two kernels that make and take them
native_packet: type | None = None
native_record_burst: RecordBurst | None = None
native_gather_burst: GatherBurst | None = None
native_take_acked: TakeAcked | None = None
native_take_ack: TakeAck | None = None
if native.module is not None:
    native_place_train = native.module.place_train
    native_pack_burst = native.module.pack_burst
    native_note_arrivals = native.module.note_arrivals
    native_note_runs = native.module.note_runs
    native_packet = native.module.Packet
    native_record_burst = native.module.record_burst
    native_gather_burst = native.module.gather_burst
    native_take_acked = native.module.take_acked
    native_take_ack = native.module.take_ack
#: True when every kernel here is the C one
NATIVE = native.module is not None
#: what the responder calls for every train (tests may swap it)
place_train: PlaceTrain = native_place_train or py_place_train
#: what the responder calls for every run of a train (tests may swap it)
note_arrivals: NoteArrivals = native_note_arrivals or py_note_arrivals
#: what the responder calls for every train's arrivals (tests may swap it)
note_runs: NoteRuns = native_note_runs or py_note_runs
#: what the requester calls for every burst (tests may swap it)
pack_burst: PackBurst = native_pack_burst or py_pack_burst
#: what the requester calls to record every burst, and what those records are (tests may
#: swap them, together: record_burst makes its own kind of record)
record_burst: RecordBurst = native_record_burst or py_record_burst
Packet: type = native_packet or PyPacket
#: what the requester calls to gather a burst into one send buffer (tests may swap it)
gather_burst: GatherBurst = native_gather_burst or py_gather_burst
#: what the requester calls for every ACK (tests may swap it; it takes either kind of record)
take_acked: TakeAcked = native_take_acked or py_take_acked
#: what the requester calls for every ACK it believes (tests may swap it, with take_acked)
take_ack: TakeAck = native_take_ack or py_take_ack


def describe() -> str:
    """Which batch kernels are in use, for logs and ``-v`` output (:func:`mrc.native.describe`:
    every kernel of the package is C, or every one is Python)."""
    return native.describe()
