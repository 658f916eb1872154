"""Test harness for the sans-IO core: an instrumented SimNetwork and a transfer checker.

``RecordingNetwork`` is a SimNetwork that sees every datagram each QP emits (with the EV it
went out on) and checks the sender-side window rules at the moment of sending. ``Transfer``
describes the WRITEs one QP posts to regions of its peer and checks, while the simulation
runs, that completions happen in order and only once their data is really in place.

Nothing here touches the core's behaviour: it only reads state and wraps the simulator.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings

from mrc import wire
from mrc.core import (
    Event,
    ImmediateReceived,
    MemoryRegion,
    QPConfig,
    QPFailed,
    QueuePair,
    WriteCompleted,
)
from mrc.core.psn import to_seq
from mrc.lab.sim import Faults, SimHost, SimNetwork

# Hypothesis settings for this suite: deterministic by default (the same examples every run);
# MRC_FUZZ_EXAMPLES=N switches to a longer, randomised search.
_FUZZ_EXAMPLES = int(os.environ.get("MRC_FUZZ_EXAMPLES", "0"))


def fuzz_settings(examples: int = 100) -> settings:
    return settings(
        derandomize=not _FUZZ_EXAMPLES,
        deadline=None,
        max_examples=_FUZZ_EXAMPLES or examples,
        suppress_health_check=[HealthCheck.too_slow],
    )


DATA_OPS = (int(wire.Opcode.RDMA_WRITE_ONLY), int(wire.Opcode.RDMA_WRITE_ONLY_IMM))


@dataclass(slots=True)
class Sent:
    """One datagram a QP handed to the network."""

    time: float
    host: str
    qpn: int
    ev: int  # EV index in the sending QP's EV set
    sport: int
    data: bytes


@dataclass(slots=True)
class DataTx:
    """One data-packet transmission, decoded."""

    time: float
    seq: int
    psn: int
    ev: int
    va: int
    length: int
    imm: int | None
    trimmed_flag: bool


class RecordingNetwork(SimNetwork):
    """SimNetwork that records what every QP sends and checks window/flow rules as it sends."""

    def __init__(self, seed: int = 0, faults: Faults | None = None) -> None:
        super().__init__(seed, faults)
        self.sent: list[Sent] = []
        self.data_tx: dict[tuple[str, int], list[DataTx]] = defaultdict(list)
        self.violations: list[str] = []
        self.max_in_flight: dict[tuple[str, int], int] = defaultdict(int)
        self.event_hooks: list[Callable[[SimHost, QueuePair, Event], None]] = []
        self.event_times: list[tuple[float, str, Event]] = []
        self._current: tuple[SimHost, QueuePair] | None = None
        # tamper(sent) -> bytes to put on the wire instead, or None to lose the datagram;
        # applied before the seeded Faults.
        self.tamper: Callable[[Sent], bytes | None] | None = None
        self.tampered_away = 0

    def pump(self, host: SimHost, qp: QueuePair) -> None:
        n = len(host.events)
        self._current = (host, qp)
        try:
            super().pump(host, qp)
        finally:
            self._current = None
        req = qp.requester
        key = (host.name, qp.qpn)
        inflight = req.in_flight
        if inflight > self.max_in_flight[key]:
            self.max_in_flight[key] = inflight
        if inflight > qp.config.max_outstanding:
            self.violations.append(
                f"{key}: {inflight} packets in flight > max_outstanding "
                f"{qp.config.max_outstanding} at t={self.now}"
            )
        for event in host.events[n:]:
            self.event_times.append((self.now, host.name, event))
            for hook in self.event_hooks:
                hook(host, qp, event)

    def _transmit(self, data: bytes, sport: int, dst: str) -> None:
        cur = self._current
        if cur is not None:
            host, qp = cur
            ev = qp.evs.index_of_value[sport]
            sent = Sent(self.now, host.name, qp.qpn, ev, sport, data)
            self.sent.append(sent)
            if data[0] in DATA_OPS:
                self._record_data(host, qp, ev, data)
            if self.tamper is not None:
                out = self.tamper(sent)
                if out is None:
                    self.tampered_away += 1
                    return
                data = out
        super()._transmit(data, sport, dst)

    def _record_data(self, host: SimHost, qp: QueuePair, ev: int, data: bytes) -> None:
        imm_op = data[0] == wire.Opcode.RDMA_WRITE_ONLY_IMM
        if imm_op:
            (_o, _f, _p, qpw, psnw, va, _rk, length, imm) = wire.DATA_IMM_HDR.unpack_from(data)
        else:
            (_o, _f, _p, qpw, psnw, va, _rk, length) = wire.DATA_HDR.unpack_from(data)
            imm = None
        psn = psnw & wire.PSN_MASK
        una = qp.requester._snd_una  # datagrams_to_send never moves it: valid at send time
        seq = to_seq(qp.initial_psn, psn, una)
        window = qp.config.psn_window
        if not una <= seq < una + window:
            self.violations.append(
                f"{(host.name, qp.qpn)}: sent seq {seq} outside [snd_una {una}, "
                f"snd_una + psn_window {una + window}) at t={self.now}"
            )
        self.data_tx[(host.name, qp.qpn)].append(
            DataTx(self.now, seq, psn, ev, va, length, imm, bool((qpw >> 24) & wire.BTH_TRIMMED))
        )

    def sent_by(self, host: str, qpn: int) -> list[Sent]:
        return [s for s in self.sent if s.host == host and s.qpn == qpn]


# ---- transfers ----------------------------------------------------------------------------


@dataclass(slots=True)
class Write:
    region: int  # index into Transfer.regions
    offset: int
    data: bytes
    imm: int | None
    wr_id: int = -1


@dataclass
class Transfer:
    """WRITEs from ``src``'s QP to regions registered on ``dst``'s endpoint."""

    net: RecordingNetwork
    src: str
    dst: str
    qp: QueuePair  # sender
    peer: QueuePair  # receiver
    regions: list[MemoryRegion]
    buffers: list[bytearray]
    sentinels: list[bytes]
    writes: list[Write] = field(default_factory=list)
    imms_seen: int = 0
    completions: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def imm_writes(self) -> list[int]:
        return [i for i, w in enumerate(self.writes) if w.imm is not None]

    @property
    def total_bytes(self) -> int:
        return sum(len(w.data) for w in self.writes)

    def post(self, region: int, offset: int, data: bytes, imm: int | None = None) -> Write:
        mr = self.regions[region]
        w = Write(region, offset, data, imm)
        w.wr_id = self.qp.post_write(data, mr.addr + offset, mr.rkey, imm=imm)
        self.writes.append(w)
        return w

    def expected(self, region: int, upto: int | None = None) -> bytearray:
        """What region ``region`` must hold once writes [0, upto) are placed."""
        exp = bytearray(self.sentinels[region])
        for w in self.writes[:upto]:
            if w.region == region:
                exp[w.offset : w.offset + len(w.data)] = w.data
        return exp

    def placed_ok(self, upto: int) -> list[str]:
        """Writes before ``upto`` whose bytes are not (yet) all in place."""
        bad = []
        for i, w in enumerate(self.writes[:upto]):
            got = self.buffers[w.region][w.offset : w.offset + len(w.data)]
            if got != w.data:
                bad.append(f"write {i} (wr_id {w.wr_id}, {len(w.data)} B at {w.offset})")
        return bad

    @property
    def done(self) -> bool:
        return self.qp.idle and self.imms_seen == len(self.imm_writes)

    # called by RecordingNetwork for every event any QP emits
    def on_event(self, host: SimHost, qp: QueuePair, event: Event) -> None:
        if host.name == self.dst and qp is self.peer and isinstance(event, ImmediateReceived):
            order = self.imm_writes
            k = self.imms_seen
            if k >= len(order):
                self.errors.append(f"unexpected ImmediateReceived {event.imm:#x}")
                return
            idx = order[k]
            want = self.writes[idx].imm
            if event.imm != want:
                self.errors.append(f"imm #{k}: got {event.imm:#x}, expected {want:#x}")
            missing = self.placed_ok(idx + 1)
            if missing:
                self.errors.append(
                    f"ImmediateReceived #{k} ({event.imm:#x}) before data placed: {missing[:3]}"
                )
            self.imms_seen += 1
        elif host.name == self.src and qp is self.qp and isinstance(event, WriteCompleted):
            k = len(self.completions)
            self.completions.append(event.wr_id)
            if k >= len(self.writes):
                self.errors.append(f"unexpected WriteCompleted {event.wr_id}")
                return
            w = self.writes[k]
            if event.wr_id != w.wr_id or event.length != len(w.data):
                self.errors.append(
                    f"completion #{k}: got wr_id {event.wr_id}/{event.length} B, expected "
                    f"{w.wr_id}/{len(w.data)} B"
                )
            missing = self.placed_ok(k + 1)
            if missing:
                self.errors.append(f"WriteCompleted {event.wr_id} before data placed: {missing}")

    def check_final(self) -> None:
        assert not self.errors, self.errors[:5]
        for r, buf in enumerate(self.buffers):
            exp = self.expected(r)
            if buf != exp:
                diff = [i for i in range(len(buf)) if buf[i] != exp[i]]
                raise AssertionError(
                    f"region {r}: {len(diff)} bytes differ, first at {diff[:5]} "
                    f"(of {len(buf)} bytes)"
                )
        assert self.imms_seen == len(self.imm_writes)
        assert self.completions == [w.wr_id for w in self.writes]
        st, pst = self.qp.stats, self.peer.stats
        # every byte placed exactly once; every duplicate recognised as such
        assert pst.bytes_placed == self.total_bytes, (pst.bytes_placed, self.total_bytes)
        assert pst.packets_received - pst.duplicates == st.data_packets_sent, (
            pst.packets_received,
            pst.duplicates,
            st.data_packets_sent,
        )
        assert st.bytes_sent == self.total_bytes


def sentinel(n: int, seed: int) -> bytes:
    """A recognisable, seed-dependent fill pattern (never all one value)."""
    rng = random.Random(seed ^ 0x5E71)
    return rng.randbytes(n)


def make_transfer(
    net: RecordingNetwork,
    src: str,
    dst: str,
    qp: QueuePair,
    peer: QueuePair,
    region_sizes: list[int],
    seed: int,
) -> Transfer:
    pd = net.hosts[dst].core.pd
    buffers, regions, sentinels = [], [], []
    for i, n in enumerate(region_sizes):
        fill = sentinel(n, seed * 31 + i)
        buf = bytearray(fill)
        buffers.append(buf)
        sentinels.append(fill)
        regions.append(pd.register(buf, name=f"{src}->{dst}#{i}"))
    t = Transfer(net, src, dst, qp, peer, regions, buffers, sentinels)
    net.event_hooks.append(t.on_event)
    return t


def plan_writes(t: Transfer, rng: random.Random, budget: int) -> None:
    """Post several non-overlapping WRITEs/WRITE_IMMs covering interesting places.

    Always includes a zero-length WRITE_IMM and a write that ends exactly at a region's end;
    leaves gaps so that bytes outside every write can be checked against the sentinel.
    """
    used = 0
    # per region: list of (start, end) already written
    taken: list[list[tuple[int, int]]] = [[] for _ in t.regions]

    def free_range(r: int, length: int) -> int | None:
        size = len(t.buffers[r])
        for _ in range(50):
            start = rng.randrange(0, max(1, size - length + 1))
            end = start + length
            if end > size:
                continue
            if all(end <= a or start >= b for a, b in taken[r]):
                return start
        return None

    # 1. a write ending exactly at the end of region 0
    size0 = len(t.buffers[0])
    tail_len = min(size0 // 4, rng.randrange(1, 20_000))
    tail = rng.randbytes(tail_len)
    taken[0].append((size0 - tail_len, size0))
    writes: list[tuple[int, int, bytes, int | None]] = [(0, size0 - tail_len, tail, None)]
    used += tail_len
    # 2. random writes until the budget is used
    while used < budget:
        r = rng.randrange(len(t.regions))
        length = rng.choice([1, 7, rng.randrange(1, 3000), rng.randrange(1000, 40_000)])
        length = min(length, budget - used, len(t.buffers[r]) // 3)
        if length <= 0:
            break
        start = free_range(r, length)
        if start is None:
            break
        taken[r].append((start, start + length))
        imm = rng.getrandbits(32) if rng.random() < 0.4 else None
        writes.append((r, start, rng.randbytes(length), imm))
        used += length
    rng.shuffle(writes)
    # 3. a zero-length WRITE_IMM somewhere in the middle, and one at the very end of a region
    #    (posted last, so its completion also marks the end of the message)
    writes.insert(rng.randrange(len(writes) + 1), (0, rng.randrange(size0), b"", 0xFFFFFFFF))
    r_last = len(t.regions) - 1
    writes.append((r_last, len(t.buffers[r_last]), b"", rng.getrandbits(32)))
    for r, off, data, imm in writes:
        t.post(r, off, data, imm)


def run_until(net: SimNetwork, transfers: list[Transfer], max_time: float = 200.0) -> bool:
    return net.run(lambda: all(t.done for t in transfers), max_time=max_time)


def failures(net: SimNetwork) -> list[QPFailed]:
    return [e for h in net.hosts.values() for e in h.events if isinstance(e, QPFailed)]


#: Drop reasons a sender also counts for genuine but stale ACKs and NACKs: about a transmission
#: since resent (a NACK or ACK racing the resend), or a packet acknowledged meanwhile (network
#: duplicates). The sender cannot tell these from forgeries, and need not: either way the
#: datagram tells it nothing it can safely act on.
STALE_REASONS = frozenset(
    {"ack_wrong_ev", "ack_not_sent", "nack_wrong_ev", "nack_not_in_flight", "nack_repeated"}
)


def split_stale(drops: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(drops other than STALE_REASONS, the stale ones)."""
    other = {k: v for k, v in drops.items() if k not in STALE_REASONS}
    return other, {k: v for k, v in drops.items() if k in STALE_REASONS}


def unaccounted(net: SimNetwork) -> dict[str, int]:
    """Per host, datagrams received that no counter took or dropped (should be all 0)."""
    return {name: h.core.unaccounted() for name, h in net.hosts.items()}


def all_drops(net: SimNetwork) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for h in net.hosts.values():
        for k, v in h.core.all_drops().items():
            out[k] += v
    return {k: v for k, v in out.items() if v}


def random_psn(rng: random.Random) -> int:
    """Initial PSNs biased towards the 2^24 wrap and other edges."""
    choice = rng.random()
    if choice < 0.4:
        return (1 << 24) - rng.randrange(1, 300)
    if choice < 0.5:
        return rng.choice([0, 1, (1 << 23) - 1, 1 << 23])
    return rng.randrange(1 << 24)


def random_config(rng: random.Random, **over: object) -> QPConfig:
    window = rng.choice([64, 128, 1024, 16384])
    cfg = QPConfig(
        payload_size=rng.randrange(500, 1501),
        max_outstanding=min(window, rng.choice([4, 16, 32, 64, 128])),
        psn_window=window,
        ack_every=rng.choice([1, 4, 16, 32]),
        spray_seed=rng.getrandbits(16),
    )
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg
