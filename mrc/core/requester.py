"""The sending half of a queue pair: segmentation, spraying, SACK/NACK, retransmission.

Posted work requests are cut into packets lazily, as the window opens. Every packet in flight
has a record in ``_outstanding`` (``fastpath.Packet``: made and removed by the batch kernels
``record_burst`` and ``take_ack``); a packet is acknowledged when its record is removed, and
``_snd_una`` is the lowest sequence number still outstanding. What is lost is found by SACK
evidence (``recovery.LossDetector``) and by the retransmission and tail loss probe timers
(``timers.LossTimers``): both name packets, and the requester resends them.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

from mrc import wire
from mrc.core import fastpath
from mrc.core.cc import WindowLaw, create
from mrc.core.config import QPConfig
from mrc.core.events import (
    Burst,
    Datagram,
    Event,
    EVReason,
    QPFailed,
    WCStatus,
    WriteCompleted,
    WriteFailed,
    datagrams_of,
    is_gathered,
)
from mrc.core.evset import EVSet
from mrc.core.psn import to_psn, to_seq
from mrc.core.recovery import LossDetector
from mrc.core.rtt import RttEstimator
from mrc.core.stats import QPStats
from mrc.core.timers import LossTimers
from mrc.errors import TooManyImmediates

_INF = float("inf")
_NEG_INF = float("-inf")

#: ``_sent_ring`` remembers, for this many of the latest sequence numbers, the EV value of each
#: one's latest transmission: enough to recognise the genuine ACK of a packet acknowledged
#: moments ago (the other SACKs of one flush share a subject that the first one acknowledged).
#: ``_resent_evs`` keeps the EV values (and send times) of the earlier transmissions of the packets
#: resent among them, and is pruned to that span once it holds twice as many entries.
_RING = 1 << 12
_RING_MASK = _RING - 1
_BECN = wire.BTH_BECN << 24
_HDR_LEN = wire.DATA_HDR_LEN
_IMM_HDR_LEN = wire.DATA_IMM_HDR_LEN
_PSN_MASK = wire.PSN_MASK
_HALF = 1 << 23  # (mrc.core.psn.to_seq's)
_NAK_BASE = wire.AETH_NAK_BASE
#: wire.ACK_PKT without its first word (opcode, flags, P_Key), which on_ack does not read:
#: three ints fewer made per ACK
_ACK_TAIL = struct.Struct("!4x" + wire.ACK_PKT.format[4:])
assert wire.ACK_PKT.format[:4] == "!BBH" and _ACK_TAIL.size == wire.ACK_LEN
_unpack_ack = _ACK_TAIL.unpack_from
#: bytes of one header arena (Requester._header_room): about 2300 headers
_ARENA = 1 << 16
_GATHER_ARENA = 1 << 21  # (a gathered burst is one GSO send's worth, at most 64 KiB)
_SUBJECT_DUP = wire.ACK_SUBJECT_DUP
_ACK_DELAY_UNIT = wire.ACK_DELAY_UNIT
_TLP_MARKS = wire.BTH_TLP | wire.BTH_ACKREQ  # BTH byte 8 of a tail loss probe
_TRIM_CODES = (wire.NackCode.TRIMMED, wire.NackCode.TRIMMED_LASTHOP)
#: the NACK codes an mrc responder sends (docs/PROTOCOL.md 7); any other is refused
_SENT_CODES = frozenset((*_TRIM_CODES, wire.NackCode.REMOTE_ACCESS_ERROR))
#: trim NACKs proved false (the copy they named arrived whole) after which trims only resend:
#: they no longer cut the window or skip EVs (a keyless forger's flood, bounded)
_TRIM_DISTRUST = 8
#: trim-NACKed transmissions remembered (pruned to those in flight beyond this)
_TRIMMED_KEEP = 4096


@dataclass(slots=True)
class _WorkRequest:
    wr_id: int
    view: memoryview
    remote_addr: int
    rkey: int
    imm: int | None
    last_seq: int = -1  # sequence number of its last packet, once segmented


#: the record of a packet in flight (``mrc._native.Packet`` where built: the same attributes)
_Packet = fastpath.PyPacket


class Requester:
    def __init__(
        self,
        config: QPConfig,
        qpn: int,
        initial_psn: int,
        evs: EVSet,
        stats: QPStats,
        emit: Callable[[Event], None],
    ) -> None:
        self.config = config
        self.qpn = qpn
        self.initial_psn = initial_psn
        self.evs = evs
        self.stats = stats
        self._emit = emit
        self.rtt = RttEstimator(config.initial_rto, config.min_rto, config.max_rto)
        self.remote_qpn: int | None = None
        self.failed = False
        #: ACKs and NACKs carry an ICV checked before they reach us (keyed mode): a fatal
        #: NACK is then believed at once, instead of on a second transmission's
        self.authenticated = False
        # seq -> the reason of a fatal NACK held until the packet's next transmission is
        # refused too (keyless: one forged packet must not end a QP)
        self._held_nacks: dict[int, str] = {}
        # peer planes its port-state bits took down, not yet confirmed by a loss on them:
        # what is in flight there is resent once one is (_confirm_plane)
        self._told_down: set[int] = set()
        # seq -> the EV value of the transmission a trim NACK named: an ACK of that very copy
        # proves the NACK false (a trimmed copy is never placed)
        self._trimmed_copy: dict[int, int] = {}
        self._next_wr_id = 1
        self.imms_outstanding = 0  # WRITE_IMMs posted and not completed nor failed
        # at most this many of them: our max_imm_outstanding, or the peer's max_imm_dest if
        # smaller (QueuePair.peer_takes_imms)
        self.imm_cap = config.max_imm_outstanding
        self._queue: deque[_WorkRequest] = deque()  # not yet fully segmented
        self._inflight_wrs: deque[_WorkRequest] = deque()  # segmented, not yet completed
        self._offset = 0  # next byte to segment in _queue[0]
        self._next_seq = 0
        self._snd_una = 0
        self._outstanding: dict[int, _Packet] = {}
        self._retransmit: deque[int] = deque()
        self.recovery = LossDetector(config.reorder_min, config.reorder_srtt_fraction)
        # losses not held against their EV: SACK evidence the detector did not trust, and
        # any loss of a transmission that met a silence of the whole peer (``silenced``)
        self.losses_unblamed = 0
        # retransmission deadlines and the tail loss probe: when the timer fires, and what
        # times out then (they call back resend_timed_out, retries_exhausted, resend_as_probe)
        self.timers = LossTimers(
            self._outstanding,
            self,
            self.rtt,
            tlp_min=config.tlp_min,
            tlp_max=config.tlp_max,
            initial_rto=config.initial_rto,
            max_timeout_retries=config.max_timeout_retries,
        )
        self._probes = 0  # tail loss probes at the head of _retransmit, sent past the window
        self.health = config.ev_health
        # seq & _RING_MASK -> (seq << 32) | EV value of seq's latest transmission (-1: none);
        # an array, so that record_burst sets its entries without an int object per packet
        self._sent_ring = array("q", [-1]) * _RING
        # seq -> EV values of its transmissions before the latest, for packets resent: an ACK
        # echoing one of them answers a copy that arrived after all (_believed)
        self._resent_evs: dict[int, tuple[tuple[int, float], ...]] = {}
        # the EV of the burst being sent and how many more new packets it takes
        self._burst_ev = 0
        self._burst_left = 0
        self.burst_now = 1  # packets per burst of the latest send (config.burst_max at most)
        # the packets one GSO send carries (_burst_size rounds bursts above it to whole sends)
        self._per_send = config.per_send
        # packets per burst at most (a law like NSCC sizes each below it)
        self._burst_max = config.burst_max
        # the header arena: headers are written here, a burst at a time, and handed out as
        # views; a full arena is replaced, never rewritten (_header_room)
        self._hbuf = bytearray(_ARENA)
        self._hview = memoryview(self._hbuf)
        # gathered bursts (fastpath.gather_burst): their arena, dropped when full like the
        # headers' (a send in the transport's backlog may still point into it); the QP turns
        # gathering off when it seals its datagrams
        self.gather = config.gather_max > 0
        self._gbuf = bytearray(0)
        self._gview = memoryview(self._gbuf)
        self._gpos = 0
        self._gspare: bytearray | None = None  # the arena before, reused once nothing views it
        self._hpos = 0
        # congestion control: the window law (mrc/core/cc/). Packets known to be out of the
        # network (queued in _retransmit after a NACK, a loss or a timeout) do not count
        # against its limit: _waiting counts them
        self.cc: WindowLaw = create(config.cc, config.cc_params, config)
        #: how long the datagrams being received had waited in this host by their ``now``
        #: (QueuePair.arrived_after; None: unknown): an ACK's share of the host delay
        self.rx_wait: float | None = None
        #: how long after their stamped send time this QP's datagrams leave, smoothed
        #: (note_send_lag; 0.0: unknown): the sender's share of the host delay
        self.tx_lag = 0.0
        self._waiting = 0
        # pacing (WindowLaw.pace_gap): nothing but tail loss probes leaves before _pace_at;
        # _paced: something was held back for it, so the timer must wake the QP then
        self._pace_at = _NEG_INF
        self._paced = False
        # nothing was queued and nothing in flight (the application had nothing to send);
        # not a paced window, which also empties the flight between its packets
        self._idle = True

    # ---- application side -------------------------------------------------------------

    def post_write(
        self, data: object, remote_addr: int, rkey: int, imm: int | None, wr_id: int | None
    ) -> int:
        # any object is accepted on purpose: memoryview() itself rejects a non-buffer
        view = memoryview(data)  # type: ignore[arg-type]
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        if imm is not None:
            if not 0 <= imm < (1 << 32):
                raise ValueError("immediate data must fit in 32 bits")
            cap = self.imm_cap
            if self.imms_outstanding >= cap:
                raise TooManyImmediates(
                    f"{cap} WRITE_IMMs are outstanding already (max_imm_outstanding, or the "
                    "peer's max_imm_dest): wait for one to complete"
                )
            self.imms_outstanding += 1
        if wr_id is None:
            wr_id = self._next_wr_id
            self._next_wr_id += 1
        self._queue.append(_WorkRequest(wr_id, view, remote_addr, rkey, imm))
        return wr_id

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing unacknowledged."""
        return not self._queue and not self._outstanding and not self._inflight_wrs

    @property
    def acked_packets(self) -> int:
        """Packets acknowledged cumulatively (a cheap progress measure)."""
        return self._snd_una

    @property
    def in_flight(self) -> int:
        return len(self._outstanding)

    # ---- output ------------------------------------------------------------------------

    def datagrams_to_send(self, now: float, out: list[Datagram]) -> None:
        """What :meth:`bursts_to_send` sends, datagram by datagram (simulator, tests)."""
        bursts: list[Burst] = []
        self.bursts_to_send(now, bursts)
        out.extend(datagrams_of(bursts))

    def bursts_to_send(self, now: float, out: list[Burst]) -> None:
        """Append what may go out now: retransmissions first, one burst each, then new data
        in bursts (consecutive packets of one work request on one EV), as the window allows.

        Each packet keeps its own record (loss detection, SACK, NACK, retransmission and EV
        health are per packet), made with its ring entry and send buffers by one
        ``fastpath.record_burst`` call per burst; what a burst's packets share is done once
        per burst: the headers (one ``fastpath.pack_burst`` call into the header arena), the
        deadline heap entry, the counters.
        """
        if self.failed or self.remote_qpn is None:
            return
        if now >= self.evs.pen_next:
            self.evs.lift_penalties(now)
        sent_before = len(out)
        cc = self.cc
        if self._idle and self._queue:
            cc.on_resume(now)  # new work after an idle spell
            self._idle = False
        gap = cc.pace_gap()
        held = gap > 0.0 and now < self._pace_at  # paced: only probes may go now
        self._paced = False
        if self._retransmit:
            held = self._send_retransmissions(now, out, gap, held)
        self._send_new(now, out, gap, held)
        if len(out) > sent_before:
            if cc.prompt_acks:
                # the window is full (or the queue empty): ask for an ACK of this burst's last
                # packet at once (AckReq), instead of after the receiver's ack_delay. A window
                # below ack_every would otherwise see every RTT sample inflated by that delay
                # and read it as queueing (docs/CONGESTION.md). The header is in the arena,
                # not yet handed out: set in place
                _ev, bufs, count, seg = out[-1]
                if is_gathered(bufs, count):  # the last datagram's header, in the one buffer
                    bufs[0][(count - 1) * seg + 8] |= wire.BTH_ACKREQ  # type: ignore[index]
                else:
                    bufs[-2][8] |= wire.BTH_ACKREQ  # type: ignore[index]
            self.timers.arm_probe(now)

    def _send_retransmissions(self, now: float, out: list[Burst], gap: float, held: bool) -> bool:
        """Resend what is queued for it, a burst of one each: tail loss probes whatever the
        window, the rest while packets in the network (``len(outstanding) - _waiting``) stay
        below the window's limit and pacing allows. Returns whether pacing holds now."""
        outstanding = self._outstanding
        retransmit = self._retransmit
        evs = self.evs
        timers = self.timers
        rtx_limit = self.cc.limit + self._waiting
        while retransmit and (self._probes or (not held and len(outstanding) < rtx_limit)):
            seq = retransmit.popleft()
            probe = self._probes > 0
            if probe:
                self._probes -= 1  # a tail loss probe, first in the queue: past the window
            pkt = outstanding.get(seq)
            if pkt is None:
                continue  # acknowledged meanwhile
            if pkt.deadline == _INF:
                self._waiting -= 1
                rtx_limit -= 1
            self._note_resent(seq, evs.values[pkt.ev], pkt.sent_at)
            if probe and pkt.probed is not None and len(pkt.probed) == 1:
                # the probe goes through the same NIC queue as what it probes (else it may
                # overtake it there, and its arriving first would prove nothing), on
                # another route if there is one
                pkt.ev = evs.next_beside(pkt.ev)
            elif probe and pkt.probed is not None:
                # a probe met silence too: what it probed has left that queue long since,
                # and the plane may be the one that died (its last EVs held at the floor,
                # too few losses yet to take it down): the next probe tries another
                pkt.ev = evs.next_apart(pkt.ev)
            else:
                pkt.ev = evs.next_other(pkt.ev)
            pkt.retransmitted = True
            if probe or not pkt.nacked:
                pkt.ambiguous = True  # the copy before this one may still be on its way
            pkt.nacked = False  # a new transmission: it may be NACKed once more
            pkt.silenced = False
            pkt.sent_at = now
            timers.resent(seq, pkt, now)
            out.append(self._build(seq, pkt, probe))
            self.stats.retransmits += 1
            if gap and not probe:
                self._pace_at = now + gap
                held = True
        return held

    def _note_resent(self, seq: int, ev_value: int, sent_at: float) -> None:
        """``seq`` goes out again: remember ``ev_value`` and ``sent_at``, its transmission until
        now, so that the ACK of that copy, should it arrive after all, is still believed
        (``_believed``) and gives that copy's round trip (``_earlier_copy_rtt``).
        Entries older than the ring's span are dropped when the table outgrows twice it:
        their ACKs are refused as not sent anyway."""
        resent = self._resent_evs
        resent[seq] = resent.get(seq, ()) + ((ev_value, sent_at),)
        if len(resent) > 2 * _RING:
            floor = self._next_seq - _RING
            for old in [s for s in resent if s < floor]:
                del resent[old]

    def _send_new(self, now: float, out: list[Burst], gap: float, held: bool) -> None:
        """Cut new packets from the queued work requests, a burst at a time, while the
        window's limit (and ``max_outstanding``, ``psn_window`` and pacing) allow."""
        cc = self.cc
        cfg = self.config
        outstanding = self._outstanding
        queue = self._queue
        limit = cfg.max_outstanding  # a hard cap on records, whatever the window
        if cc.limit + self._waiting < limit:
            limit = cc.limit + self._waiting
        span = self._snd_una + cfg.psn_window
        burst = self._burst_max
        if burst > 1:
            burst = self._burst_size(burst, limit - len(outstanding))
        self.burst_now = burst
        if held and (queue or self._retransmit):
            self._paced = True
        usable = self.evs.usable
        deadline = self.timers.first_deadline(now)
        sent_n = sent_bytes = 0
        while queue and not held and len(outstanding) < limit and self._next_seq < span:
            if self._burst_left and usable[self._burst_ev]:
                ev = self._burst_ev
                take = self._burst_left
            else:
                ev = self._burst_ev = self.evs.next()
                take = burst
                self.stats.bursts += 1
            room = min(take, limit - len(outstanding), span - self._next_seq)
            n, nbytes = self._send_burst(out, ev, room, now, deadline)
            self._burst_left = take - n
            sent_bytes += nbytes
            sent_n += n
            if gap:
                # a paced window is one packet (limit): this was the one
                self._pace_at = now + gap * n
                if queue:
                    self._paced = True
                break
        if sent_n:
            stats = self.stats
            stats.packets_sent += sent_n
            stats.data_packets_sent += sent_n
            stats.bytes_sent += sent_bytes

    def _burst_size(self, most: int, room: int) -> int:
        """Packets per burst now (``most`` > 1 at most): what the window law chooses, or, if
        more, one plane's share of the ``room`` the window has now (``burst_batch``).

        Those packets leave at once, whichever way they go: sprayed one per EV, each plane's
        NIC queue takes its share of them back to back all the same, so bursts of that share
        (on EVs of every plane) queue nothing more. A host that cannot keep up with its ACKs
        handles them in batches and frees much of the window at once: its bursts grow, and
        the GSO sends and GRO receives they buy are what it lacked. A law that sizes bursts
        from the rate delivered (NSCC) would hold such a host at one packet per send, and so
        at the rate its CPU allows one packet at a time (docs/PERFORMANCE.md, "Bursts")."""
        nplanes = self.evs.nplanes
        chosen = self.cc.burst(most, nplanes)
        share = room // nplanes
        if share <= chosen or not self.config.burst_batch:
            return chosen
        burst = share if share < most else most
        per_send = self._per_send
        if burst > per_send:
            burst -= burst % per_send  # in whole GSO sends
        return burst if burst > chosen else chosen

    def _send_burst(
        self, out: list[Burst], ev: int, room: int, now: float, deadline: float
    ) -> tuple[int, int]:
        """Cut up to ``room`` packets from the head of the queue (one work request's) and
        send them on ``ev``: their records, one deadline entry, the headers in one call; one
        burst in ``out`` (two if a longer WRITE_IMM header ends it: only the last datagram of
        a GSO send may differ in size, and only to be shorter). Returns (packets, bytes)."""
        payload = self.config.payload_size
        wr = self._queue[0]
        off = self._offset
        total = len(wr.view)
        left = -(-(total - off) // payload) or 1  # packets left in wr (1 if empty)
        last = left <= room
        n = left if last else room
        if off == 0:
            self._inflight_wrs.append(wr)
        seq = self._next_seq
        self._next_seq = seq + n
        if last:
            wr.last_seq = seq + n - 1
            self._queue.popleft()
            self._offset = 0
        else:
            self._offset = off + n * payload
        full = n - 1  # packets of payload bytes before the last one
        o = off + full * payload
        last_len = payload if o + payload <= total else total - o
        imm = wr.imm if last and wr.imm is not None else -1
        final = _IMM_HDR_LEN if imm >= 0 else _HDR_LEN
        h = self._hpos
        if h + full * _HDR_LEN + final > len(self._hbuf):
            h = self._header_room(full * _HDR_LEN + final)[1]
        qpn: int = self.remote_qpn  # type: ignore[assignment]  # (not None: connected)
        psn = (self.initial_psn + seq) & _PSN_MASK
        h_end = self._hpos = fastpath.pack_burst(
            self._hbuf, h, qpn, psn, wr.remote_addr + off, wr.rkey, payload, n, last_len, last, imm
        )
        gather = self.gather and full > 0 and payload <= self.config.gather_max
        bufs: list[bytes | memoryview] | None = None if gather else []
        fastpath.record_burst(
            self._outstanding,
            self._sent_ring,
            wr,
            self._hview,
            wr.view,
            seq,
            n,
            ev,
            self.evs.values[ev],
            h,
            off,
            payload,
            last_len,
            last,
            final,
            now,
            deadline,
            bufs,
        )
        self.timers.track(deadline, seq, n)
        self.evs.packets[ev] += n  # EVSet.count_sent, once per burst
        seg = _HDR_LEN + payload  # the segment size of a burst of more than one
        if bufs is None:
            # gathered: the datagrams back to back in one buffer, the burst's GSO send
            g = self._gather_room(full * seg + final + last_len)
            end = self._gpos = fastpath.gather_burst(
                self._gview, g, self._hview, h, wr.view, off, n, payload, last_len, final
            )
            if final + last_len > seg:
                cut = g + full * seg
                out.append((ev, [self._gview[g:cut]], full, seg))
                out.append((ev, [self._gview[cut:end]], 1, end - cut))
            else:
                out.append((ev, [self._gview[g:end]], n, seg))
        elif not full:
            out.append((ev, bufs, 1, h_end - h + last_len))
        elif final + last_len > seg:
            out.append((ev, bufs[:-2], full, seg))
            out.append((ev, bufs[-2:], 1, final + last_len))
        else:
            out.append((ev, bufs, n, seg))
        return n, full * payload + last_len

    def _gather_room(self, nbytes: int) -> int:
        """Where the next gathered burst of ``nbytes`` goes: the gather arena at its fill
        mark, or, when it is full, the arena before it if no view of it is left (every send
        from it done), else a fresh one. An arena is never written while a send waiting in the
        transport's backlog may point into it; and reusing one spares zeroing a new one, 1 GiB
        of memset per GiB sent."""
        if self._gpos + nbytes > len(self._gbuf):
            spare, self._gspare = self._gspare, self._gbuf
            # unviewed: referred to by ``spare`` and getrefcount's argument only (a view's
            # buffer holds a reference to the bytearray it exports)
            if spare is None or len(spare) < nbytes or sys.getrefcount(spare) > 2:
                spare = bytearray(max(_GATHER_ARENA, nbytes))
            self._gbuf = spare
            self._gview = memoryview(spare)
            self._gpos = 0
        return self._gpos

    def _header_room(self, nbytes: int) -> tuple[bytearray, int]:
        """Where the next ``nbytes`` of headers go: the header arena at its fill mark, or a
        fresh arena. Headers handed out are never written again (a send waiting in the
        transport's backlog still points at them): a full arena is dropped, not reused, and
        lives on only as long as the views into it."""
        if self._hpos + nbytes > len(self._hbuf):
            self._hbuf = bytearray(max(_ARENA, nbytes))
            self._hview = memoryview(self._hbuf)
            self._hpos = 0
        return self._hbuf, self._hpos

    def _ce_memory(self) -> float:
        """How long a CE mark counts: the penalty it gives an EV, and how far back before a
        lost packet's send a mark on its path makes the loss congestion, not failure."""
        cfg = self.config
        srtt = self.rtt.srtt
        span = cfg.ecn_penalty_rtts * srtt if srtt is not None else 0.0
        return span if span > cfg.ecn_penalty_min else cfg.ecn_penalty_min

    def _build(self, seq: int, pkt: _Packet, probe: bool) -> Burst:
        """A retransmission of ``pkt`` on its (new) EV, as a burst of one; a tail loss probe
        (``probe``) carries P and A: its ACK is wanted at once, and twice (docs/PROTOCOL.md
        3.1: the silence it breaks may be that of a reverse path that died)."""
        wr = pkt.wr
        imm = wr.imm if pkt.last and wr.imm is not None else -1
        hbuf, h0 = self._header_room(_IMM_HDR_LEN if imm >= 0 else _HDR_LEN)
        h_end = fastpath.pack_burst(
            hbuf,
            h0,
            self.remote_qpn,  # type: ignore[arg-type]
            (self.initial_psn + seq) & wire.PSN_MASK,
            wr.remote_addr + pkt.offset,
            wr.rkey,
            pkt.length,
            1,
            pkt.length,
            pkt.last,
            imm,
        )
        self._hpos = h_end
        if probe:
            hbuf[h0 + 8] |= _TLP_MARKS
        evs = self.evs
        evs.count_sent(pkt.ev)
        self._sent_ring[seq & _RING_MASK] = (seq << 32) | evs.values[pkt.ev]
        self.stats.packets_sent += 1
        payload = wr.view[pkt.offset : pkt.offset + pkt.length]
        return (pkt.ev, [self._hview[h0:h_end], payload], 1, h_end - h0 + pkt.length)

    # ---- timers (timers.LossTimers decides; these are its calls back) ----------------------

    def get_timer(self) -> float | None:
        """When :meth:`handle_timer` must run next: what the loss timers wait for, or sooner,
        when pacing lets what it held back go; None: nothing to wait for."""
        if self.failed:
            return None
        at = self.timers.next_time()
        if self._paced and (at is None or self._pace_at < at):
            return self._pace_at  # held back by pacing: wake up when it may go
        return at

    def handle_timer(self, now: float) -> None:
        """Time out every packet whose deadline has passed, then send a tail loss probe if
        one is due (:meth:`LossTimers.expire`, which says how and why)."""
        if not self.failed:
            self.timers.expire(now, self.recovery.latest)

    def resend_timed_out(self, seq: int, pkt: _Packet, now: float, blame: bool | None) -> None:
        """``pkt`` timed out (its deadline is inf now): queued for a resend and told to the
        window law; its EV blamed if ``blame`` (None: it met a silence of the whole peer)."""
        self._retransmit.append(seq)
        self._waiting += 1
        self.stats.retransmits_timeout += 1
        self.cc.on_timeout(now)
        if self._told_down and self.evs.planes[pkt.ev] in self._told_down:
            self._confirm_plane(self.evs.planes[pkt.ev])
        if blame is None:
            self.stats.silent_timeouts += 1
        elif not blame:
            self.losses_unblamed += 1
        elif self.health:
            self._blame(pkt.ev, pkt.sent_at, EVReason.TIMEOUT, now)

    def retries_exhausted(self, seq: int, pkt: _Packet, now: float) -> None:
        """``pkt`` timed out more often than ``max_timeout_retries`` allows: the QP fails,
        saying what the peer was last heard to do."""
        refused = sum(
            self.stats.dropped_by_reason.get(k, 0) for k in ("ack_not_sent", "ack_wrong_ev")
        )
        heard = self.timers.what_was_heard(now, self._snd_una, refused)
        self.fail(
            f"retry budget exhausted: PSN {to_psn(self.initial_psn, seq)} "
            f"unacknowledged after {self.config.max_timeout_retries} timeouts; {heard}",
            pkt.wr,
        )

    def resend_as_probe(self, seq: int, queued: bool) -> bool:
        """Send ``seq`` next, as a tail loss probe, past the window: put at the head of the
        resend queue, or, if a resend of it is ``queued`` already (held back by a window
        shrunk below what is in flight), moved behind the probes queued there. False if it
        is going out as a probe already."""
        rq = self._retransmit
        if not queued:
            rq.appendleft(seq)
            self._probes += 1
            self._waiting += 1
            self.stats.retransmits_tlp += 1
            return True
        if seq in islice(rq, self._probes):  # already going out as a probe
            return False
        try:
            rq.remove(seq)
        except ValueError:  # (always there: a resend is queued with deadline inf)
            return False
        rq.insert(self._probes, seq)  # behind the probes already queued, if any
        self._probes += 1  # (a resend counted already, under its own cause)
        return True

    def fail(
        self,
        reason: str,
        cause: _WorkRequest | None = None,
        status: WCStatus = WCStatus.RETRY_EXCEEDED,
    ) -> None:
        """The QP is in error: every work request not yet completed ends with a
        :class:`WriteFailed`, in posting order (``cause``, the one whose packet failed, with
        ``status``; the others FLUSHED), then :class:`QPFailed`."""
        if self.failed:
            return
        self.failed = True
        seen: set[int] = set()
        for wr in (*self._inflight_wrs, *self._queue):  # a WR being segmented is in both
            if id(wr) in seen:
                continue
            seen.add(id(wr))
            if wr.imm is not None:
                self.imms_outstanding -= 1
            why = status if wr is cause else WCStatus.FLUSHED
            self._emit(WriteFailed(self.qpn, wr.wr_id, why, reason))
        self._inflight_wrs.clear()
        self._queue.clear()
        self._emit(QPFailed(self.qpn, reason))

    def note_send_lag(self, lag: float) -> None:
        """A send's mean lag behind its stamped time (QueuePair.sent_after), into
        :attr:`tx_lag` (srtt's gain, 1/8). A pump stamps every burst with one ``now`` and
        sends them one ``sendmsg`` at a time; on a veth each takes the receiver's path with
        it, and the last of ten leaves 0.2-0.4 ms late. Left out, that lag read as a
        network queue and took the host delay out of the window's bound."""
        self.tx_lag += (lag - self.tx_lag) * 0.125

    # ---- acknowledgements --------------------------------------------------------------

    def on_ack(self, data: memoryview | bytes, src_ev: int, now: float) -> None:
        """One ACK/SACK/NACK: RTT sample, packets acknowledged, planes alive, losses found.

        Without keys anybody who knows our QP number can send us ACKs, so an ACK is believed
        only if its subject (the packet that triggered it) is one we sent, on the EV the ACK
        echoes: in flight now (for a NACK, it must be), or among the latest sequence numbers
        sent. Anything else is dropped and counted before it can acknowledge, fail, retransmit
        or change an EV. A believed ACK that reports PSNs beyond what we sent (the receiver
        took a forged WRITE at our next PSN) counts only for what we did send.

        A positive ACK may echo any transmission of its subject, not only the latest: a copy
        we resent (a tail loss probe in a queue that outgrew srtt) does not make the one
        before it vanish, and when that one arrives first its ACK is the news we were waiting
        for. Such an ACK says that copy was not lost (the probe proves nothing) and gives no
        RTT sample (Karn's rule) and no send time to judge losses by.
        """
        qpw, psnw, aeth, subj, base, bitmap, ev_echo, ports, delay = _unpack_ack(data)
        if self.failed:
            self.stats.dropped_by_reason["qp_failed"] += 1
            return
        # every ACK comes here (one per 30-40 packets at 1400 bytes, where the sender is
        # CPU-bound): what its common case (a positive ACK of the latest transmission) calls
        # is inlined below where that is a line or two (to_seq, the timers' and the loss
        # detector's bookkeeping), in the same order, so that each ACK pays fewer steps
        syndrome = aeth >> 24
        una = self._snd_una
        near_psn = (self.initial_psn + una) & _PSN_MASK
        subj_seq = una + ((((subj & _PSN_MASK) - near_psn + _HALF) & _PSN_MASK) - _HALF)
        outstanding = self._outstanding
        subject = outstanding.get(subj_seq)
        is_nack = (syndrome & 0x60) == _NAK_BASE
        evs = self.evs
        # the subject in flight if the ACK echoes its latest transmission (else the ACK
        # answers an earlier one, or the subject was acknowledged already)
        latest = subject if subject is not None and evs.values[subject.ev] == ev_echo else None
        if (is_nack or latest is None) and not self._believed(
            syndrome if is_nack else -1, subj_seq, subject, ev_echo, psnw, bitmap, ports
        ):
            return
        timers = self.timers
        timers.heard_at = now  # (LossTimers.heard)
        if self._trimmed_copy and not is_nack:
            self._trim_check(subj_seq, subject, ev_echo, bool(subj & _SUBJECT_DUP))
        recovery = self.recovery
        if latest is not None:
            subj_sent: float | None = latest.sent_at
            recovery.last_subject = (subj_seq, latest.sent_at)  # (subject_sent_at)
        else:
            subj_sent = recovery.subject_sent_at(subj_seq, None)
        if self.health and (ports != 0xFFFF or any(evs.peer_plane_down)):
            self._take_port_state(ports)
        if now >= evs.pen_next:
            evs.lift_penalties(now)
        rtt_sample: float | None = None
        if is_nack:
            if subject is not None:  # always (refused otherwise): for the type checker
                self._on_nack(syndrome & 0x1F, subj_seq, subject, now)
            if self.failed:
                return
        elif latest is None or qpw & _BECN or latest.probed is not None:
            rtt_sample = self._ack_signals(subject, latest, subj, qpw, ev_echo, now)
        else:
            # _ack_signals' common case: no CE echo, no probe answered
            self.stats.sacks += 1
            if not (latest.ambiguous or subj & _SUBJECT_DUP):
                rtt_sample = now - latest.sent_at
                self.rtt.sample(rtt_sample)
                if evs.delay.enabled:
                    evs.delay.sample(evs.planes[latest.ev], rtt_sample, now)
                if evs.steering is not None:
                    evs.plane_rtt(evs.planes[latest.ev], rtt_sample, now)
        # what it acknowledges, taken, per route and per plane the latest send time each
        # delivered noted, and the cumulative point moved: one call (fastpath.take_ack)
        delivered = [_NEG_INF] * evs.nplanes
        cum_una, base_seq, una, newly, cancelled, beyond = fastpath.take_ack(
            outstanding,
            self.initial_psn,
            self._snd_una,
            self._next_seq,
            psnw,
            base,
            bitmap,
            evs.planes,
            delivered,
            evs.route_ix,
            evs.route_alive_sent,
            # retirements still open to being proved false
            evs.route_delivered if evs.judging else None,
        )
        if subj_sent is not None:
            recovery.block_reported(base_seq >> 6, subj_sent, cum_una)
        if beyond:
            self.stats.ack_beyond_sent += 1
        if cancelled:
            self._waiting -= cancelled  # queued for resends that are no longer needed
            self.stats.retransmits_cancelled += cancelled
        if newly:
            timers.progress_at = now  # (LossTimers.progressed)
            if self._held_nacks:
                self._contradicted()
        news = max(delivered)
        if news != _NEG_INF:
            evs.delivered(delivered)
        self._snd_una = una
        cc = self.cc
        if delay and rtt_sample is not None and self.rx_wait is not None:
            # host delay: the subject's time in the receiving host (its ACK Delay), the
            # ACK's in this one and the subject's wait to leave it, all part of the sample
            # and none the network's
            cc.on_host_delay(now, delay * _ACK_DELAY_UNIT + self.rx_wait + self.tx_lag)
        if newly or rtt_sample is not None:
            # BECN: the responder's echo of the subject's CE mark (docs/PROTOCOL.md 3.4)
            cc.on_ack(now, newly * self.config.payload_size, rtt_sample, bool(qpw & _BECN))
        if not outstanding and not self._queue:
            self._idle = True
        wrs = self._inflight_wrs
        if wrs and 0 <= wrs[0].last_seq < una:
            self._complete()
        if news > 0.0:  # news (as for the RACK point, 0.0 stands for none)
            timers.news(now)  # the next silence may be probed again
        if now >= evs.held_next:
            evs.judge_held(now)  # losses held for the delay their path may yet show
        if news > recovery.latest:  # (LossDetector.advance)
            recovery.latest = news
            if outstanding:
                lost = recovery.detect(outstanding, self.rtt.srtt, evs.planes, evs.plane_alive_sent)
                if lost:
                    self._on_losses(lost, now)

    def _believed(
        self,
        nack: int,
        subj_seq: int,
        subject: _Packet | None,
        ev_echo: int,
        psnw: int,
        bitmap: int,
        ports: int,
    ) -> bool:
        """Whether on_ack acts on an ACK (a NACK: ``nack`` its AETH syndrome, else -1) about
        ``subj_seq`` (``subject``: its record, if in flight) echoing ``ev_echo``; counts what
        it refuses. A peer's announcement of its port state alone is taken here, and not acted
        on further.

        A NACK must carry a code an mrc responder sends, and echo the latest transmission (one
        of an earlier copy is stale: the packet has been resent since); an ACK may echo any
        (``_resent_evs``, counted as ``acks_earlier_copy``)."""
        stats = self.stats
        evs = self.evs
        if nack >= 0:
            stats.nacks += 1
            if nack & 0x1F not in _SENT_CODES:
                refused = "nack_code_unused"  # never sent by mrc: a forgery, or a stranger
            elif subject is None:
                refused = "nack_not_in_flight"
            elif evs.values[subject.ev] != ev_echo:
                refused = "nack_wrong_ev"
            elif subject.nacked:
                refused = "nack_repeated"  # one NACK per transmission has an effect
            else:
                return True
            stats.nacks_ignored += 1
            stats.dropped_by_reason[refused] += 1
            return False
        if subject is not None and evs.values[subject.ev] == ev_echo:
            return True
        if (
            ev_echo == 0
            and subj_seq == 0
            and not bitmap
            and to_seq(self.initial_psn, psnw & wire.PSN_MASK, 0) == -1
        ):
            # the peer has received nothing from us and says so: it only announces its
            # port state (see QueuePair.datagrams_to_send), which we take. Unverifiable: once
            # the peer acknowledged anything it contradicts what we know and is refused;
            # before, a forgery of it can only steer our packets (_take_port_state)
            if self.timers.heard_at != _NEG_INF:
                stats.dropped_by_reason["ack_nothing_late"] += 1
                return False
            stats.sacks += 1
            if self.health:
                self._take_port_state(ports)
            return False
        nxt = self._next_seq
        if subject is None and (not 0 <= subj_seq < nxt or nxt - subj_seq > _RING):
            refused = "ack_not_sent"
        elif subject is None and self._sent_ring[subj_seq & _RING_MASK] == (
            (subj_seq << 32) | ev_echo
        ):
            return True  # acknowledged moments ago, on the EV this ACK echoes
        elif any(v == ev_echo for v, _t in self._resent_evs.get(subj_seq, ())):
            stats.acks_earlier_copy += 1  # the answer to a copy from before a resend
            return True
        else:
            refused = "ack_wrong_ev"
        stats.dropped_by_reason[refused] += 1
        return False

    def _ack_signals(
        self,
        subject: _Packet | None,
        latest: _Packet | None,
        subj: int,
        qpw: int,
        ev_echo: int,
        now: float,
    ) -> float | None:
        """What a believed (positive) ACK says besides what it acknowledges: a CE echo, the
        fate of a tail loss probe's predecessors, an RTT sample (returned, or None).
        ``subject``: the subject's record if in flight; ``latest``: the same if the ACK echoes
        the EV of its latest transmission, else None."""
        self.stats.sacks += 1
        evs = self.evs
        if qpw & _BECN:
            self.stats.ecn_echoes += 1  # the peer echoed a CE mark (docs/PROTOCOL.md 3.1)
            if self.health:
                # the EV of the transmission that carried the mark: the one the ACK echoes
                # (checked against our records by _believed)
                marked = latest.ev if latest is not None else evs.index_of_value[ev_echo]
                evs.marked(marked, now, self._ce_memory(), self.config.ecn_steering)
        if latest is None:
            if subject is None:
                return None
            # a copy from before the latest resend arrived: whatever that resend probed was
            # not (all) lost, and the round trip is that copy's
            subject.probed = None
            return self._earlier_copy_rtt(subj, ev_echo, now)
        if latest.probed is not None:
            self._probe_answered(latest, bool(subj & _SUBJECT_DUP), now)
        if latest.ambiguous or subj & _SUBJECT_DUP:
            return None
        rtt_sample = now - latest.sent_at
        self.rtt.sample(rtt_sample)
        if evs.delay.enabled:
            evs.delay.sample(evs.planes[latest.ev], rtt_sample, now)
        if evs.steering is not None:
            evs.plane_rtt(evs.planes[latest.ev], rtt_sample, now)
        return rtt_sample

    def _earlier_copy_rtt(self, subj: int, ev_echo: int, now: float) -> float | None:
        """The round trip of the earlier copy of a packet still in flight that an ACK answers
        (it echoes that copy's EV), as a sample, when no other copy went on that EV.

        Karn's rule withholds the samples of retransmitted packets because an ACK could answer
        any copy; ours names the copy by its EV. A timeout that was only a late ACK (a receiver
        whose queue grew faster than the RTO followed) is resent, and without these samples
        the RTO never learned the longer round trip: 256 QPs into one busy receiver had every
        packet resent by timeout and tail loss probe, again and again, the RTO stuck at what
        an idle receiver had taught it (docs/PROTOCOL.md, "Retransmission timeout")."""
        if subj & _SUBJECT_DUP:
            return None
        seq = to_seq(self.initial_psn, subj & wire.PSN_MASK, self._snd_una)
        sent = [t for v, t in self._resent_evs.get(seq, ()) if v == ev_echo]
        if len(sent) != 1:
            return None
        self.stats.rtt_earlier_copy += 1
        rtt_sample = now - sent[0]
        self.rtt.sample(rtt_sample)
        return rtt_sample

    def _complete(self) -> None:
        """Complete the work requests whose every packet is acknowledged, in order."""
        wrs = self._inflight_wrs
        una = self._snd_una
        while wrs and wrs[0].last_seq >= 0 and wrs[0].last_seq < una:
            wr = wrs.popleft()
            if wr.imm is not None:
                self.imms_outstanding -= 1
            self._emit(WriteCompleted(self.qpn, wr.wr_id, len(wr.view)))

    def resend_plane(self, plane: int) -> int:
        """Everything in flight on ``plane`` is lost: its NIC, ours or the peer's, lost its
        link. Queued for resending (on EVs of other planes) at once, instead of after SACK
        evidence, a tail loss probe or a timeout; no EV is blamed (the plane is out already)
        and the window is not cut (no queue overflowed). Returns how many were queued.

        Without keys a forged port-state bitmap can make this happen once per forged
        transition: at most a window of packets sent twice, as any forged NACK may cause."""
        planes = self.evs.planes
        retransmit = self._retransmit
        n = 0
        for seq, pkt in self._outstanding.items():
            if pkt.deadline != _INF and planes[pkt.ev] == plane:
                pkt.deadline = _INF  # queued: its deadline entry is dead
                retransmit.append(seq)
                n += 1
        self._waiting += n
        self.stats.retransmits_link += n
        return n

    def _on_losses(self, lost: list[tuple[int, _Packet, bool]], now: float) -> None:
        """Resend packets the loss detector found lost; retire the EVs it blames."""
        if lost:
            self.cc.on_loss(now)
        for seq, pkt, blame in lost:
            pkt.deadline = _INF
            self._retransmit.append(seq)
            self._waiting += 1
            self.stats.retransmits_sack += 1
            if self._told_down and self.evs.planes[pkt.ev] in self._told_down:
                self._confirm_plane(self.evs.planes[pkt.ev])
            if not self.health:
                continue
            if blame and not pkt.silenced:
                self._blame(pkt.ev, pkt.sent_at, EVReason.SACK_LOSS, now)
            else:
                self.losses_unblamed += 1

    def _probe_answered(self, pkt: _Packet, dup: bool, now: float) -> None:
        """An ACK of a tail loss probe's transmission of ``pkt`` (its echoed EV is the
        probe's): unless the receiver says it had the packet already (``dup``: then only the
        ACK of an earlier copy was lost, and the receiver blames the EV that carried it), the
        probe was the first copy to arrive, so every transmission it probed was lost.

        Nothing else could tell: the probe repeats the packet's PSN, so no SACK shows a
        hole, and with a window of a packet or two there are no later packets to show one
        either. A dead path would then cost a probe timeout on every packet sent over it,
        and never be retired."""
        probed, pkt.probed = pkt.probed, None
        if dup or not self.health or probed is None:
            return
        plane = self.evs.planes[pkt.ev]
        # only a probe that shared the NIC queue of what it probed proves it lost: on another
        # plane it may just have overtaken it
        probed = [(ev, sent) for ev, sent in probed if self.evs.planes[ev] == plane]
        self.stats.losses_tlp += len(probed)
        for ev, sent in probed:
            self._blame(ev, sent, EVReason.PROBE_LOSS, now)

    def _blame(self, ev: int, sent: float, reason: EVReason, now: float) -> None:
        """A packet sent on ``ev`` at ``sent`` was lost (``reason``): evidence against the EV
        unless its path showed congestion since ``_ce_memory`` before the send, or its plane
        is one the peer said lost its link (the loss confirms that, :meth:`_confirm_plane`;
        no EV of it is to blame)."""
        evs = self.evs
        if evs.peer_plane_down[evs.planes[ev]]:
            self.losses_unblamed += 1
            return
        evs.lost(
            ev,
            now,
            reason,
            sent_at=sent,
            congestion_since=sent - self._ce_memory(),
            episode=self.recovery.window(self.rtt.srtt),
        )

    def _on_nack(self, code: int, seq: int, pkt: _Packet, now: float) -> None:
        """A NACK on_ack believed: about ``pkt`` (seq ``seq``), in flight, echoing the EV of
        its latest transmission, the first NACK of that transmission."""
        pkt.nacked = True
        if code in _TRIM_CODES:
            pkt.nacks += 1
            if pkt.nacks > self.config.max_nack_retries:
                self.fail(f"PSN {to_psn(self.initial_psn, seq)} trimmed {pkt.nacks} times", pkt.wr)
                return
            if pkt.deadline != _INF:  # not already queued for retransmission
                pkt.deadline = _INF
                self._retransmit.append(seq)
                self._waiting += 1
                self.stats.retransmits_nack += 1
            if self.stats.trims_contradicted >= _TRIM_DISTRUST and not self.authenticated:
                self.stats.trims_distrusted += 1  # a resend, and nothing more
                return
            trimmed = self._trimmed_copy
            if len(trimmed) >= _TRIMMED_KEEP:
                self._trimmed_copy = trimmed = {
                    k: v for k, v in trimmed.items() if k in self._outstanding
                }
            trimmed[seq] = self.evs.values[pkt.ev]
            self.cc.on_trim(now, now - pkt.sent_at)
            if self.health:
                if code == wire.NackCode.TRIMMED:
                    self.evs.trimmed(pkt.ev, now)  # congestion on the path: skip it a round
                else:
                    self.evs.lasthop_trimmed(pkt.ev, now)  # incast: no path is to blame
            return
        # REMOTE_ACCESS_ERROR, the one fatal code a responder sends (_believed refuses others)
        wr = pkt.wr
        reason = (
            f"remote access error: the receiver refused PSN {to_psn(self.initial_psn, seq)} "
            f"(NAK code {code}, REMOTE_ACCESS_ERROR): rkey {wr.rkey:#x}, a write of "
            f"{pkt.length} bytes at {wr.remote_addr + pkt.offset:#x} (outside the region, "
            "region closed, or no write access)"
        )
        if not self.authenticated and seq not in self._held_nacks:
            # keyless: held until the packet's next transmission, on another EV, is refused
            # too; an ACK of it in the meantime contradicts it (_contradicted)
            self._held_nacks[seq] = reason
            self.stats.nacks_unconfirmed += 1
            if pkt.deadline != _INF:
                pkt.deadline = _INF
                self._retransmit.append(seq)
                self._waiting += 1
                self.stats.retransmits_nack += 1
            return
        if seq in self._held_nacks:
            reason += "; refused again on its next transmission"
        self.fail(reason, wr, WCStatus.REMOTE_ACCESS_ERROR)

    def _trim_check(self, seq: int, subject: _Packet | None, ev_echo: int, dup: bool) -> None:
        """A believed ACK about ``seq``, which a trim NACK said arrived trimmed on the copy
        sent on EV value ``_trimmed_copy[seq]``. A trimmed copy is never placed, so the NACK
        was false (forged) if this ACK answers that very copy, or says the resend after it
        was a duplicate while that copy was the only one before it."""
        nacked = self._trimmed_copy.get(seq)
        if nacked is None:
            return
        earlier = self._resent_evs.get(seq, ())
        if subject is not None:
            last = self.evs.values[subject.ev]
        else:
            entry = self._sent_ring[seq & _RING_MASK]
            if entry >> 32 != seq:
                return
            last = entry & 0xFFFFFFFF
        if ev_echo == last:
            proof = dup and len(earlier) == 1 and earlier[0][0] == nacked
        else:
            proof = ev_echo == nacked and sum(v == nacked for v, _t in earlier) == 1
        if proof:
            del self._trimmed_copy[seq]
            self.stats.trims_contradicted += 1

    def _contradicted(self) -> None:
        """Held fatal NACKs whose packet was acknowledged after all were false (forged):
        forgotten, and counted as ``nacks_contradicted``."""
        outstanding = self._outstanding
        for seq in [s for s in self._held_nacks if s not in outstanding]:
            del self._held_nacks[seq]
            self.stats.nacks_contradicted += 1

    def _take_port_state(self, ports: int) -> None:
        """The peer's port-state bits (bit p clear: its plane p lost its link). Our packets
        avoid a plane said to be down at once; what is in flight on it is resent only when a
        loss there confirms it (:meth:`_confirm_plane`), so that a bitmap we cannot verify
        (keyless) can steer, not make us resend. A bitmap with every plane down is refused:
        the ACK that carries it came over one of them."""
        evs = self.evs
        if not ports & ((1 << evs.nplanes) - 1):
            self.stats.port_states_refused += 1
            return
        told = self._told_down
        told.update(evs.set_peer_planes(ports))
        if told:
            self._told_down = {p for p in told if evs.peer_plane_down[p]}

    def _confirm_plane(self, plane: int) -> None:
        """A loss on ``plane``, which the peer said is down: the second signal. What is still
        in flight there is resent at once, as for a link down of ours."""
        self._told_down.discard(plane)
        if self.evs.peer_plane_down[plane]:
            self.resend_plane(plane)
