"""The asyncio I/O layer: sockets in, the sans-IO core in the middle, sockets out.

One ``Endpoint`` owns the listen sockets (where data and ACKs for its QPs arrive, demultiplexed
by QP number), the EV sockets of each QP, and a single timer. Per-packet work here is kept to a
``recvmsg_into`` into one reused buffer (its control messages: a GRO train's segment size and
the IP ECN field, mrc/transport/ecn.py) and a ``sendmsg`` per burst the core hands over (header
views and payload views, no copy; GSO cuts it into datagrams): everything else is the core's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Callable

from mrc import wire
from mrc.core.endpoint import EndpointCore
from mrc.core.events import (
    EVStateChanged,
    ImmediateReceived,
    QPFailed,
    WCStatus,
    WriteCompleted,
    WriteFailed,
)
from mrc.core.qp import QueuePair
from mrc.errors import WriteError
from mrc.security.packet import DATA_OVERHEAD as _SEAL_OVERHEAD
from mrc.transport import ecn as _ecn
from mrc.transport import flowlabel, gso, rxbatch
from mrc.transport.evsockets import EVSockets
from mrc.transport.linkstate import PlaneLinks, plane_interfaces
from mrc.transport.sockets import (
    datagram_room,
    rcvbuf_drops,
    receive_queue_bytes,
    receive_room,
)

# The core's clock: CLOCK_MONOTONIC with microsecond resolution. (uvloop's loop.time() has
# millisecond resolution, which would round every send time, RTT sample and reordering window.)
# Timers still go through loop.call_at: both clocks count from boot.
_clock = time.monotonic
# the kernel's receive timestamps (SO_TIMESTAMPNS) are CLOCK_REALTIME: a receive's wait in its
# socket is this clock's reading with the batch less its timestamp
_wall = time.time

_log = logging.getLogger(__name__)

RX_BATCH = 512
RX_BUFFER = 65536
#: receives per receive batch (rxbatch.recv_batch), each into a slot of RX_BUFFER bytes
RX_SLOTS = 4

# what sendmsg takes for one datagram (header, payload) or one GSO burst of them
Buffers = list[bytes | memoryview]

_BTH_MARKS = 4  # BTH byte 4: FECN BECN T L
_LABEL_BITS = wire.EV_LABEL_BITS


def queue_mark_at(sock: socket.socket) -> int:
    """Bytes of ``sock``'s receive queue above which what is read from it is marked CE (0:
    never). Every QP into this host fills that one queue, which, unlike a switch port,
    neither trims nor marks: overflowing, it loses datagrams, which the senders blame on
    their EVs and repair by timeouts, and NSCC's window grows on delay alone. Marked, the
    queue says "congested" as a fabric port would, before it overflows: half of what the
    kernel lets it hold (``SO_RCVBUF`` as reported: a 16 MiB buffer holds about 1,000
    datagrams of 8 KiB on loopback), above what one QP's whole window (512 packets) fills."""
    try:
        receive_queue_bytes(sock)
    except OSError:
        return 0  # no SO_MEMINFO: no marks
    return receive_room(sock) // 2


