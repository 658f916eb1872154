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
import errno
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mrc.core.config import QPConfig
from mrc.core.endpoint import EndpointCore
from mrc.core.memory import Access, MemoryRegion, ProtectionDomain
from mrc.core.qp import QueuePair
from mrc.errors import MRCError
from mrc.srv6.evroutes import EVRoute, fabric_routes, plain_routes
from mrc.transport.control import PROTOCOL_VERSION, ControlChannel, ControlError, check_version
from mrc.transport.endpoint import Endpoint, QPChannel
from mrc.transport.sockets import ev_socket, family_of, udp_socket
from mrc.wire import DEFAULT_PORT

if TYPE_CHECKING:
    from mrc.fabric.topology import Topology

CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class RemoteRegion:
    """A peer's registered memory, as learnt over the side channel."""

    name: str
    rkey: int
    addr: int
    length: int

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> RemoteRegion:
        return cls(str(d["name"]), int(d["rkey"]), int(d["addr"]), int(d["length"]))  # type: ignore[arg-type]


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
    held = pd.lookup(region.rkey)
    if held is region:
        return
    if held is not None:
        raise MRCError(f"two regions share rkey {region.rkey:#x}")
    pd._by_rkey[region.rkey] = region


def _plane_pairs(local: list[str], remote: list[str]) -> list[tuple[str, str]]:
    n = min(len(local), len(remote))
    return [(local[i], remote[i]) for i in range(n)]


def _routes(pairs: list[tuple[str, str]], fabric: Topology | None) -> list[list[EVRoute]]:
    return fabric_routes(fabric, pairs) if fabric is not None else plain_routes(pairs)


def _route_ids(labels: list[str]) -> list[int]:
    """A small integer per distinct route label (the core only compares them)."""
    ids: dict[str, int] = {}
    return [ids.setdefault(label, len(ids)) for label in labels]


