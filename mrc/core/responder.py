"""The receiving half of a queue pair: validation, write-to-offset placement, SACK/NACK.

Received PSNs are tracked as sequence numbers: ``_cum`` is the highest one below which
everything has arrived, and ``_blocks`` maps a 64-PSN block number to a bitmap of what arrived
in it above ``_cum``. The same bitmaps are what SACKs carry, so building an ACK costs nothing.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable

from mrc import wire
from mrc.core import fastpath
from mrc.core.config import QPConfig
from mrc.core.events import Datagram, Event, ImmediateReceived
from mrc.core.evset import EVSet
from mrc.core.memory import ProtectionDomain
from mrc.core.psn import to_psn, to_seq
from mrc.core.stats import QPStats

_FULL = (1 << 64) - 1
_MAX_SACKS_PER_FLUSH = 8
_BECN = wire.BTH_BECN << 24
_FECN = wire.BTH_FECN << 24
_ACKREQ = wire.BTH_ACKREQ << 24
_TLP = wire.BTH_TLP << 24
_MARK_FECN = fastpath.MARK_FECN
_OP_WRITE = int(wire.Opcode.RDMA_WRITE_ONLY)
#: where an ACK's ACK Delay field begins (docs/PROTOCOL.md 3.4)
_ACK_DELAY_AT = wire.ACK_LEN - 2
#: segments one call of the train kernel may place (a GRO train holds at most 64)
TRAIN_CAP = 64


class Responder:
    def __init__(
        self,
        config: QPConfig,
        qpn: int,
        evs: EVSet,
        pd: ProtectionDomain,
        stats: QPStats,
        emit: Callable[[Event], None],
    ) -> None:
        self.config = config
        self.qpn = qpn
        self.evs = evs
        self.pd = pd
        self.stats = stats
        self._emit = emit
        self.remote_qpn: int | None = None
        self.peer_initial_psn = 0
        self._cum = -1
        self._hi = -1  # no sequence number above this has arrived (the kernel's shortcut)
        self._blocks: dict[int, int] = {}
        self._imms: list[tuple[int, int]] = []  # heap of (seq, imm) awaiting in-order completion
        self._pending = 0  # packets arrived since the last ACK
        self._dirty: set[int] = set()  # blocks with arrivals since the last ACK
        self._subject = (0, 0)  # (seq, source port) of the latest arrival
        # the latest arrival carried CE (FECN): echoed as BECN in the ACKs about it (NSCC)
        self._subject_ce = False
        self._subject_dup = False  # the latest arrival was a duplicate (wire.ACK_SUBJECT_DUP)
        # the ACKs about the latest arrival go twice (a duplicate, or a tail loss probe)
        self._subject_twice = False
        self._ack_deadline: float | None = None
        #: how long the datagrams being received had waited in this host by their ``now``
        #: (QueuePair.arrived_after; None: unknown)
        self.rx_wait: float | None = None
        # when the latest arrival reached this host, on the caller's clock (None: unknown):
        # the ACK about it says how long ago that was when it leaves (ACK Delay)
        self._subject_at: float | None = None
        # (index in _out, the subject's arrival) of the ACKs whose ACK Delay is written when
        # they are handed out (datagrams_to_send): the time until they leave counts too
        self._stamp: list[tuple[int, float]] = []
        # an ACK fell due (ack_every arrivals, or AckReq): it is built when the QP is next
        # asked for datagrams, so that the ACKs falling due within one receive batch go
        # out as one, about the batch's latest arrival (_note_arrival)
        self._ack_due = False
        # the count of _pending at which the next ACK falls due
        self._next_due = config.ack_every
        self._out: list[Datagram] = []
        # block -> (reverse EV, send time) of the last SACK reporting it
        self._sack_ev: dict[int, tuple[int, float]] = {}
        # what the train kernel reports (fastpath.place_train), reused call after call
        self._seqs = array("q", bytes(8 * TRAIN_CAP))
        self._marks = bytearray(TRAIN_CAP)
        self.fast_placed = 0  # segments placed by the train kernel (the rest: on_data)
        # arrivals owed an ACK at which one goes at once, for datagrams of _batch_size bytes
        # (ack_batch_max, or ack_batch_bytes of them if more: _batch_for)
        self._batch_size = 0
        self._batch_max = config.ack_batch_max

    # ---- input -------------------------------------------------------------------------

    def on_data(self, data: memoryview, src_ev: int, now: float, imm_op: bool) -> None:
        """Validate and place one data packet (BTH already checked for version and QP)."""
        stats = self.stats
        hdr = wire.DATA_IMM_HDR if imm_op else wire.DATA_HDR
        if len(data) < hdr.size:
            stats.dropped_by_reason["short"] += 1
            return
        if imm_op:
            (_o, _f, _p, qpw, psnw, va, rkey, length, imm) = hdr.unpack_from(data)
        else:
            (_o, _f, _p, qpw, psnw, va, rkey, length) = hdr.unpack_from(data)
            imm = 0
        # the S flag was handled before dispatch (QueuePair.receive_datagram): a datagram
        # reaching here is either unprotected or already unsealed, its S bit cleared
        # Without keys, whatever a stranger can learn from our answers it can probe for, so
        # an unknown rkey and a PSN no sender may use get none: dropped and counted exactly
        # like a datagram for an unknown QP (no ACK, no NACK, no PSN/SACK state, no EV
        # evidence). A genuine packet, trimmed or not, always carries a known rkey.
        region = self.pd.lookup(rkey)
        if region is None:
            stats.dropped_by_reason["bad_rkey"] += 1
            return
        seq = to_seq(self.peer_initial_psn, psnw & wire.PSN_MASK, self._cum + 1)
        cum = self._cum
        if seq > cum + self.config.psn_window:
            # ahead of anything the sender may send (anything behind is a duplicate, as in IB)
            stats.dropped_by_reason["psn_out_of_window"] += 1
            return
        payload_len = len(data) - hdr.size
        marks = qpw >> 24
        if payload_len < length or marks & wire.BTH_TRIMMED:
            stats.trims_seen += 1
            if seq > cum and not self._has(seq):
                lasthop = marks & wire.BTH_LASTHOP
                code = wire.NackCode.TRIMMED_LASTHOP if lasthop else wire.NackCode.TRIMMED
                self._nack(code, seq, src_ev)
            return
        if payload_len > length:
            stats.dropped_by_reason["bad_length"] += 1
            return
        offset = va - region.addr
        if offset < 0 or offset + length > region.length:
            stats.dropped_by_reason["out_of_bounds"] += 1
            self._nack(wire.NackCode.REMOTE_ACCESS_ERROR, seq, src_ev)
            return
        if not region.writable and not (region.closed and (seq <= cum or self._has(seq))):
            stats.dropped_by_reason["region_closed" if region.closed else "no_access"] += 1
            self._nack(wire.NackCode.REMOTE_ACCESS_ERROR, seq, src_ev)
            return
        if offset < region.frozen and length and seq > cum and not self._has(seq):
            # new data below the region's final prefix (MemoryRegion.freeze): closed there
            stats.dropped_by_reason["region_closed"] += 1
            self._nack(wire.NackCode.REMOTE_ACCESS_ERROR, seq, src_ev)
            return
        stats.packets_received += 1
        if seq <= cum or self._has(seq):
            stats.duplicates += 1
            sack = self._sack_ev.pop(seq >> 6, None)
            if sack is not None:
                self._duplicate_of_sacked(sack[0], now - sack[1], now)
            self._subject_ce = bool(marks & wire.BTH_FECN)
            self._note_arrival(seq, src_ev, now, force=True, dup=True)
            return
        hs = hdr.size
        region.view[offset : offset + length] = data[hs : hs + length]
        stats.bytes_placed += length
        block = seq >> 6
        self._blocks[block] = self._blocks.get(block, 0) | (1 << (seq & 63))
        if seq > self._hi:
            self._hi = seq
        if imm_op:
            heapq.heappush(self._imms, (seq, imm))
        if seq == cum + 1:
            self._advance()
        self._subject_ce = bool(qpw & _FECN)
        probe = bool(psnw & _TLP)
        if len(data) != self._batch_size:
            self._batch_for(len(data))
        self._note_arrival(seq, src_ev, now, probe or bool(psnw & _ACKREQ), twice=probe)

    def _duplicate_of_sacked(self, ev: int, since: float, now: float) -> None:
        """A duplicate arrived ``since`` seconds after the latest SACK that reported it left
        on reverse EV ``ev``. The sender sent it again, so that SACK had not reached it: lost
        (loss on the reverse EV means failure there, as on any other), or still on its way.

        Which one, only the timing tells. The sender resends a packet at the earliest
        ``tlp_min`` after it sent the copy before (a tail loss probe after a silence; a
        timeout or SACK evidence later still), and the SACK of that copy left at most
        ``ack_delay`` after it arrived: on a path whose delay held, a resend the SACK's loss
        caused arrives at least ``tlp_min - ack_delay`` after the SACK left. One that comes
        sooner was sent before the SACK could arrive: its original was held in a queue that
        grew faster than the sender's srtt, whose probe fired while the original waited
        (docs/EV_HEALTH.md, "Evidence of loss"). That is no evidence against the reverse
        path, and it is only counted (``duplicates_early``)."""
        cfg = self.config
        if since < cfg.tlp_min - cfg.ack_delay:
            self.stats.duplicates_early += 1
        elif cfg.ev_health:
            self.evs.ack_lost(ev, now, 2 * cfg.tlp_min)

    def on_data_train(
        self, view: memoryview, off: int, seg: int, src_ev: int, now: float, skip: int = 0
    ) -> int:
        """Place the common-case segments of a GRO train (``seg`` bytes each) from byte
        ``off`` with the train kernel; returns how many, from the first on, it placed.
        ``skip``: each segment's datagram starts that many bytes into it (a protected
        train unsealed in place, ``QueuePair.receive_train``).

        It stops at the first segment that is not a plain new WRITE under the rkey of the
        first one (fastpath.py says exactly which): the caller gives that one to
        :meth:`on_data`, which counts, drops or NACKs it, then calls this again after it. A
        placed segment is recorded exactly as :meth:`on_data` records one.
        """
        h = off + skip
        if len(view) - h < wire.DATA_HDR_LEN or view[h] != _OP_WRITE:
            return 0
        rkey = int.from_bytes(view[h + 20 : h + 24], "big")
        region = self.pd.lookup(rkey)
        if region is None or not region.writable:
            return 0
        _stop, placed, nbytes = fastpath.place_train(
            view,
            off,
            seg,
            self.qpn,
            rkey,
            region.open_view,  # not below its final prefix: a segment there stops the kernel
            region.open_addr,
            self.peer_initial_psn,
            self._cum,
            self._hi,
            self.config.psn_window,
            self._blocks,
            self._seqs,
            self._marks,
            skip,
        )
        if placed:
            stats = self.stats
            stats.packets_received += placed
            stats.bytes_placed += nbytes
            self.fast_placed += placed
            if seg - skip != self._batch_size:
                self._batch_for(seg - skip)
            self._arrived(self._seqs, self._marks, placed, src_ev, now)
        return placed

    def _batch_for(self, size: int) -> None:
        """Bound ACK coalescing for datagrams of ``size`` bytes: ``ack_batch_max`` arrivals,
        or as many as make ``ack_batch_bytes`` if that is more. The bound is about the bytes
        a sender's window waits on, and an ACK costs the sender the same whatever it
        acknowledges: per 64 packets of 1400 bytes it cost a fifth of the sender's CPU."""
        cfg = self.config
        self._batch_size = size
        by_bytes = cfg.ack_batch_bytes // size if size > 0 else 0
        self._batch_max = by_bytes if by_bytes > cfg.ack_batch_max else cfg.ack_batch_max

    def _arrived(
        self, seqs: array[int], marks: bytearray, count: int, src_ev: int, now: float
    ) -> None:
        """Record the first ``count`` of ``seqs``, newly placed, in arrival order: SACK bits,
        the cumulative point and ACKs come out exactly as if :meth:`on_data` had recorded
        each alone.

        The arrivals are taken in runs that end where one of them makes an ACK due (the
        ``ack_every``-th since the last ACK, or one that asked for an ACK): per run, the
        bitmaps, the cumulative point and the ACK counters as :meth:`_note_arrival` keeps
        them, all in one ``fastpath.note_runs`` call for the train, which comes back early
        only where an ACK must go at once (its subject, the run's last arrival, must be the
        one it reports). What :meth:`_note_arrival` does besides, it does here once per call,
        about that last arrival (its CE mark is the one echoed, as for a single arrival)."""
        cfg = self.config
        runs = fastpath.note_runs
        i = 0
        while i < count:
            i, self._hi, cum, self._pending, self._next_due, flags = runs(
                seqs,
                marks,
                i,
                count,
                self._blocks,
                self._dirty,
                self._hi,
                self._cum,
                self._pending,
                self._next_due,
                self._ack_due,
                cfg.ack_every,
                self._batch_max,
            )
            if cum != self._cum:
                self._cum = cum
                if self._imms:
                    self._complete_imms()
            self._subject = (seqs[i - 1], src_ev)
            self._subject_dup = self._subject_twice = False
            wait = self.rx_wait
            self._subject_at = None if wait is None else now - wait
            self._subject_ce = bool(flags & fastpath.RUN_CE)
            if flags & fastpath.RUN_FLUSH:
                self.flush(now)
            elif flags & fastpath.RUN_DUE:
                self._ack_due = True
                self._ack_deadline = now  # for a caller that asks the timer first
            elif not self._ack_due and self._ack_deadline is None:
                self._ack_deadline = now + cfg.ack_delay

    def _has(self, seq: int) -> bool:
        return bool((self._blocks.get(seq >> 6, 0) >> (seq & 63)) & 1)

    def _advance(self) -> None:
        """Move ``_cum`` over every contiguous arrival and complete WRITE_IMMs it passes."""
        cum = self._cum
        blocks = self._blocks
        while True:
            nxt = cum + 1
            b = nxt >> 6
            bm = blocks.get(b, 0) >> (nxt & 63)
            if not bm & 1:
                break
            ones = (~bm & (bm + 1)).bit_length() - 1  # trailing ones
            cum += ones
            if (cum & 63) == 63:
                blocks.pop(b, None)
        self._cum = cum
        self._complete_imms()

    def _complete_imms(self) -> None:
        """Complete the WRITE_IMMs at or below the cumulative point, in order."""
        cum = self._cum
        imms = self._imms
        while imms and imms[0][0] <= cum:
            seq, imm = heapq.heappop(imms)
            self._emit(ImmediateReceived(self.qpn, imm))

    def _note_arrival(
        self,
        seq: int,
        src_ev: int,
        now: float,
        force: bool,
        count: int = 1,
        dup: bool = False,
        twice: bool = False,
    ) -> None:
        """ACK bookkeeping for ``count`` arrivals, the latest ``seq`` (the blocks of the
        others are already in ``_dirty``). An ACK falls due at an AckReq (``force``) and at
        every ``ack_every``-th arrival after the last ACK or due point, as each would have
        been sent alone; it goes with the QP's next datagrams, so that the ACKs that fall
        due within one receive batch go out as one, about the batch's latest arrival. It goes
        at once for ``_batch_max`` unacknowledged arrivals (:meth:`_batch_for`), and where
        its own subject matters: CE (the mark is blamed on the EV the ACK echoes), a
        duplicate (``dup``: the ACK says so, wire.ACK_SUBJECT_DUP) and a tail loss probe
        (``twice``: the ACKs of both go twice). Nothing due: an ACK after the delay."""
        self._pending += count
        self._dirty.add(seq >> 6)
        self._subject = (seq, src_ev)
        self._subject_dup = dup
        self._subject_twice = dup or twice
        wait = self.rx_wait
        self._subject_at = None if wait is None else now - wait
        pending = self._pending
        cfg = self.config
        if force or pending >= self._next_due:
            self._next_due = pending + cfg.ack_every
            if self._subject_twice or self._subject_ce or pending >= self._batch_max:
                self.flush(now)
            else:
                self._ack_due = True
                self._ack_deadline = now  # for a caller that asks the timer first
        elif self._ack_due:
            if pending >= self._batch_max:
                self.flush(now)
        elif self._ack_deadline is None:
            self._ack_deadline = now + cfg.ack_delay

    # ---- output ------------------------------------------------------------------------

    def _bitmap(self, block: int) -> int:
        cum = self._cum
        first = block << 6
        if first + 63 <= cum:
            return _FULL
        below = (1 << (cum - first + 1)) - 1 if cum >= first else 0
        return self._blocks.get(block, 0) | below

    def _ack_bytes(
        self,
        syndrome: int,
        seq: int,
        src_ev: int,
        block: int,
        becn: bool = False,
        dup: bool = False,
    ) -> bytes:
        ip = self.peer_initial_psn
        return wire.pack_ack(
            # BECN rides in the BTH byte that pack_ack fills from the QPN's top 8 bits
            (self.remote_qpn or 0) | (_BECN if becn else 0),
            to_psn(ip, self._cum),
            syndrome,
            to_psn(ip, seq) | (wire.ACK_SUBJECT_DUP if dup else 0),
            to_psn(ip, block << 6),
            self._bitmap(block),
            src_ev,
            self.evs.port_state(),
        )

    def announce(self, now: float) -> None:
        """Send an ACK now, whatever arrived: it carries our port-state bitmap to the peer."""
        self._pending = max(self._pending, 1)
        self._dirty.add(max(self._cum, 0) >> 6)
        self.flush(now, timed=True)

    def flush(self, now: float, timed: bool = False) -> None:
        """Queue SACKs for every block that saw arrivals since the last ACK (at ``now``).
        ``timed``: not an ACK that fell due (the delayed-ACK timer ran out, or a port-state
        announcement): its ACK Delay is unknown (0). Its wait is this host's choice, not its
        load, and comes mostly after a loss took the AckReq that would have made it due."""
        if not self._pending:
            return
        seq, port = self._subject
        blocks = sorted(self._dirty)[-_MAX_SACKS_PER_FLUSH:]
        # a block wholly at or below the cumulative point gets no ACK of its own when another
        # block does: that one's ACK PSN acknowledges all of it, and it has no hole to blame.
        # At 1400-byte payloads a GRO train of 45 crosses a block boundary two times in three,
        # and each extra ACK cost both ends a datagram and the sender a whole on_ack
        cum = self._cum
        n = 0
        while len(blocks) - n > 1 and (blocks[n] << 6) + 63 <= cum:
            n += 1
        covered, blocks = blocks[:n], blocks[n:]
        if self._blocks:
            # a hole: the block of the oldest one is reported too, though nothing new arrived
            # in it. The sender blames a lost packet on its EV only once a SACK of its block
            # comes with a subject sent well after it (docs/EV_HEALTH.md, "Evidence of
            # loss"); at high rates the arrivals have long moved blocks ahead by then
            hole = (self._cum + 1) >> 6
            if hole not in self._dirty:
                blocks.append(hole)
        sack_ev = self._sack_ev
        dirty = self._dirty
        # ACK Delay: the subject's time here, its socket's queue and ours, so that the sender
        # can tell this host's delay from the network's (docs/PROTOCOL.md 3.4); written when
        # the ACK is handed out, which may be after the rest of a receive batch
        at = None if timed else self._subject_at
        stamp = self._stamp
        for block in blocks:
            pkt = self._ack_bytes(
                wire.AETH_ACK, seq, port, block, self._subject_ce, self._subject_dup
            )
            if at is not None:
                stamp.append((len(self._out), at))
            ev = self.evs.next()
            if block in dirty:  # a report of the oldest hole's block alone blames no EV later
                sack_ev[block] = (ev, now)
            if covered:
                # the blocks this ACK acknowledges by its ACK PSN alone: a duplicate in one
                # of them later says this ACK was lost (_duplicate_of_sacked)
                for b in covered:
                    sack_ev[b] = (ev, now)
                covered = []
            self._out.append((ev, pkt, b""))
            self.stats.acks_sent += 1
            if self._subject_twice:
                # the sender sent the subject again (a duplicate), or probes a silence (P): our
                # ACKs may not be getting through. This one goes twice, the copy on another
                # plane. A sender held at a packet or two by NSCC has nothing else in flight
                # to be acknowledged, and every ACK lost on a dead reverse path costs it a
                # tail loss probe, and after three of them an RTO (docs/EV_HEALTH.md)
                if at is not None:
                    stamp.append((len(self._out), at))
                self._out.append((self.evs.next_apart(ev), pkt, b""))
                self.stats.acks_sent += 1
        if len(sack_ev) > 4096:  # forget blocks far behind the cumulative point
            floor = (self._cum >> 6) - 1024
            for block in [b for b in sack_ev if b < floor]:
                del sack_ev[block]
        self._pending = 0
        self._dirty.clear()
        self._ack_deadline = None
        self._ack_due = False
        self._next_due = self.config.ack_every

    def _nack(self, code: int, seq: int, src_ev: int) -> None:
        if self.remote_qpn is None:
            return
        pkt = self._ack_bytes(wire.AETH_NAK_BASE | code, seq, src_ev, max(seq, 0) >> 6)
        self._out.append((self.evs.next(), pkt, b""))
        self.stats.nacks_sent += 1

    def datagrams_to_send(self, now: float, out: list[Datagram]) -> None:
        if self._ack_deadline is not None and now >= self._ack_deadline:
            # the delay ran out, or an ACK fell due (_note_arrival)
            self.flush(now, timed=not self._ack_due)
        if self._out:
            if self._stamp:
                self._write_delays(now)
            out.extend(self._out)
            self._out.clear()

    def _write_delays(self, now: float) -> None:
        """Write the ACK Delay of the ACKs about subjects whose arrival is known."""
        out = self._out
        for i, at in self._stamp:
            ev, pkt, rest = out[i]
            code = wire.ack_delay_code(now - at)
            out[i] = (ev, pkt[:_ACK_DELAY_AT] + code.to_bytes(2, "big"), rest)
        self._stamp.clear()

    def get_timer(self) -> float | None:
        return self._ack_deadline

    @property
    def received_through(self) -> int:
        """Sequence number through which every packet has arrived (-1: none yet)."""
        return self._cum