class QPChannel:
    """The I/O side of one QP: its EV sockets and the futures/queues the application awaits."""

    def __init__(self, qp: QueuePair, evsocks: EVSockets) -> None:
        self.qp = qp
        self.ev_sockets = evsocks.sockets  # distinct: the EVs of a route share one
        self.send_fns = [s.sendmsg for s in evsocks.per_ev]
        # per EV, the control messages that give its datagrams its flow label ([]: none)
        self.label_cmsgs: list[gso.Ancillary] = [
            [flowlabel.cmsg(label)] if label else [] for label in evsocks.labels
        ]
        self.pending: dict[int, asyncio.Future[int]] = {}
        self.imms: asyncio.Queue[int] = asyncio.Queue()
        self.error: str | None = None
        self.error_event = asyncio.Event()
        self.gso_error: str | None = (
            None if evsocks.gso else "uSID routes on a trimming fabric take no GSO bursts"
        )
        self.send_errors = 0
        # datagrams for this QP that arrived with CE in the IP ECN field
        self.ce_received = 0
        # datagrams for this QP marked CE here: read from a receive queue over its threshold
        self.queue_marks = 0
        # sends the socket would not take yet, in order
        self.backlog: deque[gso.Send] = deque()
        # False once a GSO send was refused (e.g. a device without checksum offload), or
        # where a route cannot take GSO bursts (EVRoute.gso)
        self.gso = qp.config.burst_max > 1 and evsocks.gso
        # the largest UDP payload every EV sends unfragmented (None: unknown). GSO segments
        # cannot be fragmented: a QP whose datagrams do not fit sends them one by one, and
        # the kernel fragments them (slower, but nothing is lost)
        rooms = [r for r in (datagram_room(s) for s in self.ev_sockets) if r is not None]
        self.datagram_room = min(rooms) if rooms else None
        seal = _SEAL_OVERHEAD if qp.protection is not None else 0
        biggest = qp.config.payload_size + wire.DATA_IMM_HDR_LEN + seal
        if self.gso and self.datagram_room is not None and biggest > self.datagram_room:
            self.gso = False
            fits = self.datagram_room - wire.DATA_IMM_HDR_LEN - seal
            # a marked socket is on a uSID fabric's route (mrc.srv6.usid): IPv6-in-IPv6 is
            # fragmented outside the tunnel, which the receiving host cannot reassemble
            tunnelled = any(
                s.getsockopt(socket.SOL_SOCKET, socket.SO_MARK) for s in self.ev_sockets
            )
            _log.warning(
                "datagrams of up to %d bytes exceed what the path MTU leaves for them (%d bytes "
                "with the routing header): %s; a payload of at most %d bytes fits",
                biggest,
                self.datagram_room,
                "on uSID routes they are fragmented outside the tunnel and lost"
                if tunnelled
                else "sent one by one and fragmented by the kernel, which costs throughput",
                fits,
            )
            self.gso_error = f"payload too large for the path MTU (at most {fits} bytes fits)"
        # the kernel's receive-buffer drops when the QP started: a failure says how many more
        self.drops_at_start = rcvbuf_drops()
        self._explained: tuple[str, str] | None = None  # explain()'s last (reason, text)
        # called with every EV state transition (Connection.on_ev_change sets it)
        self.on_ev_event: Callable[[EVStateChanged], None] | None = None
        # called once, when this QP first takes a datagram (not one it dropped): how a
        # listener learns that a sender it welcomed has started (Listener's start_timeout)
        self.on_first_datagram: Callable[[], None] | None = None

    def explain(self, reason: str) -> str:
        """``reason`` (the core's one line for a QP failure) with what this host's kernel
        dropped while the QP ran; the same text every time for one failure (its failed
        writes, then the QP)."""
        if self._explained is not None and self._explained[0] == reason:
            return self._explained[1]
        text = reason
        drops = rcvbuf_drops()
        if drops is not None and self.drops_at_start is not None and drops > self.drops_at_start:
            text += (
                f"; meanwhile this host's kernel dropped {drops - self.drops_at_start} UDP "
                "datagrams for lack of socket receive-buffer room (all sockets together)"
            )
        self._explained = (reason, text)
        return text

    def fail(self, reason: str) -> None:
        if self.error is not None:
            return
        reason = self.explain(reason)
        self.error = reason
        self.error_event.set()
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(WriteError(reason, WCStatus.FLUSHED.value))
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
        self.label_cmsgs = []


