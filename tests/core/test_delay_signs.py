"""Congestion without marks: a loss after its plane's queueing delay rose is congestion, unless
the path keeps losing (mrc.core.delaysigns, docs/EV_HEALTH.md "Congestion without marks").

The rules on an EVSet alone, with explicit times; the simulator's incast without marks is in
tests/core/test_ecn_steering.py."""

from __future__ import annotations

from typing import Any

import pytest

from mrc.core.config import EVConfig
from mrc.core.delaysigns import ANSWERED_LOSSES, HELD_WINDOWS, LATE_LOSSES
from mrc.core.events import EVReason, EVState
from mrc.core.evset import EVSet

BASE = 0.001  # every plane's base RTT in these tests
DELAYED = BASE + 0.002  # a sample 2 ms over it: delay (over max(0.5 ms, 0.5 x base))
MEMORY = 0.01  # how far back before a send evidence counts (the requester's CE memory)
SPAN = 0.004  # an episode (the requester's reordering window)


def _state(evs: EVSet, ev: int) -> EVState:
    """``ev``'s state now, read through a call: mypy would keep ``evs.state[ev]`` narrowed to
    what an earlier assert saw across the calls that change it."""
    return evs.state[ev]


def _evs(routes: list[int] | None = None, **kw: Any) -> EVSet:
    """8 EVs on two planes (even: plane 0), routes as given; route fate off unless asked."""
    config = EVConfig(**{"route_dead_evs": 0, **kw})
    evs = EVSet(list(range(1000, 1008)), [0, 1] * 4, config=config, routes=routes)
    for plane in (0, 1):
        evs.delay.sample(plane, BASE, 0.5)
    return evs


def _lose(evs: EVSet, ev: int, sent: float, now: float) -> None:
    evs.lost(
        ev, now, EVReason.SACK_LOSS, sent_at=sent, congestion_since=sent - MEMORY, episode=SPAN
    )


def test_a_loss_after_the_delay_rose_is_congestion() -> None:
    evs = _evs()
    evs.delay.sample(0, DELAYED, 1.0)
    _lose(evs, 2, 1.001, 1.004)
    assert _state(evs, 2) == EVState.GOOD and evs.losses_delayed == 1
    assert evs.delay.samples == 1


def test_a_small_rise_is_no_delay_and_the_held_loss_is_then_a_failure() -> None:
    evs = _evs()
    evs.delay.sample(0, BASE + 0.0004, 1.0)  # under the 0.5 ms floor: no evidence
    assert evs.delay.samples == 0
    _lose(evs, 2, 1.001, 1.004)
    # held for an episode: the ACKs of what was queued ahead of a tail drop come later
    assert _state(evs, 2) == EVState.GOOD and evs.held_next == pytest.approx(1.004 + SPAN)
    evs.judge_held(1.005)  # not due yet
    assert _state(evs, 2) == EVState.GOOD
    evs.judge_held(1.004 + SPAN)
    assert _state(evs, 2) == EVState.ASSUMED_BAD and evs.losses_delayed == 0
    assert evs.held_next == float("inf")


def test_delay_shown_while_a_loss_is_held_excuses_it() -> None:
    evs = _evs()
    _lose(evs, 2, 1.001, 1.004)
    evs.delay.sample(0, DELAYED, 1.006)  # the queue ahead of the drop drains
    evs.judge_held(1.01)
    assert _state(evs, 2) == EVState.GOOD and evs.losses_delayed == 1


def test_delay_on_the_other_plane_excuses_nothing() -> None:
    evs = _evs()
    evs.delay.sample(1, DELAYED, 1.0)
    _lose(evs, 2, 1.001, 1.004)
    evs.judge_held(1.01)
    assert _state(evs, 2) == EVState.ASSUMED_BAD


