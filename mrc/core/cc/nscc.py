"""NSCC (``QPConfig.cc = "nscc"``, the default): the congestion window of one queue pair.

Modelled on the public description of UET 1.0's network-signal-based congestion control: a
window in **bytes of payload**, steered by three network signals that a sprayed, trimming
fabric gives for free, without per-path state:

* **queueing delay**: every RTT sample (the requester's own, of an ACK's subject, Karn's rule
  applied) minus the *base RTT*, the smallest sample ever seen. Below ``target_delay`` the
  window grows, above it shrinks, proportionally to how far it is off;
* **ECN**: the responder echoes the CE mark (FECN) of an ACK's subject in the ACK's BECN bit
  (docs/PROTOCOL.md section 3.4); a mark counts as "over target";
* **trims and losses**: a trim is proof that a queue overflowed *now*. NSCC's *quick adapt*
  cuts the window to what the network actually delivered in the last round trip, so the sender
  stops refilling a full queue with the very packets it just lost there (the retransmit storm
  of a fixed window).

The law, per ACK that acknowledges ``acked`` new bytes (``q`` = queueing delay of the latest
sample, ``T`` = the target, ``mss`` = payload size):

* ``q < T`` and no CE: ``cwnd += acked * (mss / cwnd + gain * (T - q) / T)``: one packet per
  RTT (additive) plus a proportional term that grows fast while the queue is empty and fades
  out as the delay approaches the target (NSCC's "proportional increase");
* ``q > T`` or CE, at most once per RTT: ``cwnd *= 1 - min(max_md, md_gain * (q - T) / q)``
  (a CE mark with ``q <= T`` takes ``ce_md``): a decrease proportional to the excess delay;
* trim, SACK-detected loss or timeout, at most once per RTT: ``cwnd = min(cwnd, delivered in
  the last base RTT + T)`` (quick adapt), and no further decrease for that RTT: the delay
  samples still in flight describe the queue before the cut;
* below one packet (down to ``min_window`` of one) the requester sends one packet every
  ``mss / cwnd`` round trips (``pace_gap``); only trims (quick adapt, counting what was
  delivered over that many round trips, scaled to one) and CE take the window there, and
  every other ACK doubles it back: one packet of anybody's queue is over the target, so delay
  says nothing there. Without this, N flows into one last hop hold N packets in flight at
  least, and when that is more than the queue every packet is trimmed again and again
  (docs/CONGESTION.md, "Windows below a packet, paced"). New work after an idle spell starts
  at a packet at least (``on_resume``);
* always ``min_window * mss <= cwnd <= ceiling``,
  ``ceiling = min(cap, 1.5 * best rate * (base RTT + T))`` once a rate was measured
  (``cap`` = ``max_outstanding`` packets): 1.5 times the window that would sit exactly at the
  target, so that a burst of good news cannot inflate the window far
  beyond what the path ever carried. "Best rate" is the most bytes delivered in any interval
  of one base RTT + T, divided by that interval.

The requester enforces the window in whole packets (``limit``), new data and retransmissions
alike, so that the per-packet check stays one integer comparison; the window itself changes
only on ACKs, NACKs and timers. Sans-IO: time comes in as ``now``; nothing here reads a clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from mrc import wire
from mrc.core.cc.base import AUTO_BURST, GSO_MAX_BYTES, LawContext, WindowLaw
from mrc.core.counters import SEND, CounterSpec, Source

_INF = float("inf")


@dataclass(frozen=True, slots=True)
class MrcNsccParams:
    """NSCC's parameters (``QPConfig.cc_params``, ``--qp cc.NAME=VALUE``)."""

    #: the queueing delay (RTT above the smallest seen) the window aims at, seconds: the
    #: floor of the target. Above any ACK-coalescing delay of the peer (ack_delay), yet a
    #: fraction of a 20-packet queue at 100 Mbit/s (1.6 ms): about 6 kB of queue at
    #: 100 Mbit/s, 60 kB at 1 Gbit/s
    target_delay: float = 0.0005
    #: the target is at least this fraction of the path's base RTT (a long path needs room
    #: for the queue spraying builds); target_delay stays the floor. 0: the floor alone
    target_rtt_fraction: float = 0.25
    #: the target is at least this many of the QP's own packets at the rate it is delivering
    #: now, up to target_max (0: off). Where a packet takes longer to cross the bottleneck
    #: than the target (slow links, several flows sharing one), a target below it holds
    #: every window at a packet or two; off by default, as it does not carry over from the
    #: simulator to the netns fabric (docs/CONGESTION.md, "Target of the flow's own packets")
    target_packets: float = 0.0
    target_max: float = 0.004
    #: the window before any signal, packets (capped by max_outstanding)
    initial_window: int = 16
    #: weight of the proportional increase (0: additive only, one packet per RTT)
    gain: float = 0.5
    #: the smallest window, packets. Below 1 the requester paces: one packet every
    #: 1 / window round trips, so that many flows into one host fit its last hop's queue
    #: (docs/CONGESTION.md, "Windows below a packet, paced"). 1: never below a packet
    min_window: float = 0.25
    #: the decrease over target: md_gain x the excess delay's share of the sample...
    md_gain: float = 0.8
    #: ... at most this fraction of the window per RTT
    max_md: float = 0.5
    #: the decrease of a CE mark with the delay under target
    ce_md: float = 0.125
    #: the base RTT is the smallest sample of every QP of this process to the same peer host,
    #: not of this QP alone (WindowLaw.join). A QP that starts while others keep a queue
    #: would otherwise take that queue for its path's own round trip, see no queueing, keep
    #: its window while the others cut theirs, and finish first (docs/CONGESTION.md,
    #: "Latecomers")
    shared_base: bool = True
    #: while other QPs of this process send to the same peer host (shared_base on), the
    #: target is at least this many of the QP's own packets (as target_packets; 0: off).
    #: N QPs with one target share one queue's worth of delay: without it, 16 QPs into one
    #: host held windows of a packet each, and an ACK and a send for every packet cost the
    #: host more than the bytes (docs/CONGESTION.md, "Latecomers")
    shared_target_packets: float = 4.0

    def validate(self) -> None:
        """Raise ValueError, one line naming the parameter, for an impossible setting."""
        if not self.target_delay > 0:
            raise ValueError("cc.target_delay must be > 0 seconds")
        if not 0 <= self.target_rtt_fraction <= 4:
            raise ValueError("cc.target_rtt_fraction must be between 0 and 4")
        if not 0 <= self.target_packets <= 64:
            raise ValueError("cc.target_packets must be between 0 and 64")
        if not 0 <= self.shared_target_packets <= 64:
            raise ValueError("cc.shared_target_packets must be between 0 and 64")
        if not self.target_delay <= self.target_max <= 1:
            raise ValueError("cc.target_max must be between cc.target_delay and 1 second")
        if self.initial_window < 1:
            raise ValueError("cc.initial_window must be at least 1 packet")
        if not 0.001 <= self.min_window <= 1:
            raise ValueError("cc.min_window must be between 0.001 and 1 packet")
        if self.gain < 0:
            raise ValueError("cc.gain must be >= 0")
        for name in ("md_gain", "max_md", "ce_md"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"cc.{name} must be >= 0 and < 1")


