"""SACK-based loss detection (RACK style): which packets in flight are lost, and whom to blame.

A packet is lost once a packet sent sufficiently later is known to have arrived: waiting for
its retransmission timeout instead would stall delivery for an RTO whenever a path dies. The
detector keeps only what that decision needs (the latest send time known delivered, and what
the receiver has reported per 64-PSN block); the packets themselves stay with the requester,
which resends what the detector names. Time comes in as arguments (send times, the smoothed
RTT), never from a clock, so every decision can be tested with explicit values.

"Sufficiently later" is a reordering window: max(``reorder_min``, srtt x
``reorder_srtt_fraction``) when the evidence travelled on the packet's own plane (one NIC queue,
nearly FIFO), twice that when it came from another plane (queues of different depths: a plane
that comes back with an empty queue overtakes the others by milliseconds). See
docs/EV_HEALTH.md, "Evidence of loss".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

_INF = float("inf")
_NEG_INF = float("-inf")

#: ``_block_news`` is pruned of blocks below the cumulative point once it holds this many.
_MAX_BLOCKS = 1024


class SentPacket(Protocol):
    """What the detector reads of a packet in flight."""

    @property
    def ev(self) -> int: ...  # the EV of its latest transmission

    @property
    def sent_at(self) -> float: ...  # when its latest transmission left

    @property
    def deadline(self) -> float: ...  # retransmission deadline; inf: already queued for one

    @property
    def retransmitted(self) -> bool: ...


P = TypeVar("P", bound=SentPacket)


class LossDetector:
    """RACK-style loss detection for one requester.

    Feed it, per ACK: the send time of the ACK's subject (``subject_sent_at``), what the
    receiver reported on which block (``block_reported``), and the latest send time among the
    packets the ACK acknowledged (``advance``); when ``advance`` says the RACK point moved,
    ``detect`` names the packets in flight that are now lost.
    """

    def __init__(self, reorder_min: float, reorder_srtt_fraction: float) -> None:
        self.reorder_min = reorder_min
        self.reorder_srtt_fraction = reorder_srtt_fraction
        # the RACK point: send time of the latest-sent packet known to have arrived (0: none)
        self.latest = 0.0
        # per 64-PSN block: send time of the latest-sent packet the receiver already had when
        # it reported on that block (the subject of a SACK for it): the blame test of detect()
        self._block_news: dict[int, float] = {}
        #: (seq, sent_at) of the latest ACK's subject in flight: SACKs of one flush share a
        #: subject (public: the requester sets it itself for an ACK of one in flight)
        self.last_subject = (-1, 0.0)

    def window(self, srtt: float | None) -> float:
        """The reordering window tolerated within a plane (across planes: twice this)."""
        return max(self.reorder_min, (srtt or 0.0) * self.reorder_srtt_fraction)

    def subject_sent_at(self, seq: int, sent_at: float | None) -> float | None:
        """Send time of an ACK's subject ``seq``; ``sent_at`` is its send time if it is still
        in flight, else None.

        One flush of the receiver sends a SACK per block with the same subject: the first one
        acknowledges the subject, so the others no longer find it in flight, and its send time
        is remembered for them. Otherwise (a duplicate's ACK, or a stale one) there is no news
        about timing: None.
        """
        if sent_at is not None:
            self.last_subject = (seq, sent_at)
            return sent_at
        if seq == self.last_subject[0]:
            return self.last_subject[1]
        return None

    def block_reported(self, block: int, subject_sent: float, una: int) -> None:
        """The receiver reported on 64-PSN ``block`` after it had received a packet sent at
        ``subject_sent``; ``una`` is the lowest sequence number still in flight (blocks wholly
        below it are forgotten when the table grows)."""
        news = self._block_news
        if subject_sent > news.get(block, _NEG_INF):
            news[block] = subject_sent
        if len(news) > _MAX_BLOCKS:
            floor = una >> 6
            for b in [b for b in news if b < floor]:
                del news[b]

    def advance(self, latest_sent: float) -> bool:
        """A packet sent at ``latest_sent`` is known to have arrived; True if that moves the
        RACK point forward (only then can ``detect`` find something new)."""
        if latest_sent > self.latest:
            self.latest = latest_sent
            return True
        return False

    def detect(
        self,
        in_flight: Mapping[int, P],
        srtt: float | None,
        plane_of: Sequence[int],
        plane_delivered: Sequence[float],
    ) -> list[tuple[int, P, bool]]:
        """The packets of ``in_flight`` (seq -> packet, in send order of first transmissions)
        that are lost, as (seq, packet, blame).

        A packet is lost if it was sent more than two windows before the RACK point, or more
        than one window before both the RACK point and the latest delivery of its own plane
        (``plane_delivered[p]``: send time of the latest packet plane ``p`` delivered;
        ``plane_of[ev]``: the plane of EV ``ev``). Packets already queued for a resend
        (deadline inf) are skipped.

        ``blame``: whether the loss is evidence against the packet's EV. Only if the receiver
        reported on the packet's block after it had received a packet sent a window after
        this one: then this one really was missing. Otherwise the "evidence" may just be a
        lost SACK (its reverse path died), and a healthy EV must not be retired for it.
        """
        # (self.window(srtt), as max() picks: called after every ACK that brings news)
        window = (srtt or 0.0) * self.reorder_srtt_fraction
        if not window > self.reorder_min:
            window = self.reorder_min
        threshold = self.latest - window  # no packet sent after this can qualify
        cross = self.latest - 2 * window
        lost = []
        for seq, pkt in in_flight.items():
            sent = pkt.sent_at
            if sent >= threshold:
                if pkt.retransmitted:
                    continue  # out of send order: its position is its first transmission's
                break  # first transmissions are in send order: none later can qualify
            if sent >= cross and sent >= plane_delivered[plane_of[pkt.ev]] - window:
                continue  # only other planes' packets arrived since: within their skew
            if pkt.deadline != _INF:
                lost.append((seq, pkt))
        if not lost:
            return []  # the common case, one ACK after another
        news = self._block_news
        return [
            (seq, pkt, news.get(seq >> 6, _NEG_INF) >= pkt.sent_at + window) for seq, pkt in lost
        ]
