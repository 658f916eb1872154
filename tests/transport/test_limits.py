"""A listener's limits, on real loopback sockets: what peers can make it hold is bounded, each
excess is refused with one line naming the limit before anything is allocated, and everything
taken is given back (issue 9, "bounded, leak-free side channel").

Seen before these limits: any number of set-ups, connections and granted bytes were taken on
request; a hello that never sent data held its connection, QP, sockets and region for as long
as the listener lived; and a set-up failing after its grant, with a ``region_release``, raised
ValueError in the handler instead of releasing the region.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import mrc
from mrc.connection import Listener
from mrc.security.keys import generate_key
from mrc.security.packet import Mode
from mrc.transport import auth
from mrc.transport.control import ControlChannel
from mrc.transport.limits import Ledger, LimitError, Limits
from mrc.transport.messages import Hello, RegionRequest

HOST = "::1"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def until(condition: Callable[[], bool], what: str, limit: float = 5.0) -> None:
    """Wait for a state that no event announces (a handler task reaching a line)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def settle(baseline: int) -> int:
    with contextlib.suppress(AssertionError):
        await until(lambda: open_fds() <= baseline, "fds", 2.0)
    return open_fds()


class Regions:
    """region_factory / region_release that count what they made and freed."""

    def __init__(self) -> None:
        self.made: list[int] = []
        self.freed: list[int] = []

    def factory(self, size: int, _request: dict[str, object]) -> bytearray:
        buf = bytearray(max(size, 1))
        self.made.append(id(buf))
        return buf

    def release(self, buf: object) -> None:
        assert isinstance(buf, bytearray)
        self.freed.append(id(buf))


@contextlib.asynccontextmanager
async def listening(regions: Regions, **kw: object) -> AsyncIterator[Listener]:
    config = mrc.ListenerConfig(
        region_factory=regions.factory,
        region_release=regions.release,
        evs=4,
        **kw,  # type: ignore[arg-type]  # ListenerConfig's own fields
    )
    listener = await mrc.listen(HOST, 0, config)
    try:
        yield listener
    finally:
        await listener.close()


def hello_line(size: int | None = 1000) -> bytes:
    request = RegionRequest(size, "x") if size is not None else None
    hello = Hello(qpn=0x1234, psn=1, udp_port=9, addrs=(HOST,), evs=4, request=request)
    return json.dumps(hello.to_json()).encode() + b"\n"


