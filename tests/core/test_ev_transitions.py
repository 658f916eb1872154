"""EVSet's state table and plane liveness on their own, on explicit times (no network)."""

from __future__ import annotations

import pytest

from mrc.core.config import EVConfig
from mrc.core.events import EVReason, EVState, EVStateChanged
from mrc.core.evset import _TRANSITIONS, EVSet, EVTransitionError

NEG_INF = float("-inf")


def _state(evs: EVSet, ev: int) -> EVState:
    """``ev``'s state now, read through a call: mypy would keep ``evs.state[ev]`` narrowed to
    what an earlier assert saw across the calls that change it."""
    return evs.state[ev]


def _evset(
    n: int = 8,
    planes: int = 2,
    active: int = 6,
    plane_dead_losses: int = 8,
    resurrect_after: int = 3,
) -> tuple[EVSet, list[EVStateChanged]]:
    log: list[EVStateChanged] = []
    evs = EVSet(
        list(range(2000, 2000 + n)),
        [i % planes for i in range(n)],
        seed=3,
        active=active,
        on_change=log.append,
        qpn=42,
        config=EVConfig(plane_dead_losses=plane_dead_losses, resurrect_after=resurrect_after),
    )
    return evs, log


def test_labels_and_phrases_are_what_users_see() -> None:
    assert EVState.GOOD.label() == "GOOD"
    assert EVState.GOOD.label(backup=True) == "GOOD (backup)"
    assert EVState.ASSUMED_BAD.label(backup=True) == "ASSUMED_BAD"  # only GOOD EVs wait
    assert EVReason.SEND_ERROR.describe("Network is unreachable") == (
        "send error: Network is unreachable"
    )
    assert EVReason.PLANE_DOWN.describe("8", plane=3) == "plane 3 down: 8 losses in a row"
    assert EVReason.REPLACES.describe("5") == "replaces EV 5"
    assert EVReason.RESURRECTED.describe("3") == "resurrected: 3 probes answered"
    assert EVReason.SACK_LOSS.describe() == "lost: later packets arrived"


def test_a_retirement_and_its_replacement_are_reported_with_codes() -> None:
    evs, log = _evset()
    evs.lost(2, 1.5, EVReason.TIMEOUT)
    bad, repl = log
    assert (bad.qpn, bad.time, bad.ev, bad.value, bad.plane) == (42, 1.5, 2, 2002, 0)
    assert (bad.old, bad.new, bad.reason) == (EVState.GOOD, EVState.ASSUMED_BAD, EVReason.TIMEOUT)
    assert not bad.old_backup and not bad.new_backup
    # EV 6 is plane 0's first backup: GOOD -> GOOD, leaving the pool
    assert (repl.ev, repl.old, repl.new, repl.reason) == (
        6,
        EVState.GOOD,
        EVState.GOOD,
        EVReason.REPLACES,
    )
    assert repl.old_backup and not repl.new_backup
    assert (repl.old_label, repl.new_label, repl.reason_text) == (
        "GOOD (backup)",
        "GOOD",
        "replaces EV 2",
    )


def test_send_error_keeps_the_os_text_as_detail() -> None:
    evs, log = _evset()
    evs.lost(1, 2.0, EVReason.SEND_ERROR, detail="Network is unreachable")
    assert log[0].reason is EVReason.SEND_ERROR and log[0].detail == "Network is unreachable"
    assert log[0].reason_text == "send error: Network is unreachable"


def test_trim_skip_and_back() -> None:
    evs, log = _evset(n=4, planes=1, active=4)
    evs.trimmed(0, 1.0)
    assert _state(evs, 0) is EVState.SKIP
    for _ in range(3 * len(evs)):  # two rounds later the skip is over
        evs.next()
    assert _state(evs, 0) is EVState.GOOD
    assert [(e.old, e.new, e.reason) for e in log] == [
        (EVState.GOOD, EVState.SKIP, EVReason.TRIMMED),
        (EVState.SKIP, EVState.GOOD, EVReason.SKIP_OVER),
    ]


def test_deny_is_reported_once() -> None:
    evs, log = _evset()
    evs.deny(7)  # a backup
    evs.deny(7)
    assert [(e.old_label, e.new_label, e.reason_text) for e in log] == [
        ("GOOD (backup)", "DENIED", "denied by operator")
    ]


def test_impossible_transitions_raise() -> None:
    evs, _log = _evset()
    with pytest.raises(EVTransitionError, match="EV 0: no transition from GOOD on RESURRECTED"):
        evs._transition(0, EVReason.RESURRECTED, 1.0)
    evs.deny(1)
    with pytest.raises(EVTransitionError):
        evs._transition(1, EVReason.SKIP_OVER, 1.0)
    assert _state(evs, 1) is EVState.DENIED  # unchanged


