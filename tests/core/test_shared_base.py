"""QPs of one process to one peer share their base RTT (NSCC, ``WindowLaw.join``).

A QP's base RTT was its own smallest sample. One that started while others kept a queue took
that queue for its path's round trip, read no queueing, kept its window while the others cut
theirs and finished first: 16 QPs into one receiver on loopback finished between 0.5 s and
15 s (Jain's index of their rates 0.2-0.8). Sharing the smallest sample of them all, and a
target of a few of each QP's own packets while they share, gives every one the same reading
of the same queue."""

from __future__ import annotations

import pytest

from mrc.core import QPConfig
from mrc.core.cc import create
from mrc.core.cc.nscc import MrcNscc, PeerShare

MSS = 1400


def _law(**params: float | int | bool) -> MrcNscc:
    cfg = QPConfig(payload_size=MSS, cc="nscc-mrc", cc_params=dict(params))
    law = create(cfg.cc, cfg.cc_params, cfg)
    assert isinstance(law, MrcNscc)
    return law


def _feed(law: MrcNscc, t0: float, rtt: float, acks: int, step: float = 0.001) -> float:
    now = t0
    for _ in range(acks):
        now += step
        law.on_ack(now, MSS, rtt, False)
    return now


def test_a_latecomer_reads_the_queue_the_first_qp_measured() -> None:
    peers: dict[str, object] = {}
    first, late = _law(), _law()
    first.join(peers)
    _feed(first, 0.0, 0.0002, 20)  # an empty path: 200 us
    late.join(peers)
    # the latecomer only ever sees the queue the first one keeps: 5 ms
    _feed(late, 0.1, 0.005, 20)
    assert late.base_rtt == pytest.approx(0.0002)
    assert late.qdelay == pytest.approx(0.0048)
    assert late.decreases > 0  # the queue is over its target, as it is for the first


def test_alone_a_latecomer_takes_the_queue_for_the_path() -> None:
    """The control: the same samples without sharing, as before."""
    first, late = _law(shared_base=False), _law(shared_base=False)
    first.join({})
    late.join({})
    _feed(first, 0.0, 0.0002, 20)
    _feed(late, 0.1, 0.005, 20)
    assert late.base_rtt == pytest.approx(0.005)
    assert late.qdelay == pytest.approx(0.0)
    assert late.decreases == 0


def test_the_target_counts_own_packets_only_while_shared() -> None:
    peers: dict[str, object] = {}
    a, b = _law(), _law()
    a.join(peers)
    now = _feed(a, 0.0, 0.0002, 40)
    alone = a.target
    b.join(peers)
    _feed(a, now, 0.0002, 40)
    # 4 packets at the rate a delivers (one per ms): 5.6 ms, capped by target_max (4 ms)
    assert a.target == pytest.approx(0.004)
    assert alone < a.target
    b.leave()
    b.leave()  # a second leave does nothing
    _feed(a, now + 0.05, 0.0002, 40)
    assert a.target == pytest.approx(alone)


def test_a_qp_joins_once() -> None:
    peers: dict[str, object] = {}
    law = _law()
    law.join(peers)
    law.join(peers)
    law.leave()
    share = peers["nscc-mrc"]
    assert isinstance(share, PeerShare) and share.members == 0
