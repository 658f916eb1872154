"""The end-to-end checksum a transfer is verified with (issue 38): the sender offers, the
listener picks, and both sides' digests are that checksum's of the data, keyed BLAKE3 with a
pre-shared key. Real connections on ::1; every digest is checked against one computed here
with the hash libraries themselves (conftest.expected_digest), not with mrc.app.checksum.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from digests import expected_digest

import mrc
from mrc.app.transfer import TransferResult, receive_buffer, send_buffer
from mrc.security.keys import generate_key
from mrc.transport.messages import Refused, Welcome

HOST = "::1"
SIZE = 3 * (1 << 20) + 5  # not a multiple of anything: the hashes' last step is a short one
NAMES = ("blake3", "xxh3-128", "sha256")


def derived(key: bytes) -> bytes:
    """What keyed BLAKE3 is keyed with on a connection under the pre-shared ``key``."""
    return hashlib.sha256(b"mrc end-to-end checksum key\0" + key).digest()


class Pair:
    """A listener whose regions are made on request, and one connection to it."""

    def __init__(self) -> None:
        self.made: list[bytearray] = []
        self.listener: Any = None
        self.conn: Any = None
        self.peer: Any = None

    def factory(self, n: int, _request: dict[str, object]) -> bytearray:
        self.made.append(bytearray(max(n, 1)))
        return self.made[-1]

    async def transfer(self, data: bytes) -> tuple[TransferResult, TransferResult]:
        """``data`` sent into the region the listener made: both sides' results."""
        assert self.peer.granted is not None and self.peer.granted.length == len(data)
        return await asyncio.gather(
            send_buffer(self.conn, memoryview(data)),
            receive_buffer(self.peer, self.peer.granted.view[: len(data)]),
        )


@contextlib.asynccontextmanager
async def pair(
    size: int = SIZE,
    *,
    takes: Sequence[str] | None = None,
    offers: Sequence[str] | None = None,
    key: bytes | None = None,
) -> AsyncIterator[Pair]:
    """A connection of a sender offering ``offers`` to a listener taking ``takes`` (None:
    each side's default), both under ``key``."""
    p = Pair()
    listen: dict[str, Any] = {} if takes is None else {"checksums": takes}
    connect: dict[str, Any] = {} if offers is None else {"checksums": offers}
    p.listener = await mrc.listen(
        HOST, 0, mrc.ListenerConfig(region_factory=p.factory, key=key, **listen)
    )
    try:
        p.conn = await mrc.connect(
            HOST,
            p.listener.port,
            mrc.ConnectConfig(
                evs=16,
                request_size=size,
                key=key,
                qp=mrc.QPConfig(payload_size=4096),
                **connect,
            ),
        )
        try:
            p.peer = await p.listener.accept(timeout=5)
            yield p
        finally:
            await p.conn.close()
    finally:
        await p.listener.close()


@pytest.mark.parametrize("name", NAMES)
async def test_a_transfer_is_verified_with_the_one_checksum_offered(name: str) -> None:
    data = os.urandom(SIZE)
    async with pair(offers=(name,)) as p:
        assert p.conn.checksum == p.peer.checksum == name
        sent, got = await p.transfer(data)
        assert sent.ok and got.ok, (sent.error, got.error)
        assert sent.checksum == got.checksum == name
        digest = expected_digest(data, name)
        assert sent.digest == sent.peer_digest == got.digest == got.peer_digest == digest
        assert len(digest) == (32 if name == "xxh3-128" else 64)  # 128 bits, or 256
        assert bytes(p.made[0][:SIZE]) == data
        assert sent.bytes == got.bytes == SIZE


