"""One connected queue pair and its side channel: what ``connect()`` and ``Listener.accept()``
return."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from mrc import counter_registry as registry
from mrc.connection.config import Buffer
from mrc.core.counters import Source
from mrc.core.events import EVStateChanged
from mrc.core.memory import Access, MemoryRegion
from mrc.errors import MRCError
from mrc.transport.control import ControlChannel
from mrc.transport.endpoint import Endpoint, QPChannel
from mrc.transport.messages import (
    RemoteRegion,
)
from mrc.transport.sidechannel import (
    SideChannel,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


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
        checksum: str = "sha256",
        checksum_key: bytes | None = None,
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
        #: the end-to-end checksum the two sides agreed on at set-up (mrc.app.checksum), and
        #: the key a keyed one uses (derived from the connection's key; None without one)
        self.checksum = checksum
        self.checksum_key = checksum_key
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

    def freeze_region(self, region: MemoryRegion, upto: int) -> None:
        """Place nothing new below byte ``upto`` of ``region`` any more (it only rises): those
        bytes are final, so they can be hashed while the rest is still written and the hash
        still describes them at the end. Later WRITEs of new data starting below it are
        dropped as for :meth:`close_region`; the rest of the region stays open."""
        region.freeze(upto)

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
    def imm_room(self) -> int:
        """Sender side: WRITE_IMMs that may be posted now without waiting
        (``QPConfig.max_imm_outstanding``, or the peer's ``max_imm_dest`` if fewer, less
        those not yet ended)."""
        requester = self.qp.requester
        return max(0, requester.imm_cap - requester.imms_outstanding)

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
