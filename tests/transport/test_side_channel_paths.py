"""The side channel over every plane (mrc.transport.sidechannel), on loopback: two "planes"
that are both ::1, so the sender joins a second path to the listener. Messages arrive once
and in order whichever paths carry them; a path that breaks costs nothing while another
lives; a path joined later gets what was not yet acknowledged; keys protect every path under
keys of its own; hostile joins and framing are refused with one line."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest

import mrc
from mrc.connection import Connection
from mrc.transport.control import ControlChannel, ControlError
from mrc.transport.sidechannel import SideChannel

HOST = "::1"


async def until(cond: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.005)


async def _message(c: Connection) -> dict[str, object]:
    """The next side-channel message (within 5 s), which must come."""
    m = await c.recv_message(timeout=5)
    assert m is not None, "the channel closed"
    return m


@contextlib.asynccontextmanager
async def two_plane_pair(**kw: Any) -> AsyncIterator[tuple[Connection, Connection]]:
    async with two_plane_listener(**kw) as (conn, peer, _listener):
        yield conn, peer


@contextlib.asynccontextmanager
async def two_plane_listener(
    **kw: Any,
) -> AsyncIterator[tuple[Connection, Connection, mrc.Listener]]:
    listener = await mrc.listen(HOST, 0, mrc.ListenerConfig(plane_addrs=[HOST, HOST], **kw))
    conn = None
    try:
        conn = await mrc.connect(
            HOST,
            listener.port,
            mrc.ConnectConfig(
                evs=4,
                local_addrs=[HOST, HOST],
                key=kw.get("key"),
                encrypt=bool(kw.get("require_encrypt")),
            ),
        )
        peer = await listener.accept(timeout=5)
        # the sender joins its second path at once
        await until(lambda: conn.side.planes == [0, 1] and peer.side.planes == [0, 1], "no join")
        yield conn, peer, listener
    finally:
        if conn is not None:
            await conn.close()
        await listener.close()


async def test_each_message_arrives_once_in_order_over_two_paths() -> None:
    async with two_plane_pair() as (conn, peer):
        for i in range(50):
            await conn.send_message({"type": "x", "i": i})
        got = [await peer.recv_message(timeout=5) for _ in range(50)]
        assert [m["i"] for m in got if m] == list(range(50))
        # everything was acknowledged: nothing kept for a later path
        await until(lambda: not conn.side._unacked, "not acknowledged")
        with pytest.raises(ControlError, match="in time"):
            await peer.recv_message(timeout=0.2)  # no copy delivered twice


@pytest.mark.parametrize("which", [0, 1])
async def test_a_broken_path_costs_nothing_while_another_lives(which: int) -> None:
    async with two_plane_pair() as (conn, peer):
        lost: list[tuple[int, bool, str]] = []
        conn.side.on_path = lambda p, up, why: lost.append((p, up, why))
        # the receiver resets one path (as a dead plane's TCP ends: an error, not a close)
        sock = peer.side._paths[which].writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.side._paths[which].writer.transport.abort()
        await until(lambda: lost, "the broken path was not noticed")
        assert lost[0][0] == which and lost[0][1] is False
        for i in range(5):
            await conn.send_message({"i": i})
            await peer.send_message({"i": -i})
        assert [(await _message(peer))["i"] for _ in range(5)] == list(range(5))
        assert [(await _message(conn))["i"] for _ in range(5)] == [
            0,
            -1,
            -2,
            -3,
            -4,
        ]
        # the sender joins the plane again, and says so
        await until(lambda: (which, True, "") in lost, "not joined again", timeout=5)
        assert conn.side.planes == [0, 1]


async def test_a_path_the_peer_closed_then_reset_is_no_lost_plane() -> None:
    """A peer done with the transfer sends its last message on every path and closes them;
    our acknowledgement of it meets a closed socket, and the peer's host answers with a reset.
    Where the reset arrives before this path's reader read what came with the close, the
    path was closed, not broken: no plane is reported lost (it once made mrc-send warn
    "plane 1 lost" after a good transfer). The arrival order is set on our path's reader
    directly, in one step, as the kernel and the event loop can deliver it."""
    async with two_plane_pair() as (conn, peer):
        lost: list[tuple[int, bool, str]] = []
        conn.side.on_path = lambda p, up, why: lost.append((p, up, why))
        await peer.send_message({"type": "x"})
        assert (await conn.recv_message(timeout=5)) == {"type": "x"}
        reader = conn.side._paths[1].reader
        reader.feed_data(b'{"n": 0, "m": {"type": "x"}}\n')  # the copy on plane 1
        reader.feed_eof()
        reader.set_exception(ConnectionResetError(104, "Connection reset by peer"))
        await until(lambda: 1 not in conn.side._paths, "the reset path was kept")
        assert lost == []
        assert conn.side._eof


async def test_a_reset_without_a_close_is_a_lost_plane() -> None:
    """The same reset with no close before it is a broken path, as before."""
    async with two_plane_pair() as (conn, peer):
        lost: list[tuple[int, bool, str]] = []
        conn.side.on_path = lambda p, up, why: lost.append((p, up, why))
        conn.side._paths[1].reader.set_exception(ConnectionResetError(104, "reset"))
        await until(lambda: lost, "the broken path was not noticed")
        assert lost[0][:2] == (1, False) and "reset" in lost[0][2]


async def test_a_path_joined_later_gets_what_was_not_acknowledged() -> None:
    """Messages sent while the receiver read nothing: a new path replays them in order, and
    the receiver takes each once."""
    async with two_plane_pair() as (conn, peer):
        side = conn.side
        # hold back the acknowledgements: pause reading on the receiver's paths
        for p in peer.side._paths.values():
            cast(asyncio.Transport, p.writer.transport).pause_reading()
        for i in range(3):
            await conn.send_message({"i": i})
        assert [n for n, _m in side._unacked] == [0, 1, 2]
        for p in peer.side._paths.values():
            cast(asyncio.Transport, p.writer.transport).resume_reading()
        assert [(await _message(peer))["i"] for _ in range(3)] == [0, 1, 2]
        await until(lambda: not side._unacked, "not acknowledged")


async def test_keyed_paths_are_protected_under_keys_of_their_own() -> None:
    key = os.urandom(32)
    async with two_plane_pair(key=key, require_encrypt=True) as (conn, peer):
        keys = [p.keys() for p in conn.side._paths.values()]
        assert all(k is not None and k[2] for k in keys)  # sealed, every path
        assert len({k[0] for k in keys if k}) == 2  # distinct keys per path
        await conn.send_message({"type": "secret", "n": 1})
        assert (await peer.recv_message(timeout=5)) == {"type": "secret", "n": 1}


async def _raw_join(port: int, line: bytes) -> dict[str, object]:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(line)
        await writer.drain()
        return json.loads(await asyncio.wait_for(reader.readline(), 5))  # type: ignore[no-any-return]
    finally:
        writer.close()


async def test_hostile_joins_are_refused_with_one_line() -> None:
    key = os.urandom(32)
    async with two_plane_listener(key=key) as (conn, peer, listener):
        port = conn.control.peer_port
        (token,) = listener._joinable
        bad = [
            (b'{"mrc": 3, "join": "' + b"0" * 32 + b'", "plane": 1}\n', "no connection to join"),
            (b'{"mrc": 3, "join": "zz", "plane": 1}\n', "join must be"),
            (b'{"mrc": 3, "join": "' + b"0" * 32 + b'", "plane": true}\n', "plane must be"),
            # the real token, without the key's proof, or with a wrong one, or a plane beyond
            (f'{{"mrc": 3, "join": "{token}", "plane": 1}}\n'.encode(), "proof is wrong"),
            (
                f'{{"mrc": 3, "join": "{token}", "plane": 1, "proof": "{"ab" * 32}"}}\n'.encode(),
                "proof is wrong",
            ),
            (f'{{"mrc": 3, "join": "{token}", "plane": 7}}\n'.encode(), "no plane 7"),
        ]
        for line, words in bad:
            reply = await _raw_join(port, line)
            assert reply["ok"] is False and words in str(reply["error"]), (line, reply)
        assert peer.side.planes == [0, 1]  # nothing joined, nothing replaced
        await conn.send_message({"still": True})
        assert await peer.recv_message(timeout=5) == {"still": True}


async def test_framing_that_is_not_ours_breaks_only_that_path() -> None:
    async with two_plane_pair() as (conn, peer):
        path = conn.side._paths[1]
        path.post({"n": "zero", "m": {}})  # a path that speaks nonsense is dropped
        await until(lambda: 1 not in peer.side._paths, "the path was kept")
        await conn.send_message({"ok": 1})
        assert await peer.recv_message(timeout=5) == {"ok": 1}


def test_a_side_channel_without_paths_says_so() -> None:
    server_port = 0

    async def run() -> None:
        r, w = await asyncio.open_connection(*("::1", server_port))
        side = SideChannel(ControlChannel(r, w), None)
        side.close()
        with pytest.raises(ControlError, match="closed"):
            await side.send({"x": 1})
        w.close()

    async def serve() -> None:
        nonlocal server_port
        server = await asyncio.start_server(lambda r, w: None, HOST, 0)
        server_port = server.sockets[0].getsockname()[1]
        async with server:
            await run()

    asyncio.run(serve())


async def test_a_path_closed_with_bytes_unread_sends_its_fin_before_any_reset() -> None:
    """The receiver, done, closes its paths; our acknowledgement of its last message may
    have arrived and not been read. Closed so, a socket sends a reset and no FIN, and this
    side took the path for broken: mrc-send warned "plane 0 lost" after a good transfer (a
    CI run). ControlChannel.close sends the FIN first: the reader here sees the end."""
    accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
    accepted = asyncio.get_running_loop().create_future()

    async def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.set_result((r, w))

    server = await asyncio.start_server(on_connect, HOST, 0)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(HOST, port)
        r, w = await asyncio.wait_for(accepted, 5)
        cast(asyncio.Transport, w.transport).pause_reading()  # what comes stays unread
        writer.write(b'{"ack": 1}\n')
        await writer.drain()
        sock = w.get_extra_info("socket")
        await until(lambda: _pending(sock), "the acknowledgement never reached the peer's socket")
        ControlChannel(r, w).close()
        line = await asyncio.wait_for(reader.readline(), 5)  # a reset alone raises here
        assert line == b""
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


def _pending(sock: socket.socket) -> bool:
    """Whether ``sock`` (the transport's) holds bytes not yet read, peeked on a copy."""
    with socket.socket(fileno=os.dup(sock.fileno())) as peek:
        try:
            return bool(peek.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except BlockingIOError:
            return False


async def test_a_join_under_way_when_the_channel_closes_leaves_no_stray_error() -> None:
    """close() cancels the rejoin loop; a join it had started and that fails after (the
    peer gone: connection refused) was an orphan task, and asyncio printed "Task exception
    was never retrieved" with a traceback on mrc-send's stderr (a CI run), once the task was
    collected. Now the loop's end takes it."""
    loop = asyncio.get_running_loop()
    stray: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: stray.append(ctx))
    try:
        await _join_refused_after_close()
        gc.collect()  # (the orphan, if any, says so when it is collected)
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(old)
    assert not [c for c in stray if "never retrieved" in str(c.get("message"))], stray


async def _join_refused_after_close() -> None:
    """A connection whose rejoin loop has a join under way when the channel closes; the
    join is refused after. Nothing of it is left referenced on return."""
    loop = asyncio.get_running_loop()
    async with two_plane_pair() as (conn, _peer):
        side = conn.side
        release: asyncio.Future[None] = loop.create_future()
        started = asyncio.Event()

        async def refused(plane: int) -> ControlChannel:
            started.set()
            await asyncio.shield(release)
            raise ConnectionRefusedError(111, "Connection refused")

        assert side._rejoin is not None
        side._rejoin.cancel()
        side._rejoin = None
        side.join_planes([0, 1], refused)
        side._paths[1].reader.set_exception(ConnectionResetError(104, "reset"))
        await asyncio.wait_for(started.wait(), 5)
        side.close()
        release.set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
