"""A queue pair: one reliable connection, sending and receiving, over a set of EVs.

This is the object an I/O layer drives, in the manner of aioquic's QuicConnection::

    qp.receive_datagram(data, src_port, now)   # for each datagram addressed to this QP
    for ev, header, payload in qp.datagrams_to_send(now): send header + payload on EV ev
    deadline = qp.get_timer(); ... qp.handle_timer(now) when it passes
    while (event := qp.next_event()) is not None: ...
"""

from __future__ import annotations

from collections import deque

from mrc import wire
from mrc.core.config import QPConfig
from mrc.core.events import Event, ProbeReplied
from mrc.core.evset import EVSet
from mrc.core.memory import ProtectionDomain
from mrc.core.requester import Requester
from mrc.core.responder import Responder
from mrc.core.stats import QPStats

Datagram = tuple[int, bytes, "memoryview | bytes"]

_OP_WRITE = int(wire.Opcode.RDMA_WRITE_ONLY)
_OP_WRITE_IMM = int(wire.Opcode.RDMA_WRITE_ONLY_IMM)
_OP_ACK = int(wire.Opcode.ACKNOWLEDGE)
_OP_PROBE = int(wire.Opcode.PROBE)
_OP_PROBE_REPLY = int(wire.Opcode.PROBE_REPLY)


class QueuePair:
    def __init__(
        self,
        qpn: int,
        pd: ProtectionDomain,
        ev_ports: list[int],
        ev_planes: list[int] | None = None,
        config: QPConfig | None = None,
        initial_psn: int = 0,
    ) -> None:
        self.config = config or QPConfig()
        self.config.validate()
        if not 0 < qpn <= wire.QPN_MASK:
            raise ValueError("QP number must be 1..2^24-1")
        self.qpn = qpn
        self.initial_psn = initial_psn & wire.PSN_MASK
        self.stats = QPStats()
        self.evs = EVSet(ev_ports, ev_planes, seed=self.config.spray_seed ^ qpn)
        self._events: deque[Event] = deque()
        emit = self._events.append
        self.requester = Requester(self.config, qpn, self.initial_psn, self.evs, self.stats, emit)
        self.responder = Responder(self.config, qpn, self.evs, pd, self.stats, emit)
        self._control: list[Datagram] = []
        self.remote_qpn: int | None = None

    def connect(self, remote_qpn: int, remote_initial_psn: int) -> None:
        """Bind to the peer QP (numbers exchanged out of band)."""
        if not 0 < remote_qpn <= wire.QPN_MASK:
            raise ValueError(f"peer QP number {remote_qpn} is not a 24-bit QP number")
        self.remote_qpn = remote_qpn
        self.requester.remote_qpn = remote_qpn
        self.responder.remote_qpn = remote_qpn
        self.responder.peer_initial_psn = remote_initial_psn & wire.PSN_MASK

    # ---- application side -------------------------------------------------------------

    def post_write(
        self,
        data: object,
        remote_addr: int,
        rkey: int,
        imm: int | None = None,
        wr_id: int | None = None,
    ) -> int:
        """Queue an RDMA WRITE (WRITE_IMM if ``imm`` is given); returns its work-request id.

        ``data`` must stay unchanged until the WriteCompleted event: packets are cut from it,
        and retransmitted from it, without copying.
        """
        return self.requester.post_write(data, remote_addr, rkey, imm, wr_id)

    def send_probe(self, ev: int, now: float) -> None:
        """Send one probe on entropy value ``ev``; a ProbeReplied event reports its RTT."""
        token = int(now * 1e6) & ((1 << 64) - 1)
        pkt = wire.pack_probe(self.remote_qpn or 0, 0, self.evs.ports[ev], token, reply=False)
        self._control.append((ev, pkt, b""))
        self.stats.probes_sent += 1

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    @property
    def failed(self) -> bool:
        return self.requester.failed

    @property
    def idle(self) -> bool:
        return self.requester.idle

    # ---- I/O side ----------------------------------------------------------------------

    def receive_datagram(self, data: memoryview, src_port: int, now: float) -> None:
        """Handle one datagram whose BTH names this QP (version already checked)."""
        op = data[0]
        if op in (_OP_WRITE, _OP_WRITE_IMM):
            if self.remote_qpn is None:
                self.stats.dropped_by_reason["not_connected"] += 1
                return
            self.responder.on_data(data, src_port, now, op == _OP_WRITE_IMM)
        elif op == _OP_ACK:
            if len(data) < wire.ACK_LEN:
                self.stats.dropped_by_reason["short"] += 1
                return
            self.requester.on_ack(data, src_port, now)
        elif op in (_OP_PROBE, _OP_PROBE_REPLY):
            self._on_probe(data, now, op == _OP_PROBE_REPLY)
        else:
            self.stats.dropped_by_reason["bad_opcode"] += 1

    def _on_probe(self, data: memoryview, now: float, reply: bool) -> None:
        if len(data) < wire.PROBE_LEN:
            self.stats.dropped_by_reason["short"] += 1
            return
        (_o, _f, _p, _q, psnw, ev_port, _fl, token) = wire.PROBE_PKT.unpack_from(data)
        if reply:
            ev = self.evs.index_of_port.get(ev_port)
            if ev is not None:
                self.stats.probes_answered += 1
                rtt = max(0.0, now - token / 1e6) if token <= int(now * 1e6) else 0.0
                self._events.append(ProbeReplied(self.qpn, ev, rtt))
            return
        if self.remote_qpn is None:
            return
        pkt = wire.pack_probe(self.remote_qpn, psnw, ev_port, token, reply=True)
        self._control.append((self.evs.next(), pkt, b""))

    def datagrams_to_send(self, now: float) -> list[Datagram]:
        out: list[Datagram] = []
        if self._control:
            out.extend(self._control)
            self._control.clear()
        self.responder.datagrams_to_send(now, out)
        self.requester.datagrams_to_send(now, out)
        return out

    def get_timer(self) -> float | None:
        a = self.requester.get_timer()
        b = self.responder.get_timer()
        if a is None:
            return b
        return a if b is None or a < b else b

    def handle_timer(self, now: float) -> None:
        self.requester.handle_timer(now)

    def ev_report(self) -> list[dict[str, int]]:
        """Per-EV packet counts (data packets and retransmissions sent on each)."""
        return [
            {"ev": i, "sport": port, "plane": self.evs.planes[i], "packets": n}
            for i, (port, n) in enumerate(zip(self.evs.ports, self.evs.packets, strict=True))
        ]
