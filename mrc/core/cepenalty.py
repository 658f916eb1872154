"""Congestion signals on a QP's paths, and the CE penalties that steer spraying away from them.

A part of :class:`mrc.core.evset.EVSet` kept on its own: the EV set tells it which path (plane,
route) a mark or trim came from and whether the EV is in the rotation, and applies what it
answers (an EV penalized, penalties lifted) to its rotation. It remembers two things:

* when each EV, route and plane last showed congestion (a CE mark echoed in an ACK, a trim, a
  last-hop trim), so that a loss on such a path is taken for congestion, not failure
  (:meth:`congested`);
* the penalties: an EV whose packet came back CE-marked sits out of the rotation for a while
  (:meth:`penalize`), at most ``ecn_penalty_max_fraction`` of a plane's active EVs at once.

docs/EV_HEALTH.md, "CE penalties", has the rules and why.
"""

from __future__ import annotations

_INF = float("inf")
_NEG_INF = float("-inf")


class CEPenalties:
    def __init__(self, planes: list[int], target: list[int], max_fraction: float) -> None:
        """``planes[ev]``: the plane of EV ``ev`` (the EV set's list, read only);
        ``target[p]``: the active EVs plane ``p`` should have, at most ``max_fraction`` of
        which are penalized at once."""
        nplanes = len(target)
        self._planes = planes
        self.until: dict[int, float] = {}  # penalized EV -> end of its penalty
        # the earliest end of a penalty (maybe early, never late), for a cheap "anything to
        # lift?" test per ACK and per send
        self.next_end = _INF
        self._count = [0] * nplanes  # penalized EVs per plane
        self.limit = [int(t * max_fraction) for t in target]
        # per plane, the end of a congestion common to its paths: no penalties there until then
        self.plane_until = [_NEG_INF] * nplanes
        self._ev_at = [_NEG_INF] * len(planes)  # latest CE mark or trim per EV
        self._route_at: dict[tuple[int, int], float] = {}  # ... per (plane, route)
        self._lasthop_at = [_NEG_INF] * nplanes  # latest TRIMMED_LASTHOP NACK per plane
        self.penalties = 0  # CE marks that took an EV out of the rotation
        self.plane_congested = 0  # times a plane's marks were found common to its paths

    def note(self, ev: int, route: int, now: float) -> None:
        """A CE mark or a trim of a packet sent on ``ev`` (its route: ``route``)."""
        self._ev_at[ev] = now
        self._route_at[(self._planes[ev], route)] = now

    def note_lasthop(self, plane: int, now: float) -> None:
        """A TRIMMED_LASTHOP NACK of a packet sent on ``plane``: its last hop is congested."""
        if now > self._lasthop_at[plane]:
            self._lasthop_at[plane] = now

    def penalize(self, ev: int, now: float, duration: float, in_rotation: bool) -> list[int]:
        """A CE mark of a packet on ``ev``: penalize it until ``duration`` from now, or restart
        its penalty; if that would take more than ``limit`` of its plane's EVs out, the plane is
        congested as a whole: extend that instead, and lift every penalty of the plane.

        Returns the EVs whose penalties were lifted (the caller puts them back in the rotation);
        ``ev`` is penalized afterwards if and only if it is in ``until``."""
        plane = self._planes[ev]
        until = now + duration
        if self.plane_until[plane] >= now:
            self.plane_until[plane] = until
            return []
        pen = self.until
        if ev in pen:
            pen[ev] = until
            return []
        if not in_rotation:
            return []  # not in the rotation anyway (backup, assumed bad, plane down)
        if self._count[plane] >= self.limit[plane]:
            self.plane_congested += 1
            self.plane_until[plane] = until
            lifted = [e for e in pen if self._planes[e] == plane]
            for other in lifted:
                del pen[other]
            self._count[plane] = 0
            return lifted
        pen[ev] = until
        self._count[plane] += 1
        self.penalties += 1
        if until < self.next_end:
            self.next_end = until
        return []

    def lift(self, now: float) -> list[int]:
        """End the penalties due by ``now``; returns the EVs lifted."""
        pen = self.until
        lifted: list[int] = []
        nxt = _INF
        for ev, until in list(pen.items()):
            if until <= now:
                del pen[ev]
                self._count[self._planes[ev]] -= 1
                lifted.append(ev)
            elif until < nxt:
                nxt = until
        self.next_end = nxt
        return lifted

    def congested(self, ev: int, route: int, plane_routes: list[int] | None, since: float) -> bool:
        """Whether ``ev``'s path showed congestion at or after ``since``: a CE mark or a trim on
        the EV, its plane in common congestion, a last-hop trim on its plane, or, when the
        plane's routes are known (``plane_routes``), a mark or trim on another EV of its route
        or on two routes of its plane or more (a queue they share: the last hop or the NIC)."""
        plane = self._planes[ev]
        if (
            self._ev_at[ev] >= since
            or self.plane_until[plane] >= since
            or self._lasthop_at[plane] >= since
        ):
            return True
        if plane_routes is None:
            return False
        route_at = self._route_at
        if route_at.get((plane, route), _NEG_INF) >= since:
            return True
        marked = 0
        for other in plane_routes:
            if route_at.get((plane, other), _NEG_INF) >= since:
                marked += 1
                if marked > 1:
                    return True
        return False