def test_a_route_that_keeps_losing_is_a_failure_despite_the_delay() -> None:
    # EV 0 and 4: plane 0, route 0 (a plane whose other routes deliver: its streak is not
    # what this test is about)
    evs = _evs(routes=[0, 0, 1, 1, 0, 0, 1, 1], plane_dead_losses=100)
    evs.delay.sample(0, DELAYED, 1.0)
    _lose(evs, 0, 1.001, 1.004)  # the episode's first loss
    _lose(evs, 4, 1.003, 1.006)  # within the episode: one tail drop
    assert _state(evs, 0) == EVState.GOOD and _state(evs, 4) == EVState.GOOD
    evs.delay.sample(0, DELAYED, 1.01)
    # later, nothing delivered since: a queue that stays full, or a dead route; the first
    # LATE_LOSSES sends are given the benefit of the doubt (a burst's packets are one send)
    late = [1.001 + SPAN + 0.001 * (k + 1) for k in range(LATE_LOSSES)]
    for sent in late:
        _lose(evs, 4, sent, 1.012)
        _lose(evs, 0, sent, 1.012)  # the same send (a burst): not counted again
    assert _state(evs, 0) == _state(evs, 4) == EVState.GOOD
    _lose(evs, 4, late[-1] + 0.001, 1.013)  # one more: the route keeps losing, it is dead
    assert _state(evs, 4) == EVState.ASSUMED_BAD
    assert evs.losses_delayed == 2 + 2 * LATE_LOSSES


def test_a_route_that_delivered_since_begins_a_new_episode() -> None:
    evs = _evs(routes=[0, 0, 1, 1, 0, 0, 1, 1])
    evs.delay.sample(0, DELAYED, 1.0)
    _lose(evs, 0, 1.001, 1.004)
    evs.route_alive_sent[evs.route_ix[0]] = 1.002  # a packet sent after the loss arrived
    evs.delay.sample(0, DELAYED, 1.01)
    _lose(evs, 4, 1.009, 1.012)
    assert _state(evs, 4) == EVState.GOOD and evs.losses_delayed == 2


def test_without_known_routes_each_ev_is_its_own_path() -> None:
    evs = _evs()
    evs.delay.sample(0, DELAYED, 1.0)
    _lose(evs, 0, 1.001, 1.004)
    _lose(evs, 2, 1.001 + SPAN + 0.001, 1.008)  # another EV: its own first loss
    assert _state(evs, 0) == _state(evs, 2) == EVState.GOOD
    for k in range(LATE_LOSSES + 1):  # EV 0 again and again, nothing delivered
        assert _state(evs, 0) == EVState.GOOD
        _lose(evs, 0, 1.001 + SPAN + 0.002 + 0.001 * k, 1.009)
    assert _state(evs, 0) == EVState.ASSUMED_BAD
    assert _state(evs, 2) == EVState.GOOD


def test_off_every_loss_without_a_mark_is_a_failure_at_once() -> None:
    evs = _evs(delay_evidence_min=0.0, delay_evidence_fraction=0.0)
    evs.delay.sample(0, DELAYED, 1.0)
    _lose(evs, 2, 1.001, 1.004)
    assert _state(evs, 2) == EVState.ASSUMED_BAD and evs.losses_delayed == 0


def test_a_lost_ack_begins_an_episode_and_a_reverse_path_that_keeps_losing_retires() -> None:
    evs = _evs()
    evs.ack_lost(2, 1.0, 0.01)
    assert _state(evs, 2) == EVState.GOOD and evs.losses_delayed == 1
    evs.ack_lost(2, 1.005, 0.01)  # the same episode
    assert _state(evs, 2) == EVState.GOOD
    evs.path_answered(2, 1.006)  # a reverse probe on it came back: it works
    evs.ack_lost(2, 1.02, 0.01)  # a new episode
    assert _state(evs, 2) == EVState.GOOD and evs.losses_delayed == 3
    evs.ack_lost(2, 1.031, 0.01)  # 11 ms on, nothing answered: dead
    assert _state(evs, 2) == EVState.ASSUMED_BAD


