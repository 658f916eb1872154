"""The failover demo's figures (mrc/lab/failover/analysis.py) on synthetic series.

Each series is made so the answer can be read off it: a delivery curve with one known flat
stretch, an EV log with known retire and return times, plane events with known times, a fabric
whose capacities follow from its rate. Also the demo's cases (FAIL:HOW:HEAL), its verdict when a
link never heals, and its table. The demo itself (tests/fabric/test_failover_demo.py) checks the
same code on real runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from mrc.lab.fabric import FabricSpec, plan
from mrc.lab.failover.analysis import (
    analyse,
    bytes_at,
    capacities,
    expected_rate,
    gaps,
    longest_low,
    max_stall,
    plane_capacity,
    rate_between,
    recovery,
    resurrection,
    series,
    side_channel,
)
from mrc.lab.failover.demo import MATRIX, Case, parse_case, passed, plot_path
from mrc.lab.failover.report import case_title, table

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


# ---- issue 37: cases that never heal, time to recover, the side channel's plane -------------


def test_recovery_is_the_first_half_second_back_at_the_level() -> None:
    t, v = steady_with_outage(n=2000)  # 8 Mbit/s, nothing from 0.4 to 0.6 s
    assert recovery(t, v, 0.4, 1.999, 4e6) == pytest.approx(0.2, abs=0.002)
    assert recovery(t, v, 0.2, 1.999, 4e6) == pytest.approx(0.4, abs=0.002)  # (after the stall)
    assert recovery(t, v, 0.1, 0.39, 4e6) == 0.0  # never below: recovered at once
    assert recovery(t, v, 0.4, 1.999, 0.0) == 0.0  # nothing expected: nothing to recover
    assert recovery(t, v, 0.4, 1.999, 9e6) is None  # never back at a level above the rate


def test_recovery_takes_the_first_arrival_of_a_series_sampled_per_recv() -> None:
    # TCP: samples only when bytes arrive; 1 s of silence, then 10 ms recvs at 8 Mbit/s
    t = [0.0, 0.01, 0.02] + [1.02 + i / 100 for i in range(100)]
    v = [10_000 * (i + 1) for i in range(len(t))]
    assert recovery(t, v, 0.02, t[-1], 4e6) == pytest.approx(1.0)
    # a transfer that ends before half a second is back counts from at least one bin
    assert recovery(t[:15], v[:15], 0.02, t[14], 4e6) == pytest.approx(1.0)
    assert recovery(t[:5], v[:5], 0.02, t[4], 4e6) is None  # not even a whole bin back


def test_expected_rate_scales_by_the_capacity_left() -> None:
    assert expected_rate(800e6, (800e6, 600e6)) == pytest.approx(600e6)
    assert expected_rate(200e6, (200e6, 0.0)) == 200e6  # nothing left: only a heal helps
    assert expected_rate(None, (1.0, 1.0)) is None


def test_resurrection_without_a_heal() -> None:
    events = [event(1.005, 1, 1, "p1s0", "ASSUMED_BAD"), event(2.1, 1, 1, "p1s0", "GOOD")]
    got = resurrection(events, None, 1, 1.0, None)
    assert got["evs_failed"] == 1 and got["evs_back"] == 0 and got["still_bad"] == [1]
    assert got["resurrection_s"] is None and got["resurrection_first_s"] is None


def plane_event(t: float, plane: int, what: str, layer: str) -> dict[str, object]:
    return {"t": t, "plane": plane, "event": what, "layer": layer, "why": "test"}


def test_side_channel_on_the_failed_plane_lost_and_back() -> None:
    send = {
        "side_channel": {"setup_plane": 1, "planes_at_end": [0, 1]},
        "plane_events": [
            plane_event(10.6, 1, "lost", "data"),
            plane_event(14.2, 1, "lost", "side_channel"),
            plane_event(16.4, 1, "back", "side_channel"),
            plane_event(16.1, 1, "back", "data"),
        ],
    }
    recv = {
        "side_channel": {"setup_plane": 1},
        "plane_events": [
            plane_event(10.55, 1, "lost", "data"),
            plane_event(13.9, 1, "lost", "side_channel"),
            plane_event(9.0, 1, "lost", "side_channel"),  # before the failure: not its doing
            plane_event(12.0, 0, "lost", "side_channel"),  # another plane
        ],
    }
    got = side_channel(send, recv, 1, 9.5, 10.5, 16.0)
    assert got["setup_plane"] == 1 and got["setup_plane_receiver"] == 1
    assert got["on_failed_plane"] is True
    assert got["lost_after_s"] == pytest.approx(3.4)  # the receiver's, first
    assert got["back_after_heal_s"] == pytest.approx(0.4)
    assert got["data_lost_after_s"] == pytest.approx(0.05)
    assert got["data_back_after_heal_s"] == pytest.approx(0.1)
    assert got["planes_at_end"] == [0, 1]
    ts = [e["t_s"] for e in got["events"]]
    assert ts == sorted(ts) and len(ts) == 8 and got["events"][0]["end"] == "receiver"
    never = side_channel(send, recv, 1, 9.5, 10.5, None)
    assert never["back_after_heal_s"] is None and never["data_back_after_heal_s"] is None
    other = side_channel({"side_channel": {"setup_plane": 0}}, {}, 1, 0.0, 1.0, None)
    assert other["on_failed_plane"] is False and other["lost_after_s"] is None
    assert other["events"] == []


def test_analyse_a_tcp_run_that_never_healed() -> None:
    """TCP pinned to a plane lost for good: it gave up at its deadline, with what it moved."""
    t = [i / 100 for i in range(1, 101)]  # 1 s at 8 Mbit/s, then nothing
    v = [10_000 * (i + 1) for i in range(100)]
    recv = {
        "ok": False,
        "finished": False,
        "sha256": "prefix",
        "bytes": v[-1],
        "t_done": 21.0,
        "samples": {"t": t, "placed": v, "inorder": v},
    }
    send = {"ok": False, "finished": False, "bytes_sent": 3_000_000}
    ctx = {"capacity": {"tcp": (8e6, 0.0)}, "failed_plane": 1}
    out = analyse("tcp", recv, send, 0.0, 1.0, None, "all", ctx)
    assert not out["ok"] and not out["finished"] and not out["sha256_match"]
    assert out["bytes"] == 1_000_000 and out["bytes_sent"] == 3_000_000
    assert out["goodput_after_bps"] is None and out["finished_before_heal"] is None
    assert out["goodput_during_bps"] == 0
    assert out["max_stall_in_failure_ms"] == pytest.approx(20_000.0)  # up to its giving up
    assert out["recovery_ms"] is None  # never
    assert "side_channel" not in out


def test_analyse_an_mrc_run_whose_set_up_plane_failed_for_good() -> None:
    t, v = steady_with_outage(n=2000)
    recv = {
        "ok": True,
        "finished": True,
        "sha256": "ab",
        "bytes": v[-1],
        "t_done": t[-1],
        "samples": {"t": t, "placed": v, "inorder": v},
        "stats": {"duplicates": 0},
        "evs": {},
        "side_channel": {"setup_plane": 1, "planes_at_end": [0]},
        "plane_events": [plane_event(0.45, 1, "lost", "side_channel")],
    }
    send = {
        "ok": True,
        "finished": True,
        "evs": {"evs_assumed_bad": 64, "evs_resurrected": 0, "planes_lost": 1},
        "ev_events": [event(0.41, 1, 1, "p1s0", "ASSUMED_BAD")],
        "stats": {},
        "side_channel": {"setup_plane": 1, "planes_at_end": [0]},
        "plane_events": [plane_event(0.41, 1, "lost", "data")],
        "errors": [],
    }
    ctx = {"capacity": {"mrc": (16e6, 8e6)}, "failed_plane": 1, "failed_plane_all": 1}
    out = analyse("mrc", recv, send, 0.0, 0.4, None, "ab", ctx)
    assert out["ok"] and out["finished"] and out["sha256_match"]
    assert out["resurrection_s"] is None and out["failed_link_evs"]["still_bad"] == [1]
    assert out["recovery_ms"] == pytest.approx(200.0, abs=2)  # back at 8 Mbit/s >= 4 / 2
    sc = out["side_channel"]
    assert sc["on_failed_plane"] and sc["lost_after_s"] == pytest.approx(0.05)
    assert "errors" not in out  # none reported


# ---- the cases and the verdict (mrc/lab/failover/demo.py) -------------------------------------


def test_cases_parse_from_fail_how_heal() -> None:
    assert parse_case("recv-nic:blackhole:never", 1, 3.0) == Case(
        ("h3", "p1l1"), "blackhole", None, "recv-nic"
    )
    got = parse_case("nic", 2, 3.0)
    assert got == Case(("h0", "p2l0"), "down", 3.0, "nic") and got.label == "nic:down:heal"
    assert parse_case("spine:blackhole", 1, 4.0).heal_at == 4.0
    for bad in ("disk", "nic:cut", "nic:down:later", "nic:down:never:x"):
        with pytest.raises(ValueError):
            parse_case(bad, 1, 3.0)
    assert len(MATRIX) == 8 and len({parse_case(c, 1, 3.0) for c in MATRIX}) == 8
    assert plot_path("out/f.png", got, False) == "out/f.png"
    assert plot_path("out/f.png", got, True) == "out/f-nic-down-heal.png"


def test_a_case_that_never_heals_needs_only_mrc_to_finish() -> None:
    good = {"ok": True, "sha256_match": True, "finished": True, "expected_to_finish": True}
    stuck = {"ok": False, "sha256_match": False, "finished": False, "expected_to_finish": False}
    names = ["mrc", "tcp", "mptcp"]
    assert passed({"mrc": good, "tcp": stuck, "mptcp": good}, names)
    assert passed({"mrc": good, "tcp": stuck, "mptcp": stuck}, names)  # MPTCP: reported
    assert not passed({"mrc": {**good, "ok": False}, "tcp": stuck, "mptcp": good}, names)
    crashed = {**stuck, "error": "tcp: helper failed"}
    assert not passed({"mrc": good, "tcp": crashed, "mptcp": good}, names)
    corrupt = {**stuck, "finished": True}  # all there, but other data than was sent
    assert not passed({"mrc": good, "tcp": corrupt, "mptcp": good}, names)
    healed = {**stuck, "expected_to_finish": True}
    assert not passed({"mrc": good, "tcp": healed, "mptcp": good}, names)


def test_the_table_says_what_failed_and_what_finished() -> None:
    case: dict[str, Any] = {
        "link": ["h3", "p1l1"],
        "fail": "recv-nic",
        "how": "blackhole",
        "fail_at_s": 1.5,
        "heal_at_s": None,
        "setup_plane": 1,
        "setup_on_failed_plane": True,
        "mrc": {
            "ok": True,
            "sha256_match": True,
            "finished": True,
            "recovery_ms": 120.0,
            "side_channel": {"setup_plane": 1, "lost_after_s": 4.1, "back_after_heal_s": None},
        },
        "tcp": {"ok": False, "sha256_match": False, "finished": False, "bytes": 37_000_000},
    }
    title = case_title(case)
    assert "recv-nic (h3-p1l1) blackholed at 1.5 s, never healed" in title
    assert "plane 1 (the failed plane)" in title
    text = table(case)
    assert "NO (37 MB moved)" in text and "never" in text and "120 ms" in text
    assert "what moved: yes" in table({**case, "tcp": {**case["tcp"], "moved_sha256_match": True}})
    assert "plane 1, lost +4.1 s" in text
