"""The side channel's messages: every field checked before anything is allocated, every
allocation released when set-up fails, and a one-line reason naming the field."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Protocol

import pytest

import mrc
from mrc.connection import Connection, Listener
from mrc.core.events import EVStateChanged
from mrc.transport.control import ControlChannel, ControlError
from mrc.transport.messages import (
    Abort,
    Done,
    Hello,
    MessageError,
    Refusal,
    RegionRequest,
    RemoteRegion,
    Result,
    RoundDigest,
    Welcome,
    parse_reply,
)

HOST = "::1"
SHA = "ab" * 32


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def settle(baseline: int) -> int:
    """The open fd count once the closes already under way are done (at most 2 s)."""
    for _ in range(200):
        if open_fds() <= baseline:
            break
        await asyncio.sleep(0.01)
    return open_fds()


def good_hello(port: int = 40000) -> dict[str, object]:
    return Hello(
        qpn=0x123456,
        psn=7,
        udp_port=port,
        addrs=(HOST,),
        evs=4,
        psn_window=1024,
        regions=(RemoteRegion("mine", 5, 1 << 32, 4096),),
        request=RegionRequest(1000, "file"),
    ).to_json()


def with_field(path: str, raw: str) -> bytes:
    """A good hello as a JSON line with ``path`` (``a`` or ``a.b``) set to the JSON text
    ``raw`` as is (so 1e999 reaches the parser as written)."""
    obj: dict[str, object] = good_hello()
    *parents, key = path.split(".")
    inner = obj
    for p in parents:
        inner = inner[p]  # type: ignore[assignment]  # the parents are objects here
    inner[key] = "__RAW__"
    return json.dumps(obj).replace('"__RAW__"', raw).encode() + b"\n"


def without_field(key: str) -> bytes:
    obj = good_hello()
    del obj[key]
    return json.dumps(obj).encode() + b"\n"


# (line sent as the hello, text the refusal must contain)
BAD_HELLOS = [
    (with_field("regions", "[1]"), "regions[0] must be an object"),
    (with_field("psn_window", "1e999"), "psn_window must be an integer in 64..4194304"),
    (with_field("psn_window", "63"), "psn_window must be an integer"),
    (with_field("udp_port", "70000"), "udp_port must be an integer in 1..65535, not 70000"),
    (with_field("udp_port", "-1"), "udp_port must be an integer in 1..65535, not -1"),
    (with_field("udp_port", "0"), "udp_port"),
    (with_field("max_imm", "0"), "max_imm must be an integer in 1..1048576, not 0"),
    (with_field("request.size", "1e999"), "request.size must be an integer"),
    (with_field("request.size", "-1"), "request.size"),
    (with_field("request", "[]"), "request must be an object"),
    (with_field("qpn", "true"), "qpn must be an integer in 1..16777215, not true"),
    (with_field("qpn", "0"), "qpn"),
    (with_field("qpn", "16777216"), "qpn"),
    (with_field("psn", "1.5"), "psn must be an integer"),
    (with_field("psn", '"7"'), "psn must be an integer"),
    (with_field("evs", "0"), "evs"),
    (with_field("addrs", '"::1"'), "addrs must be a list"),
    (with_field("addrs", '["not an address"]'), "addrs[0] must be an IP address"),
    (with_field("addrs", json.dumps(["::1"] * 17)), "addrs must be a list of at most 16"),
    (with_field("regions", '[{"name": "x", "rkey": -1, "addr": 0, "length": 1}]'), "rkey"),
    (with_field("regions", '[{"name": "x", "rkey": 1, "addr": 0}]'), "regions[0].length is"),
    (with_field("regions", '[{"name": 5, "rkey": 1, "addr": 0, "length": 1}]'), "name"),
    (with_field("request.name", json.dumps("n" * 2000)), "request.name must be a string"),
    (without_field("qpn"), "qpn is missing"),
    (without_field("udp_port"), "udp_port is missing"),
    (with_field("mrc", "1"), "version mismatch"),
    (without_field("mrc"), "not speaking the MRC side-channel protocol"),
    (b"[1, 2]\n", "not speaking the MRC side-channel protocol"),
    (b"{not json\n", "not speaking the MRC side-channel protocol"),
    (b"{" + b" " * (1 << 20) + b"}\n", "message over 1048576 bytes long"),
    # deep nesting: Python's parser would raise RecursionError, a traceback in the listener
    (b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}\n", "nested deeper than 16 levels"),
    (with_field("request.name", "[" * 17 + "]" * 17), "nested deeper than 16 levels"),
]


@contextlib.asynccontextmanager
async def listening(**kw: object) -> AsyncIterator[Listener]:
    def factory(size: int, _request: dict[str, object]) -> bytearray:
        if size > 1 << 20:
            raise mrc.MRCError(f"transfer of {size} bytes is too large")
        return bytearray(max(size, 1))

    listener = await mrc.listen(HOST, 0, mrc.ListenerConfig(region_factory=factory, **kw))  # type: ignore[arg-type]  # kw: ListenerConfig fields
    try:
        yield listener
    finally:
        await listener.close()


async def exchange(port: int, line: bytes, hang_up: bool = True) -> dict[str, object]:
    """Send ``line`` as a hello over a raw TCP connection; the one-line answer (after which
    the listener hangs up, unless it accepted)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(line)
        await writer.drain()
        answer = await asyncio.wait_for(reader.readline(), 5)
        if hang_up:  # (a reset, when part of an oversized line was left unread, is one too)
            with contextlib.suppress(ConnectionResetError):
                assert await asyncio.wait_for(reader.read(), 5) == b"", "the listener hangs up"
    finally:
        writer.close()
        await writer.wait_closed()
    reply = json.loads(answer)
    assert isinstance(reply, dict)
    return reply


