"""A QP's entropy values (EVs): the order it sprays packets over them, and their health.

An EV is an index into the QP's list of paths; the transport maps each index to a UDP source
port, a local address (its plane) and a route. The core only needs the wire value (the source
port, echoed back in ACKs) and the plane of each EV.

Spraying walks a fresh pseudo-random permutation of the usable EVs each round, so every EV
carries the same number of packets to within one per round while consecutive packets take
unrelated paths. With several planes the round is interleaved: one EV of every live plane per
row, planes in a fresh random order per row, so consecutive packets go to different planes and
every plane gets the same share even when it has fewer usable EVs than the others (its EVs
then carry more each). Per-plane queues stay level, which keeps the reordering that SACK-based
loss detection must tolerate small. With ``route_weighted_planes``, where routes are known and
a plane has lost some of them (no usable EV left on a route), each plane's share follows the
fraction of its routes still alive instead, so its remaining spines are not loaded beyond the
others'.

Health, after the OCP MRC states (every transition is reported through ``on_change`` as an
``EVStateChanged`` event, and every transition is a row of ``_TRANSITIONS``):

* GOOD: in use. The first ``active`` EVs are in the rotation; the rest wait in a backup pool.
* SKIP: a TRIMMED NACK came back for a packet on this EV (congestion on its path): left out of
  the next rotation round, then GOOD again. TRIMMED_LASTHOP (incast at the receiver) is not the
  path's fault and changes nothing.
* ASSUMED_BAD: a packet on it was lost without a trim (a timeout, SACK evidence that later
  packets arrived, a duplicate proving an ACK was lost, or a send error). Loss means failure:
  the EV leaves the rotation at once and a backup EV *of the same plane* takes its place, so
  planes stay equally loaded. It is probed every ``probe_interval``; ``resurrect_after``
  consecutive answered probes make it GOOD again (active if its plane is short, else backup).
  A floor of ``min_active_per_plane`` usable EVs per plane is kept: a loss on an EV at the
  floor, with no backup to replace it, does not retire it (a noisy episode cannot retire
  everything).
* DENIED: set by the operator; never used, never probed.

A plane goes down when ``plane_dead_losses`` losses in a row hit it with no delivery in
between (a NIC that is down shows as send errors, which count as losses): all its EVs become
ASSUMED_BAD and are probed; the first answered probe brings the plane back. "In between" is in
send order: the loss of a packet sent no later than one the plane is known to have delivered
(acknowledged data, or an answered probe) does not count, so losses found together (one SACK,
late timeouts of packets sent during an outage that has ended) cannot take down a plane that
demonstrably works. EVSet keeps this bookkeeping (``delivered``, ``lost``); the requester only
reports what was acknowledged. The planes a peer reports down in the port-state bitmap of its
SACKs are avoided too, for data and ACKs alike.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable

from mrc import wire
from mrc.core.cepenalty import CEPenalties
from mrc.core.config import EVConfig
from mrc.core.counters import BOTH, CounterSpec, Source
from mrc.core.delaysigns import ANSWERED_LOSSES, HELD_WINDOWS, LATE_LOSSES, DelaySigns
from mrc.core.events import EVReason, EVState, EVStateChanged
from mrc.core.evprobes import EVProbes
from mrc.core.planesteer import PlaneSteering
from mrc.errors import MRCError

__all__ = ["EV_COUNTERS", "EVReason", "EVSet", "EVState", "EVTransitionError"]

_INF = float("inf")
_NEG_INF = float("-inf")

_GOOD = EVState.GOOD
_SKIP = EVState.SKIP
_BAD = EVState.ASSUMED_BAD
_DENIED = EVState.DENIED
_R = EVReason

# Every state change an EV can make: (state, what happened) -> next state. The numbers are the
# rows of the table in docs/EV_HEALTH.md. Which EVs an event applies to at all (only active
# ones are trimmed or retired, the floor, the backup chosen) is decided by the methods below;
# this table only says where each one leads, and ``_transition`` refuses anything not in it.
_TRANSITIONS: dict[tuple[EVState, EVReason], EVState] = {
    (_GOOD, _R.TRIMMED): _SKIP,  # 1
    (_SKIP, _R.SKIP_OVER): _GOOD,  # 2
    (_GOOD, _R.TIMEOUT): _BAD,  # 3
    (_SKIP, _R.TIMEOUT): _BAD,
    (_GOOD, _R.SACK_LOSS): _BAD,
    (_SKIP, _R.SACK_LOSS): _BAD,
    (_GOOD, _R.PROBE_LOSS): _BAD,
    (_SKIP, _R.PROBE_LOSS): _BAD,
    (_GOOD, _R.SEND_ERROR): _BAD,
    (_SKIP, _R.SEND_ERROR): _BAD,
    (_GOOD, _R.ACK_LOST): _BAD,
    (_SKIP, _R.ACK_LOST): _BAD,
    (_GOOD, _R.REVERSE_PROBE): _BAD,
    (_SKIP, _R.REVERSE_PROBE): _BAD,
    (_GOOD, _R.REPLACES): _GOOD,  # 4: a backup joins the rotation
    (_GOOD, _R.ROUTE_DOWN): _BAD,  # 5': every EV of a route that lost EVs (active or backup)
    (_SKIP, _R.ROUTE_DOWN): _BAD,
    (_GOOD, _R.PLANE_DOWN): _BAD,  # 5: active or backup
    (_SKIP, _R.PLANE_DOWN): _BAD,
    (_GOOD, _R.LINK_DOWN): _BAD,  # 5'': the plane's NIC lost its link (the transport saw it)
    (_SKIP, _R.LINK_DOWN): _BAD,
    (_BAD, _R.RESURRECTED): _GOOD,  # 6: active again, or back to the pool
    (_GOOD, _R.DENIED): _DENIED,  # 7
    (_SKIP, _R.DENIED): _DENIED,
    (_BAD, _R.DENIED): _DENIED,
    (_DENIED, _R.DENIED): _DENIED,  # denying twice changes nothing
    (_DENIED, _R.ALLOWED): _BAD,  # 8: probed, and back through #6 once it answers
}

ChangeCallback = Callable[[EVStateChanged], None]

# The counters of an EVSet (``counters()``, ``Connection.ev_counters()``, and every output of
# ``mrc.counter_registry``): the attribute each is kept in, and what it counts.
EV_COUNTERS = (
    CounterSpec(
        "evs_assumed_bad",
        Source.EVS,
        "EVs moved to ASSUMED_BAD",
        metric="mrc_qp_ev_assumed_bad",
        attr="assumed_bad",
        json=BOTH,
    ),
    CounterSpec(
        "evs_resurrected",
        Source.EVS,
        "EVs back to GOOD after answered probes",
        metric="mrc_qp_ev_resurrected",
        attr="resurrected",
        json=BOTH,
    ),
    CounterSpec(
        "evs_skipped",
        Source.EVS,
        "EVs skipped for a round after a trim",
        metric="mrc_qp_ev_skipped",
        attr="skips",
        json=BOTH,
    ),
    CounterSpec(
        "planes_lost", Source.EVS, "Planes declared down", metric="mrc_qp_planes_lost", json=BOTH
    ),
    CounterSpec(
        "floor_holds",
        Source.EVS,
        "Losses not acted on because their plane was at its floor of active EVs",
        json=BOTH,
    ),
    CounterSpec(
        "evs_assumed_bad_false",
        Source.EVS,
        "EV retirements later proved false (the route carried traffic, or the first probe was "
        "answered)",
        metric="mrc_qp_ev_assumed_bad_false",
        attr="assumed_bad_false",
        json=BOTH,
    ),
    CounterSpec(
        "evs_penalized",
        Source.EVS,
        "CE penalties: EVs left out of the spraying for a while after a CE mark",
        metric="mrc_qp_ev_penalized",
        attr="ce.penalties",
        json=BOTH,
    ),
    CounterSpec(
        "ev_losses_congested",
        Source.EVS,
        "Losses not held against their EV: its path showed congestion (CE)",
        metric="mrc_qp_ev_losses_congested",
        attr="losses_congested",
        json=BOTH,
    ),
    CounterSpec(
        "ev_routes_asked",
        Source.EVS,
        "Probes of GOOD EVs sent to ask whether their route works: a loss with no congestion "
        "seen is congestion if the route answers",
        metric="mrc_qp_ev_routes_asked",
        attr="routes_asked",
        json=BOTH,
    ),
    CounterSpec(
        "ev_losses_delayed",
        Source.EVS,
        "Losses not held against their EV: the first of an episode on a path whose queueing "
        "delay had risen, or a lost ACK the first on its path",
        metric="mrc_qp_ev_losses_delayed",
        attr="losses_delayed",
        json=BOTH,
    ),
)


#: a loss held for judgement (``EVSet.lost``): its arguments, and when it is judged at last
_Held = tuple[int, EVReason, bool, float, str, float, float, float]


def _nothing(event: EVStateChanged) -> None:
    return None


class EVTransitionError(MRCError, RuntimeError):
    """A state change ``_TRANSITIONS`` does not allow: a bug in the core, not a network event.

    Part of the one hierarchy like everything mrc raises, and a RuntimeError: nothing should
    catch it on purpose."""


class EVSet:
    def __init__(
        self,
        values: list[int],
        planes: list[int] | None = None,
        seed: int = 0,
        active: int | None = None,
        config: EVConfig | None = None,
        plane_steering: PlaneSteering | None = None,
        on_change: ChangeCallback | None = None,
        routes: list[int] | None = None,
        qpn: int = 0,
    ) -> None:
        """``values[i]``/``planes[i]``/``routes[i]``: wire value (32 bits, mrc.wire.ev_value),
        plane and route id of EV i.
        The first ``active`` EVs (all, by default) are in the rotation, the rest wait in the
        backup pool. ``config``: the EV knobs (a QP's own ``QPConfig`` is one; the defaults if
        None). ``plane_steering``: planes' shares follow their delays (None: equal shares).
        ``on_change`` receives an ``EVStateChanged`` (naming QP ``qpn``) per transition."""
        self.config = cfg = config if config is not None else EVConfig()
        self.qpn = qpn
        self.on_change: ChangeCallback = on_change or _nothing
        self.steering = plane_steering  # mrc.core.planesteer
        self._lay_out(values, planes, routes)
        self._start_rotation(active, cfg.min_active_per_plane, seed)
        self._start_plane_liveness()
        self.probes = EVProbes(cfg.probe_interval, cfg.probe_timeout)
        self.ce = CEPenalties(self.planes, self.target, cfg.ecn_penalty_max_fraction)
        self.pen_next = self.ce.next_end  # read per ACK and per send (``lift_penalties``)
        self.delay = DelaySigns(self.nplanes, cfg.delay_evidence_min, cfg.delay_evidence_fraction)
        # losses held for judgement (``lost``): (due, order, arguments of ``lost``)
        self._held: list[tuple[float, int, _Held]]
        self._held = []
        self.held_next = _INF  # the earliest due (read per ACK: ``judge_held``)
        self._held_order = itertools.count()
        # EVs whose routes a held loss asks about: the QP probes each (``_ask``)
        self.asks: list[int] = []
        self._start_judging()
        self._start_counters()
        self._rebuild()

    def _lay_out(
        self, values: list[int], planes: list[int] | None, routes: list[int] | None
    ) -> None:
        """The paths: each EV's wire value, plane and route."""
        if not values:
            raise ValueError("an EV set needs at least one entropy value")
        if len(set(values)) != len(values):
            raise ValueError("entropy values must be distinct")
        n = len(values)
        self.values = list(values)
        self.planes = list(planes) if planes is not None else [0] * n
        if len(self.planes) != n:
            raise ValueError("need one plane per entropy value")
        self.nplanes = max(self.planes) + 1
        if min(self.planes) < 0 or self.nplanes > wire.MAX_PLANES:
            raise ValueError(
                f"planes are numbered 0 .. {wire.MAX_PLANES - 1} (an ACK's port-state bitmap "
                f"has {wire.MAX_PLANES} bits), not {min(self.planes)} .. {self.nplanes - 1}"
            )
        self.routes: list[int] = []
        self._route_known: list[bool] = []
        self._plane_routes: list[list[int]] = []
        self.set_routes(routes if routes is not None else [0] * n)
        self.index_of_value = {p: i for i, p in enumerate(self.values)}
        self.packets = [0] * n  # data packets sent on each EV (``count_sent``)

    def _start_rotation(self, active: int | None, min_active_per_plane: int, seed: int) -> None:
        """Every EV GOOD, the first ``active`` in the rotation; each plane's target (the active
        EVs it should have) and floor (the fewest it keeps, see ``lost``); the spraying order."""
        n = len(self.values)
        n_active = n if active is None else max(1, min(active, n))
        self.state = [EVState.GOOD] * n
        self.active = [i < n_active for i in range(n)]
        self.target = [0] * self.nplanes
        for i in range(n_active):
            self.target[self.planes[i]] += 1
        self.floor = [
            min(t, min_active_per_plane) if min_active_per_plane else max(1, t // 4)
            for t in self.target
        ]
        self.usable = list(self.active)  # in the rotation now (``_refresh``)
        self._rng = random.Random(seed)
        self._order: list[int] = []  # the round being sprayed
        self._pos = 0
        self._reply_pos = 0  # next_reply's own cursor in _order
        self._skipped: list[int] = []  # trimmed this round
        self._skipped_prev: list[int] = []  # trimmed last round: sit out this one too
        self._now = 0.0  # time of the latest evidence, for transitions found while spraying

    def _start_plane_liveness(self) -> None:
        self.plane_down = [False] * self.nplanes  # our verdict (``set_plane_down``)
        self.peer_plane_down = [False] * self.nplanes  # the peer's port-state bitmap
        self.loss_streak = [0] * self.nplanes
        # send time of the latest packet known delivered, per plane: a loss of a packet sent
        # no later than that is no evidence against the plane (it worked after that send)
        self.plane_alive_sent = [_NEG_INF] * self.nplanes
        # the same from probes of GOOD EVs answered (``route_answered``), for the streak only:
        # loss detection reads ``plane_alive_sent`` as the plane's FIFO order, which a probe
        # need not keep (a switch may serve small control packets first)
        self.plane_answered_sent = [_NEG_INF] * self.nplanes

    def _start_judging(self) -> None:
        # retirements still being judged (``evs_assumed_bad_false``): ev -> (plane, route,
        # send time of the lost packet or None, time of the retirement)
        self.judging: dict[int, tuple[int, int, float | None, float]] = {}
        # route fate's evidence: per retired EV the send time of the packet whose loss retired
        # it (inf: none known); per (plane, route) the send time of the latest packet it is
        # known to have delivered is ``route_alive_sent`` (``set_routes``)
        self._lost_sent: dict[int, float] = {}

    def _start_counters(self) -> None:
        self.assumed_bad = 0
        self.resurrected = 0
        self.skips = 0
        self.planes_lost = 0
        self.floor_holds = 0
        self.losses_congested = 0  # losses not held against an EV: its path was marked
        self.losses_route_alive = 0  # losses not held against an EV: its route delivered since
        self.losses_delayed = 0  # losses not held against an EV: its path's delay had risen
        self.assumed_bad_false = 0  # retirements later proved false
        self.routes_asked = 0  # probes asked for by held losses (``_ask``)

    def __len__(self) -> int:
        return len(self.values)

    # ---- spraying ----------------------------------------------------------------------

    def _rebuild(self) -> None:
        # a trimmed EV sits out the rest of its round and the whole next one
        for ev in self._skipped_prev:
            if self.state[ev] == EVState.SKIP:
                self._transition(ev, EVReason.SKIP_OVER, self._now)
        self._skipped_prev = self._skipped
        self._skipped = []
        order = [i for i, ok in enumerate(self.usable) if ok]
        rng = self._rng
        if not order:
            # nothing known to work: keep trying everything the operator allows, so data
            # still flows if the evidence was wrong and the retry budget still runs out if not
            order = [i for i, s in enumerate(self.state) if s != EVState.DENIED]
            rng.shuffle(order)
        elif self.nplanes == 1:
            rng.shuffle(order)
        else:
            order = self._interleave(order)
        self._order = order
        self._pos = 0

    def _interleave(self, usable: list[int]) -> list[int]:
        """One round over several planes: every plane with a usable EV gets the same number
        of slots, and consecutive packets go to different planes.

        Each plane's usable EVs are shuffled; a plane with fewer of them (its backups ran out,
        or it sits at the floor) repeats some, so its NIC still gets an equal share. The round
        is laid out row by row, one EV of every plane per row in a shuffled plane order: the
        planes' queues stay level packet by packet, so sprayed packets arrive nearly in order
        and the reordering window of loss detection can stay tight.
        """
        rng = self._rng
        planes = self.planes
        by_plane: dict[int, list[int]] = {}
        for ev in usable:
            by_plane.setdefault(planes[ev], []).append(ev)
        share = self._plane_shares(by_plane) if self.config.route_weighted_planes else None
        steer = self.steering.shares() if self.steering is not None else None
        if steer is not None:
            base = share or {}
            share = {p: base.get(p, 1.0) * steer[p] for p in by_plane}
        if share is not None:
            return self._interleave_weighted(by_plane, share)
        lists = list(by_plane.values())
        width = max(len(evs) for evs in lists)
        for evs in lists:
            rng.shuffle(evs)
            k = len(evs)
            evs.extend(evs[j % k] for j in range(width - k))
        order: list[int] = []
        for row in range(width):
            rng.shuffle(lists)
            order.extend(evs[row] for evs in lists)
        return order

    def _plane_shares(self, by_plane: dict[int, list[int]]) -> dict[int, float] | None:
        """Per plane, the fraction of its routes that still have a usable EV, where routes
        are known and some plane lost one (None: every plane whole, equal shares).

        A plane that lost one of its two spines has half its paths between the leaves: an
        equal share would send it as much as the others over half the links, and its one
        remaining spine would set the pace of the whole QP (the link_down all-to-all)."""
        share: dict[int, float] = {}
        whole = True
        for plane, evs in by_plane.items():
            if not self._route_known[plane]:
                share[plane] = 1.0
                continue
            live = {self.routes[ev] for ev in evs}
            total = len(self._plane_routes[plane])
            share[plane] = len(live) / total
            whole = whole and len(live) == total
        return None if whole else share

    def _interleave_weighted(
        self, by_plane: dict[int, list[int]], share: dict[int, float]
    ) -> list[int]:
        """As _interleave, but plane p takes a slot in only ``share[p]`` of the rows (relative
        to the best plane, which takes every row), spread evenly from a random phase."""
        rng = self._rng
        top = max(share.values())
        weight = {p: w / top for p, w in share.items()}
        rows = max(-(-len(evs) // weight[p]) for p, evs in by_plane.items())
        slots: dict[int, list[bool]] = {}
        for p, evs in by_plane.items():
            w, phase = weight[p], rng.random()
            slots[p] = [int((r + 1) * w + phase) > int(r * w + phase) for r in range(int(rows))]
            rng.shuffle(evs)
        order: list[int] = []
        taken = dict.fromkeys(by_plane, 0)
        plist = list(by_plane)
        for r in range(int(rows)):
            rng.shuffle(plist)
            for p in plist:
                if slots[p][r]:
                    evs = by_plane[p]
                    order.append(evs[taken[p] % len(evs)])
                    taken[p] += 1
        return order

    def plane_rtt(self, plane: int, rtt: float, now: float) -> None:
        """An RTT sample of a packet sent on ``plane``: with plane steering on, it may move
        the planes' shares, and a move large enough starts a new round laid out with them."""
        steering = self.steering
        if steering is not None and steering.sample(plane, rtt, now):
            self._pos = len(self._order)  # next() lays out a new round

    def next(self) -> int:
        """The EV for the next packet."""
        usable = self.usable
        while True:
            pos = self._pos
            if pos >= len(self._order):
                self._rebuild()
                pos = 0
                if not any(usable):
                    ev = self._order[0] if self._order else 0
                    self._pos = 1
                    return ev
            ev = self._order[pos]
            self._pos = pos + 1
            if usable[ev]:
                return ev

    def next_reply(self) -> int:
        """The EV for a probe reply: the rotation's order, on a cursor of its own. The
        peer's probes arrive when it chooses (reverse probes every few ms while we send):
        taken from :meth:`next`, each reply would shift which EV, and so which plane, every
        later burst of our data lands on."""
        order = self._order
        usable = self.usable
        for _ in range(len(order)):
            pos = self._reply_pos + 1
            if pos >= len(order):
                pos = 0
            self._reply_pos = pos
            ev = order[pos]
            if usable[ev]:
                return ev
        return self.next()

    def next_beside(self, ev: int) -> int:
        """The next EV of ``ev``'s plane that is not ``ev`` and, where routes are known, not
        on its route (either rule dropped if no such EV is in the rotation): for a tail loss
        probe, which must share the NIC queue of the transmission it probes and should not
        follow it onto a route that may have died."""
        plane = self.planes[ev]
        route = self.routes[ev]
        known = self._route_known[plane]
        planes, routes = self.planes, self.routes
        fallback = -1
        for _ in range(len(self.values) + 1):
            cand = self.next()
            if cand == ev or planes[cand] != plane:
                continue
            if not known or routes[cand] != route:
                return cand
            if fallback < 0:
                fallback = cand
        return fallback if fallback >= 0 else self.next_other(ev)

    def next_apart(self, ev: int) -> int:
        """The next EV that shares as little of ``ev``'s path as the rotation allows: on
        another plane, else on another route of its plane, else any other EV. For a second
        copy of something whose first copy may take a path that just died."""
        planes, routes = self.planes, self.routes
        same_plane = -1
        for _ in range(len(self.values) + 1):
            cand = self.next()
            if cand == ev:
                continue
            if planes[cand] != planes[ev]:
                return cand
            if same_plane < 0 and routes[cand] != routes[ev]:
                same_plane = cand
        return same_plane if same_plane >= 0 else self.next_other(ev)

    def next_other(self, avoid: int) -> int:
        """The next EV that is not ``avoid`` (used for retransmissions)."""
        ev = self.next()
        tries = len(self.values) + 1
        # ``while``, not ``if``: the second draw can start a fresh permutation whose first
        # entry is ``avoid`` again.
        while ev == avoid and tries:
            ev = self.next()
            tries -= 1
        if ev == avoid:
            # ``avoid`` is the only usable EV: take another that is merely resting (backup or
            # SKIP) before one assumed bad, and never a denied one
            rank = {EVState.GOOD: 0, EVState.SKIP: 1, EVState.ASSUMED_BAD: 2}
            others = [i for i, st in enumerate(self.state) if i != avoid and st != EVState.DENIED]
            if others:
                ev = min(others, key=lambda i: (rank[self.state[i]], i))
        return ev

    def set_routes(self, routes: list[int]) -> None:
        """``routes[i]``: an id of EV i's path (e.g. the spine its SRv6 route turns at), for
        whoever knows it (the transport; a simulator that hashes EVs onto spines). A plane
        whose EVs all have one id has its paths unknown: evidence is then never pooled by
        route there (see ``lost`` and ``route_delivered``)."""
        if len(routes) != len(self.values):
            raise ValueError("need one route id per entropy value")
        self.routes = list(routes)
        ids: list[set[int]] = [set() for _ in range(self.nplanes)]
        for ev, route in enumerate(self.routes):
            ids[self.planes[ev]].add(route)
        self._route_known = [len(r) > 1 for r in ids]
        self._plane_routes = [sorted(r) for r in ids]
        # per EV the index of its (plane, route), and per index the send time of the latest
        # packet that route is known to have delivered (the requester keeps it up to date
        # from acknowledgements; answered probes count too)
        # (a plane whose routes are not known has each EV for a path of its own: the key of
        # its loss episodes, mrc.core.delaysigns, and never pooled as a route)
        index: dict[tuple[int, int], int] = {}
        self.route_ix = [
            index.setdefault(
                (self.planes[ev], route if self._route_known[self.planes[ev]] else -1 - ev),
                len(index),
            )
            for ev, route in enumerate(self.routes)
        ]
        self.route_alive_sent = [_NEG_INF] * len(index)
        # per route index: the send time of the latest probe of it answered, and when it was
        # last asked (``_ask``)
        self.route_answered_sent = [_NEG_INF] * len(index)
        self._asked = [_NEG_INF] * len(index)

    # ---- CE penalties ------------------------------------------------------------------

    def marked(self, ev: int, now: float, duration: float, steer: bool = True) -> None:
        """An ACK echoed a CE mark (BECN) of a packet sent on ``ev``: its path is congested.

        The EV sits out of the rotation until ``duration`` after its latest mark (a penalty,
        not a retirement: no state change, no event, no probe), so new packets go to unmarked
        paths; the mark reaches the congestion window as always. A mark on a penalized EV
        restarts its penalty. If penalizing it would take more than the ``ce.limit`` of its
        plane's EVs out, the congestion is common to the plane's paths (its last hop or NIC:
        steering cannot avoid it): every penalty of the plane is lifted and none is given
        there until ``duration`` after the plane's latest mark (``CEPenalties.penalize``).
        Losses on a marked path, or on a plane so congested, are not held against their EV
        (``lost``). ``steer`` False: the mark is only remembered for that, no penalty.
        """
        ce = self.ce
        ce.note(ev, self.routes[ev], now)
        if not steer:
            return
        for lifted in ce.penalize(ev, now, duration, self.usable[ev]):
            self._refresh(lifted)
        if ev in ce.until:
            self.usable[ev] = False
        self.pen_next = ce.next_end

    def lift_penalties(self, now: float) -> None:
        """End the penalties due by ``now``. Callers test ``now >= pen_next`` first: that
        float comparison is all a packet or an ACK pays while no penalty is due."""
        for ev in self.ce.lift(now):
            self._refresh(ev)
        self.pen_next = self.ce.next_end

    def penalized(self, ev: int) -> bool:
        return ev in self.ce.until

    def congested(self, ev: int, since: float) -> bool:
        """Whether ``ev``'s path showed congestion at or after ``since``: a CE mark or a
        trim on the EV, its plane in common congestion (``marked``), a last-hop trim on its
        plane (``lasthop_trimmed``), or, when the plane's routes are known, a mark or trim on
        another EV of its route or on two routes of its plane or more (a queue they share:
        the last hop or the NIC)."""
        plane = self.planes[ev]
        known = self._plane_routes[plane] if self._route_known[plane] else None
        return self.ce.congested(ev, self.routes[ev], known, since)

    # ---- false retirements -------------------------------------------------------------

    def route_delivered(self, ev: int, sent_at: float) -> None:
        """A packet sent on ``ev`` at ``sent_at`` was acknowledged, while ``judging`` is not
        empty (the requester tests that; nothing is paid otherwise).

        A retirement is false if another EV on the retired EV's route delivered a packet
        sent after the lost one and no later than the retirement: the route carried traffic
        then, so the loss was not its failure."""
        plane = self.planes[ev]
        if not self._route_known[plane]:
            return
        route = self.routes[ev]
        for bad, (p, r, lost_sent, at) in list(self.judging.items()):
            if (
                p == plane
                and r == route
                and bad != ev
                and lost_sent is not None
                and lost_sent < sent_at <= at
            ):
                del self.judging[bad]
                self.assumed_bad_false += 1

    # ---- evidence ----------------------------------------------------------------------

    def count_sent(self, ev: int) -> None:
        """A data packet (new or resent) goes out on ``ev``: counted in ``packets``."""
        self.packets[ev] += 1

    def delivered(self, sent_at_by_plane: list[float]) -> None:
        """Packets were acknowledged: ``sent_at_by_plane[p]`` is the send time of the
        latest-sent of them on plane ``p`` (-inf if none was on it).

        Each plane with a delivery is alive: its loss streak starts again, and losses of its
        packets sent no later than that one are no evidence against it (see ``lost``). One
        call per ACK, not per packet: the ACK path builds the list as it pops packets.
        """
        streak = self.loss_streak
        alive = self.plane_alive_sent
        for plane, sent_at in enumerate(sent_at_by_plane):
            if sent_at != _NEG_INF:  # (_plane_delivered, inlined: once per ACK)
                streak[plane] = 0
                if sent_at > alive[plane]:
                    alive[plane] = sent_at

    def lost(
        self,
        ev: int,
        now: float,
        reason: EVReason,
        plane_evidence: bool = True,
        sent_at: float | None = None,
        detail: str = "",
        congestion_since: float | None = None,
        episode: float = 0.0,
        hold: bool = True,
        until: float = 0.0,
    ) -> None:
        """A packet sent on ``ev`` (at ``sent_at``) was lost without a trim: loss means failure,
        unless its path was congested: with ``congestion_since`` given, a path that showed
        congestion since then (``congested``) lost it to a queue, not a failure, and neither
        the EV nor its plane is blamed (``losses_congested``; the packet is resent elsewhere
        all the same).

        Without marks, delay is the evidence (``episode`` and ``delay``, mrc.core.delaysigns):
        a loss on a plane whose queueing delay rose since ``congestion_since``, or where
        another route of the plane lost a packet sent since then (a queue they share), is
        congestion if it begins an episode on its path, falls within ``episode`` seconds of
        the one that did, or is one of the few sends lost after it (more while the plane's
        other routes lose too) (``losses_delayed``); a path that keeps losing after that,
        delivering nothing, has failed. A loss with no such evidence yet is held ``episode``
        seconds, and again while its route has neither delivered nor lost a packet sent after
        it, up to ``until`` (``judge_held``; ``hold`` False: a held loss judged now). Either
        way the plane's loss streak takes the loss at once. A held loss, one beyond its
        episode's span and half a dead plane's streak ask the route whether it works
        (``_ask``): an answer to a probe sent after the packet is congestion evidence as well
        (more lost sends allowed while it answers), and a delivery for the plane's streak.

        ``reason`` is one of the loss reasons of ``_TRANSITIONS`` (``detail`` completes its
        phrase, e.g. the OS error of a send error). ``plane_evidence``: whether the loss also
        counts towards declaring the plane dead. A side that only sends ACKs never hears of
        deliveries, so its streaks could not reset. A loss of a packet sent before (or with)
        one the plane is known to have delivered is no evidence against the plane either:
        losses declared together (one SACK, or timeouts found late) would otherwise add up to
        a "dead" plane that is demonstrably alive.
        """
        if congestion_since is not None and self.congested(ev, congestion_since):
            self.losses_congested += 1
            return
        plane = self.planes[ev]
        known = self._route_known[plane]
        if hold and sent_at is not None and known and self.delay.enabled:
            # every loss of a route, for its siblings' comparison (mrc.core.delaysigns)
            self.delay.note_lost(self.route_ix[ev], plane, sent_at)
        if sent_at is not None and known and self.route_alive_sent[self.route_ix[ev]] > sent_at:
            # its route delivered a packet sent after this one: the route works, and an EV
            # is nothing but its route (SRv6 pins the path), so this packet was delayed past
            # the reordering window (a deep queue) or dropped by congestion, not by a failure
            self.losses_route_alive += 1
            return
        # the plane's streak takes every loss its path's delay may yet excuse, as before
        # there was delay evidence: losses of a live plane are interleaved with deliveries
        # that reset it, and a whole plane that dies is found as fast as ever
        if (
            plane_evidence
            and sent_at is not None
            and sent_at <= max(self.plane_alive_sent[plane], self.plane_answered_sent[plane])
        ):
            plane_evidence = False
        if plane_evidence:
            self.loss_streak[plane] += 1
        streak = self.loss_streak[plane]
        if streak >= self.config.plane_dead_losses and not self.plane_down[plane]:
            self.set_plane_down(plane, now, EVReason.PLANE_DOWN, str(streak))
            return
        if plane_evidence and episode > 0 and 2 * streak >= self.config.plane_dead_losses:
            # half a dead plane's streak: ask whether the plane works, so that an answer can
            # end a streak of tail drops (a full queue dropping a QP's every send for tens of
            # ms) before it takes a live plane down; a dead plane answers nothing
            self._ask(ev, sent_at or now, now, 2 * episode, plane_wide=True)
        if congestion_since is not None and sent_at is not None and self.delay.enabled:
            ix = self.route_ix[ev]
            siblings = len(self._plane_routes[plane]) - 1 if known else 0
            if (
                self.delay.delayed(plane, congestion_since)
                or (siblings and self.delay.siblings_lost(ix, plane, congestion_since))
                or (known and self.route_answered_sent[ix] > sent_at)
            ):
                alive = self.route_alive_sent[ix]
                # (with ask_routes off no answer is ever recorded: the route's stays -inf)
                answered = self.route_answered_sent[ix]
                excused = self.delay.excuses(
                    ix,
                    sent_at,
                    alive,
                    episode,
                    LATE_LOSSES,
                    plane,
                    siblings,
                    answered,
                    ANSWERED_LOSSES,
                )
                if known and self.delay.late_sends(ix):
                    # a run of lost sends beyond the episode: ask whether the route works, so
                    # the answer is in when its next loss is judged
                    self._ask(ev, sent_at, now, 2 * episode)
                if excused:
                    self.losses_delayed += 1
                    return
            elif hold or (now < until and episode > 0 and self._route_undecided(ev, sent_at)):
                # no congestion seen yet: the EV is judged ``episode`` from now, when the ACKs
                # of what was queued ahead of a tail-dropped packet have had time to show it,
                # and again while its route has neither delivered nor lost a packet sent after
                # it (a single tail drop and a dead route look alike until then), up to
                # ``until``
                if hold:
                    until = now + max(HELD_WINDOWS * episode, sent_at - congestion_since)
                    self._ask(ev, sent_at, now, until - now)
                else:  # asked, unanswered: a small probe can be dropped too; ask once more
                    self._ask(ev, sent_at, now, 2 * episode)
                held: _Held = (
                    ev,
                    reason,
                    False,
                    sent_at,
                    detail,
                    congestion_since,
                    episode,
                    until,
                )
                heapq.heappush(self._held, (now + episode, next(self._held_order), held))
                self.held_next = self._held[0][0]
                return
        if self.state[ev] not in (EVState.GOOD, EVState.SKIP) or not self.active[ev]:
            return
        if (
            self._backup_for(plane, self.routes[ev]) is None
            and self._active_in_plane(plane) <= self.floor[plane]
        ):
            self.floor_holds += 1
            return
        self._retire_and_replace(ev, now, reason, detail, sent_at)
        self._route_fate(plane, self.routes[ev], now)

    def judge_held(self, now: float) -> None:
        """Judge the losses held by ``lost`` that are due by ``now``, on the evidence there is
        now. Callers test ``now >= held_next`` first: all an ACK pays while nothing is due."""
        held = self._held
        while held and held[0][0] <= now:
            _due, _n, (ev, reason, plane_ev, sent_at, detail, since, episode, until) = (
                heapq.heappop(held)
            )
            self.lost(ev, now, reason, plane_ev, sent_at, detail, since, episode, False, until)
        self.held_next = held[0][0] if held else _INF

    def _route_undecided(self, ev: int, sent_at: float) -> bool:
        """Whether ``ev``'s route (where routes are known) has neither delivered nor lost a
        packet sent after ``sent_at``."""
        plane = self.planes[ev]
        if not self._route_known[plane]:
            return False
        ix = self.route_ix[ev]
        return (
            self.route_alive_sent[ix] <= sent_at
            and self.route_answered_sent[ix] <= sent_at
            and not self.delay.lost_after(ix, plane, sent_at)
        )

    def _ask(
        self, ev: int, sent_at: float, now: float, wait: float, plane_wide: bool = False
    ) -> None:
        """Ask ``ev``'s route whether it works: a probe on ``ev`` (the QP sends those of
        ``asks``), unless one left since the packet lost at ``sent_at``, less than ``wait``
        ago. A loss with nothing to tell a full queue from a dead route is otherwise judged by
        the route's next data packet, which a sparse route sends tens of ms later; a probe's
        answer comes back in a round trip, and a small probe fits a tail-drop queue that had no
        room for a full packet (``route_answered``). ``plane_wide``: for the plane's loss
        streak, which needs no known routes (the EV is then its own path)."""
        if not self.config.ask_routes:
            return
        if not plane_wide and not self._route_known[self.planes[ev]]:
            return
        ix = self.route_ix[ev]
        asked = self._asked[ix]
        if asked > sent_at and now - asked < wait:
            return
        self._asked[ix] = now
        self.asks.append(ev)
        self.routes_asked += 1

    def route_answered(self, ev: int, sent: float) -> None:
        """A probe of GOOD ``ev`` sent at ``sent`` was answered: its route carried a packet
        then. Losses of its packets sent before are then congestion as a delay rise makes
        them (within an episode, ``lost``): a route that loses data while it answers probes
        loses more than its episode allows, and is retired all the same."""
        if not self.config.ask_routes:
            return
        ix = self.route_ix[ev]
        if sent > self.route_answered_sent[ix]:
            self.route_answered_sent[ix] = sent
        # its plane carried the probe: its loss streak starts again, as for any delivery, and
        # losses sent before the probe are no evidence that the plane is dead (where the
        # routes' losses are asked about, the retired EVs whose answered health probes did
        # this are few)
        plane = self.planes[ev]
        self.loss_streak[plane] = 0
        if sent > self.plane_answered_sent[plane]:
            self.plane_answered_sent[plane] = sent

    def ack_lost(self, ev: int, now: float, span: float) -> None:
        """An ACK sent on ``ev`` was lost (data arrived twice, docs/EV_HEALTH.md). The first
        such loss on its path (its route where known, else the EV) begins an episode and is
        not held against it: a reverse queue that drops ACKs in a burst of congestion loses
        one now and then, a dead path keeps losing them. A loss ``span`` or more after the
        episode's first, with no probe on the path answered since, retires the EV."""
        ix = self.route_ix[ev]
        if self.delay.enabled and self.delay.excuses(ix, now, self.route_alive_sent[ix], span):
            self.losses_delayed += 1
            return
        self.lost(ev, now, EVReason.ACK_LOST, plane_evidence=False)

    def path_answered(self, ev: int, sent: float) -> None:
        """A probe of ``ev`` sent at ``sent`` was answered (a reverse probe of a GOOD EV): its
        path worked then."""
        ix = self.route_ix[ev]
        if sent > self.route_alive_sent[ix]:
            self.route_alive_sent[ix] = sent

    def _route_fate(self, plane: int, route: int, now: float) -> None:
        """EVs on one route share its fate: once ``route_dead_evs`` of them are assumed bad,
        the route is taken for down and its other EVs leave the rotation too (each probed and
        resurrected on its own, as any other), instead of every one of them having to lose a
        packet first. Only with route labels (``routes``) and another route in the plane with
        GOOD EVs to carry the traffic."""
        dead_evs = self.config.route_dead_evs
        if dead_evs <= 0 or not self._route_known[plane]:
            return
        n = len(self.values)
        same = [e for e in range(n) if self.planes[e] == plane and self.routes[e] == route]
        # a loss counts against the route only if the route has delivered nothing sent after
        # it: two packets delayed past the reordering window on a route that works (a deep
        # queue) must not take the whole route out
        alive = self.route_alive_sent[self.route_ix[same[0]]] if same else _NEG_INF
        lost = self._lost_sent
        bad = sum(1 for e in same if self.state[e] == _BAD and lost.get(e, _INF) > alive)
        if bad < dead_evs:
            return
        # a dead link shows on its route alone; losses spread over every route of the plane
        # (a full queue at the sender's own NIC, say) say nothing against this one
        bad_elsewhere: dict[int, int] = {}
        for e in range(n):
            if self.planes[e] == plane and self.routes[e] != route and self.state[e] == _BAD:
                bad_elsewhere[self.routes[e]] = bad_elsewhere.get(self.routes[e], 0) + 1
        if bad <= 2 * max(bad_elsewhere.values(), default=0):
            return
        others = [
            e
            for e in range(len(self.values))
            if self.planes[e] == plane and self.routes[e] != route and self.state[e] == _GOOD
        ]
        if not others:
            return
        for e in same:
            if self.state[e] in (_GOOD, _SKIP):
                self._retire_and_replace(e, now, EVReason.ROUTE_DOWN, str(bad))

    def trimmed(self, ev: int, now: float) -> None:
        """A TRIMMED NACK: congestion on this EV's path; skip it for a round. A queue deep
        enough to trim also delays what it does not trim, so for ``congested`` the trim counts
        like a CE mark on the path."""
        self._now = now
        self.ce.note(ev, self.routes[ev], now)
        if self.state[ev] == EVState.GOOD and self.active[ev]:
            self.skips += 1
            self._transition(ev, EVReason.TRIMMED, now)
            self._skipped.append(ev)

    def lasthop_trimmed(self, ev: int, now: float) -> None:
        """A TRIMMED_LASTHOP NACK for a packet sent on ``ev``: the last hop of its plane into
        the peer is congested (incast). No EV is to blame, so none is skipped; but every path
        of the plane shares that queue, and a packet waiting in it for longer than the
        reordering window looks lost to SACK evidence from the plane's shallower moments or
        from other planes. Such a loss is congestion (``congested``), not a failure."""
        self.ce.note_lasthop(self.planes[ev], now)

    def deny(self, ev: int, now: float = 0.0) -> None:
        """Operator denylist: never use this EV again."""
        was_active = self.active[ev] and self.state[ev] in (EVState.GOOD, EVState.SKIP)
        self._probe_cleanup(ev)
        self._transition(ev, EVReason.DENIED, now, active=False)
        if was_active:
            self._replace(ev, now)

    def allow(self, ev: int, now: float) -> bool:
        """Undo :meth:`deny`: the EV is probed like one assumed bad and returns to use (the
        rotation or its plane's backups) once ``resurrect_after`` probes are answered, so a
        path that broke while it was denied is not sprayed on blind. Returns False (and
        changes nothing) for an EV that is not denied."""
        if self.state[ev] != EVState.DENIED:
            return False
        self._transition(ev, EVReason.ALLOWED, now, active=False)
        self.probes.start(ev, now)
        return True

    def set_plane_down(
        self, plane: int, now: float, reason: EVReason = EVReason.PLANE_DOWN, detail: str = ""
    ) -> bool:
        """Our own verdict: ``plane`` is dead, after losses in a row (``PLANE_DOWN``, the
        streak in ``detail``) or because its NIC lost its link (``LINK_DOWN``); every EV of
        it (backups included) becomes ASSUMED_BAD and is probed. Returns whether the plane
        was up until now."""
        if self.plane_down[plane]:
            return False
        self.plane_down[plane] = True
        self.planes_lost += 1
        if self.steering is not None:
            self.steering.forget(plane)
        for ev in range(len(self.values)):
            if self.planes[ev] == plane and self.state[ev] in (EVState.GOOD, EVState.SKIP):
                self._retire(ev, now, reason, detail)
        self._refresh_plane(plane)
        return True

    def set_peer_planes(self, port_state: int) -> list[int]:
        """The peer's port-state bitmap (bit p set: its plane p works); returns the planes
        it says went down just now."""
        went_down = []
        for plane in range(self.nplanes):
            down = not (port_state >> plane) & 1
            if down != self.peer_plane_down[plane]:
                self.peer_plane_down[plane] = down
                self._refresh_plane(plane)
                if down:
                    went_down.append(plane)
        return went_down

    def port_state(self) -> int:
        """Our port-state bitmap for SACKs: bit p clear when plane p is down here."""
        bits = 0xFFFF
        for plane, down in enumerate(self.plane_down):
            if down:
                bits &= ~(1 << plane)
        return bits

    # ---- probing -----------------------------------------------------------------------

    def probes_due(self, now: float) -> list[int]:
        """ASSUMED_BAD EVs to probe now (at most one unanswered probe per EV)."""
        if not self.probes.next:
            return []
        due, silent = self.probes.due(now)
        for ev in silent:
            self.judging.pop(ev, None)  # the path failed a probe: not a false retirement
        return due

    def probe_answered(self, ev: int, now: float) -> None:
        sent = self.probes.answered(ev)
        if sent is None or self.state[ev] != EVState.ASSUMED_BAD:
            return
        if self.judging.pop(ev, None) is not None:
            self.assumed_bad_false += 1  # its first probe came back: the path worked
        plane = self.planes[ev]
        ix = self.route_ix[ev]
        if sent > self.route_alive_sent[ix]:
            self.route_alive_sent[ix] = sent  # the route carried the probe
        # the plane carried a packet sent at ``sent``: losses of packets sent before that
        # (e.g. timeouts of retransmissions that went out during the outage) are no evidence
        # that it is dead now
        self._plane_delivered(plane, sent)
        if self.plane_down[plane]:
            self.plane_down[plane] = False
            if self.steering is not None:
                self.steering.forget(plane)
            self._refresh_plane(plane)
        ok = self.probes.count_answer(ev)
        if ok >= self.config.resurrect_after:
            self._probe_cleanup(ev)
            self.resurrected += 1
            active = self._active_in_plane(plane) < self.target[plane]
            self._transition(ev, EVReason.RESURRECTED, now, str(ok), active=active)

    def next_probe_time(self) -> float | None:
        """When probes_due() will next have something to do (a probe or a probe timeout)."""
        return self.probes.next_time()

    def is_probing(self, ev: int) -> bool:
        return self.probes.probing(ev)

    # ---- reporting ---------------------------------------------------------------------

    def is_backup(self, ev: int) -> bool:
        """GOOD but waiting in the backup pool (not in the rotation)."""
        return self.state[ev] == EVState.GOOD and not self.active[ev]

    def describe(self, ev: int) -> str:
        """EV ``ev``'s state as users see it (``GOOD (backup)`` for one in the pool)."""
        return self.state[ev].label(self.is_backup(ev))

    def counters(self) -> dict[str, int]:
        """Every counter of ``EV_COUNTERS``, by name."""
        return {spec.name: spec.read(self) for spec in EV_COUNTERS}

    # ---- internals ---------------------------------------------------------------------

    def _plane_delivered(self, plane: int, sent_at: float) -> None:
        """``plane`` delivered a packet sent at ``sent_at``: it was alive then."""
        self.loss_streak[plane] = 0
        if sent_at > self.plane_alive_sent[plane]:
            self.plane_alive_sent[plane] = sent_at

    def _retire(
        self,
        ev: int,
        now: float,
        reason: EVReason,
        detail: str = "",
        lost_sent: float | None = None,
    ) -> None:
        self.assumed_bad += 1
        # judged until its first probe is answered (false) or times out (not false)
        self.judging[ev] = (self.planes[ev], self.routes[ev], lost_sent, now)
        self._lost_sent[ev] = lost_sent if lost_sent is not None else _INF
        self._transition(ev, reason, now, detail, active=False)
        self.probes.start(ev, now)

    def _retire_and_replace(
        self,
        ev: int,
        now: float,
        reason: EVReason,
        detail: str = "",
        lost_sent: float | None = None,
    ) -> None:
        """Retire ``ev`` and, if it was in the rotation, bring a backup in in its place."""
        was_active = self.active[ev]
        self._retire(ev, now, reason, detail, lost_sent)
        if was_active:
            self._replace(ev, now)

    def _replace(self, ev: int, now: float) -> None:
        """Bring a backup of ``ev``'s plane, off its route, into the rotation for ``ev``
        (none: the plane carries on with one EV fewer)."""
        backup = self._backup_for(self.planes[ev], self.routes[ev])
        if backup is not None:
            self._transition(backup, EVReason.REPLACES, now, str(ev), active=True)

    def _probe_cleanup(self, ev: int) -> None:
        self.judging.pop(ev, None)
        self._lost_sent.pop(ev, None)
        self.probes.stop(ev)

    def _transition(
        self,
        ev: int,
        reason: EVReason,
        now: float,
        detail: str = "",
        active: bool | None = None,
    ) -> None:
        """The one place an EV's state changes: look the change up in ``_TRANSITIONS``, set
        the state (and ``active``, if given: whether it is in the rotation), and report it if
        anything a user can see changed."""
        old = self.state[ev]
        new = _TRANSITIONS.get((old, reason))
        if new is None:
            raise EVTransitionError(f"EV {ev}: no transition from {old.name} on {reason.name}")
        old_backup = self.is_backup(ev)
        self.state[ev] = new
        if active is not None:
            self.active[ev] = active
        self._refresh(ev)
        new_backup = self.is_backup(ev)
        if old != new or old_backup != new_backup:
            self.on_change(
                EVStateChanged(
                    self.qpn,
                    now,
                    ev,
                    self.values[ev],
                    self.planes[ev],
                    old,
                    new,
                    reason,
                    old_backup,
                    new_backup,
                    detail,
                )
            )

    def _refresh(self, ev: int) -> None:
        plane = self.planes[ev]
        self.usable[ev] = (
            self.active[ev]
            and self.state[ev] == EVState.GOOD
            and not self.plane_down[plane]
            and not self.peer_plane_down[plane]
            and ev not in self.ce.until
        )

    def _refresh_plane(self, plane: int) -> None:
        for ev in range(len(self.values)):
            if self.planes[ev] == plane:
                self._refresh(ev)

    def _backup_for(self, plane: int, avoid_route: int | None = None) -> int | None:
        """A backup EV of ``plane``, preferring routes with no EV assumed bad.

        A backup on the route of the EV it replaces would most likely share its fate (a dead
        link kills every EV routed over it), so it is never chosen: better one EV fewer in the
        plane than one that fails again at once.
        """
        bad_on_route: dict[int, int] = {}
        plane_routes = set()
        for ev, st in enumerate(self.state):
            if self.planes[ev] == plane:
                plane_routes.add(self.routes[ev])
                if st == EVState.ASSUMED_BAD:
                    bad_on_route[self.routes[ev]] = bad_on_route.get(self.routes[ev], 0) + 1
        if len(plane_routes) < 2:
            avoid_route = None  # one path in this plane: EVs differ by source port only
        best = None
        best_rank = None
        for ev in range(len(self.values)):
            if self.planes[ev] != plane or self.active[ev] or self.state[ev] != EVState.GOOD:
                continue
            route = self.routes[ev]
            if route == avoid_route:
                continue
            rank = (bad_on_route.get(route, 0), ev)
            if best_rank is None or rank < best_rank:
                best, best_rank = ev, rank
        return best

    def _active_in_plane(self, plane: int) -> int:
        return sum(
            1
            for ev in range(len(self.values))
            if self.planes[ev] == plane
            and self.active[ev]
            and self.state[ev] in (EVState.GOOD, EVState.SKIP)
        )
