"""The RTT estimator on its own: first sample, smoothing, RTO bounds, backoff (RFC 6298)."""

from __future__ import annotations

import pytest

from mrc.core.rtt import RttEstimator


def _est(initial: float = 0.1, lo: float = 0.05, hi: float = 1.0) -> RttEstimator:
    return RttEstimator(initial_rto=initial, min_rto=lo, max_rto=hi)


def test_before_any_sample_the_rto_is_the_initial_one() -> None:
    rtt = _est(initial=0.1)
    assert rtt.srtt is None
    assert rtt.rto == 0.1
    assert rtt.backed_off(0) == 0.1


def test_first_sample_sets_srtt_and_half_of_it_as_variation() -> None:
    rtt = _est(lo=0.001)
    rtt.sample(0.02)
    assert rtt.srtt == 0.02
    assert rtt.rttvar == 0.01
    assert rtt.rto == pytest.approx(0.02 + 4 * 0.01)


def test_later_samples_are_smoothed() -> None:
    rtt = _est(lo=0.001)
    rtt.sample(0.02)
    rtt.sample(0.04)
    # rttvar = 3/4 * 0.01 + 1/4 * |0.02 - 0.04|, then srtt = 7/8 * 0.02 + 1/8 * 0.04
    assert rtt.rttvar == pytest.approx(0.0125)
    assert rtt.srtt == pytest.approx(0.0225)
    assert rtt.rto == pytest.approx(0.0225 + 4 * 0.0125)


def test_a_steady_rtt_converges_and_the_variation_decays() -> None:
    rtt = _est(lo=0.0001)
    for _ in range(200):
        rtt.sample(0.005)
    assert rtt.srtt == pytest.approx(0.005)
    assert rtt.rttvar == pytest.approx(0.0, abs=1e-9)
    assert rtt.rto == pytest.approx(0.005, rel=1e-6)


def test_one_outlier_moves_srtt_by_an_eighth() -> None:
    rtt = _est(lo=0.0001)
    for _ in range(200):
        rtt.sample(0.01)
    rtt.sample(0.09)
    assert rtt.srtt == pytest.approx(0.01 + (0.09 - 0.01) / 8)


def test_negative_samples_are_ignored() -> None:
    rtt = _est()
    rtt.sample(-0.001)
    assert rtt.srtt is None and rtt.rto == 0.1
    rtt.sample(0.02)
    before = (rtt.srtt, rtt.rttvar, rtt.rto)
    rtt.sample(-1.0)
    assert (rtt.srtt, rtt.rttvar, rtt.rto) == before


def test_zero_is_a_valid_sample() -> None:
    rtt = _est()
    rtt.sample(0.0)
    assert rtt.srtt == 0.0 and rtt.rto == 0.05  # clamped up to min_rto


def test_rto_is_clamped_to_its_bounds() -> None:
    low = _est(lo=0.05, hi=1.0)
    low.sample(0.001)  # srtt + 4 rttvar = 3 ms
    assert low.rto == 0.05
    high = _est(lo=0.05, hi=1.0)
    high.sample(0.5)  # 0.5 + 4 * 0.25 = 1.5 s
    assert high.rto == 1.0


def test_backoff_doubles_per_timeout_up_to_max_rto() -> None:
    rtt = _est(lo=0.05, hi=1.0)
    rtt.sample(0.02)  # rto = 0.02 + 0.04 = 0.06
    assert [rtt.backed_off(n) for n in range(6)] == pytest.approx(
        [0.06, 0.12, 0.24, 0.48, 0.96, 1.0]
    )
    assert rtt.backed_off(40) == 1.0  # no overflow trouble with many timeouts


def test_backoff_follows_the_current_rto() -> None:
    rtt = _est(lo=0.001, hi=1.0)
    rtt.sample(0.01)
    first = rtt.backed_off(2)
    for _ in range(50):
        rtt.sample(0.001)
    assert rtt.backed_off(2) < first
    assert rtt.backed_off(2) == pytest.approx(4 * rtt.rto)
