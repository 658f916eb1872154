"""Spraying: EV choice for first transmissions and for retransmissions, fairness, planes."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrc.core import QPConfig
from mrc.core.evset import EVSet
from mrc.lab.sim import Faults

from .mrcsim_harness import (
    RecordingNetwork,
    Transfer,
    failures,
    fuzz_settings,
    make_transfer,
    run_until,
)

# ---- EVSet unit tests ----------------------------------------------------------------------


@fuzz_settings()
@given(
    n=st.integers(2, 40),
    seed=st.integers(0, 2**32),
    avoids=st.lists(st.integers(0, 10**6), min_size=1, max_size=300),
)
def test_next_other_never_returns_the_avoided_ev(n: int, seed: int, avoids: list[int]) -> None:
    """Regression: at a round boundary the redraw could start a new permutation with ``avoid``."""
    evs = EVSet(list(range(5000, 5000 + n)), seed=seed)
    for a in avoids:
        a %= n
        assert evs.next_other(a) != a


def test_next_other_round_boundary_regression() -> None:
    # exhaustive over many seeds/positions for small sets, where the old bug showed ~1/n times
    for n in (2, 3, 4, 5):
        for seed in range(200):
            evs = EVSet(list(range(n)), seed=seed)
            for i in range(3 * n + 1):
                avoid = (seed + i) % n
                assert evs.next_other(avoid) != avoid, (n, seed, i)


def test_single_ev_retransmits_on_the_only_ev() -> None:
    evs = EVSet([7000])
    assert [evs.next_other(0) for _ in range(5)] == [0] * 5


@fuzz_settings()
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32), rounds=st.integers(1, 6))
def test_each_round_is_a_permutation(n: int, seed: int, rounds: int) -> None:
    evs = EVSet(list(range(1000, 1000 + n)), seed=seed)
    for _ in range(rounds):
        assert sorted(evs.next() for _ in range(n)) == list(range(n))


def test_evset_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        EVSet([])
    with pytest.raises(ValueError):
        EVSet([1, 1])
    with pytest.raises(ValueError):
        EVSet([1, 2], planes=[0])


# ---- in the simulator ----------------------------------------------------------------------


def _one_way(
    seed: int,
    faults: Faults,
    evs: int,
    nbytes: int,
    payload: int = 500,
    planes: int = 1,
    max_outstanding: int = 128,
    ev_health: bool = True,
) -> tuple[RecordingNetwork, Transfer]:
    net = RecordingNetwork(seed, faults)
    net.add_host("a")
    net.add_host("b")
    # per-packet spraying is what these tests check (bursts: tests/core/test_bursts.py)
    cfg = QPConfig(
        payload_size=payload,
        max_outstanding=max_outstanding,
        spray_seed=seed,
        ev_health=ev_health,
        burst=1,
    )
    qa, qb = net.connect("a", "b", evs=evs, config=cfg, planes=planes, psn_a=seed * 977)
    t = make_transfer(net, "a", "b", qa, qb, [nbytes], seed)
    rng = random.Random(seed)
    half = nbytes // 2
    t.post(0, 0, rng.randbytes(half))
    t.post(0, half, rng.randbytes(nbytes - half), imm=seed)
    assert run_until(net, [t])
    assert not failures(net)
    t.check_final()
    return net, t


@pytest.mark.parametrize("evs", [2, 3, 5, 16])
def test_every_retransmission_uses_a_different_ev(evs: int) -> None:
    total_retx = 0
    for seed in range(15):
        net, t = _one_way(seed, Faults(loss=0.1, trim=0.2, reorder=0.2), evs, 60_000)
        last: dict[int, int] = {}
        for tx in net.data_tx[("a", t.qp.qpn)]:
            if tx.seq in last:
                total_retx += 1
                assert tx.ev != last[tx.seq], (seed, tx.seq, tx.ev)
            last[tx.seq] = tx.ev
    assert total_retx > 100  # the property was exercised


@pytest.mark.parametrize("evs", [4, 16, 64, 128, 256])
def test_spraying_is_fair_on_a_clean_network(evs: int) -> None:
    rounds = 12
    net, t = _one_way(evs, Faults(), evs, rounds * evs * 500, payload=500)
    txs = net.data_tx[("a", t.qp.qpn)]
    assert len(txs) == rounds * evs  # no retransmissions on a clean network
    per_ev = Counter(tx.ev for tx in txs)
    assert set(per_ev) == set(range(evs))  # every EV carries traffic
    fair = len(txs) / evs
    assert max(per_ev.values()) <= 1.5 * fair
    # a fresh permutation per round: exactly one packet per EV in every aligned round
    for r in range(rounds):
        assert sorted(tx.ev for tx in txs[r * evs : (r + 1) * evs]) == list(range(evs))
    # the QP's own per-EV report agrees with the wire (its backups, after the active EVs, wait)
    report = t.qp.ev_report()
    assert [row["packets"] for row in report] == [per_ev[i] for i in range(len(report))]
    assert [row["value"] for row in report] == t.qp.evs.values


@pytest.mark.parametrize("evs", [8, 32, 128])
def test_spraying_stays_fair_with_retransmissions(evs: int) -> None:
    # the sprayer alone: EV health would (rightly) take lossy and trimmed EVs out of rotation
    net, t = _one_way(
        evs + 1, Faults(loss=0.02, trim=0.1, reorder=0.3), evs, 40 * evs * 500, ev_health=False
    )
    txs = net.data_tx[("a", t.qp.qpn)]
    assert t.qp.stats.retransmits > 0
    per_ev = Counter(tx.ev for tx in txs)
    fair = len(txs) / evs
    assert set(per_ev) == set(range(evs))
    assert max(per_ev.values()) <= 1.5 * fair
    assert min(per_ev.values()) >= 0.5 * fair


@pytest.mark.parametrize(("evs", "planes"), [(16, 2), (16, 4), (128, 8), (24, 3)])
def test_planes_split_evenly(evs: int, planes: int) -> None:
    net, t = _one_way(planes, Faults(), evs, 10 * evs * 500, planes=planes)
    qa = t.qp
    active = Counter(p for p, on in zip(qa.evs.planes, qa.evs.active, strict=True) if on)
    assert active == dict.fromkeys(range(planes), evs // planes)
    txs = net.data_tx[("a", qa.qpn)]
    per_plane = Counter(qa.evs.planes[tx.ev] for tx in txs)
    fair = len(txs) / planes
    assert set(per_plane) == set(range(planes))
    for n in per_plane.values():
        assert abs(n - fair) <= evs / planes  # within one packet per EV of that plane
        assert n <= 1.5 * fair


def test_different_qps_spray_in_different_orders() -> None:
    a = EVSet(list(range(64)), seed=0 ^ 1)
    b = EVSet(list(range(64)), seed=0 ^ 2)
    assert [a.next() for _ in range(64)] != [b.next() for _ in range(64)]


def test_a_plane_that_lost_a_route_gets_a_share_in_proportion_to_the_routes_it_has_left() -> None:
    """Two planes of two routes (spines) each. With every route alive the planes share equally;
    once route 0 of plane 0 has no usable EV, plane 0 has half its paths and gets a third of
    the packets: an equal share would load its one remaining spine twice as much as any other
    path (the link_down all-to-all of mrc-bench: steps 1.6x the clean ones, 1.25x with this).
    Off by default (QPConfig.route_weighted_planes): without it, equal shares."""
    from mrc.core.config import EVConfig
    from mrc.core.evset import EVSet

    n = 32
    planes = [i % 2 for i in range(n)]
    routes = [(i % 2) * 2 + (i // 2) % 2 for i in range(n)]  # plane 0: routes 0, 1; plane 1: 2, 3
    evs = EVSet(
        list(range(3000, 3000 + n)),
        planes,
        seed=5,
        routes=routes,
        config=EVConfig(route_dead_evs=0, route_weighted_planes=True),
    )

    def shares(draws: int) -> list[float]:
        got = [0, 0]
        for _ in range(draws):
            got[planes[evs.next()]] += 1
        return [g / draws for g in got]

    assert shares(3200) == pytest.approx([0.5, 0.5], abs=0.01)
    for ev in range(n):
        if routes[ev] == 0:
            evs.deny(ev)  # route 0 of plane 0: no usable EV left on it
    seen = shares(6000)
    assert seen == pytest.approx([1 / 3, 2 / 3], abs=0.02), seen
    # and the EVs of the live route of plane 0 carry it, none of the dead route's
    for _ in range(500):
        assert routes[evs.next()] != 0
    plain = EVSet(list(range(3000, 3000 + n)), planes, seed=5, routes=routes)
    for ev in range(n):
        if routes[ev] == 0:
            plain.deny(ev)
    got = [0, 0]
    for _ in range(6000):
        got[planes[plain.next()]] += 1
    assert got[0] == pytest.approx(3000, abs=60), got
