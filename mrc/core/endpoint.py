"""Demultiplexing datagrams to queue pairs, and counting what cannot be delivered to any."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import Any

from mrc import wire
from mrc.core.memory import ProtectionDomain
from mrc.core.qp import QueuePair


class PeerGroups:
    """The QPs to one peer whose window laws share what they measure (the base RTT):
    one dict per peer (``key``: whatever names it, e.g. its host and our addresses), handed
    to each member with :meth:`QueuePair.share_with`, and dropped when its last member
    leaves, so that the groups never outgrow the QPs open.

    Endpoints that should share (a process's connections, each with an endpoint of its
    own) are given the same one (``EndpointCore(peers=...)``)."""

    __slots__ = ("_groups", "_members", "_key_of")

    def __init__(self) -> None:
        self._groups: dict[Hashable, dict[str, Any]] = {}
        self._members: dict[Hashable, int] = {}
        self._key_of: dict[QueuePair, Hashable] = {}

    def join(self, key: Hashable, qp: QueuePair) -> None:
        """``qp`` shares with the other QPs to peer ``key`` (a QP joins once: again, or to
        another key, does nothing)."""
        if qp in self._key_of:
            return
        group = self._groups.setdefault(key, {})
        self._members[key] = self._members.get(key, 0) + 1
        self._key_of[qp] = key
        qp.share_with(group)

    def leave(self, qp: QueuePair) -> None:
        """``qp`` (closed) stops sharing; its group goes with its last member. A QP that
        never joined, or left already, is told to stop all the same (it does nothing)."""
        qp.share_with(None)
        key = self._key_of.pop(qp, None)
        if key is None:
            return
        left = self._members[key] - 1
        if left:
            self._members[key] = left
        else:
            del self._members[key], self._groups[key]

    def __len__(self) -> int:
        """The groups (peers) with a member."""
        return len(self._groups)

    def members(self, key: Hashable) -> int:
        """The QPs sharing as peer ``key`` (0: no such group)."""
        return self._members.get(key, 0)


class EndpointCore:
    """All QPs of one endpoint share its protection domain and its receive path, and their
    window laws share per peer through ``peers`` (its own unless given one: see
    :class:`PeerGroups`)."""

    def __init__(self, pd: ProtectionDomain | None = None, peers: PeerGroups | None = None) -> None:
        self.pd = pd or ProtectionDomain()
        self.peers = peers if peers is not None else PeerGroups()
        self.qps: dict[int, QueuePair] = {}
        self.dropped_by_reason: Counter[str] = Counter()
        self.datagrams_received = 0  # every datagram receive_datagram was given
        # datagrams taken and dropped by QPs since removed, so the accounting still adds up
        self._retired = 0

    def add(self, qp: QueuePair) -> None:
        if qp.qpn in self.qps:
            raise ValueError(f"QP number {qp.qpn} already in use")
        self.qps[qp.qpn] = qp

    def remove(self, qpn: int) -> None:
        qp = self.qps.pop(qpn, None)
        if qp is not None:
            self._retired += qp.stats.taken() + sum(qp.stats.dropped_by_reason.values())

    def receive_datagram(
        self, data: memoryview, src_ev: int, now: float, wait: float | None = None
    ) -> QueuePair | None:
        """Route one datagram to its QP; returns that QP, or None if it was dropped here.
        ``wait``: seconds it had waited in this host by ``now`` (its socket's receive queue,
        measured by the transport), None where unknown: the ACK Delay an ACK about it tells
        the peer, and the host delay of an ACK (``QueuePair.arrived_after``)."""
        qp = self._route(data)
        if qp is not None:
            qp.arrived_after(wait)
            qp.receive_datagram(data, src_ev, now)
        return qp

    def receive_train(
        self, view: memoryview, seg: int, src_ev: int, now: float, wait: float | None = None
    ) -> dict[int, int]:
        """Receive a GRO train: consecutive datagrams of ``seg`` bytes (the last may be
        shorter) from one source port; ``seg`` 0 or at least ``len(view)``: one datagram.
        Returns the QPs that were given datagrams, by number, with how many each. ``wait``:
        as for :meth:`receive_datagram`, the train's.

        Every segment meets the same rules as if it had come alone through
        :meth:`receive_datagram` (its checks, counters, drops, NACKs and events); runs of
        plain WRITEs to one QP are placed by the train kernel (``QueuePair.receive_train``).
        """
        n = len(view)
        if seg <= 0 or seg >= n:
            seg = n
        touched: dict[int, int] = {}
        off = 0
        while True:
            qp = self._route(view[off : off + seg])
            if qp is None:
                off += seg
            else:
                qp.arrived_after(wait)
                taken = qp.receive_train(view, off, seg, src_ev, now)
                self.datagrams_received += taken - 1  # _route counted the first
                touched[qp.qpn] = touched.get(qp.qpn, 0) + taken
                off += taken * seg
            if off >= n:
                return touched

    def _route(self, data: memoryview) -> QueuePair | None:
        """The QP a datagram is for (counted as received), or None: dropped and counted."""
        self.datagrams_received += 1
        if len(data) < wire.BTH_LEN:
            self.dropped_by_reason["short"] += 1
            return None
        if data[1] & 0x0F != wire.MRC_TVER:
            self.dropped_by_reason["bad_version"] += 1
            return None
        qp = self.qps.get((data[5] << 16) | (data[6] << 8) | data[7])
        if qp is None:
            self.dropped_by_reason["unknown_qp"] += 1
        return qp

    def unaccounted(self) -> int:
        """Datagrams received that no counter took or dropped: 0 unless a path forgot to
        count (every datagram is taken by kind, ``QPStats.taken``, or dropped for a reason,
        here or on its QP, exactly once)."""
        counted = sum(self.dropped_by_reason.values()) + self._retired
        for qp in self.qps.values():
            counted += qp.stats.taken() + sum(qp.stats.dropped_by_reason.values())
        return self.datagrams_received - counted

    def all_drops(self) -> dict[str, int]:
        """Drops at this level plus every QP's, by reason."""
        total = Counter(self.dropped_by_reason)
        for qp in self.qps.values():
            total.update(qp.stats.dropped_by_reason)
        return dict(total)
