"""End-to-end invariants of the core over hundreds of seeded simulated networks.

Each case posts several WRITEs and WRITE_IMMs (including a zero-length WRITE_IMM and a write
that ends exactly at a region's end) into sentinel-filled regions, with initial PSNs biased to
the 2^24 wrap, and checks while the simulation runs and at its end:

* every written byte is in place and every other byte still holds the sentinel;
* ImmediateReceived events come in posting order, with the right values, and only once all
  data before them (in posting order) is placed;
* WriteCompleted comes for every wr_id, in order, and only once its bytes are placed remotely;
* each byte is placed once: bytes_placed equals the bytes written, and every packet that arrived
  more than once is counted as a duplicate;
* the sender never exceeds max_outstanding or snd_una + psn_window; every retransmission
  leaves on a different EV than the transmission it replaces; retransmissions are bounded;
* no QP fails, and nothing legitimate is dropped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from mrc import wire
from mrc.core import ImmediateReceived, QPConfig
from mrc.lab.sim import Faults

from .mrcsim_harness import (
    RecordingNetwork,
    Transfer,
    all_drops,
    failures,
    make_transfer,
    plan_writes,
    random_config,
    random_psn,
    run_until,
    split_stale,
    unaccounted,
)


@dataclass(frozen=True)
class Mix:
    name: str
    loss: float = 0.0
    trim: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0

    def faults(self) -> Faults:
        return Faults(
            loss=self.loss, trim=self.trim, duplicate=self.duplicate, reorder=self.reorder
        )


MIXES = [
    Mix("clean"),
    Mix("loss", loss=0.03),
    Mix("trim", trim=0.15),
    Mix("dup_reorder", duplicate=0.1, reorder=0.4),
    Mix("combined", loss=0.02, trim=0.03, duplicate=0.03, reorder=0.2),
    Mix("heavy_loss", loss=0.2),
]
SEEDS_PER_MIX = 100  # 600 cases in all
KINDS = ("one_way", "bidirectional", "three_to_one")


def _cases() -> list[tuple[Mix, int]]:
    return [(mix, seed) for mix in MIXES for seed in range(SEEDS_PER_MIX)]


def build(mix: Mix, seed: int, kind: str) -> tuple[RecordingNetwork, list[Transfer]]:
    rng = random.Random(f"{mix.name}/{seed}/{kind}")
    net = RecordingNetwork(seed, mix.faults())
    evs = rng.choice([2, 3, 4, 8, 16, 32, 128])
    planes = rng.choice([1, 1, 2, 4])
    transfers: list[Transfer] = []
    if kind == "three_to_one":
        net.add_host("r")
        senders = []
        for i in range(3):
            name = f"s{i}"
            net.add_host(name)
            qs, qr = net.connect(
                name,
                "r",
                evs=evs,
                planes=planes,
                config=random_config(rng),
                qpn_a=5 + i,
                qpn_b=20 + i,
                psn_a=random_psn(rng),
                psn_b=random_psn(rng),
            )
            senders.append((name, qs, qr))
        for i, (name, qs, qr) in enumerate(senders):
            sizes = [rng.randrange(20_000, 80_000) for _ in range(rng.choice([1, 2]))]
            t = make_transfer(net, name, "r", qs, qr, sizes, seed * 10 + i)
            plan_writes(t, rng, rng.randrange(10_000, 60_000))
            transfers.append(t)
        return net, transfers
    net.add_host("a")
    net.add_host("b")
    qa, qb = net.connect(
        "a",
        "b",
        evs=evs,
        planes=planes,
        config=random_config(rng),
        qpn_a=rng.randrange(1, 46),
        qpn_b=rng.randrange(1, 46),
        psn_a=random_psn(rng),
        psn_b=random_psn(rng),
    )
    sizes = [rng.randrange(20_000, 200_000) for _ in range(rng.choice([1, 2]))]
    t = make_transfer(net, "a", "b", qa, qb, sizes, seed)
    transfers.append(t)
    if kind == "bidirectional":
        back = make_transfer(net, "b", "a", qb, qa, [rng.randrange(20_000, 120_000)], ~seed)
        transfers.append(back)
    # post in an interleaved order when both directions are active
    for tr in transfers:
        plan_writes(tr, rng, rng.randrange(20_000, 150_000 // len(transfers)))
    return net, transfers


def check_run(mix: Mix, net: RecordingNetwork, transfers: list[Transfer]) -> None:
    assert run_until(net, transfers), (
        f"did not finish by t={net.now}: failures={failures(net)} "
        f"idle={[t.qp.idle for t in transfers]} imms={[t.imms_seen for t in transfers]}"
    )
    assert not failures(net)
    for t in transfers:
        t.check_final()
    assert not net.violations, net.violations[:3]

    # Legitimate traffic is never dropped as malformed. The one exception: a network duplicate
    # delayed until the receiver is more than psn_window past it is counted as out of window.
    drops, stale = split_stale(all_drops(net))
    assert set(unaccounted(net).values()) == {0}, unaccounted(net)
    # ACKs/NACKs the senders refused as stale: in these seeds only network duplicates make
    # them (a duplicated NACK, or the ACK of a duplicate racing a resend), and rarely
    if mix.duplicate == 0:
        assert stale == {}, stale
    else:
        dups = sum(t.peer.stats.duplicates + t.peer.stats.trims_seen for t in transfers)
        assert sum(stale.values()) <= dups, (stale, dups)
    if mix.duplicate == 0:
        assert drops == {}
    else:
        assert set(drops) <= {"psn_out_of_window"}, drops

    for t in transfers:
        st, pst = t.qp.stats, t.peer.stats
        key = (t.src, t.qp.qpn)
        txs = net.data_tx[key]
        # every retransmission leaves on a different EV than the one it replaces
        last_ev: dict[int, int] = {}
        for tx in txs:
            if tx.seq in last_ev:
                assert tx.ev != last_ev[tx.seq], f"seq {tx.seq} retransmitted on EV {tx.ev}"
            last_ev[tx.seq] = tx.ev
        # the wire agrees with the counters
        assert len(txs) == st.data_packets_sent + st.retransmits
        assert len(last_ev) == st.data_packets_sent
        assert sorted(last_ev) == list(range(st.data_packets_sent))  # no gaps, no extras
        # every resend has one cause; a resend an ACK made unnecessary is counted as cancelled
        assert st.retransmits + st.retransmits_cancelled == (
            st.retransmits_nack
            + st.retransmits_timeout
            + st.retransmits_sack
            + st.retransmits_tlp
            + st.retransmits_link
        )

        # retransmissions are bounded by what the faults can explain
        p = mix.loss + mix.trim
        if p == 0:
            assert st.retransmits == 0
            assert pst.trims_seen == 0 and pst.nacks_sent == 0
        else:
            expected_losses = st.data_packets_sent * p / (1 - p)
            bound = 3 * expected_losses + 2 * t.qp.config.max_outstanding + 8
            assert st.retransmits <= bound, (st.retransmits, bound)
        if mix.trim == 0:
            assert st.retransmits_nack == 0 and pst.trims_seen == 0
        if mix.loss == 0:
            # no real loss: trims are the only reason to resend, and each is NACKed at once
            assert st.retransmits_timeout == 0
            if mix.duplicate == 0:
                assert pst.nacks_sent == pst.trims_seen
                assert st.nacks == pst.nacks_sent
                assert st.retransmits_nack == pst.nacks_sent
        if mix.duplicate == 0 and mix.loss == 0:
            assert pst.duplicates == 0

    # a sanity check that the faults were really applied (when enough packets make a fault
    # near-certain: at least ~10 expected)
    n_sent = len(net.sent)
    if mix.loss * n_sent >= 10:
        assert net.lost > 0
    n_data = sum(len(v) for v in net.data_tx.values())
    if mix.trim * n_data >= 10:
        assert net.trimmed > 0
        assert sum(t.peer.stats.trims_seen for t in transfers) > 0
    if mix.duplicate * n_data >= 10:
        assert sum(t.peer.stats.duplicates for t in transfers) > 0


@pytest.mark.parametrize(("mix", "seed"), _cases(), ids=lambda v: getattr(v, "name", v))
def test_invariants(mix: Mix, seed: int) -> None:
    net, transfers = build(mix, seed, KINDS[seed % len(KINDS)])
    check_run(mix, net, transfers)


# ---- targeted scenarios --------------------------------------------------------------------


def test_bidirectional_simultaneous_writes_on_one_qp_pair() -> None:
    """Both ends write to each other at once over the same QP pair, through every fault."""
    mix = Mix("combined", loss=0.02, trim=0.05, duplicate=0.05, reorder=0.3)
    for seed in range(10):
        net, transfers = build(mix, 1000 + seed, "bidirectional")
        a_to_b, b_to_a = transfers
        assert a_to_b.qp is b_to_a.peer and b_to_a.qp is a_to_b.peer
        check_run(mix, net, transfers)
        # data really flowed both ways at overlapping times
        ta = [tx.time for tx in net.data_tx[("a", a_to_b.qp.qpn)]]
        tb = [tx.time for tx in net.data_tx[("b", b_to_a.qp.qpn)]]
        assert ta and tb and min(ta) <= max(tb) and min(tb) <= max(ta)
        assert a_to_b.peer.stats.bytes_placed == a_to_b.total_bytes > 0
        assert b_to_a.peer.stats.bytes_placed == b_to_a.total_bytes > 0


def test_three_senders_share_one_receiver_protection_domain() -> None:
    mix = Mix("combined", loss=0.02, trim=0.03, duplicate=0.03, reorder=0.2)
    for seed in range(10):
        net, transfers = build(mix, 2000 + seed, "three_to_one")
        rcv = net.hosts["r"].core
        assert len(rcv.qps) == 3
        regions = [mr for t in transfers for mr in t.regions]
        assert {mr.rkey for mr in regions} == {mr.rkey for mr in rcv.pd.regions()}
        assert len({mr.rkey for mr in regions}) == len(regions)
        check_run(mix, net, transfers)
        for t in transfers:
            # each receiver QP placed exactly its own sender's bytes, nothing from the others
            assert t.peer.stats.bytes_placed == t.total_bytes
            imms = [
                e.imm
                for (_, h, e) in net.event_times
                if h == "r" and e.qpn == t.peer.qpn and isinstance(e, ImmediateReceived)
            ]
            assert imms == [t.writes[i].imm for i in t.imm_writes]


def test_psn_wrap_is_crossed() -> None:
    """A transfer that starts 10 PSNs before 2^24 really wraps, and still lands intact."""
    net = RecordingNetwork(7, Mix("combined", 0.03, 0.05, 0.05, 0.3).faults())
    net.add_host("a")
    net.add_host("b")
    cfg = QPConfig(payload_size=500, max_outstanding=32)
    qa, qb = net.connect("a", "b", evs=8, config=cfg, psn_a=wire.PSN_MASK - 9, psn_b=0xABCDEF)
    t = make_transfer(net, "a", "b", qa, qb, [60_000], 7)
    t.post(0, 0, random.Random(1).randbytes(30_000))
    t.post(0, 30_000, random.Random(2).randbytes(29_000), imm=0x1234)
    check_run(Mix("combined", 0.03, 0.05, 0.05, 0.3), net, [t])
    psns = [tx.psn for tx in net.data_tx[("a", qa.qpn)]]
    assert wire.PSN_MASK in psns and 0 in psns and max(psns) == wire.PSN_MASK
    assert t.buffers[0][59_000:] == t.sentinels[0][59_000:]  # the gap kept its sentinel
