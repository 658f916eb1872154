"""Fuzzed and forged datagrams against a transfer in the simulator (issue 9).

A stranger (tests/core/datagram_fuzz.py: it knows QP numbers, the PSN space and packets of
another session, not the live rkeys or EVs) fires datagrams at both ends at random moments of
a transfer. On a clean network nothing it sends may show: the transfer lands byte for byte
(every byte outside the writes keeps its sentinel), nothing is retransmitted, no EV changes
state, no QP fails, every fuzzed datagram is dropped and counted, and every datagram either
endpoint received is accounted for.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from mrc.core import EVStateChanged, QPConfig
from mrc.lab.sim import Faults

from .datagram_fuzz import Fuzzer, Target, capture_session
from .mrcsim_harness import (
    RecordingNetwork,
    Transfer,
    all_drops,
    failures,
    fuzz_settings,
    make_transfer,
    split_stale,
    unaccounted,
)

THROUGHPUT: list[tuple[int, float]] = []  # (datagrams, seconds) per example, for the report


@functools.cache
def _captured() -> list[bytes]:
    return capture_session(qpn=3)


def _setup(seed: int, faults: Faults) -> tuple[RecordingNetwork, Transfer]:
    net = RecordingNetwork(seed, faults)
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=700, max_outstanding=32, psn_window=256)
    rng = random.Random(seed)
    qa, qb = net.connect(
        "a", "b", evs=8, config=cfg, qpn_a=3, qpn_b=4, psn_a=rng.getrandbits(24), psn_b=77
    )
    t = make_transfer(net, "a", "b", qa, qb, [60_000, 4_000], seed)
    t.post(0, 1_000, rng.randbytes(25_000))
    t.post(1, 100, rng.randbytes(2_000), imm=1)
    t.post(0, 30_000, rng.randbytes(20_000), imm=2)
    return net, t


def _fuzz_run(rng: random.Random, n: int, faults: Faults) -> tuple[RecordingNetwork, Transfer]:
    net, t = _setup(rng.getrandbits(16), faults)
    qa, qb = t.qp, t.peer
    target = Target(
        qpns=[qa.qpn, qb.qpn],
        psn_base=qa.initial_psn,
        psn_span=400,
        live_rkeys={mr.rkey for mr in t.regions},
        live_evs=set(qa.evs.values) | set(qb.evs.values),
    )
    fuzzer = Fuzzer(rng, target, _captured())
    left = [n]

    def inject() -> bool:
        # called between simulated events: deliver fuzz right there, mid-transfer
        while left[0] and (t.done or rng.random() < 0.3):
            left[0] -= 1
            dst = rng.choice(["a", "b"])
            net._deliver(dst, fuzzer.next(), rng.choice([9999, rng.randrange(1, 65536)]))
        return t.done and not left[0]

    start = time.perf_counter()
    assert run_until_with(net, inject), (failures(net), left)
    THROUGHPUT.append((n, time.perf_counter() - start))
    return net, t


def run_until_with(net: RecordingNetwork, until: Callable[[], bool]) -> bool:
    """Run the simulation until ``until()`` holds; keep time moving when the transfer is done
    but fuzz is left (a timer far ahead keeps the event heap non-empty)."""
    net._at(50.0, lambda: None)
    done = net.run(until, max_time=60)
    net.run(max_time=net.now + 0.5)  # deliver what is still on the wire (e.g. probe replies)
    return done


@fuzz_settings(300)
@given(st.integers(0, 2**64), st.integers(1, 300))
def test_fuzzed_datagrams_change_nothing_on_a_clean_network(seed: int, n: int) -> None:
    net, t = _fuzz_run(random.Random(seed), n, Faults())
    qa = t.qp
    assert not failures(net)
    t.check_final()  # every byte right, sentinels intact elsewhere, imms and completions in order
    assert qa.stats.retransmits == 0  # no forged NACK or ACK made the sender resend
    changes = [e for h in net.hosts.values() for e in h.events if isinstance(e, EVStateChanged)]
    assert changes == []
    # every fuzzed datagram was dropped and counted (a forged probe is answered, and its reply,
    # naming an EV the peer does not have, is dropped there instead)
    assert sum(all_drops(net).values()) == n
    assert set(unaccounted(net).values()) == {0}, unaccounted(net)


@fuzz_settings(100)
@given(st.integers(0, 2**64), st.integers(1, 300))
def test_fuzzed_datagrams_amid_trims_and_loss(seed: int, n: int) -> None:
    """The same amid real trims, loss and reordering: genuine NACKs and resends are in flight,
    so forged ones have state to hit; still nothing but the network's faults shows."""
    net, t = _fuzz_run(random.Random(seed), n, Faults(loss=0.02, trim=0.05, reorder=0.3))
    assert not failures(net)
    t.check_final()
    drops, stale = split_stale(all_drops(net))
    # forged ACKs and NACKs are refused under the same reasons as genuine stale ones (which
    # only resends and trims make); the reply to a forged probe can be lost on the way
    dropped = sum(drops.values()) + sum(stale.values())
    replies = t.qp.stats.probes_received + t.peer.stats.probes_received
    assert n - replies <= dropped <= n + t.qp.stats.retransmits + 2 * t.peer.stats.trims_seen
    assert set(unaccounted(net).values()) == {0}, unaccounted(net)


def test_fuzz_throughput_is_reported() -> None:
    """Not a check of speed: prints what the fuzz tests above pushed through the core."""
    rng = random.Random(5)
    n = 3000
    net, t = _fuzz_run(rng, n, Faults())
    t.check_final()
    assert sum(all_drops(net).values()) == n
    total = sum(k for k, _ in THROUGHPUT)
    secs = sum(s for _, s in THROUGHPUT)
    print(f"\ncore fuzz: {total} datagrams in {secs:.2f} s of simulation ({total / secs:.0f}/s)")
