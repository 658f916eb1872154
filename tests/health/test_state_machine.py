"""EV health state machine on the simulated network (deterministic, seeded, fast).

Scenarios: paths dying mid-transfer, paths flapping, a whole plane lost, lossy-but-alive paths,
lost probes, operator-denied EVs. Every scenario checks the same invariants while it runs:

* no data lost: the receiver's buffer equals what was written, and the QP never fails;
* no data packet leaves on an EV that is ASSUMED_BAD or DENIED at send time, except in the two
  documented fallbacks of ``EVSet``: nothing at all is usable (``next`` then tries every EV the
  operator allows), or a retransmission must avoid the only usable EV (``next_other``);
* DENIED EVs never carry anything (data, ACKs, probes);
* the floor holds: a live plane never has fewer active usable EVs than its floor;
* every state transition is reported by an EVStateChanged event: replaying the events from
  the initial states gives exactly the final states, each event's ``old`` is the state the
  replay has at that point, and the counters agree with the events;

plus what each scenario is about: detection within a few round trips, replacement from the
same plane's backups, planes balanced, resurrection within the probing bound.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from mrc import wire
from mrc.core import QPConfig, QueuePair
from mrc.core.events import EVReason, EVStateChanged, ImmediateReceived, QPFailed
from mrc.core.evset import EVState
from mrc.lab.sim import Faults, SimHost, SimNetwork

DATA_OPS = (int(wire.Opcode.RDMA_WRITE_ONLY), int(wire.Opcode.RDMA_WRITE_ONLY_IMM))
PROBE_OPS = (int(wire.Opcode.PROBE), int(wire.Opcode.PROBE_REPLY))
ACK_OP = int(wire.Opcode.ACKNOWLEDGE)

DELAY = 0.001  # one-way path delay: RTT ~2 ms, so "a few RTTs" is measurable in virtual time
RTT = 2 * DELAY


@dataclass
class Tx:
    time: float
    host: str
    ev: int
    plane: int
    op: int
    state: EVState
    active: bool
    any_usable: bool
    retransmission: bool


@dataclass
class Drop:
    """Per-datagram drop rule: dead(sport, now) -> drop everything; extra(sport, data) -> drop."""

    dead: Callable[[int, float], bool] = lambda sport, now: False
    extra: Callable[[int, bytes, float], bool] = lambda sport, data, now: False


class HealthNet(SimNetwork):
    """SimNetwork that records every datagram with its EV's state at send time and checks the
    floor after every step; drop rules may depend on the source port and virtual time."""

    def __init__(self, seed: int, drop: Drop | None = None) -> None:
        super().__init__(seed, Faults(delay=DELAY, jitter=DELAY / 10))
        self.drop = drop or Drop()
        self.tx: list[Tx] = []
        self.violations: list[str] = []
        self._cur: tuple[SimHost, QueuePair] | None = None
        self._sent_seqs: dict[str, set[int]] = defaultdict(set)
        self.check_floor = True
        self._plane_retired: dict[str, set[int]] = {}
        # extra one-way delay (s) by source port and time, on top of Faults.delay
        self.extra_delay: Callable[[int, float], float] = lambda sport, now: 0.0

    def pump(self, host: SimHost, qp: QueuePair) -> None:
        self._cur = (host, qp)
        n_events = len(host.events)
        try:
            super().pump(host, qp)
        finally:
            self._cur = None
        evs = qp.evs
        # EVs whose latest retirement was a whole plane going down: until they are
        # resurrected one by one, their plane is recovering and may sit below its floor
        by_plane = self._plane_retired.setdefault(host.name, set())
        for e in host.events[n_events:]:
            if isinstance(e, EVStateChanged):
                if e.new is EVState.ASSUMED_BAD and e.reason is EVReason.PLANE_DOWN:
                    by_plane.add(e.ev)
                else:
                    by_plane.discard(e.ev)
        if self.check_floor and any(evs.usable):
            for plane in range(evs.nplanes):
                if evs.plane_down[plane] or evs.peer_plane_down[plane]:
                    continue
                if any(evs.planes[ev] == plane for ev in by_plane):
                    continue
                n = evs._active_in_plane(plane)
                if n < evs.floor[plane]:
                    self.violations.append(
                        f"t={self.now:.4f} {host.name}: plane {plane} has {n} active EVs, "
                        f"floor {evs.floor[plane]}"
                    )

    def _transmit(self, data: bytes, sport: int, dst: str) -> None:
        assert self._cur is not None
        host, qp = self._cur
        evs = qp.evs
        ev = evs.index_of_value[sport]
        op = data[0]
        retx = False
        if op in DATA_OPS:
            psn = int.from_bytes(data[9:12], "big")
            seen = self._sent_seqs[host.name]
            retx = psn in seen
            seen.add(psn)
        self.tx.append(
            Tx(
                self.now,
                host.name,
                ev,
                evs.planes[ev],
                op,
                evs.state[ev],
                evs.active[ev],
                any(evs.usable),
                retx,
            )
        )
        if self.drop.dead(sport, self.now) or self.drop.extra(sport, data, self.now):
            self.lost += 1
            return
        extra = self.extra_delay(sport, self.now)
        if not extra:
            super()._transmit(data, sport, dst)
            return
        base = self.faults.delay
        self.faults.delay = base + extra
        try:
            super()._transmit(data, sport, dst)
        finally:
            self.faults.delay = base


@dataclass
class Run:
    net: HealthNet
    qa: QueuePair  # sender
    qb: QueuePair  # receiver
    data: bytes
    buf: bytearray
    done_at: float | None = None
    events: dict[str, list[EVStateChanged]] = field(default_factory=dict)

    def ev_events(self, host: str = "a") -> list[EVStateChanged]:
        return [e for e in self.net.hosts[host].events if isinstance(e, EVStateChanged)]

    def data_tx(self, host: str = "a") -> list[Tx]:
        return [t for t in self.net.tx if t.host == host and t.op in DATA_OPS]


def connect(
    net: HealthNet, active: int, backups: int, planes: int, config: QPConfig
) -> tuple[QueuePair, QueuePair]:
    """A QP pair with ``active`` EVs in rotation plus ``backups`` in the pool, EV i on plane
    i mod ``planes`` (as mrc.connection lays them out)."""
    return net.connect("a", "b", active, config, planes=planes, backups=backups)


def run_transfer(
    seed: int = 1,
    size: int = 2_000_000,
    active: int = 32,
    backups: int = 8,
    planes: int = 4,
    drop: Drop | None = None,
    max_time: float = 10.0,
    setup: Callable[[HealthNet, QueuePair, QueuePair], None] | None = None,
    **cfg: Any,
) -> Run:
    """One WRITE of ``size`` random bytes plus a WRITE_IMM from host a to host b."""
    # a fixed window of 16: the detection-time bounds below assume a steady packet rate
    base: dict[str, Any] = {"payload_size": 1000, "max_outstanding": 16, "cc": "fixed"}
    config = QPConfig(**{**base, **cfg})
    net = HealthNet(seed, drop)
    net.add_host("a")
    net.add_host("b")
    qa, qb = connect(net, active, backups, planes, config)
    if setup is not None:
        setup(net, qa, qb)
    data = random.Random(seed).randbytes(size)
    buf = bytearray(size)
    mr = net.hosts["b"].core.pd.register(buf)
    qa.post_write(data, mr.addr, mr.rkey)
    qa.post_write(b"", mr.addr + size, mr.rkey, imm=7)
    run = Run(net, qa, qb, data, buf)

    def finished() -> bool:
        got = any(isinstance(e, ImmediateReceived) for e in net.hosts["b"].events)
        if got and qa.idle and run.done_at is None:
            run.done_at = net.now
        return got and qa.idle

    assert net.run(finished, max_time=max_time), f"transfer not done by t={net.now:.3f}"
    return run


# ---- invariants ----------------------------------------------------------------------------


def check_invariants(run: Run, denied: set[int] | None = None) -> None:
    net, qa, qb = run.net, run.qa, run.qb
    fails = [e for h in net.hosts.values() for e in h.events if isinstance(e, QPFailed)]
    assert not fails, fails
    assert run.buf == run.data, "data lost or corrupted"
    assert qb.stats.bytes_placed == len(run.data)
    assert not net.violations, net.violations[:5]
    # data only on usable EVs, except the documented fallbacks
    for t in net.tx:
        if t.op not in DATA_OPS or t.state not in (EVState.ASSUMED_BAD, EVState.DENIED):
            continue
        assert t.state != EVState.DENIED, f"data on DENIED EV {t.ev} at {t.time:.4f}"
        assert not t.any_usable or t.retransmission, (
            f"{t.host}: new data on ASSUMED_BAD EV {t.ev} at t={t.time:.4f} while other EVs "
            "were usable"
        )
    # DENIED never used at all
    for host, qp in (("a", qa), ("b", qb)):
        dead = {i for i, s in enumerate(qp.evs.state) if s == EVState.DENIED}
        if host == "a" and denied:
            assert dead == denied
        used = [t for t in net.tx if t.host == host and t.ev in dead]
        assert not used, f"{host}: DENIED EVs used: {used[:3]}"
    # events tell the whole story
    for host, qp in (("a", qa), ("b", qb)):
        events = run.ev_events(host)
        # initial states: active EVs GOOD, the rest GOOD (backup); denials are events too
        state = ["GOOD" if i < _n_active(qp) else "GOOD (backup)" for i in range(len(qp.evs))]
        bad = res = 0
        for e in events:
            assert e.old_label == state[e.ev], (host, e, state[e.ev])
            assert e.old_label != e.new_label, e
            assert e.value == qp.evs.values[e.ev] and e.plane == qp.evs.planes[e.ev]
            state[e.ev] = e.new_label
            bad += e.new is EVState.ASSUMED_BAD
            res += e.old is EVState.ASSUMED_BAD and e.new is EVState.GOOD
        assert state == [qp.evs.describe(i) for i in range(len(qp.evs))], host
        assert bad == qp.evs.assumed_bad and res == qp.evs.resurrected, host


def _n_active(qp: QueuePair) -> int:
    return sum(qp.evs.target)


def per_plane(txs: list[Tx], t0: float, t1: float, first_only: bool = True) -> Counter[int]:
    return Counter(
        t.plane for t in txs if t0 <= t.time < t1 and not (first_only and t.retransmission)
    )


def assert_balanced(counts: Counter[int], planes: int, tol: float = 0.1) -> None:
    assert set(counts) == set(range(planes)), counts
    fair = sum(counts.values()) / planes
    for p, n in counts.items():
        assert abs(n - fair) <= max(tol * fair, 2), (p, counts)


def first_event(
    events: list[EVStateChanged], ev: int, new: str, after: float = 0.0
) -> EVStateChanged | None:
    return next((e for e in events if e.ev == ev and e.new_label == new and e.time >= after), None)


# ---- scenarios -----------------------------------------------------------------------------


def test_healthy_network_keeps_planes_balanced_and_states_quiet() -> None:
    run = run_transfer(size=1_000_000)
    check_invariants(run)
    assert run.ev_events("a") == [] and run.ev_events("b") == []
    txs = run.data_tx()
    counts = per_plane(txs, 0, 1e9)
    assert_balanced(counts, 4, tol=0.01)
    # interleaved spraying: any 4 consecutive first transmissions cover all 4 planes
    firsts = [t.plane for t in txs if not t.retransmission]
    for i in range(0, len(firsts) - 4, 4):
        assert sorted(firsts[i : i + 4]) == [0, 1, 2, 3], (i, firsts[i : i + 4])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dead_paths_are_retired_and_replaced_from_the_same_plane(seed: int) -> None:
    T = 0.05
    planes = 4
    # EVs 0, 4 (plane 0) and 1, 5, 9 (plane 1) die at T: like a spine link in two planes
    victims = {0, 4, 1, 5, 9}
    holder: dict[str, set[int]] = {}

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        holder["ports"] = {qa.evs.values[i] for i in victims}

    drop = Drop(dead=lambda sport, now: now >= T and sport in holder["ports"])
    run = run_transfer(seed=seed, size=3_000_000, drop=drop, setup=setup)
    check_invariants(run)
    qa = run.qa
    events = run.ev_events("a")
    assert run.done_at is not None and run.done_at > T + 0.1, "failure must hit mid-transfer"
    for ev in victims:
        bad = first_event(events, ev, "ASSUMED_BAD", after=T)
        assert bad is not None, f"dead EV {ev} never retired"
        # detected within a few RTTs of its first packet after T (SACK evidence, not RTO)
        first_after = min(t.time for t in run.data_tx() if t.ev == ev and t.time >= T)
        assert bad.time - first_after < 5 * RTT + qa.config.reorder_min, (ev, bad.time)
        assert bad.time - T < 0.03, (ev, bad.time - T)
        assert bad.reason is EVReason.SACK_LOSS
        # replaced by a backup of the same plane at the same moment
        repl = [
            e
            for e in events
            if e.time == bad.time and e.reason is EVReason.REPLACES and e.detail == str(ev)
        ]
        if repl:
            assert qa.evs.planes[repl[0].ev] == qa.evs.planes[ev]
            assert repl[0].old_label == "GOOD (backup)" and repl[0].new_label == "GOOD"
    # every replacement stays in its plane, and no dead EV is used again for new data
    for e in events:
        if e.reason is EVReason.REPLACES:
            old = int(e.detail)
            assert qa.evs.planes[e.ev] == qa.evs.planes[old]
    for t in run.data_tx():
        if t.ev in victims and t.time > T + 0.03:
            assert t.retransmission or not t.any_usable, t
    assert all(qa.evs.state[ev] == EVState.ASSUMED_BAD for ev in victims)
    assert qa.evs.planes_lost == 0, "a few dead paths are not a dead plane"
    # planes balanced before and after the replacement
    txs = run.data_tx()
    assert_balanced(per_plane(txs, 0, T), planes)
    assert_balanced(per_plane(txs, T + 0.03, run.done_at), planes)


def test_planes_stay_balanced_when_backups_run_out() -> None:
    """Plane 0 loses 6 of its 8 EVs and has 1 backup: it still gets a quarter of the data
    (its surviving EVs carry more each), and the floor (2) is never crossed."""
    T = 0.03
    victims = {0, 4, 8, 12, 16, 20}  # plane 0: EVs 0,4,...,28 active; 32 is its backup
    holder: dict[str, set[int]] = {}

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        holder["ports"] = {qa.evs.values[i] for i in victims}

    drop = Drop(dead=lambda sport, now: now >= T and sport in holder["ports"])
    run = run_transfer(seed=4, size=2_000_000, active=32, backups=4, drop=drop, setup=setup)
    check_invariants(run)
    qa = run.qa
    assert qa.evs.floor == [2, 2, 2, 2]
    assert sum(qa.evs.usable[i] for i in range(len(qa.evs)) if qa.evs.planes[i] == 0) == 3
    txs = run.data_tx()
    assert run.done_at is not None
    assert_balanced(per_plane(txs, T + 0.03, run.done_at), 4)


@pytest.mark.parametrize("seed", [12, 13, 14])
def test_many_losses_at_once_on_a_live_plane_do_not_take_it_down(seed: int) -> None:
    """Regression: 6 of plane 0's 8 EVs die together, with a window deep enough that a dozen
    of their packets are found lost by one or two SACKs. The same SACKs acknowledge plane-0
    packets sent later on its two live EVs, so those losses are no evidence against the plane:
    it must not be declared down (which would retire its live EVs too)."""
    T = 0.03
    victims = {0, 4, 8, 12, 16, 20}
    holder: dict[str, set[int]] = {}

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        holder["ports"] = {qa.evs.values[i] for i in victims}

    drop = Drop(dead=lambda sport, now: now >= T and sport in holder["ports"])
    run = run_transfer(
        seed=seed, size=6_000_000, backups=4, drop=drop, setup=setup, max_outstanding=96
    )
    check_invariants(run)
    assert run.qa.evs.planes_lost == 0
    assert {e.ev for e in run.ev_events("a") if e.new is EVState.ASSUMED_BAD} >= victims - {32}


@pytest.mark.parametrize("seed", [5, 6])
def test_healed_paths_are_resurrected_within_the_probing_bound(seed: int) -> None:
    T1, T2 = 0.05, 0.30
    victims = {2, 6, 10, 14}  # four EVs of plane 2
    holder: dict[str, set[int]] = {}

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        holder["ports"] = {qa.evs.values[i] for i in victims}

    drop = Drop(dead=lambda sport, now: T1 <= now < T2 and sport in holder["ports"])
    run = run_transfer(seed=seed, size=8_000_000, drop=drop, setup=setup)
    check_invariants(run)
    cfg = run.qa.config
    events = run.ev_events("a")
    assert run.done_at is not None and run.done_at > T2 + 0.2
    # one outstanding probe per EV: after the heal the probe in flight must time out first
    # (probe_timeout), then resurrect_after answered probes probe_interval apart
    bound = cfg.probe_timeout + cfg.resurrect_after * cfg.probe_interval + 3 * RTT
    for ev in victims:
        bad = first_event(events, ev, "ASSUMED_BAD", after=T1)
        assert bad is not None and bad.time < T2
        back = first_event(events, ev, "GOOD", after=T2) or first_event(
            events, ev, "GOOD (backup)", after=T2
        )
        assert back is not None, f"EV {ev} never resurrected"
        assert back.old is EVState.ASSUMED_BAD and back.reason is EVReason.RESURRECTED
        assert back.time - T2 <= bound, (ev, back.time - T2, bound)
        # nothing came back while the path was still dead
        early = [
            e for e in events if e.ev == ev and T1 < e.time < T2 and e.old is EVState.ASSUMED_BAD
        ]
        assert not early, early
    assert run.qa.evs.resurrected >= len(victims)
    # probes went out while dead, every probe_timeout, and were not counted as data
    probes = [
        t
        for t in run.net.tx
        if t.host == "a" and t.op == wire.Opcode.PROBE and t.ev in victims and T1 < t.time < T2
    ]
    assert len(probes) >= len(victims) * int((T2 - T1 - 0.03) / cfg.probe_timeout)


@pytest.mark.parametrize(("dead_ms", "alive_ms"), [(30, 30), (40, 250)])
def test_flapping_paths(dead_ms: int, alive_ms: int) -> None:
    """Six EVs (two planes) flap: dead for ``dead_ms``, alive for ``alive_ms``, repeatedly.

    Fast flapping keeps them retired (an alive phase is shorter than a probe timeout plus
    ``resurrect_after`` answered probes: the hysteresis works); slow flapping cycles them
    through ASSUMED_BAD and back. Either way the data arrives intact and nothing else moves.
    """
    flappers = {0, 1, 4, 5, 8, 9}
    holder: dict[str, set[int]] = {}
    dead_s, period = dead_ms / 1000, (dead_ms + alive_ms) / 1000

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        holder["ports"] = {qa.evs.values[i] for i in flappers}

    def dead(sport: int, now: float) -> bool:
        return sport in holder["ports"] and now >= 0.02 and (now - 0.02) % period < dead_s

    size = 6_000_000 if alive_ms < 100 else 14_000_000
    run = run_transfer(seed=7, size=size, drop=Drop(dead=dead), setup=setup)
    check_invariants(run)
    qa = run.qa
    events = run.ev_events("a")
    assert {e.ev for e in events if e.new is EVState.ASSUMED_BAD} == flappers
    assert qa.evs.planes_lost == 0
    # resurrections only ever happen while the path is alive
    for e in events:
        if e.old is EVState.ASSUMED_BAD:
            assert not dead(qa.evs.values[e.ev], e.time - RTT), e
    if alive_ms < 100:
        assert qa.evs.resurrected == 0
        counts = Counter(t.ev for t in run.data_tx() if not t.retransmission)
        steady = [counts[i] for i in range(32) if i not in flappers]
        assert max(counts[i] for i in flappers) < 0.2 * (sum(steady) / len(steady))
    else:
        assert run.done_at is not None
        cycles = run.done_at / period
        assert qa.evs.resurrected >= len(flappers) * int(cycles - 1), (qa.evs.resurrected, cycles)
        assert qa.evs.assumed_bad >= len(flappers) * int(cycles)


def test_whole_plane_loss_and_return() -> None:
    """Every EV of plane 1, both directions, dies at T1 and comes back at T2: the plane goes
    down within a few RTTs, the peer is told (port-state bitmap) and stops using it for ACKs,
    the other planes share the data evenly, and the plane comes back after the heal.

    Window 32: several SACKs per window, so losing the quarter of them that travel on the dead
    plane cannot leave the sender without news (see the small-window test below)."""
    T1, T2 = 0.05, 0.25
    holder: dict[str, set[int]] = {}

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        holder["ports"] = {
            q.evs.values[i] for q in (qa, qb) for i in range(len(q.evs)) if q.evs.planes[i] == 1
        }

    drop = Drop(dead=lambda sport, now: T1 <= now < T2 and sport in holder["ports"])
    run = run_transfer(seed=8, size=12_000_000, drop=drop, setup=setup, max_outstanding=32)
    check_invariants(run)
    qa, qb = run.qa, run.qb
    events = run.ev_events("a")
    down = [e for e in events if e.reason is EVReason.PLANE_DOWN and e.plane == 1]
    assert down, "plane 1 never declared down"
    t_down = down[0].time
    # measured: 11.6 ms (5.8 RTTs), 12.0 since losses after a delay rise retire no EV (the
    # dead plane's EVs stay in the rotation a little longer, the plane's streak is the same)
    assert t_down - T1 < 7 * RTT, t_down - T1
    assert qa.stats.retransmits_timeout == 0
    assert qa.evs.planes_lost == 1
    # every EV of the plane was retired at that moment, backups included
    plane1 = [i for i in range(len(qa.evs)) if qa.evs.planes[i] == 1]
    retired = {e.ev for e in events if e.new is EVState.ASSUMED_BAD and T1 <= e.time <= t_down}
    assert retired == set(plane1)  # backups included
    # the receiver learnt it from the port-state bitmap and stopped ACKing on plane 1
    acks = [t for t in run.net.tx if t.host == "b" and t.op == ACK_OP]
    late = [t for t in acks if t_down + 2 * RTT < t.time < T2 and t.plane == 1]
    assert not late, late[:3]
    # no data on plane 1 while it is down; the other three share evenly
    txs = run.data_tx()
    assert not [t for t in txs if t.plane == 1 and t_down < t.time < T2]
    counts = per_plane(txs, t_down + 0.01, T2)
    assert counts[1] == 0
    del counts[1]
    fair = sum(counts.values()) / 3
    assert all(abs(n - fair) <= 0.1 * fair for n in counts.values()), counts
    # the plane came back after the heal and carries data again
    up = [t for t in txs if t.plane == 1 and t.time > T2]
    assert up, "plane 1 never used again"
    assert not qa.evs.plane_down[1] and not qb.evs.peer_plane_down[1]
    assert up[0].time - T2 < qa.config.probe_timeout + 4 * qa.config.probe_interval


def test_whole_plane_loss_with_a_tiny_window() -> None:
    """With a window one SACK covers, the SACK that travels on the dead plane is the only news
    the sender would get. The tail loss probe (after 2 srtt) repairs the data first; the plane
    is declared down by the losses that follow, within two RTOs. Data arrives intact."""
    T1 = 0.05
    holder: dict[str, set[int]] = {}

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        holder["ports"] = {
            q.evs.values[i] for q in (qa, qb) for i in range(len(q.evs)) if q.evs.planes[i] == 1
        }

    drop = Drop(dead=lambda sport, now: now >= T1 and sport in holder["ports"])
    run = run_transfer(seed=8, size=3_000_000, drop=drop, setup=setup, max_outstanding=16)
    check_invariants(run)
    down = [e for e in run.ev_events("a") if e.reason is EVReason.PLANE_DOWN and e.plane == 1]
    assert down
    cfg = run.qa.config
    assert down[0].time - T1 < 2 * cfg.min_rto + 6 * RTT


def test_no_plane_goes_down_after_the_heal() -> None:
    """Regression: a short total outage (every forward path, 60 ms) leaves retransmissions
    sent during the outage to time out *after* the heal (RTO backoff). Answered probes prove
    the planes work again, so those late timeouts must not add up to "plane down"."""
    T1, T2 = 0.03, 0.09
    holder: dict[str, set[int]] = {}

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        holder["ports"] = set(qa.evs.values)

    drop = Drop(dead=lambda sport, now: T1 <= now < T2 and sport in holder["ports"])
    run = run_transfer(seed=11, size=4_000_000, active=16, backups=4, drop=drop, setup=setup)
    check_invariants(run)
    late = [e for e in run.ev_events("a") if e.reason is EVReason.PLANE_DOWN and e.time > T2]
    assert not late, late[:2]
    assert run.qa.evs.planes_lost == 0
    assert run.qa.stats.retransmits_timeout > 0  # the scenario did produce late timeouts


@pytest.mark.parametrize("seed", [15, 16, 17])
def test_dead_ack_paths_blame_the_ack_evs_not_the_data_evs(seed: int) -> None:
    """A spine-like failure in both directions: the sender's data EVs 0, 4, 8 and the
    receiver's ACK EVs 1, 5, 9 die together. Data is lost (holes keep the cumulative ACK back)
    and so are the SACKs on the dead reverse paths, so the sender sees later packets
    acknowledged while earlier ones that did arrive are not: it resends those (harmless) but
    must only retire the data EVs that really died, and no plane. The receiver retires exactly
    its dead ACK EVs: its reverse probes go unanswered on them while others are answered."""
    T = 0.03
    fwd, rev = {0, 4, 8}, {1, 5, 9}
    holder: dict[str, set[int]] = {}

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        holder["ports"] = {qa.evs.values[i] for i in fwd} | {qb.evs.values[i] for i in rev}

    drop = Drop(dead=lambda sport, now: now >= T and sport in holder["ports"])
    run = run_transfer(seed=seed, size=6_000_000, drop=drop, setup=setup, max_outstanding=64)
    check_invariants(run)
    qa = run.qa
    assert qa.stats.retransmits_sack > 0
    blamed = {e.ev for e in run.ev_events("a") if e.new is EVState.ASSUMED_BAD}
    assert blamed == fwd, blamed
    assert qa.evs.planes_lost == 0
    assert qa.requester.losses_unblamed > 0  # the filter was needed
    # the receiver finds its dead ACK paths by probing them (it only receives), before any
    # data arrives twice; nothing else is retired on its side
    retired = {e.ev: e.reason for e in run.ev_events("b") if e.new is EVState.ASSUMED_BAD}
    assert set(retired) == rev, retired
    assert set(retired.values()) <= {EVReason.REVERSE_PROBE, EVReason.ACK_LOST}
    assert run.qb.stats.reverse_probes_lost >= 1


@pytest.mark.parametrize("seed", [18, 19])
def test_a_plane_with_a_shorter_queue_is_not_reordering_loss(seed: int) -> None:
    """Regression: planes 0, 2 and 3 carry 3 ms more queueing than plane 1 (as when plane 1
    has just come back with an empty queue while the others are full). Plane 1's packets
    overtake the others' by 3 ms, more than the 2 ms reordering window, but less than the
    cross-plane window: no packet may be declared lost, no EV retired."""

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        slow = {qa.evs.values[i] for i in range(len(qa.evs)) if qa.evs.planes[i] != 1}
        net.extra_delay = lambda sport, now: 0.003 if sport in slow else 0.0

    run = run_transfer(seed=seed, size=3_000_000, setup=setup, max_outstanding=64)
    check_invariants(run)
    assert run.qa.stats.retransmits == 0
    assert run.ev_events("a") == []


def test_lossy_but_alive_paths() -> None:
    """Four EVs lose 2% of their datagrams: the data arrives intact, the lossy EVs are
    retired now and then and come back (their probes mostly get through), the floor holds and
    no plane is declared down."""
    lossy = {3, 7, 11, 15}
    holder: dict[str, set[int]] = {}
    rng = random.Random(99)

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        holder["ports"] = {qa.evs.values[i] for i in lossy}

    drop = Drop(extra=lambda sport, data, now: sport in holder["ports"] and rng.random() < 0.02)
    run = run_transfer(seed=9, size=12_000_000, drop=drop, setup=setup)
    check_invariants(run)
    qa = run.qa
    assert qa.stats.retransmits > 0
    bad = {e.ev for e in run.ev_events("a") if e.new is EVState.ASSUMED_BAD}
    assert bad and bad <= lossy, bad  # only lossy EVs were ever blamed
    assert qa.evs.resurrected >= 1
    assert qa.evs.planes_lost == 0
    assert_balanced(per_plane(run.data_tx(), 0, 1e9), 4, tol=0.02)


def test_lost_probes_delay_resurrection_but_nothing_else() -> None:
    """Dead paths heal at T2, but their probes (and replies) are dropped until T3: the EVs
    stay ASSUMED_BAD (and unused) until the probes get through, then come back."""
    T1, T2, T3 = 0.03, 0.12, 0.35
    victims = {1, 5, 9}
    holder: dict[str, set[int]] = {}

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        holder["ports"] = {qa.evs.values[i] for i in victims}

    def extra(sport: int, data: bytes, now: float) -> bool:
        return (
            data[0] in PROBE_OPS
            and now < T3
            and (sport in holder["ports"] or data[0] == wire.Opcode.PROBE_REPLY)
        )

    drop = Drop(dead=lambda sport, now: T1 <= now < T2 and sport in holder["ports"], extra=extra)
    run = run_transfer(seed=10, size=8_000_000, drop=drop, setup=setup)
    check_invariants(run)
    cfg = run.qa.config
    events = run.ev_events("a")
    assert run.done_at is not None and run.done_at > T3 + 0.2
    for ev in victims:
        assert first_event(events, ev, "ASSUMED_BAD", after=T1) is not None
        back = [e for e in events if e.ev == ev and e.old is EVState.ASSUMED_BAD]
        assert back and back[0].time >= T3, back[:1]
        assert (
            back[0].time - T3
            <= cfg.probe_timeout + cfg.resurrect_after * cfg.probe_interval + 3 * RTT
        )
        # no first transmission on it while it waited
        assert not [
            t
            for t in run.data_tx()
            if t.ev == ev and T1 + 0.03 < t.time < T3 and not t.retransmission
        ]


def test_denied_evs_are_never_used_even_when_everything_else_fails() -> None:
    """Deny four EVs, then kill every other EV for 400 ms: the QP keeps trying the EVs the
    operator allows, never the denied ones, and recovers after the heal. (A silence of every
    path blames no EV, handle_timer: only the oldest packet is resent, on allowed EVs; if
    planes do go down, the desperate case still uses allowed EVs only.)"""
    T1, T2 = 0.03, 0.43
    denied = {0, 1, 2, 3}
    holder: dict[str, set[int]] = {}

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        for ev in denied:
            qa.deny_ev(ev)
        holder["ports"] = {qa.evs.values[i] for i in range(len(qa.evs)) if i not in denied}

    net_holder: dict[str, HealthNet] = {}

    def dead(sport: int, now: float) -> bool:
        return T1 <= now < T2 and sport in holder["ports"]

    def setup_all(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        net.check_floor = False  # denials take EVs below the floor by operator's choice
        net_holder["net"] = net
        setup(net, qa, qb)

    run = run_transfer(
        seed=11, size=4_000_000, active=16, backups=4, drop=Drop(dead=dead), setup=setup_all
    )
    check_invariants(run, denied=denied)
    qa = run.qa
    assert [qa.evs.describe(i) for i in sorted(denied)] == ["DENIED"] * 4
    # data went out during the outage, and never on a denied EV
    outage = [t for t in run.data_tx() if T1 <= t.time < T2]
    assert outage and all(t.ev not in denied for t in outage)
    assert all(t.ev not in denied for t in run.data_tx() if not t.any_usable)
    assert qa.stats.silent_timeouts > 0  # the outage was taken for what it was: silence
    # denials were reported as events
    den = [e for e in run.ev_events("a") if e.new is EVState.DENIED]
    assert {e.ev for e in den} == denied


def test_a_stalled_receivers_overflow_is_no_evidence_against_a_path() -> None:
    """A receiver stops reading for 0.3 s (SIGSTOP, a preempted host): its socket holds what
    arrived first, the kernel drops the rest, and after the resume the held packets are
    answered at once. The dropped ones met a silence of the whole peer, so when they time
    out (or SACK shows them lost) after the answers resumed, nothing is blamed.

    Seen on ::1 (tests/transport/test_peer_stall.py, about 1 run in 5): those late timeouts
    were taken as losses of their EVs, 8 in a row took the only plane down, and the sender
    sprayed on EVs it believed dead until probes brought them back."""
    T1, T2, HELD = 0.02, 0.32, 24
    arrived: list[float] = []
    sender_ports: set[int] = set()

    def overflow(sport: int, data: bytes, now: float) -> bool:
        if not T1 <= now < T2 or sport not in sender_ports or data[0] not in DATA_OPS:
            return False
        arrived.append(now)
        return len(arrived) > HELD  # the socket buffer is full: the kernel drops it

    def setup(net: HealthNet, qa: QueuePair, qb: QueuePair) -> None:
        sender_ports.update(qa.evs.values)
        # what reaches the stopped receiver waits in its socket until it runs again
        net.extra_delay = lambda sport, now: (
            T2 - now if T1 <= now < T2 and sport in sender_ports else 0.0
        )

    run = run_transfer(
        seed=5, size=3_000_000, active=16, backups=4, planes=1, drop=Drop(extra=overflow),
        setup=setup, max_outstanding=64,
    )  # fmt: skip
    check_invariants(run)
    qa = run.qa
    assert len(arrived) > HELD  # the stall overflowed the receiver's socket
    assert qa.stats.silent_timeouts >= 1
    assert qa.requester.losses_unblamed > 0  # the overflow was found lost, blaming nothing
    retired = [e for e in run.ev_events("a") if e.new is EVState.ASSUMED_BAD]
    assert retired == [], retired[:3]
    assert qa.evs.planes_lost == 0
