"""Reverse-EV probes (mrc/core/revprobes.py): a side that only receives tests the paths its
ACKs take, and retires a dead one before the sender has to send data twice to show it.

The state machine alone first (rounds, silence, misses in a row, a timer that is always
served), then a seeded transfer in the simulator whose receiver has a dead ACK path.
"""

from __future__ import annotations

import random

from mrc.core import QPConfig
from mrc.core.events import EVReason, EVStateChanged
from mrc.core.evset import EVState
from mrc.core.revprobes import MISSES_IN_A_ROW, ReverseProbes
from mrc.lab.sim import Faults

from .mrcsim_harness import RecordingNetwork, make_transfer, run_until

RTT = 0.001


def _probes() -> ReverseProbes:
    return ReverseProbes(interval=0.005, per_plane=1)


def test_a_round_probes_each_planes_latest_ack_ev_once_an_interval_has_passed() -> None:
    rp = _probes()
    assert rp.next_time(RTT) is None  # no ACK sent yet: nothing to probe
    for ev, plane, t in [(1, 0, 0.0), (2, 1, 0.001), (3, 0, 0.002), (1, 0, 0.003)]:
        rp.ack_sent(ev, plane, t)
    assert rp.next_time(RTT) == 0.005  # an interval after the round's first ACK
    assert rp.due(0.004, True, RTT) == ([], [])
    due, lost = rp.due(0.005, True, RTT)
    assert sorted(due) == [1, 2] and lost == []  # plane 0's most recent (1), plane 1's (2)
    assert rp.sent == 2
    assert rp.due(0.5, True, RTT)[0] == []  # no ACK since: no new round


def test_a_side_with_data_in_flight_does_not_probe() -> None:
    """Its own data's ACKs already test those paths (SACK evidence, tail loss probes)."""
    rp = _probes()
    rp.ack_sent(4, 0, 0.0)
    assert rp.due(0.01, False, RTT) == ([], [])
    assert rp.next_time(RTT) is None


def test_two_misses_in_a_row_retire_an_ev_one_does_not() -> None:
    """A probe tests a round trip: a reply lost on the peer's side must not retire a working
    reverse EV, so the first miss only has the EV probed again."""
    rp = _probes()
    t = 0.0
    lost_at: list[tuple[float, list[tuple[int, float]]]] = []
    for _round in range(5 * MISSES_IN_A_ROW + 2):  # a probe waits 2 rounds for its answer
        if not lost_at:
            rp.ack_sent(7, 0, t)  # EV 7 (dead) carries ACKs on plane 0 until retired
        rp.ack_sent(8, 1, t)  # EV 8 (alive) on plane 1
        t += rp.interval
        due, lost = rp.due(t, True, RTT)
        if lost:
            lost_at.append((t, lost))
        if 8 in due:
            assert rp.answered(8)
    assert [ev for _t, lost in lost_at for ev, _sent in lost] == [7]
    assert rp.lost == MISSES_IN_A_ROW


def test_one_miss_then_an_answer_starts_the_count_again() -> None:
    rp = _probes()
    rp.ack_sent(7, 0, 0.0)
    rp.ack_sent(8, 1, 0.0)
    assert sorted(rp.due(0.005, True, RTT)[0]) == [7, 8]
    assert rp.answered(8)
    assert rp.due(0.030, True, RTT)[1] == []  # 7 missed once
    rp.ack_sent(8, 1, 0.030)
    assert sorted(rp.due(0.035, True, RTT)[0]) == [7, 8]  # 7 again, whatever carried ACKs
    assert rp.answered(7) and rp.answered(8)
    rp.ack_sent(7, 0, 0.036)
    rp.ack_sent(8, 1, 0.036)
    assert sorted(rp.due(0.041, True, RTT)[0]) == [7, 8]
    assert rp.answered(8)
    assert rp.due(0.070, True, RTT)[1] == []  # one miss since the answer: not yet


