"""With encryption the side channel is sealed after the key exchange (issue 21).

Seen before: with ``--encrypt`` every payload was encrypted, but the file name (in the hello's
region request), its exact size and its SHA-256 (in ``done`` and ``result``) still travelled in
clear on the side channel, so an observer could confirm a guess of the file. Now the request
follows the proof, and every message after the proof is AES-GCM sealed under keys of the
handshake, numbered per direction: replayed, reordered or altered messages are refused.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
from collections.abc import AsyncIterator

import pytest

import mrc
from mrc.security.keys import generate_key
from mrc.transport.control import ControlChannel, ControlError
from mrc.transport.messages import Done, Result

HOST = "::1"
KEY = generate_key()
NAME = "quarterly-results-draft.xlsx"


class Tap:
    """A TCP relay between a sender and a listener that keeps every byte in both directions."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.upstream = bytearray()  # sender -> listener
        self.downstream = bytearray()
        self.server: asyncio.Server | None = None
        self._pumps: list[asyncio.Task[None]] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, HOST, 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(HOST, self.port)

        async def pump(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, log: bytearray
        ) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    log += data
                    dst.write(data)
                    await dst.drain()
            dst.close()

        self._pumps += [
            asyncio.ensure_future(pump(r, uw, self.upstream)),
            asyncio.ensure_future(pump(ur, w, self.downstream)),
        ]

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for p in self._pumps:
            p.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)


@contextlib.asynccontextmanager
async def tapped() -> AsyncIterator[tuple[Tap, mrc.Listener]]:
    made: list[bytearray] = []

    def factory(size: int, request: dict[str, object]) -> bytearray:
        assert request["name"] == NAME  # the listener still learns the name, sealed
        made.append(bytearray(max(size, 1)))
        return made[-1]

    async with await mrc.listen(
        HOST, 0, mrc.ListenerConfig(key=KEY, region_factory=factory, evs=4)
    ) as listener:
        tap = Tap(listener.port)
        try:
            yield tap, listener
        finally:
            await tap.close()


async def transfer_through(tap: Tap, listener: mrc.Listener, encrypt: bool) -> str:
    data = os.urandom(100_000)
    digest = hashlib.sha256(data).hexdigest()
    port = await tap.start()
    async with await mrc.connect(
        HOST,
        port,
        mrc.ConnectConfig(
            evs=4, key=KEY, encrypt=encrypt, request_size=len(data), request_name=NAME
        ),
    ) as conn:
        assert conn.requested is not None and conn.requested.name == NAME
        await conn.write(data, conn.requested)
        peer = await listener.accept(timeout=10, started=True)
        await conn.send_message(Done(digest, len(data)).to_json())
        got = await peer.recv_message(timeout=10)
        assert got == Done(digest, len(data)).to_json()
        await peer.send_message(Result(True, digest, {"bytes": len(data)}).to_json())
        assert Result.from_json(await conn.recv_message(timeout=10)).digest == digest
        await peer.close()
    return digest


async def test_with_encryption_nothing_about_the_file_crosses_the_side_channel_in_clear() -> None:
    async with tapped() as (tap, listener):
        digest = await transfer_through(tap, listener, encrypt=True)
    wire = bytes(tap.upstream + tap.downstream)
    for secret in (NAME.encode(), digest.encode(), b":100000", b'"done"', b'"result"'):
        assert secret not in wire, secret
    # after the proof, every line in both directions is one sealed message
    for stream in (tap.upstream, tap.downstream):
        lines = bytes(stream).splitlines()
        after = lines[2:] if stream is tap.upstream else lines[1:]  # hello, proof | challenge
        assert after and all(set(json.loads(line)) == {"sealed"} for line in after), lines


async def test_without_encryption_the_side_channel_stays_readable() -> None:
    """Integrity mode keeps its MAC'd clear messages (tools can read them), as documented."""
    async with tapped() as (tap, listener):
        digest = await transfer_through(tap, listener, encrypt=False)
    assert digest.encode() in bytes(tap.upstream) and NAME.encode() in bytes(tap.upstream)


@contextlib.asynccontextmanager
async def channel_pair() -> AsyncIterator[tuple[ControlChannel, ControlChannel]]:
    got: asyncio.Queue[ControlChannel] = asyncio.Queue()

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await got.put(ControlChannel(r, w))

    server = await asyncio.start_server(on_conn, HOST, 0)
    try:
        r, w = await asyncio.open_connection(HOST, server.sockets[0].getsockname()[1])
        a, b = ControlChannel(r, w), await got.get()
        k1, k2 = os.urandom(32), os.urandom(32)
        a.seal(send_key=k1, receive_key=k2)
        b.seal(send_key=k2, receive_key=k1)
        yield a, b
        a.close()
        b.close()
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("attack", ["replay", "reorder", "alter", "clear", "truncate"])
async def test_sealed_messages_replayed_reordered_or_altered_are_refused(attack: str) -> None:
    async with channel_pair() as (a, b):
        deliver = a.writer.write
        lines: list[bytes] = []  # what a seals, held back: the test delivers it
        a.writer.write = lambda data: lines.append(bytes(data))  # type: ignore[method-assign]
        await a.send({"type": "done", "bytes": 1})
        await a.send({"type": "done", "bytes": 2})
        first, second = lines
        assert set(json.loads(first)) == {"sealed"}

        def sealed(blob: bytes) -> bytes:
            return json.dumps({"sealed": base64.b64encode(blob).decode()}).encode() + b"\n"

        if attack == "reorder":  # the second message arrives first
            deliver(second)
        else:
            deliver(first)
            deliver(second)
            assert await b.recv(5) == {"type": "done", "bytes": 1}
            assert await b.recv(5) == {"type": "done", "bytes": 2}
            blob = base64.b64decode(json.loads(second)["sealed"])
            if attack == "replay":
                deliver(first)
            elif attack == "alter":
                deliver(sealed(blob[:3] + bytes([blob[3] ^ 1]) + blob[4:]))
            elif attack == "clear":
                deliver(b'{"type":"result","ok":true}\n')
            else:
                deliver(sealed(blob[:10]))
        with pytest.raises(ControlError, match="failed authentication"):
            await b.recv(5)