def test_the_knobs_are_checked() -> None:
    with pytest.raises(ValueError, match="delay_evidence_min"):
        EVConfig(delay_evidence_min=-1).validate()
    with pytest.raises(ValueError, match="delay_evidence_fraction"):
        EVConfig(delay_evidence_fraction=1000).validate()


# ---- a route compared with its siblings (the plane's other routes) ---------------------
# EVs 0 and 4: plane 0, route 0; EVs 2 and 6: plane 0, route 1 (its sibling)
ROUTES = [0, 0, 1, 1, 0, 0, 1, 1]


def test_a_loss_while_a_sibling_route_loses_too_is_congestion_without_delay() -> None:
    """A queue every route of the plane shares (the last hop) drops what arrives while it is
    full, whatever its route; where it stayed full since the QP began, no delay rise shows."""
    evs = _evs(routes=ROUTES, plane_dead_losses=100)
    _lose(evs, 0, 1.001, 1.004)  # no evidence yet: held
    assert evs.held_next == pytest.approx(1.004 + SPAN)
    _lose(evs, 2, 1.002, 1.004)  # the sibling lost one sent in the same memory: congestion
    assert evs.losses_delayed == 1
    evs.judge_held(1.004 + SPAN)  # and the held one, judged, is congestion too
    assert _state(evs, 0) == _state(evs, 2) == EVState.GOOD and evs.losses_delayed == 2
    assert evs.delay.samples == 0


def test_a_route_that_loses_alone_twice_is_a_failure() -> None:
    """A dead route, its siblings well: retired once it lost a second packet, sent after the
    first, before the route delivered anything sent after that one."""
    evs = _evs(routes=ROUTES, plane_dead_losses=100)
    _lose(evs, 0, 1.001, 1.004)
    evs.route_alive_sent[evs.route_ix[2]] = 1.004  # the sibling delivers
    evs.judge_held(1.004 + SPAN)  # the route has neither delivered nor lost since: held on
    assert _state(evs, 0) == EVState.GOOD and evs.held_next == pytest.approx(1.004 + 2 * SPAN)
    _lose(evs, 4, 1.006, 1.01)  # its next send is lost too
    evs.judge_held(1.004 + 2 * SPAN)
    assert _state(evs, 0) == EVState.ASSUMED_BAD and evs.losses_delayed == 0
    evs.judge_held(1.01 + SPAN)  # the latest loss waits for the route's next packet
    assert _state(evs, 4) == EVState.GOOD
    _lose(evs, 4, 1.011, 1.015)
    evs.judge_held(1.01 + 2 * SPAN)
    assert _state(evs, 4) == EVState.ASSUMED_BAD


def test_a_single_tail_drop_is_forgiven_once_the_route_delivers_after_it() -> None:
    evs = _evs(routes=ROUTES)
    _lose(evs, 0, 1.001, 1.004)
    evs.judge_held(1.004 + SPAN)
    evs.route_alive_sent[evs.route_ix[4]] = 1.005  # the route's next send arrived
    evs.judge_held(1.004 + 2 * SPAN)
    assert _state(evs, 0) == EVState.GOOD and evs.losses_route_alive == 1
    assert evs.held_next == float("inf")


def test_a_held_loss_is_judged_at_last_when_the_route_stays_silent() -> None:
    """Nothing sent on the route since: judged after HELD_WINDOWS windows (or the memory)."""
    evs = _evs(routes=ROUTES)
    _lose(evs, 0, 1.001, 1.004)
    until = 1.004 + max(HELD_WINDOWS * SPAN, MEMORY)
    t = 1.004
    while evs.held_next < until:
        t = evs.held_next
        evs.judge_held(t)
        assert _state(evs, 0) == EVState.GOOD
    evs.judge_held(evs.held_next)
    assert _state(evs, 0) == EVState.ASSUMED_BAD and evs.held_next == float("inf")


