"""The side channel after set-up, over every plane: no plane is special.

Set-up happens on one TCP connection, to the address the sender was given. Once it is done,
the sender opens one more TCP connection per other plane (its address on that plane to the
receiver's), each a *path* that joins the connection with the token the welcome gave
(:class:`~mrc.transport.messages.Join`). From then on every message is sent on every live path,
numbered (``{"n": k, "m": message}``), and taken once: the first copy of each number is
delivered, in order, the others dropped. The receiving side acknowledges what it took
(``{"ack": k}``, on every path); the sending side keeps what is not yet acknowledged and sends
it again on a path that joins later. So losing any one plane, the set-up's too, loses no
message, and a plane that comes back is joined again.

A path on a dead or blackholed plane is found by the kernel: TCP keepalives every second and
a user timeout of a few seconds (only when there is more than one plane: alone, a path waits
as long as TCP does). With a key each path has its own keys, derived from the set-up's, so
every path authenticates (or seals) its messages under its own message numbers
(docs/PROTOCOL.md, "Side channel over every plane").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable

from mrc.transport.control import ControlChannel, ControlError

log = logging.getLogger("mrc.transport")

#: a path's TCP keepalive: idle seconds before the first probe, seconds between probes, probes
KEEPALIVE = (1, 1, 3)
#: a path whose data is unacknowledged this long (ms) is dead (TCP_USER_TIMEOUT)
USER_TIMEOUT_MS = 4000
#: a path with this many bytes not yet sent is stuck (its plane is blackholed): dropped
STUCK_BYTES = 1 << 20
#: messages held for a gap (a path that joined late delivered them first): at most this many
MAX_HELD = 1024
#: messages sent and not yet acknowledged: at most this many (the peer reads nothing more)
MAX_UNACKED = 1 << 16
#: how often the sender tries again to join a plane whose path was lost (seconds)
REJOIN_INTERVAL = 1.0
#: how long one join may take (seconds)
JOIN_TIMEOUT = 3.0

#: a path joins the connection as the path over this plane (the pair index both sides share)
Plane = int
#: opens and joins the path over a plane (the sender's side)
Joiner = Callable[[Plane], Awaitable[ControlChannel]]
#: told when a path goes (False, the reason) or comes (True, "")
PathWatcher = Callable[[Plane, bool, str], None]


def _discard_join(task: asyncio.Task[ControlChannel]) -> None:
    """A join that finished after the channel stopped wanting it: its path closed, its
    error taken."""
    if task.cancelled():
        return
    if task.exception() is None:
        task.result().close()


def tune_path(writer: asyncio.StreamWriter) -> None:
    """Let the kernel find a dead path within seconds: keepalives on an idle path, a user
    timeout on one whose data goes unacknowledged."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    idle, interval, count = KEEPALIVE
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)


def _derive(key: bytes, plane: Plane) -> bytes:
    return hmac.new(
        key, b"mrc side channel path" + plane.to_bytes(2, "big"), hashlib.sha256
    ).digest()


def key_path(path: ControlChannel, primary: ControlChannel, plane: Plane) -> None:
    """Protect ``path`` as ``primary`` is protected, under keys of its own for ``plane``
    (derived from the primary's, the same on both sides: one side's sending key is the
    other's receiving key)."""
    keys = primary.keys()
    if keys is None:
        return
    send, receive, sealed = keys
    if sealed:
        path.seal(_derive(send, plane), _derive(receive, plane))
    else:
        path.authenticate(_derive(send, plane), _derive(receive, plane))


def join_proof(primary: ControlChannel, token: str, plane: Plane, sending: bool) -> str | None:
    """With a key: what proves a join of the path over ``plane`` (HMAC-SHA256 under the
    sender's path key of the token); None without one. ``sending``: we are the sender."""
    keys = primary.keys()
    if keys is None:
        return None
    key = _derive(keys[0] if sending else keys[1], plane)
    return hmac.new(key, b"mrc join" + token.encode(), hashlib.sha256).hexdigest()


