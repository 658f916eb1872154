"""Fuzzed and forged datagrams sprayed at both UDP ports of a real transfer on loopback.

The stranger of tests/core/datagram_fuzz.py (knows the QP numbers, the sender's PSN space,
packets of another session; not the live rkeys, addresses or EVs) sends random bytes, valid
headers with random fields, mutated genuine packets and forged ACKs, NACKs and probes at the
receiver's and the sender's ports while a WRITE is under way. Checked: no exception anywhere
(the loop's exception handler records), the write completes with the right SHA-256, no byte of
a registered region outside it changed (on either side), every fuzzed datagram was counted
exactly once (dropped, or answered as a probe), every datagram either endpoint received is
accounted for, and no file descriptor leaked.
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
from mrc.core.memory import ProtectionDomain
from mrc.core.qp import QueuePair

SEED = 20260509
MiB = 1 << 20
FUZZ_LIMIT = 50_000  # datagrams at most
FUZZ_SECONDS = 6.0  # and at most this long
CHUNK = MiB  # the sender writes the data in pieces of this size, over and over, meanwhile


def _pattern(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _instrument(core: EndpointCore, forger_port: int, seen: list[int], bad: list[bytes]) -> None:
    """Wrap ``core.receive_datagram``: each datagram from the forger must move the counters by
    exactly one, either a drop or a probe taken (answered), and nothing else."""
    inner = core.receive_datagram

    def totals() -> tuple[int, int, int]:
        qps = core.qps.values()
        taken = sum(qp.stats.taken() for qp in qps)
        drops = sum(core.dropped_by_reason.values())
        drops += sum(sum(qp.stats.dropped_by_reason.values()) for qp in qps)
        return taken, drops, sum(qp.stats.probes_received for qp in qps)

    def receive(
        data: memoryview, src_ev: int, now: float, wait: float | None = None
    ) -> QueuePair | None:
        if src_ev >> wire.EV_LABEL_BITS != forger_port:
            return inner(data, src_ev, now, wait)
        t0, d0, p0 = totals()
        qp = inner(data, src_ev, now, wait)
        t1, d1, p1 = totals()
        seen[0] += 1
        dropped = d1 - d0 == 1 and t1 == t0
        probe = d1 == d0 and t1 - t0 == 1 and p1 - p0 == 1
        if not (dropped or probe):
            bad.append(bytes(data))
        return qp

    core.receive_datagram = receive  # type: ignore[method-assign]


async def _until(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_fuzzed_datagrams_at_both_ports_during_a_transfer() -> None:
    gc.collect()  # what earlier tests left to the collector closes now, not during this one
    fds = len(os.listdir("/proc/self/fd"))
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    old_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    size = 24 * MiB
    margin = MiB
    data = os.urandom(size)
    fill = _pattern(size + 2 * margin, SEED)
    inbox = bytearray(fill)
    # memory of the sender's that its peer may write into: forged WRITEs to the sender's port
    # must not land there either
    mine_fill = _pattern(64 * 1024, SEED + 1)
    mine = bytearray(mine_fill)
    mine_region = ProtectionDomain().register(mine, name="mine")
    listener = await mrc.listen("::1", 0)
    conn = None
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        listener.register(inbox, name="inbox")
        cfg = mrc.QPConfig(payload_size=8192)
        conn = await mrc.connect(
            "::1", listener.port, mrc.ConnectConfig(evs=16, qp=cfg), regions=[mine_region]
        )
        peer = await listener.accept(timeout=5)
        endpoints = [listener.endpoint, conn.endpoint]
        forger.bind(("::1", 0))
        forger.setblocking(False)
        seen = [0]
        bad: list[bytes] = []
        for ep in endpoints:
            _instrument(ep.core, forger.getsockname()[1], seen, bad)
        target = Target(
            qpns=[peer.qpn, conn.qpn],
            psn_base=conn.qp.initial_psn,
            psn_span=2 * size // cfg.payload_size,
            live_rkeys={r.rkey for qp in (conn.qp, peer.qp) for r in qp.pd.regions()},
            live_evs=set(conn.qp.evs.values) | set(peer.qp.evs.values),
        )
        rng = random.Random(SEED)
        fuzzer = Fuzzer(rng, target, capture_session(qpn=peer.qpn, seed=SEED % 1000))
        dests = [("::1", listener.port), ("::1", conn.endpoint.port)]

        region = conn.remote["inbox"]
        view = memoryview(data)
        stop = asyncio.Event()
        rounds = [0]

        async def legit() -> None:
            """Write the data piece by piece, round after round, until the fuzz is over (each
            round writes the same bytes to the same places), then once more with an imm."""
            while not stop.is_set():
                for off in range(0, size, CHUNK):
                    assert await conn.write(view[off : off + CHUNK], region, margin + off) == CHUNK
                rounds[0] += 1
            assert await conn.write(view, region, margin, imm=0xF022) == size

        writer = asyncio.ensure_future(legit())
        sent = 0
        start = time.perf_counter()
        while sent < FUZZ_LIMIT and time.perf_counter() - start < FUZZ_SECONDS:
            assert not writer.done(), writer
            for _ in range(32):
                try:
                    forger.sendto(fuzzer.next(), rng.choice(dests))
                except BlockingIOError:
                    break
                sent += 1
            await asyncio.sleep(0)  # let both endpoints read
        elapsed = time.perf_counter() - start
        stop.set()
        await asyncio.wait_for(writer, 60)
        assert await peer.next_immediate(timeout=5) == 0xF022
        await _until(lambda: seen[0] == sent, f"{seen[0]} of {sent} fuzzed datagrams arrived")
        print(
            f"\nloopback fuzz: {sent} datagrams in {elapsed:.2f} s ({sent / elapsed:.0f}/s) "
            f"while {rounds[0]} x {size // MiB} MiB were written"
        )

        assert errors == [], errors[:3]
        assert sent >= 5000 and rounds[0] >= 1  # the fuzz really ran during transfers
        got = hashlib.sha256(inbox[margin : margin + size]).hexdigest()
        assert got == hashlib.sha256(data).hexdigest()
        assert inbox[:margin] == fill[:margin]
        assert inbox[margin + size :] == fill[margin + size :]
        assert mine == mine_fill
        assert not bad, f"{len(bad)} fuzzed datagrams not counted exactly once: " + ", ".join(
            b[:40].hex() for b in bad[:3]
        )
        await _until(
            lambda: [ep.core.unaccounted() for ep in endpoints] == [0, 0],
            f"unaccounted datagrams: {[ep.core.unaccounted() for ep in endpoints]}",
        )
        assert conn.error is None and peer.error is None
        assert peer.stats()["bytes_placed"] == (rounds[0] + 1) * size
        drops: Counter[str] = Counter()
        for ep in endpoints:
            drops.update(ep.core.all_drops())  # both ends' counts, summed
        assert drops["bad_rkey"] > 0 and drops["unknown_qp"] > 0, drops
    finally:
        forger.close()
        if conn is not None:
            await conn.close()
        await listener.close()
        loop.set_exception_handler(old_handler)
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == fds