def test_every_state_can_be_denied_and_only_the_operator_lets_one_out() -> None:
    for state in EVState:
        assert _TRANSITIONS[(state, EVReason.DENIED)] is EVState.DENIED
    assert {(r, new) for (old, r), new in _TRANSITIONS.items() if old is EVState.DENIED} == {
        (EVReason.DENIED, EVState.DENIED),
        (EVReason.ALLOWED, EVState.ASSUMED_BAD),
    }


def test_an_allowed_ev_is_probed_before_it_is_used_again() -> None:
    """mrc_ctl's MODIFY_EV_STATE goes both ways: a denied EV may be allowed again. It is not
    sprayed on blind (its path may have broken meanwhile): probed as one assumed bad, then
    GOOD once ``resurrect_after`` probes are answered."""
    evs, log = _evset(resurrect_after=2)
    evs.deny(1, 0.5)  # active: a backup of its plane takes its place
    assert not evs.allow(3, 0.6)  # not denied: nothing happens
    assert evs.allow(1, 1.0)
    assert not evs.allow(1, 1.0)  # once is enough
    assert _state(evs, 1) is EVState.ASSUMED_BAD and not evs.usable[1]
    t = 1.0
    for _ in range(2):
        t += 0.5
        assert 1 in evs.probes_due(t)
        evs.probe_answered(1, t + 0.001)
    assert _state(evs, 1) is EVState.GOOD
    mine = [(e.old_label, e.new_label, e.reason_text) for e in log if e.ev == 1]
    assert mine == [
        ("GOOD", "DENIED", "denied by operator"),
        ("DENIED", "ASSUMED_BAD", "allowed again by operator: probed before use"),
        ("ASSUMED_BAD", "GOOD (backup)", "resurrected: 2 probes answered"),
    ]
    assert evs.assumed_bad == 0  # the operator's word is no loss


def test_deliveries_reset_the_loss_streak_and_mark_the_plane_alive() -> None:
    evs, _log = _evset(plane_dead_losses=3)
    evs.lost(0, 1.0, EVReason.TIMEOUT, sent_at=0.9)
    evs.lost(2, 1.0, EVReason.TIMEOUT, sent_at=0.9)
    assert evs.loss_streak == [2, 0]
    evs.delivered([0.95, NEG_INF])
    assert evs.loss_streak == [0, 0]
    assert evs.plane_alive_sent == [0.95, NEG_INF]
    evs.delivered([0.5, NEG_INF])  # an older delivery does not move it back
    assert evs.plane_alive_sent == [0.95, NEG_INF]


def test_losses_sent_before_a_delivery_are_no_evidence_against_the_plane() -> None:
    evs, _log = _evset(plane_dead_losses=3)
    evs.delivered([2.0, NEG_INF])
    for _ in range(5):
        evs.lost(4, 2.1, EVReason.TIMEOUT, sent_at=1.9)  # sent before 2.0: the plane worked
    assert evs.loss_streak[0] == 0 and not evs.plane_down[0]


def test_a_plane_goes_down_after_losses_in_a_row_and_a_probe_brings_it_back() -> None:
    # plane 1: EVs 1, 3, 5 active, 7 and 9 backups
    evs, log = _evset(n=10, active=6, plane_dead_losses=3, resurrect_after=1)
    for t in (1.0, 1.1, 1.2):
        evs.lost(1, t, EVReason.TIMEOUT, sent_at=t - 0.05)
    assert evs.plane_down[1] and evs.planes_lost == 1
    # the first loss retired EV 1 (7 replaced it); the third took the plane down
    assert [(e.ev, e.reason) for e in log[:2]] == [(1, EVReason.TIMEOUT), (7, EVReason.REPLACES)]
    down = log[2:]
    assert [e.ev for e in down] == [3, 5, 7, 9]  # the remaining backup (9) too
    assert all(e.reason is EVReason.PLANE_DOWN and e.new is EVState.ASSUMED_BAD for e in down)
    assert down[0].reason_text == "plane 1 down: 3 losses in a row"
    assert down[-1].old_label == "GOOD (backup)"
    assert evs.port_state() & 0b11 == 0b01
    (ev,) = [ev for ev in evs.probes_due(1.3) if ev == 3]
    evs.probe_answered(ev, 1.31)
    assert not evs.plane_down[1]
    assert evs.plane_alive_sent[1] == 1.3  # the probe's send time
    assert log[-1].ev == 3 and log[-1].reason is EVReason.RESURRECTED
    assert log[-1].old is EVState.ASSUMED_BAD and log[-1].new is EVState.GOOD
