"""Window and flow limits: max_outstanding packets in flight, PSNs below snd_una + psn_window.

RecordingNetwork checks both limits every time a QP sends (see mrcsim_harness); these tests
also make sure each limit is really the binding one in some run, so the checks are not vacuous.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from mrc.core import QPConfig
from mrc.lab.sim import Faults

from .mrcsim_harness import (
    RecordingNetwork,
    Sent,
    Transfer,
    all_drops,
    failures,
    make_transfer,
    run_until,
)


def _run(
    seed: int,
    cfg: QPConfig,
    faults: Faults,
    nbytes: int,
    tamper: Callable[[Sent], bytes | None] | None = None,
) -> tuple[RecordingNetwork, Transfer]:
    net = RecordingNetwork(seed, faults)
    net.tamper = tamper
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect("a", "b", evs=8, config=cfg, psn_a=(1 << 24) - 5 - seed, psn_b=seed)
    t = make_transfer(net, "a", "b", qa, qb, [nbytes], seed)
    t.post(0, 0, random.Random(seed).randbytes(nbytes), imm=seed)
    assert run_until(net, [t], max_time=500)
    assert not failures(net)
    t.check_final()
    return net, t


@pytest.mark.parametrize("max_outstanding", [1, 2, 7, 32, 100])
def test_max_outstanding_is_respected_and_reached(max_outstanding: int) -> None:
    for seed in range(6):
        cfg = QPConfig(
            payload_size=600, max_outstanding=max_outstanding, psn_window=128, cc="fixed"
        )
        faults = Faults(loss=0.03, trim=0.05, duplicate=0.05, reorder=0.3)
        net, t = _run(seed, cfg, faults, 120_000)
        assert not net.violations, net.violations[:3]
        assert net.max_in_flight[("a", t.qp.qpn)] == max_outstanding  # the limit was hit


@pytest.mark.parametrize("window", [64, 100, 256])
def test_psn_window_bounds_sends_past_a_hole(window: int) -> None:
    """The first packet's first copy is lost. SACKs free the in-flight slots of everything
    after it, but the sender must stop at snd_una + psn_window - 1 until the hole is filled."""

    done = False

    def lose_first_copy_of_psn0(s: Sent) -> bytes | None:
        nonlocal done
        if s.data[0] in (0x0A, 0x0B) and not done:
            done = True
            return None
        return s.data

    # reorder_min, tlp_min: no SACK-based repair and no tail loss probe, so the hole stays
    # open until the timeout
    cfg = QPConfig(
        payload_size=500, max_outstanding=16, psn_window=window, reorder_min=10.0, tlp_min=10.0
    )
    net, t = _run(1, cfg, Faults(), 500 * (window + 200), lose_first_copy_of_psn0)
    assert not net.violations, net.violations[:3]
    txs = net.data_tx[("a", t.qp.qpn)]
    assert txs[0].seq == 0
    retx_at = next(i for i, tx in enumerate(txs) if i > 0 and tx.seq == 0)
    before = txs[1:retx_at]
    assert max(tx.seq for tx in before) == window - 1  # went right up to the edge, not past
    assert t.qp.stats.retransmits == 1 and t.qp.stats.retransmits_timeout == 1
    assert max(tx.seq for tx in txs) > window  # and resumed once the hole was filled
    assert net.max_in_flight[("a", t.qp.qpn)] == 16
    assert all_drops(net) == {}  # the receiver accepted everything the sender sent


def test_window_limits_hold_over_many_seeds() -> None:
    tried = 0
    for seed in range(40):
        rng = random.Random(seed)
        window = rng.choice([64, 65, 128, 300])
        cfg = QPConfig(
            payload_size=rng.randrange(500, 1500),
            max_outstanding=rng.randrange(1, window + 1),
            psn_window=window,
            ack_every=rng.choice([1, 8, 64]),
        )
        net, t = _run(seed, cfg, Faults(loss=0.05, trim=0.1, duplicate=0.05, reorder=0.3), 80_000)
        assert not net.violations, (seed, net.violations[:3])
        assert net.max_in_flight[("a", t.qp.qpn)] <= cfg.max_outstanding
        tried += len(net.data_tx[("a", t.qp.qpn)])
    assert tried > 2000


def test_window_config_is_validated() -> None:
    for bad in (
        QPConfig(max_outstanding=0),
        QPConfig(psn_window=63),
        QPConfig(psn_window=(1 << 22) + 1),
        QPConfig(max_outstanding=200, psn_window=100),
        QPConfig(payload_size=0),
        QPConfig(ack_every=0),
        QPConfig(min_rto=0.2, initial_rto=0.1),
    ):
        with pytest.raises(ValueError):
            bad.validate()
    QPConfig(max_outstanding=64, psn_window=64).validate()
