"""NSCC as UET 1.0 defines it (``QPConfig.cc = "nscc"``, the default, or ``"uet-1.0-nscc"``,
mrc_ctl.h's name for it): one queue pair's window.

UET's network-signal-based congestion control, written from the public description of the
algorithm (the UET 1.0 specification's NSCC and the Ultra Ethernet Consortium's htsim model of
it), with its parameters named as OCP's ``mrc_ctl.h`` names them (``struct
mrc_ctl_cc_nscc_cfg``). Its difference from mrc's own law, ``nscc-mrc`` (mrc/core/cc/nscc.py), is
what it does with the two signals together. Per ACK, with ``d`` the queueing delay of the
ACK's subject (its RTT minus the base RTT) and ``T`` the target delay:

=============  ==========================================================================
no CE, d < T   *proportional increase*: the window grows by a gain times ``T - d`` (and
               by ``fi_scale`` per acknowledged byte, *fast increase*, after a whole
               window with next to no queue)
no CE, d >= T  *fair increase*: a fixed ``fi`` per round trip, the same for every flow, so
               that flows sharing a queue converge; delay alone never cuts the window
CE, d >= T     *multiplicative decrease*, at most once per base RTT, by ``gamma`` times the
               excess of the *average* delay over the target, at most ``max_md_jump``
CE, d < T      NOOP: the mark is about a queue this flow is not building
=============  ==========================================================================

Increases are collected and applied together (``cwnd += collected / cwnd``) once
``adjust_bytes_threshold`` bytes were acknowledged or ``adjust_period_threshold`` passed;
after a period without one, the window also gains ``eta``. *Quick adapt*: once per base RTT +
target, if a trim NACK, a loss, or a delay over ``qa_threshold`` came and the flow delivered
less than ``max_cwnd >> qa_gate`` in that time, the window becomes what it delivered; the ECN
marks of packets already in flight are then ignored. A trim NACK otherwise takes one packet
off the window, and so does a loss (a timeout does not, see ``on_timeout``): losses over
sprayed paths are the EV health's to handle (a dead path, not a full queue). The window stays
between one packet and ``max_cwnd`` (1.5 x the bandwidth-delay product).

Where this must differ from a NIC (docs/CONGESTION.md, "Where it must differ from a NIC's"):

* UET scales its gains by the network's BDP against a reference network (100 Gbit/s x 12 us,
  37 packets of 4 KiB) and its target against the reference RTT. A NIC knows its link speed
  and the fabric's RTT; a socket does not. The scaling factor is ``max_cwnd``'s BDP when
  that is given, else a constant (``initial_window`` packets): one each flow measured would
  make the fair increase unfair. The window's bound, ``max_cwnd``, is measured unless given:
  1.5 x the best delivery rate any QP of this process to the same peer host saw, times the
  base RTT plus the target; and, when the QP's line rate is known (``QPConfig.line_rate_bps``:
  its NICs' speeds or a topology file's plane rate), at most UET's own 1.5 x that rate x the
  base RTT measured so far, so that a fabric that neither trims nor marks is not overrun into
  tail drops (docs/CONGESTION.md, "A window from the line rate"). The time-valued gains
  scale by the base RTT where UET's use 12 us: the law behaves on a 1 ms path as UET's does
  on a 12 us one.
* Trim NACKs do not lower the base RTT (UET's ``update_base_rtt_on_nack``): a data packet's
  own serialization is much of the round trip at these link rates, and a trimmed header has
  none.
* A timeout does not take a packet off the window (``on_timeout``).
* Where no port marks ECN nor trims, UET's law never cuts the window for delay, and a queue
  that tail-drops fills up to its limit. A loss that came with a queue teaches the depth the
  path drops at (``loss_delay``), and a delay over ``cc.loss_delay_fraction`` of it reads as
  a CE mark: the window backs off, by the queue's excess over that threshold, before the
  queue overflows again, by the share of the window that meets the queue (docs/CONGESTION.md,
  "A queue's depth learned from its losses"; ``cc.loss_delay_fraction=0`` is UET's law).
* UET counts the bytes in flight when quick adapt cuts (its marks are then ignored); the law
  does not see them and takes the window before the cut (it was full, or the flow would not
  have queued).
* UET's ACK covers a packet; here one ACK may cover several (``ack_every``): the delay
  average weighs a sample by the packets it acknowledges, as if they had come one by one.

Sans-IO: time comes in as ``now``; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrc import wire
from mrc.core.cc.base import AUTO_BURST, GSO_MAX_BYTES, LawContext, WindowLaw
from mrc.core.cc.nscc import MrcNscc, burst_packets

_INF = float("inf")
#: UET's reference network: 100 Gbit/s x 12 us = 150 kB, in 4 KiB packets (its MTU). Gains
#: given "per packet x scaling factor" mean this many of them per reference BDP
REFERENCE_BDP_PACKETS = 150_000 / 4096
#: UET's target is 0.75 of the network RTT where the fabric trims (its reference b factor)
TARGET_RTT_FRACTION = 0.75
#: UET's max_cwnd: 1.5 x the network's bandwidth-delay product (its line rate x base RTT)
MAX_CWND_BDP = 1.5
#: a full packet's round trip crosses at least this many store-and-forward links (host to
#: leaf, leaf to spine, spine to leaf, leaf to host), each taking the packet's whole
#: serialization at no more than the line rate: the least round trip the line's BDP counts
SERIALIZING_LINKS = 4
#: fast increase starts below 1 us of queueing delay on a 12 us network: 1/12 of the base RTT
FAST_INCREASE_FRACTION = 1 / 12
#: the weight of one host delay sample in its average (srtt's, RFC 6298)
HOST_DELAY_GAIN = 1 / 8
#: with ``cc.host_delay`` the host delay enters the bound over this many windows delivered
#: without a loss, trim or timeout, from none at the QP's first ACK and again after each
HOST_DELAY_RAMP = 32
#: with ``cc.host_delay``, round trips whose network part (an RTT sample less its host delay
#: sample and the base RTT; smoothed with ``HOST_DELAY_GAIN``) is over this, seconds, or over
#: the target or the host delay itself if longer, show a network queue: the bound counts no
#: host delay while they do (one 8 KiB packet at 100 Mbit/s is 0.66 ms; one descheduled
#: sender is a single sample; below the host delay, it is what the hosts' measures miss)
HOST_DELAY_NET_QUEUE = 0.5e-3
#: the most of one host delay sample that counts as the hosts', seconds; the rest is a queue.
#: Part of the hosts' delay is the receiver's socket queue, which every QP into that host
#: fills: 256 QPs into one host on loopback measured 30-50 ms of "host delay" with RTTs of
#: 60 ms, and taking it all for the hosts' left quick adapt nothing to cut for (receive
#: buffer drops and timeouts rose). A host's own batches and sends take 0.2-1.7 ms under load
HOST_DELAY_MAX = 2e-3
#: the weight of one queueing delay sample in the recent delay a loss is learned from (srtt's)
RECENT_DELAY_GAIN = 1 / 8
#: the weight of a loss's recent delay in the learned loss depth (``loss_delay``)
LOSS_DELAY_GAIN = 1 / 4


@dataclass(frozen=True, slots=True)
class UetNsccParams:
    """UET NSCC's parameters (``QPConfig.cc_params``, ``--qp cc.NAME=VALUE``), named as the
    fields of ``mrc_ctl.h``'s ``struct mrc_ctl_cc_nscc_cfg``; times in seconds and sizes in
    bytes where ``mrc_ctl`` has nanoseconds and bytes. 0 for a derived default."""

    #: quick adapt off (``disable_qa``)
    disable_qa: bool = False
    #: apply the collected increases after this many acknowledged bytes (0: 8 packets)
    adjust_bytes_threshold: int = 0
    #: ... or after this long, seconds, when ``eta`` is added too (0: the base RTT)
    adjust_period_threshold: float = 0.0
    #: the network's round trip, seconds (0: measured, the smallest RTT sample)
    base_rtt: float = 0.0
    #: the additive increase per adjust period, packets x the BDP scaling factor
    eta: float = 0.15
    #: the fair increase per round trip, packets x the BDP scaling factor
    fi: float = 5.0
    #: the fast increase per acknowledged byte, x the BDP scaling factor
    fi_scale: float = 0.25
    #: the multiplicative decrease's weight of the average delay's excess over the target
    gamma: float = 0.8
    #: the largest multiplicative decrease, a fraction of the window
    max_md_jump: float = 0.5
    #: the largest window, bytes (0: 1.5 x the measured BDP, within max_outstanding)
    max_cwnd: int = 0
    #: quick adapt only while the flow delivered less than max_cwnd >> qa_gate per period
    qa_gate: int = 3
    #: a delay over this, seconds, triggers quick adapt (0: 4 x the target)
    qa_threshold: float = 0.0
    #: the queueing delay to aim at, seconds (0: 0.75 x the base RTT, UET's with trimming)
    target_delay: float = 0.0
    #: the window before a rate was measured, packets (UET starts at max_cwnd; the BDP is
    #: not known here until a round trip was measured)
    initial_window: int = 16
    #: the weight of one packet's delay sample in the average (UET's 0.0125)
    delay_alpha: float = 0.0125
    #: the base RTT and the best rate are those of every QP of this process to the same peer
    #: host (as ``nscc-mrc``'s, docs/CONGESTION.md, "Latecomers")
    shared_base: bool = True
    #: the window's bound counts the hosts' delay in the round trip (``on_host_delay``):
    #: the base RTT plus the smoothed host delay, as much of it as was earned, is its time
    #: basis (docs/CONGESTION.md, "Host delay", "On by default"). Off: the base RTT alone,
    #: UET's bound, which holds a userspace host to its idle turnaround
    host_delay: bool = True
    #: where no port marks: a queueing delay over this fraction of the one losses came at
    #: (learned, ``loss_delay``) counts as a CE mark, so that the window backs off before
    #: the queue overflows again (docs/CONGESTION.md, "A queue's depth learned from its
    #: losses"; 0: off, UET's law). On the netns fabric, untold, it took the clean
    #: all-to-all's timeouts from about 25 a run to 0 at the same speed or better, and with a
    #: link down as fast as without it
    loss_delay_fraction: float = 0.8

    def validate(self) -> None:
        """Raise ValueError, one line naming the parameter, for an impossible setting."""
        for name in ("adjust_period_threshold", "base_rtt", "qa_threshold", "target_delay"):
            if not 0 <= getattr(self, name) <= 10:
                raise ValueError(f"cc.{name} must be between 0 and 10 seconds")
        for name in ("eta", "fi", "fi_scale"):
            if not 0 <= getattr(self, name) <= 1000:
                raise ValueError(f"cc.{name} must be between 0 and 1000")
        if not 0 <= self.gamma <= 1:
            raise ValueError("cc.gamma must be between 0 and 1")
        if not 0 < self.max_md_jump < 1:
            raise ValueError("cc.max_md_jump must be > 0 and < 1")
        if not 0 <= self.qa_gate <= 16:
            raise ValueError("cc.qa_gate must be between 0 and 16")
        if self.adjust_bytes_threshold < 0 or self.max_cwnd < 0:
            raise ValueError("cc.adjust_bytes_threshold and cc.max_cwnd must be >= 0 bytes")
        if self.initial_window < 1:
            raise ValueError("cc.initial_window must be at least 1 packet")
        if not 0 < self.delay_alpha <= 1:
            raise ValueError("cc.delay_alpha must be > 0 and <= 1")
        if not 0 <= self.loss_delay_fraction <= 10:
            raise ValueError("cc.loss_delay_fraction must be between 0 and 10")


class UetShare:
    """What the windows of one process's QPs to one peer host share: the smallest round trip
    and the best delivery rate any of them saw."""

    __slots__ = ("base_rtt", "best_rate")

    def __init__(self) -> None:
        self.base_rtt = _INF
        self.best_rate = 0.0


class UetNscc(WindowLaw):
    """UET 1.0's NSCC for one sender (see the module docstring)."""

    COUNTERS = MrcNscc.COUNTERS  # decreases, quick adapts, losses not acted on (timeouts)

    __slots__ = (
        "p",
        "mss",
        "cap",
        "line_rate",
        "cwnd",
        "target",
        "base_rtt",
        "best_rate",
        "avg_delay",
        "host_delay",
        "_widen",
        "_host_sample",
        "net_delay",
        "shared",
        "scaling",
        "decreases",
        "quick_adapts",
        "losses_ignored",
        "trace",
        "burst_delay_fraction",
        "burst_spread",
        "per_send",
        "_inc",
        "_received",
        "_achieved",
        "_ignored",
        "_to_ignore",
        "_trigger_qa",
        "_qa_end",
        "_last_adjust",
        "_last_decrease",
        "_fi_count",
        "_increasing",
        "_delivered",
        "_rate_mark",
        "loss_delay",
        "recent_delay",
        "virtual_marks",
        "_marking",
        "_over_bytes",
        "_seen_bytes",
        "_seen_since",
    )

    Params = UetNsccParams
    default_burst = AUTO_BURST
    plane_steering = True
    prompt_acks = True

    def __init__(self, params: UetNsccParams, ctx: LawContext) -> None:
        self.p = params
        self.mss = ctx.payload_size
        self.cap = float(ctx.payload_size * ctx.max_outstanding)
        #: the QP's line rate, bytes/s over all its planes (0.0: unknown)
        self.line_rate = (ctx.line_rate_bps or 0.0) / 8
        self.cwnd = float(self.mss * max(1, min(params.initial_window, ctx.max_outstanding)))
        # UET's scaling factor a: the network's BDP over the reference network's. The
        # network's, not the flow's: the fair increase is fair only if every flow through a
        # queue adds the same. Given max_cwnd, its BDP; else initial_window packets, a
        # constant too (a BDP each flow measured grew the flows that got a larger share early
        # faster: in an incast 15 -> 1 in the simulator, one flow finished at 0.23 x the
        # ideal time and the last at 1.6 x)
        if params.max_cwnd:
            self.scaling = params.max_cwnd / 1.5 / (REFERENCE_BDP_PACKETS * self.mss)
        else:
            self.scaling = params.initial_window / REFERENCE_BDP_PACKETS
        self.base_rtt = params.base_rtt or _INF
        self.target = params.target_delay or 0.0
        self.best_rate = 0.0  # bytes/s, the most delivered over one base RTT + target
        self.avg_delay = 0.0
        #: the smoothed host delay, seconds (0.0: none measured; on_host_delay)
        self.host_delay = 0.0
        self._widen = 0.0  # the share of host_delay the bound counts now (0 to 1)
        self._host_sample: float | None = None  # the host delay of the next on_ack's RTT
        #: the RTT's network part over the base RTT, smoothed (host delay's gain), seconds
        self.net_delay = 0.0
        self.shared: UetShare | None = None
        self.decreases = 0
        self.quick_adapts = 0
        self.losses_ignored = 0  # timeouts, which take nothing off the window (on_timeout)
        self.virtual_marks = 0  # delays read as CE marks (cc.loss_delay_fraction)
        #: (time, cwnd in bytes) after every change, once set to a list (tests, plots)
        self.trace: list[tuple[float, float]] | None = None
        self.burst_delay_fraction = ctx.burst_delay_fraction
        self.burst_spread = ctx.burst_spread
        self.per_send = max(1, GSO_MAX_BYTES // (self.mss + wire.DATA_IMM_HDR_LEN))
        self._inc = 0.0  # increases collected until the next adjustment, bytes x bytes
        self._received = 0  # bytes acknowledged since the last adjustment
        self._achieved = 0  # bytes acknowledged since the quick adapt period began
        self._ignored = 0  # bytes acknowledged or NACKed since the last quick adapt
        self._to_ignore = 0  # ... until which CE marks are ignored
        self._trigger_qa = False
        self._qa_end = 0.0  # 0: quick adapt not armed yet (UET's first period only arms)
        self._last_adjust = -_INF
        self._last_decrease = -_INF
        self._fi_count = 0  # bytes acknowledged in a row with next to no queueing
        self._increasing = False  # fast increase under way
        self._delivered = 0  # bytes acknowledged in all
        self._rate_mark: tuple[float, int] | None = None  # (time, _delivered): rate sampling
        #: the queueing delay this QP's losses came at, smoothed, seconds (0.0: none learned;
        #: _learn_loss)
        self.loss_delay = 0.0
        #: the queueing delay of the latest samples, smoothed (RECENT_DELAY_GAIN), seconds
        self.recent_delay = 0.0
        #: a port on the path marks CE or trims: its signals, not a learned depth, say when
        #: to back off (no virtual marks from then on)
        self._marking = False
        #: bytes acknowledged whose delay read as a mark, and all bytes acknowledged with a
        #: sample, since ``_seen_since`` (the last virtual decrease, or two round trips)
        self._over_bytes = 0
        self._seen_bytes = 0
        self._seen_since = -_INF
        self._retarget()
        self._set(0.0, self.cwnd)

    # ---- derived quantities ----------------------------------------------------------

    @property
    def interval(self) -> float:
        """A round trip at the target: the base RTT plus the target delay."""
        return self.base_rtt + self.target

    @property
    def basis(self) -> float:
        """The round trip without queues that the window's bound is reckoned over: the base
        RTT, plus with ``cc.host_delay`` the hosts' smoothed delay, as much of it as the
        round trips since the last loss allow (:meth:`_calm`). A userspace host's
        smallest RTT sample is an idle turnaround; under load both ends handle datagrams in
        batches, and each waits in a socket queue and for its batch, which no network queue
        explains (docs/CONGESTION.md, "Host delay"). The target and the delay signal stay
        the network's."""
        return self.base_rtt + self._widen * self.host_delay

    @property
    def bdp(self) -> float:
        """The bandwidth-delay product the window is bounded by, bytes: UET's max_cwnd / 1.5
        when given, else the best rate measured (this QP's or, shared, any QP's to the same
        peer) over a round trip at the target, host delay included (:attr:`basis`; until
        then, ``initial_window``)."""
        if self.p.max_cwnd:
            return self.p.max_cwnd / 1.5
        rate = self.best_rate
        if self.shared is not None and self.shared.best_rate > rate:
            rate = self.shared.best_rate
        if rate <= 0.0 or self.base_rtt == _INF:
            return self.mss * float(self.p.initial_window)
        return rate * (self.basis + self.target)

    @property
    def line_cap(self) -> float:
        """UET's max_cwnd from what the host knows, bytes: 1.5 x the line rate x the base RTT
        measured so far, host delay included (:attr:`basis`), but at least a full packet's
        serialization over ``SERIALIZING_LINKS`` links (6 packets); infinite while either is
        unknown."""
        if not self.line_rate or self.base_rtt == _INF:
            return _INF
        # a NIC's base RTT includes its packets' serialization; a shaper with a burst (tbf,
        # as the netns fabric's links) can pass a packet in a fraction of it on an idle path,
        # and a base RTT from that bounded each QP of a 100 Mbit/s fabric at one packet
        least = SERIALIZING_LINKS * self.mss / self.line_rate
        return MAX_CWND_BDP * self.line_rate * max(self.basis, least)

    @property
    def max_cwnd(self) -> float:
        """``min(cap, max(MAX_CWND_BDP * bdp, initial_window packets), line_cap)``, with
        :attr:`bdp`, :attr:`basis` and :attr:`line_cap` inlined and min() and max() as they
        pick, float for float: read on every ACK."""
        p = self.p
        if p.max_cwnd:
            return min(self.cap, float(p.max_cwnd))
        mss = self.mss
        floor = mss * float(p.initial_window)
        base = self.base_rtt
        rate = self.best_rate
        shared = self.shared
        if shared is not None and shared.best_rate > rate:
            rate = shared.best_rate
        if rate <= 0.0 or base == _INF:
            bdp = floor
        else:
            bdp = rate * (base + self._widen * self.host_delay + self.target)
        top = MAX_CWND_BDP * bdp
        if floor > top:
            top = floor
        most = self.cap
        if top < most:
            most = top
        line = self.line_rate
        if line and base != _INF:
            basis = base + self._widen * self.host_delay
            least = SERIALIZING_LINKS * mss / line
            line_cap = MAX_CWND_BDP * line * (least if least > basis else basis)
            if line_cap < most:
                most = line_cap
        return most

    def burst(self, most: int, planes: int) -> int:
        """Packets per burst, sized as mrc's own NSCC sizes them (:func:`burst_packets`)."""
        return burst_packets(self, most, planes)

    # ---- signals -----------------------------------------------------------------------

    def join(self, peers: dict[str, object]) -> None:
        if self.p.shared_base and self.shared is None:
            shared = peers.setdefault("nscc", UetShare())
            assert isinstance(shared, UetShare)
            self.shared = shared

    def leave(self) -> None:
        self.shared = None

    def on_ack(self, now: float, acked: int, rtt: float | None, ce: bool) -> None:
        """An ACK acknowledged ``acked`` new bytes; ``rtt``: its subject's sample (None:
        none), ``ce``: the subject carried CE (or, learned from losses, its delay says it
        would have: ``cc.loss_delay_fraction``).

        Called for every ACK: the steps of its common case (``_note_base``, ``_average``,
        the proportional increase, ``_bound``, ``_adjust``, ``_set``) are inlined, float for
        float as those methods compute, ``max_cwnd`` is computed once, and quick adapt,
        ``_note_rate`` and ``_network_delay`` are called only when they have work to do."""
        p = self.p
        host = self._host_sample  # the hosts' part of this ACK's RTT sample, if measured
        virtual = False
        if p.host_delay:
            self._calm(acked, rtt, ce)
        mss = self.mss
        base = self.base_rtt
        if acked > 0:
            self._achieved += acked
            self._received += acked
            self._ignored += acked
            self._delivered += acked
            mark = self._rate_mark
            if mark is None or base == _INF or now - mark[0] >= base + self.target:
                self._note_rate(now)  # a new mark, or a rate measured
        if rtt is not None:
            # _note_base
            low = rtt
            shared = self.shared
            if shared is not None:
                if rtt < shared.base_rtt:
                    shared.base_rtt = rtt
                else:
                    low = shared.base_rtt  # another QP to this peer saw the path emptier
            if low < base:
                self.base_rtt = base = low
                self._retarget()
            delay = rtt - base
            if p.loss_delay_fraction:  # off (UET's law): no per-ACK work for it
                self.recent_delay += (delay - self.recent_delay) * RECENT_DELAY_GAIN
            if ce:
                self._marking = True
            elif self.loss_delay and not self._marking:
                over = delay > p.loss_delay_fraction * self.loss_delay
                self._count_over(now, max(acked, mss), over)
                if over:
                    # as near the depth that overflowed as a marking port's threshold
                    ce = virtual = True
                    self.virtual_marks += 1
            # _average(delay, ce, max(1, acked // mss))
            target = self.target
            packets = acked // mss
            sample = delay if ce or delay <= target else 0.25 * base
            keep = (1.0 - p.delay_alpha) ** (packets if packets > 1 else 1)
            self.avg_delay = keep * self.avg_delay + (1.0 - keep) * sample
        else:
            delay = self.avg_delay
        # _quick_adapt does nothing unless one of these holds
        due = (ce and self._ignored < self._to_ignore) or (now > self._qa_end and base != _INF)
        if (
            due
            and not p.disable_qa
            and self._quick_adapt(now, False, ce, self._network_delay(delay, rtt, host))
        ):
            return
        target = self.target
        top = self.max_cwnd  # (nothing below changes it)
        if not ce and delay >= target:
            # fair increase: the same per round trip for every flow, whatever its window
            self._inc += p.fi * mss * self.scaling * acked
        elif not ce:
            # proportional increase, or fast increase: a whole window acknowledged with
            # next to no queueing
            fast = False
            if delay < FAST_INCREASE_FRACTION * base:
                self._fi_count += acked
                fast = self._fi_count > self.cwnd or self._increasing
            else:
                self._fi_count = 0
            if fast:
                self._increasing = True
                self._set(now, self.cwnd + acked * p.fi_scale * self.scaling, top)
            else:
                self._increasing = False
                # UET's alpha = 4 x mss x a x b / target, b the target over the network RTT:
                # summed over a window, 4 x mss x a x (target - delay) / base RTT per round trip
                alpha = 4.0 * mss * self.scaling / base
                self._inc += alpha * acked * (target - delay)
        elif delay >= target:
            self._decrease(now, delay if virtual else None)
        # else NOOP: a mark about a queue this flow's own delay does not show
        if self.cwnd > top:  # (_bound)
            self._set(now, self.cwnd, top)
        period = p.adjust_period_threshold or base
        threshold = p.adjust_bytes_threshold or 8 * mss
        if self._received > threshold or now - self._last_adjust > period:
            # _adjust(now, period), then _set
            cwnd = self.cwnd
            cwnd = cwnd + self._inc / cwnd
            if now - self._last_adjust >= period:
                cwnd += p.eta * mss * self.scaling
                self._last_adjust = now
            self._inc = 0.0
            self._received = 0
            cwnd = mss if cwnd < mss else top if cwnd > top else cwnd
            self.cwnd = cwnd
            n = int(cwnd // mss)
            self.limit = n if n > 1 else 1
            if self.trace is not None:
                self.trace.append((now, cwnd))

    def _count_over(self, now: float, acked: int, over: bool) -> None:
        """Count ``acked`` bytes whose delay read (``over``) or did not read as a mark, over
        the last two round trips at most: the share of the window that meets the queue."""
        if now - self._seen_since > 2 * (self.base_rtt + self.recent_delay):
            self._over_bytes = self._seen_bytes = 0
            self._seen_since = now
        self._seen_bytes += acked
        if over:
            self._over_bytes += acked

    def _network_delay(self, delay: float, rtt: float | None, host: float | None) -> float:
        """The delay quick adapt weighs: with ``cc.host_delay``, ``delay`` less the sample's
        host delay where one came with it. Quick adapt cuts the window to what one period
        delivered when the delay passes 4 x the target, a network's queue; on a short path a
        userspace host's own 0.1-0.3 ms passes that on every ACK (a veth: base 90 µs, target
        70 µs), and the window the wider bound allowed was cut back 50 times a transfer."""
        if not self.p.host_delay or rtt is None or host is None:
            return delay
        return max(0.0, delay - host)

    def on_host_delay(self, now: float, delay: float) -> None:
        """A host delay sample (the base class says what it is): averaged into
        :attr:`host_delay` (srtt's gain, 1/8), which widens the window's bound where
        ``cc.host_delay`` says so (and is only kept, to be read, where not)."""
        if delay > HOST_DELAY_MAX:
            delay = HOST_DELAY_MAX  # the rest is a queue (the constant says why)
        self.host_delay += (delay - self.host_delay) * HOST_DELAY_GAIN
        self._host_sample = delay

    def _calm(self, acked: int, rtt: float | None, ce: bool) -> None:
        """How much of the host delay the bound counts (``_widen``, 0 to 1): none at first
        and after a loss, a trim or a timeout, then a ``HOST_DELAY_RAMP``-th more for every
        window delivered without one, and none while the network part of the round trips
        shows a queue (``HOST_DELAY_NET_QUEUE``) or an ACK echoes a CE mark (``ce``). A
        wider bound is right for a QP whose path has room, and wrong where QPs meet at a
        port: there the queue, its marks and its losses keep it narrow (docs/CONGESTION.md,
        "Host delay"). Delivered
        windows, not seconds: a QP idle between an all-to-all's steps earns nothing while it
        waits, and starts the next step with the bound the last one left it."""
        sample, self._host_sample = self._host_sample, None
        if rtt is not None and sample is not None and self.base_rtt != _INF:
            network = max(0.0, rtt - sample - self.base_rtt)
            self.net_delay += (network - self.net_delay) * HOST_DELAY_GAIN
        if ce or self.net_delay > max(HOST_DELAY_NET_QUEUE, self.target, self.host_delay):
            # a port's queue, which the hosts' delay does not fill, or one that marks: a
            # fabric's, or the receiving host's socket queue (the transport marks it over
            # half its room), which many QPs into one host fill by the host delay they earn
            self._widen = 0.0
        elif acked > 0 and self._widen < 1.0:
            self._widen = min(1.0, self._widen + acked / (HOST_DELAY_RAMP * self.cwnd))

    def _unsettle(self, now: float) -> None:
        """A loss, a trim or a timeout: the bound counts no host delay until calm again."""
        self._widen = 0.0

    def on_trim(self, now: float, rtt_hint: float) -> None:
        """A trim NACK: a queue overflowed. Quick adapt if its period is over, else a packet
        off the window."""
        self._marking = True
        self._unsettle(now)
        self._ignored += self.mss
        if self.base_rtt == _INF and rtt_hint > 0.0:
            # the only time scale yet. UET takes every NACK's round trip for a base RTT
            # (update_base_rtt_on_nack); not here, where a data packet's own serialization is
            # much of the round trip (8 KiB at 50 Mbit/s: 1.3 ms a hop) and a trimmed header
            # has none: every ACK would then read as a queue of that much
            self._note_base(rtt_hint)
        if self.base_rtt != _INF:
            # UET reads a trim as a queue at the trimming threshold: about a base RTT of delay
            self._average(self.base_rtt, True, 1)
        self._trigger_qa = True
        if not self._quick_adapt(now, True, True, 0.0):
            self._set(now, self.cwnd - self.mss)

    def _learn_loss(self) -> None:
        """A loss (SACKs or a timeout): if the recent delay shows a queue (over the target),
        the loss was that queue's overflow, and its depth enters ``loss_delay``. A loss on a
        dead path with the queues low teaches nothing."""
        recent = self.recent_delay
        fraction = self.p.loss_delay_fraction
        if fraction and not self._marking and self.base_rtt != _INF and recent > self.target:
            learned = self.loss_delay
            if learned:
                if recent < fraction * learned:
                    return  # a shallower queue's loss, or a dead path's: not this depth
                recent = learned + (recent - learned) * LOSS_DELAY_GAIN
            self.loss_delay = recent

    def on_loss(self, now: float) -> None:
        """Lost packets (SACKs): a packet off the window, as UET does for every packet it
        marks for retransmission. A dead path is the EV health's."""
        self._learn_loss()
        self._unsettle(now)
        self._set(now, self.cwnd - self.mss)

    def on_timeout(self, now: float) -> None:
        """A retransmission timer fired: nothing. UET takes a packet off the window here too,
        but resends timed-out packets in loss recovery whatever the window; this requester
        holds every resend below the window, so a blackout (every path dead) would shrink
        the window to a packet and serialise the retries of all the others: a QP of 4
        packets gave up after 23.6 s instead of the 10.6 its retry budget allows. A timeout
        here is a dead path's (EV health) or a blackout's (the retry budget)."""
        self._learn_loss()
        self._unsettle(now)
        self.losses_ignored += 1

    # ---- the law -----------------------------------------------------------------------

    def _quick_adapt(self, now: float, loss: bool, ce: bool, delay: float) -> bool:
        p = self.p
        if p.disable_qa:
            return False
        done = False
        if ce and self._ignored < self._to_ignore:
            done = True  # a mark of a packet sent before the last quick adapt
        elif now > self._qa_end and self.base_rtt != _INF:
            if (
                self._qa_end
                and (self._trigger_qa or loss or delay > self._qa_threshold)
                and self._achieved < self.max_cwnd / (1 << p.qa_gate)
            ):
                self.quick_adapts += 1
                self._to_ignore = int(self.cwnd)  # (UET: the bytes in flight)
                self._ignored = 0
                self._trigger_qa = False
                self._set(now, float(self._achieved))
                done = True
            self._achieved = 0
            self._qa_end = now + self.interval
        if done:
            self._inc = 0.0
            self._received = 0
        return done

    @property
    def _qa_threshold(self) -> float:
        return self.p.qa_threshold or 4 * self.target

    def _decrease(self, now: float, virtual: float | None = None) -> None:
        self._increasing = False
        self._fi_count = 0
        avg = self.avg_delay
        # at most once per base RTT, as UET's marking fabric keeps queues short; a mark of
        # ours (``virtual``: its delay) comes of a queue as long as the recent delay, which
        # takes a round trip of that length to show the decrease: once per such round trip
        gap = self.base_rtt + self.recent_delay if virtual is not None else self.base_rtt
        if now - self._last_decrease <= gap:
            return
        if virtual is not None:
            # by the share of the round trip the queue stands over the learned threshold:
            # what taking that much off every window sharing the queue would drain (UET's
            # cut, by the average's excess over a target kept short by the marks, took up
            # to half the window per base RTT and slowed the simulator's all-to-all 4%)
            # and only the share of the window whose ACKs met it: a queue on one plane (a
            # link down behind it) leaves the other planes' share of the window alone
            over = virtual - self.p.loss_delay_fraction * self.loss_delay
            share = self._over_bytes / self._seen_bytes
            self._over_bytes = self._seen_bytes = 0
            self._seen_since = now
            factor = 1.0 - self.p.gamma * share * over / (self.base_rtt + virtual)
        elif avg > self.target:
            factor = 1.0 - self.p.gamma * (avg - self.target) / avg
        else:
            return
        self.decreases += 1
        self._last_decrease = now
        self._set(now, self.cwnd * max(factor, 1.0 - self.p.max_md_jump))

    # ---- measurements ------------------------------------------------------------------

    def _note_base(self, rtt: float) -> None:
        low = rtt
        shared = self.shared
        if shared is not None:
            if rtt < shared.base_rtt:
                shared.base_rtt = rtt
            else:
                low = shared.base_rtt  # another QP to this peer saw the path emptier
        if low < self.base_rtt:
            self.base_rtt = low
            self._retarget()

    def _retarget(self) -> None:
        if not self.p.target_delay and self.base_rtt != _INF:
            self.target = TARGET_RTT_FRACTION * self.base_rtt

    def _average(self, delay: float, ce: bool, packets: int) -> None:
        # a delay over target without a mark is not trusted: the average moves towards a
        # quarter of the base RTT instead (UET's update_delay)
        sample = delay if ce or delay <= self.target else 0.25 * self.base_rtt
        keep = (1.0 - self.p.delay_alpha) ** packets
        self.avg_delay = keep * self.avg_delay + (1.0 - keep) * sample

    def _note_rate(self, now: float) -> None:
        """The best delivery rate: bytes acknowledged over each stretch of one round trip at
        the target."""
        mark = self._rate_mark
        if mark is None or self.base_rtt == _INF:
            self._rate_mark = (now, self._delivered)
            return
        t0, d0 = mark
        if now - t0 >= self.interval:
            rate = (self._delivered - d0) / (now - t0)
            if rate > self.best_rate:
                self.best_rate = rate
                if self.shared is not None and rate > self.shared.best_rate:
                    self.shared.best_rate = rate
            self._rate_mark = (now, self._delivered)

    def start_within(self, packets: int) -> None:
        cwnd = float(self.mss * max(1, packets))
        if cwnd < self.cwnd:
            self.cwnd = cwnd
            self.limit = max(1, int(cwnd // self.mss))

    def _set(self, now: float, cwnd: float, top: float | None = None) -> None:
        """The window becomes ``cwnd``, within one packet and ``top`` (``max_cwnd``, unless
        the caller has it already)."""
        if top is None:
            top = self.max_cwnd
        cwnd = self.mss if cwnd < self.mss else top if cwnd > top else cwnd
        self.cwnd = cwnd
        self.limit = max(1, int(cwnd // self.mss))
        if self.trace is not None:
            self.trace.append((now, cwnd))
