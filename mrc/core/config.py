"""Tunables of one queue pair, with the defaults the tools use."""

from __future__ import annotations

from dataclasses import dataclass, field

# the window laws' constants live with them (mrc/core/cc/base.py: the laws do not import this
# module, so this one may import the registry); named here too for the callers that read them
from mrc.core.cc.base import AUTO_BURST as AUTO_BURST
from mrc.core.cc.base import GSO_MAX_BYTES as GSO_MAX_BYTES
from mrc.core.cc.registry import law_class, params_of
from mrc.wire import DATA_IMM_HDR_LEN

# Bounds of psn_window, named so that validate() and the side channel's check of a peer's
# hello (mrc/transport/messages.py) cannot drift apart.
PSN_WINDOW_MIN = 64
PSN_WINDOW_MAX = 1 << 22
MAX_BURST = 64  # the kernel's limit on segments in one UDP GSO send (UDP_MAX_SEGMENTS)


@dataclass(slots=True)
class EVConfig:
    """The knobs of a QP's entropy values: EV health, CE penalties, route fate, plane shares.

    ``EVSet`` is handed this whole, not one keyword per knob. ``QPConfig`` extends it instead of
    nesting it, so that users, tests and ``--qp KEY=VALUE`` keep naming every knob of a QP on
    one flat object (``QPConfig(probe_interval=..., route_dead_evs=...)``), each knob and its
    default is declared once (here), and a QP hands its own config to its EVSet as it is: there
    is no copy to keep in step.
    """

    # EV health (mrc/core/evset.py, docs/EV_HEALTH.md)
    ev_health: bool = True
    min_active_per_plane: int = 0  # 0: a quarter of the plane's active EVs, at least 1
    probe_interval: float = 0.02
    probe_timeout: float = 0.1
    resurrect_after: int = 3
    plane_dead_losses: int = 8
    # reverse EVs (mrc/core/revprobes.py): while a side only receives, every interval the
    # EVs of each plane that last carried its ACKs (this many per plane) are probed; an
    # unanswered probe retires the EV (0 for either: off)
    reverse_probe_interval: float = 0.005
    reverse_probes_per_plane: int = 1
    # CE penalties (docs/EV_HEALTH.md, "CE penalties"): an EV whose packet came back CE-marked
    # sits out of the rotation for max(ecn_penalty_min, ecn_penalty_rtts x srtt) after its
    # latest mark; at most ecn_penalty_max_fraction of a plane's active EVs at once (more: the
    # whole plane is congested, and no EV of it is penalized). A loss on a path marked within
    # that long before the packet left is congestion, not failure: no retirement
    ecn_steering: bool = True
    ecn_penalty_rtts: float = 4.0
    ecn_penalty_min: float = 0.001
    ecn_penalty_max_fraction: float = 0.5
    # congestion without marks (docs/EV_HEALTH.md, "Congestion without marks"): an RTT sample
    # more than max(delay_evidence_min, delay_evidence_fraction x its plane's base RTT) above
    # that base is queueing delay on its path, and a loss there is congestion, not failure,
    # unless the path keeps losing (both 0: off; every loss without a mark is failure)
    delay_evidence_min: float = 0.0005
    delay_evidence_fraction: float = 0.5
    # a loss with no such evidence, on a known route, asks the route: a probe on its EV, and
    # the loss is congestion (within an episode, as after a delay rise) if the route answers
    # a probe sent after the lost packet (off: it waits for the route's next data packet)
    ask_routes: bool = True
    # EVs of one route (an SRv6 path) share its fate: once this many of them are assumed bad,
    # the route's other EVs leave the rotation too (0: off; needs route labels)
    route_dead_evs: int = 2
    # a plane that lost some of its routes gets a share of the spray in proportion to the
    # routes it has left (off: every plane an equal share). It helps where hosts share the
    # spine links and hurts where each host's NIC is the bottleneck, which is why it is off
    # (docs/EV_HEALTH.md, "A plane's share can follow its live routes")
    route_weighted_planes: bool = False
    # planes' shares follow their delays: a plane whose smallest RTT over 4 round trips
    # exceeds the best plane's by more than plane_steer_margin x that + 1 ms, twice in a row,
    # gives up share (down to plane_steer_floor of an equal share) and wins it back once level
    # (mrc.core.planesteer, docs/EV_HEALTH.md "Plane shares"). None: the window law's default
    # (on with NSCC; off with a fixed window, whose standing queues say how the window was set,
    # not what the planes can carry)
    plane_steering: bool | None = None
    plane_steer_margin: float = 0.5
    plane_steer_floor: float = 0.25

    def validate(self) -> None:
        """Raise ValueError with a user-facing message for impossible EV settings."""
        if not 0 <= self.ecn_penalty_rtts <= 1000:
            raise ValueError("ecn_penalty_rtts must be between 0 and 1000")
        if not 0 <= self.ecn_penalty_min <= 10:
            raise ValueError("ecn_penalty_min must be between 0 and 10 seconds")
        if not 0 <= self.ecn_penalty_max_fraction < 1:
            raise ValueError("ecn_penalty_max_fraction must be >= 0 and < 1")
        if not 0 <= self.delay_evidence_min <= 10:
            raise ValueError("delay_evidence_min must be between 0 and 10 seconds")
        if not 0 <= self.delay_evidence_fraction <= 100:
            raise ValueError("delay_evidence_fraction must be between 0 and 100")
        if not 0 <= self.reverse_probe_interval <= 10:
            raise ValueError("reverse_probe_interval must be between 0 and 10 seconds")
        if not 0 <= self.reverse_probes_per_plane <= 64:
            raise ValueError("reverse_probes_per_plane must be between 0 and 64")


