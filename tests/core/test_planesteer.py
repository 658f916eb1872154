"""Delay-steered plane shares (mrc.core.planesteer, docs/EV_HEALTH.md "Plane shares"): a plane
that queues more than the others gives up share, gets it back once level, never below the
floor; alike planes keep equal shares; and in the simulator a QP whose plane 0 lost three
quarters of its capacity between the leaves sends less there and finishes sooner."""

from __future__ import annotations

from typing import Any

from mrc.core import QPConfig
from mrc.core.evset import EVSet
from mrc.core.planesteer import PlaneSteering
from mrc.lab.sim import Faults
from mrc.lab.sim_links import Fabric, LinkSpec

from .mrcsim_harness import RecordingNetwork, make_transfer, run_until


def _feed(st: PlaneSteering, delays: list[float], t0: float, rounds: int) -> tuple[float, bool]:
    """``rounds`` round trips of one sample per plane; (time after, any rebuild asked)."""
    now, moved = t0, False
    for _ in range(rounds):
        for p, d in enumerate(delays):
            moved |= st.sample(p, d, now)
        now += max(delays)
    return now, moved


def test_a_slower_plane_gives_up_share_down_to_the_floor_and_wins_it_back() -> None:
    # windows of 4 round trips, margin 0.5 + 1 ms, 2 windows in a row, floor 0.25, x0.8 / +0.05
    st = PlaneSteering(2)
    now, moved = _feed(st, [0.004, 0.0015], 0.0, 4)  # 4 ms > 1.5 x 1.5 ms + 1 ms ...
    assert st.weights == [1.0, 1.0] and not moved  # ... but for one window only
    now, moved = _feed(st, [0.004, 0.0015], now, 1)  # the second window ends
    assert st.weights[1] == 1.0 and st.weights[0] == 0.8
    now, moved = _feed(st, [0.004, 0.0015], now, 40)
    assert moved and st.weights == [0.25, 1.0]  # the floor
    assert st.shares() == [0.25, 1.0] and st.applied == [0.25, 1.0]
    now, moved = _feed(st, [0.0015, 0.0015], now, 200)  # level again: the share comes back
    assert st.weights == [1.0, 1.0] and moved
    assert st.shares() is None  # equal shares: the plain interleave


def test_alike_planes_keep_equal_shares_within_the_margin() -> None:
    st = PlaneSteering(3)
    # 3 ms against 1.4 ms: under 1.5 x 1.4 + 1 = 3.1 ms, queues of this size are no signal
    _, moved = _feed(st, [0.003, 0.0014, 0.002], 0.0, 50)
    assert not moved and st.weights == [1.0, 1.0, 1.0] and st.decreases == 0


def test_a_plane_that_goes_down_and_back_starts_afresh() -> None:
    evs = EVSet(list(range(100, 108)), [0, 1] * 4, plane_steering=PlaneSteering(2))
    st = evs.steering
    assert st is not None
    for i in range(80):
        evs.plane_rtt(0, 0.004, i * 0.004)
        evs.plane_rtt(1, 0.0015, i * 0.004)
    assert st.weights[0] == 0.25
    evs.set_plane_down(0, 1.0, detail="8")
    assert st.weights == [1.0, 1.0] and st.delay[0] is None


def test_the_rotation_follows_the_weights() -> None:
    evs = EVSet(list(range(100, 132)), [0, 1] * 16, plane_steering=PlaneSteering(2))
    st = evs.steering
    assert st is not None
    st.weights = [0.25, 1.0]
    evs.plane_rtt(0, 0.001, 0.0)  # moves nothing by itself: the weights were set by hand
    evs._pos = len(evs._order)  # start a round laid out with them
    picks = [evs.planes[evs.next()] for _ in range(1000)]
    share0 = picks.count(0) / len(picks)
    assert 0.17 < share0 < 0.23  # 0.25 : 1 -> 20%


def test_on_with_nscc_off_with_a_fixed_window_unless_asked() -> None:
    from mrc.core.memory import ProtectionDomain
    from mrc.core.qp import QueuePair

    def steering(**kw: Any) -> PlaneSteering | None:
        cfg = QPConfig(**kw)
        qp = QueuePair(1, ProtectionDomain(), list(range(100, 108)), [0, 1] * 4, cfg)
        return qp.evs.steering

    assert steering() is not None  # NSCC, the default
    assert steering(cc="fixed") is None
    assert steering(cc="fixed", plane_steering=True) is not None
    assert steering(plane_steering=False) is None
    single = QueuePair(1, ProtectionDomain(), list(range(100, 104)), [0] * 4, QPConfig())
    assert single.evs.steering is None  # one plane: nothing to steer between


def _asymmetric(steer: bool) -> tuple[float, float, int]:
    """One QP a -> b, 2 planes x 2 spines; plane 0's uplinks from a's leaf run at a quarter
    of the rate: plane 0 carries R/4 between the leaves, plane 1 R. (seconds, plane 0's share,
    timeouts)."""
    rate = 12.5e6
    nic = LinkSpec(rate=rate, queue=200_000)
    mid = LinkSpec(rate=rate / 2, queue=120_000)
    slow = LinkSpec(rate=rate / 8, queue=120_000)
    fab = Fabric(
        nic=nic,
        up=mid,
        down=mid,
        lasthop=nic,
        spines=2,
        leaves={"a": "L0", "b": "L1"},
        overrides={"up:L0/p0/s0": slow, "up:L0/p0/s1": slow},
    )
    net = RecordingNetwork(5, Faults(delay=0.0, jitter=0.0))
    net.set_fabric(fab)
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=8192, max_outstanding=64, psn_window=16384, plane_steering=steer)
    qa, qb = net.connect("a", "b", evs=32, config=cfg, planes=2, routes=True)
    size = 3_000_000
    t = make_transfer(net, "a", "b", qa, qb, [size], 7)
    t.post(0, 0, bytes(i % 251 for i in range(size)))
    assert run_until(net, [t])
    t.check_final()
    per_plane = [0, 0]
    for d in net.data_tx[("a", qa.qpn)]:
        per_plane[qa.evs.planes[d.ev]] += 1
    return net.now, per_plane[0] / sum(per_plane), qa.stats.retransmits_timeout


def test_steering_moves_share_off_a_plane_with_less_capacity_and_finishes_sooner() -> None:
    on_s, on_share, on_to = _asymmetric(True)
    off_s, off_share, off_to = _asymmetric(False)
    # measured: 422 ms, 30% on plane 0 and 0 timeouts, against 682 ms, 50% and 4 (454 ms,
    # 33% and 0 against 631 ms, 48% and 0 with the spines hashed from per-EV ports)
    assert on_share < off_share - 0.02
    assert on_s < 0.92 * off_s
    assert on_to <= off_to
