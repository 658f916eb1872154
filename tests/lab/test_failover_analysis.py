"""The failover demo's figures (mrc/lab/failover/analysis.py) on synthetic series.

Each series is made so the answer can be read off it: a delivery curve with one known flat
stretch, an EV log with known retire and return times, a fabric whose capacities follow from
its rate. The demo itself (tests/fabric/test_failover_demo.py) checks the same code on real runs.
"""

from __future__ import annotations

import pytest

from mrc.lab.fabric import FabricSpec, plan
from mrc.lab.failover.analysis import (
    analyse,
    bytes_at,
    capacities,
    gaps,
    longest_low,
    max_stall,
    plane_capacity,
    rate_between,
    resurrection,
    series,
)

T = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
V = [0, 10, 10, 10, 20, 30]


def steady_with_outage(
    rate_per_ms: int = 1000, stall: tuple[int, int] = (400, 600), n: int = 1000
) -> tuple[list[float], list[int]]:
    """A sample every ms delivering ``rate_per_ms`` bytes, nothing from ms stall[0] to
    stall[1]."""
    t, v, total = [], [], 0
    for i in range(n):
        if not stall[0] <= i < stall[1]:
            total += rate_per_ms
        t.append(i / 1000)
        v.append(total)
    return t, v


def test_gaps_run_from_one_increase_to_the_next() -> None:
    assert gaps(T, V, 0.0, 5.0) == [(0.0, 1.0), (1.0, 4.0), (4.0, 5.0)]
    assert gaps(T, V, 1.5, 5.0) == [(4.0, 5.0)]  # the window starts on the flat stretch


def test_max_stall_and_the_one_overlapping_the_failure() -> None:
    assert max_stall(T, V, 0.0, 5.0) == (3.0, 1.0)
    assert max_stall(T, V, 0.0, 5.0, overlapping=(4.5, 6.0)) == (1.0, 4.0)
    assert max_stall(T, [5] * len(T), 0.0, 5.0) == (0.0, 0.0)  # never moved: no gap at all


def test_bytes_at_takes_the_last_sample_at_or_before() -> None:
    assert bytes_at(T, V, 2.5) == 10
    assert bytes_at(T, V, 4.0) == 20
    assert bytes_at(T, V, -1.0) == 0  # before the first sample: the first sample's count
    assert bytes_at([], [], 1.0) == 0


def test_rate_between_in_bits_per_second() -> None:
    assert rate_between(T, V, 0.0, 4.0) == 20 * 8 / 4
    assert rate_between(T, V, 1.0, 1.04) is None  # too short to say


def test_longest_low_finds_the_outage() -> None:
    t, v = steady_with_outage()
    rate = 1000 * 8 * 1000  # bit/s of the steady part
    assert longest_low(t, v, 0.0, 0.999, rate / 2) == pytest.approx(0.2, abs=0.021)
    assert longest_low(t, v, 0.0, 0.39, rate / 2) == 0.0


def test_series_bins_goodput_in_mbit() -> None:
    t, v = steady_with_outage()
    xs, ys = series(t, v, 0.0, 0.1)
    assert xs[0] == pytest.approx(0.05) and ys[0] == pytest.approx(8.0)
    assert ys[4] == 0.0  # 0.4-0.5 s: the outage
    assert series([], [], 0.0, 0.1) == ([], [])


def event(t: float, ev: int, plane: int, route: str, new: str) -> list[object]:
    return [t, ev, 40000 + ev, plane, route, "GOOD", new, "test"]


def test_resurrection_of_a_spine_links_evs() -> None:
    fail, heal = 1.0, 2.0
    events = [
        event(1.005, 1, 1, "p1s0", "ASSUMED_BAD"),
        event(1.010, 2, 1, "p1s0", "ASSUMED_BAD"),
        event(1.020, 3, 1, "p1s1", "ASSUMED_BAD"),  # another route: not the failed link's
        event(2.100, 1, 1, "p1s0", "GOOD"),
        event(2.300, 2, 1, "p1s0", "GOOD (probed)"),
    ]
    got = resurrection(events, {(1, "p1s0")}, None, fail, heal)
    assert got == {
        "evs_failed": 2,
        "evs_back": 2,
        "still_bad": [],
        "detect_s": 0.005,
        "resurrection_s": 0.3,
        "resurrection_first_s": 0.1,
    }
    stuck = resurrection(events[:4], {(1, "p1s0")}, None, fail, heal)
    assert stuck["still_bad"] == [2] and stuck["resurrection_s"] is None
    plane = resurrection(events, None, 1, fail, heal)  # a NIC link: every EV of the plane
    assert plane["evs_failed"] == 3 and plane["still_bad"] == [3]


def test_capacities_of_a_two_plane_fabric() -> None:
    topo = plan(FabricSpec(name="cap", planes=2, rate="100mbit"))
    assert plane_capacity(topo, None, "h0", "h3") == [100e6, 100e6]
    # the other spine of plane 1 still carries a full link's rate
    assert plane_capacity(topo, ("p1l1", "p1s0"), "h0", "h3") == [100e6, 100e6]
    assert plane_capacity(topo, ("h0", "p1l0"), "h0", "h3") == [100e6, 0.0]
    caps = capacities(topo, ("p1l1", "p1s0"), 1, "h0", "h3")
    assert caps == {"mrc": (200e6, 200e6), "mptcp": (200e6, 100e6), "tcp": (100e6, 0.0)}


def test_analyse_one_mrc_run() -> None:
    t, v = steady_with_outage(n=2000)
    recv = {
        "ok": True,
        "sha256": "ab",
        "bytes": v[-1],
        "t_done": t[-1],
        "samples": {"t": t, "placed": v, "inorder": v},
        "stats": {"duplicates": 0},
        "evs": 128,
    }
    send = {
        "ok": True,
        "evs": {"evs_assumed_bad": 2, "evs_resurrected": 2, "planes_lost": 0},
        "ev_events": [event(0.41, 1, 1, "p1s0", "ASSUMED_BAD"), event(1.2, 1, 1, "p1s0", "GOOD")],
        "stats": {"retransmits": 3, "retransmits_sack": 2, "retransmits_timeout": 1, "srtt": 0.002},
    }
    ctx = {"capacity": {"mrc": (16e6, 8e6)}, "failed_routes": {(1, "p1s0")}}
    out = analyse("mrc", recv, send, 0.0, 0.4, 1.0, "ab", ctx)
    assert out["ok"] and out["sha256_match"]
    assert out["max_stall_ms"] == pytest.approx(201.0) and out["max_stall_at_s"] == 0.399
    assert out["max_stall_in_failure_ms"] == out["max_stall_ms"]
    assert out["max_stall_outside_failure_ms"] == pytest.approx(1.0)  # the steady samples'
    assert out["goodput_before_bps"] == 7_980_000  # from the first sample, which had 1000
    assert out["goodput_after_bps"] == 8_000_000
    assert out["during_vs_capacity"] == pytest.approx(out["goodput_during_bps"] / 8e6, abs=1e-3)
    assert out["resurrection_s"] == 0.2 and out["failed_link_evs"]["detect_s"] == 0.01
    assert out["srtt_ms"] == 2.0 and out["sampler_max_gap_ms"] == 1.0
    wrong = analyse("mrc", recv, send, 0.0, 0.4, 1.0, "cd", ctx)
    assert not wrong["ok"] and not wrong["sha256_match"]
