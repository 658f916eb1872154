"""With a key, a stranger who sees everything on the wire still writes nothing.

The fuzzer of tests/core/datagram_fuzz.py, made stronger: it knows the live rkeys, region
addresses and EVs, and it replays and mutates the session's own protected datagrams as the
sender put them on the wire. Without the key none of that may matter: every fuzzed datagram is
dropped (none is taken, not even a probe), every drop is a security or demux drop, the receiver
places exactly the legitimate bytes, and nothing else in memory changes.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import random
import socket
import time
from collections import Counter
from collections.abc import Callable

from core.datagram_fuzz import Fuzzer, Target, capture_session

import mrc
from mrc import wire
from mrc.core.endpoint import EndpointCore
from mrc.core.qp import QueuePair
from mrc.security.keys import generate_key

SEED = 20261123
MiB = 1 << 20
FUZZ_LIMIT = 30_000
FUZZ_SECONDS = 4.0
# demux drops (bad_opcode: an opcode with no headers to authenticate); all others: security_*
ALLOWED = {"short", "bad_version", "unknown_qp", "bad_opcode"}


class Insider(Fuzzer):
    """Knows the live rkey, addresses and EVs, and has the session's real packets."""

    region: tuple[int, int]  # (addr, length) of the live region, set once it is known

    def __init__(self, rng: random.Random, target: Target, live: list[bytes], rkey: int) -> None:
        super().__init__(rng, target, capture_session(qpn=target.qpns[0], seed=SEED % 1000))
        self.live = live
        self.rkey = rkey
        self.kinds += [self.known_write, self.known_write, self.replay, self.replay]

    def known_write(self) -> bytes:
        """A WRITE with the real rkey and an address inside the region, sealed or not."""
        r = self.rng
        addr, length = self.region
        hdr = bytearray(
            wire.pack_data(
                self.t.qpns[0], self.psn(), addr + r.randrange(length), self.rkey, 64, False, None
            )
        )
        if r.random() < 0.5:  # a made-up security block
            hdr[8] |= wire.BTH_SECURE
            return bytes(hdr) + r.randbytes(28) + b"\xee" * 64 + r.randbytes(16)
        return bytes(hdr) + b"\xee" * 64

    def replay(self) -> bytes:
        """One of the session's real protected datagrams, as sent or with one change."""
        r = self.rng
        pkt = bytearray(r.choice(self.live[-4096:]))
        what = r.random()
        if what < 0.3 and len(pkt) > 40:
            pkt[r.randrange(40, len(pkt))] ^= 1 << r.randrange(8)  # block or payload
        elif what < 0.5 and len(pkt) > 32:
            pkt[r.randrange(0, 32)] ^= 1 << r.randrange(8)  # headers
        elif what < 0.6 and len(pkt) > 70:
            del pkt[r.randrange(28, len(pkt)) :]
        elif what < 0.8 and len(pkt) > 70:
            # a counter never used: past the replay window, on to the tags
            at = 36 if pkt[0] == wire.Opcode.ACKNOWLEDGE else 28 + 4 * (pkt[0] == 0x0B)
            pkt[at + 4 : at + 12] = (r.getrandbits(40) + (1 << 41)).to_bytes(8, "big")
        return bytes(pkt)

    def sanitize(self, pkt: bytes) -> bytes:
        return pkt  # nothing is off limits: the key is what protects


class ForgerCounts:
    """What the datagrams from the forger's port did: taken (must stay 0), drops by reason."""

    def __init__(self) -> None:
        self.seen = 0
        self.taken = 0
        self.drops: Counter[str] = Counter()

    def watch(self, core: EndpointCore, forger_port: int) -> None:
        inner = core.receive_datagram

        def snapshot() -> tuple[int, Counter[str]]:
            taken = sum(qp.stats.taken() for qp in core.qps.values())
            return taken, Counter(core.all_drops())

        def receive(
            data: memoryview, src_ev: int, now: float, wait: float | None = None
        ) -> QueuePair | None:
            if src_ev >> wire.EV_LABEL_BITS != forger_port:
                return inner(data, src_ev, now, wait)
            taken0, drops0 = snapshot()
            qp = inner(data, src_ev, now, wait)
            taken1, drops1 = snapshot()
            self.seen += 1
            self.taken += taken1 - taken0
            self.drops.update(drops1 - drops0)
            return qp

        core.receive_datagram = receive  # type: ignore[method-assign]