def _sends_until_retired(sibling_every: int) -> int:
    """Route 0 dead, its plane delayed: route 0 loses every send, the sibling route one send
    in ``sibling_every`` (0: none). How many sends route 0 lost before an EV was retired."""
    evs = _evs(routes=ROUTES, plane_dead_losses=1000)
    for k in range(200):
        sent = 1.0 + 0.002 * k
        evs.delay.sample(0, DELAYED, sent)
        if sibling_every and k % sibling_every == 0:
            _lose(evs, 2, sent, sent + 0.003)
        _lose(evs, 0 if k % 2 else 4, sent, sent + 0.003)
        if EVState.ASSUMED_BAD in (_state(evs, 0), _state(evs, 4)):
            return k + 1
    return 200


def test_a_dead_route_whose_siblings_lose_too_is_still_retired_within_a_few_sends() -> None:
    """The allowance grows by the siblings' average losses since the episode began: a dead
    route loses all of its sends, its siblings their share, so it is found after about
    LATE_LOSSES / (1 - p) sends beyond the episode."""
    alone = _sends_until_retired(0)
    # as before: the episode's sends within its span, LATE_LOSSES more, and one
    assert alone == SPAN / 0.002 + LATE_LOSSES + 1
    half = _sends_until_retired(2)  # the siblings lose half of theirs
    assert alone < half <= alone + LATE_LOSSES + 2, (alone, half)
    # the siblings losing every send: a plane that loses everything, which its loss streak
    # takes down (plane_dead_losses), not the route rule
    assert _sends_until_retired(1) == 200


def test_a_held_loss_asks_its_route_once_and_an_answer_after_it_is_congestion() -> None:
    """No evidence either way: the loss asks its route (a probe on its EV, which the QP
    sends); the route answering a probe sent after the lost packet says it works, so the
    packet was a full queue's (the last hop tail-drops full packets, and a small probe still
    fits)."""
    evs = _evs(routes=ROUTES, plane_dead_losses=100)
    _lose(evs, 0, 1.001, 1.004)
    assert evs.asks == [0] and evs.routes_asked == 1
    evs.asks.clear()  # the QP sent the probe
    _lose(evs, 4, 1.002, 1.0045)  # the same route, its question still open: not asked again
    assert evs.asks == [] and evs.routes_asked == 1
    evs.route_answered(4, 1.0041)  # the probe, sent at 1.0041, came back
    evs.judge_held(1.0045 + SPAN)
    assert _state(evs, 0) == _state(evs, 4) == EVState.GOOD and evs.losses_delayed == 2
    assert evs.held_next == float("inf")
    assert evs.counters()["ev_routes_asked"] == 1


def test_an_answer_to_a_probe_sent_before_the_loss_excuses_nothing() -> None:
    evs = _evs(routes=ROUTES, plane_dead_losses=100)
    evs.route_answered(0, 1.0005)  # the route worked before the packet left
    _lose(evs, 0, 1.001, 1.004)
    until = 1.004 + max(HELD_WINDOWS * SPAN, MEMORY)
    while evs.held_next <= until:
        evs.judge_held(evs.held_next)
    assert _state(evs, 0) == EVState.ASSUMED_BAD and evs.losses_delayed == 0


def test_a_route_unasked_again_only_after_its_question_went_unanswered_for_the_hold() -> None:
    evs = _evs(routes=ROUTES, plane_dead_losses=100)
    _lose(evs, 0, 1.001, 1.004)
    evs.asks.clear()
    hold = max(HELD_WINDOWS * SPAN, MEMORY)
    _lose(evs, 4, 1.002, 1.004 + hold - 0.0001)  # the question is still fresh
    assert evs.asks == []
    _lose(evs, 4, 1.003, 1.004 + hold + 0.0001)  # unanswered for as long as a hold: ask again
    assert evs.asks == [4] and evs.routes_asked == 2


