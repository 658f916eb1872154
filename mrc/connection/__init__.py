"""The library API: RDMA-style connections over MRC.

A receiver ``listen()``s and registers memory; a sender ``connect()``s, learns the receiver's
regions (name, rkey, address, length) over the side channel, and posts WRITE / WRITE_IMM work
requests that land straight in that memory. Completions are awaited, not polled::

    listener = await mrc.listen("::1", 4791)
    inbox = listener.register(bytearray(1 << 20), name="inbox")
    ...
    conn = await mrc.connect("::1", 4791)
    await conn.write(b"hello", conn.remote["inbox"], offset=0, imm=1)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import hmac
import ipaddress
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol

from mrc import counter_registry as registry
from mrc.core.config import QPConfig
from mrc.core.counters import Source
from mrc.core.endpoint import EndpointCore, PeerGroups
from mrc.core.events import EVStateChanged
from mrc.core.memory import Access, MemoryRegion, ProtectionDomain
from mrc.core.qp import QueuePair
from mrc.errors import MRCError
from mrc.security.packet import Mode, Protection
from mrc.srv6.evroutes import EVRoute, fabric_routes, plain_routes
from mrc.transport import auth
from mrc.transport.control import MAX_LINE, ControlChannel, ControlError
from mrc.transport.endpoint import Endpoint, QPChannel
from mrc.transport.evsockets import EVSockets, open_ev_sockets
from mrc.transport.limits import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_GRANTED,
    DEFAULT_MAX_SETUPS,
    Admission,
    Ledger,
    LimitError,
    Limits,
    source_of,
)
from mrc.transport.memory import default_budget, usable_memory
from mrc.transport.messages import (
    MAX_EVS,
    MAX_REGION_SIZE,
    PROTOCOL_VERSION,
    Abort,
    Hello,
    Join,
    Refusal,
    RefusedForNow,
    RegionRequest,
    RemoteRegion,
    Welcome,
    parse_reply,
)
from mrc.transport.ports import PortRange, RangeExhausted
from mrc.transport.sidechannel import (
    JOIN_TIMEOUT,
    SideChannel,
    join_proof,
    key_path,
    tune_path,
)
from mrc.transport.sockets import family_of, udp_socket
from mrc.wire import DEFAULT_PORT, MAX_PLANES

if TYPE_CHECKING:
    from mrc.topology.model import Topology

log = logging.getLogger(__name__)

__all__ = [
    "Buffer",
    "Connection",
    "Limits",
    "Listener",
    "MRCError",
    "RegionFactory",
    "RegionRelease",
    "RemoteRegion",
    "backup_count",
    "connect",
    "listen",
]

CONNECT_TIMEOUT = 5.0
#: set-ups a sender tries when a listener lets each give way to a newer connection (a refusal
#: with ``retry``): a listener full of peers that prove nothing drops its oldest for a newcomer
SETUP_ATTEMPTS = 4
#: a listener's bound on one whole set-up, TCP connection to welcome (``setup_timeout``)
SETUP_TIMEOUT = 10.0
#: how long a new side-channel connection has to say its hello and, with a key, prove it
#: (``hello_timeout``): a sender does both within a round trip of connecting
HELLO_TIMEOUT = 2.0
#: how long a welcomed sender may stay silent on the data path (``start_timeout``)
START_TIMEOUT = 10.0
#: how long a listener tries to hand a refusal or an abort to a peer before hanging up
_GOODBYE_TIMEOUT = 1.0


class Buffer(Protocol):
    """Anything ``memoryview()`` accepts: bytes, bytearray, memoryview, mmap, array...

    (``collections.abc.Buffer`` from Python 3.12, spelled out for 3.11. Type checkers on 3.11
    do not know that NumPy arrays are buffers; they work all the same.)
    """

    def __buffer__(self, flags: int, /) -> memoryview: ...


def _any_address(host: str) -> str:
    return "0.0.0.0" if family_of(host) == socket.AF_INET else "::"


def _resolve(host: str) -> str:
    """A literal address for ``host`` (IPv6 preferred)."""
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise MRCError(f"cannot resolve {host!r}: {exc.strerror}") from None
    infos.sort(key=lambda i: 0 if i[0] == socket.AF_INET6 else 1)
    return str(infos[0][4][0])


def _new_qpn(core: EndpointCore) -> int:
    while True:
        qpn = secrets.randbits(24)
        if qpn and qpn not in core.qps:
            return qpn


def _adopt(pd: ProtectionDomain, region: MemoryRegion) -> None:
    """Make ``region`` (registered elsewhere, e.g. on a ProtectionDomain of the caller's)
    writable through ``pd`` under the same rkey and address, so what the peer is told holds."""
    try:
        pd.adopt(region)
    except ValueError as exc:
        raise MRCError(str(exc)) from None


def _plane_pairs(local: list[str], remote: list[str]) -> list[tuple[str, str]]:
    n = min(len(local), len(remote))
    return [(local[i], remote[i]) for i in range(n)]


def _routes(pairs: list[tuple[str, str]], fabric: Topology | None) -> list[list[EVRoute]]:
    return fabric_routes(fabric, pairs) if fabric is not None else plain_routes(pairs)


def _route_ids(labels: list[str]) -> list[int]:
    """A small integer per distinct route label (the core only compares them)."""
    ids: dict[str, int] = {}
    return [ids.setdefault(label, len(ids)) for label in labels]


def _primary_plane(pairs: list[tuple[str, str]], control: ControlChannel) -> int | None:
    """Which plane pair the set-up's TCP connection runs over (None: none of them)."""
    writer = control.writer
    here, there = writer.get_extra_info("sockname"), writer.get_extra_info("peername")
    if not here or not there:
        return None
    for i, (local, remote) in enumerate(pairs):
        if _same_addr(local, here[0]) and _same_addr(remote, there[0]):
            return i
    return None


def _same_addr(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a.split("%")[0]) == ipaddress.ip_address(b.split("%")[0])
    except ValueError:
        return a == b


def _side_channel(control: ControlChannel, pairs: list[tuple[str, str]]) -> SideChannel:
    """The side channel over ``control`` and, later, a path per further plane of ``pairs``
    (their addresses name each plane in what is said about it)."""

    def describe(plane: int) -> str:
        if 0 <= plane < len(pairs):
            local, remote = pairs[plane]
            return f"plane {plane} ([{local}] -> [{remote}])"
        return f"the set-up's connection ([{control.peer_host}])"

    if len(pairs) > 1:
        tune_path(control.writer)
    return SideChannel(control, _primary_plane(pairs, control), describe)


class _JoinRequest(MRCError):  # noqa: N818 - a signal within the listener, not an error
    """The first line of a side-channel connection was a :class:`Join`, not a hello."""

    def __init__(self, join: Join) -> None:
        super().__init__("join")
        self.join = join


def backup_count(active: int, planes: int) -> int:
    """Backup EVs opened beside ``active`` ones: a quarter more, at least one per plane."""
    return max(planes, active // 4)


#: what the window laws of this process's QPs to one peer (its host, our addresses) share
#: (WindowLaw.join): every sender's endpoint is given this one, so that connections, each
#: with an endpoint of its own, share too; a peer's group goes when its last QP closes
_PEERS = PeerGroups()


class Connection:
    """One connected queue pair plus its side channel.

    ``endpoint``, ``channel``, ``qp`` and ``control`` are the machinery underneath, kept
    for tests and instrumentation: they are not part of the API and change without notice.
    What a program needs (progress, EV events and counters, memory) is a method or property.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        channel: QPChannel,
        control: ControlChannel,
        *,
        remote: tuple[RemoteRegion, ...],
        requested: RemoteRegion | None,
        owns_endpoint: bool,
        peer_addrs: tuple[str, ...],
        routes: list[str],
        granted: MemoryRegion | None = None,
        requested_size: int | None = None,
        side: SideChannel | None = None,
        plane_pairs: list[tuple[str, str]] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.channel = channel
        self.qp = channel.qp
        self.control = control
        #: the side channel after set-up: ``control`` and a path per further plane
        self.side = side if side is not None else SideChannel(control, None)
        #: (our address, the peer's) on each plane, in plane order
        self.plane_pairs = list(plane_pairs or [])
        self.remote = {r.name: r for r in remote}
        self.granted = granted  # region created for this peer's request (receiver side)
        self.requested = requested  # the region we asked the receiver for (sender side)
        self.routes = routes  # route label of each EV
        self._peer_addrs = peer_addrs
        self._requested_size = requested_size
        self._owns_endpoint = owns_endpoint
        self._closed = False
        self._imm_futures: set[asyncio.Future[int]] = set()  # WRITE_IMMs not yet ended
        # run once by close(): how a listener hears that a connection ended (limits, lists)
        self._close_hooks: list[Callable[[], None]] = []

    # ---- memory ------------------------------------------------------------------------

    def register(self, buffer: Buffer, name: str = "") -> MemoryRegion:
        """Register local memory the peer may write into (tell the peer via messages)."""
        return self.qp.pd.register(buffer, Access.REMOTE_WRITE, name)

    def deregister(self, region: MemoryRegion) -> None:
        """Forget ``region`` (registered here, or granted to the peer on its request): later
        WRITEs to it are dropped as bad_rkey, and our view of its buffer is released so the
        buffer (an mmap, say) can be closed."""
        self.qp.pd.deregister(region)

    def close_region(self, region: MemoryRegion) -> None:
        """Place nothing more into ``region``: from now on its bytes are final, so a hash of
        them (the end-to-end verdict) still describes them once it is done, whoever else knows
        the rkey. Later WRITEs of new data are dropped and counted (``region_closed``);
        retransmissions of what it holds are still acknowledged. Stays registered until
        :meth:`deregister`."""
        region.close()

    # ---- work requests -----------------------------------------------------------------

    def post_write(
        self, data: Buffer, region: RemoteRegion, offset: int = 0, imm: int | None = None
    ) -> asyncio.Future[int]:
        """Post a WRITE (WRITE_IMM with ``imm``); the future resolves when it is placed, or
        fails with a :class:`~mrc.errors.WriteError` saying how the write ended. With
        ``QPConfig.max_imm_outstanding`` WRITE_IMMs not yet ended, one more raises
        :class:`~mrc.errors.TooManyImmediates` (:meth:`write` waits instead).

        ``data`` is sent from where it lies, without copying: keep it unchanged until then.
        """
        if self.channel.error is not None:
            raise MRCError(self.channel.error)
        length = memoryview(data).nbytes
        if offset < 0 or offset + length > region.length:
            raise ValueError(
                f"write of {length} bytes at offset {offset} does not fit region "
                f"{region.name!r} of {region.length} bytes"
            )
        fut: asyncio.Future[int] = self.endpoint.loop.create_future()
        wr_id = self.qp.post_write(data, region.addr + offset, region.rkey, imm)
        self.channel.pending[wr_id] = fut
        if imm is not None:
            self._imm_futures.add(fut)
            fut.add_done_callback(self._imm_futures.discard)
        self.endpoint.kick(self.qp.qpn)
        return fut

    async def write(
        self, data: Buffer, region: RemoteRegion, offset: int = 0, imm: int | None = None
    ) -> int:
        """WRITE and wait until every byte is acknowledged; returns the byte count. A write
        that will not complete raises :class:`~mrc.errors.WriteError`, its ``status`` saying
        how it ended (remote access error, retry exceeded, flushed...). A WRITE_IMM first
        waits while ``QPConfig.max_imm_outstanding`` of them (or the peer's ``max_imm_dest``,
        if fewer) are not yet ended."""
        if imm is not None:
            cap = self.qp.requester.imm_cap
            while len(self._imm_futures) >= cap and self.channel.error is None:
                await asyncio.wait(set(self._imm_futures), return_when=asyncio.FIRST_COMPLETED)
        # shielded: a caller that gives up on the write (a timeout) leaves it counted until
        # it really ends, as the QP counts it
        return await asyncio.shield(self.post_write(data, region, offset, imm))

    async def next_immediate(self, timeout: float | None = None) -> int:
        """The immediate value of the next WRITE_IMM completed in order by the peer."""
        get = asyncio.ensure_future(self.channel.imms.get())
        err = asyncio.ensure_future(self.channel.error_event.wait())
        done, _ = await asyncio.wait({get, err}, timeout=timeout, return_when="FIRST_COMPLETED")
        if get in done:
            err.cancel()
            return get.result()
        get.cancel()
        err.cancel()
        if self.channel.error is not None:
            raise MRCError(self.channel.error)
        raise TimeoutError("no WRITE_IMM completion in time")

    # ---- side channel ------------------------------------------------------------------

    async def send_message(self, obj: dict[str, object]) -> None:
        """Send one JSON object to the peer over the side channel (after set-up, the
        application's to use: mrc-send and mrc-recv swap their verdict this way)."""
        await self.side.send(obj)

    async def recv_message(self, timeout: float | None = None) -> dict[str, object] | None:
        """The peer's next side-channel message, or None once it closed the channel."""
        return await self.side.recv(timeout)

    # ---- the peer ----------------------------------------------------------------------

    @property
    def qpn(self) -> int:
        """Our QP number for this connection (unique within the endpoint)."""
        return self.qp.qpn

    @property
    def peer_host(self) -> str:
        """The peer's address as the side channel (TCP) sees it."""
        return self.control.peer_host

    @property
    def peer_addrs(self) -> tuple[str, ...]:
        """The peer's address on each plane, as it announced them (empty: one plane, at
        ``peer_host``)."""
        return self._peer_addrs

    @property
    def requested_size(self) -> int | None:
        """Receiver side: the bytes the peer asked us to allocate (``granted`` may be larger,
        as no buffer is empty, or smaller: a window it streams through); None if it asked for
        none."""
        return self._requested_size

    # ---- progress and reporting --------------------------------------------------------

    @property
    def error(self) -> str | None:
        return self.channel.error

    @property
    def bytes_acked(self) -> int:
        """Sender side: packets the peer acknowledged cumulatively, in bytes of full payload
        (a cheap progress measure: it overcounts by the short last packet of each WRITE)."""
        return self.qp.requester.acked_packets * self.qp.config.payload_size

    @property
    def bytes_placed(self) -> int:
        """Receiver side: payload bytes the peer's WRITEs placed here so far (in any order)."""
        return self.qp.stats.bytes_placed

    def stats(self) -> dict[str, object]:
        """The QP's counters (``QPStats``), the transport's for it and its window law's
        (``mrc.counter_registry``), its drops plus those counted for the whole endpoint, its
        smoothed RTT and RTO."""
        qp = self.qp
        out: dict[str, object] = {}
        out.update(registry.read(qp, self.channel, registry.of(Source.QP)))
        drops = dict(self.endpoint.core.dropped_by_reason)
        for k, v in qp.stats.dropped_by_reason.items():
            drops[k] = drops.get(k, 0) + v
        out["dropped_by_reason"] = drops
        out.update(registry.read(qp, self.channel, registry.of(Source.CHANNEL, Source.CC)))
        out["srtt"] = qp.requester.rtt.srtt
        out["rto"] = qp.requester.rtt.rto
        return out

    def counters(self) -> dict[str, int]:
        """Every counter of this connection (``mrc.counter_registry.COUNTERS``: those of
        ``stats()``, ``ev_counters()`` and the congestion window's), by name."""
        return registry.read(self.qp, self.channel)

    def ev_report(self) -> list[dict[str, object]]:
        """One row per EV: index, 32-bit value and its source port and flow label bits,
        plane, route, packets sent on it, state."""
        rows: list[dict[str, object]] = []
        for row in self.qp.ev_report():
            r: dict[str, object] = dict(row)
            ev = row["ev"]
            r["route"] = self.routes[ev] if self.routes and isinstance(ev, int) else "direct"
            rows.append(r)
        return rows

    def ev_counters(self) -> dict[str, int]:
        """EV health so far: evs_assumed_bad, evs_resurrected, evs_skipped, planes_lost,
        floor_holds, evs_assumed_bad_false, evs_penalized, ev_losses_congested
        (``EV_COUNTERS`` in mrc/core/evset.py, docs/EV_HEALTH.md)."""
        return registry.read(self.qp, self.channel, registry.of(Source.EVS))

    # ---- paths -------------------------------------------------------------------------

    def deny_ev(self, ev: int) -> None:
        """Stop using EV ``ev`` (an index of :meth:`ev_report`): state DENIED, until
        :meth:`allow_ev`."""
        self._check_ev(ev)
        self.qp.deny_ev(ev, time.monotonic())

    def allow_ev(self, ev: int) -> bool:
        """Use a denied EV again once its probes are answered (it is ASSUMED_BAD until
        then); False if it was not denied."""
        self._check_ev(ev)
        allowed = self.qp.allow_ev(ev, time.monotonic())
        self.endpoint.kick(self.qp.qpn)  # its first probe goes now, not at the next timer
        return allowed

    def _check_ev(self, ev: int) -> None:
        if not 0 <= ev < len(self.qp.evs.values):
            raise ValueError(f"no EV {ev} (this connection has {len(self.qp.evs.values)})")

    def on_ev_change(self, callback: Callable[[EVStateChanged], None] | None) -> None:
        """Call ``callback(event)`` with every EV state transition of this connection, the
        core's :class:`~mrc.core.events.EVStateChanged` as it is (``event.time`` is on the
        ``time.monotonic()`` clock). One callback per connection: a new one replaces the last;
        None stops. It runs inside the transport's packet processing, so keep it short."""
        self.channel.on_ev_event = callback

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once, when this connection closes: its QP is detached by then,
        so its counters are final (how :mod:`mrc.metrics` keeps a closed connection's totals).
        Called at once if the connection is already closed."""
        if self._closed:
            callback()
        else:
            self._close_hooks.append(callback)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.endpoint.core.peers.leave(self.qp)
        self.side.close()
        self.endpoint.detach(self.qp.qpn)
        if self._owns_endpoint:
            self.endpoint.close()
        hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            hook()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# ``region_factory(size, request)``: a writable buffer for a sender that asked for ``size``
# bytes; ``request`` is the hello's request object ({"size", "name"}). At least ``size`` bytes,
# or fewer: a window the sender streams through in rounds (mrc/app/rounds.py; mrc-recv --discard).
# Called in a worker thread (a large region takes seconds to make, and the listener's other
# connections keep moving meanwhile), so it must not touch the event loop.
RegionFactory = Callable[[int, dict[str, object]], Buffer]
# ``region_memory(size)``: how many of the bytes of a region ``region_factory`` makes for ``size``
# are memory (counted against ``max_memory_bytes``); without it, all of them.
RegionMemory = Callable[[int], int]
# ``region_release(buffer)``: a region made for a sender will never reach the application: its
# set-up failed after the buffer was made, the sender never started sending (``start_timeout``),
# or the listener closed before ``accept()`` handed the connection out. Free it (e.g. unmap and
# delete the file behind it). Never called for a connection ``accept()`` returned: its owner
# frees ``granted`` when the transfer ends.
RegionRelease = Callable[[Buffer], None]


def _describe(region: MemoryRegion) -> RemoteRegion:
    return RemoteRegion(region.name, region.rkey, region.addr, region.length)


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
        plane_addrs: list[str],
        evs: int,
        config: QPConfig | None,
        region_factory: RegionFactory | None,
        fabric: Topology | None = None,
        region_release: RegionRelease | None = None,
        *,
        limits: Limits | None = None,
        setup_timeout: float = SETUP_TIMEOUT,
        hello_timeout: float = HELLO_TIMEOUT,
        start_timeout: float | None = START_TIMEOUT,
        key: bytes | None = None,
        require_encrypt: bool = False,
        region_memory: RegionMemory | None = None,
        ports: PortRange | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.ports = ports  # the EV sockets' source ports (mrc.transport.ports)
        self.key = key
        self.require_encrypt = require_encrypt
        self.region_release = region_release
        self.fabric = fabric
        self.server = server
        self.plane_addrs = plane_addrs
        self.evs = evs
        self.config = config
        self.region_factory = region_factory
        self.region_memory = region_memory
        self.limits = limits or Limits()
        self.setup_timeout = setup_timeout
        self.hello_timeout = hello_timeout
        self.start_timeout = start_timeout
        self.ledger = Ledger(self.limits)
        #: live connections (set up, not closed), handed out or not
        self.connections: list[Connection] = []
        self._queue: list[Connection] = []  # set up, not yet handed out by accept()
        self._started: set[Connection] = set()  # whose peer has sent on the data path
        self._start_timers: dict[Connection, asyncio.TimerHandle] = {}
        self._queue_changed = asyncio.Event()
        self._admissions: dict[ControlChannel, Admission] = {}  # set-ups past the limits check
        # a welcome's join token -> the side channel further paths join, and its plane count
        self._joinable: dict[str, tuple[SideChannel, int]] = {}
        self._setup_tasks: set[asyncio.Task[None]] = set()
        self._abort_tasks: set[asyncio.Task[None]] = set()
        self._making: set[asyncio.Future[Buffer]] = set()  # region_factory calls running
        self._closing = False
        self.shared_regions: list[MemoryRegion] = []
        self._on_connection: list[Callable[[Connection], None]] = []

    @property
    def port(self) -> int:
        return self.endpoint.port

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
                async with asyncio.timeout(self.setup_timeout):
                    conn = await self._setup(control, setup)
            except TimeoutError:
                raise MRCError(f"set-up did not finish within {self.setup_timeout:g} s") from None
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
        found = self._joinable.get(join.token)
        if found is None:
            raise MRCError("no connection to join with that token (it ended, or never was)")
        side, planes = found
        if join.plane >= planes:
            raise MRCError(f"the connection has {planes} planes, no plane {join.plane}")
        want = join_proof(side.primary, join.token, join.plane, sending=False)
        if want is not None and not (
            join.proof is not None and hmac.compare_digest(join.proof, want)
        ):
            raise MRCError("the join's proof is wrong (another key, or none)")
        await control.send({"mrc": PROTOCOL_VERSION, "ok": True})
        key_path(control, side.primary, join.plane)
        tune_path(control.writer)
        side.add_path(join.plane, control)

    def _admit(self, control: ControlChannel, request: RegionRequest | None) -> None:
        """The limits check of a checked request, before anything is allocated for it: a
        connection slot, the bytes it asks for and the memory among them, or
        :class:`LimitError` (the refusal)."""
        size = request.size if request is not None else 0
        memory = self.region_memory(size) if self.region_memory is not None and size else size
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
        if self.start_timeout is not None:
            loop = asyncio.get_running_loop()
            self._start_timers[conn] = loop.call_later(
                self.start_timeout, self._start_expired, conn
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
            f"no data from the sender within {self.start_timeout:g} s of set-up; connection dropped"
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
            buf = granted.view.obj
            conn.deregister(granted)
            self._release(buf)

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
            async with asyncio.timeout(self.hello_timeout) as deadline:
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
                    control, self.key, hello, None, self.require_encrypt
                )
                self.ledger.proven(setup)
                setup.stage = "region request"
                request = await auth.request_of(control, hello, None)
        except TimeoutError:
            if setup.dropped is not None:
                raise RefusedForNow(setup.dropped) from None
            raise MRCError(
                f"no {setup.stage} within {self.hello_timeout:g} s of connecting"
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
        cfg = dataclasses.replace(self.config) if self.config is not None else QPConfig()
        if hello.psn_window is not None:
            cfg.psn_window = hello.psn_window
        cfg.max_outstanding = min(cfg.max_outstanding, cfg.psn_window)
        try:
            cfg.validate()
        except ValueError as exc:
            raise MRCError(f"cannot accept with this receiver's settings: {exc}") from None
        peer_addrs = list(hello.addrs) or [control.peer_host]
        local = self.plane_addrs or [_any_address(peer_addrs[0])]
        pairs = _plane_pairs(local, peer_addrs)
        active = max(self.evs, len(pairs))
        total = active + backup_count(active, len(pairs))
        routes = _routes(pairs, self.fabric)

        core = self.endpoint.core
        # this peer's own domain: the listener's shared regions and what it is granted, so
        # its rkeys reach nothing granted to another peer
        pd = ProtectionDomain()
        shared = [r for r in self.shared_regions if core.pd.lookup(r.rkey) is r]
        for r in shared:
            pd.adopt(r)
        self._admit(control, request)  # the listener's limits, before anything is allocated
        granted = await self._grant(request, pd) if request is not None else None
        evsocks: EVSockets | None = None
        attached: QueuePair | None = None
        side: SideChannel | None = None
        token: str | None = None
        try:
            evsocks = open_ev_sockets(total, routes, hello.udp_port, self.ports, cfg.source_ports)
            qp = QueuePair(
                _new_qpn(core),
                pd,
                evsocks.values,
                evsocks.planes,
                cfg,
                secrets.randbits(24),
                active_evs=active,
                ev_routes=_route_ids(evsocks.routes),
            )
            qp.connect(hello.qpn, hello.psn)
            if hello.max_imm is not None:
                qp.peer_takes_imms(hello.max_imm)
            if protection is not None:
                qp.protect(protection)
            channel = self.endpoint.attach(qp, evsocks)
            attached = qp  # from here on the endpoint owns the EV sockets
            side = _side_channel(control, pairs)
            token = secrets.token_hex(16) if len(pairs) > 1 else None
            if token is not None:
                self._joinable[token] = (side, len(pairs))
            welcome = Welcome(
                qpn=qp.qpn,
                psn=qp.initial_psn,
                udp_port=self.endpoint.port,
                addrs=tuple(self.plane_addrs),
                regions=tuple(_describe(r) for r in ([granted] if granted else []) + shared),
                max_imm=cfg.max_imm_dest,
                start_bytes=self.endpoint.start_share(),
                join=token,
            )
            await control.send(welcome.to_json())
            assert evsocks is not None  # (for the type checker: opened above)
        except BaseException:
            if side is not None:
                side.close(keep_primary=True)
            if token is not None:
                self._joinable.pop(token, None)
            if attached is not None:
                self.endpoint.detach(attached.qpn)
            if evsocks is not None:
                evsocks.close()
            if granted is not None:
                buf = granted.view.obj  # (deregister releases the view, and .obj with it)
                pd.deregister(granted)
                self._release(buf)
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
        )
        if token is not None:
            joinable = self._joinable
            conn.on_close(lambda: joinable.__delitem__(token) if token in joinable else None)
        return conn

    async def _grant(self, request: RegionRequest, pd: ProtectionDomain) -> MemoryRegion:
        """Allocate (with ``region_factory``) and register the region a sender asked for.

        The factory runs in a worker thread: making a large region (a file reserved on disk,
        its pages faulted in) takes seconds, and other connections must keep moving meanwhile.
        A set-up cancelled while it runs (its timeout, the listener closing) releases what it
        makes once it is made; :meth:`close` waits for that."""
        if self.region_factory is None:
            raise MRCError("this receiver does not allocate memory on request")
        made = asyncio.ensure_future(
            asyncio.to_thread(self.region_factory, request.size, request.to_json())
        )
        self._making.add(made)
        made.add_done_callback(self._making.discard)
        try:
            buf = await asyncio.shield(made)
        except asyncio.CancelledError:
            made.add_done_callback(self._release_late)
            raise
        except MRCError:
            raise
        except (OSError, ValueError, TypeError, OverflowError, MemoryError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise MRCError(
                f"cannot allocate the {request.size} bytes asked for: {reason}"
            ) from None
        try:
            return pd.register(buf, Access.REMOTE_WRITE, request.name)
        except (ValueError, TypeError) as exc:
            self._release(buf)
            raise MRCError(f"cannot allocate the {request.size} bytes asked for: {exc}") from None

    def _release_late(self, made: asyncio.Future[Buffer]) -> None:
        """A region made for a set-up that was cancelled meanwhile: nobody will use it."""
        if not made.cancelled() and made.exception() is None:
            self._release(made.result())

    def _release(self, buf: Buffer | None) -> None:
        if buf is not None and self.region_release is not None:
            self.region_release(buf)

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
        await asyncio.gather(*self._making, return_exceptions=True)
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


def _check_planes(addrs: list[str] | None, name: str) -> None:
    """At most :data:`mrc.wire.MAX_PLANES` planes: an ACK says which of them work in a
    16-bit bitmap, and a 17th plane would always read as down."""
    if addrs is not None and len(addrs) > MAX_PLANES:
        raise MRCError(
            f"{name}: at most {MAX_PLANES} planes (an ACK's port-state bitmap has "
            f"{MAX_PLANES} bits), not {len(addrs)}"
        )


async def listen(
    host: str = "::",
    port: int = DEFAULT_PORT,
    *,
    plane_addrs: list[str] | None = None,
    evs: int = 16,
    config: QPConfig | None = None,
    region_factory: RegionFactory | None = None,
    region_release: RegionRelease | None = None,
    fabric: Topology | None = None,
    max_setups: int = DEFAULT_MAX_SETUPS,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_granted_bytes: int | None = DEFAULT_MAX_GRANTED,
    max_memory_bytes: int | None | Literal["auto"] = "auto",
    region_memory: RegionMemory | None = None,
    limit_hints: dict[str, str] | None = None,
    setup_timeout: float = SETUP_TIMEOUT,
    hello_timeout: float = HELLO_TIMEOUT,
    start_timeout: float | None = START_TIMEOUT,
    key: bytes | None = None,
    require_encrypt: bool = False,
    ports: PortRange | None = None,
) -> Listener:
    """Listen for MRC connections: UDP on ``port`` and the TCP side channel on the same port.
    ``ports``: the source ports of every connection's EV sockets come from this range (the
    ACKs leave from them), and port 0 picks a listening port from it (docs/CLUSTER.md).

    ``plane_addrs``: this host's address on each plane (one per NIC); data for plane p arrives
    there, and senders are told about them. Without it, one plane on whatever address the
    sender reached. ``region_factory(size, request)`` allocates memory for a sender that asks
    for a region of ``size`` bytes (as mrc-recv does for a file), in a worker thread, or
    fewer bytes, a window to stream through (``RegionFactory``); ``region_release(buffer)``
    frees one the application never received (mrc-recv deletes the file). ``fabric``: an
    mrc-fabric topology; acknowledgements are then sprayed over its SRv6 paths (every spine of
    every plane).

    Whoever reaches the port can make the listener work, so what peers hold is bounded; beyond
    a bound a peer is refused with one line naming it, before anything is allocated for it:

    * ``max_setups`` (64): TCP connections still in set-up (hello not yet answered). When all
      slots are taken, the oldest set-up that has not yet said its hello (and, with a key,
      proved it) is dropped for the newcomer, from the source (IPv4 address, IPv6 /64) that
      holds the most of them, so peers that prove nothing cannot keep out one that can; if
      every set-up in progress has, the newcomer is refused at once, unread. A set-up has
      ``hello_timeout`` (2 s) to say its hello and prove the key, and ``setup_timeout``
      (10 s) in all.
    * ``max_connections`` (64): connections set up and not yet closed, handed out or not
      (each holds ``evs`` plus backup UDP sockets).
    * ``max_granted_bytes`` (64 GiB; None: no bound): the sum of regions ``region_factory``
      made on request and whose connections are not yet closed. Checked against the size asked
      for before ``region_factory`` is called; the bytes return when the connection closes.
    * ``max_memory_bytes``: the part of those regions that is memory, checked the same way.
      ``region_memory(size)`` says how much of a region of ``size`` bytes is (without it:
      all; a file mapping is the page cache's, so none). "auto" (the default): a quarter of
      the memory this process may use (the machine's, or its memory cgroup's limit if lower),
      at most half of what is available when it starts; None: no bound. A bound above the
      machine's memory is refused.
    * ``limit_hints``: how each limit (``setups``, ``connections``, ``granted_bytes``,
      ``memory_bytes``) is raised, appended to its refusals (mrc-recv names its flags).
    * ``start_timeout`` (10 s; None: never): a welcomed sender whose first datagram has not
      arrived this long after set-up, and that :meth:`Listener.accept` has not handed out, is
      sent an Abort with the reason and closed; its QP, sockets, region (``region_release``)
      and limits are freed. ``accept(started=True)`` hands out only senders that started.

    ``key``: a pre-shared key (:func:`mrc.security.keys.read_key_file`). Senders must then
    prove they hold it before anything is allocated for them, and every datagram and
    side-channel message of their connection is authenticated (docs/PROTOCOL.md section 11).
    ``require_encrypt``: refuse senders that do not also encrypt payloads. Without a key,
    anyone who can reach the port can write into the regions it offers.
    """
    if require_encrypt and key is None:
        raise MRCError("require_encrypt needs a key")
    limits = Limits(
        max_setups,
        max_connections,
        max_granted_bytes,
        _memory_budget(max_memory_bytes),
        tuple(sorted((limit_hints or {}).items())),
    )
    if not setup_timeout > 0:
        raise MRCError(f"setup_timeout must be more than 0 s, not {setup_timeout!r}")
    if not hello_timeout > 0:
        raise MRCError(f"hello_timeout must be more than 0 s, not {hello_timeout!r}")
    if start_timeout is not None and not start_timeout > 0:
        raise MRCError(f"start_timeout must be None or more than 0 s, not {start_timeout!r}")
    _check_planes(plane_addrs, "plane_addrs")
    addrs = [_resolve(a) for a in plane_addrs] if plane_addrs else []
    host = _resolve(host) if host not in ("", "::", "0.0.0.0") else (host or "::")
    tcp_hosts = addrs or [host]
    # one UDP socket for every plane: a single receive queue keeps the arrival order across
    # planes, which SACK-based loss detection at the sender relies on (two sockets drained in
    # turn would reorder by a whole batch)
    udp_hosts = [_any_address(addrs[0])] if len(addrs) > 1 else tcp_hosts
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
    listener = Listener(
        endpoint,
        server,
        addrs,
        evs,
        config,
        region_factory,
        fabric,
        region_release,
        key=key,
        require_encrypt=require_encrypt,
        limits=limits,
        setup_timeout=setup_timeout,
        hello_timeout=hello_timeout,
        start_timeout=start_timeout,
        region_memory=region_memory,
        ports=ports,
    )
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


#: connect errors worth trying again while ``wait`` lasts: nobody listens yet, or the
#: address or its route is not up yet (a container's interface still coming up)
_RETRYABLE = (errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL)


async def _open_side_channel(
    host: str, port: int, timeout: float, wait: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The TCP side channel to ``host``:``port``, tried again on refusal while ``wait`` lasts.

    Polling is the only way here: nothing tells a client that a remote listener has started.
    Retries back off from 50 ms to 1 s so a peer that never comes costs little.
    """
    deadline = time.monotonic() + wait
    delay = 0.05
    while True:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=MAX_LINE), timeout
            )
        except TimeoutError:
            raise MRCError(
                f"peer [{host}]:{port} unreachable (no answer in {timeout:g} s)"
            ) from None
        except OSError as exc:
            if exc.errno in _RETRYABLE and time.monotonic() + delay <= deadline:
                log.debug(
                    "[%s]:%d: %s; trying again in %g s", host, port, os.strerror(exc.errno), delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if isinstance(exc, ConnectionRefusedError):
                waited = f" after trying for {wait:g} s" if wait > 0 else ""
                raise MRCError(
                    f"connection refused by [{host}]:{port}{waited} (is mrc-recv listening there?)"
                ) from None
            raise MRCError(f"cannot reach [{host}]:{port}: {exc.strerror or exc}") from None


#: seconds a set-up waits for one address before it tries the next beside it (connect's
#: ``alternates``; RFC 8305 recommends 250 ms)
STAGGER = 0.25


async def _open_first(
    hosts: list[str], port: int, timeout: float, wait: float
) -> tuple[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """The side channel to the first of ``hosts`` that answers: each is tried :data:`STAGGER`
    seconds after the one before (at once when that one failed); the rest are abandoned."""
    if len(hosts) == 1:
        return hosts[0], await _open_side_channel(hosts[0], port, timeout, wait)
    tries: dict[asyncio.Task[tuple[asyncio.StreamReader, asyncio.StreamWriter]], str] = {}
    errors: list[str] = []
    pending = list(hosts)
    try:
        while pending or tries:
            if pending:
                h = pending.pop(0)
                tries[asyncio.ensure_future(_open_side_channel(h, port, timeout, wait))] = h
            done, _ = await asyncio.wait(
                tries, timeout=STAGGER if pending else None, return_when="FIRST_COMPLETED"
            )
            for task in done:
                h = tries.pop(task)
                try:
                    return h, task.result()
                except MRCError as exc:
                    errors.append(str(exc))
        raise MRCError("; ".join(errors))
    finally:
        for task in tries:
            task.cancel()
        for task in tries:
            with contextlib.suppress(BaseException):
                _r, w = await task
                w.close()


async def connect(
    host: str,
    port: int = DEFAULT_PORT,
    *,
    evs: int = 128,
    local_addrs: list[str] | None = None,
    config: QPConfig | None = None,
    request_size: int | None = None,
    request_name: str = "",
    regions: list[MemoryRegion] | None = None,
    timeout: float = CONNECT_TIMEOUT,
    fabric: Topology | None = None,
    key: bytes | None = None,
    encrypt: bool = False,
    wait: float = 0.0,
    ports: PortRange | None = None,
    alternates: list[str] | None = None,
) -> Connection:
    """Connect a QP to a listener at ``host``:``port``.

    ``alternates``: more addresses of the same listener (its other planes'): when ``host``
    does not answer within :data:`STAGGER` seconds, or refuses, the next is tried beside it,
    as happy eyeballs does for address families; the first to answer is used. Once set up,
    the side channel runs over every plane anyway (docs/PROTOCOL.md, "Side channel over every
    plane"), so no address matters after set-up either.

    ``fabric``: an mrc-fabric topology; each plane's EVs are then spread over its SRv6 paths
    (one per spine), each EV socket carrying its path as a sticky Segment Routing Header.

    ``evs`` entropy values (32 bits: a UDP source port, one socket per route, and an IPv6 flow
    label, mrc/transport/evsockets.py) are spread evenly over the planes: plane p pairs
    ``local_addrs[p]`` with the listener's p-th plane address. ``request_size`` asks the
    listener to allocate a region of that size for us (it appears first in ``remote``).
    ``regions``: memory of ours the listener may write into (announced in the hello; its
    ``remote``). ``timeout`` bounds the TCP connect and the wait for the listener's answer.
    ``wait``: for up to this many seconds, a refused or unroutable connect is tried again (the
    receiver, say a container started beside this one, may still be starting); 0 fails at once.
    ``ports``: every UDP socket of the connection (the one ACKs arrive on, and each EV's) is
    bound to a port of this range, for a firewall (mrc.transport.ports, docs/CLUSTER.md).

    ``key``: the listener's pre-shared key; both sides prove they hold it, and every datagram
    of the connection is then authenticated, its payload also encrypted with ``encrypt``.
    Each protected data packet carries 44 bytes more (docs/PROTOCOL.md section 11).
    """
    if encrypt and key is None:
        raise MRCError("encrypt needs a key")
    if evs < 1:
        raise MRCError("need at least one EV")
    if evs > MAX_EVS:
        raise MRCError(
            f"at most {MAX_EVS} EVs (with their backups, a 16-bit flow label each), not {evs}"
        )
    if request_size is not None and not 0 <= request_size <= MAX_REGION_SIZE:
        raise MRCError(f"cannot request a region of {request_size} bytes (0..{MAX_REGION_SIZE})")
    if ports is not None and len(ports) < 2:
        raise MRCError(
            f"the port range {ports} (--ports) holds {len(ports)} port; a connection needs at "
            "least 2 (an EV socket per route, and the sender's receive port)"
        )
    cfg = config or QPConfig()
    try:
        cfg.validate()
    except ValueError as exc:
        raise MRCError(str(exc)) from None
    core = EndpointCore(peers=_PEERS)
    for region in regions or []:
        _adopt(core.pd, region)
    hosts = [_resolve(h) for h in [host, *(alternates or [])]]
    host = hosts[0]
    _check_planes(local_addrs, "local_addrs")
    locals_ = [_resolve(a) for a in local_addrs] if local_addrs else []
    # the UDP socket first: the hello then follows the TCP handshake at once (a listener whose
    # set-up slots are full lets a connection that has said nothing give way first)
    try:
        rx = udp_socket(_any_address(host), 0, ports=ports)
    except RangeExhausted as exc:
        raise MRCError(f"cannot open the UDP socket for ACKs: {exc}") from None
    except OSError as exc:
        raise MRCError(f"cannot open a UDP socket: {exc.strerror or exc}") from None
    endpoint = Endpoint(core, [rx])
    request = RegionRequest(request_size, request_name) if request_size is not None else None
    qpn, psn = _new_qpn(core), secrets.randbits(24)
    attempts = 0
    try:
        while True:
            host, (reader, writer) = await _open_first(hosts, port, timeout, wait)
            control = ControlChannel(reader, writer)
            hello = Hello(
                qpn=qpn,
                psn=psn,
                udp_port=endpoint.port,
                addrs=tuple(locals_ or [writer.get_extra_info("sockname")[0]]),
                evs=evs,
                psn_window=cfg.psn_window,
                max_imm=cfg.max_imm_dest,
                regions=tuple(_describe(r) for r in regions or []),
                request=None if encrypt else request,  # encrypting: sealed, after the proof
                auth=auth.offer(Mode.ENCRYPT if encrypt else Mode.INTEGRITY) if key else None,
            )
            try:
                return await _client_setup(
                    endpoint, control, host, hello, cfg, timeout, fabric, key, request, ports
                )
            except RefusedForNow:
                control.close()
                attempts += 1
                if attempts == SETUP_ATTEMPTS:
                    raise
            except BaseException:
                control.close()
                raise
            await asyncio.sleep(0.01 * 2 ** (attempts - 1))
    except BaseException:
        endpoint.close()  # and with it the EV sockets of an attached QP
        raise


async def _client_setup(
    endpoint: Endpoint,
    control: ControlChannel,
    host: str,
    hello: Hello,
    cfg: QPConfig,
    timeout: float,
    fabric: Topology | None,
    key: bytes | None = None,
    request: RegionRequest | None = None,
    ports: PortRange | None = None,
) -> Connection:
    """Say hello (and prove the key; encrypting, then send ``request`` sealed), check all of
    the answer, then open the EV sockets (from ``ports``, if given) and attach the QP."""
    protection = None
    try:
        await control.send(hello.to_json())
        if key is not None:
            protection = await auth.as_sender(control, key, hello, timeout)
            await auth.send_request(control, hello, request)
        obj = await control.recv(timeout=timeout)
    except ControlError as exc:
        raise MRCError(f"set-up with [{host}] failed: {exc}") from None
    if obj is None:
        raise MRCError(f"[{host}] closed the side channel during set-up")
    reply = parse_reply(obj)
    if isinstance(reply, Refusal):
        raise reply.exception()
    pairs = _plane_pairs(list(hello.addrs), list(reply.addrs) or [host])
    evs = hello.evs or 1
    total = evs + backup_count(evs, len(pairs))
    evsocks = open_ev_sockets(
        total, _routes(pairs, fabric), reply.udp_port, ports, cfg.source_ports
    )
    try:
        qp = QueuePair(
            hello.qpn,
            endpoint.core.pd,
            evsocks.values,
            evsocks.planes,
            cfg,
            hello.psn,
            active_evs=evs,
            ev_routes=_route_ids(evsocks.routes),
        )
        qp.connect(reply.qpn, reply.psn)
        if reply.max_imm is not None:
            qp.peer_takes_imms(reply.max_imm)
        if reply.start_bytes is not None:
            qp.requester.cc.start_within(reply.start_bytes // cfg.payload_size)
        if protection is not None:
            qp.protect(protection)
        channel = endpoint.attach(qp, evsocks)
    except BaseException:
        evsocks.close()
        raise
    # only once nothing can fail: Connection.close is what leaves the group again
    endpoint.core.peers.join((host, hello.addrs), qp)
    side = _side_channel(control, pairs)
    if reply.join is not None and len(pairs) > 1:
        token, port = reply.join, control.peer_port
        side.join_planes(  # (the set-up's plane has its path: joined again once lost)
            list(range(len(pairs))),
            lambda plane: _join_path(control, pairs[plane], port, token, plane),
        )
    return Connection(
        endpoint,
        channel,
        control,
        remote=reply.regions,
        requested=reply.regions[0] if reply.regions else None,
        owns_endpoint=True,
        peer_addrs=reply.addrs,
        routes=evsocks.routes,
        side=side,
        plane_pairs=pairs,
    )


async def _join_path(
    primary: ControlChannel, pair: tuple[str, str], port: int, token: str, plane: int
) -> ControlChannel:
    """Open the side channel's path over ``plane`` (from ``pair``'s local address to its
    remote one) and join it to the connection (the welcome's ``token``)."""
    local, remote = pair
    reader, writer = await asyncio.open_connection(
        remote, port, local_addr=(local, 0), limit=MAX_LINE
    )
    path = ControlChannel(reader, writer)
    try:
        tune_path(writer)
        proof = join_proof(primary, token, plane, sending=True)
        await path.send(Join(token, plane, proof).to_json())
        obj = await path.recv(timeout=JOIN_TIMEOUT)
        if obj is None:
            raise ControlError("the receiver closed the path as it joined")
        if obj.get("ok") is not True:
            raise ControlError(f"join refused: {Refusal.from_json(obj).error}")
        key_path(path, primary, plane)
    except BaseException:
        path.close()
        raise
    return path
