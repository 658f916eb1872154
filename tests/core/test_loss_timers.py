"""The requester's loss timers on their own (``mrc.core.timers.LossTimers``), with explicit
times: when the timer fires (RTO, backoff, the tail loss probe before the RTO and its hold on
timeouts) and what a timeout or a probe does to the packet records and asks of the requester.

Why: these decisions used to be reachable only through a whole queue pair and a simulator;
here each one is pinned to numbers, so a change to any of them shows as a changed value."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from mrc.core.rtt import RttEstimator
from mrc.core.timers import LossTimers

INF = float("inf")
RTO = 0.1  # initial_rto: the RTO until a sample
TLP_MIN = 0.005


@dataclass
class Pkt:
    ev: int
    sent_at: float
    deadline: float
    timeouts: int = 0
    silenced: bool = False
    probed: list[tuple[int, float]] | None = None


@dataclass
class Host:
    """Records what the timers ask of the requester; ``probe_moves`` answers resend_as_probe
    for a packet already queued."""

    calls: list[tuple[object, ...]] = field(default_factory=list)
    probe_moves: bool = True

    def resend_timed_out(self, seq: int, pkt: Pkt, now: float, blame: bool | None) -> None:
        self.calls.append(("timeout", seq, now, blame))

    def retries_exhausted(self, seq: int, pkt: Pkt, now: float) -> None:
        self.calls.append(("exhausted", seq, now))

    def resend_as_probe(self, seq: int, queued: bool) -> bool:
        self.calls.append(("probe", seq, queued))
        return self.probe_moves or not queued


def _timers(
    records: dict[int, Pkt], host: Host, tlp_max: int = 3, retries: int = 12
) -> tuple[LossTimers[Pkt], RttEstimator]:
    rtt = RttEstimator(RTO, 0.01, 1.0)
    timers = LossTimers(
        records,
        host,
        rtt,
        tlp_min=TLP_MIN,
        tlp_max=tlp_max,
        initial_rto=RTO,
        max_timeout_retries=retries,
    )
    return timers, rtt


def _send(timers: LossTimers[Pkt], records: dict[int, Pkt], seqs: range, now: float) -> float:
    """A burst ``seqs`` leaves ``now`` on EV 0 (as the requester sends one)."""
    deadline = timers.first_deadline(now)
    for s in seqs:
        records[s] = Pkt(0, now, deadline)
    timers.track(deadline, seqs.start, len(seqs))
    timers.arm_probe(now)
    return deadline


def test_the_timer_is_the_earliest_live_deadline_and_stale_entries_are_dropped() -> None:
    records: dict[int, Pkt] = {}
    timers, _rtt = _timers(records, Host(), tlp_max=0)  # no probe: deadlines only
    assert timers.next_time() is None
    assert _send(timers, records, range(0, 4), 1.0) == pytest.approx(1.0 + RTO)
    _send(timers, records, range(4, 8), 1.02)
    assert timers.next_time() == 1.0 + RTO
    # the first burst acknowledged: its entry is dead, the second one's is the top
    for s in range(4):
        del records[s]
    assert timers.next_time() == 1.02 + RTO
    # half the second burst acknowledged too: the entry is trimmed to its live packets
    del records[4], records[5]
    assert timers.next_time() == 1.02 + RTO
    assert timers._deadlines == [(1.02 + RTO, 6, 2)]
    # a packet resent later (new deadline) no longer keeps the old entry alive
    records[6].deadline = records[7].deadline = 5.0
    assert timers.next_time() is None and timers._deadlines == []


def test_the_tail_loss_probe_is_due_before_the_rto_and_doubles_in_a_row() -> None:
    records: dict[int, Pkt] = {}
    timers, rtt = _timers(records, Host())
    _send(timers, records, range(0, 2), 1.0)
    # no RTT sample yet: half the initial RTO
    assert timers.tlp_at == pytest.approx(1.0 + RTO / 2)
    tlp = timers.tlp_at
    assert tlp is not None and timers.next_time() == tlp < 1.0 + RTO
    rtt.sample(0.01)  # srtt 10 ms: 2 srtt, 20 ms
    timers.arm_probe(1.0)
    assert timers.tlp_at == pytest.approx(1.02)
    rtt.srtt = 0.001  # 2 srtt below tlp_min: tlp_min
    timers.arm_probe(1.0)
    assert timers.tlp_at == pytest.approx(1.0 + TLP_MIN)
    timers.tlps = 2  # the third probe in a row waits four times as long
    timers.arm_probe(1.0)
    assert timers.tlp_at == pytest.approx(1.0 + 4 * TLP_MIN)
    timers.tlps = 3  # tlp_max in a row met silence: no more
    timers.arm_probe(1.0)
    assert timers.tlp_at is None
    timers.news(1.5)  # news: probes again, counted from zero
    assert timers.tlps == 0 and timers.tlp_at == pytest.approx(1.5 + TLP_MIN)
    records.clear()  # nothing in flight: nothing to probe
    timers.news(1.6)
    assert timers.tlp_at is None


def test_a_tail_loss_probe_resends_the_newest_packet_and_holds_timeouts_off() -> None:
    records: dict[int, Pkt] = {}
    host = Host()
    timers, _rtt = _timers(records, host)
    _send(timers, records, range(0, 3), 1.0)
    due = 1.0 + RTO / 2
    timers.expire(due - 1e-9, rack_latest=0.0)
    assert host.calls == [] and timers.tlps == 0
    timers.expire(due, rack_latest=0.0)
    assert host.calls == [("probe", 2, False)]
    assert records[2].deadline == INF and records[2].probed == [(0, 1.0)]
    assert records[1].deadline == 1.0 + RTO  # the others keep theirs
    assert timers.tlps == 1
    assert timers.rto_hold == pytest.approx(due + RTO)
    assert timers.tlp_at == pytest.approx(due + RTO)  # the next one waits twice as long
    # the packets' RTO has come, but the probe holds timeouts off until its own RTO
    assert timers.next_time() == timers.rto_hold
    timers.expire(1.0 + RTO, rack_latest=0.0)
    assert host.calls == [("probe", 2, False)]


def test_a_probe_of_a_packet_already_queued_moves_its_resend() -> None:
    records: dict[int, Pkt] = {}
    host = Host()
    timers, _rtt = _timers(records, host)
    _send(timers, records, range(0, 2), 1.0)
    records[1].deadline = INF  # queued for a resend already (a NACK, a loss found)
    timers.expire(1.05, rack_latest=0.0)
    assert host.calls == [("probe", 1, True)]
    assert records[1].probed is None  # its transmission is not repeated by a probe
    assert timers.tlps == 1 and timers.rto_hold == pytest.approx(1.05 + RTO)
    assert timers.tlp_at == pytest.approx(1.05 + RTO)
    # going out as a probe already: no probe counted, no hold, but the probe is armed again
    # (packet 0's RTO, held off until now, has come too: silent, so resent unjudged)
    host.probe_moves = False
    timers.expire(1.05 + RTO, rack_latest=0.0)
    assert host.calls[1:] == [("timeout", 0, 1.05 + RTO, None), ("probe", 1, True)]
    assert timers.tlps == 1 and timers.rto_hold == pytest.approx(1.05 + RTO)
    assert timers.tlp_at == pytest.approx(1.05 + RTO + 2 * RTO / 2)


def test_timeouts_after_progress_resend_every_packet_and_blame_by_the_rack_point() -> None:
    records: dict[int, Pkt] = {}
    host = Host()
    timers, _rtt = _timers(records, host, tlp_max=0)
    _send(timers, records, range(0, 3), 1.0)
    records[2].silenced = True  # it waited out a silence before: never blamed
    timers.progressed(1.01)  # the peer acknowledged something new after they left
    # the RACK point: a packet sent at 1.0 arrived, so packets sent at 1.0 are not blamed...
    timers.expire(1.0 + RTO, rack_latest=1.0)
    assert host.calls == [
        ("timeout", 0, 1.0 + RTO, False),
        ("timeout", 1, 1.0 + RTO, False),
        ("timeout", 2, 1.0 + RTO, False),
    ]
    assert all(p.deadline == INF and p.timeouts == 1 for p in records.values())
    # ...a packet sent after them did: the ones before it are blamed (not the silenced one)
    host.calls.clear()
    for s, p in records.items():
        timers.resent(s, p, 1.2)
        p.sent_at = 1.2
    assert records[0].deadline == pytest.approx(1.2 + 2 * RTO)  # backed off: one timeout
    timers.progressed(1.25)
    timers.expire(1.2 + 2 * RTO, rack_latest=1.3)
    assert [c[3] for c in host.calls] == [True, True, False]
    assert records[0].timeouts == 2


def test_a_silent_flight_resends_its_oldest_and_the_rest_wait_for_its_backoff() -> None:
    records: dict[int, Pkt] = {}
    host = Host()
    timers, rtt = _timers(records, host, tlp_max=0)
    _send(timers, records, range(0, 4), 1.0)  # nothing acknowledged since they left
    now = 1.0 + RTO
    timers.expire(now, rack_latest=0.0)
    assert host.calls == [("timeout", 0, now, None)]  # the oldest, no EV judged
    assert records[0].deadline == INF and records[0].timeouts == 1
    wait = now + rtt.backed_off(1)
    assert wait == pytest.approx(now + 2 * RTO)
    assert [(p.deadline, p.silenced, p.timeouts) for s, p in records.items() if s] == [
        (wait, True, 0)
    ] * 3
    assert timers.next_time() == wait


def test_the_retry_budget_ends_the_expiry_at_the_packet_that_exhausts_it() -> None:
    records: dict[int, Pkt] = {}
    host = Host()
    timers, _rtt = _timers(records, host, retries=2)
    _send(timers, records, range(0, 3), 1.0)
    records[0].timeouts = 2  # it timed out twice already
    timers.progressed(1.01)
    timers.expire(1.0 + RTO, rack_latest=0.0)
    # the QP fails on packet 0: nothing else times out, and no probe goes out
    assert host.calls == [("exhausted", 0, 1.0 + RTO)]
    assert records[0].timeouts == 3 and records[0].deadline == 1.0 + RTO
    assert records[1].deadline == 1.0 + RTO and records[1].timeouts == 0


def test_the_backoff_doubles_per_timeout_up_to_max_rto() -> None:
    records: dict[int, Pkt] = {}
    timers, _rtt = _timers(records, Host())
    pkt = records[0] = Pkt(0, 2.0, INF)
    got = []
    for timeouts in range(6):
        pkt.timeouts = timeouts
        timers.resent(0, pkt, 2.0)
        got.append(round(pkt.deadline - 2.0, 9))
    assert got == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]  # max_rto 1.0
    assert timers.next_time() == pytest.approx(2.0 + 1.0)


def test_what_was_heard_says_when_the_peer_last_answered() -> None:
    timers, _rtt = _timers({}, Host())
    assert timers.what_was_heard(5.0, 0, 0) == (
        "no ACK ever came back (peer unreachable, not answering, or gone)"
    )
    timers.heard(2.0)
    timers.progressed(2.0)
    assert timers.what_was_heard(5.0, 7, 2) == (
        "the last ACK came 3.0 s ago (7 packets acknowledged in all, and 2 ACKs were "
        "refused as not ours)"
    )
    timers.heard(4.0)
    assert timers.what_was_heard(5.0, 7, 0) == (
        "the last ACK came 1.0 s ago, the last that acknowledged anything new 3.0 s ago "
        "(7 packets acknowledged in all)"
    )