class Raw:
    """A hand-driven side-channel client: says what the test says, reads what comes back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Raw:
        return cls(*await asyncio.open_connection(HOST, port))

    async def say(self, line: bytes) -> None:
        self.writer.write(line)
        await self.writer.drain()

    async def line(self, timeout: float = 5.0) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.reader.readline(), timeout)
        assert raw.endswith(b"\n"), f"no whole line: {raw!r}"
        obj = json.loads(raw)
        assert isinstance(obj, dict)
        return obj

    async def hung_up(self, timeout: float = 5.0) -> bool:
        try:
            return await asyncio.wait_for(self.reader.read(), timeout) == b""
        except ConnectionResetError:
            return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def verified_transfer(listener: Listener, size: int = 300_000) -> None:
    data = os.urandom(size)
    async with await mrc.connect(
        HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=size)
    ) as conn:
        assert conn.requested is not None
        await conn.write(data, conn.requested)
        peer = await listener.accept(timeout=5, started=True)
        assert peer.granted is not None
        got = hashlib.sha256(peer.granted.view[:size]).hexdigest()
        assert got == hashlib.sha256(data).hexdigest()
        await peer.close()


# ---- the ledger on its own ----------------------------------------------------------------


def test_ledger_counts_refuses_and_gives_back_once() -> None:
    ledger = Ledger(Limits(max_setups=1, max_connections=2, max_granted_bytes=100))
    ledger.begin_setup("first", HOST)
    ledger.proven("first")  # (an unproven one would give way to the newcomer)
    with pytest.raises(LimitError, match=r"^too many set-ups in progress \(limit 1\)$"):
        ledger.begin_setup("second", HOST)
    ledger.end_setup("first")
    a = ledger.admit(60)
    with pytest.raises(LimitError, match="cannot grant 41 bytes: 60 of the 100 bytes"):
        ledger.admit(41)
    b = ledger.admit(40)
    with pytest.raises(LimitError, match=r"^too many connections \(limit 2\)$"):
        ledger.admit(0)
    a.release()
    a.release()  # a second release (close after abort, say) gives nothing back twice
    assert ledger.usage() == {
        "setups": 0,
        "connections": 1,
        "granted_bytes": 40,
        "memory_bytes": 40,
        "refused_connections": 1,
        "refused_granted_bytes": 1,
        "refused_setups": 1,
    }
    b.release()
    assert (ledger.connections, ledger.granted_bytes) == (0, 0)


@pytest.mark.parametrize(
    "kw",
    [{"max_setups": 0}, {"max_connections": -1}, {"max_granted_bytes": -5}, {"max_setups": 1.5}],
)
def test_bad_limits_are_one_line_errors(kw: dict[str, object]) -> None:
    with pytest.raises(mrc.MRCError, match=next(iter(kw))):
        Limits(**kw)  # type: ignore[arg-type]  # wrong types on purpose


# ---- on real sockets ----------------------------------------------------------------------


async def test_a_newcomer_displaces_the_oldest_silent_set_up() -> None:
    """Set-ups that have not said their hello give way to newcomers when the slots are full
    (issue 21: silent or unproven peers used to hold every slot and keep real senders out)."""
    regions = Regions()
    async with listening(regions, max_setups=2) as listener:
        quiet = [await Raw.open(listener.port) for _ in range(2)]  # hold both set-up slots
        await until(lambda: listener.usage()["setups"] == 2, "two set-ups in progress")
        third = await Raw.open(listener.port)  # says nothing either: the oldest gives way
        reply = await quiet[0].line(timeout=5)
        assert reply == {
            "mrc": 3,
            "ok": False,
            "error": "set-up dropped for a newer connection: all 2 set-up slots were taken "
            "and this one had not yet said its hello or proved the key",
            "retry": True,
        }
        assert await quiet[0].hung_up()
        await verified_transfer(listener)  # displaces the next silent one, and is set up
        assert listener.usage()["refused_setups"] == 2
        for q in [*quiet, third]:
            await q.close()
        await until(lambda: listener.usage()["setups"] == 0, "the slots back")


async def test_when_every_set_up_has_proven_itself_a_newcomer_is_refused_at_once() -> None:
    """Only set-ups past their proof are never displaced: beyond the limit of those, the
    newcomer is refused at once, unread. (A keyed sender that encrypts and withholds its sealed
    region request holds a proven set-up: only a holder of the key can.)"""
    key = generate_key()
    regions = Regions()
    async with listening(regions, max_setups=1, key=key) as listener:
        reader, writer = await asyncio.open_connection(HOST, listener.port)
        holder = ControlChannel(reader, writer)
        hello = Hello(0x77, 1, 9, (HOST,), 4, auth=auth.offer(Mode.ENCRYPT))
        await holder.send(hello.to_json())
        await auth.as_sender(holder, key, hello, 5)  # proven; its request never follows
        with pytest.raises(mrc.MRCError, match=r"too many set-ups in progress \(limit 1\)$"):
            await mrc.connect(
                HOST, listener.port, mrc.ConnectConfig(evs=4, key=key, request_size=10)
            )
        reply = await holder.recv(timeout=10)  # and the holder runs out of time
        assert reply is not None and reply["error"] == (
            f"no region request within {listener.hello_timeout:g} s of connecting"
        )
        holder.close()
        assert regions.made == []


async def test_a_set_up_that_takes_too_long_is_refused_and_frees_its_slot() -> None:
    regions = Regions()
    async with listening(regions, max_setups=1, setup_timeout=0.3) as listener:
        slow = await Raw.open(listener.port)
        await slow.say(b'{"mrc": 3, ')  # half a hello, then nothing
        reply = await slow.line(timeout=3)
        assert reply["ok"] is False
        assert reply["error"] == "set-up did not finish within 0.3 s"
        assert await slow.hung_up()
        await slow.close()
        assert listener.usage()["setups"] == 0
        await verified_transfer(listener)


async def test_connections_beyond_the_limit_are_refused_before_allocation() -> None:
    regions = Regions()
    async with listening(regions, max_connections=2) as listener:
        a = await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=100))
        b = await mrc.connect(
            HOST, listener.port, mrc.ConnectConfig(evs=4)
        )  # no region: a slot all the same
        assert listener.usage()["connections"] == 2
        with pytest.raises(mrc.MRCError, match=r"too many connections \(limit 2\)$"):
            await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=100))
        assert len(regions.made) == 1  # the refused one never reached region_factory
        assert listener.usage()["refused_connections"] == 1
        # closing a connection the application took gives its slot back
        peer_a = await listener.accept(timeout=5)
        await a.close()
        await peer_a.close()
        assert listener.usage()["connections"] == 1 and listener.connections != []
        await verified_transfer(listener)
        await b.close()


async def test_granted_bytes_are_bounded_and_return_when_the_connection_closes() -> None:
    regions = Regions()
    async with listening(regions, max_granted_bytes=10_000) as listener:
        first = await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=6000))
        with pytest.raises(mrc.MRCError) as info:
            await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=6000))
        assert str(info.value).endswith(
            "cannot grant 6000 bytes: 6000 of the 10000 bytes this receiver grants at once "
            "are in use"
        )
        assert len(regions.made) == 1  # refused before region_factory was called
        second = await mrc.connect(
            HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=4000)
        )  # fits
        assert listener.usage()["granted_bytes"] == 10_000
        for _ in range(2):
            peer = await listener.accept(timeout=5)
            await peer.close()
        assert listener.usage() == {
            "setups": 0,
            "connections": 0,
            "granted_bytes": 0,
            "memory_bytes": 0,
            "refused_granted_bytes": 1,
        }
        assert listener.connections == []  # closed connections are not kept either
        await first.close()
        await second.close()
        await verified_transfer(listener, 9000)


async def test_a_silent_sender_is_aborted_and_everything_it_held_released() -> None:
    """The issue's defect at the library level: a valid hello, then nothing. It used to hold
    its connection slot, QP, EV sockets and region for the listener's lifetime."""
    regions = Regions()
    async with listening(regions, max_connections=1, start_timeout=0.3) as listener:
        before = open_fds()
        idle = await Raw.open(listener.port)
        await idle.say(hello_line(5000))
        welcome = await idle.line()
        assert welcome["ok"] is True
        assert listener.usage()["connections"] == 1 and len(regions.made) == 1
        # the only slot is taken: a real sender is refused at once, with the reason
        with pytest.raises(mrc.MRCError, match=r"too many connections \(limit 1\)"):
            await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=10))
        abort = await idle.line(timeout=3)
        assert abort == {  # numbered, as every message after set-up is
            "n": 0,
            "m": {"error": "no data from the sender within 0.3 s of set-up; connection dropped"},
        }
        assert await idle.hung_up()
        await idle.close()
        assert regions.freed == regions.made  # region_release got the idle sender's region
        assert listener.usage()["connections"] == 0 and listener.usage()["granted_bytes"] == 0
        assert listener.connections == [] and listener.endpoint.core.qps == {}
        assert await settle(before) == before
        await verified_transfer(listener)  # and the slot is there for a real sender