def assert_nothing_held(listener: Listener) -> None:
    core = listener.endpoint.core
    assert core.qps == {}
    assert listener.endpoint.channels == {}
    assert core.pd.regions() == []
    assert listener.connections == []


async def test_bad_hellos_are_refused_naming_the_field_and_leak_nothing() -> None:
    async with listening() as listener:
        before = open_fds()
        for line, expected in BAD_HELLOS:
            reply = await exchange(listener.port, line)
            assert reply["mrc"] == 3 and reply["ok"] is False, (line, reply)
            error = reply["error"]
            assert isinstance(error, str) and expected in error, (line, error)
            assert "\n" not in error
        # a request the factory refuses: refused with its reason, before any socket exists
        big = json.dumps({**good_hello(), "request": {"size": 1 << 30, "name": ""}})
        reply = await exchange(listener.port, big.encode() + b"\n")
        assert reply["ok"] is False and "too large" in str(reply["error"])
        assert await settle(before) == before
        assert_nothing_held(listener)
        # and the listener still accepts a good sender
        async with await mrc.connect(
            HOST, listener.port, mrc.ConnectConfig(evs=4, request_size=5000)
        ) as conn:
            peer = await listener.accept(timeout=5)
            assert peer.requested_size == 5000
            assert conn.requested is not None
            assert await conn.write(b"x" * 5000, conn.requested) == 5000


async def test_hello_up_to_the_line_limit_is_read() -> None:
    """1 MiB per line, as documented (not the 64 KiB a StreamReader takes by default)."""
    regions = [RemoteRegion(f"{i:0>200}", i, i << 20, 1) for i in range(1000)]
    line = json.dumps({**good_hello(), "regions": [r.to_json() for r in regions]})
    assert 200_000 < len(line) < 1 << 20
    async with listening() as listener:
        reply = await exchange(listener.port, line.encode() + b"\n", hang_up=False)
        assert reply["ok"] is True, reply


async def test_ev_socket_failure_after_the_grant_releases_everything() -> None:
    """Plane 1 is IPv4 here and the hello names an IPv6 address for it: its EV sockets cannot
    connect, after the granted region and plane 0's sockets exist."""
    async with listening(plane_addrs=[HOST, "127.0.0.1"]) as listener:
        before = open_fds()
        hello = {**good_hello(), "addrs": [HOST, HOST]}
        reply = await exchange(listener.port, json.dumps(hello).encode() + b"\n")
        assert reply["ok"] is False and "cannot open EV sockets" in str(reply["error"])
        assert await settle(before) == before
        assert_nothing_held(listener)


