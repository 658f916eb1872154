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
* a loss is compared with the path's *siblings* (the plane's other routes, same peer) over
  the same time (:meth:`note_lost`): a queue they share (the last hop) drops the packets of
  every route that arrive while it is full. So a sibling's loss is evidence of congestion as
  a delay rise is (:meth:`siblings_lost`: a queue that stayed full since the QP began shows
  no rise), and beyond the episode a path may lose as many more sends as its siblings lost
  on average since the episode began; a dead route keeps losing while its siblings lose few
  or none, and is taken for dead as before. A loss with no evidence either way waits for
  its route's next packet, delivered or lost (``HELD_WINDOWS``, ``EVSet.judge_held``).
* a route that answers a probe sent after its lost packet works (``EVSet._ask`` sends one;
  a small probe fits a full tail-drop queue far more often than a full packet): evidence of
  congestion too, and beyond the episode the route may lose ``ANSWERED_LOSSES`` more sends
  while it answers probes sent after its latest lost one. A dead route answers nothing.
"""

from __future__ import annotations

_NEG_INF = float("-inf")
_NO_EPISODE = (_NEG_INF, 0, _NEG_INF, 0, _NEG_INF, _NEG_INF)
_NO_LOSS = (_NEG_INF, 0)
#: sends lost beyond an episode's span, with nothing delivered, still taken for congestion
LATE_LOSSES = 3
#: sends lost beyond those still taken for congestion while the path answers probes sent after
#: its previous lost send (EVSet.route_answered): it works, and its full packets meet a full
#: queue that small probes still fit
ANSWERED_LOSSES = 6
#: a loss with no congestion seen is held at most this many reordering windows (or the CE
#: memory, if longer), while its route has neither delivered a packet sent after it nor lost
#: one (EVSet.judge_held)
HELD_WINDOWS = 4


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
        # span, the one found last, its plane's sibling losses when the episode began, the
        # latest send time among the episode's lost sends, the same before the one found last)
        self._episode: dict[int, tuple[float, int, float, int, float, float]] = {}
        # path key -> (send time of its latest lost packet, sends it lost), and per plane the
        # sends lost on all its paths: its siblings' losses are the difference (``note_lost``)
        self._lost: dict[int, tuple[float, int]] = {}
        self._plane_lost = [0] * nplanes
        self._plane_paths: list[dict[int, float]] = [{} for _ in range(nplanes)]
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

    def note_lost(self, key: int, plane: int, sent_at: float) -> None:
        """A packet sent at ``sent_at`` on path ``key`` of ``plane`` was found lost (once per
        packet, whatever the verdict): the sends each path lost, for its siblings' comparison
        (``excuses``). The packets of one burst leave together: one send."""
        last, n = self._lost.get(key, _NO_LOSS)
        if sent_at != last:
            self._lost[key] = (sent_at, n + 1)
            self._plane_lost[plane] += 1
            paths = self._plane_paths[plane]
            if sent_at > paths.get(key, _NEG_INF):
                paths[key] = sent_at

    def siblings_lost(self, key: int, plane: int, since: float) -> bool:
        """Whether another path of ``plane`` lost a packet sent at or after ``since``: a
        loss on path ``key`` then is the plane's congestion (a queue they share drops what
        arrives while it is full, whatever its route), even where no delay rise shows (a
        queue that stayed full since the QP began is its base RTT). A dead route loses alone.
        """
        return any(k != key and t >= since for k, t in self._plane_paths[plane].items())

    def lost_after(self, key: int, plane: int, sent_at: float) -> bool:
        """Whether path ``key`` of ``plane`` lost a packet sent after ``sent_at``
        (``note_lost``; losses are found out of send order too)."""
        return self._plane_paths[plane].get(key, _NEG_INF) > sent_at

    def _siblings_lost(self, key: int, plane: int) -> int:
        return self._plane_lost[plane] - self._lost.get(key, _NO_LOSS)[1]

    def excuses(
        self,
        key: int,
        sent_at: float,
        alive_sent: float,
        span: float,
        late: int = 0,
        plane: int = -1,
        siblings: int = 0,
        answered: float = _NEG_INF,
        more: int = 0,
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
        loses every packet sprayed on it, so a few more cost it little time.

        With ``siblings`` (the number of other routes of ``plane`` to the same peer, whose
        losses ``note_lost`` counted), ``late`` grows by the sends they lost since the
        episode began, per sibling: at a full queue they share, every route loses the packets
        that arrive while it is full, and one route's run of losses is as long as theirs. A
        dead route loses all of its sends, its siblings only their share of the congestion
        (a fraction ``p`` of theirs), so it is still found after about ``late / (1 - p)``
        sends, and as before where they lose none.

        ``answered``: the send time of the latest probe of the path answered. If that probe
        left after every earlier lost send of the episode (losses are found out of send
        order too), ``late`` grows by ``more``: the path works
        (a dead one answers nothing, so it is found as before, one send later at most if it
        died within the episode), and behind a queue that stays full a route of a QP that
        sends seldom loses a run of sends its siblings may not (its next sends meet the same
        full queue). A route that answers probes but loses every full packet (an MTU black
        hole) is still found, ``more`` sends later."""
        start, lost, last, sib0, top, prev = self._episode.get(key, _NO_EPISODE)
        if start == _NEG_INF or alive_sent >= start:
            sib = self._siblings_lost(key, plane) if siblings else 0
            self._episode[key] = (sent_at, 0, sent_at, sib, sent_at, _NEG_INF)
            return True
        if sent_at - start < span:
            if sent_at > top:
                self._episode[key] = (start, lost, last, sib0, sent_at, prev)
            return True
        if sent_at != last:  # the packets of one burst leave together: one send
            lost += 1
            prev = top
            top = sent_at if sent_at > top else top
            self._episode[key] = (start, lost, sent_at, sib0, top, prev)
        if answered > prev:
            late += more
        if lost <= late:
            return True
        return bool(siblings) and lost * siblings <= (
            late * siblings + self._siblings_lost(key, plane) - sib0
        )

    def late_sends(self, key: int) -> int:
        """Sends path ``key`` lost beyond its current episode's span (0: none, or none yet)."""
        return self._episode.get(key, _NO_EPISODE)[1]
