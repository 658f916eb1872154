"""Whoever cannot prove the key cannot lock out whoever can (issue 21).

Seen before: with a key, 64 hellos that announce ``auth`` and never send the proof filled
``max_setups`` for about 5 s each, again and again, and every real keyed sender was refused
"too many set-ups in progress". Now a set-up that has not yet proven the key (or, without a key,
said its hello) gives way to a newcomer when the set-up slots are full, and has a short deadline
of its own; set-ups past the proof are never displaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import mrc
from mrc.connection import Listener
from mrc.security.keys import generate_key
from mrc.security.packet import Mode
from mrc.transport import auth
from mrc.transport.limits import Ledger, Limits
from mrc.transport.messages import Hello, RegionRequest

HOST = "::1"
KEY = generate_key()


def keyed_hello_line() -> bytes:
    hello = Hello(
        qpn=0x4242,
        psn=1,
        udp_port=9,
        addrs=(HOST,),
        evs=4,
        request=RegionRequest(4096, "x"),
        auth=auth.offer(Mode.INTEGRITY),
    )
    return json.dumps(hello.to_json()).encode() + b"\n"


class Unproven:
    """A peer that says a keyed hello, reads the challenge and never proves anything."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Unproven:
        peer = cls(*await asyncio.open_connection(HOST, port))
        peer.writer.write(keyed_hello_line())
        await peer.writer.drain()
        return peer

    async def line(self, timeout: float = 30.0) -> dict[str, object] | None:
        raw = await asyncio.wait_for(self.reader.readline(), timeout)
        return json.loads(raw) if raw else None

    def close(self) -> None:
        self.writer.close()


@contextlib.asynccontextmanager
async def hammered(listener: Listener, peers: int) -> AsyncIterator[list[int]]:
    """``peers`` unproven set-ups, each opened again as soon as the listener drops it; yields
    a one-item list counting the set-ups opened.

    They stop on a flag, not only by being cancelled: Python 3.11's ``asyncio.wait_for`` can
    lose a cancellation that comes as its inner read completes, and a peer that lost it opened
    set-ups again and again and held the test (and a CI run) forever."""
    opened = [0]
    stopping = False

    async def one() -> None:
        while not stopping:
            try:
                peer = await Unproven.open(listener.port)
            except OSError:
                await asyncio.sleep(0.01)
                continue
            opened[0] += 1
            try:
                with contextlib.suppress(OSError, TimeoutError, ValueError):
                    while await peer.line() is not None:  # the challenge, then the refusal
                        pass
            finally:
                peer.close()

    tasks = [asyncio.ensure_future(one()) for _ in range(peers)]
    try:
        yield opened
    finally:
        stopping = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def keyed_transfer(listener: Listener) -> None:
    async with await mrc.connect(
        HOST, listener.port, mrc.ConnectConfig(evs=4, key=KEY, request_size=4096)
    ) as c:
        assert c.requested is not None
        await c.write(b"k" * 4096, c.requested)
        peer = await listener.accept(timeout=30, started=True)
        assert peer.granted is not None and bytes(peer.granted.view[:4096]) == b"k" * 4096
        await peer.close()


def factory(size: int, _request: dict[str, object]) -> bytearray:
    return bytearray(max(size, 1))


async def test_unproven_set_ups_in_every_slot_do_not_keep_a_keyed_sender_out() -> None:
    async with await mrc.listen(
        HOST, 0, mrc.ListenerConfig(key=KEY, region_factory=factory, evs=4)
    ) as listener:
        slots = listener.limits.max_setups
        waiting = [await Unproven.open(listener.port) for _ in range(slots)]
        for peer in waiting:
            assert "challenge" in (await peer.line() or {})
        assert listener.usage()["setups"] == slots
        await keyed_transfer(listener)  # refused "too many set-ups in progress" before
        # the oldest unproven one gave way, told why
        dropped = await waiting[0].line()
        assert dropped is not None and dropped["ok"] is False
        assert str(dropped["error"]).startswith("set-up dropped for a newer connection")
        for peer in waiting:
            peer.close()


async def test_keyed_senders_get_in_while_unproven_set_ups_hammer_the_listener() -> None:
    async with (
        await mrc.listen(
            HOST, 0, mrc.ListenerConfig(key=KEY, region_factory=factory, evs=4)
        ) as listener,
        hammered(listener, listener.limits.max_setups) as opened,
    ):
        while listener.usage()["setups"] < listener.limits.max_setups:
            await asyncio.sleep(0.01)  # (no event says the slots are full)
        for _ in range(10):
            await keyed_transfer(listener)
        assert opened[0] > listener.limits.max_setups  # they were dropped and came back