class Endpoint:
    """asyncio driver for an :class:`EndpointCore` (use :meth:`open`)."""

    def __init__(
        self,
        core: EndpointCore,
        listen_sockets: list[socket.socket],
        gro: bool = True,
        ecn: bool = True,
    ) -> None:
        self.core = core
        self.listen_sockets = listen_sockets
        self.loop = asyncio.get_running_loop()
        self.channels: dict[int, QPChannel] = {}
        # where receives land: RX_SLOTS slots of RX_BUFFER bytes for the receive batch (a
        # plain receive, without control messages, takes the first)
        self._rxbuf = bytearray(RX_SLOTS * RX_BUFFER)
        self._rxview = memoryview(self._rxbuf)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._closed = False
        # GRO on every receiving socket: bursts sent with GSO arrive as one receive each
        self.gro = all(gso.enable_gro(s) for s in listen_sockets) if gro else False
        self.gro_trains = 0  # receives that held more than one datagram
        # the flow label of every IPv6 datagram: the low half of its 32-bit EV (and its
        # traffic class, so its ECN field, comes with it: no separate message for that).
        # An IPv4 socket has none: its datagrams' EVs are their ports (label bits 0)
        labelled = [flowlabel.enable_recv(s) for s in listen_sockets]
        self.labels = any(labelled)
        # the IP ECN field of every datagram (a cmsg per receive; see mrc/transport/ecn.py):
        # IPv6's from the flow information where labels are read, IPv4's from the TOS
        self.ecn = (
            all(
                _ecn.enable_recv(s, tclass=not lab)
                for s, lab in zip(listen_sockets, labelled, strict=True)
            )
            if ecn
            else False
        )
        self.ce_received = 0  # datagrams that arrived with CE, whoever took them
        space = (gso.GRO_CMSG_SPACE if self.gro else 0) + (_ecn.CMSG_SPACE if self.ecn else 0)
        space += flowlabel.CMSG_SPACE if self.labels else 0
        # each receive's kernel timestamp: how long it waited in the socket is host delay,
        # which the ACK's ACK Delay tells the peer and the window law takes out of the
        # network's round trip (docs/PROTOCOL.md 3.4). Only with the other control messages:
        # a plain receive has none, and then nothing is measured
        self.stamps = bool(space) and all(rxbatch.enable_timestamps(s) for s in listen_sockets)
        space += rxbatch.TIMESTAMP_CMSG_SPACE if self.stamps else 0
        self._meta_space = space  # 0: plain recvfrom_into, no control messages
        # a receive queue over this many bytes marks what is read from it CE, as a switch
        # port marks its queue (queue_mark_at)
        self._mark_at = {s.fileno(): queue_mark_at(s) for s in listen_sockets}
        self.queue_marks = 0  # datagrams marked CE because this host's receive queue was deep
        for sock in listen_sockets:
            self.loop.add_reader(sock.fileno(), self._on_readable, sock)
        # the link state of the QPs' plane NICs: a plane whose NIC goes down is out at once
        self.links = PlaneLinks(self.loop, self._link_down)

    @property
    def port(self) -> int:
        port: int = self.listen_sockets[0].getsockname()[1]
        return port

    def start_share(self) -> int:
        """Payload bytes a newly attached QP's peer may send before its first ACK: its share
        of this endpoint's receive buffer, among every QP attached (itself included).

        Every sender of a host's QPs fills one receive socket here, which, unlike a switch
        port, neither trims nor marks: what overflows it is lost, blamed on the EVs it came
        by, and repaired by timeouts. A window law's first window is sent before any signal
        can come back, so 256 QPs starting with 16 packets of 8 KiB each (32 MiB) overran a
        16 MiB buffer and collapsed (docs/PERFORMANCE.md, "Many QPs into one host"). Half
        the buffer is shared out, counting a datagram at twice its payload (what the kernel
        charges for one on loopback); the welcome tells the peer (``start_bytes``)."""
        room = receive_room(self.listen_sockets[0])
        return max(1, room // 4 // max(1, len(self.channels)))

    # ---- QPs ---------------------------------------------------------------------------

    def attach(self, qp: QueuePair, evsocks: EVSockets) -> QPChannel:
        """Start driving ``qp``; ``evsocks.per_ev[i]`` sends the packets of EV i, with flow
        label ``evsocks.labels[i]``."""
        self.core.add(qp)
        ch = QPChannel(qp, evsocks)
        self.channels[qp.qpn] = ch
        if qp.config.ev_health and qp.evs.nplanes > 1:  # one plane has nowhere else to go
            self.links.add(qp.qpn, plane_interfaces(qp.evs.planes, evsocks.per_ev))
        return ch

    def _link_down(self, qpn: int, plane: int, index: int) -> None:
        """Plane ``plane`` of QP ``qpn`` runs on interface ``index``, which lost its link."""
        ch = self.channels.get(qpn)
        if ch is None or not ch.qp.link_down(plane, _clock()):
            return
        try:
            nic = socket.if_indextoname(index)
        except OSError:
            nic = f"interface #{index}"
        _log.warning("QP %d: plane %d is out: its NIC (%s) lost its link", qpn, plane, nic)
        self._pump(ch)

    def detach(self, qpn: int) -> None:
        ch = self.channels.pop(qpn, None)
        self.core.remove(qpn)
        self.links.remove(qpn)
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
        if self._meta_space:
            self._on_readable_meta(sock)
            return
        recv = sock.recvfrom_into
        buf = self._rxview[:RX_BUFFER]
        view = self._rxview
        rx = self.core.receive_datagram
        now = _clock()
        touched: dict[int, int] = {}
        for _ in range(RX_BATCH):
            try:
                n, addr = recv(buf)
            except BlockingIOError:
                break
            except OSError:  # a pending socket error (e.g. from ICMP): nothing was read
                continue
            qp = rx(view[:n], addr[1] << _LABEL_BITS, now)
            if qp is not None:
                touched[qp.qpn] = 1
        self._pump_touched(touched)

    def _on_readable_meta(self, sock: socket.socket) -> None:
        """As _on_readable, with control messages: a receive may hold a GRO train of datagrams
        (the core takes it whole, EndpointCore.receive_train), and carries the IP ECN field
        (CE: FECN set in each datagram's BTH) and the flow label (with the source port, the
        datagram's EV). The receives come ``RX_SLOTS`` at a time (``rxbatch.recv_batch``: in
        C, one call and no GIL for them), into the slots of one buffer small enough to stay
        in the cache while the core places them."""
        recv = rxbatch.recv_batch
        buf = self._rxbuf
        view = self._rxview
        rx = self.core.receive_datagram
        rx_train = self.core.receive_train
        space = self._meta_space
        ecn = self.ecn
        now = _clock()
        wall = _wall() if self.stamps else 0.0
        touched: dict[int, int] = {}
        deep = self._queue_is_deep(sock)
        left = RX_BATCH
        while left > 0:
            metas, tries, empty = recv(sock, buf, RX_BUFFER, left, ecn, space)
            left -= tries
            at = 0
            for n, seg, ce, label, port, stamp in metas:
                data = view[at : at + n]
                at += RX_BUFFER
                ev = port << _LABEL_BITS | label
                # the time it waited in the socket until this batch began (None: unknown;
                # one that came during the batch waited none)
                wait = (wall - stamp if wall > stamp else 0.0) if stamp else None
                if seg <= 0 or seg >= n:
                    seg = 0  # a single datagram
                if ce or deep:
                    self._receive_ce(data, seg, ev, now, touched, local=not ce, wait=wait)
                    continue
                if not seg:
                    qp = rx(data, ev, now, wait)
                    if qp is not None:
                        touched[qp.qpn] = 1
                    continue
                self.gro_trains += 1
                for qpn in rx_train(data, seg, ev, now, wait):
                    touched[qpn] = 1
            if empty or not tries:
                break
        self._pump_touched(touched)

    def _queue_is_deep(self, sock: socket.socket) -> bool:
        """Whether ``sock``'s receive queue holds more than its marking threshold now."""
        mark_at = self._mark_at.get(sock.fileno())
        if not mark_at:
            return False
        try:
            return receive_queue_bytes(sock) > mark_at
        except OSError:
            return False

    def _receive_ce(
        self,
        data: memoryview,
        seg: int,
        ev: int,
        now: float,
        touched: dict[int, int],
        local: bool = False,
        wait: float | None = None,
    ) -> None:
        """The datagram(s) of one receive that arrived with CE: FECN set in each one's BTH
        (the core echoes it as BECN, docs/PROTOCOL.md 3.1), counted, then received as usual.
        ``local``: not marked on the way but here, read from a receive queue over its
        threshold (counted as ``queue_marks``, not as CE received)."""
        n = len(data)
        channels = self.channels
        if seg:
            self.gro_trains += 1
        step = seg or max(n, 1)  # an empty datagram too: the core counts it as short
        marked = 0
        for off in range(0, max(n, 1), step):
            if min(off + step, n) - off > _BTH_MARKS:
                data[off + _BTH_MARKS] |= wire.BTH_FECN
            marked += 1
        if local:
            self.queue_marks += marked
        else:
            self.ce_received += marked
        if seg:
            taken = self.core.receive_train(data, seg, ev, now, wait)
        else:
            qp = self.core.receive_datagram(data, ev, now, wait)
            taken = {qp.qpn: 1} if qp is not None else {}
        for qpn, count in taken.items():
            touched[qpn] = 1
            ch = channels.get(qpn)
            if ch is None:
                continue
            if local:
                ch.queue_marks += count
            else:
                ch.ce_received += count

    def _pump_touched(self, touched: dict[int, int]) -> None:
        channels = self.channels
        for qpn in touched:
            ch = channels.get(qpn)
            if ch is not None:
                # started only by a datagram the QP took: junk, or with keys anything not
                # sealed by the peer, is dropped and must not keep a silent sender's slot
                if ch.on_first_datagram is not None and ch.qp.stats.taken():
                    started, ch.on_first_datagram = ch.on_first_datagram, None
                    started()
                self._pump(ch)

    # ---- send path ---------------------------------------------------------------------

    def _pump(self, ch: QPChannel) -> None:
        qp = ch.qp
        now = _clock()
        bursts = qp.bursts_to_send(now)
        if bursts:
            sends = gso.sends(bursts) if ch.gso else gso.singles(bursts)
            if ch.backlog:
                ch.backlog.extend(sends)
            elif self._send(ch, sends, now):
                # datagrams lost to send errors: the core decided repairs just now
                self._send(ch, gso.singles(qp.bursts_to_send(now)), now, repair=True)
        self._dispatch_events(ch)
        deadline = qp.get_timer()
        if deadline is not None and (self._timer_at is None or deadline < self._timer_at):
            self._arm(deadline)

    def _send(self, ch: QPChannel, sends: list[gso.Send], now: float, repair: bool = False) -> int:
        """Send in order; returns how many datagrams were lost to send errors. What the
        socket does not take yet waits in the backlog (never for repairs: they are lost)."""
        send = ch.send_fns
        labels = ch.label_cmsgs
        lost = 0
        # how long after ``now`` (the send time the core stamped) each datagram left, summed:
        # a host delay that no ACK Delay or socket wait shows (QueuePair.sent_after)
        lag = 0.0
        sent = 0
        for i, (ev, bufs, cmsg, count) in enumerate(sends):
            try:
                send[ev](bufs, cmsg + labels[ev] if cmsg else labels[ev])
                lag += (_clock() - now) * count
                sent += count
            except BlockingIOError:
                if not repair:
                    ch.backlog.extend(sends[i:])
                    self._wait_writable(ch)
                break
            except OSError as exc:
                if cmsg and ch.gso:
                    # GSO refused on this path: from now on one datagram per send
                    ch.gso = False
                    ch.gso_error = exc.strerror or str(exc)
                    lost += self._send(ch, gso.split((ev, bufs, cmsg, count)), now, repair)
                    continue
                # e.g. the NIC of this EV's plane is down (ENETUNREACH), or an ICMP error
                # came back: the datagrams are lost, which is evidence on the EV
                lost += count
                ch.send_errors += count
                if not repair:
                    ch.qp.send_failed(ev, now, exc.strerror or str(exc))
        if sent:
            ch.qp.sent_after(lag / sent)
        return lost

    def _wait_writable(self, ch: QPChannel) -> None:
        for s in ch.ev_sockets:
            self.loop.add_writer(s.fileno(), self._drain_backlog, ch)

    def _drain_backlog(self, ch: QPChannel) -> None:
        send = ch.send_fns
        labels = ch.label_cmsgs
        while ch.backlog:
            ev, bufs, cmsg, count = ch.backlog[0]
            try:
                send[ev](bufs, cmsg + labels[ev] if cmsg else labels[ev])
            except BlockingIOError:
                return
            except OSError:
                if cmsg and ch.gso:
                    ch.gso = False
                    ch.backlog.popleft()
                    ch.backlog.extendleft(reversed(gso.split((ev, bufs, cmsg, count))))
                    continue
                ch.send_errors += count
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
            elif isinstance(ev, WriteFailed):
                fut = ch.pending.pop(ev.wr_id, None)
                if fut is not None and not fut.done():
                    fut.set_exception(WriteError(ch.explain(ev.reason), ev.status.value))
                    fut.exception()  # retrieved: as for QPChannel.fail
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
        self.links.close()
        for sock in self.listen_sockets:
            with contextlib.suppress(ValueError, OSError):
                self.loop.remove_reader(sock.fileno())
            sock.close()
