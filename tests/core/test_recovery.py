"""SACK-based loss detection (mrc.core.recovery.LossDetector) on explicit send times.

Times are seconds; the reordering window is max(reorder_min, srtt x fraction) within a plane
and twice that across planes. Plane p's EVs here are simply EV p (``PLANE_OF``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mrc.core.recovery import LossDetector

INF = float("inf")
NEG_INF = float("-inf")
PLANE_OF = [0, 1, 2, 3]  # EV i is on plane i
W = 0.002  # the window with reorder_min 2 ms and no srtt


@dataclass
class Pkt:
    ev: int
    sent_at: float
    deadline: float = 1e9  # armed; INF means already queued for a resend
    retransmitted: bool = False


def _detector() -> LossDetector:
    return LossDetector(reorder_min=W, reorder_srtt_fraction=0.5)


def _lost(
    det: LossDetector,
    flight: dict[int, Pkt],
    delivered: list[float],
    srtt: float | None = None,
) -> list[int]:
    return [seq for seq, _pkt, _blame in det.detect(flight, srtt, PLANE_OF, delivered)]


def test_window_is_a_fraction_of_srtt_but_at_least_reorder_min() -> None:
    det = _detector()
    assert det.window(None) == W
    assert det.window(0.0) == W
    assert det.window(0.001) == W  # 0.5 ms < 2 ms
    assert det.window(0.010) == pytest.approx(0.005)


def test_the_rack_point_only_moves_forward() -> None:
    det = _detector()
    assert det.latest == 0.0
    assert not det.advance(0.0)  # nothing sent at or before the start is news
    assert det.advance(1.0)
    assert not det.advance(0.5)
    assert not det.advance(1.0)
    assert det.advance(1.001)
    assert det.latest == 1.001


def test_same_plane_evidence_needs_one_window() -> None:
    det = _detector()
    # one packet per ms on plane 0; the one sent at 1.010 arrived
    flight = {i: Pkt(0, 1.0 + i / 1000) for i in range(10)}
    det.advance(1.010)
    delivered = [1.010, NEG_INF, NEG_INF, NEG_INF]
    # lost: sent before 1.010 - 2 ms
    assert _lost(det, flight, delivered) == [0, 1, 2, 3, 4, 5, 6, 7]


def test_cross_plane_evidence_needs_two_windows() -> None:
    det = _detector()
    # packets of plane 1, while only plane 0 delivered (at 1.010)
    flight = {i: Pkt(1, 1.0 + i / 1000) for i in range(10)}
    det.advance(1.010)
    delivered = [1.010, NEG_INF, NEG_INF, NEG_INF]
    assert _lost(det, flight, delivered) == [0, 1, 2, 3, 4, 5]  # before 1.010 - 4 ms


def test_a_plane_that_delivered_recently_gets_the_tight_window() -> None:
    det = _detector()
    flight = {i: Pkt(1, 1.0 + i / 1000) for i in range(10)}
    det.advance(1.010)
    # plane 1 itself delivered a packet sent at 1.010: its own order is nearly FIFO, so one
    # window of its own delivery is enough
    assert _lost(det, flight, [1.010, 1.010, NEG_INF, NEG_INF]) == [0, 1, 2, 3, 4, 5, 6, 7]
    # its latest delivery is older (1.009): lost if sent before 1.009 - 2 ms
    assert _lost(det, flight, [1.010, 1.009, NEG_INF, NEG_INF]) == [0, 1, 2, 3, 4, 5, 6]


def test_the_srtt_widens_the_window() -> None:
    det = _detector()
    flight = {i: Pkt(0, 1.0 + i / 1000) for i in range(20)}
    det.advance(1.020)
    delivered = [1.020, NEG_INF, NEG_INF, NEG_INF]
    # srtt 12 ms -> window 6 ms: lost if sent before 1.014
    assert _lost(det, flight, delivered, srtt=0.012) == list(range(14))


def test_nothing_is_lost_before_the_rack_point_moves_past_the_window() -> None:
    det = _detector()
    flight = {0: Pkt(0, 1.000), 1: Pkt(0, 1.001)}
    det.advance(1.002)  # only 1-2 ms later: within the reordering window
    assert _lost(det, flight, [1.002, NEG_INF, NEG_INF, NEG_INF]) == []


def test_packets_already_queued_for_a_resend_are_skipped() -> None:
    det = _detector()
    flight = {0: Pkt(0, 1.000, deadline=INF), 1: Pkt(0, 1.001)}
    det.advance(1.010)
    assert _lost(det, flight, [1.010, NEG_INF, NEG_INF, NEG_INF]) == [1]


def test_scan_stops_at_the_first_recent_first_transmission() -> None:
    det = _detector()
    flight = {
        0: Pkt(0, 1.000),
        1: Pkt(0, 1.009, retransmitted=True),  # resent recently: skipped, scan goes on
        2: Pkt(0, 1.001),
        3: Pkt(0, 1.009),  # first transmission within the window: nothing after can qualify
        4: Pkt(0, 1.000, retransmitted=True),  # (not reached)
    }
    det.advance(1.010)
    assert _lost(det, flight, [1.010, NEG_INF, NEG_INF, NEG_INF]) == [0, 2]


def test_a_loss_is_blamed_only_with_news_from_its_own_block() -> None:
    det = _detector()
    # seq 5 (block 0) and seq 70 (block 1), both sent at 1.000
    flight = {5: Pkt(0, 1.000), 70: Pkt(0, 1.000)}
    det.advance(1.010)
    delivered = [1.010, NEG_INF, NEG_INF, NEG_INF]
    # no SACK about either block: resent, but nobody is blamed (it may be a lost SACK)
    assert [b for _s, _p, b in det.detect(flight, None, PLANE_OF, delivered)] == [False, False]
    # the receiver reported on block 0 after receiving a packet sent a window after seq 5
    det.block_reported(0, 1.000 + W, una=0)
    assert [(s, b) for s, _p, b in det.detect(flight, None, PLANE_OF, delivered)] == [
        (5, True),
        (70, False),
    ]


def test_news_sent_less_than_a_window_later_blames_nobody() -> None:
    det = _detector()
    flight = {5: Pkt(0, 1.000)}
    det.advance(1.010)
    det.block_reported(0, 1.001, una=0)
    assert det.detect(flight, None, PLANE_OF, [1.010, NEG_INF, NEG_INF, NEG_INF])[0][2] is False


def test_block_news_keeps_the_latest_subject() -> None:
    det = _detector()
    flight = {5: Pkt(0, 1.000)}
    det.advance(1.010)
    det.block_reported(0, 1.005, una=0)
    det.block_reported(0, 1.0005, una=0)  # an older report arriving late changes nothing
    assert det.detect(flight, None, PLANE_OF, [1.010, NEG_INF, NEG_INF, NEG_INF])[0][2] is True


def test_block_news_is_pruned_below_the_cumulative_point() -> None:
    det = _detector()
    for block in range(1025):
        det.block_reported(block, 1.0, una=0)  # una 0: nothing to prune yet
    det.block_reported(1025, 1.0, una=1000 * 64)
    flight = {999 * 64: Pkt(0, 0.5), 1000 * 64: Pkt(0, 0.5)}
    det.advance(1.010)
    blamed = {s: b for s, _p, b in det.detect(flight, None, PLANE_OF, [1.010] + [NEG_INF] * 3)}
    assert blamed == {999 * 64: False, 1000 * 64: True}


def test_subject_send_time_is_remembered_for_the_sacks_of_one_flush() -> None:
    det = _detector()
    assert det.subject_sent_at(7, None) is None  # unknown subject: no timing news
    assert det.subject_sent_at(7, 1.25) == 1.25  # in flight: its own send time
    assert det.subject_sent_at(7, None) == 1.25  # acknowledged by the first SACK of the flush
    assert det.subject_sent_at(8, None) is None
    assert det.subject_sent_at(9, 1.5) == 1.5
    assert det.subject_sent_at(7, None) is None  # only the latest subject is remembered


def test_detect_on_an_empty_flight() -> None:
    det = _detector()
    det.advance(5.0)
    assert det.detect({}, 0.01, PLANE_OF, [5.0, NEG_INF, NEG_INF, NEG_INF]) == []
