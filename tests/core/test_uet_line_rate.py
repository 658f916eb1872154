"""UET NSCC's window bounded by what the host knows (issue 39, item 2): with
``QPConfig.line_rate_bps`` given and ``cc.max_cwnd`` not, the window is at most 1.5 x the
line rate x the base RTT measured so far; unknown rate, the law as before."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mrc.core import QPConfig
from mrc.core.cc import LawContext, UetNscc, UetNsccParams, create
from mrc.core.cc.uet import MAX_CWND_BDP, SERIALIZING_LINKS

MSS = 1000


def _law(rate: float | None, **params: Any) -> UetNscc:
    p = dataclasses.replace(UetNsccParams(shared_base=False), **params)
    return UetNscc(
        p, LawContext.of(QPConfig(payload_size=MSS, max_outstanding=4096, line_rate_bps=rate))
    )


def test_cap_is_one_and_a_half_bdp_of_the_line_rate_and_the_base_rtt() -> None:
    law = _law(40e6)  # 4 planes x 10 Mbit/s: 5 MB/s
    assert law.line_cap == float("inf")  # no RTT sample yet: the law's initial behaviour
    law.on_ack(0.01, MSS, 0.002, False)  # a base RTT of 2 ms
    assert MAX_CWND_BDP == 1.5  # UET's max_cwnd: 1.5 x the BDP
    assert law.line_cap == pytest.approx(1.5 * 5e6 * 0.002)  # 15 packets
    assert law.max_cwnd == pytest.approx(15 * MSS)  # below initial_window (16)
    # ACKs at 10 MB/s on an empty path: the measured bound (1.5 x 10 MB/s x 3.5 ms) would
    # let the window grow to 52 packets; the line rate's holds it at 15
    t = 0.01
    for _ in range(5000):
        t += 0.0001
        law.on_ack(t, MSS, 0.002, False)
    assert law.bdp * 1.5 > 50 * MSS
    assert law.max_cwnd == pytest.approx(15 * MSS)
    assert law.cwnd == pytest.approx(15 * MSS) and law.limit == 15


def test_cap_follows_the_base_rtt_as_it_is_learned() -> None:
    law = _law(80e6)  # 10 MB/s
    law.on_ack(0.01, MSS, 0.004, False)
    assert law.line_cap == pytest.approx(1.5 * 10e6 * 0.004)  # 60 packets
    law.on_ack(0.02, MSS, 0.001, False)  # an emptier path: a smaller base RTT
    assert law.line_cap == pytest.approx(1.5 * 10e6 * 0.001)  # 15 packets
    assert law.max_cwnd == pytest.approx(15 * MSS)
    assert law.cwnd <= 15 * MSS  # the initial 16 packets cut to it at once


def test_cap_counts_a_packets_serialization_where_the_base_rtt_is_shorter() -> None:
    """A tbf with a burst (the netns fabric's links) passes a packet on an idle path in a
    fraction of its serialization: a base RTT from that bounded every QP at one packet."""
    law = _law(8e6)  # 1 MB/s: a 1000-byte packet takes 1 ms on the wire
    law.on_ack(0.01, MSS, 0.0001, False)  # 0.1 ms: a packet through a full token bucket
    assert SERIALIZING_LINKS == 4
    assert law.line_cap == pytest.approx(1.5 * 4 * MSS)  # 6 packets, not 1.5 x 0.1 of one
    law.on_ack(0.02, MSS, 0.00001, False)
    assert law.max_cwnd == pytest.approx(6 * MSS)
    fast = _law(8e9)  # a NIC's rate: the measured base RTT counts, as before
    fast.on_ack(0.01, MSS, 0.0001, False)
    assert fast.line_cap == pytest.approx(1.5 * 1e9 * 0.0001)


def test_given_max_cwnd_wins_and_unknown_rate_changes_nothing() -> None:
    told = _law(80e6, max_cwnd=40 * MSS)
    told.on_ack(0.01, MSS, 0.001, False)
    assert told.max_cwnd == 40 * MSS  # the user knows better
    untold, plain = (
        _law(None),
        UetNscc(
            UetNsccParams(shared_base=False),
            LawContext.of(QPConfig(payload_size=MSS, max_outstanding=4096)),
        ),
    )
    t = 0.0
    for i in range(3000):
        t += 0.0002
        rtt = 0.001 + (i % 7) * 0.0002
        for law in (untold, plain):
            law.on_ack(t, MSS, rtt, i % 11 == 0)
    assert untold.line_cap == float("inf")
    assert untold.cwnd == plain.cwnd and untold.max_cwnd == plain.max_cwnd


def test_the_rate_reaches_the_law_from_the_config() -> None:
    cfg = QPConfig(payload_size=MSS, line_rate_bps=1e9)
    cfg.validate()
    assert LawContext.of(cfg).line_rate_bps == 1e9
    law = create("nscc", {}, cfg)
    assert isinstance(law, UetNscc) and law.line_rate == 1e9 / 8
    assert LawContext.of(QPConfig()).line_rate_bps is None
    with pytest.raises(ValueError, match="line_rate_bps"):
        QPConfig(line_rate_bps=0.0).validate()
