"""The listening side: ``listen()`` and :class:`Listener`, the asyncio glue around the set-up
decisions of :mod:`mrc.connection.handshake` (limits, timeouts, allocation, sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import secrets
import socket
from collections.abc import Callable
from typing import Any, Literal

from mrc.connection.common import new_qpn, resolve, side_channel
from mrc.connection.config import Buffer, ListenerConfig, from_keywords
from mrc.connection.conn import Connection
from mrc.connection.grants import RegionMaker
from mrc.connection.handshake import (
    JoinTable,
    any_address,
    checksum_key,
    describe_region,
    pick_checksum,
    plan_accept,
    region_cost,
    route_ids,
)
from mrc.core.endpoint import EndpointCore
from mrc.core.memory import Access, MemoryRegion, ProtectionDomain
from mrc.core.qp import QueuePair
from mrc.errors import MRCError
from mrc.security.packet import Protection
from mrc.transport import auth
from mrc.transport.control import MAX_LINE, ControlChannel, ControlError
from mrc.transport.endpoint import Endpoint
from mrc.transport.evsockets import EVSockets, open_ev_sockets
from mrc.transport.limits import (
    Admission,
    Ledger,
    LimitError,
    Limits,
    source_of,
)
from mrc.transport.linkspeed import with_line_rate
from mrc.transport.memory import default_budget, usable_memory
from mrc.transport.messages import (
    PROTOCOL_VERSION,
    Abort,
    Hello,
    Join,
    Refusal,
    RefusedForNow,
    RegionRequest,
    Welcome,
)
from mrc.transport.ports import RangeExhausted
from mrc.transport.sidechannel import (
    SideChannel,
    join_proof,
    key_path,
    tune_path,
)
from mrc.transport.sockets import udp_socket
from mrc.wire import DEFAULT_PORT

log = logging.getLogger(__name__)

#: how long a listener tries to hand a refusal or an abort to a peer before hanging up
_GOODBYE_TIMEOUT = 1.0


class _JoinRequest(MRCError):  # noqa: N818 - a signal within the listener, not an error
    """The first line of a side-channel connection was a :class:`Join`, not a hello."""

    def __init__(self, join: Join) -> None:
        super().__init__("join")
        self.join = join


class _SetUp:
    """One set-up in progress, as the listener's ledger counts it (its ticket): until the peer
    said its hello and proved the key it runs under ``deadline``, which :meth:`drop` ends
    early when a newcomer needs the slot."""

    __slots__ = ("deadline", "dropped", "stage")

    def __init__(self) -> None:
        self.deadline: asyncio.Timeout | None = None
        self.dropped: str | None = None  # why it gave way to a newcomer
        self.stage = "hello"  # what the listener waits for: hello, key proof, region request

    def drop(self, reason: str) -> None:
        """Give way: the set-up ends with ``reason`` at once (its deadline expires now)."""
        self.dropped = reason
        deadline = self.deadline
        if deadline is not None and not deadline.expired():
            deadline.reschedule(asyncio.get_running_loop().time())


class Listener:
    """Accepts connections from any number of senders; they share its memory regions.

    What peers can make it hold is bounded (:class:`~mrc.transport.limits.Limits`): set-ups in
    progress, live connections and bytes granted on request, each refused beyond its limit with
    one line naming it, before anything is allocated. A set-up takes at most ``setup_timeout``
    seconds; a welcomed sender that sends nothing on the data path for ``start_timeout`` seconds
    (and was not yet handed to the application) is aborted and everything it held released.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        server: asyncio.Server,
        config: ListenerConfig,
        plane_addrs: list[str],
        limits: Limits,
    ) -> None:
        self.endpoint = endpoint
        self.server = server
        #: what ``listen()`` was told; ``plane_addrs`` and ``limits`` as resolved on this machine
        self.config = config
        self.plane_addrs = plane_addrs
        self.limits = limits
        self.ledger = Ledger(self.limits)
        #: live connections (set up, not closed), handed out or not
        self.connections: list[Connection] = []
        self._queue: list[Connection] = []  # set up, not yet handed out by accept()
        self._started: set[Connection] = set()  # whose peer has sent on the data path
        self._start_timers: dict[Connection, asyncio.TimerHandle] = {}
        self._queue_changed = asyncio.Event()
        self._admissions: dict[ControlChannel, Admission] = {}  # set-ups past the limits check
        # a welcome's join token -> the side channel further paths join, and its plane count
        self._joinable: JoinTable[SideChannel] = JoinTable()
        self._setup_tasks: set[asyncio.Task[None]] = set()
        self._abort_tasks: set[asyncio.Task[None]] = set()
        #: the regions made on senders' requests (region_factory, region_release)
        self.regions = RegionMaker(config.region_factory, config.region_release)
        self._closing = False
        self.shared_regions: list[MemoryRegion] = []
        self._on_connection: list[Callable[[Connection], None]] = []

    @property
    def port(self) -> int:
        return self.endpoint.port

    @property
    def setup_timeout(self) -> float:
        return self.config.setup_timeout

    @property
    def hello_timeout(self) -> float:
        return self.config.hello_timeout

    def register(self, buffer: Buffer, name: str = "") -> MemoryRegion:
        """Register memory every connecting sender will be told about."""
        region = self.endpoint.core.pd.register(buffer, Access.REMOTE_WRITE, name)
        self.shared_regions.append(region)
        return region

    def usage(self) -> dict[str, int]:
        """Set-ups in progress, live connections, bytes granted and the memory among them now,
        and how many peers each limit refused so far (``refused_setups``, set-ups dropped
        for a newcomer included, ``refused_connections``, ``refused_granted_bytes``,
        ``refused_memory_bytes``; absent while zero)."""
        return self.ledger.usage()

    def on_connection(self, callback: Callable[[Connection], None]) -> None:
        """Call ``callback(conn)`` with every connection this listener sets up, as soon as it
        is set up (before :meth:`accept` hands it out, and whether it ever does): how
        :mod:`mrc.metrics` counts a connection that closes before anyone accepts it."""
        self._on_connection.append(callback)

    async def accept(self, timeout: float | None = None, *, started: bool = False) -> Connection:
        """The next connection set up, in set-up order; from here on the caller owns it
        (closes it, frees its ``granted`` region).

        ``started=True``: only a connection whose peer has started sending (its first datagram
        arrived), so a sender that says hello and then nothing is never handed out: the
        listener aborts it after ``start_timeout`` and gives back its slot (mrc-recv counts
        transfers this way). Without it a connection is handed out as soon as it is set up,
        and whether its peer ever sends is the caller's business (a connection may carry
        WRITEs the other way, or wait for the application)."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    conn = self._take(started)
                    if conn is not None:
                        return conn
                    self._queue_changed.clear()
                    await self._queue_changed.wait()
        except TimeoutError:
            raise TimeoutError("no sender connected in time") from None

    def _take(self, started: bool) -> Connection | None:
        for conn in self._queue:
            if not started or conn in self._started:
                self._queue.remove(conn)
                self._stop_start_timer(conn)
                return conn
        return None

    # ---- set-up ------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One TCP connection: counted as a set-up in progress (when the slots are full, the
        oldest set-up that has proven nothing gives way, or if all have, this one is refused
        at once), set up within ``setup_timeout``, then queued for accept() and watched until
        its peer starts sending."""
        control = ControlChannel(reader, writer)
        if self._closing:
            control.close()
            return
        setup = _SetUp()
        try:
            displaced = self.ledger.begin_setup(setup, source_of(control.peer_host))
        except LimitError as exc:
            await self._goodbye(control, Refusal.because(str(exc)).to_json())
            return
        if isinstance(displaced, _SetUp):
            displaced.drop(self.ledger.displaced_reason())
        task = asyncio.current_task()
        assert task is not None
        self._setup_tasks.add(task)
        try:
            try:
                async with asyncio.timeout(self.config.setup_timeout):
                    conn = await self._setup(control, setup)
            except TimeoutError:
                raise MRCError(
                    f"set-up did not finish within {self.config.setup_timeout:g} s"
                ) from None
            except _JoinRequest as request:
                await self._join(control, request.join)
                return
        except MRCError as exc:  # ControlError and MessageError too: refuse with the reason
            self._unadmit(control)
            refusal = Refusal.because(str(exc), retry=isinstance(exc, RefusedForNow))
            await self._goodbye(control, refusal.to_json())
            return
        except asyncio.CancelledError:
            self._unadmit(control)
            control.close()
            if self._closing:
                return  # close() cancelled it: ends here, not as an error of the server
            raise
        except BaseException:
            self._unadmit(control)
            control.close()
            raise
        finally:
            self._setup_tasks.discard(task)
            self.ledger.end_setup(setup)
        self._welcomed(conn, self._admissions.pop(control))

    async def _join(self, control: ControlChannel, join: Join) -> None:
        """A further side-channel connection joins a connection's side channel as its path
        over ``join.plane`` (mrc.transport.sidechannel); MRCError, the refusal, otherwise."""
        side = self._joinable.check(
            join, lambda side, token, plane: join_proof(side.primary, token, plane, sending=False)
        )
        await control.send({"mrc": PROTOCOL_VERSION, "ok": True})
        key_path(control, side.primary, join.plane)
        tune_path(control.writer)
        side.add_path(join.plane, control)

    def _admit(self, control: ControlChannel, request: RegionRequest | None) -> None:
        """The limits check of a checked request, before anything is allocated for it: a
        connection slot, the bytes it asks for and the memory among them, or
        :class:`LimitError` (the refusal)."""
        size, memory = region_cost(request, self.config.region_memory)
        self._admissions[control] = self.ledger.admit(size, memory)

    def _unadmit(self, control: ControlChannel) -> None:
        admission = self._admissions.pop(control, None)
        if admission is not None:
            admission.release()

    def _welcomed(self, conn: Connection, admission: Admission) -> None:
        """``conn`` was welcomed: count it until it closes, queue it for accept(), and give
        its peer ``start_timeout`` seconds to start sending."""
        self.connections.append(conn)
        self._queue.append(conn)
        conn._close_hooks.append(lambda: self._closed_one(conn, admission))
        for callback in self._on_connection:
            callback(conn)
        conn.channel.on_first_datagram = lambda: self._on_start(conn)
        if self.config.start_timeout is not None:
            loop = asyncio.get_running_loop()
            self._start_timers[conn] = loop.call_later(
                self.config.start_timeout, self._start_expired, conn
            )
        self._queue_changed.set()

    def _on_start(self, conn: Connection) -> None:
        self._started.add(conn)
        self._stop_start_timer(conn)
        self._queue_changed.set()

    def _stop_start_timer(self, conn: Connection) -> None:
        timer = self._start_timers.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def _closed_one(self, conn: Connection, admission: Admission) -> None:
        """Connection.close() hook: the slot and the granted bytes return to the limits."""
        admission.release()
        self._stop_start_timer(conn)
        self._started.discard(conn)
        with contextlib.suppress(ValueError):
            self.connections.remove(conn)
        with contextlib.suppress(ValueError):
            self._queue.remove(conn)

    def _start_expired(self, conn: Connection) -> None:
        """A welcomed peer sent nothing for ``start_timeout`` s and nobody took it: abort it."""
        self._start_timers.pop(conn, None)
        if conn not in self._queue or conn in self._started:
            return
        self._queue.remove(conn)
        reason = (
            f"no data from the sender within {self.config.start_timeout:g} s of set-up; "
            "connection dropped"
        )
        conn.channel.fail(reason)
        task = asyncio.ensure_future(self._abort(conn, reason))
        self._abort_tasks.add(task)
        task.add_done_callback(self._abort_tasks.discard)

    async def _abort(self, conn: Connection, reason: str) -> None:
        """Tell the peer why (briefly), then close ``conn`` and free its granted region."""
        try:
            with contextlib.suppress(ControlError, TimeoutError):
                await asyncio.wait_for(conn.side.send(Abort(reason).to_json()), _GOODBYE_TIMEOUT)
        finally:
            await self._discard(conn)

    async def _discard(self, conn: Connection) -> None:
        """Close a connection the application never received and free its granted region."""
        await conn.close()
        granted, conn.granted = conn.granted, None  # (released once, whoever comes second)
        if granted is not None:
            buf = granted.view.obj  # (deregister releases the view, and .obj with it)
            conn.deregister(granted)
            self.regions.release(buf)

    async def _goodbye(self, control: ControlChannel, message: dict[str, object]) -> None:
        """Send a last message (refusal or abort) if the peer takes it promptly; hang up."""
        with contextlib.suppress(ControlError, TimeoutError):
            await asyncio.wait_for(control.send(message), _GOODBYE_TIMEOUT)
        control.close()

    async def _introduce(
        self, control: ControlChannel, setup: _SetUp
    ) -> tuple[Hello, Protection | None, RegionRequest | None]:
        """The hello and, with a key, the proof (and an encrypting sender's sealed region
        request), within ``hello_timeout`` of connecting; until the proof the set-up may be
        dropped for a newcomer (:meth:`_SetUp.drop`), after it never."""
        try:
            async with asyncio.timeout(self.config.hello_timeout) as deadline:
                setup.deadline = deadline
                obj = await control.recv()
                if obj is None:
                    raise ControlError("peer closed the side channel before saying hello")
                if Join.is_join(obj):
                    raise _JoinRequest(Join.from_json(obj))
                hello = Hello.from_json(obj)
                self.ledger.said_hello(setup)
                setup.stage = "key proof"
                protection = await auth.as_receiver(
                    control, self.config.key, hello, None, self.config.require_encrypt
                )
                self.ledger.proven(setup)
                setup.stage = "region request"
                request = await auth.request_of(control, hello, None)
        except TimeoutError:
            if setup.dropped is not None:
                raise RefusedForNow(setup.dropped) from None
            raise MRCError(
                f"no {setup.stage} within {self.config.hello_timeout:g} s of connecting"
            ) from None
        finally:
            setup.deadline = None
        if setup.dropped is not None:  # dropped just as its last message arrived
            raise RefusedForNow(setup.dropped)
        return hello, protection, request

    async def _setup(self, control: ControlChannel, setup: _SetUp) -> Connection:
        """Accept one hello: check all of it, then allocate (granted region, EV sockets, QP);
        whatever was allocated is released again if a later step fails."""
        hello, protection, request = await self._introduce(control, setup)
        plan = plan_accept(
            hello,
            control.peer_host,
            self.plane_addrs,
            self.config.evs,
            self.config.qp,
            self.config.fabric,
        )
        cfg, pairs = plan.qp, plan.pairs
        cfg = with_line_rate(cfg, [local for local, _ in pairs], self.config.fabric)
        checksum = pick_checksum(hello.checksums, self.config.checksums)
        core = self.endpoint.core
        # this peer's own domain: the listener's shared regions and what it is granted, so
        # its rkeys reach nothing granted to another peer
        pd = ProtectionDomain()
        shared = [r for r in self.shared_regions if core.pd.lookup(r.rkey) is r]
        for r in shared:
            pd.adopt(r)
        self._admit(control, request)  # the listener's limits, before anything is allocated
        granted = await self.regions.grant(request, pd) if request is not None else None
        evsocks: EVSockets | None = None
        attached: QueuePair | None = None
        side: SideChannel | None = None
        token: str | None = None
        try:
            evsocks = open_ev_sockets(
                plan.total, plan.routes, hello.udp_port, self.config.ports, cfg.source_ports
            )
            qp = QueuePair(
                new_qpn(core),
                pd,
                evsocks.values,
                evsocks.planes,
                cfg,
                secrets.randbits(24),
                active_evs=plan.active,
                ev_routes=route_ids(evsocks.routes),
            )
            qp.connect(hello.qpn, hello.psn)
            if hello.max_imm is not None:
                qp.peer_takes_imms(hello.max_imm)
            if protection is not None:
                qp.protect(protection)
            channel = self.endpoint.attach(qp, evsocks)
            attached = qp  # from here on the endpoint owns the EV sockets
            side = side_channel(control, pairs)
            token = self._joinable.offer(side, len(pairs))
            welcome = Welcome(
                qpn=qp.qpn,
                psn=qp.initial_psn,
                udp_port=self.endpoint.port,
                addrs=tuple(self.plane_addrs),
                regions=tuple(describe_region(r) for r in ([granted] if granted else []) + shared),
                max_imm=cfg.max_imm_dest,
                start_bytes=self.endpoint.start_share(),
                join=token,
                checksum=checksum,
            )
            await control.send(welcome.to_json())
            assert evsocks is not None  # (for the type checker: opened above)
        except BaseException:
            if side is not None:
                side.close(keep_primary=True)
            self._joinable.forget(token)
            if attached is not None:
                self.endpoint.detach(attached.qpn)
            if evsocks is not None:
                evsocks.close()
            if granted is not None:
                self.regions.revoke(pd, granted)
            raise
        conn = Connection(
            self.endpoint,
            channel,
            control,
            remote=hello.regions,
            requested=None,
            owns_endpoint=False,
            peer_addrs=hello.addrs,
            routes=evsocks.routes,
            granted=granted,
            requested_size=request.size if request is not None else None,
            side=side,
            plane_pairs=pairs,
            checksum=checksum or "sha256",
            checksum_key=checksum_key(self.config.key),
        )
        if token is not None:
            joinable = self._joinable
            conn.on_close(lambda: joinable.forget(token))
        return conn

    async def close(self) -> None:
        """Stop listening; close every connection. Set-ups in progress are cancelled, and
        regions granted to connections never handed out are given to ``region_release``."""
        self._closing = True
        self.server.close()
        for task in list(self._setup_tasks):
            task.cancel()
        for timer in self._start_timers.values():
            timer.cancel()
        self._start_timers.clear()
        await asyncio.gather(*self._setup_tasks, *self._abort_tasks, return_exceptions=True)
        # regions still being made for set-ups just cancelled: released once made
        await self.regions.wait()
        for conn in list(self._queue):  # never handed out: the listener's to free
            await self._discard(conn)
        for conn in list(self.connections):
            await conn.close()
        self.endpoint.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 1.0)

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def listen(
    host: str = "::",
    port: int = DEFAULT_PORT,
    config: ListenerConfig | None = None,
    **keywords: Any,
) -> Listener:
    """Listen for MRC connections: UDP on ``port`` and the TCP side channel on the same port,
    as ``config`` says (:class:`~mrc.connection.config.ListenerConfig`: planes, limits,
    timeouts, key, regions made on request). Port 0: a free port (from ``config.ports`` if
    set), then ``Listener.port``.

    The keyword arguments ``listen()`` took before ``ListenerConfig`` (``evs=``, ``key=``,
    ``config=QPConfig(...)``...) still work for one release, with a DeprecationWarning.
    """
    config = from_keywords(ListenerConfig, config, keywords, "listen")
    limits = config.limits(_memory_budget(config.max_memory_bytes))
    plane_addrs = config.plane_addrs
    ports = config.ports
    addrs = [resolve(a) for a in plane_addrs] if plane_addrs else []
    host = resolve(host) if host not in ("", "::", "0.0.0.0") else (host or "::")
    tcp_hosts = addrs or [host]
    # one UDP socket for every plane: a single receive queue keeps the arrival order across
    # planes, which SACK-based loss detection at the sender relies on (two sockets drained in
    # turn would reorder by a whole batch)
    udp_hosts = [any_address(addrs[0])] if len(addrs) > 1 else tcp_hosts
    listener: Listener | None = None

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        assert listener is not None
        await listener._handle(r, w)

    # port 0: the kernel picks a free UDP port, which may be taken for TCP (or on another
    # plane address): try again with another rather than fail
    for attempt in range(32 if port == 0 else 1):
        last = attempt == (31 if port == 0 else 0)
        want = port
        socks: list[socket.socket] = []
        try:
            for h in udp_hosts:
                socks.append(udp_socket(h, want, ports=ports))
                want = socks[0].getsockname()[1]
        except RangeExhausted as exc:
            for s in socks:
                s.close()
            raise MRCError(f"cannot listen: {exc}") from None
        except OSError as exc:
            for s in socks:
                s.close()
            if last or exc.errno != errno.EADDRINUSE:
                raise MRCError(
                    f"cannot listen on UDP [{h}]:{want}: {exc.strerror or exc}"
                ) from None
            continue
        endpoint = Endpoint(EndpointCore(), socks)
        try:
            server = await asyncio.start_server(
                handler, tcp_hosts, want, reuse_address=True, limit=MAX_LINE
            )
        except OSError as exc:
            endpoint.close()
            if last or exc.errno != errno.EADDRINUSE:
                raise MRCError(f"cannot listen on TCP port {want}: {exc.strerror or exc}") from None
            continue
        break
    listener = Listener(endpoint, server, config, addrs, limits)
    return listener


def _memory_budget(value: int | None | Literal["auto"]) -> int | None:
    """``listen(max_memory_bytes=...)`` resolved: "auto" from this machine's memory, a number
    checked against it (never more than the process can have)."""
    if value == "auto":
        return default_budget()
    if isinstance(value, int) and not isinstance(value, bool):
        usable = usable_memory()
        if usable is not None and value > usable:
            raise MRCError(
                f"max_memory_bytes {value} is more than this machine's memory ({usable} bytes)"
            )
    return value
