"""The asyncio I/O layer: sockets in, the sans-IO core in the middle, sockets out.

One ``Endpoint`` owns the listen sockets (where data and ACKs for its QPs arrive, demultiplexed
by QP number), the EV sockets of each QP, and a single timer. Per-packet work here is kept to a
``recvfrom_into`` into one reused buffer and a ``sendmsg`` of header + payload view (no copy):
everything else is the core's.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from collections.abc import Callable

from mrc.core.endpoint import EndpointCore
from mrc.core.events import EVStateChanged, ImmediateReceived, QPFailed, WriteCompleted
from mrc.core.qp import QueuePair

# The core's clock: CLOCK_MONOTONIC with microsecond resolution. (uvloop's loop.time() has
# millisecond resolution, which would round every send time, RTT sample and reordering window.)
# Timers still go through loop.call_at: both clocks count from boot.
_clock = time.monotonic

RX_BATCH = 512
RX_BUFFER = 65536

# what sendmsg takes for one datagram: header, payload
Buffers = list[bytes | memoryview]


class QPChannel:
    """The I/O side of one QP: its EV sockets and the futures/queues the application awaits."""

    def __init__(self, qp: QueuePair, ev_sockets: list[socket.socket]) -> None:
        self.qp = qp
        self.ev_sockets = ev_sockets
        self.send_fns = [s.sendmsg for s in ev_sockets]
        self.pending: dict[int, asyncio.Future[int]] = {}
        self.imms: asyncio.Queue[int] = asyncio.Queue()
        self.error: str | None = None
        self.error_event = asyncio.Event()
        self.send_errors = 0
        self.backlog: deque[tuple[int, Buffers]] = deque()
        # called with every EV state transition (Connection.on_ev_change sets it)
        self.on_ev_event: Callable[[EVStateChanged], None] | None = None
        # called once, when the first datagram from the peer reaches this QP: how a listener
        # learns that a sender it welcomed has started (Listener's start_timeout)
        self.on_first_datagram: Callable[[], None] | None = None

    def fail(self, reason: str) -> None:
        if self.error is not None:
            return
        self.error = reason
        self.error_event.set()
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(reason))
                # marked retrieved: the failure reaches the application through whichever
                # write it awaits (and ``error``); the other pending writes' futures must not
                # each print "Future exception was never retrieved" when collected
                fut.exception()
        self.pending.clear()

    def close(self) -> None:
        for s in self.ev_sockets:
            s.close()
        self.ev_sockets = []
        self.send_fns = []


class Endpoint:
    """asyncio driver for an :class:`EndpointCore` (use :meth:`open`)."""

    def __init__(self, core: EndpointCore, listen_sockets: list[socket.socket]) -> None:
        self.core = core
        self.listen_sockets = listen_sockets
        self.loop = asyncio.get_running_loop()
        self.channels: dict[int, QPChannel] = {}
        self._rxbuf = bytearray(RX_BUFFER)
        self._rxview = memoryview(self._rxbuf)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._closed = False
        for sock in listen_sockets:
            self.loop.add_reader(sock.fileno(), self._on_readable, sock)

    @property
    def port(self) -> int:
        port: int = self.listen_sockets[0].getsockname()[1]
        return port

    # ---- QPs ---------------------------------------------------------------------------

    def attach(self, qp: QueuePair, ev_sockets: list[socket.socket]) -> QPChannel:
        """Start driving ``qp``; ``ev_sockets[i]`` sends the packets of EV i."""
        self.core.add(qp)
        ch = QPChannel(qp, ev_sockets)
        self.channels[qp.qpn] = ch
        return ch

    def detach(self, qpn: int) -> None:
        ch = self.channels.pop(qpn, None)
        self.core.remove(qpn)
        if ch is not None:
            for s in ch.ev_sockets:
                with contextlib.suppress(ValueError, OSError):
                    self.loop.remove_writer(s.fileno())
            ch.close()

    def kick(self, qpn: int) -> None:
        """Let a QP send what it can now (after the application posted work)."""
        ch = self.channels.get(qpn)
        if ch is not None:
            self._pump(ch)

    # ---- receive path ------------------------------------------------------------------

    def _on_readable(self, sock: socket.socket) -> None:
        recv = sock.recvfrom_into
        buf = self._rxbuf
        view = self._rxview
        rx = self.core.receive_datagram
        now = _clock()
        touched: dict[int, QueuePair] = {}
        for _ in range(RX_BATCH):
            try:
                n, addr = recv(buf)
            except BlockingIOError:
                break
            except OSError:  # a pending socket error (e.g. from ICMP): nothing was read
                continue
            qp = rx(view[:n], addr[1], now)
            if qp is not None:
                touched[qp.qpn] = qp
        channels = self.channels
        for qpn in touched:
            ch = channels.get(qpn)
            if ch is not None:
                if ch.on_first_datagram is not None:
                    started, ch.on_first_datagram = ch.on_first_datagram, None
                    started()
                self._pump(ch)

    # ---- send path ---------------------------------------------------------------------

    def _pump(self, ch: QPChannel) -> None:
        qp = ch.qp
        now = _clock()
        datagrams = qp.datagrams_to_send(now)
        if datagrams:
            send = ch.send_fns
            if ch.backlog:
                ch.backlog.extend((ev, [h, p]) for ev, h, p in datagrams)
            else:
                errors = 0
                for i, (ev, hdr, payload) in enumerate(datagrams):
                    try:
                        send[ev]((hdr, payload))
                    except BlockingIOError:
                        ch.backlog.extend((e, [h, p]) for e, h, p in datagrams[i:])
                        self._wait_writable(ch)
                        break
                    except OSError as exc:
                        # e.g. the NIC of this EV's plane is down (ENETUNREACH), or an ICMP
                        # error came back: the datagram is lost, which is evidence on the EV
                        errors += 1
                        qp.send_failed(ev, now, exc.strerror or str(exc))
                ch.send_errors += errors
                if errors:
                    datagrams = qp.datagrams_to_send(now)  # repairs decided just now
                    for ev, hdr, payload in datagrams:
                        try:
                            send[ev]((hdr, payload))
                        except OSError:
                            ch.send_errors += 1
        self._dispatch_events(ch)
        deadline = qp.get_timer()
        if deadline is not None and (self._timer_at is None or deadline < self._timer_at):
            self._arm(deadline)

    def _wait_writable(self, ch: QPChannel) -> None:
        for s in ch.ev_sockets:
            self.loop.add_writer(s.fileno(), self._drain_backlog, ch)

    def _drain_backlog(self, ch: QPChannel) -> None:
        send = ch.send_fns
        while ch.backlog:
            ev, bufs = ch.backlog[0]
            try:
                send[ev](bufs)
            except BlockingIOError:
                return
            except OSError:
                ch.send_errors += 1
            ch.backlog.popleft()
        for s in ch.ev_sockets:
            self.loop.remove_writer(s.fileno())
        self._pump(ch)

    def _dispatch_events(self, ch: QPChannel) -> None:
        qp = ch.qp
        while (ev := qp.next_event()) is not None:
            if isinstance(ev, WriteCompleted):
                fut = ch.pending.pop(ev.wr_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(ev.length)
            elif isinstance(ev, ImmediateReceived):
                ch.imms.put_nowait(ev.imm)
            elif isinstance(ev, QPFailed):
                ch.fail(ev.reason)
            elif isinstance(ev, EVStateChanged) and ch.on_ev_event is not None:
                ch.on_ev_event(ev)
            # ProbeReplied answers QueuePair.send_probe, which nothing above the core calls

    # ---- timer -------------------------------------------------------------------------

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        now = _clock()
        for ch in list(self.channels.values()):
            deadline = ch.qp.get_timer()
            if deadline is not None and deadline <= now:
                ch.qp.handle_timer(now)
                self._pump(ch)
        earliest = None
        for ch in self.channels.values():
            d = ch.qp.get_timer()
            if d is not None and (earliest is None or d < earliest):
                earliest = d
        if earliest is not None and (self._timer_at is None or earliest < self._timer_at):
            self._arm(max(earliest, now + 0.0002))

    # ---- shutdown ----------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for qpn in list(self.channels):
            self.detach(qpn)
        for sock in self.listen_sockets:
            with contextlib.suppress(ValueError, OSError):
                self.loop.remove_reader(sock.fileno())
            sock.close()