def test_an_unanswered_question_is_asked_once_more_while_the_loss_is_held() -> None:
    """A small probe fits a full queue far more often than a full packet, but not always: the
    loss asks again two windows on, still within its hold, so a dead route is retired no later
    than before."""
    evs = _evs(routes=ROUTES, plane_dead_losses=100)
    _lose(evs, 0, 1.001, 1.004)
    evs.asks.clear()
    evs.route_alive_sent[evs.route_ix[2]] = 1.004  # the sibling delivers
    evs.judge_held(1.004 + SPAN)  # asked a window ago: not yet
    assert evs.asks == []
    evs.judge_held(1.004 + 2 * SPAN)
    assert evs.asks == [0] and evs.routes_asked == 2
    evs.asks.clear()
    evs.judge_held(1.004 + 3 * SPAN)
    assert evs.asks == [] and _state(evs, 0) == EVState.GOOD
    evs.judge_held(1.004 + 4 * SPAN)  # unanswered: judged at the bound, as before
    assert _state(evs, 0) == EVState.ASSUMED_BAD and evs.held_next == float("inf")


def test_a_route_that_answers_probes_but_loses_its_data_is_still_retired() -> None:
    """Small probes get through, full packets do not (an MTU black hole, a lossy link): the
    answers excuse an episode's losses only, as a delay rise does."""
    evs = _evs(routes=ROUTES, plane_dead_losses=1000)
    for k in range(50):
        sent = 1.0 + 0.002 * k
        _lose(evs, 0 if k % 2 else 4, sent, sent + 0.003)
        for ev in evs.asks:
            evs.route_answered(ev, sent + 0.0031)
        evs.asks.clear()
        evs.judge_held(sent + 0.003 + SPAN)
        if EVState.ASSUMED_BAD in (_state(evs, 0), _state(evs, 4)):
            break
    # the episode's sends within its span, LATE_LOSSES and ANSWERED_LOSSES more, and one
    assert k + 1 == SPAN / 0.002 + LATE_LOSSES + ANSWERED_LOSSES + 1, k
    assert evs.losses_delayed >= 1


def _late_sends_until_retired(answers_until: int) -> int:
    """Route 0 on a delayed plane loses every send (one every 2 ms); after each loss found
    it is asked, and answers a probe sent 1 ms after the lost send while ``k <
    answers_until``. The send (its index) whose loss retired an EV."""
    evs = _evs(routes=ROUTES, plane_dead_losses=1000)
    for k in range(100):
        sent = 1.0 + 0.002 * k
        evs.delay.sample(0, DELAYED, sent)
        _lose(evs, 0 if k % 2 else 4, sent, sent + 0.003)
        if EVState.ASSUMED_BAD in (_state(evs, 0), _state(evs, 4)):
            return k
        if evs.asks and k < answers_until:  # asked (at most once a route a while): answered
            evs.route_answered(evs.asks[0], sent + 0.003)
        evs.asks.clear()
    return 100


def test_answers_allow_a_route_more_lost_sends_and_a_route_that_dies_is_found_as_before() -> None:
    """While the route answers probes sent after its previous lost send, ANSWERED_LOSSES more
    sends; once it stops answering (it died), its second lost send after that retires it (a
    route is asked every other send here: a question still open covers the next loss)."""
    never = _late_sends_until_retired(0)
    assert never == SPAN / 0.002 + LATE_LOSSES  # as without asking: k = 5
    assert _late_sends_until_retired(100) == never + ANSWERED_LOSSES
    for died in (6, 7, 8, 9):  # its first unanswered question: at send ``died`` or the next
        assert died < _late_sends_until_retired(died) <= died + 2, died


def test_asking_routes_off_leaves_the_loss_to_the_route_s_next_packet() -> None:
    evs = _evs(routes=ROUTES, plane_dead_losses=100, ask_routes=False)
    _lose(evs, 0, 1.001, 1.004)
    assert evs.asks == [] and evs.routes_asked == 0
    evs.route_answered(0, 1.0041)  # ignored
    until = 1.004 + max(HELD_WINDOWS * SPAN, MEMORY)
    while evs.held_next <= until:
        evs.judge_held(evs.held_next)
    assert _state(evs, 0) == EVState.ASSUMED_BAD


