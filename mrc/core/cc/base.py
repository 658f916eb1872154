"""What the requester asks of a window law, and what it does when a law does not say.

A *window law* decides how many packets a queue pair may have in the network and reacts to
the signals a sprayed, trimming fabric gives: ACKs (bytes acknowledged, an RTT sample, the CE
echo), trims, losses and timeouts. The requester (mrc/core/requester.py) keeps everything
else: which packets are in flight, what is resent, which EV carries what. It calls the hooks
below and reads ``limit`` before every send; nothing else of a law is looked at, so a new law
is one class (see examples/dctcp_window.py and docs/CONGESTION.md, "Writing a window law").

The base class is a complete law: every hook does nothing and ``limit`` stays at
``max_outstanding``, which is exactly the fixed window (:class:`~mrc.core.cc.fixed.FixedWindow`).
A law overrides what it reacts to. Sans-IO like the rest of the core: time comes in as ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from mrc.core.counters import CounterSpec

# the most bytes of datagrams (MRC headers + payloads) one UDP GSO send carries: an IPv6
# payload (65535) less the UDP header and room for an SRH (mrc/transport/gso.py)
GSO_MAX_BYTES = 65000
# QPConfig.burst left unset: the most packets per burst a window law that sizes its bursts
# (NSCC) may choose (docs/PERFORMANCE.md, "Bursts": past about 16 x 8 KiB the kernel's GSO gains
# little and a burst's queueing grows); at payloads where one GSO send carries more than this,
# that many (QPConfig.burst_max)
AUTO_BURST = 16


class QPSettings(Protocol):
    """What :meth:`LawContext.of` reads of a QP's settings (a ``QPConfig`` is one): the laws
    need not know the config's class, nor the config theirs (no import circle, issue 41)."""

    @property
    def payload_size(self) -> int: ...
    @property
    def max_outstanding(self) -> int: ...
    @property
    def burst_delay_fraction(self) -> float: ...
    @property
    def burst_spread(self) -> int: ...
    @property
    def line_rate_bps(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class LawContext:
    """What a window law is told of its QP (of ``QPConfig``, by the same names).

    ``payload_size``: bytes of payload per packet, the unit of ``limit``; ``max_outstanding``:
    the cap of ``limit`` whatever the law says; ``burst_delay_fraction`` and ``burst_spread``:
    how bursts are paced and spread (``QPConfig``'s comments say how); ``line_rate_bps``: the
    QP's line rate, bits/s summed over its planes, None where unknown (the host's NICs or the
    topology file say it; a law may bound its window by it and the base RTT it measures).
    """

    payload_size: int
    max_outstanding: int
    burst_delay_fraction: float = 0.5
    burst_spread: int = 4
    line_rate_bps: float | None = None

    @classmethod
    def of(cls, settings: QPSettings) -> LawContext:
        """The context of a QP of ``settings`` (its ``QPConfig``)."""
        return cls(
            payload_size=settings.payload_size,
            max_outstanding=settings.max_outstanding,
            burst_delay_fraction=settings.burst_delay_fraction,
            burst_spread=settings.burst_spread,
            line_rate_bps=settings.line_rate_bps,
        )


@dataclass(frozen=True, slots=True)
class NoParams:
    """The parameters of a law that has none."""

    def validate(self) -> None:
        """Nothing to check."""


class WindowLaw:
    """A congestion window for one queue pair: the hooks the requester calls.

    Construction: ``Law(params, ctx)``, ``params`` an instance of the law's ``Params``
    dataclass (validated, from ``QPConfig.cc_params``), ``ctx`` the QP's
    :class:`LawContext` (``payload_size`` is the packet's payload, the unit of ``limit``;
    ``max_outstanding`` caps it whatever the law says). A law's ``__init__`` sets ``limit``
    (this one: ``max_outstanding``).

    Units: bytes are payload bytes, times are seconds on the caller's clock (``now``).
    """

    __slots__ = ("limit",)

    #: the law's parameters: a dataclass whose fields are int, float or bool, each with a
    #: default; an optional ``validate()`` raises ValueError naming the bad one
    #: (``cc.<field> must be ...``). Set from text as ``--qp cc.<field>=VALUE``.
    Params: ClassVar[type[Any]] = NoParams
    #: the most packets per EV burst when ``QPConfig.burst`` is unset: 1 sprays every packet;
    #: :data:`AUTO_BURST` suits a law whose :meth:`burst` sizes bursts
    default_burst: ClassVar[int] = 1
    #: the default of ``QPConfig.plane_steering`` (planes' shares follow their delays). Off
    #: for a law that keeps standing queues: they say how the window was set, not what the
    #: planes can carry
    plane_steering: ClassVar[bool] = False
    #: ask for an ACK of the last packet of every send at once (AckReq), not after the
    #: receiver's ``ack_delay``: a law that reads queueing from RTT samples needs them
    #: free of that delay whenever its window is below the receiver's ``ack_every``
    prompt_acks: ClassVar[bool] = False
    #: the law finds the window itself, and ``max_outstanding`` is only its cap (mrc-bench
    #: then defaults to a large cap); False: ``max_outstanding`` is the window
    adaptive: ClassVar[bool] = True
    #: the law's counters (``Source.CC``), each read from its attribute (``attr`` or
    #: ``name``): they reach ``Connection.counters()`` and ``stats()``; those of the laws mrc
    #: ships also reach the Prometheus exporter and ``--json`` (mrc/counter_registry.py)
    COUNTERS: ClassVar[tuple[CounterSpec, ...]] = ()

    #: packets the law lets into the network: new data and retransmissions alike, not
    #: counting packets known to be out of it (queued for a resend). At least 1; read before
    #: every send, so a law keeps it current rather than computing it on demand
    limit: int

    def __init__(self, params: Any, ctx: LawContext) -> None:
        self.limit = ctx.max_outstanding

    def burst(self, most: int, planes: int) -> int:
        """Packets per EV burst now, 1..``most`` (``most`` > 1: ``QPConfig.burst`` or
        ``default_burst``), over ``planes`` planes. Called before every send."""
        return most

    def pace_gap(self) -> float:
        """Seconds the requester waits after a packet before the next one (tail loss probes
        excepted), or 0.0: the window alone limits. Called before every send; the requester
        keeps the wake-up time and asks its timer for it."""
        return 0.0

    def on_resume(self, now: float) -> None:
        """The sender has new work after an idle spell (nothing queued, nothing in flight)."""

    def on_ack(self, now: float, acked: int, rtt: float | None, ce: bool) -> None:
        """An ACK acknowledged ``acked`` new payload bytes (0: none, but an RTT sample).
        ``rtt``: the round trip of its subject, the packet that triggered it (None: no sample,
        e.g. the subject was resent and either copy may have been acknowledged; Karn's rule).
        ``ce``: the subject arrived CE-marked (the receiver's echo, BECN); ECN reaches a law
        only this way, with the ACK that carries it."""

    def on_host_delay(self, now: float, delay: float) -> None:
        """Of the RTT sample the next :meth:`on_ack` brings, ``delay`` seconds were spent in
        the two hosts, not the network: the subject's wait in the receiver (its socket's
        queue and the time until the ACK left, the ACK's ACK Delay) and the ACK's wait here.
        Called only where both hosts measured it (kernel receive timestamps); a userspace
        host's batching makes it a large part of a short path's round trip. This law
        ignores it."""

    def on_trim(self, now: float, rtt_hint: float) -> None:
        """A NACK says a packet was trimmed: a queue on its path overflowed now.
        ``rtt_hint``: the trimmed packet's send time to now (the NACK's round trip: its
        header overtook the queue)."""

    def on_loss(self, now: float) -> None:
        """SACKs show packets lost (once per ACK that finds any). Over sprayed paths a loss
        is as likely a dead path, which EV health handles, as a full queue."""

    def on_timeout(self, now: float) -> None:
        """A packet's retransmission timer fired (once per packet)."""
        self.on_loss(now)

    def start_within(self, packets: int) -> None:
        """The receiver takes at most ``packets`` (at least 1) from this QP before it can
        say anything: its share of the receive buffer that every QP into that host fills
        (its welcome's ``start_bytes``). Called once, before the first send. A law whose
        first window is larger starts at this one and grows from there as usual; this one
        (a fixed window, what it was asked to be) ignores it."""

    def join(self, peers: dict[str, Any]) -> None:
        """This QP's sender shares its host with other QPs to the same peer: ``peers`` is one
        dict per (process, peer host), the same object for all of them, where a law may keep
        what they measure in common (NSCC: the smallest round trip any of them saw). Called
        once, before the first send, by the connection layer; a law that shares nothing
        ignores it."""

    def leave(self) -> None:
        """The QP is closed: let go of what :meth:`join` shared (called at most once more
        than it matters: a second call must do nothing)."""

    def counters(self) -> dict[str, int]:
        """The law's counters (:attr:`COUNTERS`) by name, as they stand."""
        return {spec.name: spec.read(self) for spec in self.COUNTERS}
