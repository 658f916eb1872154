"""The library API on loopback, in one event loop: listen / connect / write / next_immediate."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import mmap
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import cast

import numpy as np
import pytest

import mrc
from mrc.connection import Buffer, Connection, Listener
from mrc.core.memory import ProtectionDomain

HOST = "::1"


@contextlib.asynccontextmanager
async def session(
    buffer: Buffer | None = None, name: str = "inbox", senders: int = 1, **connect_kw: object
) -> AsyncIterator[tuple[Listener, list[Connection], list[Connection]]]:
    """A listener (with ``buffer`` registered as ``name``), ``senders`` connections to it and
    the listener's side of each (in the same order)."""
    listener = await mrc.listen(HOST, 0)
    regions = connect_kw.pop("regions", None)  # connect()'s own; the rest configure it
    conns: list[Connection] = []
    try:
        if buffer is not None:
            listener.register(buffer, name=name)
        peers = []
        for _ in range(senders):
            conns.append(
                await mrc.connect(
                    HOST,
                    listener.port,
                    mrc.ConnectConfig(**connect_kw),  # type: ignore[arg-type]
                    regions=regions,  # type: ignore[arg-type]
                )
            )
            peers.append(await listener.accept(timeout=5))
        yield listener, conns, peers
    finally:
        for c in conns:
            await c.close()
        await listener.close()


def sha(b: object) -> str:
    return hashlib.sha256(memoryview(b).cast("B")).hexdigest()  # type: ignore[arg-type]