def test_a_miss_is_probed_again_after_the_last_ack() -> None:
    """The last ACKs of a transfer died on EV 7, and no ACK leaves after them: the first miss
    must still have EV 7 probed again (with EV 8, last answered, as the witness that the peer
    answers), or it is never retired and the sender finds the dead path only by sending data
    twice (seen over real sockets: tests/transport/test_reverse_probes.py, 1 run in 6)."""
    rp = _probes()
    rp.ack_sent(7, 0, 0.0)
    rp.ack_sent(8, 1, 0.0)  # the last ACKs of all
    assert sorted(rp.due(0.005, True, RTT)[0]) == [7, 8]
    assert rp.answered(8)
    t = 0.005
    retired: list[int] = []
    while not retired and t < 1.0:
        at = rp.due_at
        assert at is not None, "nothing left to do while EV 7 has missed once"
        t = max(t, at)
        due, lost = rp.due(t, True, RTT)
        retired += [ev for ev, _sent in lost]
        if 8 in due:
            assert rp.answered(8)
    assert retired == [7] and rp.lost == MISSES_IN_A_ROW
    assert rp.due_at is None  # and then it rests


def test_a_silent_peer_retires_nothing() -> None:
    """No probe answered since this one left: the peer stopped or went away, which says
    nothing about any one path (and a retired EV would be probed for ever)."""
    rp = _probes()
    t = 0.0
    for _round in range(6):
        rp.ack_sent(1, 0, t)
        rp.ack_sent(2, 1, t)
        t += rp.interval
        assert rp.due(t, True, RTT)[1] == []
    assert rp.lost == 0 and rp.silent > 0


def test_a_due_timer_is_always_served() -> None:
    """Seen while building this: the timeout was judged as ``sent <= now - wait`` and the
    timer set at ``sent + wait``; for some floats the two disagree, the timer stayed due at
    the same instant and the simulator never advanced."""
    r = random.Random(5)
    for _ in range(2000):
        rp = ReverseProbes(interval=r.uniform(1e-4, 0.02), per_plane=1)
        t0 = r.uniform(0, 1000)
        rp.ack_sent(3, 0, t0)
        first = rp.next_time(RTT)
        assert first is not None
        rp.due(first, True, RTT)
        timer = rp.next_time(RTT)
        assert timer is not None and timer > first
        rp.due(timer, True, RTT)
        after = rp.next_time(RTT)
        assert after is None or after > timer
        # the cached time the QP checks per batch and arms its timer for, likewise
        assert rp.due_at == after


def _dead_ack_path(interval: float) -> tuple[list[EVStateChanged], int, int]:
    """A 2 MB transfer at a steady 64 packets per 4 ms round trip whose receiver's EV 3 (an
    ACK path) dies at 10 ms; the receiver's EV events, duplicates and reverse-probe losses.
    The ACKs the dead path eats are covered by the next ones (cumulative): the sender never
    waits, sends nothing twice, and so shows the receiver nothing."""
    net = RecordingNetwork(3, Faults(delay=0.002, jitter=0.0002))
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(
        payload_size=1000, cc="fixed", max_outstanding=64, reverse_probe_interval=interval
    )
    qa, qb = net.connect("a", "b", evs=8, config=cfg, planes=2)
    t = make_transfer(net, "a", "b", qa, qb, [2_000_000], 3)
    t.post(0, 0, bytes(range(250)) * 8000)
    dead = qb.evs.values[3]
    net._at(0.010, lambda: net.faults.dead_evs.add(dead))
    assert run_until(net, [t])
    t.check_final()
    events = [e for e in net.hosts["b"].events if isinstance(e, EVStateChanged)]
    return events, qb.stats.duplicates, qb.stats.reverse_probes_lost


def test_a_receiver_retires_its_dead_ack_path_by_probing_it() -> None:
    events, dups, lost = _dead_ack_path(0.005)
    retired = [(e.ev, e.reason) for e in events if e.new is EVState.ASSUMED_BAD]
    assert retired[:1] == [(3, EVReason.REVERSE_PROBE)], retired
    assert {ev for ev, _r in retired} == {3}
    assert lost == 1  # one retirement, after MISSES_IN_A_ROW misses


def test_without_reverse_probes_the_dead_ack_path_stays_in_use() -> None:
    """The same transfer without them: nothing tells the receiver (the control for the
    test above)."""
    events, dups, lost = _dead_ack_path(0.0)
    assert not [e for e in events if e.reason is EVReason.REVERSE_PROBE]
    assert not [e for e in events if e.ev == 3 and e.time < 0.1], events[:3]
    assert lost == 0