async def test_by_default_blake3_and_the_listener_picks_by_its_own_preference() -> None:
    data = os.urandom(SIZE)
    async with pair() as p:  # the sender offers all three, the listener prefers BLAKE3
        assert p.conn.checksum == p.peer.checksum == "blake3"
        assert p.conn.checksum_key is None and p.peer.checksum_key is None
        sent, got = await p.transfer(data)
        assert sent.digest == got.digest == expected_digest(data, "blake3")
    # the listener's order decides, not the sender's
    async with pair(takes=("xxh3-128", "blake3"), offers=("blake3", "xxh3-128")) as p:
        assert p.conn.checksum == p.peer.checksum == "xxh3-128"
        sent, got = await p.transfer(data)
        assert sent.ok and got.ok, (sent.error, got.error)
        assert sent.digest == got.peer_digest == got.digest == expected_digest(data, "xxh3-128")


@pytest.mark.parametrize("name", NAMES)
async def test_with_a_key_blake3_is_keyed_and_the_others_are_not(name: str) -> None:
    key = generate_key()
    data = os.urandom(SIZE)
    async with pair(offers=(name,), key=key) as p:
        assert p.conn.checksum == p.peer.checksum == name
        sent, got = await p.transfer(data)
        assert sent.ok and got.ok, (sent.error, got.error)
        assert sent.checksum == got.checksum == name
        plain = expected_digest(data, name)
        if name == "blake3":
            keyed = expected_digest(data, name, derived(key))
            assert keyed != plain
            assert sent.digest == sent.peer_digest == got.digest == got.peer_digest == keyed
        else:  # a key would not make either a MAC: they stay what they are
            assert sent.digest == sent.peer_digest == got.digest == got.peer_digest == plain


async def test_keyed_blake3_depends_on_the_key() -> None:
    """The same bytes under two keys: two digests, neither the unkeyed one."""
    data = os.urandom(1 << 20)
    digests = []
    for key in (generate_key(), generate_key()):
        async with pair(len(data), key=key) as p:
            sent, got = await p.transfer(data)
            assert sent.ok and got.ok, (sent.error, got.error)
            assert sent.digest == got.digest == expected_digest(data, "blake3", derived(key))
            digests.append(got.digest)
    assert len({*digests, expected_digest(data, "blake3")}) == 3


@pytest.mark.parametrize(
    ("name", "key", "label"),
    [
        ("blake3", None, "BLAKE3"),
        ("blake3", generate_key(), "keyed BLAKE3"),
        ("xxh3-128", None, "xxh3-128"),
        ("xxh3-128", generate_key(), "xxh3-128"),
        ("sha256", None, "SHA-256"),
    ],
)
async def test_a_mismatch_is_named_after_the_checksum(
    name: str, key: bytes | None, label: str
) -> None:
    """The receiver hashes a buffer the data never lands in: both verdicts say no, in the
    checksum's name, each with the digest of what it hashed."""
    size = 1 << 20
    data = os.urandom(size)
    async with pair(size, offers=(name,), key=key) as p:
        elsewhere = memoryview(bytearray(size))
        sent, got = await asyncio.gather(
            send_buffer(p.conn, memoryview(data)), receive_buffer(p.peer, elsewhere)
        )
        assert not sent.ok and not got.ok
        assert sent.error == got.error == f"{label} mismatch: data placed differs from sent"
        hash_key = derived(key) if key is not None and name == "blake3" else None
        assert sent.digest == got.peer_digest == expected_digest(data, name, hash_key)
        assert got.digest == sent.peer_digest == expected_digest(bytes(size), name, hash_key)