def _buffer(kind: str, size: int) -> tuple[Buffer, memoryview]:
    """A registrable buffer of ``size`` bytes and a byte view of it."""
    if kind == "bytearray":
        b: Buffer = bytearray(size)
    elif kind == "mmap":
        b = mmap.mmap(-1, size)
    else:
        b = np.zeros(size // 4, dtype=np.float32)  # type: ignore[assignment]  # 3.12+ stubs: a buffer
    return b, memoryview(b).cast("B")


@pytest.mark.parametrize("kind", ["bytearray", "mmap", "numpy"])
async def test_write_and_write_imm_land_at_their_offsets(kind: str) -> None:
    size = 1 << 20
    buf, view = _buffer(kind, size)
    first = os.urandom(100_000)  # many packets at the default 1400-byte payload
    second = os.urandom(30_001)
    async with session(buf, evs=32) as (_l, [conn], [peer]):
        region = conn.remote["inbox"]
        assert region.length == size
        assert await conn.write(first, region, offset=4096) == len(first)
        assert await conn.write(second, region, offset=600_000, imm=0xDEADBEEF) == len(second)
        assert await peer.next_immediate(timeout=5) == 0xDEADBEEF
        assert sha(view[4096 : 4096 + len(first)]) == sha(first)
        assert sha(view[600_000 : 600_000 + len(second)]) == sha(second)
        # nothing outside the two writes was touched
        assert not any(view[:4096])
        assert not any(view[4096 + len(first) : 600_000])
        assert not any(view[600_000 + len(second) :])
        st = peer.stats()
        assert st["bytes_placed"] == len(first) + len(second)
        assert st["dropped_by_reason"] == {}
        assert conn.stats()["data_packets_sent"] == -(-len(first) // 1400) + -(-len(second) // 1400)
    if kind == "numpy":
        floats = np.frombuffer(first[:4000], dtype=np.float32)
        assert np.array_equal(buf[1024 : 1024 + 1000], floats, equal_nan=True)  # type: ignore[index]


async def test_numpy_array_receives_floats() -> None:
    arr = np.zeros((64, 1024), dtype=np.float64)
    values = np.arange(32 * 1024, dtype=np.float64) * 0.5
    # (NumPy's stubs call an array a buffer only on Python 3.12+; on 3.11 it is one all the same)
    async with session(arr, name="grads", evs=16) as (_l, [conn], [peer]):  # type: ignore[arg-type]
        region = conn.remote["grads"]
        assert region.length == arr.nbytes
        # rows 16..47: byte offset 16 rows * 1024 * 8 bytes
        await conn.write(values, region, offset=16 * 1024 * 8, imm=3)  # type: ignore[arg-type]
        assert await peer.next_immediate(timeout=5) == 3
    assert np.array_equal(arr[16:48].ravel(), values)
    assert not arr[:16].any() and not arr[48:].any()


async def test_write_imm_completions_in_posting_order() -> None:
    sizes = [0, 1, 511, 512, 513, 20_000, 3, 70_000, 0, 4096] * 3
    total = sum(sizes)
    data = os.urandom(total)
    buf = bytearray(total + 1)
    cfg = mrc.QPConfig(payload_size=512)
    async with session(buf, evs=64, qp=cfg) as (_l, [conn], [peer]):
        region = conn.remote["inbox"]
        futs, offsets, off = [], [], 0
        for i, n in enumerate(sizes):
            # every other work request is a plain WRITE: it completes with no immediate
            imm = 1000 + i if i % 2 == 0 else None
            futs.append(conn.post_write(data[off : off + n], region, off, imm=imm))
            offsets.append(off)
            off += n
        seen = []
        for _ in range(len(sizes) // 2):
            imm = await peer.next_immediate(timeout=5)
            seen.append(imm)
            i = imm - 1000
            # completion of WRITE_IMM i means every write posted before it is placed
            end = offsets[i] + sizes[i]
            assert buf[:end] == data[:end]
        assert seen == [1000 + i for i in range(0, len(sizes), 2)]
        assert await asyncio.gather(*futs) == sizes
        assert buf[:total] == data
        # a round of the spray gives each EV one burst (of one plane's share of the window,
        # QPConfig.burst_batch): every EV carried data, or every burst went on its own EV
        used = sum(1 for e in conn.ev_report() if e["packets"])
        bursts = conn.counters()["bursts"]
        assert used == min(64, bursts), (used, bursts)


async def test_bidirectional_writes_into_the_senders_announced_region() -> None:
    inbox = bytearray(1 << 20)
    back = bytearray(1 << 19)
    pd = ProtectionDomain()
    back_region = pd.register(back, name="back")
    to_recv = os.urandom(700_000)
    to_send = os.urandom(300_000)
    async with session(inbox, evs=16, regions=[back_region]) as (_l, [conn], [peer]):
        assert set(peer.remote) == {"back"}
        assert peer.remote["back"].length == len(back)
        # both directions at once on the same QP pair
        a, b = await asyncio.gather(
            conn.write(to_recv, conn.remote["inbox"], offset=10, imm=1),
            peer.write(to_send, peer.remote["back"], offset=100, imm=2),
        )
        assert (a, b) == (len(to_recv), len(to_send))
        assert await peer.next_immediate(timeout=5) == 1
        assert await conn.next_immediate(timeout=5) == 2
        assert sha(inbox[10 : 10 + len(to_recv)]) == sha(to_recv)
        assert sha(back[100 : 100 + len(to_send)]) == sha(to_send)
        assert conn.stats()["dropped_by_reason"] == {}
        assert conn.stats()["bytes_placed"] == len(to_send)


async def test_several_senders_write_their_slices_of_one_region() -> None:
    n, part = 4, 1 << 21
    shared = bytearray(n * part)
    data = [os.urandom(part) for _ in range(n)]
    cfg = mrc.QPConfig(payload_size=8192)
    async with session(shared, name="shared", senders=n, evs=32, qp=cfg) as (
        listener,
        conns,
        peers,
    ):
        assert len(listener.connections) == n
        assert len({c.remote["shared"].rkey for c in conns}) == 1
        assert len({p.qpn for p in peers}) == n
        done = await asyncio.gather(
            *(
                c.write(data[i], c.remote["shared"], offset=i * part, imm=i)
                for i, c in enumerate(conns)
            )
        )
        assert done == [part] * n
        # each sender's immediate arrives on its own connection at the listener
        for i, p in enumerate(peers):
            assert await p.next_immediate(timeout=5) == i
            assert p.stats()["bytes_placed"] == part
        for i in range(n):
            assert sha(shared[i * part : (i + 1) * part]) == sha(data[i]), f"slice {i}"


async def test_write_outside_the_region_raises_before_sending() -> None:
    async with session(bytearray(10_000), evs=4) as (_l, [conn], [peer]):
        region = conn.remote["inbox"]
        for offset, length in ((9_995, 10), (-1, 5), (0, 10_001), (10_001, 0)):
            with pytest.raises(ValueError, match="does not fit region 'inbox'"):
                conn.post_write(b"x" * length, region, offset)
        assert conn.stats()["packets_sent"] == 0
        assert peer.stats()["packets_received"] == 0
        # the connection is still usable, and the edge of the region is reachable
        assert await conn.write(b"y" * 10, region, offset=9_990) == 10
        assert peer.stats()["packets_received"] == 1


async def test_connect_refused_when_nothing_listens(mrc_port: int) -> None:
    t0 = time.monotonic()
    with pytest.raises(mrc.MRCError, match="refused"):
        await mrc.connect(HOST, mrc_port, mrc.ConnectConfig(evs=4))
    assert time.monotonic() - t0 < 2


@contextlib.asynccontextmanager
async def fake_server(answer: bytes | None) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A TCP server that reads the hello and answers ``answer`` (or never answers)."""
    hellos: list[bytes] = []
    writers: list[asyncio.StreamWriter] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        writers.append(w)
        hellos.append(await r.readline())
        if answer is not None:
            w.write(answer)
            await w.drain()

    server = await asyncio.start_server(handle, HOST, 0)
    try:
        yield server.sockets[0].getsockname()[1], hellos
    finally:
        for w in writers:
            w.close()
        server.close()
        await server.wait_closed()


async def test_version_mismatch_is_reported() -> None:
    answer = b'{"mrc": 99, "ok": true, "qpn": 5, "psn": 0, "udp_port": 1, "regions": []}\n'
    async with fake_server(answer) as (port, hellos):
        with pytest.raises(mrc.MRCError, match=r"version mismatch.*version 99"):
            await mrc.connect(HOST, port, mrc.ConnectConfig(evs=4))
    assert b'"mrc":3' in hellos[0]


async def test_receiver_refusal_reason_is_reported() -> None:
    answer = b'{"mrc": 3, "ok": false, "error": "transfer too large"}\n'
    async with fake_server(answer) as (port, _hellos):
        with pytest.raises(mrc.MRCError, match="refused by the receiver: transfer too large"):
            await mrc.connect(HOST, port, mrc.ConnectConfig(evs=4))


async def test_connect_times_out_when_the_peer_never_answers() -> None:
    async with fake_server(None) as (port, hellos):
        t0 = time.monotonic()
        with pytest.raises(mrc.MRCError, match="did not answer.*in time"):
            await mrc.connect(HOST, port, mrc.ConnectConfig(evs=4, timeout=0.3))
        elapsed = time.monotonic() - t0
    assert len(hellos) == 1
    assert 0.25 < elapsed < 1.5, elapsed


async def test_connect_times_out_when_syns_are_dropped() -> None:
    """A TCP listener whose accept queue is full drops SYNs: the connect itself hangs."""
    lsock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    fillers: list[socket.socket] = []
    try:
        lsock.bind((HOST, 0))
        lsock.listen(0)
        port = lsock.getsockname()[1]
        for _ in range(4):  # the backlog of 0 admits one; the rest wait in SYN_SENT
            s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect((HOST, port))
            fillers.append(s)
        t0 = time.monotonic()
        with pytest.raises(mrc.MRCError, match=r"unreachable \(no answer in 0.3 s\)"):
            await mrc.connect(HOST, port, mrc.ConnectConfig(evs=4, timeout=0.3))
        assert time.monotonic() - t0 < 1.5
    finally:
        for s in fillers:
            s.close()
        lsock.close()


async def test_peer_vanishing_exhausts_the_retry_budget() -> None:
    cfg = mrc.QPConfig(min_rto=0.01, initial_rto=0.02, max_rto=0.05, max_timeout_retries=5)
    async with session(bytearray(1 << 20), evs=8, qp=cfg) as (listener, [conn], _peers):
        region = conn.remote["inbox"]
        assert await conn.write(b"a" * 5000, region) == 5000  # the path works
        listener.endpoint.close()  # the receiver's sockets vanish without a word
        t0 = time.monotonic()
        with pytest.raises(mrc.MRCError, match="retry budget exhausted") as info:
            await conn.write(os.urandom(50_000), region, offset=8192)
        assert time.monotonic() - t0 < 3
        assert "after 5 timeouts" in str(info.value)
        assert conn.error is not None and "retry budget" in conn.error
        assert cast(int, conn.stats()["retransmits_timeout"]) >= 5
        # a failed QP refuses new work at once
        with pytest.raises(mrc.MRCError, match="retry budget"):
            conn.post_write(b"b", region)
