"""Path signals steer spraying (docs/EV_HEALTH.md, "CE penalties" and "False retirements"):
a CE-marked path gets less traffic while marked and all of it back after; congestion losses
retire (almost) nothing and the retirements they still cause are counted false; a dead link
still retires its EVs, and those are not counted false."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from mrc.core import QPConfig
from mrc.core.config import EVConfig
from mrc.core.events import EVReason
from mrc.core.evset import EVSet, EVState
from mrc.lab.sim import Faults
from mrc.lab.sim_links import Fabric, LinkSpec

from .mrcsim_harness import RecordingNetwork, Transfer, make_transfer, run_until

RATE = 12.5e6  # bytes/s: 100 Mbit/s
PAYLOAD = 1000


def _pattern(n: int, salt: int) -> bytes:
    return bytes((i * 31 + salt * 7 + (i >> 8)) % 251 for i in range(n))


def _pair(fab: Fabric, cfg: QPConfig, seed: int = 3) -> tuple[RecordingNetwork, Transfer, int]:
    """One QP a -> b over ``fab`` (16 EVs, one plane), told its routes: a spine each."""
    net = RecordingNetwork(seed, Faults(delay=0.0, jitter=0.0))
    net.set_fabric(fab)
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=16, config=cfg)
    size = 3_000_000
    t = make_transfer(net, "a", "b", qa, qb, [size], seed)
    t.post(0, 0, _pattern(size, seed))
    return net, t, size


def _per_ev_share(net: RecordingNetwork, t: Transfer, t0: float, t1: float) -> dict[int, float]:
    """Data packets sent per EV of each route in [t0, t1)."""
    routes = t.qp.evs.routes
    sent = Counter(routes[d.ev] for d in net.data_tx[("a", t.qp.qpn)] if t0 <= d.time < t1)
    evs = Counter(routes)
    return {r: sent[r] / evs[r] for r in evs}


@pytest.mark.parametrize("steer", [True, False])
def test_a_marked_spine_gets_less_traffic_while_marked_and_all_of_it_back_after(
    steer: bool,
) -> None:
    fast = LinkSpec(rate=4 * RATE, queue=200_000, delay=20e-6)
    slow = LinkSpec(rate=RATE / 2, queue=None, delay=20e-6, ecn=4_000)  # marks, never drops
    fab = Fabric(up=fast, down=fast, lasthop=fast, spines=2, overrides={"up:a/p0/s1": slow})
    # per packet: the share of each spine is measured in packets (bursts would make it lumpy)
    cfg = QPConfig(payload_size=PAYLOAD, max_outstanding=256, ecn_steering=steer, burst=1)
    net, t, size = _pair(fab, cfg)
    assert set(t.qp.evs.routes) == {0, 1}
    assert net.run(lambda: t.qp.requester.acked_packets > size // PAYLOAD // 4)
    healed = net.now
    fab.link("up:a/p0/s1").spec = fast  # the marks stop
    assert run_until(net, [t])
    t.check_final()
    counters = t.qp.evs.counters()
    # nothing failed: whatever reordering behind the slow queue retired was proved false
    assert counters["evs_assumed_bad_false"] == counters["evs_assumed_bad"], counters
    before = _per_ev_share(net, t, 0.0, healed)
    # once the last penalties ended, and EVs spuriously retired meanwhile were resurrected
    after = _per_ev_share(net, t, healed + 0.15, net.now)
    assert fab.link("up:a/p0/s1").stats.ecn_marked > 100
    if steer:
        assert counters["evs_penalized"] > 10
        assert before[1] < 0.8 * before[0], before  # measured: 0.68-0.75
    else:
        assert counters["evs_penalized"] == 0
        assert before[1] == pytest.approx(before[0], rel=0.1), before
    assert after[1] == pytest.approx(after[0], rel=0.1), after


#: delay evidence off: losses without marks are all failures (the rule before it)
NO_DELAY: dict[str, Any] = {"delay_evidence_min": 0.0, "delay_evidence_fraction": 0.0}


def _counted(
    net: RecordingNetwork, fab: Fabric, transfers: list[Transfer], dropped_over: int
) -> dict[str, int]:
    """Run ``transfers`` to the end, check every byte, and sum their EV counters; the fabric
    must have tail-dropped more than ``dropped_over`` packets and lost none to a link down."""
    assert run_until(net, transfers)
    for t in transfers:
        t.check_final()
    assert fab.total("dropped") > dropped_over and fab.total("lost_down") == 0
    total: Counter[str] = Counter()
    for t in transfers:
        total.update(t.qp.evs.counters())
    total["fabric_dropped"] = fab.total("dropped")
    return dict(total)


def _incast(ecn: int | None, **config: Any) -> dict[str, int]:
    """8 senders -> b through a last hop with a 10 kB queue that tail-drops (no trimming):
    pure congestion, no failure anywhere. ``config``: QPConfig fields."""
    net = RecordingNetwork(11, Faults(delay=0.0, jitter=0.0))
    links = LinkSpec(rate=4 * RATE, queue=64_000, delay=10e-6)
    last = LinkSpec(rate=RATE, queue=10_000, delay=5e-6, ecn=ecn)
    fab = Fabric(up=links, down=links, lasthop=last, spines=2)
    net.set_fabric(fab)
    senders = [f"s{i}" for i in range(8)]
    for h in ["b", *senders]:
        net.add_host(h)
    transfers = []
    for i, src in enumerate(senders):
        qa, qb = net.connect(
            src,
            "b",
            evs=16,
            config=QPConfig(payload_size=PAYLOAD, **config),
            qpn_a=i + 1,
            qpn_b=i + 1,
            planes=2,
        )
        t = make_transfer(net, src, "b", qa, qb, [200_000], 100 + i)
        t.post(0, 0, _pattern(200_000, i))
        transfers.append(t)
    return _counted(net, fab, transfers, dropped_over=100)


def test_congestion_losses_on_marked_paths_retire_far_fewer_evs_and_retirements_are_false() -> None:
    marked = _incast(ecn=2_000, **NO_DELAY)
    unmarked = _incast(ecn=None, **NO_DELAY)
    # without marks every tail drop looks like a failure; with them, losses on marked paths
    # are congestion. What is still retired is the first flight's losses, before any mark came
    # back (measured: 3 against 46; 6 against 58 with spines hashed from ports)
    assert marked["ev_losses_congested"] > 20
    assert unmarked["ev_losses_congested"] == 0
    assert marked["evs_assumed_bad"] < 0.5 * unmarked["evs_assumed_bad"], (marked, unmarked)
    # nothing failed: most retirements are proved false, by their route or their probe. Not
    # every one: the health probes cross the same tail-dropping queue, and a probe dropped
    # there leaves its EV counted as not false (21 of 29 with marks, since tail loss probes
    # also send resends that the window holds back; 32 of 32 before)
    for c in (marked, unmarked):
        assert c["evs_assumed_bad_false"] >= 0.7 * c["evs_assumed_bad"] > 0, c


def test_losses_after_the_delay_rose_retire_few_evs_without_marks() -> None:
    """The same incast, no marks, with delay evidence (the default): a loss on a plane whose
    queueing delay had risen is congestion (mrc.core.delaysigns), so most tail drops retire
    nothing. Measured: 12 EVs assumed bad (9 by SACK, then route fate took the rest of three
    routes), against 46 with every such loss taken for a failure. (1 against 58 while the
    simulator gave every EV a port of its own and hashed it onto a spine.) What is still
    retired was lost with no delay over the 0.5 ms floor seen on its plane: this last hop
    holds 0.8 ms at most, and half the samples are under 0.25 ms over the base; each sender
    has a window of a packet or two, so its samples are few. Comparing a route with its
    siblings (the plane's other route lost packets too: the shared last hop) and holding a
    loss until its route delivers or loses a later packet took the 12 to 0."""
    told = _incast(ecn=None)
    untold = _incast(ecn=None, **NO_DELAY)
    assert untold["evs_assumed_bad"] > 40, untold
    assert told["ev_losses_delayed"] > 20, told
    assert told["evs_assumed_bad"] <= 0.3 * untold["evs_assumed_bad"], (told, untold)
    assert told["evs_assumed_bad"] <= 3, told  # 0 measured: the routes lose together


def _untold(dropped_over: int = 300, **config: Any) -> dict[str, int]:
    """8 senders -> r over 4 planes x 4 spines, the last hop a quarter of what the senders are
    told (200 against 50 Mbit/s a plane), a plain FIFO of 9 ms that tail-drops by bytes (no
    band for control packets: a probe waits and drops as a tc tbf makes it), no marks:
    tools/bench_share.py --no-trim --reshape 50mbit, whose queue stays full from the first
    flight, so its QPs see no delay rise. ``config``: QPConfig fields."""
    net = RecordingNetwork(5, Faults(delay=50e-6, jitter=50e-6))
    links = LinkSpec(rate=2 * RATE, queue=250_000, delay=10e-6)
    last = LinkSpec(rate=RATE / 2, queue=56_250, delay=5e-6, priority=False)
    fab = Fabric(nic=links, up=links, down=links, lasthop=last, spines=4)
    net.set_fabric(fab)
    senders = [f"s{i}" for i in range(8)]
    for h in ["r", *senders]:
        net.add_host(h)
    transfers = []
    size = 3_000_000
    for i, src in enumerate(senders):
        cfg = QPConfig(payload_size=8192, line_rate_bps=4 * 2 * RATE * 8)
        cfg.max_outstanding, cfg.psn_window = 512, 2048  # mrc-send's cap
        for k, v in config.items():
            setattr(cfg, k, v)
        qa, qb = net.connect(src, "r", evs=128, config=cfg, qpn_a=i + 1, qpn_b=i + 1, planes=4)
        t = make_transfer(net, src, "r", qa, qb, [size], 200 + i)
        t.post(0, 0, _pattern(size, i))
        transfers.append(t)
    return _counted(net, fab, transfers, dropped_over=dropped_over)


def test_untold_tail_drops_ask_their_routes_and_retire_few_evs() -> None:
    """Most losses there have no delay rise nor a sibling's loss of the same QP to excuse them,
    and a route of 8 senders' QPs sends a packet every few tens of ms: waiting for its next one
    retired the EV. Asking the route (a probe) answers in a round trip: measured 0 EVs retired
    (176 questions) against 20 without asking (all false: nothing failed)."""
    # the law's default, whose windows keep the queue full (a learned depth,
    # cc.loss_delay_fraction, drops a third as much here: the next test)
    full: dict[str, Any] = {"cc_params": {"loss_delay_fraction": 0.0}}
    asked = _untold(**full)
    unasked = _untold(ask_routes=False, **full)
    assert unasked["evs_assumed_bad"] >= 12, unasked
    assert unasked["ev_routes_asked"] == 0
    assert asked["ev_routes_asked"] > 20, asked
    assert asked["evs_assumed_bad"] <= 0.25 * unasked["evs_assumed_bad"], (asked, unasked)


def test_untold_tail_drops_fall_once_the_law_learns_the_depth_they_came_at() -> None:
    """The same last hop with NSCC's learned loss depth (cc.loss_delay_fraction=0.8): a
    delay near the one the first drops came at reads as a CE mark, and the windows back off
    before the queue overflows again. Measured: 309 drops against 1001, 59 questions
    against 176, 0 EVs retired either way, 0.99 s against 0.97 s."""
    learned = _untold(dropped_over=100, cc_params={"loss_delay_fraction": 0.8})
    assert learned["fabric_dropped"] < 500, learned  # 1001 with the queue kept full
    assert learned["evs_assumed_bad"] == 0, learned
    assert 0 < learned["ev_routes_asked"] < 100, learned  # 176


def test_a_dead_link_still_retires_its_evs_and_they_are_not_false() -> None:
    links = LinkSpec(rate=4 * RATE, queue=200_000, delay=20e-6)
    fab = Fabric(up=links, down=links, lasthop=links, spines=2)
    net, t, size = _pair(fab, QPConfig(payload_size=PAYLOAD, max_outstanding=64))
    assert net.run(lambda: t.qp.requester.acked_packets > size // PAYLOAD // 4)
    dead = fab.link("up:a/p0/s1")
    dead.down = True
    t_down = net.now
    assert net.run(lambda: net.now > t_down + 0.3)  # longer than a first probe takes
    dead.down = False
    assert run_until(net, [t])
    t.check_final()
    on_dead = [ev for ev, r in enumerate(t.qp.evs.routes) if r == 1]
    counters = t.qp.evs.counters()
    assert dead.stats.lost_down > 0
    assert counters["evs_assumed_bad"] >= len(on_dead) // 2 > 0, counters
    assert counters["evs_assumed_bad_false"] == 0, counters
    assert counters["ev_losses_congested"] == 0


# ---- the rules, on an EVSet alone --------------------------------------------------------


def _evs(routes: list[int], **kw: Any) -> EVSet:
    # route fate off unless asked; delay evidence off (its rules: tests/core/test_delay_signs.py)
    config = EVConfig(**{"route_dead_evs": 0, **NO_DELAY, **kw})
    return EVSet(
        list(range(2000, 2000 + len(routes))), [0] * len(routes), routes=routes, config=config
    )


def test_penalty_lasts_its_duration_is_restarted_by_marks_and_has_a_floor() -> None:
    evs = _evs([0, 1] * 4)  # 8 active EVs, one plane: at most 4 penalized
    evs.marked(0, 1.0, 0.01)
    assert evs.penalized(0) and not evs.usable[0] and evs.state[0] == EVState.GOOD
    assert all(evs.next() != 0 for _ in range(50))
    evs.marked(0, 1.005, 0.01)  # restarts: now ends at 1.015
    evs.lift_penalties(1.012)
    assert evs.penalized(0)
    evs.lift_penalties(1.015)
    assert not evs.penalized(0) and evs.usable[0]
    for ev in range(4):
        evs.marked(ev, 2.0, 0.01)
    assert sum(evs.usable) == 4 and evs.ce.penalties == 5
    evs.marked(4, 2.0, 0.01)  # a fifth: the plane's paths are all congested: nobody sits out
    assert all(evs.usable) and evs.ce.plane_congested == 1
    evs.marked(5, 2.005, 0.01)
    assert all(evs.usable)  # no penalty while the plane's congestion lasts
    assert evs.counters()["evs_penalized"] == 5


def test_a_loss_on_a_marked_path_is_congestion_not_failure() -> None:
    evs = _evs([0, 1] * 4)
    evs.marked(2, 1.0, 0.01)  # route 0
    evs.lost(0, 1.02, EVReason.SACK_LOSS, sent_at=1.005, congestion_since=1.005 - 0.01)
    assert evs.state[0] == EVState.GOOD and evs.losses_congested == 1  # same route, marked
    evs.lost(1, 1.02, EVReason.SACK_LOSS, sent_at=1.005, congestion_since=1.005 - 0.01)
    assert evs.state[1] == EVState.ASSUMED_BAD  # route 1 showed nothing
    evs.lost(4, 1.5, EVReason.TIMEOUT, sent_at=1.3, congestion_since=1.3 - 0.01)
    assert evs.state[4] == EVState.ASSUMED_BAD  # the mark is too old
    evs.lost(6, 1.5, EVReason.SEND_ERROR)  # no congestion test for a send error
    assert evs.state[6] == EVState.ASSUMED_BAD


def test_a_trim_makes_losses_on_its_path_or_last_hop_congestion_not_failure() -> None:
    evs = _evs([0, 1] * 4)
    evs.trimmed(2, 1.0)  # route 0, TRIMMED: skipped a round, and its route is congested
    assert evs.state[2] == EVState.SKIP
    evs.lost(0, 1.02, EVReason.SACK_LOSS, sent_at=1.005, congestion_since=1.005 - 0.01)
    assert evs.state[0] == EVState.GOOD and evs.losses_congested == 1
    evs.lost(1, 1.02, EVReason.SACK_LOSS, sent_at=1.005, congestion_since=1.005 - 0.01)
    assert evs.state[1] == EVState.ASSUMED_BAD  # route 1 showed nothing
    two = EVSet(  # two planes
        list(range(3000, 3008)), [0, 1] * 4, routes=[0] * 8, config=EVConfig(**NO_DELAY)
    )
    two.lasthop_trimmed(0, 2.0)  # plane 0's last hop into the peer: incast
    assert all(s == EVState.GOOD for s in two.state) and two.usable == [True] * 8  # no skip
    two.lost(4, 2.01, EVReason.SACK_LOSS, sent_at=2.0, congestion_since=2.0 - 0.01)
    assert two.state[4] == EVState.GOOD and two.losses_congested == 1  # same plane
    two.lost(5, 2.01, EVReason.SACK_LOSS, sent_at=2.0, congestion_since=2.0 - 0.01)
    assert two.state[5] == EVState.ASSUMED_BAD  # plane 1's last hop showed nothing
    two.lost(6, 2.5, EVReason.TIMEOUT, sent_at=2.3, congestion_since=2.3 - 0.01)
    assert two.state[6] == EVState.ASSUMED_BAD  # the trim is too old


def test_a_loss_on_a_route_that_delivered_a_later_packet_retires_nothing() -> None:
    evs = _evs([0, 1] * 4)
    # what the requester does per acknowledged packet: route 0 delivered a packet sent at 1.01
    evs.route_alive_sent[evs.route_ix[2]] = 1.01
    evs.lost(0, 1.02, EVReason.SACK_LOSS, sent_at=1.005)  # route 0, sent before that
    assert evs.state[0] == EVState.GOOD and evs.losses_route_alive == 1
    evs.lost(4, 1.03, EVReason.PROBE_LOSS, sent_at=1.015)  # route 0, sent after: evidence
    assert evs.state[4] == EVState.ASSUMED_BAD
    evs.lost(1, 1.02, EVReason.SACK_LOSS, sent_at=1.005)  # route 1 delivered nothing
    assert evs.state[1] == EVState.ASSUMED_BAD
    assert evs.losses_route_alive == 1


def test_route_fate_counts_only_losses_after_the_routes_last_delivery() -> None:
    def route0_down(second_sent: float, delivered: float | None = None) -> bool:
        evs = _evs([0, 1] * 4, route_dead_evs=2)
        evs.lost(0, 1.01, EVReason.SACK_LOSS, sent_at=1.0)  # route 0
        if delivered is not None:  # route 0 delivered a packet sent then
            evs.route_alive_sent[evs.route_ix[2]] = delivered
        evs.lost(2, 1.02, EVReason.SACK_LOSS, sent_at=second_sent)  # route 0 again
        assert evs.state[0] == EVState.ASSUMED_BAD
        return evs.state[4] == evs.state[6] == EVState.ASSUMED_BAD  # the rest of route 0

    assert route0_down(1.003)  # two losses: the route is taken for down
    assert route0_down(1.0005)  # a burst too: a link that dies takes all in flight at once
    assert not route0_down(1.003, delivered=1.002)  # the route worked after the first loss


def test_false_retirements_by_route_delivery_and_by_first_probe() -> None:
    evs = _evs([0, 1] * 4, probe_interval=0.02, probe_timeout=0.1)
    evs.lost(0, 1.0, EVReason.SACK_LOSS, sent_at=0.99)  # route 0
    evs.lost(1, 1.0, EVReason.SACK_LOSS, sent_at=0.99)  # route 1
    evs.lost(3, 1.0, EVReason.SACK_LOSS, sent_at=0.99)  # route 1
    evs.route_delivered(5, 0.98)  # route 1, sent before the loss: proves nothing
    evs.route_delivered(2, 0.995)  # route 0, sent between the loss and the retirement
    assert evs.assumed_bad_false == 1 and 0 not in evs.judging
    assert evs.probes_due(1.02) == [0, 1, 3]
    evs.probe_answered(1, 1.021)  # EV 1's first probe came back: the path worked
    assert evs.assumed_bad_false == 2
    assert 3 in evs.probes_due(1.2)  # EV 3's probe timed out: a real failure, judged
    assert 3 not in evs.judging
    evs.probe_answered(3, 1.21)  # later answers prove nothing about the retirement
    assert evs.counters()["evs_assumed_bad_false"] == 2