async def test_welcome_that_cannot_be_sent_releases_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The QP is attached and the region granted when the welcome fails to go out."""
    real_send = ControlChannel.send

    async def send(self: ControlChannel, obj: dict[str, object]) -> None:
        if obj.get("ok") is True:
            raise ControlError("side channel to the peer broke: test")
        await real_send(self, obj)

    monkeypatch.setattr(ControlChannel, "send", send)
    async with listening() as listener:
        before = open_fds()
        reply = await exchange(listener.port, json.dumps(good_hello()).encode() + b"\n")
        assert reply["ok"] is False and "broke: test" in str(reply["error"])
        assert await settle(before) == before
        assert_nothing_held(listener)


@contextlib.asynccontextmanager
async def answering(answer: bytes) -> AsyncIterator[int]:
    """A TCP server that reads a hello and answers ``answer``."""
    writers: list[asyncio.StreamWriter] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        writers.append(w)
        await r.readline()
        w.write(answer)
        await w.drain()

    server = await asyncio.start_server(handle, HOST, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for w in writers:
            w.close()
        server.close()
        await server.wait_closed()


GOOD_WELCOME = Welcome(qpn=9, psn=0, udp_port=40000, regions=(RemoteRegion("in", 1, 0, 8),))

BAD_WELCOMES = [
    ({"udp_port": 70000}, "bad welcome: udp_port must be an integer in 1..65535, not 70000"),
    ({"qpn": 0}, "bad welcome: qpn"),
    ({"max_imm": 1 << 21}, "bad welcome: max_imm must be an integer in 1..1048576"),
    ({"start_bytes": 0}, "bad welcome: start_bytes must be an integer in 1..1099511627776"),
    ({"start_bytes": "64K"}, "bad welcome: start_bytes must be an integer"),
    ({"psn": -1}, "bad welcome: psn"),
    ({"regions": [1]}, "bad welcome: regions[0] must be an object"),
    ({"regions": [{"name": "in", "rkey": 1, "addr": 0, "length": 1.5}]}, "regions[0].length"),
    ({"addrs": ["fd00::1", 5]}, "bad welcome: addrs[1] must be an IP address"),
    ({"ok": "yes"}, "bad welcome: ok must be true or false"),
]


@pytest.mark.parametrize(("change", "expected"), BAD_WELCOMES)
async def test_bad_welcomes_are_reported_naming_the_field(
    change: dict[str, object], expected: str
) -> None:
    answer = json.dumps({**GOOD_WELCOME.to_json(), **change}).encode() + b"\n"
    before = open_fds()
    async with answering(answer) as port:  # (its end of the connection is open till the end)
        with pytest.raises(mrc.MRCError) as info:
            await mrc.connect(HOST, port, mrc.ConnectConfig(evs=4))
        assert expected in str(info.value)
    assert await settle(before) == before


def test_messages_round_trip() -> None:
    hello = Hello.from_json(good_hello())
    assert hello.request == RegionRequest(1000, "file")
    assert hello.regions == (RemoteRegion("mine", 5, 1 << 32, 4096),)
    assert Hello.from_json(hello.to_json()) == hello
    minimal = Hello.from_json({"mrc": 3, "qpn": 1, "psn": 0, "udp_port": 1})
    assert minimal == Hello(1, 0, 1)
    assert parse_reply(GOOD_WELCOME.to_json()) == GOOD_WELCOME
    granted = Welcome(qpn=9, psn=0, udp_port=1, max_imm=3, start_bytes=1 << 20)
    assert parse_reply(granted.to_json()) == granted
    refusal = Refusal("no room")
    assert parse_reply(refusal.to_json()) == refusal
    assert parse_reply({"mrc": 3, "ok": False}) == Refusal("no reason")
    assert len(Refusal.because("x" * 10_000).error) <= 4096
    done = Done(SHA, 12)
    assert Done.from_json(done.to_json()) == done
    result = Result(True, SHA, {"bytes_placed": 5, "srtt": None, "dropped_by_reason": {"a": 1}})
    assert Result.from_json(result.to_json()) == result
    assert Abort.from_json({"error": "disk full"}) == Abort("disk full")
    digest = RoundDigest(7, SHA)
    assert RoundDigest.from_json(digest.to_json()) == digest


class _Parsed(Protocol):
    """A message class: it reads itself from JSON (raising MessageError if it is wrong)."""

    def from_json(self, obj: object, /) -> object: ...


@pytest.mark.parametrize(
    ("cls", "obj", "expected"),
    [
        (
            Done,
            {"type": "done", "digest": "ABC", "bytes": 1},
            "digest must be 32 to 64 lowercase hex",
        ),
        (Done, {"type": "done", "digest": SHA, "bytes": False}, "bytes must be an integer"),
        (Done, {"type": "result", "digest": SHA, "bytes": 1}, 'type must be "done"'),
        (Result, {"type": "result", "ok": 1, "digest": SHA}, "ok must be true or false"),
        (Result, {"type": "result", "ok": True, "digest": SHA, "stats": {"x": []}}, "stats.x"),
        (
            Result,
            {"type": "result", "ok": True, "digest": SHA, "stats": {"x": float("nan")}},
            "stats.x",
        ),
        (RoundDigest, {"type": "round", "round": 1 << 24, "digest": SHA}, "round must be"),
        (RoundDigest, {"type": "round", "round": True, "digest": SHA}, "round must be"),
        (RoundDigest, {"type": "round", "round": 1}, "digest is missing"),
        (RoundDigest, {"type": "done", "round": 1, "digest": SHA}, 'type must be "round"'),
        (Abort, {"error": None}, "error must be a string"),
        (Abort, {}, "error is missing"),
        (RemoteRegion, {"name": "", "rkey": 1, "addr": (1 << 64) - 1, "length": 2}, "length"),
    ],
)
def test_after_setup_messages_are_checked(cls: _Parsed, obj: object, expected: str) -> None:
    with pytest.raises(MessageError, match=None) as info:
        cls.from_json(obj)
    assert expected in str(info.value)
    assert isinstance(info.value, mrc.MRCError)


async def test_connection_public_api() -> None:
    """What the commands, the bench and the tools use instead of the internals."""
    async with listening() as listener:
        conn: Connection = await mrc.connect(
            HOST, listener.port, mrc.ConnectConfig(evs=8, request_size=100_000)
        )
        async with conn:
            peer = await listener.accept(timeout=5)
            assert peer.peer_addrs == (HOST,) and conn.peer_addrs == ()
            assert peer.peer_host == HOST and peer.requested_size == 100_000
            assert conn.qpn != 0 and peer.qpn != 0
            events: list[object] = []
            conn.on_ev_change(events.append)
            conn.deny_ev(3)
            assert "denied" in str(conn.ev_report()[3]["state"]).lower()
            with pytest.raises(ValueError, match="no EV 99"):
                conn.deny_ev(99)
            assert set(conn.ev_counters()) >= {"evs_assumed_bad", "planes_lost"}
            assert conn.requested is not None
            await conn.write(os.urandom(100_000), conn.requested)
            # the core's event, passed through as it is (delivered with the next packets)
            assert events and all(isinstance(e, EVStateChanged) for e in events)
            assert 3 in [getattr(e, "ev", None) for e in events]  # (a backup may step in too)
            # allowed again: probed over the real sockets, and GOOD once its probes answer
            back = asyncio.Event()
            conn.on_ev_change(
                lambda e: back.set() if e.ev == 3 and e.new_label != "ASSUMED_BAD" else None
            )
            assert conn.allow_ev(3) and not conn.allow_ev(3)
            with pytest.raises(ValueError, match="no EV 99"):
                conn.allow_ev(99)
            await asyncio.wait_for(back.wait(), 10)
            assert str(conn.ev_report()[3]["state"]).startswith("GOOD")
            assert conn.bytes_acked >= 100_000
            assert peer.bytes_placed == 100_000
            assert peer.granted is not None
            peer.deregister(peer.granted)
            assert listener.endpoint.core.pd.lookup(peer.granted.rkey) is None
