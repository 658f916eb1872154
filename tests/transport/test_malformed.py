"""Malformed and forged datagrams fired at a receiver in the middle of a real 64 MiB transfer.

The transfer must complete with a matching hash, and the receiver must count every datagram it
dropped under the right reason. Library in-process: the forging socket knows the receiver's QP
number, rkey and the sender's PSN space, so near-valid packets are wrong in exactly one way.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, cast

import pytest

import mrc
from mrc import wire
from mrc.connection import Connection, Listener
from mrc.errors import MRCError
from mrc.transport.endpoint import Endpoint

MiB = 1 << 20


def forgeries(
    qpn: int, other_qpn: int, psn: int, addr: int, rkey: int, length: int
) -> list[tuple[str, bytes]]:
    """(reason, datagram) pairs; each datagram is wrong in exactly one way."""
    payload = b"\xee" * 64

    def data(
        qpn: int = qpn,
        psn: int = psn,
        va: int = addr,
        rkey: int = rkey,
        n: int = 64,
        body: bytes = payload,
        flags1: int | None = None,
        op: int | None = None,
    ) -> bytes:
        hdr = bytearray(wire.pack_data(qpn, psn, va, rkey, n, False, None))
        if flags1 is not None:
            hdr[1] = flags1
        if op is not None:
            hdr[0] = op
        return bytes(hdr) + body

    secure = bytearray(data())
    secure[8] |= wire.BTH_SECURE
    imm_secure = bytearray(wire.pack_data(qpn, psn, addr, rkey, 64, False, 7) + payload)
    imm_secure[8] |= wire.BTH_SECURE
    far = (psn + (1 << 23) - 5) & wire.PSN_MASK
    return [
        ("short", b""),
        ("short", b"\x0a\x00\xff\xff\x00"),  # 5 bytes
        ("short", data()[: wire.BTH_LEN - 1]),
        ("bad_version", data(flags1=0x01)),  # TVer 1
        ("bad_version", data(flags1=0x0F)),
        ("unknown_qp", data(qpn=other_qpn)),
        ("bad_opcode", data(op=0x04)),  # RC SEND ONLY: not part of MRC
        ("bad_opcode", data(op=0x0C)),  # RC READ REQUEST
        ("short", data()[: wire.DATA_HDR_LEN - 1]),  # BTH ok, RETH cut
        ("bad_rkey", data(rkey=rkey ^ 0x5A5A5A5A)),
        ("out_of_bounds", data(va=addr + length - 32)),  # 64 bytes, 32 past the end
        ("out_of_bounds", data(va=addr - 64)),
        ("psn_out_of_window", data(psn=far)),
        ("bad_length", data(body=payload + b"\xee" * 16)),  # 80 bytes, header says 64
        ("security_unsupported", bytes(secure)),
        ("security_unsupported", bytes(imm_secure)),
    ]


async def test_malformed_datagrams_are_counted_and_the_transfer_survives() -> None:
    size = 64 * MiB
    data = os.urandom(size)
    inbox = bytearray(size)
    listener = await mrc.listen("::1", 0)
    conn = None
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        region_local = listener.register(inbox, name="inbox")
        cfg = mrc.QPConfig(payload_size=8192)
        conn = await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=128, qp=cfg))
        peer = await listener.accept(timeout=5)
        region = conn.remote["inbox"]
        assert region.rkey == region_local.rkey
        qpn = peer.qpn
        other = (qpn + 1) & wire.QPN_MASK or 1
        assert other not in listener.endpoint.core.qps
        cases = forgeries(qpn, other, conn.qp.initial_psn, region.addr, region.rkey, size)
        expected: dict[str, int] = {}
        for reason, _ in cases:
            expected[reason] = expected.get(reason, 0) + 1

        fut = conn.post_write(memoryview(data), region, 0, imm=42)
        # wait for the transfer to be under way (placement has begun), then fire
        deadline = time.monotonic() + 10
        while peer.stats()["bytes_placed"] == 0:
            assert time.monotonic() < deadline, "transfer never started"
            await asyncio.sleep(0)
        forger.connect(("::1", listener.port))
        for _reason, dgram in cases:
            forger.send(dgram)
        assert not fut.done(), "transfer finished before the forgeries were sent"
        placed_when_fired = cast(int, peer.stats()["bytes_placed"])
        assert placed_when_fired < size

        assert await asyncio.wait_for(fut, 30) == size
        assert await peer.next_immediate(timeout=5) == 42
        assert hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()

        # the forgeries sit in the socket queue behind data already there: await their count
        deadline = time.monotonic() + 5
        while sum(cast("dict[str, int]", peer.stats()["dropped_by_reason"]).values()) < len(cases):
            assert time.monotonic() < deadline, peer.stats()["dropped_by_reason"]
            await asyncio.sleep(0.01)
        assert peer.stats()["dropped_by_reason"] == expected
        assert peer.stats()["bytes_placed"] == size
        assert not peer.error and not conn.error
        # the receiver NACKed the forgeries it could attribute to the QP; the sender ignored
        # them because they name PSNs/EVs it never used that way
        st: dict[str, Any] = conn.stats()
        assert st["nacks_ignored"] == st["nacks"]
        # no forged NACK caused a retransmission (timing-driven ones may happen on a loaded
        # machine; they are the core's business, not the forgeries')
        assert st["retransmits_nack"] == 0
    finally:
        forger.close()
        if conn is not None:
            await conn.close()
        await listener.close()


async def test_forgeries_before_any_data_do_not_disturb_a_later_transfer() -> None:
    """Forged packets for the right QP at the start of the PSN space must not be placed or
    count as received: the genuine packets with those PSNs must still be accepted."""
    size = 4 * MiB
    data = os.urandom(size)
    inbox = bytearray(size)
    listener = await mrc.listen("::1", 0)
    conn = None
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        listener.register(inbox, name="inbox")
        conn = await mrc.connect(
            "::1", listener.port, mrc.ConnectConfig(evs=16, qp=mrc.QPConfig(payload_size=8192))
        )
        peer = await listener.accept(timeout=5)
        region = conn.remote["inbox"]
        qpn = peer.qpn
        cases = [
            c
            for c in forgeries(qpn, qpn ^ 1, conn.qp.initial_psn, region.addr, region.rkey, size)
            if c[0] not in ("short", "bad_version", "unknown_qp")
        ]
        forger.connect(("::1", listener.port))
        for _reason, dgram in cases:
            forger.send(dgram)
        deadline = time.monotonic() + 5
        while sum(cast("dict[str, int]", peer.stats()["dropped_by_reason"]).values()) < len(cases):
            assert time.monotonic() < deadline, peer.stats()["dropped_by_reason"]
            await asyncio.sleep(0.01)
        assert peer.stats()["packets_received"] == 0
        assert await conn.write(data, region, imm=9) == size
        assert await peer.next_immediate(timeout=5) == 9
        assert inbox == data
        # no real packet was taken for a duplicate of a forgery (only resends can duplicate)
        assert cast(int, peer.stats()["duplicates"]) <= cast(int, conn.stats()["retransmits"])
    finally:
        forger.close()
        if conn is not None:
            await conn.close()
        await listener.close()


# ---- forged acknowledgements and injected writes (issue 9) ---------------------------------
#
# The forger below knows a lot: QP numbers, both UDP ports, the sender's PSN space and the EV
# ports of the sender. What it cannot see is which EV each packet took (it is not on the path).
# To keep PSNs in flight long enough to aim at them, the receiver stops reading its socket for a
# while (``paused``): the sender's packets wait in the kernel queue, unacknowledged, and the
# first retransmission timeout is a second away.

SLOW_RTO: dict[str, Any] = dict(
    initial_rto=1.0, max_rto=1.0, payload_size=1000, max_outstanding=64, cc="fixed"
)


@contextlib.contextmanager
def paused(endpoint: Endpoint) -> Iterator[None]:
    """The endpoint reads nothing inside the block (its datagrams queue in the kernel)."""
    loop = endpoint.loop
    for sock in endpoint.listen_sockets:
        loop.remove_reader(sock.fileno())
    try:
        yield
    finally:
        for sock in endpoint.listen_sockets:
            loop.add_reader(sock.fileno(), endpoint._on_readable, sock)


async def until(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Poll ``cond`` (a counter the loop updates) until it holds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


def received(conn: Connection) -> int:
    return conn.endpoint.core.datagrams_received


@contextlib.asynccontextmanager
async def pair(
    size: int, evs: int = 16, **cfg: Any
) -> AsyncIterator[tuple[Listener, Connection, Connection, bytearray, socket.socket]]:
    """listener, sender connection, receiver connection, inbox, forger socket."""
    inbox = bytearray(size)
    listener = await mrc.listen("::1", 0)
    conn = None
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        listener.register(inbox, name="inbox")
        conn = await mrc.connect(
            "::1", listener.port, mrc.ConnectConfig(evs=evs, qp=mrc.QPConfig(**cfg))
        )
        peer = await listener.accept(timeout=5)
        yield listener, conn, peer, inbox, forger
    finally:
        forger.close()
        if conn is not None:
            await conn.close()
        await listener.close()


def nack(conn: Connection, psn: int, echo: int, code: int = wire.NackCode.TRIMMED) -> bytes:
    """A NACK to ``conn`` (the sender) about ``psn``, echoing EV port ``echo``."""
    below = (conn.qp.initial_psn - 1) & wire.PSN_MASK  # cumulative point: nothing yet
    return wire.pack_ack(conn.qp.qpn, below, wire.AETH_NAK_BASE | code, psn, psn & ~63, 0, echo)


async def test_forged_trimmed_nack_flood_changes_nothing() -> None:
    """1001 TRIMMED NACKs for one in-flight PSN, echoing EVs it was not sent on, plus as many
    for PSNs not in flight: no retransmission, no EV state change, no failure; each dropped
    and counted. Then a volley echoing the right EV: one retransmission, the rest dropped."""
    size = 64 * 1000
    data = os.urandom(size)
    async with pair(size, **SLOW_RTO) as (listener, conn, peer, inbox, forger):
        region = conn.remote["inbox"]
        forger.connect(("::1", conn.endpoint.port))
        req = conn.qp.requester
        ports = conn.qp.evs.values
        with paused(listener.endpoint):
            fut = conn.post_write(data, region)
            assert req.in_flight == 64
            first = req._outstanding[0]
            psn = conn.qp.initial_psn
            wrong = [p for i, p in enumerate(ports) if i != first.ev] + [9, 65535]
            before = received(conn)
            volley = [nack(conn, psn, wrong[i % len(wrong)]) for i in range(1001)]
            volley += [nack(conn, (psn + 64 + i) & wire.PSN_MASK, ports[0]) for i in range(1001)]
            for d in volley:
                forger.send(d)
            await until(lambda: received(conn) - before == len(volley), "volley not received")
            st: dict[str, Any] = conn.stats()
            drops = st["dropped_by_reason"]
            assert not conn.error, conn.error
            assert st["retransmits_nack"] == 0 and st["retransmits"] == 0
            assert conn.ev_counters()["evs_skipped"] == 0
            assert drops.get("nack_wrong_ev") == 1001, drops
            assert drops.get("nack_not_in_flight") == 1001, drops
            assert first.nacks == 0
            # the forger guesses the right EV: one NACK per transmission has an effect
            before = received(conn)
            right = [nack(conn, psn, ports[first.ev]) for _ in range(300)]
            for d in right:
                forger.send(d)
            await until(lambda: received(conn) - before == len(right), "volley not received")
            st = cast("dict[str, Any]", conn.stats())
            drops = st["dropped_by_reason"]
            assert st["retransmits_nack"] == 1, st
            assert drops.get("nack_repeated", 0) + drops.get("nack_wrong_ev") - 1001 == 299
            assert conn.ev_counters()["evs_skipped"] <= 1
            assert not conn.error
        assert await asyncio.wait_for(fut, 10) == size
        assert hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()
        assert conn.endpoint.core.unaccounted() == 0
        assert listener.endpoint.core.unaccounted() == 0


async def test_injected_write_at_the_next_psn_does_not_kill_the_connection() -> None:
    """A WRITE injected (with the real rkey: unavoidable without keys) at the PSN the sender
    will use next moves the receiver's cumulative point past what was sent. The sender takes
    such ACKs as evidence for what it did send (counting ``ack_beyond_sent``) and both sides
    carry on: the write in flight completes, and so does a later one."""
    size = 200 * 1000
    data = os.urandom(size)
    async with pair(size, **SLOW_RTO, max_timeout_retries=3) as (
        listener,
        conn,
        peer,
        inbox,
        forger,
    ):
        region = conn.remote["inbox"]
        forger.connect(("::1", listener.port))
        req = conn.qp.requester
        first = data[: 20 * 1000]
        with paused(listener.endpoint):
            # the injection reaches the receiver first, the 20 genuine packets right behind it:
            # the last of them moves the cumulative point over PSN 20 at once
            nxt = (conn.qp.initial_psn + 20) & wire.PSN_MASK
            evil = wire.pack_data(
                peer.qpn, nxt, region.addr + size - 100, region.rkey, 100, True, None
            )
            forger.send(evil + b"\xee" * 100)
            fut = conn.post_write(first, region)
            assert req.in_flight == 20 and req._next_seq == 20
        assert await asyncio.wait_for(fut, 10) == len(first)
        assert cast(int, conn.stats()["ack_beyond_sent"]) >= 1
        assert bytes(inbox[-100:]) == b"\xee" * 100  # it landed: no keys, no defence
        # the next write's first packet (the injected PSN) is a duplicate to the receiver and
        # its data is lost to the injection; the connection itself must survive
        rest = data[20 * 1000 : size - 1000]
        assert await asyncio.wait_for(conn.write(rest, region, 20 * 1000, imm=5), 10) == len(rest)
        assert await peer.next_immediate(timeout=5) == 5
        assert bytes(inbox[21 * 1000 : size - 1000]) == rest[1000:]
        assert not conn.error and not peer.error
        assert conn.stats()["retransmits_timeout"] == 0
        await until(lambda: conn.endpoint.core.unaccounted() == 0, "sender accounting")
        await until(lambda: listener.endpoint.core.unaccounted() == 0, "receiver accounting")


async def test_forged_ack_completes_nothing() -> None:
    """ACKs naming PSNs not in flight, beyond what was sent, or echoing an EV the PSN was not
    sent on: no write completes, nothing is acknowledged, each is dropped and counted; the
    write completes only when its data has really arrived."""
    size = 30 * 1000
    data = os.urandom(size)
    async with pair(size, **SLOW_RTO) as (listener, conn, peer, inbox, forger):
        region = conn.remote["inbox"]
        forger.connect(("::1", conn.endpoint.port))
        req = conn.qp.requester
        qpn, ip, ports = conn.qp.qpn, conn.qp.initial_psn, conn.qp.evs.values
        with paused(listener.endpoint):
            fut = conn.post_write(data, region)
            assert req.in_flight == 30
            ev0 = ports[req._outstanding[0].ev]
            wrong = next(p for p in ports if p != ev0)

            def ack(cum: int, subject: int, echo: int, bitmap: int = 0) -> bytes:
                c, s = (ip + cum) & wire.PSN_MASK, (ip + subject) & wire.PSN_MASK
                return wire.pack_ack(qpn, c, wire.AETH_ACK, s, ip, bitmap, echo)

            forged = [
                ack(29, 29 + 5000, ev0),  # subject never sent
                ack(29, -1, ev0),  # subject before the first PSN
                ack(40, 40, ev0),  # beyond what was sent
                ack(29, 0, wrong),  # in flight, wrong EV
                ack(-1, 0, wrong, bitmap=(1 << 30) - 1),  # SACKs everything, wrong EV
                ack(29, 100, 12345),
            ] * 50
            before = received(conn)
            for d in forged:
                forger.send(d)
            await until(lambda: received(conn) - before == len(forged), "forgeries not received")
            assert not fut.done()
            assert req.in_flight == 30 and req.acked_packets == 0
            st: dict[str, Any] = conn.stats()
            assert st["sacks"] == 0 and not conn.error
            assert sum(st["dropped_by_reason"].values()) == len(forged), st["dropped_by_reason"]
            assert conn.endpoint.core.unaccounted() == 0
        assert await asyncio.wait_for(fut, 10) == size
        assert hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()


async def test_unknown_rkey_and_out_of_window_psn_get_no_answer() -> None:
    """A WRITE with an rkey the receiver's domain does not know is dropped as silently as one
    for an unknown QP (no NACK, no ACK, no PSN/SACK state): the rkey cannot be probed. So is a
    WRITE beyond the PSN window, even with the real rkey."""
    size = 10 * 1000
    async with pair(size) as (listener, conn, peer, inbox, forger):
        region = conn.remote["inbox"]
        forger.connect(("::1", listener.port))
        assert await conn.write(b"x" * 1000, region) == 1000
        qp = peer.qp
        cum = qp.responder.received_through
        sent_before = (qp.stats.acks_sent, qp.stats.nacks_sent)
        psn = (conn.qp.initial_psn + 1) & wire.PSN_MASK  # the next PSN: otherwise acceptable
        far = (psn + qp.config.psn_window + 10) & wire.PSN_MASK
        before = received(peer)
        for rkey in range(1, 201):  # none is the region's (it is 32 random bits)
            if rkey != region.rkey:
                forger.send(wire.pack_data(peer.qpn, psn, region.addr, rkey, 8, True, 7) + b"e" * 8)
        forger.send(wire.pack_data(peer.qpn, far, region.addr, region.rkey, 8, True, 7) + b"e" * 8)
        # (at least: the answers to the receiver's reverse probes arrive meanwhile)
        await until(lambda: received(peer) - before >= 201, "forgeries not received")
        drops = peer.stats()["dropped_by_reason"]
        assert drops == {"bad_rkey": 200, "psn_out_of_window": 1}
        assert (qp.stats.acks_sent, qp.stats.nacks_sent) == sent_before
        assert qp.responder.received_through == cum
        assert conn.stats()["nacks"] == 0
        assert bytes(inbox[1000:]) == bytes(size - 1000)
        assert listener.endpoint.core.unaccounted() == 0


# ---- an on-path observer without keys (issue 36) -------------------------------------------
#
# This forger sees which EV each packet took (it reads it from the requester, as a party on the
# path reads it from the packets), so its NACKs pass every check an ACK can be put to. What
# it says must still not end the QP, and what it can cost is bounded.


async def test_six_observed_nacks_with_code_0_do_not_end_the_transfer() -> None:
    """Code 0 (PSN sequence error) is never sent by an mrc responder: six of them, each
    echoing the EV its PSN really took, are dropped and counted; the data arrives. Before,
    the first believed one failed the QP ("peer reports PSN out of window")."""
    size = 64 * 1000
    data = os.urandom(size)
    async with pair(size, **SLOW_RTO) as (listener, conn, peer, inbox, forger):
        region = conn.remote["inbox"]
        forger.connect(("::1", conn.endpoint.port))
        req = conn.qp.requester
        ports = conn.qp.evs.values
        with paused(listener.endpoint):
            fut = conn.post_write(data, region)
            seqs = list(req._outstanding)[:6]
            volley = [
                nack(
                    conn,
                    (conn.qp.initial_psn + s) & wire.PSN_MASK,
                    ports[req._outstanding[s].ev],
                    wire.NackCode.PSN_SEQUENCE_ERROR,
                )
                for s in seqs
            ]
            before = received(conn)
            for d in volley:
                forger.send(d)
            await until(lambda: received(conn) - before == len(volley), "volley not received")
            st: dict[str, Any] = conn.stats()
            assert not conn.error, conn.error
            assert st["dropped_by_reason"].get("nack_code_unused") == 6, st["dropped_by_reason"]
            assert st["retransmits"] == 0
        assert await asyncio.wait_for(fut, 10) == size
        assert hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()
        assert conn.endpoint.core.unaccounted() == 0


async def test_an_observed_remote_access_nack_is_held_and_contradicted() -> None:
    """REMOTE_ACCESS_ERROR, which a responder does send, echoing the right EV: without keys
    it is held until the packet's next transmission is refused too; the real receiver
    acknowledges that one, the NACK is counted as contradicted, the data arrives."""
    size = 64 * 1000
    data = os.urandom(size)
    async with pair(size, **SLOW_RTO) as (listener, conn, peer, inbox, forger):
        region = conn.remote["inbox"]
        forger.connect(("::1", conn.endpoint.port))
        req = conn.qp.requester
        ports = conn.qp.evs.values
        with paused(listener.endpoint):
            fut = conn.post_write(data, region)
            first = req._outstanding[0]
            before = received(conn)
            forger.send(
                nack(conn, conn.qp.initial_psn, ports[first.ev], wire.NackCode.REMOTE_ACCESS_ERROR)
            )
            await until(lambda: received(conn) - before == 1, "NACK not received")
            assert not conn.error, conn.error
            assert conn.stats()["nacks_unconfirmed"] == 1
        assert await asyncio.wait_for(fut, 10) == size
        assert hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()
        st: dict[str, Any] = conn.stats()
        assert st["nacks_contradicted"] == 1 and not conn.error
        assert st["retransmits_nack"] == 1  # the one resend it cost


async def test_forged_port_state_announcements_cost_no_resends() -> None:
    """Forged "nothing received" ACKs (the one ACK no EV check applies to) flap the peer's port
    state between 0x0000 and 0xFFFE, 400 of them mid-transfer: once the peer acknowledged
    anything they contradict what the sender knows and are dropped; and a believed ACK
    saying every plane is down is refused. Before, each flap resent a window (5322
    retransmissions in one run)."""
    size = 64 * 1000
    data = os.urandom(size)
    async with pair(size, **SLOW_RTO) as (listener, conn, peer, inbox, forger):
        region = conn.remote["inbox"]
        forger.connect(("::1", conn.endpoint.port))
        qpn, ip = conn.qp.qpn, conn.qp.initial_psn
        # something acknowledged first: the peer has been heard
        assert await conn.write(data[:1000], region) == 1000
        below = (ip - 1) & wire.PSN_MASK
        with paused(listener.endpoint):
            fut = conn.post_write(data, region)
            volley = [
                wire.pack_ack(qpn, below, wire.AETH_ACK, ip, 0, 0, 0, 0xFFFE if i % 2 else 0)
                for i in range(400)
            ]
            before = received(conn)
            for d in volley:
                forger.send(d)
            # (at least: the last ACK of the write before may still come in meanwhile)
            await until(lambda: received(conn) - before >= len(volley), "volley not received")
            st: dict[str, Any] = conn.stats()
            assert st["dropped_by_reason"].get("ack_nothing_late") == 400, st["dropped_by_reason"]
            # (a tail loss probe into the paused receiver's silence is timing, not forgery)
            assert st["retransmits_link"] == 0 and st["retransmits"] == st["retransmits_tlp"]
            assert not any(conn.qp.evs.peer_plane_down)
        assert await asyncio.wait_for(fut, 10) == size
        assert hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()
        assert conn.endpoint.core.unaccounted() == 0


async def test_acks_the_receiver_never_sent_are_named_on_both_sides() -> None:
    """The observer acknowledges a whole transfer that never arrived (one ACK echoing the
    EV of the last packet: unavoidable without keys). The sender's write completes, and the
    end-to-end check names what happened on both sides instead of "verdict unreadable"."""
    from mrc.app.transfer import receive_buffer, send_buffer
    from mrc.transport.messages import Abort

    size = 20 * 1000
    listener = await mrc.listen(
        "::1", 0, mrc.ListenerConfig(region_factory=lambda n, _req: bytearray(n))
    )
    conn = None
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        conn = await mrc.connect(
            "::1",
            listener.port,
            mrc.ConnectConfig(evs=16, request_size=size, qp=mrc.QPConfig(**SLOW_RTO)),
        )
        peer = await listener.accept(timeout=5)
        forger.connect(("::1", conn.endpoint.port))
        req = conn.qp.requester

        async def receiver() -> str:
            assert peer.granted is not None  # the listener made the region it requested
            try:
                await receive_buffer(peer, peer.granted.view)
            except MRCError as exc:  # what mrc-recv does: tell the sender why, then fail
                await peer.send_message(Abort(str(exc)).to_json())
                return str(exc)
            return "completed"

        with paused(listener.endpoint):
            recv_task = asyncio.ensure_future(receiver())
            send_task = asyncio.ensure_future(send_buffer(conn, memoryview(os.urandom(size))))
            await until(lambda: req.in_flight == 21, "the data and its WRITE_IMM not in flight")
            last = max(req._outstanding)
            psn = (conn.qp.initial_psn + last) & wire.PSN_MASK
            echo = conn.qp.evs.values[req._outstanding[last].ev]
            forger.send(wire.pack_ack(conn.qp.qpn, psn, wire.AETH_ACK, psn, 0, 0, echo))
            with pytest.raises(MRCError) as err:
                await asyncio.wait_for(send_task, 20)
            said = await asyncio.wait_for(recv_task, 20)
        assert peer.bytes_placed == 0
        assert "acknowledgements this receiver did not send" in said, said
        assert f"all {size} bytes were acknowledged, but only 0 arrived" in said
        assert str(err.value).startswith("the receiver gave up: the sender says all")
        assert "unreadable" not in str(err.value)
    finally:
        forger.close()
        if conn is not None:
            await conn.close()
        await listener.close()


async def test_observed_trim_nacks_proved_false_stop_cutting_the_window() -> None:
    """The observer sends a TRIMMED NACK for every packet it sees (each echoing the right EV):
    each costs one resend (one NACK per transmission is believed), and the ACKs of the very
    copies they named prove them false; after 8 such, trims only resend: they no longer cut
    the window or skip EVs. The data arrives."""
    size = 64 * 1000
    data = os.urandom(size)
    async with pair(size, **SLOW_RTO, ack_every=1) as (listener, conn, peer, inbox, forger):
        region = conn.remote["inbox"]
        forger.connect(("::1", conn.endpoint.port))
        req = conn.qp.requester
        ports = conn.qp.evs.values

        async def write_under_nacks() -> int:
            """Post the write into the paused receiver, then a TRIMMED NACK for every packet
            in flight, on the EV it took; the write's completion once the receiver reads."""
            with paused(listener.endpoint):
                fut = conn.post_write(data, region)
                volley = [
                    nack(conn, (conn.qp.initial_psn + s) & wire.PSN_MASK, ports[p.ev])
                    for s, p in list(req._outstanding.items())
                ]
                before = received(conn)
                for d in volley:
                    forger.send(d)
                # (at least: a probe of the paused receiver's EVs may be answered meanwhile)
                await until(lambda: received(conn) - before >= len(volley), "volley not received")
            assert await asyncio.wait_for(fut, 10) == size
            assert hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()
            return len(volley)

        sent = await write_under_nacks()
        st: dict[str, Any] = conn.stats()
        assert st["retransmits_nack"] == sent
        assert st["trims_contradicted"] >= 8, st
        assert not conn.error
        # a second volley, now that trims are known to be forged here: resends only
        assert st["trims_distrusted"] == 0
        sent = await write_under_nacks()
        assert conn.stats()["trims_distrusted"] == sent
