"""A queue pair: one reliable connection, sending and receiving, over a set of EVs.

This is the object an I/O layer drives, in the manner of aioquic's QuicConnection::

    qp.receive_datagram(data, src_ev, now)   # for each datagram addressed to this QP
    for ev, header, payload in qp.datagrams_to_send(now): send header + payload on EV ev
    # or, a burst at a time (what the asyncio transport does, with UDP GSO):
    for ev, buffers, count, seg in qp.bursts_to_send(now): send buffers on EV ev
    deadline = qp.get_timer(); ... qp.handle_timer(now) when it passes
    while (event := qp.next_event()) is not None: ...
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import deque
from typing import Any, Protocol

from mrc import wire
from mrc.core.cc import law_class
from mrc.core.config import QPConfig
from mrc.core.events import Burst, Datagram, Event, EVReason, ProbeReplied, datagrams_of
from mrc.core.evset import EVSet
from mrc.core.memory import ProtectionDomain
from mrc.core.planesteer import PlaneSteering
from mrc.core.requester import Requester
from mrc.core.responder import TRAIN_CAP, Responder
from mrc.core.revprobes import ReverseProbes
from mrc.core.stats import QPStats
from mrc.errors import MRCError

_OP_WRITE = int(wire.Opcode.RDMA_WRITE_ONLY)
_OP_WRITE_IMM = int(wire.Opcode.RDMA_WRITE_ONLY_IMM)
_OP_ACK = int(wire.Opcode.ACKNOWLEDGE)
_OP_PROBE = int(wire.Opcode.PROBE)
_OP_PROBE_REPLY = int(wire.Opcode.PROBE_REPLY)
_BTH_SECURE = wire.BTH_SECURE
# a probe token: send time in microseconds (low 40 bits, wrapping every 12.7 days) under a
# 24-bit tag keyed with a secret of the QP's, so only replies to our own probes are believed
_PROBE_TIME_BITS = 40
_PROBE_TIME_MASK = (1 << _PROBE_TIME_BITS) - 1

# the fixed headers a security block follows, by opcode (docs/PROTOCOL.md section 11)
_HEADERS_LEN = {
    _OP_WRITE: wire.DATA_HDR_LEN,
    _OP_WRITE_IMM: wire.DATA_IMM_HDR_LEN,
    _OP_ACK: wire.ACK_LEN,
    _OP_PROBE: wire.PROBE_LEN,
    _OP_PROBE_REPLY: wire.PROBE_LEN,
}


class Protection(Protocol):
    """Per-datagram protection of one connection (:class:`mrc.security.packet.Protection`).

    A protocol here, so the core never imports ``cryptography``: the I/O layer builds the
    object from the keys the side-channel handshake derived and hands it to
    :meth:`QueuePair.protect`. ``unseal`` raises an :class:`MRCError` with a ``reason`` (the
    drop counter) for anything it does not accept.
    """

    def seal(
        self, headers: bytes, payload: bytes | memoryview, is_data: bool
    ) -> tuple[bytes, bytes | memoryview]: ...

    def unseal(self, data: memoryview, hdr_len: int, is_data: bool) -> memoryview: ...

    def seal_burst(
        self, bufs: list[bytes | memoryview], count: int
    ) -> tuple[list[bytes | memoryview], int]:
        """A burst's datagrams sealed at once: (parts, segment size or -1 if the sealed
        datagrams no longer make one burst)."""
        ...

    def open_train(
        self, view: memoryview, off: int, seg: int, cap: int, qpn: int
    ) -> tuple[int, str | None, int, int]:
        """A train's run of WRITEs naming ``qpn`` opened in place: (opened, drop reason of
        the segment that stopped the run or None, where that one lies if it opened to
        another form or 0, 0)."""
        ...

    #: where ``unseal`` leaves a whole data packet of a writable buffer in place (its
    #: headers moved up to the payload, which ends where the packet ends): the bytes before
    #: them, a constant. 0: it does not, and trains go datagram by datagram
    in_place_skip: int


class QueuePair:
    def __init__(
        self,
        qpn: int,
        pd: ProtectionDomain,
        ev_values: list[int],
        ev_planes: list[int] | None = None,
        config: QPConfig | None = None,
        initial_psn: int = 0,
        active_evs: int | None = None,
        ev_routes: list[int] | None = None,
    ) -> None:
        """``ev_values[i]``/``ev_planes[i]``: wire value (32 bits) and plane of EV i. The first
        ``active_evs`` EVs (all, by default) are sprayed over; the rest are the backup pool
        that replaces EVs found bad, plane by plane. ``ev_routes[i]``: an id of EV i's path
        (EVs on one path share its fate, so a backup never replaces an EV on its own path)."""
        self.config = config or QPConfig()
        self.config.validate()
        if not 0 < qpn <= wire.QPN_MASK:
            raise ValueError("QP number must be 1..2^24-1")
        self.qpn = qpn
        self.initial_psn = initial_psn & wire.PSN_MASK
        self.stats = QPStats()
        cfg = self.config
        self._events: deque[Event] = deque()
        emit = self._events.append
        nplanes = max(ev_planes) + 1 if ev_planes else 1
        steering = None
        steer = cfg.plane_steering
        if steer is None:
            steer = law_class(cfg.cc).plane_steering  # the window law's default
        if steer and nplanes > 1:
            steering = PlaneSteering(
                nplanes, margin=cfg.plane_steer_margin, floor=cfg.plane_steer_floor
            )
        self.evs = EVSet(
            ev_values,
            ev_planes,
            seed=cfg.spray_seed ^ qpn,
            active=active_evs,
            config=cfg,
            plane_steering=steering,
            on_change=emit,
            routes=ev_routes,
            qpn=qpn,
        )
        self.requester = Requester(self.config, qpn, self.initial_psn, self.evs, self.stats, emit)
        self.pd = pd  # the regions peers of this QP may write into
        self.responder = Responder(self.config, qpn, self.evs, pd, self.stats, emit)
        self._control: list[Datagram] = []
        self.reverse = ReverseProbes(cfg.reverse_probe_interval, cfg.reverse_probes_per_plane)
        self._announced_ports = 0xFFFF
        self.remote_qpn: int | None = None
        self.protection: Protection | None = None
        # unpredictable, not secret from the core's determinism: replies echo what we sent
        self._probe_key = secrets.token_bytes(16)

    def protect(self, protection: Protection) -> None:
        """From now on seal every datagram sent and accept only datagrams that unseal
        (before any is exchanged: a connection is protected from its first packet or never).
        The peer's ACKs are then authenticated, so its fatal NACKs are believed at once."""
        self.protection = protection
        self.requester.authenticated = True
        self.requester.gather = False  # sealing takes a burst's headers and payloads apart

    def share_with(self, group: dict[str, Any] | None) -> None:
        """Share what this QP's window law measures in common with the other QPs of this
        process to the same peer (NSCC: the base RTT; ``WindowLaw.join``): ``group`` is one
        dict per peer, the same object for all of them (:class:`~mrc.core.endpoint.PeerGroups`
        keeps them). None: stop sharing (the QP is closed; again does nothing)."""
        if group is None:
            self.requester.cc.leave()
        else:
            self.requester.cc.join(group)

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
        sent = int(now * 1e6) & _PROBE_TIME_MASK
        token = (self._probe_tag(self.evs.values[ev], sent) << _PROBE_TIME_BITS) | sent
        pkt = wire.pack_probe(self.remote_qpn or 0, 0, self.evs.values[ev], token, reply=False)
        self._control.append((ev, pkt, b""))
        self.stats.probes_sent += 1

    def peer_takes_imms(self, limit: int) -> None:
        """The peer takes at most ``limit`` WRITE_IMMs in flight (its ``max_imm_dest``, told
        at set-up): ours stay below that too (``mrc.h``'s MRC_QP_MAX_WIMM_DEST)."""
        if limit < 1:
            raise ValueError("a peer takes at least one WRITE_IMM")
        self.requester.imm_cap = min(self.config.max_imm_outstanding, limit)

    def deny_ev(self, ev: int, now: float = 0.0) -> None:
        """Operator denylist: EV ``ev`` is not used (state DENIED) until :meth:`allow_ev`."""
        self.evs.deny(ev, now)

    def allow_ev(self, ev: int, now: float = 0.0) -> bool:
        """Undo :meth:`deny_ev`: EV ``ev`` is probed, and used again once it answers
        (ASSUMED_BAD, then GOOD); False if it was not denied."""
        return self.evs.allow(ev, now)

    def link_down(self, plane: int, now: float) -> bool:
        """Our NIC of ``plane`` lost its link (the transport watches link state, where it
        can): the plane is out at once instead of after losses, its EVs probed until it
        answers again, the peer told in the port-state bitmap of our next ACKs, and what was
        in flight on it resent on the other planes, also when send errors or losses took the
        plane out a moment before (the link is proof they were lost). Returns whether that
        changed anything (False: EV health off, no such plane, or nothing left to do)."""
        if not self.config.ev_health or not 0 <= plane < self.evs.nplanes:
            return False
        changed = self.evs.set_plane_down(
            plane, now, EVReason.LINK_DOWN, "this host's NIC lost its link"
        )
        return self.requester.resend_plane(plane) > 0 or changed

    def send_failed(self, ev: int, now: float, reason: str) -> None:
        """The transport could not send on ``ev`` (e.g. its NIC is down): that is a loss."""
        if self.config.ev_health:
            self.evs.lost(ev, now, EVReason.SEND_ERROR, detail=reason)

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    @property
    def failed(self) -> bool:
        return self.requester.failed

    @property
    def idle(self) -> bool:
        return self.requester.idle

    # ---- I/O side ----------------------------------------------------------------------

    def arrived_after(self, wait: float | None) -> None:
        """The datagrams given next had waited ``wait`` seconds in this host (its socket's
        receive queue) by the ``now`` they come with; None: unknown (the simulator, a
        transport without kernel timestamps). The responder reports it in its ACKs (ACK
        Delay), the requester adds it to theirs: host delay, for the window law."""
        self.responder.rx_wait = wait
        self.requester.rx_wait = wait

    def sent_after(self, lag: float) -> None:
        """The datagrams handed out last left this host ``lag`` seconds (their mean) after
        the ``now`` they were stamped with: the time the sends before them took, the hosts'
        delay too. The requester adds it, smoothed, to its host delay samples."""
        self.requester.note_send_lag(lag)

    def receive_datagram(self, data: memoryview, src_ev: int, now: float) -> None:
        """Handle one datagram whose BTH names this QP (version already checked)."""
        if self.protection is not None:
            plain = self._unseal(data)
            if plain is None:
                return
            data = plain
        elif data[8] & _BTH_SECURE:
            self.stats.dropped_by_reason["security_unsupported"] += 1
            return
        self._receive_plain(data, src_ev, now)

    def _receive_plain(self, data: memoryview, src_ev: int, now: float) -> None:
        """Handle one datagram as the unprotected protocol carries it."""
        op = data[0]
        if op in (_OP_WRITE, _OP_WRITE_IMM):
            if self.remote_qpn is None:
                self.stats.dropped_by_reason["not_connected"] += 1
                return
            self.responder.on_data(data, src_ev, now, op == _OP_WRITE_IMM)
        elif op == _OP_ACK:
            if len(data) < wire.ACK_LEN:
                self.stats.dropped_by_reason["short"] += 1
                return
            self.requester.on_ack(data, src_ev, now)
        elif op in (_OP_PROBE, _OP_PROBE_REPLY):
            self._on_probe(data, now, op == _OP_PROBE_REPLY)
        else:
            self.stats.dropped_by_reason["bad_opcode"] += 1

    def receive_train(self, view: memoryview, off: int, seg: int, src_ev: int, now: float) -> int:
        """Handle the segment of a GRO train at byte ``off`` (``seg`` bytes, the last may be
        shorter), whose BTH names this QP, and as many following ones as the train kernel
        places; returns how many segments that was (at least one).

        Plain WRITEs of an unprotected, connected QP go to the kernel
        (``Responder.on_data_train``); the first segment it does not take goes through
        :meth:`receive_datagram` like any lone datagram, so its fate is the same either way.
        A protected QP whose unsealing works in place (``in_place_skip``: both of mrc's
        modes) unseals its WRITEs first (:meth:`_receive_sealed_train`).
        """
        if self.remote_qpn is not None:
            if self.protection is None:
                placed = self.responder.on_data_train(view, off, seg, src_ev, now)
                if placed:
                    return placed
            elif self.protection.in_place_skip and not view.readonly:
                return self._receive_sealed_train(view, off, seg, src_ev, now)
        self.receive_datagram(view[off : off + seg], src_ev, now)
        return 1

    def _receive_sealed_train(
        self, view: memoryview, off: int, seg: int, src_ev: int, now: float
    ) -> int:
        """:meth:`receive_train` for a protected QP whose unsealing works in place: the
        segments from ``off`` that are WRITEs naming this QP are unsealed in one call (each
        checked and its counter taken exactly as alone), then the train kernel places them,
        reading each datagram ``in_place_skip`` bytes into its segment. Any it does not
        take, and one that unsealed to something else (a trimmed packet), take the general
        path in their unsealed form. Returns how many segments were handled (at least 1)."""
        assert self.protection is not None
        skip = self.protection.in_place_skip
        # one call opens the run (Protection.open_train: the C kernel, or its Python twin)
        whole, reason, ostart, ostop = self.protection.open_train(
            view, off, seg, TRAIN_CAP, self.qpn
        )
        dropped = 0  # 1: the one after them did not unseal (dropped, counted here)
        if reason is not None:
            self.stats.dropped_by_reason[reason] += 1
            if not whole:
                return 1
            dropped = 1
        # the one after them, unsealed to another form (a trimmed packet)
        odd = view[ostart:ostop] if ostop else None
        o = min(off + whole * seg, len(view))  # where the segments unsealed in place end
        if not whole and odd is None:
            self.receive_datagram(view[off : off + seg], src_ev, now)
            return 1
        # the in-place segments end at o: the kernel must not read past them
        train = view[:o]
        pos = off
        while pos < o:
            placed = self.responder.on_data_train(train, pos, seg, src_ev, now, skip)
            pos += placed * seg
            if pos < o:  # the kernel stopped at this one: the general path takes it
                self._receive_plain(train[pos + skip : min(pos + seg, o)], src_ev, now)
                pos += seg
        if odd is not None:
            self._receive_plain(odd, src_ev, now)
            return whole + 1
        return whole + dropped

    def _unseal(self, data: memoryview) -> memoryview | None:
        """The unprotected form of a protected datagram, or None (dropped and counted)."""
        assert self.protection is not None
        op = data[0]
        hdr_len = _HEADERS_LEN.get(op)
        if hdr_len is None:
            self.stats.dropped_by_reason["bad_opcode"] += 1
            return None
        try:
            return self.protection.unseal(data, hdr_len, op in (_OP_WRITE, _OP_WRITE_IMM))
        except MRCError as exc:
            self.stats.dropped_by_reason[getattr(exc, "reason", "security_error")] += 1
            return None

    def _probe_tag(self, ev_value: int, sent: int) -> int:
        digest = hmac.new(
            self._probe_key, ev_value.to_bytes(4, "big") + sent.to_bytes(5, "big"), hashlib.sha256
        )
        return int.from_bytes(digest.digest()[:3], "big")

    def _on_probe(self, data: memoryview, now: float, reply: bool) -> None:
        if len(data) < wire.PROBE_LEN:
            self.stats.dropped_by_reason["short"] += 1
            return
        (_o, _f, _p, _q, psnw, ev_echo, _fl, _r, token) = wire.PROBE_PKT.unpack_from(data)
        if reply:
            ev = self.evs.index_of_value.get(ev_echo)
            if ev is None:
                self.stats.dropped_by_reason["probe_unknown_ev"] += 1
                return
            sent = token & _PROBE_TIME_MASK
            if token >> _PROBE_TIME_BITS != self._probe_tag(ev_echo, sent):
                # not a reply to a probe of ours: it must not bring an EV back
                self.stats.dropped_by_reason["probe_bad_token"] += 1
                return
            self.stats.probes_answered += 1
            rtt = ((int(now * 1e6) - sent) & _PROBE_TIME_MASK) / 1e6
            self.evs.probes.sample(rtt)  # late or not: how long probes take now
            if self.evs.is_probing(ev):
                self.evs.probe_answered(ev, now)  # a health probe of an ASSUMED_BAD EV
            else:
                if self.reverse.answered(ev):
                    self.stats.reverse_probes_answered += 1
                    self.evs.path_answered(ev, now - rtt)
                self.evs.route_answered(ev, now - rtt)
                self._events.append(ProbeReplied(self.qpn, ev, rtt))
            return
        if self.remote_qpn is None:
            self.stats.dropped_by_reason["not_connected"] += 1
            return
        self.stats.probes_received += 1
        pkt = wire.pack_probe(self.remote_qpn, psnw, ev_echo, token, reply=True)
        self._control.append((self.evs.next_reply(), pkt, b""))

    def datagrams_to_send(self, now: float) -> list[Datagram]:
        """What :meth:`bursts_to_send` sends, datagram by datagram (the simulator, tests)."""
        return datagrams_of(self.bursts_to_send(now))

    def bursts_to_send(self, now: float) -> list[Burst]:
        """Everything to send now: probes, ACKs and probe replies (a burst of one each), then
        data in bursts (``Requester.bursts_to_send``); sealed when protected."""
        control: list[Datagram] = []
        if self.config.ev_health and self.remote_qpn is not None and not self.failed:
            for ev in self.evs.probes_due(now):
                self.send_probe(ev, now)
            asks = self.evs.asks
            if asks:  # held losses ask their routes (EVSet._ask)
                for ev in asks:
                    self.send_probe(ev, now)
                asks.clear()
            at = self.reverse.due_at
            if at is not None and now >= at:
                self._probe_reverse(now)
            state = self.evs.port_state()
            if state != self._announced_ports:
                # a plane of ours went down or came back: tell the peer at once (SACKs carry
                # the bitmap), so it stops or resumes sending data and ACKs that way
                self._announced_ports = state
                self.responder.announce(now)
        if self._control:
            control.extend(self._control)
            self._control.clear()
        acks_from = len(control)
        self.responder.datagrams_to_send(now, control)
        if self.reverse.enabled and len(control) > acks_from:
            planes = self.evs.planes
            for ev, _hdr, _payload in control[acks_from:]:
                self.reverse.ack_sent(ev, planes[ev], now)
        out: list[Burst] = [
            (ev, [hdr, payload], 1, len(hdr) + len(payload)) for ev, hdr, payload in control
        ]
        self.requester.bursts_to_send(now, out)
        if self.protection is not None and out:
            out = [sealed for burst in out for sealed in self._seal(burst)]
        return out

    def _probe_reverse(self, now: float) -> None:
        """Probe the reverse EVs that are due (see :mod:`mrc.core.revprobes`), and take an
        unanswered probe for the loss it is."""
        only_receiving = self.requester.in_flight == 0
        due, lost = self.reverse.due(now, only_receiving, self.evs.probes.rtt)
        for ev, sent in lost:
            self.stats.reverse_probes_lost += 1
            self.evs.lost(ev, now, EVReason.REVERSE_PROBE, plane_evidence=False, sent_at=sent)
        usable = self.evs.usable
        for ev in due:
            if not usable[ev]:  # out of the rotation since its ACK: the health probes' now
                self.reverse.forget(ev)
                continue
            self.send_probe(ev, now)
            self.stats.reverse_probes_sent += 1

    def _seal(self, burst: Burst) -> list[Burst]:
        """The protected form of a burst: one burst if its sealed datagrams still make one
        (sealing adds the same bytes to each), else one per datagram."""
        assert self.protection is not None
        ev, bufs, count, _seg = burst
        parts, seg = self.protection.seal_burst(bufs, count)  # one call for the burst
        if seg >= 0:
            return [(ev, parts, count, seg)]
        return [
            (ev, parts[i : i + 2], 1, len(parts[i]) + len(parts[i + 1]))
            for i in range(0, 2 * count, 2)
        ]

    def get_timer(self) -> float | None:
        probe = None
        if self.config.ev_health and self.remote_qpn is not None and not self.failed:
            probe = self.evs.next_probe_time()
            rev = self.reverse.due_at
            if rev is not None and (probe is None or rev < probe):
                probe = rev
        times = [
            t
            for t in (self.requester.get_timer(), self.responder.get_timer(), probe)
            if t is not None
        ]
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        self.requester.handle_timer(now)

    def ev_report(self) -> list[dict[str, object]]:
        """Per EV: its 32-bit value, the UDP source port and flow label bits it is made of, its
        plane, packets sent on it (incl. retransmissions), state."""
        evs = self.evs
        return [
            {
                "ev": i,
                "value": value,
                "sport": value >> wire.EV_LABEL_BITS,
                "label": value & wire.EV_LABEL_MASK,
                "plane": evs.planes[i],
                "packets": n,
                "state": evs.describe(i),
            }
            for i, (value, n) in enumerate(zip(evs.values, evs.packets, strict=True))
        ]
