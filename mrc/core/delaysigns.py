"""Queueing delay on a QP's paths, and the loss episodes it excuses: congestion without marks.

A part of :class:`mrc.core.evset.EVSet` kept on its own. Loss means failure only where a full
queue trims or marks before it drops. On a network that does neither (tail drop, no ECN: most
networks), a loss after the path's delay rose is congestion all the same, and retiring its EV
only moved healthy traffic around (docs/EV_HEALTH.md, "Congestion without marks"). Delay is
what the window law reads anyway; here it is remembered per path, as CE marks are
(:class:`mrc.core.cepenalty.CEPenalties`):

* an RTT sample more than ``max(floor, fraction x base)`` above its plane's base RTT (the
  smallest sample seen there) is *delay* on its plane (:meth:`sample`);
* a loss is judged a little after it is found (``EVSet.lost`` holds it for a reordering
  window): a tail drop is found by packets that went round the full queue, before the ACKs of
  the packets queued ahead of the dropped one bring the delay back;
* a loss on a plane that showed delay is excused only as the first of an *episode*
  (:meth:`excuses`): a dead link shows no delay rise before its first loss, but may have had
  one (it was carrying traffic when it died); what tells it from a queue is that it keeps
  losing. So once a path (its route where routes are known, else its EV) has lost a packet, a
  loss of a packet sent a span or more later while the path delivered nothing sent since the
  episode began is a failure, delay or not. Losses within the span are one episode (a tail
  drop takes several packets of a burst at once).
"""

from __future__ import annotations

_NEG_INF = float("-inf")
_NO_EPISODE = (_NEG_INF, 0, _NEG_INF)
#: sends lost beyond an episode's span, with nothing delivered, still taken for congestion
LATE_LOSSES = 3


class DelaySigns:
    def __init__(self, nplanes: int, floor: float, fraction: float) -> None:
        """A sample is delay above ``max(floor, fraction x base RTT)``; ``floor`` 0 and
        ``fraction`` 0: off."""
        self.floor = floor
        self.fraction = fraction
        self.enabled = floor > 0 or fraction > 0
        self.base = [float("inf")] * nplanes  # smallest RTT sample per plane
        self._plane_at = [_NEG_INF] * nplanes  # latest delayed sample per plane
        # path key -> (send time of its episode's first loss, sends lost since beyond the
        # span, the latest of them)
        self._episode: dict[int, tuple[float, int, float]] = {}
        self.samples = 0  # samples found delayed

    def sample(self, plane: int, rtt: float, now: float) -> None:
        """An RTT sample of a packet sent on ``plane``, taken at ``now``."""
        base = self.base[plane]
        if rtt < base:
            self.base[plane] = rtt
            return
        excess = self.fraction * base
        if rtt - base > (excess if excess > self.floor else self.floor):
            self.samples += 1
            self._plane_at[plane] = now

    def delayed(self, plane: int, since: float) -> bool:
        """Whether ``plane`` showed queueing delay at or after ``since``, on any of its paths:
        a queue they share (the last hop, the NIC) delays them all, and where a path that died
        is the one losing, the episode rule (:meth:`excuses`) tells it from a queue."""
        return self._plane_at[plane] >= since

    def excuses(
        self, key: int, sent_at: float, alive_sent: float, span: float, late: int = 0
    ) -> bool:
        """Whether a loss on path ``key`` of a packet sent at ``sent_at`` may be congestion:
        it starts an episode (the path delivered a packet sent at or after the last
        episode's first loss: ``alive_sent``), falls within ``span`` of the episode's first
        loss, or is one of the first ``late`` sends lost after that (the requester's data
        paths: ``LATE_LOSSES``). A path that loses more, with nothing delivered since the
        episode began, keeps losing: False.

        Why a count as well as a span: behind a queue that stays full, the path's packets
        sent since the episode began are still queued, or dropped too, when the next loss is
        found, and a span alone took such a path for dead (docs/EV_HEALTH.md); a dead path
        loses every packet sprayed on it, so a few more cost it little time."""
        start, lost, last = self._episode.get(key, _NO_EPISODE)
        if start == _NEG_INF or alive_sent >= start:
            self._episode[key] = (sent_at, 0, sent_at)
            return True
        if sent_at - start < span:
            return True
        if sent_at != last:  # the packets of one burst leave together: one send
            lost += 1
            self._episode[key] = (start, lost, sent_at)
        return lost <= late