async def test_an_unproven_set_up_has_a_short_deadline_of_its_own() -> None:
    async with await mrc.listen(
        HOST, 0, mrc.ListenerConfig(key=KEY, region_factory=factory, evs=4)
    ) as listener:
        peer = await Unproven.open(listener.port)
        assert "challenge" in (await peer.line() or {})
        dropped = await peer.line()
        assert dropped is not None and dropped["ok"] is False
        deadline = listener.hello_timeout
        assert dropped["error"] == f"no key proof within {deadline:g} s of connecting"
        assert deadline < listener.setup_timeout
        peer.close()


def test_the_set_up_dropped_is_the_oldest_unproven_of_the_busiest_source() -> None:
    """Per-source fairness: a source holding many unproven set-ups gives way first, so one
    address cannot push out the set-up of another; proven set-ups never give way."""
    ledger = Ledger(Limits(max_setups=5))
    a, b, c = "2001:db8:a::", "2001:db8:b::", "2001:db8:c::"
    for ticket, source in (("a1", a), ("b1", b), ("a2", a), ("a3", a), ("a4", a)):
        assert ledger.begin_setup(ticket, source) is None
    ledger.proven("a1")
    # full: a holds the most unproven set-ups (a2, a3, a4); its oldest unproven gives way
    assert ledger.begin_setup("c1", c) == "a2"
    assert ledger.begin_setup("c2", c) == "a3"
    # a1 (proven), b1, a4, c1, c2: c holds the most, so c1 goes although b1 is older
    assert ledger.begin_setup("b2", b) == "c1"
    for ticket in ("b1", "a4", "c2", "b2"):
        ledger.proven(ticket)
    try:
        ledger.begin_setup("d1", "2001:db8:d::")
    except mrc.MRCError as exc:
        assert str(exc) == "too many set-ups in progress (limit 5)"
    else:
        raise AssertionError("every set-up proven: the newcomer must be refused")
    ledger.end_setup("a2")  # a displaced set-up ending later gives nothing back twice
    assert ledger.setups == 5


def test_a_silent_set_up_gives_way_before_one_that_said_its_hello() -> None:
    ledger = Ledger(Limits(max_setups=2))
    ledger.begin_setup("spoke", "192.0.2.1")
    ledger.said_hello("spoke")  # older, and waiting for its proof
    ledger.begin_setup("silent", "192.0.2.1")
    assert ledger.begin_setup("new", "192.0.2.1") == "silent"


def test_sources_are_addresses_and_ipv6_prefixes() -> None:
    from mrc.transport.limits import source_of

    assert source_of("192.0.2.7") == "192.0.2.7"
    assert source_of("::ffff:192.0.2.7") == "192.0.2.7"
    assert (
        source_of("2001:db8:1:2:aaaa::1") == source_of("2001:db8:1:2:bbbb::9") == ("2001:db8:1:2::")
    )
    assert source_of("fe80::1%eth0") == "fe80::"


async def test_a_sender_dropped_for_a_newer_connection_tries_again() -> None:
    """A refusal with ``retry`` (the set-up gave way) is tried again, SETUP_ATTEMPTS times in
    all, each with a fresh connection and hello; any other refusal ends the set-up at once."""
    from mrc.connection import SETUP_ATTEMPTS
    from mrc.transport.messages import Refusal, RefusedForNow

    hellos: list[dict[str, object]] = []
    retry = [True]

    async def refuse(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        hellos.append(json.loads(await r.readline()))
        w.write(json.dumps(Refusal("busy", retry=retry[0]).to_json()).encode() + b"\n")
        await w.drain()
        w.close()

    server = await asyncio.start_server(refuse, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        try:
            await mrc.connect(HOST, port, mrc.ConnectConfig(evs=4, key=KEY, request_size=10))
        except RefusedForNow as exc:
            assert str(exc) == "connection refused by the receiver: busy"
        else:
            raise AssertionError("refused every time: the set-up must fail")
        assert len(hellos) == SETUP_ATTEMPTS > 1
        nonces = {str(h["auth"]["nonce"]) for h in hellos}  # type: ignore[index]
        assert len(nonces) == SETUP_ATTEMPTS  # a fresh key exchange each time
        hellos.clear()
        retry[0] = False
        try:
            await mrc.connect(HOST, port, mrc.ConnectConfig(evs=4, key=KEY, request_size=10))
        except mrc.MRCError as exc:
            assert not isinstance(exc, RefusedForNow)
        assert len(hellos) == 1
    finally:
        server.close()
        await server.wait_closed()
