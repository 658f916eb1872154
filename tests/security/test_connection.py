"""Keys on real connections (loopback): the handshake, protected datagrams, forged traffic.

Each test runs a listener and a sender in one event loop. What the sender puts on the wire is
recorded by wrapping its EV sockets' ``sendmsg`` (the datagrams still go out unchanged), so a
test can replay or alter real protected packets with a socket of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable

import pytest

import mrc
from mrc import wire
from mrc.connection import Connection, Listener
from mrc.security.keys import generate_key
from mrc.security.packet import DATA_OVERHEAD, SEC_BLOCK_LEN, Mode, Protection

HOST = "::1"
KEY = generate_key()
MARKER = b"MRC-PLAINTEXT-MARKER-0123456789"
REGION = 4 << 20


def sha(b: object) -> str:
    return hashlib.sha256(memoryview(b).cast("B")).hexdigest()  # type: ignore[arg-type]


class Allocations:
    """region_factory / region_release for a listener, counting both."""

    def __init__(self) -> None:
        self.made = 0
        self.released = 0

    def factory(self, size: int, request: dict[str, object]) -> bytearray:
        self.made += 1
        return bytearray(max(size, 1))

    def release(self, buf: object) -> None:
        self.released += 1


def record(conn: Connection) -> list[bytes]:
    """Every datagram ``conn`` sends from now on, as sent."""
    sent: list[bytes] = []

    def wrap(fn: Callable[..., int]) -> Callable[..., int]:
        def send(bufs: list[bytes | memoryview], *cmsg: object) -> int:
            sent.append(b"".join(bytes(b) for b in bufs))
            return fn(bufs, *cmsg)

        return send

    conn.channel.send_fns = [wrap(f) for f in conn.channel.send_fns]
    return sent


@contextlib.asynccontextmanager
async def keyed(
    listen_key: bytes | None = KEY,
    connect_key: bytes | None = KEY,
    encrypt: bool = False,
    require_encrypt: bool = False,
) -> AsyncIterator[tuple[Listener, Connection, Connection, bytearray]]:
    """A listener offering a 4 MiB region filled with 0x5A, and one connected sender."""
    listener = await mrc.listen(
        HOST, 0, mrc.ListenerConfig(key=listen_key, require_encrypt=require_encrypt)
    )
    region = bytearray(b"\x5a" * REGION)
    listener.register(region, name="inbox")
    conn = None
    try:
        conn = await mrc.connect(
            HOST, listener.port, mrc.ConnectConfig(evs=8, key=connect_key, encrypt=encrypt)
        )
        peer = await listener.accept(timeout=5)
        yield listener, conn, peer, region
    finally:
        if conn is not None:
            await conn.close()
        await listener.close()


@pytest.mark.parametrize("encrypt", [False, True], ids=["integrity", "encrypt"])
async def test_keyed_write_lands_and_every_datagram_is_protected(encrypt: bool) -> None:
    data = MARKER * ((1 << 20) // len(MARKER))
    async with keyed(encrypt=encrypt) as (_listener, conn, peer, region):
        sent = record(conn)
        expect = bytearray(region)
        expect[1 << 20 : (1 << 20) + len(data)] = data
        assert await conn.write(data, conn.remote["inbox"], offset=1 << 20) == len(data)
        assert sha(region) == sha(expect)
        # nothing genuine failed a security check (a late duplicate ACK may be a stale drop)
        for side in (peer, conn):
            drops = side.stats()["dropped_by_reason"]
            assert isinstance(drops, dict)
            assert not [k for k in drops if k.startswith("security")], drops
        data_packets = [d for d in sent if d[0] == wire.Opcode.RDMA_WRITE_ONLY]
        assert data_packets, "no data packets recorded"
        assert all(d[8] & wire.BTH_SECURE for d in sent)
        payload = conn.qp.config.payload_size
        # (a send may be a GSO burst of such datagrams: the first window leaves at once)
        assert len(data_packets[0]) % (wire.DATA_HDR_LEN + payload + DATA_OVERHEAD) == 0
        clear = sum(MARKER in d for d in data_packets)
        if encrypt:
            assert clear == 0  # no payload travels in clear
        else:
            assert clear == len(data_packets)
        # the receiver authenticated what the sender sealed, and answered with sealed ACKs
        assert isinstance(peer.qp.protection, Protection)
        assert isinstance(conn.qp.protection, Protection)
        assert peer.qp.protection.opener.replay.top >= len(data_packets)
        assert conn.qp.protection.opener.replay.top > 0


@pytest.mark.parametrize(
    "listen_key, connect_key, encrypt, require, why",
    [
        (KEY, generate_key(), False, False, "authentication failed: the receiver does not hold"),
        (KEY, None, False, False, "this receiver requires a key"),
        (None, KEY, False, False, "this receiver uses no key, the sender does"),
        (KEY, KEY, False, True, "this receiver requires encryption"),
    ],
    ids=["wrong-key", "sender-without-key", "receiver-without-key", "integrity-not-enough"],
)
async def test_sender_refused_before_anything_is_allocated(
    listen_key: bytes | None,
    connect_key: bytes | None,
    encrypt: bool,
    require: bool,
    why: str,
) -> None:
    alloc = Allocations()
    listener = await mrc.listen(
        HOST,
        0,
        mrc.ListenerConfig(
            key=listen_key,
            require_encrypt=require,
            region_factory=alloc.factory,
            region_release=alloc.release,
        ),
    )
    try:
        with pytest.raises(mrc.MRCError) as err:
            await mrc.connect(
                HOST,
                listener.port,
                mrc.ConnectConfig(evs=4, key=connect_key, encrypt=encrypt, request_size=4096),
            )
        assert why in str(err.value)
        assert "\n" not in str(err.value)
        assert alloc.made == 0 and listener.connections == []
        assert listener.endpoint.core.qps == {}
        # the listener still serves a sender with the right credentials
        good = await mrc.connect(
            HOST,
            listener.port,
            mrc.ConnectConfig(evs=4, key=listen_key, encrypt=require, request_size=4096),
        )
        await good.write(b"x" * 4096, good.remote[""])
        await good.close()
        assert alloc.made == 1
    finally:
        await listener.close()


async def test_listener_refuses_a_sender_whose_proof_is_wrong() -> None:
    """The receiver's side of a wrong key: a sender that passes the receiver's proof check
    (it cannot, without the key, so this one skips it) and sends a made-up proof."""
    from mrc.transport import auth
    from mrc.transport.control import ControlChannel
    from mrc.transport.messages import Hello, Proof, Refusal, parse_challenge

    alloc = Allocations()
    listener = await mrc.listen(
        HOST,
        0,
        mrc.ListenerConfig(key=KEY, region_factory=alloc.factory, region_release=alloc.release),
    )
    try:
        reader, writer = await asyncio.open_connection(HOST, listener.port)
        control = ControlChannel(reader, writer)
        hello = Hello(qpn=7, psn=1, udp_port=9, auth=auth.offer(Mode.INTEGRITY))
        await control.send(hello.to_json())
        challenge = parse_challenge(await control.recv(5))
        assert not isinstance(challenge, Refusal)
        await control.send(Proof(os.urandom(32).hex()).to_json())
        refusal = await control.recv(5)
        assert refusal is not None and refusal["ok"] is False
        assert "does not hold this receiver's key" in str(refusal["error"])
        assert await control.recv(5) is None  # and it hung up
        control.close()
        assert alloc.made == 0 and listener.endpoint.core.qps == {}
    finally:
        await listener.close()


def _inject(port: int, datagrams: list[bytes]) -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        for d in datagrams:
            s.sendto(d, (HOST, port))


async def test_forged_replayed_and_altered_datagrams_are_dropped_and_counted() -> None:
    async with keyed() as (listener, conn, peer, region):
        inbox = conn.remote["inbox"]
        sent = record(conn)
        await conn.write(os.urandom(64 << 10), inbox)
        before = sha(region)
        captured = next(d for d in sent if d[0] == wire.Opcode.RDMA_WRITE_ONLY)
        hdr = wire.DATA_HDR_LEN
        # one datagram per way of being wrong; all know the real QP, rkey and address
        plain = wire.pack_data(peer.qpn, 0, inbox.addr, inbox.rkey, 64, False, None) + b"!" * 64
        fresh = bytearray(captured)  # an unused counter: passes the replay check, not the tag
        struct.pack_into("!Q", fresh, hdr + 4, (1 << 40) + 1)
        other_key = bytearray(captured)
        other_key[hdr] ^= 0xFF
        altered = bytearray(captured)
        altered[hdr + SEC_BLOCK_LEN + 5] ^= 0x01  # a payload bit, counter already seen
        forged = {
            "security_missing": [plain, captured[: hdr + 10]],
            "security_replay": [captured, bytes(altered)],
            "security_bad_tag": [bytes(fresh)],
            "security_key_id": [bytes(other_key)],
        }
        _inject(listener.port, [d for ds in forged.values() for d in ds])
        # and at the sender: an unprotected ACK for everything
        ack = wire.pack_ack(conn.qpn, 5, wire.AETH_ACK, 5, 0, 0, 0)
        _inject(conn.endpoint.port, [ack])
        # a legitimate write after the forgeries: the receive queue is FIFO, so once it is
        # acknowledged every forged datagram was handled
        await conn.write(b"\x01" * 4096, inbox, offset=REGION - 4096)
        drops = peer.stats()["dropped_by_reason"]
        assert drops == {k: len(v) for k, v in forged.items()}, drops
        sender_drops = conn.stats()["dropped_by_reason"]
        assert isinstance(sender_drops, dict)
        assert {k: v for k, v in sender_drops.items() if k.startswith("security")} == {
            "security_missing": 1
        }, sender_drops
        # nothing forged was written: only the legitimate last 4 KiB changed since `before`
        region[REGION - 4096 :] = b"\x5a" * 4096
        assert sha(region) == before


async def test_side_channel_messages_after_the_handshake_are_authenticated() -> None:
    """Every message after the key exchange carries a MAC over its number and content."""
    from mrc.transport.control import ControlChannel, ControlError

    got: asyncio.Queue[ControlChannel] = asyncio.Queue()

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await got.put(ControlChannel(r, w))

    server = await asyncio.start_server(on_conn, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        r, w = await asyncio.open_connection(HOST, port)
        a, b = ControlChannel(r, w), await got.get()
        k1, k2 = os.urandom(32), os.urandom(32)
        a.authenticate(send_key=k1, receive_key=k2)
        b.authenticate(send_key=k2, receive_key=k1)
        await a.send({"type": "done", "bytes": 1})
        assert await b.recv(5) == {"type": "done", "bytes": 1}
        # an altered message, a replayed one and an unauthenticated one all fail
        for line in (
            b'{"type":"done","bytes":2,"mac":"' + b"0" * 64 + b'"}\n',
            None,
            b'{"type":"result","ok":true}\n',
        ):
            if line is None:  # replay the first message as sent (its number is now stale)
                body = {"type": "done", "bytes": 1}
                line = b'{"type":"done","bytes":1,"mac":"' + a._mac(k1, 0, body).encode() + b'"}\n'
            w.write(line)
            with pytest.raises(ControlError, match="failed authentication"):
                await b.recv(5)
        a.close()
        b.close()
    finally:
        server.close()
        await server.wait_closed()