@pytest.mark.parametrize(
    ("takes", "offers", "why"),
    [
        (
            ("blake3",),
            ("xxh3-128",),
            "no end-to-end checksum in common: the sender offers xxh3-128, this receiver "
            "takes blake3",
        ),
        (
            ("blake3", "xxh3-128"),
            ("sha256",),
            "no end-to-end checksum in common: the sender offers sha256, this receiver "
            "takes blake3, xxh3-128",
        ),
        (
            ("blake3",),
            (),
            "the sender names no end-to-end checksum (so SHA-256), and this receiver takes "
            "only blake3",
        ),
    ],
)
async def test_no_checksum_in_common_is_refused_at_set_up_in_one_line(
    takes: tuple[str, ...], offers: tuple[str, ...], why: str
) -> None:
    made: list[bytearray] = []

    def factory(n: int, _request: dict[str, object]) -> bytearray:
        made.append(bytearray(max(n, 1)))
        return made[-1]

    config = mrc.ListenerConfig(region_factory=factory, checksums=takes)
    async with await mrc.listen(HOST, 0, config) as listener:
        with pytest.raises(Refused) as info:
            await mrc.connect(
                HOST,
                listener.port,
                mrc.ConnectConfig(evs=4, request_size=SIZE, checksums=offers),
            )
        assert str(info.value) == f"connection refused by the receiver: {why}"
        assert made == []  # refused before any region was made for it
        assert listener.usage()["connections"] == 0
        # and a sender that offers what it takes is set up and verified
        data = os.urandom(1000)
        async with await mrc.connect(
            HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=len(data), checksums=takes)
        ) as conn:
            peer = await listener.accept(timeout=5)
            assert peer.granted is not None  # the listener made the region requested
            try:
                assert conn.checksum == peer.checksum == takes[0]
                sent, got = await asyncio.gather(
                    send_buffer(conn, memoryview(data)),
                    receive_buffer(peer, peer.granted.view[: len(data)]),
                )
                assert sent.digest == got.digest == expected_digest(data, takes[0])
            finally:
                await peer.close()


async def test_a_sender_that_offers_none_gets_sha256() -> None:
    data = os.urandom(SIZE)
    async with pair(offers=()) as p:
        assert p.conn.checksum == p.peer.checksum == "sha256"
        sent, got = await p.transfer(data)
        assert sent.ok and got.ok, (sent.error, got.error)
        assert sent.checksum == got.checksum == "sha256"
        digest = hashlib.sha256(data).hexdigest()
        assert sent.digest == sent.peer_digest == got.digest == got.peer_digest == digest


@contextlib.asynccontextmanager
async def answering(answer: dict[str, object]) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A fake listener that reads a hello and answers ``answer``: its port and the hellos."""
    hellos: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hellos.append(await reader.readline())
        writer.write(json.dumps(answer).encode() + b"\n")
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            await reader.read()
        writer.close()

    server = await asyncio.start_server(handle, HOST, 0)
    try:
        yield server.sockets[0].getsockname()[1], hellos
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("picked", "why"),
    [
        ("sha256", "[::1] picked the checksum sha256, not one of those offered (blake3)"),
        (None, "[::1] picked the checksum none, not one of those offered (blake3)"),
    ],
)
async def test_a_sender_refuses_a_checksum_it_did_not_offer(picked: str | None, why: str) -> None:
    """A listener that picks what was not offered (or, offered some, picks none) is not
    believed: the sender would verify with what it never asked for."""
    welcome = Welcome(qpn=5, psn=0, udp_port=9, max_imm=1, checksum=picked).to_json()
    async with answering(welcome) as (port, hellos):
        with pytest.raises(mrc.MRCError) as info:
            await mrc.connect(HOST, port, mrc.ConnectConfig(evs=4, checksums=("blake3",)))
    assert str(info.value) == why
    assert json.loads(hellos[0])["checksums"] == ["blake3"]  # what it offered


def test_checksum_configs_name_only_checksums_mrc_knows() -> None:
    with pytest.raises(mrc.MRCError, match=r"^checksums: 'md5' is not a checksum mrc knows"):
        mrc.ConnectConfig(checksums=("md5",))
    with pytest.raises(mrc.MRCError, match=r"^checksums: 'md5' is not a checksum mrc knows"):
        mrc.ListenerConfig(checksums=("blake3", "md5"))
    with pytest.raises(mrc.MRCError, match="names one checksum twice"):
        mrc.ConnectConfig(checksums=("blake3", "blake3"))
    with pytest.raises(mrc.MRCError, match="name at least one checksum"):
        mrc.ListenerConfig(checksums=())
    # the defaults: a sender offers every one, BLAKE3 first; a listener prefers BLAKE3
    assert mrc.ConnectConfig().checksums == ("blake3", "xxh3-128", "sha256")
    assert mrc.ListenerConfig().checksums[0] == "blake3"
    assert set(mrc.ListenerConfig().checksums) == set(NAMES)