async def test_accept_started_hands_out_senders_that_send_and_skips_silent_ones() -> None:
    regions = Regions()
    async with listening(regions, start_timeout=0.5) as listener:
        idle = await Raw.open(listener.port)
        await idle.say(hello_line(100))
        assert (await idle.line())["ok"] is True
        async with await mrc.connect(
            HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=100)
        ) as conn:
            assert conn.requested is not None
            await conn.write(b"y" * 100, conn.requested)
            peer = await listener.accept(timeout=5, started=True)
            assert peer.granted is not None and bytes(peer.granted.view[:100]) == b"y" * 100
            assert "no data from the sender" in str((await idle.line(timeout=3))["m"]["error"])
            with pytest.raises(TimeoutError):  # the silent one is never handed out
                await listener.accept(timeout=0.2, started=True)
            await peer.close()
        await idle.close()
        assert regions.freed == [regions.made[0]]  # the idle one's; the taken one is ours


async def test_plain_accept_hands_out_at_once_and_the_caller_owns_it() -> None:
    """Without started=True a connection is the application's as soon as it is set up: the
    listener never aborts it (a connection may carry WRITEs the other way, or wait)."""
    regions = Regions()
    async with (
        listening(regions, start_timeout=0.1) as listener,
        await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=100)) as conn,
    ):
        peer = await listener.accept(timeout=5)
        await asyncio.sleep(0.3)  # three start timeouts: nothing may happen (no event)
        assert peer.error is None and regions.freed == []
        assert conn.requested is not None
        await conn.write(b"z" * 100, conn.requested)
        await peer.close()


async def test_closing_the_listener_releases_what_was_never_handed_out() -> None:
    regions = Regions()
    listener = await mrc.listen(
        HOST,
        0,
        mrc.ListenerConfig(region_factory=regions.factory, region_release=regions.release, evs=4),
    )
    conns = [
        await mrc.connect(HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=64))
        for _ in range(3)
    ]
    quiet = await Raw.open(listener.port)  # a set-up in progress: cancelled
    await until(lambda: listener.usage()["setups"] == 1, "a set-up in progress")
    await listener.close()
    assert len(regions.made) == 3 and sorted(regions.freed) == sorted(regions.made)
    assert listener.usage() == {
        "setups": 0,
        "connections": 0,
        "granted_bytes": 0,
        "memory_bytes": 0,
    }
    assert await quiet.hung_up()
    await quiet.close()
    for c in conns:
        await c.close()


async def test_a_set_up_failing_after_its_grant_calls_region_release() -> None:
    """Plane 1 is IPv4 and the hello names IPv6 for it: EV sockets fail after the grant. With
    a region_release this raised ValueError (the view was released before .obj was read)."""
    regions = Regions()
    async with listening(regions, plane_addrs=[HOST, "127.0.0.1"]) as listener:
        raw = await Raw.open(listener.port)
        hello = json.loads(hello_line(100))
        await raw.say(json.dumps({**hello, "addrs": [HOST, HOST]}).encode() + b"\n")
        reply = await raw.line()
        assert reply["ok"] is False and "cannot open EV sockets" in str(reply["error"])
        await raw.close()
        assert len(regions.made) == 1 and regions.freed == regions.made
        assert listener.usage()["connections"] == 0 and listener.usage()["granted_bytes"] == 0


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"start_timeout": 0}, "start_timeout must be None or more than 0 s"),
        ({"setup_timeout": -1.0}, "setup_timeout must be more than 0 s"),
        ({"max_connections": 0}, "max_connections must be a positive integer"),
    ],
)
async def test_listen_checks_its_limits(kw: dict[str, object], expected: str) -> None:
    with pytest.raises(mrc.MRCError, match=expected):
        await mrc.listen(HOST, 0, mrc.ListenerConfig(**kw))  # type: ignore[arg-type]  # its own fields
