"""Counters of one queue pair, as reported by ``--json``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class QPStats:
    """Plain counters; the core increments them, nobody else writes them."""

    packets_sent: int = 0
    data_packets_sent: int = 0
    bytes_sent: int = 0
    retransmits: int = 0
    retransmits_nack: int = 0
    retransmits_timeout: int = 0
    retransmits_sack: int = 0
    retransmits_tlp: int = 0
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
    probes_answered: int = 0
    dropped_by_reason: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            name: getattr(self, name) for name in self.__slots__ if name != "dropped_by_reason"
        }
        out["dropped_by_reason"] = dict(self.dropped_by_reason)
        return out