class SideChannel:
    """The side channel of one connection: its paths, numbered messages, acknowledgements.

    ``primary`` is the set-up's connection, the path over ``plane`` (None: over no plane of
    the connection's, e.g. a ``--to`` address that is none of the receiver's planes).
    ``describe(plane)`` names a plane for messages."""

    def __init__(
        self,
        primary: ControlChannel,
        plane: Plane | None,
        describe: Callable[[Plane], str] = lambda p: f"plane {p}",
    ) -> None:
        self.primary = primary
        self._describe = describe
        self._paths: dict[Plane, ControlChannel] = {}  # every path we can send on
        self._readers: dict[Plane, asyncio.Task[None]] = {}  # ... and those still read
        self._unacked: deque[tuple[int, dict[str, object]]] = deque()
        self._next_send = 0
        self._next_recv = 0
        self._held: dict[int, dict[str, object]] = {}
        self._inbox: asyncio.Queue[dict[str, object]] = asyncio.Queue()
        self._ended = False  # no path left: _end says why
        self._end: ControlError | None = None  # None with _ended: the peer closed
        self._eof = False
        self._closed = False
        self._changed = asyncio.Event()
        self.on_path: PathWatcher | None = None
        self.lost: list[tuple[Plane, str]] = []  # paths lost, in order (for reports)
        self._gone: set[Plane] = set()  # planes whose path was lost and not joined again
        self._joiner: Joiner | None = None
        self._planes: list[Plane] = []
        self._rejoin: asyncio.Task[None] | None = None
        #: the primary's own label: -1 when it is over no plane of the connection's
        self.primary_plane = -1 if plane is None else plane
        self._add(self.primary_plane, primary)

    # ---- paths -------------------------------------------------------------------------

    @property
    def planes(self) -> list[Plane]:
        """The planes with a live path, in order."""
        return sorted(self._paths)

    def add_path(self, plane: Plane, path: ControlChannel) -> None:
        """A path joined (the listener's side), or was joined (the sender's): what is not
        acknowledged yet goes on it too, then everything new. A path over a plane that had
        one replaces it (the old one may be stuck on a plane that failed and came back)."""
        if self._closed or self._ended:
            path.close()
            return
        old = self._paths.get(plane)
        if old is not None:
            self._drop(plane, old, "replaced by a new path over the same plane", notify=False)
        self._add(plane, path)
        for n, obj in self._unacked:
            self._post(plane, path, {"n": n, "m": obj})
        if plane in self._paths and plane in self._gone and self.on_path is not None:
            self._gone.discard(plane)
            self.on_path(plane, True, "")  # back: a path over it was lost before
        self._changed.set()

    def _add(self, plane: Plane, path: ControlChannel) -> None:
        self._paths[plane] = path
        self._readers[plane] = asyncio.ensure_future(self._read(plane, path))

    def join_planes(self, planes: list[Plane], joiner: Joiner) -> None:
        """The sender's side: join a path over each of ``planes`` that has none, now and
        whenever one is lost, every :data:`REJOIN_INTERVAL` until the channel closes."""
        self._planes = planes
        self._joiner = joiner
        if planes and self._rejoin is None:
            self._rejoin = asyncio.ensure_future(self._keep_joined())

    async def _keep_joined(self) -> None:
        assert self._joiner is not None
        joiner = self._joiner
        trying: dict[Plane, asyncio.Task[ControlChannel]] = {}
        try:
            await self._join_while_open(joiner, trying)
        finally:
            # closed, ended, or cancelled by close(): a join still under way is cancelled,
            # and whatever it comes to is taken here (a path that joined anyway is closed;
            # a refusal, once the peer is gone, is no "Task exception was never retrieved")
            for task in trying.values():
                task.cancel()
                task.add_done_callback(_discard_join)

    async def _join_while_open(
        self, joiner: Joiner, trying: dict[Plane, asyncio.Task[ControlChannel]]
    ) -> None:
        while not self._closed and not self._ended and not self._eof:
            for plane in self._planes:
                if plane not in self._paths and plane not in trying:
                    trying[plane] = asyncio.ensure_future(
                        asyncio.wait_for(joiner(plane), JOIN_TIMEOUT)
                    )
            for plane, task in list(trying.items()):
                if not task.done():
                    continue
                del trying[plane]
                try:
                    path = task.result()
                except (ControlError, OSError, TimeoutError) as exc:
                    log.debug("side channel: cannot join %s: %s", self._describe(plane), exc)
                    continue
                self.add_path(plane, path)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                waiting = [t for t in trying.values() if not t.done()]
                if waiting:
                    await asyncio.wait(waiting, timeout=REJOIN_INTERVAL)
                else:
                    await asyncio.wait_for(self._changed.wait(), REJOIN_INTERVAL)

    def _drop(self, plane: Plane, path: ControlChannel, why: str, notify: bool = True) -> None:
        """``path`` broke (or was replaced): gone for reading and sending."""
        if self._paths.get(plane) is not path:
            return
        del self._paths[plane]
        reader = self._readers.pop(plane, None)
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        path.close()
        self._changed.set()
        if self._closed:
            return
        if notify:
            self.lost.append((plane, why))
            self._gone.add(plane)
            if self.on_path is not None:
                self.on_path(plane, False, why)
        self._check_end(why)

    def _check_end(self, why: str) -> None:
        """Nothing is read any more, and no path will be joined: the channel ended."""
        if self._readers or self._ended or self._closed:
            return
        if self._joiner is None or self._eof:
            self._finish(why)

    def _finish(self, why: str) -> None:
        """No path is left (and none will be joined): the channel ended."""
        self._ended = True
        if not self._eof:
            self._end = ControlError(f"side channel to the peer broke on every plane: {why}")
        self._inbox.put_nowait({})  # wakes a waiting recv(), which reads _ended

    async def _read(self, plane: Plane, path: ControlChannel) -> None:
        """Take what ``path`` brings until it ends: closed by the peer (which closes every
        path when it is done, or dies: no plane was lost), or broken (a plane was)."""
        try:
            while True:
                obj = await path.recv()
                if obj is None:  # the peer sends no more here; it may still read
                    self._eof = True
                    del self._readers[plane]
                    self._check_end("closed by the peer")
                    return
                self._take(obj)
        except ControlError as exc:
            if path.peer_closed():
                # the peer closed this path, then its host reset it for what we sent after
                # (our acknowledgement of its last message): a close, not a broken plane
                self._eof = True
                self._drop(plane, path, str(exc), notify=False)
                return
            self._drop(plane, path, str(exc))

    # ---- messages ----------------------------------------------------------------------

    def _take(self, obj: dict[str, object]) -> None:
        ack = obj.get("ack")
        if ack is not None:
            if not isinstance(ack, int) or isinstance(ack, bool) or ack < 0:
                raise ControlError("peer sent a side-channel acknowledgement that is no count")
            while self._unacked and self._unacked[0][0] < ack:
                self._unacked.popleft()
            return
        n, msg = obj.get("n"), obj.get("m")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(msg, dict):
            raise ControlError("peer is not speaking the MRC side-channel protocol")
        if n < self._next_recv or n in self._held:
            return  # a copy from another path
        if n > self._next_recv:
            if len(self._held) >= MAX_HELD:
                raise ControlError(f"peer left a gap of over {MAX_HELD} side-channel messages")
            self._held[n] = msg
            return
        self._inbox.put_nowait(msg)
        self._next_recv += 1
        while self._next_recv in self._held:
            self._inbox.put_nowait(self._held.pop(self._next_recv))
            self._next_recv += 1
        self._post_all({"ack": self._next_recv})

    def _post(self, plane: Plane, path: ControlChannel, obj: dict[str, object]) -> None:
        try:
            path.post(obj)
        except ControlError as exc:
            self._drop(plane, path, str(exc))
            return
        if path.unsent() > STUCK_BYTES:
            self._drop(plane, path, f"over {STUCK_BYTES} bytes waiting to be sent")

    def _post_all(self, obj: dict[str, object]) -> None:
        for plane, path in list(self._paths.items()):
            self._post(plane, path, obj)

    async def send(self, obj: dict[str, object]) -> None:
        """Send ``obj`` on every live path; ControlError when there is none."""
        if not self._paths:  # (a path the peer stopped sending on may still take ours)
            raise self._end or ControlError("side channel to the peer is closed")
        if len(self._unacked) >= MAX_UNACKED:
            raise ControlError("peer acknowledges nothing sent on the side channel")
        n = self._next_send
        self._next_send += 1
        self._unacked.append((n, obj))
        self._post_all({"n": n, "m": obj})
        if not self._paths:
            raise self._end or ControlError("side channel to the peer broke on every plane")
        await asyncio.sleep(0)  # (as a drain would: let the loop run)

    async def recv(self, timeout: float | None = None) -> dict[str, object] | None:
        """The next message, or None once the peer closed the channel (every path)."""
        if self._inbox.empty() and self._ended:
            if self._end is not None:
                raise self._end
            return None
        try:
            msg = await asyncio.wait_for(self._inbox.get(), timeout)
        except TimeoutError:
            raise ControlError("peer did not answer on the side channel in time") from None
        if not msg and self._ended:  # the end's wake-up (a real message is never empty)
            self._inbox.put_nowait({})  # for the next recv() too
            if self._end is not None:
                raise self._end
            return None
        return msg

    def close(self, keep_primary: bool = False) -> None:
        """Close every path (``keep_primary``: all but the set-up's, which its owner closes:
        a set-up that fails still sends its refusal there)."""
        self._closed = True
        if self._rejoin is not None:
            self._rejoin.cancel()
        for reader in self._readers.values():
            reader.cancel()
        for path in self._paths.values():
            if not (keep_primary and path is self.primary):
                path.close()
        self._paths.clear()
        self._readers.clear()