def backup_count(active: int, planes: int) -> int:
    """Backup EVs opened beside ``active`` ones: a quarter more, at least one per plane."""
    return max(planes, active // 4)


def _open_ev_sockets(
    count: int, routes: list[list[EVRoute]], peer_port: int
) -> tuple[list[socket.socket], list[int], list[str]]:
    """``count`` EV sockets: EV i is on plane i mod P and takes that plane's paths in turn,
    so EVs are spread evenly over planes first and over paths (spines) within a plane."""
    socks: list[socket.socket] = []
    planes: list[int] = []
    labels: list[str] = []
    used: set[int] = set()
    nplanes = len(routes)
    try:
        for i in range(count):
            plane = i % nplanes
            options = routes[plane]
            route = options[(i // nplanes) % len(options)]
            for _attempt in range(64):
                sock = ev_socket(route.local, (route.remote, peer_port), route.srh)
                sport = sock.getsockname()[1]
                if sport not in used:
                    break
                # the same port on another plane's address: EVs are told apart by port alone
                sock.close()
            else:
                raise OSError("could not find distinct source ports for every EV")
            used.add(sport)
            socks.append(sock)
            planes.append(plane)
            labels.append(route.label)
    except OSError as exc:
        for s in socks:
            s.close()
        raise MRCError(f"cannot open EV sockets: {exc.strerror or exc}") from None
    return socks, planes, labels


class Connection:
    """One connected queue pair plus its side channel."""

    def __init__(
        self,
        endpoint: Endpoint,
        channel: QPChannel,
        control: ControlChannel,
        remote_regions: list[RemoteRegion],
        owns_endpoint: bool,
        granted: MemoryRegion | None = None,
        meta: dict[str, object] | None = None,
        plane_pairs: list[tuple[str, str]] | None = None,
        routes: list[str] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.channel = channel
        self.qp = channel.qp
        self.control = control
        self.remote = {r.name: r for r in remote_regions}
        self.granted = granted  # region created for this peer's request (receiver side)
        self.requested = remote_regions[0] if remote_regions else None  # sender side
        self.plane_pairs = plane_pairs or []
        self.routes = routes or []  # route label of each EV
        self.meta = meta or {}
        self._owns_endpoint = owns_endpoint
        self._closed = False

    # ---- memory ------------------------------------------------------------------------

    def register(self, buffer: object, name: str = "") -> MemoryRegion:
        """Register local memory the peer may write into (tell the peer via messages)."""
        return self.endpoint.core.pd.register(buffer, Access.REMOTE_WRITE, name)

    # ---- work requests -----------------------------------------------------------------

    def post_write(
        self, data: object, region: RemoteRegion, offset: int = 0, imm: int | None = None
    ) -> asyncio.Future[int]:
        """Post a WRITE (WRITE_IMM with ``imm``); the future resolves when it is placed.

        ``data`` is sent from where it lies, without copying: keep it unchanged until then.
        """
        if self.channel.error is not None:
            raise MRCError(self.channel.error)
        length = memoryview(data).nbytes  # type: ignore[arg-type]
        if offset < 0 or offset + length > region.length:
            raise ValueError(
                f"write of {length} bytes at offset {offset} does not fit region "
                f"{region.name!r} of {region.length} bytes"
            )
        fut: asyncio.Future[int] = self.endpoint.loop.create_future()
        wr_id = self.qp.post_write(data, region.addr + offset, region.rkey, imm)
        self.channel.pending[wr_id] = fut
        self.channel.idle_event.clear()
        self.endpoint.kick(self.qp.qpn)
        return fut

    async def write(
        self, data: object, region: RemoteRegion, offset: int = 0, imm: int | None = None
    ) -> int:
        """WRITE and wait until every byte is acknowledged; returns the byte count."""
        try:
            return await self.post_write(data, region, offset, imm)
        except ConnectionError as exc:
            raise MRCError(str(exc)) from None

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
        await self.control.send(obj)

    async def recv_message(self, timeout: float | None = None) -> dict[str, object] | None:
        return await self.control.recv(timeout)

    # ---- reporting ---------------------------------------------------------------------

    @property
    def error(self) -> str | None:
        return self.channel.error

    def stats(self) -> dict[str, object]:
        """Counters of this QP plus drops counted for the whole endpoint."""
        out = self.qp.stats.as_dict()
        drops = dict(self.endpoint.core.dropped_by_reason)
        for k, v in self.qp.stats.dropped_by_reason.items():
            drops[k] = drops.get(k, 0) + v
        out["dropped_by_reason"] = drops
        out["send_errors"] = self.channel.send_errors
        out["srtt"] = self.qp.requester.rtt.srtt
        out["rto"] = self.qp.requester.rtt.rto
        return out

    def ev_report(self) -> list[dict[str, object]]:
        """One row per EV: index, source port, plane, route, packets sent on it, state."""
        rows: list[dict[str, object]] = []
        for row in self.qp.ev_report():
            r: dict[str, object] = dict(row)
            r["route"] = self.routes[row["ev"]] if self.routes else "direct"
            rows.append(r)
        return rows

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.control.close()
        self.endpoint.detach(self.qp.qpn)
        if self._owns_endpoint:
            self.endpoint.close()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


RegionFactory = Callable[[int, dict[str, object]], object]


class Listener:
    """Accepts connections from any number of senders; they share its memory regions."""

    def __init__(
        self,
        endpoint: Endpoint,
        server: asyncio.Server,
        plane_addrs: list[str],
        evs: int,
        config: QPConfig | None,
        region_factory: RegionFactory | None,
        fabric: Topology | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.fabric = fabric
        self.server = server
        self.plane_addrs = plane_addrs
        self.evs = evs
        self.config = config
        self.region_factory = region_factory
        self._accepted: asyncio.Queue[Connection] = asyncio.Queue()
        self.connections: list[Connection] = []
        self.failures: list[str] = []
        self.shared_regions: list[MemoryRegion] = []

    @property
    def port(self) -> int:
        return self.endpoint.port

    def register(self, buffer: object, name: str = "") -> MemoryRegion:
        """Register memory every connecting sender will be told about."""
        region = self.endpoint.core.pd.register(buffer, Access.REMOTE_WRITE, name)
        self.shared_regions.append(region)
        return region

    async def accept(self, timeout: float | None = None) -> Connection:
        try:
            return await asyncio.wait_for(self._accepted.get(), timeout)
        except TimeoutError:
            raise TimeoutError("no sender connected in time") from None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        control = ControlChannel(reader, writer)
        try:
            conn = await self._setup(control)
        except (ControlError, MRCError, ValueError, KeyError, TypeError) as exc:
            msg = str(exc) if isinstance(exc, ControlError | MRCError) else f"bad hello: {exc}"
            self.failures.append(msg)
            with contextlib.suppress(ControlError):
                await control.send({"mrc": PROTOCOL_VERSION, "ok": False, "error": msg})
            control.close()
            return
        self.connections.append(conn)
        self._accepted.put_nowait(conn)

    async def _setup(self, control: ControlChannel) -> Connection:
        hello = await control.recv(timeout=CONNECT_TIMEOUT)
        if hello is None:
            raise ControlError("peer closed the side channel before saying hello")
        check_version(hello)
        core = self.endpoint.core
        cfg = QPConfig(**(self.config and _config_dict(self.config) or {}))
        cfg.psn_window = int(hello.get("psn_window", cfg.psn_window))  # type: ignore[arg-type]
        cfg.max_outstanding = min(cfg.max_outstanding, cfg.psn_window)
        cfg.validate()
        peer_addrs = [str(a) for a in hello.get("addrs") or []] or [control.peer_host]  # type: ignore[union-attr]
        local = self.plane_addrs or [_any_address(peer_addrs[0])]
        pairs = _plane_pairs(local, peer_addrs)
        peer_port = int(hello["udp_port"])  # type: ignore[arg-type]
        active = max(self.evs, len(pairs))
        total = active + backup_count(active, len(pairs))
        socks, planes, labels = _open_ev_sockets(total, _routes(pairs, self.fabric), peer_port)
        qp = QueuePair(
            _new_qpn(core),
            core.pd,
            [s.getsockname()[1] for s in socks],
            planes,
            cfg,
            secrets.randbits(24),
            active_evs=active,
            ev_routes=_route_ids(labels),
        )
        qp.connect(int(hello["qpn"]), int(hello["psn"]))  # type: ignore[arg-type]
        granted = None
        request = hello.get("request")
        if isinstance(request, dict):
            if self.region_factory is None:
                raise MRCError("this receiver does not allocate memory on request")
            size = int(request["size"])
            if size < 0:
                raise MRCError("requested a negative region size")
            buf = self.region_factory(size, request)
            granted = core.pd.register(buf, Access.REMOTE_WRITE, str(request.get("name", "")))
        channel = self.endpoint.attach(qp, socks)
        shared = [r for r in self.shared_regions if core.pd.lookup(r.rkey) is r]
        regions = [r.describe() for r in ([granted] if granted else []) + shared]
        await control.send(
            {
                "mrc": PROTOCOL_VERSION,
                "ok": True,
                "qpn": qp.qpn,
                "psn": qp.initial_psn,
                "udp_port": self.endpoint.port,
                "addrs": self.plane_addrs,
                "regions": regions,
            }
        )
        conn = Connection(
            self.endpoint,
            channel,
            control,
            [],
            False,
            granted,
            hello,
            plane_pairs=pairs,
            routes=labels,
        )
        remote = hello.get("regions") or []
        conn.remote = {str(r["name"]): RemoteRegion.from_dict(r) for r in remote}  # type: ignore[index, union-attr, arg-type]
        return conn

    async def close(self) -> None:
        self.server.close()
        for conn in self.connections:
            await conn.close()
        self.endpoint.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 1.0)

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _config_dict(cfg: QPConfig) -> dict[str, object]:
    return {name: getattr(cfg, name) for name in cfg.__slots__}


async def listen(
    host: str = "::",
    port: int = DEFAULT_PORT,
    *,
    plane_addrs: list[str] | None = None,
    evs: int = 16,
    config: QPConfig | None = None,
    region_factory: RegionFactory | None = None,
    fabric: Topology | None = None,
) -> Listener:
    """Listen for MRC connections: UDP on ``port`` and the TCP side channel on the same port.

    ``plane_addrs``: this host's address on each plane (one per NIC); data for plane p arrives
    there, and senders are told about them. Without it, one plane on whatever address the
    sender reached. ``region_factory(size, request)`` allocates memory for a sender that asks
    for a region of ``size`` bytes (as mrc-recv does for a file). ``fabric``: an mrc-fabric
    topology; acknowledgements are then sprayed over its SRv6 paths (every spine of every plane).
    """
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
                socks.append(udp_socket(h, want))
                want = socks[0].getsockname()[1]
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
            server = await asyncio.start_server(handler, tcp_hosts, want, reuse_address=True)
        except OSError as exc:
            endpoint.close()
            if last or exc.errno != errno.EADDRINUSE:
                raise MRCError(f"cannot listen on TCP port {want}: {exc.strerror or exc}") from None
            continue
        break
    listener = Listener(endpoint, server, addrs, evs, config, region_factory, fabric)
    return listener


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
) -> Connection:
    """Connect a QP to a listener at ``host``:``port``.

    ``fabric``: an mrc-fabric topology; each plane's EVs are then spread over its SRv6 paths
    (one per spine), each EV socket carrying its path as a sticky Segment Routing Header.

    ``evs`` entropy values (UDP source ports) are spread evenly over the planes: plane p pairs
    ``local_addrs[p]`` with the listener's p-th plane address. ``request_size`` asks the
    listener to allocate a region of that size for us (it appears first in ``remote``).
    ``regions``: memory of ours the listener may write into (announced in the hello; its
    ``remote``). ``timeout`` bounds the TCP connect and the wait for the listener's answer.
    """
    if evs < 1:
        raise MRCError("need at least one EV")
    cfg = config or QPConfig()
    try:
        cfg.validate()
    except ValueError as exc:
        raise MRCError(str(exc)) from None
    core = EndpointCore()
    for region in regions or []:
        _adopt(core.pd, region)
    host = _resolve(host)
    locals_ = [_resolve(a) for a in local_addrs] if local_addrs else []
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except TimeoutError:
        raise MRCError(f"peer [{host}]:{port} unreachable (no answer in {timeout:g} s)") from None
    except ConnectionRefusedError:
        raise MRCError(
            f"connection refused by [{host}]:{port} (is mrc-recv listening there?)"
        ) from None
    except OSError as exc:
        raise MRCError(f"cannot reach [{host}]:{port}: {exc.strerror or exc}") from None
    control = ControlChannel(reader, writer)
    if not locals_:
        locals_ = [writer.get_extra_info("sockname")[0]]
    try:
        rx = udp_socket(_any_address(host), 0)
    except OSError as exc:
        control.close()
        raise MRCError(f"cannot open a UDP socket: {exc.strerror or exc}") from None
    endpoint = Endpoint(core, [rx])
    try:
        conn = await _client_setup(
            endpoint,
            control,
            host,
            locals_,
            evs,
            cfg,
            request_size,
            request_name,
            regions or [],
            timeout,
            fabric,
        )
    except BaseException:
        control.close()
        endpoint.close()
        raise
    return conn


async def _client_setup(
    endpoint: Endpoint,
    control: ControlChannel,
    host: str,
    locals_: list[str],
    evs: int,
    cfg: QPConfig,
    request_size: int | None,
    request_name: str,
    regions: list[MemoryRegion],
    timeout: float = CONNECT_TIMEOUT,
    fabric: Topology | None = None,
) -> Connection:
    core = endpoint.core
    qpn = _new_qpn(core)
    psn = secrets.randbits(24)
    hello: dict[str, object] = {
        "mrc": PROTOCOL_VERSION,
        "qpn": qpn,
        "psn": psn,
        "udp_port": endpoint.port,
        "addrs": locals_,
        "evs": evs,
        "psn_window": cfg.psn_window,
        "regions": [r.describe() for r in regions],
    }
    if request_size is not None:
        hello["request"] = {"size": request_size, "name": request_name}
    try:
        await control.send(hello)
        reply = await control.recv(timeout=timeout)
    except ControlError as exc:
        raise MRCError(f"set-up with [{host}] failed: {exc}") from None
    if reply is None:
        raise MRCError(f"[{host}] closed the side channel during set-up")
    try:
        check_version(reply)
    except ControlError as exc:
        raise MRCError(str(exc)) from None
    if not reply.get("ok"):
        raise MRCError(f"connection refused by the receiver: {reply.get('error', 'no reason')}")
    remote_addrs = [str(a) for a in reply.get("addrs") or []] or [host]  # type: ignore[union-attr]
    pairs = _plane_pairs(locals_, remote_addrs)
    total = evs + backup_count(evs, len(pairs))
    socks, planes, labels = _open_ev_sockets(
        total,
        _routes(pairs, fabric),
        int(reply["udp_port"]),  # type: ignore[arg-type]
    )
    qp = QueuePair(
        qpn,
        core.pd,
        [s.getsockname()[1] for s in socks],
        planes,
        cfg,
        psn,
        active_evs=evs,
        ev_routes=_route_ids(labels),
    )
    qp.connect(int(reply["qpn"]), int(reply["psn"]))  # type: ignore[arg-type]
    channel = endpoint.attach(qp, socks)
    remote = [RemoteRegion.from_dict(r) for r in reply.get("regions") or []]  # type: ignore[union-attr, arg-type]
    return Connection(endpoint, channel, control, remote, True, plane_pairs=pairs, routes=labels)
