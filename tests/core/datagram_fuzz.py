"""A datagram fuzzer shared by the simulated and the real-socket fuzz tests.

It plays a stranger who can send UDP to both endpoints and knows a good deal: the wire format,
both QP numbers, the sender's PSN space (so it can aim at PSNs in flight), and genuine packets
of *another* session (``capture_session``: other rkeys, other PSNs, other EVs), which it
replays retargeted and mutated. What it does not know is what only the path reveals: the rkeys
and region addresses of this session, and the EV each packet of it took.
``Fuzzer.sanitize`` enforces that: a data packet never carries a live rkey, and no ACK, NACK
or probe echoes a live EV. Without keys a stranger who guesses those can write into
registered memory or complete a write early (docs/PROTOCOL.md, section 11); the fuzz tests
check that nothing less gets it anywhere.

Every draw comes from a ``random.Random``: the tests seed it (or derive the seed from
hypothesis) so a run is reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from mrc import wire
from mrc.core import QPConfig
from mrc.lab.sim import Faults, SimNetwork

OP_W = int(wire.Opcode.RDMA_WRITE_ONLY)
OP_WI = int(wire.Opcode.RDMA_WRITE_ONLY_IMM)
OP_ACK = int(wire.Opcode.ACKNOWLEDGE)
OP_PROBE = int(wire.Opcode.PROBE)
OP_REPLY = int(wire.Opcode.PROBE_REPLY)
DATA_OPS = (OP_W, OP_WI)
OPCODES = [OP_W, OP_WI, OP_ACK, OP_PROBE, OP_REPLY, 0x04, 0x0C, 0x00, 0x12, 0xFF]
NACK_CODES = [0, 1, 2, 3, 16, 17, 4, 31]


def capture_session(qpn: int = 1, seed: int = 99) -> list[bytes]:
    """Genuine datagrams of a short simulated session with trims and loss: data (with and
    without immediate, some trimmed), ACKs, SACKs and NACKs. Its rkeys, PSNs and EVs are
    its own, so replaying them elsewhere is the work of a stranger, not an eavesdropper."""
    captured: list[bytes] = []
    net = SimNetwork(seed, Faults(trim=0.1, loss=0.02, reorder=0.2))
    transmit = net._transmit

    def record(data: bytes, ev: int, dst: str) -> None:
        if len(captured) < 400:
            captured.append(bytes(data))
        transmit(data, ev, dst)

    net._transmit = record  # type: ignore[method-assign]
    net.add_host("a")
    net.add_host("b")
    qa, _qb = net.connect("a", "b", evs=4, config=QPConfig(payload_size=256), qpn_a=qpn)
    buf = bytearray(40_000)
    mr = net.hosts["b"].core.pd.register(buf)
    rng = random.Random(seed)
    qa.post_write(rng.randbytes(20_000), mr.addr, mr.rkey)
    qa.post_write(rng.randbytes(3_000), mr.addr + 30_000, mr.rkey, imm=7)
    assert net.run(lambda: qa.idle, max_time=30)
    return captured


@dataclass
class Target:
    """What the fuzzer aims at."""

    qpns: list[int]  # QP numbers it addresses (those of the session under attack)
    psn_base: int  # the sender's initial PSN: forged PSNs are drawn around it
    psn_span: int = 4096  # how far beyond psn_base the sender's PSNs may be
    live_rkeys: set[int] = field(default_factory=set)  # never put into a data packet
    live_evs: set[int] = field(default_factory=set)  # never echoed as an EV


class Fuzzer:
    """Draws one fuzzed datagram per ``next()`` call."""

    def __init__(self, rng: random.Random, target: Target, captured: list[bytes]) -> None:
        self.rng = rng
        self.t = target
        self.captured = captured
        self.kinds: list[Callable[[], bytes]] = [
            self.noise,
            self.bth_noise,
            self.data,
            self.data,
            self.ack,
            self.ack,
            self.nack,
            self.nack,
            self.probe,
            self.mutated,
            self.mutated,
            self.mutated,
        ]
        self.count = 0

    def next(self) -> bytes:
        self.count += 1
        return self.sanitize(self.rng.choice(self.kinds)())

    # ---- fields --------------------------------------------------------------------------

    def qpn(self) -> int:
        r = self.rng
        return r.choice(self.t.qpns) if r.random() < 0.85 else r.getrandbits(24)

    def psn(self) -> int:
        r = self.rng
        if r.random() < 0.8:
            off = r.choice([r.randrange(-64, self.t.psn_span), r.randrange(-(1 << 23), 1 << 23)])
            return (self.t.psn_base + off) & wire.PSN_MASK
        return r.getrandbits(24)

    def ev(self) -> int:
        """An EV value (32 bits: the simulator's are small numbers, real ones port << 16)."""
        r = self.rng
        return r.choice(
            [0, 1, 4791, 65535, 0xFFFFFFFF, r.getrandbits(16), r.getrandbits(32), 4791 << 16]
        )

    # ---- kinds ---------------------------------------------------------------------------

    def noise(self) -> bytes:
        r = self.rng
        return r.randbytes(r.choice([0, 1, 11, 12, 13, r.randrange(200), r.randrange(1500)]))

    def bth_noise(self) -> bytes:
        """A BTH that passes the endpoint's demux, then anything."""
        r = self.rng
        flags = r.choice([0, 0, 0x10, 0x80, r.getrandbits(8)])
        bth = wire.BTH.pack(
            r.choice(OPCODES), flags, r.getrandbits(16), self.qpn() | r.getrandbits(8) << 24, 0
        )
        bth = bth[:8] + r.getrandbits(8).to_bytes(1, "big") + self.psn().to_bytes(3, "big")
        return bth + r.randbytes(r.choice([0, 1, 16, 24, r.randrange(100)]))

    def data(self) -> bytes:
        r = self.rng
        length = r.choice([0, 1, 64, 1000, r.randrange(9000), r.getrandbits(32)])
        real = min(length, 2000)
        body = r.randbytes(max(0, real + r.choice([0, 0, 0, -1, 1, -real])))
        imm = r.getrandbits(32) if r.random() < 0.3 else None
        hdr = bytearray(
            wire.pack_data(
                self.qpn(),
                self.psn(),
                r.getrandbits(64),
                r.getrandbits(32),
                length & 0xFFFFFFFF,
                r.random() < 0.5,
                imm,
            )
        )
        if r.random() < 0.2:
            hdr[4] |= r.choice([wire.BTH_TRIMMED, wire.BTH_TRIMMED | wire.BTH_LASTHOP, 0x80])
        if r.random() < 0.05:
            hdr[8] |= wire.BTH_SECURE
        return bytes(hdr) + body

    def ack(self, nack: bool = False) -> bytes:
        r = self.rng
        syndrome = (wire.AETH_NAK_BASE | r.choice(NACK_CODES)) if nack else wire.AETH_ACK
        if r.random() < 0.1:
            syndrome = r.getrandbits(8)
        subject = self.psn()
        cum = r.choice([subject, self.psn(), (self.t.psn_base - 1) & wire.PSN_MASK])
        bitmap = r.choice([0, (1 << 64) - 1, r.getrandbits(64)])
        return wire.pack_ack(
            self.qpn(),
            cum,
            syndrome,
            subject | (r.getrandbits(8) << 24 if r.random() < 0.1 else 0),
            r.choice([subject & ~63 & wire.PSN_MASK, self.psn()]),
            bitmap,
            self.ev(),
            r.choice([0xFFFF, 0, r.getrandbits(16)]),
        )

    def nack(self) -> bytes:
        return self.ack(nack=True)

    def probe(self) -> bytes:
        r = self.rng
        return wire.pack_probe(
            self.qpn(), r.getrandbits(24), self.ev(), r.getrandbits(64), r.random() < 0.5
        )

    def mutated(self) -> bytes:
        """A genuine packet of another session: retargeted, then bit-flipped, truncated,
        extended or with fields replaced."""
        r = self.rng
        pkt = bytearray(r.choice(self.captured))
        if len(pkt) >= 8 and r.random() < 0.8:
            pkt[5:8] = self.qpn().to_bytes(3, "big")
        for _ in range(r.choice([0, 1, 1, 2, 3, 8])):
            what = r.random()
            if what < 0.4 and pkt:
                bit = r.randrange(len(pkt) * 8)
                pkt[bit // 8] ^= 1 << (bit % 8)
            elif what < 0.55 and pkt:
                del pkt[r.randrange(len(pkt)) :]
            elif what < 0.65:
                pkt += r.randbytes(r.randrange(1, 40))
            elif what < 0.8 and len(pkt) >= 12:
                pkt[9:12] = self.psn().to_bytes(3, "big")
            elif what < 0.9 and len(pkt) >= 24:
                pkt[20:24] = r.getrandbits(32).to_bytes(4, "big")  # rkey or base/bitmap
            elif len(pkt) >= 36:
                pkt[32:36] = self.ev().to_bytes(4, "big")  # an ACK's echoed EV
        return bytes(pkt)

    # ---- what the stranger cannot know ---------------------------------------------------

    def sanitize(self, pkt: bytes) -> bytes:
        """Replace a live rkey in a data packet, and a live EV echoed by an ACK or
        carried by a probe, by one that is not live."""
        if len(pkt) < wire.BTH_LEN:
            return pkt
        op = pkt[0]
        out = bytearray(pkt)
        if op in DATA_OPS and len(out) >= 24:
            while int.from_bytes(out[20:24], "big") in self.t.live_rkeys:
                out[20:24] = self.rng.getrandbits(32).to_bytes(4, "big")
        elif op == OP_ACK and len(out) >= 36:
            while int.from_bytes(out[32:36], "big") in self.t.live_evs:
                out[32:36] = self.rng.getrandbits(32).to_bytes(4, "big")
        elif op in (OP_PROBE, OP_REPLY) and len(out) >= 16:
            while int.from_bytes(out[12:16], "big") in self.t.live_evs:
                out[12:16] = self.rng.getrandbits(32).to_bytes(4, "big")
        return bytes(out)