async def test_keyed_session_survives_an_insider_fuzzer() -> None:
    gc.collect()  # what earlier tests left to the collector closes now, not during this one
    fds = len(os.listdir("/proc/self/fd"))
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    key = generate_key()
    size, margin = 8 * MiB, MiB
    data = os.urandom(size)
    fill = random.Random(SEED).randbytes(size + 2 * margin)
    inbox = bytearray(fill)
    listener = await mrc.listen("::1", 0, mrc.ListenerConfig(key=key))
    conn = None
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        listener.register(inbox, name="inbox")
        cfg = mrc.QPConfig(payload_size=8192)
        conn = await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=16, qp=cfg, key=key))
        peer = await listener.accept(timeout=5)
        live: list[bytes] = []

        def wrap(fn: Callable[..., int]) -> Callable[..., int]:
            def send(bufs: list[bytes | memoryview], *cmsg: object) -> int:
                live.append(b"".join(bytes(b) for b in bufs))
                return fn(bufs, *cmsg)

            return send

        conn.channel.send_fns = [wrap(f) for f in conn.channel.send_fns]
        region = conn.remote["inbox"]
        await conn.write(data[:MiB], region, margin)  # some real packets to replay
        forger.bind(("::1", 0))
        forger.setblocking(False)
        counts = ForgerCounts()
        for ep in (listener.endpoint, conn.endpoint):
            counts.watch(ep.core, forger.getsockname()[1])
        target = Target(qpns=[peer.qpn, conn.qpn], psn_base=conn.qp.initial_psn, psn_span=4096)
        rng = random.Random(SEED)
        fuzzer = Insider(rng, target, live, region.rkey)
        fuzzer.region = (region.addr, region.length)
        fuzzer.kinds.append(lambda: bytes(rng.choice(live)))  # plain replays too
        dests = [("::1", listener.port), ("::1", conn.endpoint.port)]
        stop = asyncio.Event()
        rounds = [0]

        async def legit() -> None:
            while not stop.is_set():
                assert await conn.write(data, region, margin) == size
                rounds[0] += 1

        writer = asyncio.ensure_future(legit())
        sent = 0
        start = time.perf_counter()
        while sent < FUZZ_LIMIT and time.perf_counter() - start < FUZZ_SECONDS:
            for _ in range(32):
                try:
                    forger.sendto(fuzzer.next(), rng.choice(dests))
                except BlockingIOError:
                    break
                sent += 1
            await asyncio.sleep(0)
        elapsed = time.perf_counter() - start
        stop.set()
        await asyncio.wait_for(writer, 60)
        deadline = time.monotonic() + 10
        while counts.seen < sent:
            assert time.monotonic() < deadline, f"{counts.seen} of {sent} arrived"
            await asyncio.sleep(0.01)
        print(f"\nkeyed insider fuzz: {sent} datagrams in {elapsed:.2f} s ({sent / elapsed:.0f}/s)")

        assert errors == [], errors[:3]
        assert sent >= 3000 and rounds[0] >= 1
        assert counts.taken == 0, f"{counts.taken} forged datagrams were taken"
        drops = counts.drops
        assert sum(drops.values()) == sent, (drops, sent)
        assert {k for k in drops if not k.startswith("security_")} <= ALLOWED, drops
        assert drops["security_replay"] > 0 and drops["security_missing"] > 0, drops
        assert drops["security_bad_tag"] > 0, drops
        # exactly the legitimate bytes were placed, and nothing outside them changed
        assert peer.stats()["bytes_placed"] == MiB + rounds[0] * size
        assert (
            hashlib.sha256(inbox[margin : margin + size]).digest() == hashlib.sha256(data).digest()
        )
        assert inbox[:margin] == fill[:margin] and inbox[margin + size :] == fill[margin + size :]
        assert conn.error is None and peer.error is None
    finally:
        forger.close()
        if conn is not None:
            await conn.close()
        await listener.close()
        loop.set_exception_handler(None)
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == fds