class _BurstSizing(Protocol):
    """What :func:`burst_packets` reads of a window law."""

    mss: int
    limit: int
    target: float
    best_rate: float
    burst_delay_fraction: float
    burst_spread: int
    per_send: int


def burst_packets(law: _BurstSizing, most: int, planes: int) -> int:
    """Packets per burst: what one plane drains in ``burst_delay_fraction`` of the law's
    target delay at the best rate it measured (the QP's rate shared by its planes), at least
    1 and at most ``most``. The last packet of a burst waits behind the others in the
    sender's own NIC queue; kept below the target, that wait is not read as congestion (and
    a slow path, where one packet takes longer than the budget, is sprayed packet by
    packet). Both NSCC laws size bursts so."""
    budget = law.burst_delay_fraction * law.target * law.best_rate / planes
    k = int(budget // law.mss)
    # and a window still holds burst_spread bursts per plane: EV health learns of a dead
    # path from the EVs it tried, so bursts must not cut how many it tries per round trip
    spread = law.limit // (planes * law.burst_spread)
    if spread < k:
        k = spread
    if k > most:
        k = most
    # in whole GSO sends: 16 x 8 KiB would go out as 7 + 7 + 2, and the 2 cost a send
    # and a receive of their own
    per_send = law.per_send
    if k > per_send:
        k -= k % per_send
    return k if k > 1 else 1


class PeerShare:
    """What the NSCC windows of one process's QPs to one peer share: the smallest round trip
    any of them saw (``value``), and how many of them are open (``members``)."""

    __slots__ = ("value", "members")

    def __init__(self) -> None:
        self.value = _INF
        self.members = 0


class MrcNscc(WindowLaw):
    """The congestion window of one sender (see the module docstring for the law)."""

    COUNTERS = (
        CounterSpec(
            "cc_decreases",
            Source.CC,
            "Window decreases for queueing delay or CE, at most one per round trip",
            metric="mrc_qp_cc_decreases",
            attr="decreases",
            json=SEND,
        ),
        CounterSpec(
            "cc_quick_adapts",
            Source.CC,
            "Quick adapts: the window cut to what the last round trip delivered (trims, "
            "congestion losses)",
            metric="mrc_qp_cc_quick_adapts",
            attr="quick_adapts",
            json=SEND,
        ),
        CounterSpec(
            "cc_losses_ignored",
            Source.CC,
            "Losses the window did not act on: taken for path failures, not congestion",
            metric="mrc_qp_cc_losses_ignored",
            attr="losses_ignored",
            json=SEND,
        ),
    )

    __slots__ = (
        "mss",
        "cap",
        "min_cwnd",
        "target_min",
        "target_rtt_fraction",
        "target_packets",
        "target_max",
        "target",
        "rate",
        "gain",
        "md_gain",
        "max_md",
        "ce_md",
        "cwnd",
        "floor_ceiling",
        "share_base",
        "shared_target_packets",
        "shared",
        "base_rtt",
        "nack_rtt",
        "active_since",
        "best_rate",
        "qdelay",
        "ce",
        "decreases",
        "quick_adapts",
        "losses_ignored",
        "trace",
        "burst_delay_fraction",
        "burst_spread",
        "per_send",
        "_next_decrease",
        "_next_adapt",
        "_delivered",
        "_hist",
        "_horizon",
    )

    Params = MrcNsccParams
    default_burst = AUTO_BURST
    plane_steering = True
    prompt_acks = True

    def __init__(self, params: MrcNsccParams, ctx: LawContext) -> None:
        mss = ctx.payload_size
        cap_packets = ctx.max_outstanding
        self.mss = mss
        # the smallest window, bytes: below one packet the requester paces (pace_gap)
        self.min_cwnd = mss * min(1.0, params.min_window)
        self.cap = float(mss * cap_packets)
        self.target_min = params.target_delay
        self.target_rtt_fraction = params.target_rtt_fraction
        self.target_packets = params.target_packets
        self.target_max = params.target_max
        self.rate = 0.0  # bytes/s delivered over the latest interval
        self.target = params.target_delay
        self.gain = params.gain
        self.md_gain = params.md_gain
        self.max_md = params.max_md
        self.ce_md = params.ce_md
        self.share_base = params.shared_base
        self.shared_target_packets = params.shared_target_packets
        self.shared: PeerShare | None = None  # what the QPs to this peer share (join)
        self.cwnd = float(mss * max(1, min(params.initial_window, cap_packets)))
        self.floor_ceiling = self.cwnd
        self.limit = 0  # the window in whole packets, what the requester compares against
        self.base_rtt = _INF
        # the smallest round trip of a trim's NACK: the trimmed header overtakes the queue,
        # so it stays near the path's own round trip when every ACK sample of a flow that
        # started into a full queue includes that queue (pace_gap)
        self.nack_rtt = _INF
        # when the sender last started from nothing in flight (on_resume): what it delivered
        # before that says what it had to send, not what the path carries
        self.active_since = -_INF
        self.best_rate = 0.0  # bytes/s
        self.qdelay = 0.0  # queueing delay of the latest sample
        self.ce = False  # the latest sample's subject carried CE
        self.decreases = 0
        self.quick_adapts = 0
        self.losses_ignored = 0  # losses taken for path failures, not congestion (on_loss)
        #: (time, cwnd in bytes) after every change, once set to a list (tests, plots)
        self.trace: list[tuple[float, float]] | None = None
        # burst sizing (burst): QPConfig's burst knobs, and the packets one GSO send carries
        self.burst_delay_fraction = ctx.burst_delay_fraction
        self.burst_spread = ctx.burst_spread
        self.per_send = max(1, GSO_MAX_BYTES // (mss + wire.DATA_IMM_HDR_LEN))
        self._next_decrease = -_INF
        self._next_adapt = -_INF
        self._delivered = 0  # payload bytes acknowledged so far
        # (time, _delivered) per ACK with news, over the last two intervals: delivery rate and
        # "delivered in the last round trip" for quick adapt
        self._hist: deque[tuple[float, int]] = deque()
        self._horizon = 0.0  # how far back _hist must reach: two intervals (0: none known)
        self._set(0.0, self.cwnd)

    # ---- derived quantities ----------------------------------------------------------

    @property
    def interval(self) -> float:
        """One round trip at the target: base RTT + target delay (before any sample: inf)."""
        return self.base_rtt + self.target

    @property
    def ceiling(self) -> float:
        if self.best_rate <= 0.0 or self.base_rtt == _INF:
            return self.cap
        # never below the initial window: a sender that was idle or application-limited has
        # a low best rate, and that says nothing about the path
        return max(self.floor_ceiling, min(self.cap, 1.5 * self.best_rate * self.interval))

    def on_resume(self, now: float) -> None:
        """The sender sends again with nothing in flight (a new step, a new message after
        an idle spell): a window below a packet describes a queue that has since drained,
        and would space the first packets of the new work by many round trips."""
        self.active_since = now
        if self.cwnd < self.mss:
            self._set(now, float(self.mss))

    def burst(self, most: int, planes: int) -> int:
        """Packets per burst (:func:`burst_packets`, at this law's target and best rate)."""
        return burst_packets(self, most, planes)

    def pace_gap(self) -> float:
        """Seconds between packets while the window is below one packet: one packet per
        ``mss / cwnd`` round trips at the target (0: the window itself is the limit)."""
        cwnd = self.cwnd
        rtt = self.base_rtt if self.base_rtt < self.nack_rtt else self.nack_rtt
        if cwnd >= self.mss or rtt == _INF:
            return 0.0
        # the NACK's round trip if smaller: a base RTT taken in a queue would space packets
        # by that queue's delay, and a flow that sends nothing never measures a smaller one
        return (rtt + self.target) * self.mss / cwnd

    def delivered_since(self, since: float) -> int:
        """Payload bytes acknowledged after time ``since`` (the history reaches back two
        intervals; before it was ever pruned, to the first ACK)."""
        before = 0
        for t, d in self._hist:
            if t >= since:
                break
            before = d
        return self._delivered - before

    # ---- signals -----------------------------------------------------------------------

    def join(self, peers: dict[str, object]) -> None:
        if self.share_base and self.shared is None:
            shared = peers.setdefault("nscc-mrc", PeerShare())
            assert isinstance(shared, PeerShare)
            shared.members += 1
            self.shared = shared

    def leave(self) -> None:
        if self.shared is not None:
            self.shared.members -= 1
            self.shared = None

    def on_ack(self, now: float, acked: int, rtt: float | None, ce: bool) -> None:
        """An ACK acknowledged ``acked`` new payload bytes; ``rtt``: the sample its subject
        gave (None: none, e.g. a retransmitted subject), ``ce``: the subject carried CE."""
        if rtt is not None:
            low = rtt
            shared = self.shared
            if shared is not None:
                if rtt < shared.value:
                    shared.value = rtt
                else:
                    low = shared.value  # another QP to this peer saw the path emptier
            if low < self.base_rtt:
                if self._next_adapt == _INF:
                    self._next_adapt = now  # the first time scale: quick adapt armed again
                self.base_rtt = low
                # the target follows the path: a fraction of its base RTT, never below the
                # configured floor. On a long path a fixed sub-millisecond target is less than
                # the queue spraying itself builds (a few packet times per bottleneck) and
                # holds the window below the BDP (docs/CONGESTION.md). The base RTT only
                # shrinks, so congestion can never raise the target; and unlike the flow's
                # own rate it does not grow the target when many flows share a bottleneck.
                self._retarget()
                self._horizon = 2 * self.interval
            self.qdelay = rtt - self.base_rtt
            self.ce = ce
        if acked > 0:
            self._delivered += acked
            self._note_delivery(now)
        q = self.qdelay
        target = self.target
        if self.cwnd < self.mss and acked > 0 and not self.ce:
            # below a packet delay says nothing (one packet of anyone's queue is over
            # target): the window climbs back, doubling per ACK, until a trim or CE cuts it.
            # (The additive term would add mss / cwnd packets per ACK: 4 at a quarter.)
            self._set(now, self.cwnd * 2)
            return
        if q > target or self.ce:
            if rtt is None or now < self._next_decrease:
                return
            # over target: proportional to the excess; CE alone (delay fine): a small fixed cut
            cut = min(self.max_md, self.md_gain * (q - target) / q) if q > target else self.ce_md
            self.decreases += 1
            # once per RTT: packets sent after this cut report back one sample-RTT from now
            self._next_decrease = now + rtt
            cwnd = self.cwnd * (1.0 - cut)
            if not self.ce and cwnd < self.mss:
                # delay alone does not take the window below a packet: where one packet
                # takes longer than the target to cross the bottleneck, any queue at all
                # reads as over target. Trims (quick adapt) and CE do
                cwnd = min(self.cwnd, float(self.mss))
            self._set(now, cwnd)
        elif acked > 0:
            cwnd = self.cwnd
            self._set(now, cwnd + acked * (self.mss / cwnd + self.gain * (target - q) / target))

    def on_loss(self, now: float) -> None:
        """A SACK-detected loss or a timeout. Over sprayed paths a loss is as likely a dead
        path as a full queue: with no congestion signal (delay at or under target, no CE) it is
        the EV health's to handle (the EV is retired and its packets resent elsewhere), and the
        window stays; cutting it would turn every link failure into a goodput collapse. With a
        congestion signal (queueing delay over twice the target, or CE) it is congestion: quick
        adapt."""
        # twice the target: a window in steady state keeps the delay around the target, so
        # "over target" alone would take every path failure for congestion half the time
        if self.qdelay > 2 * self.target or self.ce:
            self.on_congestion_loss(now)
        else:
            self.losses_ignored += 1

    def on_congestion_loss(self, now: float, rtt_hint: float = 0.0) -> None:
        """A trim, a SACK-detected loss or a timeout: quick adapt, at most once per RTT.

        ``rtt_hint``: a round trip that this very signal measured (a NACK: the trimmed
        packet's send time to now). It stands in for the base RTT until an ACK gave one: in a
        storm every ACK's subject may be a retransmission, which gives no sample (Karn), and
        quick adapt is exactly what must not wait for one. It never enters ``base_rtt``: a
        NACK is sent at once and its trimmed header overtook the queue, so its round trip is
        not comparable with an ACK's."""
        if 0.0 < rtt_hint < self.nack_rtt:
            self.nack_rtt = rtt_hint
        if now < self._next_adapt:
            return
        if self.base_rtt != _INF:
            interval = self.interval
        elif rtt_hint > 0.0:
            interval = rtt_hint + self.target
        else:
            # no time scale at all (a timeout before any round trip): halve, once, until a
            # sample or a hint comes
            self.quick_adapts += 1
            self._set(now, self.cwnd / 2)
            self._next_adapt = _INF
            return
        self.quick_adapts += 1
        # below a packet, one round trip delivers a packet or none: measure over the round
        # trips one packet is paced across, and scale back to one
        span = self._span(interval)
        self._horizon = max(self._horizon, 2 * interval)
        delivered = self.delivered_since(now - span) * interval / span
        if delivered < self.mss and (
            now - self.active_since < span or not (self._hist and now - self._hist[0][0] >= span)
        ):
            # what was delivered says nothing before the sender has been busy and had ACKs
            # for that long (a trim of the first window, or of the first after an idle
            # spell): one packet, as with windows that never go below one
            delivered = float(self.mss)
        if delivered < self.cwnd:  # else the window is not above what the path carries
            self._set(now, delivered)
        # the delay samples of the next round trip describe the queue before the cut
        self._next_adapt = now + interval
        self._next_decrease = max(self._next_decrease, self._next_adapt)

    on_trim = on_congestion_loss
    on_timeout = on_loss

    # ---- internals ---------------------------------------------------------------------

    def _note_delivery(self, now: float) -> None:
        hist = self._hist
        hist.append((now, self._delivered))
        horizon = now - self._horizon
        if self.cwnd < self.mss:
            # quick adapt below a packet looks back over mss / cwnd round trips
            horizon = now - self._horizon * self.mss / self.cwnd
        while len(hist) > 2 and hist[1][0] <= horizon:
            hist.popleft()
        interval = self.interval
        if interval == _INF:
            return
        # the delivery rate over the last interval, once the history spans a whole one
        t0, d0 = hist[0]
        if now - t0 >= interval:
            for t, d in hist:
                if t >= now - interval:
                    break
                t0, d0 = t, d
            rate = (self._delivered - d0) / (now - t0)
            self.rate = rate
            if rate > self.best_rate:
                self.best_rate = rate
            if rate > 0.0 and (self.target_packets or self.shared is not None):
                self._retarget()  # (a sharing QP's partners come and go)

    def _span(self, interval: float) -> float:
        """The time one packet takes at this window: a round trip, or more below a packet."""
        return interval * self.mss / self.cwnd if self.cwnd < self.mss else interval

    def _retarget(self) -> None:
        target = self.target_rtt_fraction * self.base_rtt
        packets = self.target_packets
        shared = self.shared
        if shared is not None and shared.members > 1 and self.shared_target_packets > packets:
            packets = self.shared_target_packets  # one of several QPs to this peer
        if packets and self.rate > 0.0:
            own = packets * self.mss / self.rate
            if own > self.target_max:
                own = self.target_max
            if own > target:
                target = own
        self.target = target if target > self.target_min else self.target_min

    def start_within(self, packets: int) -> None:
        cwnd = max(float(self.mss * max(1, packets)), self.min_cwnd)
        if cwnd < self.cwnd:
            self.cwnd = cwnd
            self.limit = max(1, int(cwnd // self.mss))

    def _set(self, now: float, cwnd: float) -> None:
        cwnd = min(max(cwnd, self.min_cwnd), self.ceiling)
        self.cwnd = cwnd
        self.limit = max(1, int(cwnd // self.mss))
        if self.trace is not None:
            self.trace.append((now, cwnd))
