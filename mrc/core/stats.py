"""Counters of one queue pair, as reported by ``--json``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class QPStats:
    """Plain counters; the core increments them, nobody else writes them."""

    packets_sent: int = 0
    data_packets_sent: int = 0
    #: runs of new packets sent back to back on one EV (data_packets_sent / bursts: the mean
    #: burst, QPConfig.burst at most; 1 while spraying packet by packet)
    bursts: int = 0
    bytes_sent: int = 0
    retransmits: int = 0
    retransmits_nack: int = 0
    retransmits_timeout: int = 0
    retransmits_sack: int = 0
    retransmits_tlp: int = 0
    #: transmissions found lost because their tail loss probe was the first copy to arrive
    #: (the ACK of the probe did not carry wire.ACK_SUBJECT_DUP): each blamed on its EV
    losses_tlp: int = 0
    #: packets queued for a resend (one of the four causes above) that an ACK covered before
    #: they went out again: retransmits + retransmits_cancelled == the four causes' sum
    retransmits_cancelled: int = 0
    nacks: int = 0
    nacks_ignored: int = 0
    sacks: int = 0
    acks_sent: int = 0
    nacks_sent: int = 0
    trims_seen: int = 0
    packets_received: int = 0
    bytes_placed: int = 0
    duplicates: int = 0
    probes_sent: int = 0
    probes_answered: int = 0  # probe replies taken (for an EV of ours)
    probes_received: int = 0  # probes from the peer, answered
    ack_beyond_sent: int = 0  # ACKs reporting PSNs beyond what was sent (clamped, see requester)
    ecn_echoes: int = 0  # ACKs (not NACKs) taken with BECN: the peer's echo of a CE mark
    dropped_by_reason: Counter[str] = field(default_factory=Counter)

    def taken(self) -> int:
        """Datagrams this QP took, one counter per kind, each datagram in exactly one: data
        (placed or duplicate), trimmed headers, ACKs, NACKs acted on, probes, probe replies.
        Together with ``dropped_by_reason`` this accounts for every datagram the endpoint
        handed to the QP (see ``EndpointCore.unaccounted``)."""
        return (
            self.packets_received
            + self.trims_seen
            + self.sacks
            + self.nacks
            - self.nacks_ignored  # ignored NACKs are in dropped_by_reason too
            + self.probes_received
            + self.probes_answered
        )

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            name: getattr(self, name) for name in self.__slots__ if name != "dropped_by_reason"
        }
        out["dropped_by_reason"] = dict(self.dropped_by_reason)
        return out
