"""Counters of one queue pair, each declared with what ``--json`` and the metrics show of it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mrc.core.counters import RECV, SEND, Source, counter, counters_of

#: the Prometheus family of the five ``retransmits_*`` causes (label ``cause``)
RETRANSMIT_TRIGGERS = "mrc_qp_retransmit_triggers"


@dataclass(slots=True)
class QPStats:
    """Plain counters; the core increments them, nobody else writes them.

    Every field but ``dropped_by_reason`` is declared with :func:`~mrc.core.counters.counter`:
    its help line, its Prometheus family and the ``--json`` outputs that print it are part of
    the field, and ``mrc.counter_registry`` builds every output from that."""

    packets_sent: int = counter(
        "Data packets sent, retransmissions included", metric="mrc_qp_sent_packets", json=SEND
    )
    data_packets_sent: int = counter(
        "Data packets sent for the first time",
        metric="mrc_qp_sent_new_packets",
        json=SEND,
        json_key="data_packets",
    )
    bursts: int = counter(
        "Runs of new packets sent back to back on one EV, one GSO send each (data packets / "
        "bursts: the mean burst, the configured burst at most; 1 while spraying packet by "
        "packet)",
        json=SEND,
    )
    bytes_sent: int = counter("Payload bytes sent for the first time", metric="mrc_qp_sent_bytes")
    retransmits: int = counter("Data packets sent again", metric="mrc_qp_retransmits", json=SEND)
    retransmits_nack: int = counter(
        "Retransmissions a NACK queued",
        metric=RETRANSMIT_TRIGGERS,
        labels=(("cause", "nack"),),
        json=SEND,
    )
    retransmits_timeout: int = counter(
        "Retransmissions a retransmission timeout queued",
        metric=RETRANSMIT_TRIGGERS,
        labels=(("cause", "timeout"),),
        json=SEND,
    )
    silent_timeouts: int = counter(
        "Of retransmits_timeout, those of a silent flight (nothing new acknowledged since the "
        "packet left): only its oldest packet is resent, and no EV is blamed",
        json=SEND,
    )
    retransmits_sack: int = counter(
        "Retransmissions SACK evidence queued (later packets arrived)",
        metric=RETRANSMIT_TRIGGERS,
        labels=(("cause", "sack"),),
        json=SEND,
    )
    retransmits_link: int = counter(
        "Retransmissions of what was in flight on a plane when its NIC (ours, or the peer's, "
        "as its port-state bitmap said) lost its link",
        metric=RETRANSMIT_TRIGGERS,
        labels=(("cause", "link"),),
        json=SEND,
    )
    retransmits_tlp: int = counter(
        "Tail loss probes: the newest packet sent again after a silence",
        metric=RETRANSMIT_TRIGGERS,
        labels=(("cause", "tlp"),),
        json=SEND,
    )
    losses_tlp: int = counter(
        "Transmissions proved lost by their tail loss probe (the probe arrived first: the ACK "
        "of the probe did not carry wire.ACK_SUBJECT_DUP); each blamed on its EV",
        json=SEND,
    )
    retransmits_cancelled: int = counter(
        "Retransmissions queued (by one of the five causes) that an ACK covered before they "
        "went out again: retransmits + retransmits_cancelled == the five causes' sum"
    )
    nacks: int = counter("NACKs received from the peer", metric="mrc_qp_received_nacks", json=SEND)
    nacks_ignored: int = counter("NACKs received and not acted on (in dropped_by_reason too)")
    nacks_unconfirmed: int = counter(
        "Fatal NACKs (remote access error) held, keyless, until the packet's next transmission "
        "is refused too: one forged NACK cannot end a QP",
        json=SEND,
    )
    nacks_contradicted: int = counter(
        "Held fatal NACKs whose packet was acknowledged after all (false: forged)", json=SEND
    )
    trims_contradicted: int = counter(
        "Trim NACKs proved false: an ACK answered the very copy they said was trimmed (forged)",
        json=SEND,
    )
    trims_distrusted: int = counter(
        "Trim NACKs taken only as a reason to resend (no window cut, no EV skipped): after "
        "8 were proved false on a keyless QP",
        json=SEND,
    )
    port_states_refused: int = counter(
        "Port-state bitmaps refused: every plane of the peer down, in an ACK that came over one",
        json=SEND,
    )
    sacks: int = counter(
        "ACKs (SACKs) received from the peer", metric="mrc_qp_received_acks", json=SEND
    )
    acks_earlier_copy: int = counter(
        "ACKs that answered a copy sent before the latest resend of their subject (a tail loss "
        "probe of a packet that was only queued, or a resend overtaken by the ACK it awaited)",
        json=SEND,
    )
    rtt_earlier_copy: int = counter(
        "RTT samples taken from the ACK of a copy sent before the latest resend of its subject "
        "(the ACK names the copy by its EV; the RTO learns a round trip a timeout fell short of)",
        json=SEND,
    )
    acks_sent: int = counter("ACKs (SACKs) sent to the peer", metric="mrc_qp_sent_acks", json=RECV)
    nacks_sent: int = counter("NACKs sent to the peer", metric="mrc_qp_sent_nacks", json=RECV)
    trims_seen: int = counter(
        "Trimmed packets received (headers whose payload a switch cut under congestion)",
        metric="mrc_qp_trimmed_packets",
        json=RECV,
    )
    packets_received: int = counter(
        "Data packets received, duplicates included", metric="mrc_qp_received_packets", json=RECV
    )
    bytes_placed: int = counter(
        "Payload bytes placed in registered memory", metric="mrc_qp_placed_bytes", json=RECV
    )
    duplicates: int = counter(
        "Data packets received that were already placed",
        metric="mrc_qp_duplicate_packets",
        json=RECV,
    )
    duplicates_early: int = counter(
        "Duplicates that arrived less than tlp_min after the SACK that reported them left: "
        "resent before that SACK could arrive, no evidence that it was lost",
        json=RECV,
    )
    probes_sent: int = counter("EV probes sent", metric="mrc_qp_sent_probes")
    probes_answered: int = counter("Probe replies taken (for an EV of ours)")
    probes_received: int = counter("Probes from the peer, answered")
    reverse_probes_sent: int = counter(
        "Probes of reverse EVs (the paths of our ACKs) sent while only receiving; "
        "also counted in probes_sent",
        metric="mrc_qp_sent_reverse_probes",
        json=RECV,
    )
    reverse_probes_answered: int = counter("Reverse EV probes answered (also in probes_answered)")
    reverse_probes_lost: int = counter(
        "Reverse EVs retired: their probes went unanswered twice in a row while others "
        "were answered (reason: reverse probe unanswered)",
        metric="mrc_qp_reverse_probe_losses",
        json=RECV,
    )
    ack_beyond_sent: int = counter(
        "ACKs reporting PSNs beyond what was sent (clamped, see the requester)"
    )
    ecn_echoes: int = counter(
        "ACKs received with BECN (the peer's echo of a CE mark)",
        metric="mrc_qp_received_ecn_echoes",
        json=SEND,
    )
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


#: every counter of QPStats, in field order
QP_COUNTERS = counters_of(QPStats, Source.QP)
