"""Delay-steered plane shares: send less on a plane whose paths queue more than the others'.

Spraying gives every plane the same share of a QP's packets, which is right while the planes
are alike. When one plane loses capacity somewhere between the leaves (a spine link down, so
its remaining spine carries what two did), an equal share makes that plane's queue set the
pace of the whole QP while the other planes idle. Nothing marks or drops at first: the only
signal is delay, and only a queue that stands: each window of 4 round trips (of the slowest
plane, from smoothed RTTs), the smallest RTT sample of each plane is compared with the best
plane's. A plane whose smallest sample exceeded the best one's by more than a margin in
``persist`` windows in a row gives up part of its share (multiplicative decrease); a plane
that did not wins share back (additive increase), up to an equal share.

The smallest sample is what tells a standing queue (the one spine left carrying two spines'
traffic never drains) from queues that come and go: planes that share the bottleneck take
turns being the deeper one for a few milliseconds, each draining to near empty in between, and
steering that chases those turns costs goodput, since the share taken from one plane leaves
the other as the bottleneck. Senders that share a receiver still move together a little (they
see the same last hops); docs/EV_HEALTH.md ("Plane shares follow the planes' delays") has
what each choice measured.

When every plane shares the bottleneck (the receiver's last hops, the sender's NICs) their
delays stay alike and nothing changes: the failover demo's single flow, whose NICs are the
bottleneck, keeps every plane in full use with one spine of a plane down.

Sans-IO: times come in as arguments. The EV set reads ``weights`` when it lays out a round.
"""

from __future__ import annotations

#: smoothing gain of each plane's delay per sample: only the window's length comes from it
_GAIN = 1 / 32
_INF = float("inf")
#: round trips (of the slowest plane) per comparison window
_WINDOW_RTTS = 4


class PlaneSteering:
    """Per-plane weights in [``floor``, 1] from per-plane RTT samples.

    ``margin``: a plane is "slower" in a window when its smallest sample exceeds the best
    plane's by more than ``margin`` x that plus ``min_excess`` seconds. ``decrease``: the
    factor a slower plane's weight is multiplied by per window, once it has been slower for
    ``persist`` windows in a row; ``increase``: what any other plane's weight gains per
    window. ``threshold``: how far the weights must move from those the current round was
    laid out with before ``sample`` asks for a new round.
    """

    def __init__(
        self,
        nplanes: int,
        margin: float = 0.5,
        min_excess: float = 0.001,
        floor: float = 0.25,
        decrease: float = 0.8,
        increase: float = 0.05,
        threshold: float = 0.1,
        persist: int = 2,
    ) -> None:
        self.nplanes = nplanes
        self.margin = margin
        self.min_excess = min_excess
        self.floor = floor
        self.decrease = decrease
        self.increase = increase
        self.threshold = threshold
        self.persist = persist
        self._over = [0] * nplanes  # windows in a row each plane has been slower
        # smoothed RTT per plane: only the comparison window's length is taken from it
        self.delay: list[float | None] = [None] * nplanes
        self._win_min = [_INF] * nplanes  # smallest sample per plane in the current window
        self.weights = [1.0] * nplanes
        self.applied = [1.0] * nplanes  # the weights the current round was laid out with
        self._next_update = 0.0
        self.decreases = 0  # times a plane gave up share (for tests and debugging)

    def sample(self, plane: int, rtt: float, now: float) -> bool:
        """An RTT sample of a packet sent on ``plane``; True if the weights have moved far
        enough from ``applied`` that the rotation should be laid out again."""
        d = self.delay[plane]
        self.delay[plane] = rtt if d is None else d + _GAIN * (rtt - d)
        if rtt < self._win_min[plane]:
            self._win_min[plane] = rtt
        if now < self._next_update:
            return False
        known = [x for x in self.delay if x is not None]
        if len(known) < 2:
            return False
        mins = self._win_min
        seen = [m for m in mins if m != _INF]
        self._next_update = now + _WINDOW_RTTS * max(known)
        if len(seen) < 2:
            return False
        # the smallest sample of each plane over a few round trips: a queue that comes and
        # goes (planes sharing the bottleneck take turns) drains to it, a standing one (the
        # one spine left) does not
        best = min(seen)
        limit = best * (1.0 + self.margin) + self.min_excess
        weights = self.weights
        over = self._over
        window = list(mins)
        self._win_min = [_INF] * self.nplanes
        for p, dp in enumerate(window):
            if dp == _INF:
                continue  # no sample this window: no news
            if dp > limit:
                over[p] += 1
                if over[p] >= self.persist:  # a lasting difference, not a queue's noise
                    w = weights[p] * self.decrease
                    weights[p] = w if w > self.floor else self.floor
                    self.decreases += 1
                continue
            over[p] = 0
            if weights[p] < 1.0:
                w = weights[p] + self.increase
                weights[p] = w if w < 1.0 else 1.0
        return any(abs(w - a) >= self.threshold for w, a in zip(weights, self.applied, strict=True))

    def forget(self, plane: int) -> None:
        """``plane`` went down or came back: its old delay says nothing about it now."""
        self.delay[plane] = None
        self.weights[plane] = 1.0
        self._over[plane] = 0

    def shares(self) -> list[float] | None:
        """The weights for a new round (remembered as ``applied``), or None if all are equal."""
        self.applied = list(self.weights)
        if all(w == 1.0 for w in self.weights):
            return None
        return self.applied