#: source ports per route a QP may open (QPConfig.source_ports)
MAX_SOURCE_PORTS = 1024


@dataclass(slots=True)
class QPConfig(EVConfig):
    """Everything a QP needs to know that is not negotiated with the peer.

    ``max_outstanding`` bounds packets in flight (the cap of the congestion window, ``cc``;
    the window itself with ``cc="fixed"``); ``psn_window`` bounds how far ahead of the oldest
    unacknowledged packet a sender may go, and is also the span of PSNs a receiver accepts
    ahead of its cumulative point.
    """

    payload_size: int = 1400
    max_outstanding: int = 512
    psn_window: int = 16384
    # WRITE_IMMs posted and not yet completed (mrc.h's MRC_QP_MAX_WIMM): one more is refused
    # by post_write, and awaited by Connection.write
    max_imm_outstanding: int = 256
    # WRITE_IMMs this side takes in flight as a responder (MRC_QP_MAX_WIMM_DEST): announced to
    # the peer at set-up, whose senders then keep below the smaller of their cap and this one
    max_imm_dest: int = 256
    ack_every: int = 16
    ack_delay: float = 0.0005
    # the ACKs that fall due while one receive batch is taken in go out as one, at its end,
    # unless this many packets arrived unacknowledged (1: each at once, as it falls due)...
    ack_batch_max: int = 64
    # ...or, if that is more packets, this many bytes of datagrams (0: packets only): at
    # 1400-byte payloads an ACK per 64 packets cost the sender a fifth of its CPU
    # (docs/PERFORMANCE.md, "An ACK per bytes owed, not per 64 packets")
    ack_batch_bytes: int = 384 << 10
    initial_rto: float = 0.1
    min_rto: float = 0.05
    max_rto: float = 1.0
    max_timeout_retries: int = 12
    max_nack_retries: int = 1000
    spray_seed: int = 0
    # SACK-based loss detection: a packet is lost once one sent this much later was acked
    reorder_min: float = 0.002
    # tail loss probe: resend the newest packet after max(tlp_min, 2 srtt) without an ACK
    tlp_min: float = 0.005
    # tail loss probes in a row without news, each after twice the previous wait, before the
    # RTO is left to act: a single probe lost as well (the receiver starved for a moment, or
    # the probe's EV on a path that just died) would otherwise cost a whole min_rto
    tlp_max: int = 3
    # ... and at least this fraction of srtt: a whole one, so that the first windows of a run,
    # queued 10-30 ms, are not taken for losses on healthy routes (docs/EV_HEALTH.md, "Limits")
    reorder_srtt_fraction: float = 1.0
    # new packets sent back to back on one EV before the next EV is drawn: the transport sends
    # such a burst as one GSO send (one skb through the kernel) and the receiver takes it in one
    # GRO receive; 1 sprays every packet (docs/PROTOCOL.md section 2). A window law may size
    # bursts itself below this maximum (NSCC: what one plane drains in burst_delay_fraction of
    # the target delay at the rate measured so far, 1 before any rate is known, so that a
    # burst never queues long enough to read as congestion; docs/PERFORMANCE.md, "Bursts").
    # None (the default): the law's default_burst (AUTO_BURST with NSCC, 1 with the fixed window)
    burst: int | None = None
    burst_delay_fraction: float = 0.5
    # with NSCC, bursts are also cut so that one window holds at least this many per plane
    burst_spread: int = 4
    # bursts may also be one plane's share of what the window lets go at once (whatever the
    # law chose): sprayed, those packets would fill each plane's NIC queue just the same
    # (docs/PERFORMANCE.md, "Bursts"); 0: the law's size alone
    burst_batch: bool = True
    # bursts of payloads of at most this many bytes are gathered: their datagrams copied back
    # to back into one send buffer, which the kernel takes faster than two views a datagram,
    # and no view is made per packet. The copy costs more than that saves at 8 KiB, less at
    # 1400 bytes (docs/PERFORMANCE.md, "Fewer objects per packet at the sender"); 0: never.
    # Not with keys (sealing makes its own buffers)
    gather_max: int = 2048
    # congestion control: the window law's name (mrc/core/cc/, docs/CONGESTION.md): "nscc",
    # UET 1.0's NSCC capped by max_outstanding; "nscc-mrc", mrc's own NSCC-style law; "fixed",
    # a window of max_outstanding packets; another registered name, or a MODULE:CLASS law
    # from a module or file that mrc.core.cc.load() loaded in this process first (the config
    # only names laws: checking it never imports code)
    cc: str = "nscc"
    # the law's parameters, by the names of its Params fields (nscc: mrc.core.cc.UetNsccParams);
    # what is not given takes the law's default. Text form: --qp cc.NAME=VALUE
    cc_params: dict[str, float | int | bool] = field(default_factory=dict)
    # UDP source ports (one socket each) per route, on IPv6: the EVs of a route share them and
    # differ by IPv6 flow label (an EV is 32 bits, port and label: docs/PROTOCOL.md section 2).
    # Raise it where switches hash the UDP ports but not the flow label. Over IPv4, where no
    # flow label is carried, every EV has a port of its own whatever this says
    source_ports: int = 1
    # the QP's line rate, bits/s summed over its planes (its NICs' speeds, or a topology
    # file's plane rate), for the window law: nscc caps its window at 1.5 x this x the base
    # RTT it measures unless cc.max_cwnd is given. None: unknown (no such cap)
    line_rate_bps: float | None = None

    @property
    def per_send(self) -> int:
        """Data packets one GSO send carries at ``payload_size`` (a WRITE_IMM's header, the
        longer one, counted), at least 1."""
        return max(1, GSO_MAX_BYTES // (self.payload_size + DATA_IMM_HDR_LEN))

    @property
    def burst_max(self) -> int:
        """``burst``, or what leaving it unset means for this window law: its default_burst,
        and for a law that sizes its bursts (``AUTO_BURST``, NSCC) raised at small payloads to
        what one GSO send carries (at most ``MAX_BURST``).

        Why: the default was chosen in packets at 8 KiB (16, two GSO sends of 7); at 1400
        bytes 16 packets are a third of one send, so each ``sendmsg``, GRO receive and
        burst's Python carried a third of what the kernel takes (docs/PERFORMANCE.md,
        "Bursts and ACKs at 1400 bytes"). In bytes a burst stays below the 8 KiB default's. The law
        still sizes each burst below this (its delay budget and spread)."""
        if self.burst is not None:
            return self.burst
        auto = law_class(self.cc).default_burst
        if auto == AUTO_BURST:
            return max(auto, min(self.per_send, MAX_BURST))
        return auto

    def validate(self) -> None:
        """Raise ValueError with a user-facing message for impossible settings."""
        if not 1 <= self.payload_size <= 65_000:
            raise ValueError(f"payload size must be 1..65000 bytes, not {self.payload_size}")
        if self.max_outstanding < 1:
            raise ValueError("max_outstanding must be at least 1")
        if not PSN_WINDOW_MIN <= self.psn_window <= PSN_WINDOW_MAX:
            raise ValueError(f"psn_window must be between {PSN_WINDOW_MIN} and {PSN_WINDOW_MAX}")
        if self.max_outstanding > self.psn_window:
            raise ValueError("max_outstanding cannot exceed psn_window")
        if not 1 <= self.max_imm_outstanding <= 1 << 20:
            raise ValueError(
                f"max_imm_outstanding must be 1..{1 << 20}, not {self.max_imm_outstanding}"
            )
        if not 1 <= self.max_imm_dest <= 1 << 20:
            raise ValueError(f"max_imm_dest must be 1..{1 << 20}, not {self.max_imm_dest}")
        if self.burst is not None and not 1 <= self.burst <= MAX_BURST:
            raise ValueError(f"burst must be 1..{MAX_BURST} packets, not {self.burst}")
        if not 0 < self.burst_delay_fraction <= 4:
            raise ValueError("burst_delay_fraction must be > 0 and <= 4")
        if self.burst_spread < 1:
            raise ValueError("burst_spread must be at least 1")
        if not 0 <= self.gather_max <= 65000:
            raise ValueError(f"gather_max must be 0..65000 payload bytes, not {self.gather_max}")
        if not 1 <= self.source_ports <= MAX_SOURCE_PORTS:
            raise ValueError(
                f"source_ports must be 1..{MAX_SOURCE_PORTS} per route, not {self.source_ports}"
            )
        if self.ack_every < 1:
            raise ValueError("ack_every must be at least 1")
        if self.ack_batch_max < 1:
            raise ValueError("ack_batch_max must be at least 1")
        if self.ack_batch_bytes < 0:
            raise ValueError("ack_batch_bytes must be >= 0")
        if self.tlp_max < 0:
            raise ValueError("tlp_max must be >= 0")
        if self.line_rate_bps is not None and not self.line_rate_bps > 0:
            raise ValueError("line_rate_bps must be > 0 bits/s, or None (unknown)")
        params_of(self.cc, self.cc_params)  # the law is registered, its parameters fit it
        EVConfig.validate(self)
        if not 0 < self.min_rto <= self.initial_rto <= self.max_rto:
            raise ValueError("need 0 < min_rto <= initial_rto <= max_rto")