def test_without_known_routes_nothing_is_asked() -> None:
    evs = _evs()
    _lose(evs, 0, 1.001, 1.004)
    assert evs.asks == [] and evs.routes_asked == 0


def test_an_answer_restarts_its_plane_s_loss_streak_and_older_losses_do_not_count() -> None:
    """An answered probe is a delivery on its plane, as a health probe's is: fewer EVs
    retired meant fewer health probes, and streaks of tail drops no answer reset took live
    planes down."""
    evs = _evs(routes=ROUTES, plane_dead_losses=3)
    evs.lost(0, 1.004, EVReason.SACK_LOSS, sent_at=1.001)
    evs.lost(2, 1.004, EVReason.SACK_LOSS, sent_at=1.002)
    assert evs.loss_streak[0] == 2
    evs.route_answered(4, 1.003)
    assert evs.loss_streak[0] == 0 and evs.plane_alive_sent[0] == float("-inf")  # streak only
    evs.lost(6, 1.005, EVReason.SACK_LOSS, sent_at=1.0025)  # sent before the probe
    assert evs.loss_streak[0] == 0
    for ev, sent in ((0, 1.0035), (2, 1.0036), (4, 1.0037)):
        evs.lost(ev, 1.006, EVReason.SACK_LOSS, sent_at=sent)
    assert evs.plane_down[0]  # three sent after it: a dead plane is found as before


def test_half_a_dead_plane_s_streak_asks_and_an_answer_ends_it() -> None:
    """A full queue can drop a QP's every send on a plane for tens of ms, on every route
    (congestion: no route is to blame), and its loss streak took live planes down. Half way
    there, the plane is asked; a dead plane answers nothing and goes down as before."""
    for answered in (True, False):
        evs = _evs(plane_dead_losses=8)  # no routes known: nothing else asks
        asked: list[int] = []
        for k in range(8):
            sent = 1.0 + 0.002 * k
            evs.delay.sample(0, DELAYED, sent)
            _lose(evs, (2 * k) % 8, sent, sent + 0.01)
            asked += evs.asks
            if evs.asks and answered:
                evs.route_answered(evs.asks[0], sent + 0.01)  # sent after this loss
            evs.asks.clear()
        assert asked, answered  # asked from the 4th loss on
        assert evs.plane_down[0] == (not answered), answered
        assert evs.loss_streak[0] < 4 if answered else evs.planes_lost == 1


def test_an_answer_must_follow_every_earlier_lost_send_not_the_one_found_last() -> None:
    """Losses are found out of send order: an old send found late must not make an answer
    from before the route died look recent again."""
    evs = _evs(routes=ROUTES, plane_dead_losses=1000)
    prev = 1.000
    for k, sent in enumerate((1.000, 1.010, 1.012, 1.014, 1.016, 1.018, 1.020)):
        evs.delay.sample(0, DELAYED, sent)
        evs.route_answered(0, prev + 0.001)  # it answered after its previous lost send
        _lose(evs, 4 if k % 2 else 0, sent, sent + 0.003)
        prev = sent
    assert _state(evs, 0) == _state(evs, 4) == EVState.GOOD  # 6 late sends: answered, excused
    evs.route_answered(0, 1.021)  # its last answer: then it dies
    evs.delay.sample(0, DELAYED, 1.024)
    _lose(evs, 0, 1.024, 1.027)  # answered after the previous lost send: excused
    assert _state(evs, 0) == EVState.GOOD
    _lose(evs, 0, 1.019, 1.028)  # an older send found late: nothing answered after 1.024
    assert _state(evs, 0) == EVState.ASSUMED_BAD
    _lose(evs, 4, 1.026, 1.029)  # its next send: the answer is older than 1.024 still
    assert _state(evs, 4) == EVState.ASSUMED_BAD
