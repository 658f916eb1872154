"""The requester's loss timers: when its one timer fires, and what a retransmission timeout or
a tail loss probe does to the packets in flight.

SACK evidence (:mod:`mrc.core.recovery`) finds most losses; these timers are for what it cannot
see: the tail of a flight (no later packet shows a hole) and a silence of the whole peer.

* Every packet has a retransmission deadline, the RTO from its send, doubled per timeout it
  met (``RttEstimator.backed_off``). Deadlines live in a heap with lazy deletion (an entry is
  live only while its packet is in flight with that very deadline): they are not monotone in
  send order (per-packet backoff, a changing RTO), and the timer must always be armed at the
  earliest one.
* A tail loss probe is due max(``tlp_min``, 2 srtt) after the last news, each probe in a row
  waiting twice as long as the one before, at most ``tlp_max`` in a row. It resends the
  newest packet in flight, whose ACK lets SACK detection repair a lost tail without waiting
  for an RTO, and holds every timeout off for an RTO (as TCP's does, RFC 8985 7.3), so that
  the SACKs it brings decide what was lost.

The packet records and the resend queue stay with the requester: the timers read and write
the records' timing fields (``deadline``, ``timeouts``, ``silenced``, ``probed``) and tell the
requester what to resend and why through :class:`TimerHost`. Time comes in as arguments,
never from a clock, so every decision can be tested with explicit values.
"""

from __future__ import annotations

import heapq
from typing import Generic, Protocol, TypeVar

from mrc.core.rtt import RttEstimator

_INF = float("inf")
_NEG_INF = float("-inf")


class TimedPacket(Protocol):
    """What the timers read and write of a packet in flight (``fastpath.Packet``)."""

    ev: int  # the EV of its latest transmission
    sent_at: float  # when its latest transmission left
    deadline: float  # when it times out; inf: queued for a resend
    timeouts: int  # how many times it timed out (its deadline's backoff)
    # it timed out in a silence of the whole peer and waits for the oldest one's resend: its
    # loss is no evidence against its EV
    silenced: bool
    # the transmissions a tail loss probe repeated, as (ev, sent_at), until its ACK says
    probed: list[tuple[int, float]] | None


P = TypeVar("P", bound=TimedPacket)
P_contra = TypeVar("P_contra", bound=TimedPacket, contravariant=True)


class TimerHost(Protocol[P_contra]):
    """What the timers ask of the requester they serve: resends, and its end."""

    def resend_timed_out(self, seq: int, pkt: P_contra, now: float, blame: bool | None) -> None:
        """``pkt`` (sequence number ``seq``) timed out and its deadline is inf now: queue its
        resend and tell the window law. ``blame``: whether the loss is evidence against its EV;
        None: it met a silence of the whole peer (counted as such, no EV judged)."""

    def retries_exhausted(self, seq: int, pkt: P_contra, now: float) -> None:
        """``pkt`` timed out more often than ``max_timeout_retries`` allows: the QP fails."""

    def resend_as_probe(self, seq: int, queued: bool) -> bool:
        """Send ``seq`` next, as a tail loss probe, past the window. ``queued``: a resend of it
        is queued already (a loss found, a NACK), and is moved ahead instead. False if it is
        going out as a probe already: nothing changed."""


class LossTimers(Generic[P]):
    """The retransmission deadlines and the tail loss probe of one requester.

    ``records``: the requester's packets in flight, seq -> record, in sequence order (shared:
    the requester adds and removes them, the timers change their timing fields). The
    requester tells the timers what left (:meth:`track`, :meth:`resent`) and what the peer said
    (:meth:`heard`, :meth:`progressed`, :meth:`news`); :meth:`next_time` is when the timer must
    fire, :meth:`expire` what happens then.
    """

    def __init__(
        self,
        records: dict[int, P],
        host: TimerHost[P],
        rtt: RttEstimator,
        *,
        tlp_min: float,
        tlp_max: int,
        initial_rto: float,
        max_timeout_retries: int,
    ) -> None:
        self._records = records
        self._host = host
        self._rtt = rtt
        self.tlp_min = tlp_min
        self.tlp_max = tlp_max
        self.initial_rto = initial_rto
        self.max_timeout_retries = max_timeout_retries
        # heap of (deadline, seq, n): packets seq..seq+n-1 (a burst, or one resent packet) were
        # given that deadline; lazy deletion (an entry is live while any of them still has it)
        self._deadlines: list[tuple[float, int, int]] = []
        self.tlp_at: float | None = None  # when the tail loss probe is due (None: not armed)
        self.tlps = 0  # tail loss probes sent since the last news (at most tlp_max)
        # no packet times out before this: a tail loss probe went out then, and restarts the
        # retransmission timer as TCP's does (RFC 8985 7.3), so that its answer, which finds
        # what was lost by SACK, is not overtaken by timeouts of what it probes for
        self.rto_hold = _NEG_INF
        # when an ACK last acknowledged something new: a packet sent after it that times out
        # met a silent peer, not (known) a bad path (expire)
        self.progress_at = _NEG_INF
        # when an ACK was last believed, news or not: what a failure reports the peer did
        self.heard_at = _NEG_INF

    # ---- what left, what came back --------------------------------------------------------

    def first_deadline(self, now: float) -> float:
        """The deadline of a packet sent ``now`` for the first time: one RTO later."""
        return now + self._rtt.rto

    def track(self, deadline: float, seq: int, n: int) -> None:
        """Packets ``seq``..``seq + n - 1`` left with ``deadline`` (one heap entry a burst)."""
        heapq.heappush(self._deadlines, (deadline, seq, n))

    def resent(self, seq: int, pkt: P, now: float) -> None:
        """``pkt`` leaves again ``now``: its deadline is the RTO backed off per timeout."""
        pkt.deadline = deadline = now + self._rtt.backed_off(pkt.timeouts)
        heapq.heappush(self._deadlines, (deadline, seq, 1))

    def heard(self, now: float) -> None:
        """An ACK was believed ``now`` (for a failure's message)."""
        self.heard_at = now

    def progressed(self, now: float) -> None:
        """An ACK acknowledged something new ``now``: what was sent before it met no silence."""
        self.progress_at = now

    def news(self, now: float) -> None:
        """An ACK showed a packet delivered: the next silence may be probed again, from now.
        (:meth:`arm_probe` with ``tlps`` 0, inlined: most ACKs bring news.)"""
        self.tlps = 0
        if not self._records or self.tlp_max <= 0:
            self.tlp_at = None
            return
        srtt = self._rtt.srtt
        pto = 2 * srtt if srtt is not None else self.initial_rto / 2
        # max(tlp_min, pto) * (1 << 0), as max() picks
        self.tlp_at = now + (pto if pto > self.tlp_min else self.tlp_min)

    def arm_probe(self, now: float) -> None:
        """Arm the tail loss probe from ``now`` (after a send, news or a probe), or disarm it:
        nothing in flight, or ``tlp_max`` probes in a row met silence already."""
        if not self._records or self.tlps >= self.tlp_max:
            self.tlp_at = None
            return
        srtt = self._rtt.srtt
        pto = 2 * srtt if srtt is not None else self.initial_rto / 2
        # each probe in a row waits twice as long as the one before
        self.tlp_at = now + max(self.tlp_min, pto) * (1 << self.tlps)

    # ---- when ---------------------------------------------------------------------------

    def _live_top(self) -> float | None:
        """The earliest live deadline, dropping stale entries on the way. The entry left on
        top starts at a packet that has its deadline: a burst whose first packets were
        acknowledged is trimmed once (``heapreplace`` with a larger key keeps the heap a
        heap), not rescanned on every call."""
        heap = self._deadlines
        records = self._records
        while heap:
            deadline, seq, n = heap[0]
            for s in range(seq, seq + n):
                pkt = records.get(s)
                if pkt is not None and pkt.deadline == deadline:
                    if s != seq:
                        heapq.heapreplace(heap, (deadline, s, seq + n - s))
                        break  # the trimmed entry may no longer be the top
                    return deadline
            else:
                heapq.heappop(heap)
        return None

    def next_time(self) -> float | None:
        """When :meth:`expire` must run: the earliest live deadline (not before a probe's
        hold), or the tail loss probe if sooner; None: nothing to wait for."""
        top = self._live_top()
        if top is not None and top < self.rto_hold:
            top = self.rto_hold
        tlp = self.tlp_at
        if top is None:
            return tlp
        return top if tlp is None or top < tlp else tlp

    # ---- what then ----------------------------------------------------------------------

    def expire(self, now: float, rack_latest: float) -> None:
        """Time out every packet whose deadline has passed, then send the tail loss probe if
        it is due. ``rack_latest``: the send time of the latest packet known delivered
        (``LossDetector.latest``).

        A packet sent after the last ACK that acknowledged anything new met silence: the
        peer (or every path) said nothing since it left, and that is no evidence against its
        EV. Of those, the oldest is resent, as TCP resends one segment on an RTO, and the
        rest wait for its answer (their deadlines join its backed-off one): resending every
        packet of a silent window buried a peer that had only stalled under duplicates, whose
        resend of the oldest then waited behind them past the next RTO, again and again
        (a 0.3 s receiver stop on ::1 became a transfer that never ended).

        A packet that times out after the peer answered again is resent with the rest, but
        blamed only if something sent after it was acknowledged: one left waiting in a
        silence (``silenced``), or sent just before the peer stopped answering, was lost to
        the stop (a stalled receiver's socket overflows), not to its path; blamed, eight
        of them took a single plane down after a 0.3 s receiver stop.

        Stops at once when a packet exhausts its retries (the host fails the QP)."""
        records = self._records
        silent: list[int] = []  # judged together, after the others
        while True:
            top = self._live_top()
            if top is None or top > now or now < self.rto_hold:
                break
            deadline, first, n = heapq.heappop(self._deadlines)
            # every packet of the entry that still has its deadline times out, in order
            for seq in range(first, first + n):
                pkt = records.get(seq)
                if pkt is None or pkt.deadline != deadline:
                    continue
                if pkt.sent_at >= self.progress_at:
                    silent.append(seq)
                    continue
                # nothing sent after it was acknowledged: the peer may have gone quiet just
                # after answering what came before it (a stopped receiver)
                blame = not (pkt.silenced or pkt.sent_at >= rack_latest)
                if not self._time_out(seq, pkt, now, blame):
                    return
        if silent and not self._time_out_silence(silent, now):
            return
        if self.tlp_at is not None and self.tlp_at <= now:
            self.tlp_at = None
            if records:
                self._tail_probe(now)

    def _time_out(self, seq: int, pkt: P, now: float, blame: bool | None) -> bool:
        """``pkt`` timed out once more: queued for a resend by the host, or, past the retry
        budget, the QP fails (False)."""
        pkt.timeouts += 1
        if pkt.timeouts > self.max_timeout_retries:
            self._host.retries_exhausted(seq, pkt, now)
            return False
        pkt.deadline = _INF
        self._host.resend_timed_out(seq, pkt, now, blame)
        return True

    def _time_out_silence(self, silent: list[int], now: float) -> bool:
        """Of the packets that timed out in silence, the oldest is resent (blaming no EV);
        the others keep waiting, until its resend's backed-off deadline. False: the QP
        failed."""
        records = self._records
        head = min(silent)
        pkt = records[head]
        if not self._time_out(head, pkt, now, None):
            return False
        # the resend's deadline, as resent() will set it (it may go later)
        wait = now + self._rtt.backed_off(pkt.timeouts)
        for seq in silent:
            if seq != head:
                waiting = records[seq]
                waiting.silenced = True
                waiting.deadline = wait
                heapq.heappush(self._deadlines, (wait, seq, 1))
        return True

    def _tail_probe(self, now: float) -> None:
        """The tail loss probe is due: resend the newest packet in flight, past the window."""
        records = self._records
        seq = next(reversed(records))  # insertion order is seq order
        pkt = records[seq]
        if pkt.deadline == _INF:  # already queued for a resend
            self._probe_queued(seq, now)
            return
        pkt.deadline = _INF
        # the transmission probed: if the probe turns out to be the first copy to arrive, it
        # was lost, and its EV is blamed then (Requester._probe_answered)
        if pkt.probed is None:
            pkt.probed = [(pkt.ev, pkt.sent_at)]
        else:
            pkt.probed.append((pkt.ev, pkt.sent_at))
        # a probe goes out whatever the window: the law may have shrunk it below what is in
        # flight, and a probe held back by the silence it is meant to break would leave that
        # silence to the RTO
        self._host.resend_as_probe(seq, False)
        self.tlps += 1
        self.rto_hold = now + self._rtt.backed_off(0)
        self.arm_probe(now)  # the next probe, if this one meets silence too

    def _probe_queued(self, seq: int, now: float) -> None:
        """The tail loss probe when the newest packet is already queued for a resend (a loss
        found, a NACK), held back by a window shrunk below what is in flight: that resend is
        the probe, and goes now, past the window; doing nothing instead would leave the
        silence to the RTO, and arm no further probe (docs/CONGESTION.md)."""
        if self._host.resend_as_probe(seq, True):
            self.tlps += 1
            self.rto_hold = now + self._rtt.backed_off(0)
        self.arm_probe(now)

    def what_was_heard(self, now: float, acked: int, refused: int) -> str:
        """What the peer's side of the QP showed before it failed, for the failure's message
        (``acked``: packets acknowledged in all; ``refused``: ACKs refused as not ours):
        "gone" is a guess the sender cannot make (a receiver too busy to answer in time, or
        one whose ACKs take a path that drops, look the same from here)."""
        why = f", and {refused} ACKs were refused as not ours" if refused else ""
        if self.heard_at == _NEG_INF:
            return f"no ACK ever came back (peer unreachable, not answering, or gone{why})"
        told = f"{acked} packets acknowledged in all{why}"
        last = f"the last ACK came {now - self.heard_at:.1f} s ago"
        if self.heard_at <= self.progress_at:
            return f"{last} ({told})"
        news = (
            f"{now - self.progress_at:.1f} s ago"
            if self.progress_at != _NEG_INF
            else "never acknowledged anything new"
        )
        return f"{last}, the last that acknowledged anything new {news} ({told})"
