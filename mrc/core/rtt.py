"""Round-trip time estimation and the retransmission timeout (RFC 6298 style)."""

from __future__ import annotations


class RttEstimator:
    """Smoothed RTT and its variation, and the RTO derived from them.

    The RTO is srtt + 4 rttvar clamped to [``min_rto``, ``max_rto``]: the floor keeps a
    microsecond-RTT fabric from firing timeouts at every scheduling hiccup of the host, the
    ceiling bounds how long a dead path can stall a packet. Until the first sample it is
    ``initial_rto``.
    """

    def __init__(self, initial_rto: float, min_rto: float, max_rto: float) -> None:
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.min_rto = min_rto
        self.max_rto = max_rto
        self.rto = initial_rto

    def sample(self, rtt: float) -> None:
        """One measured round trip (never of a retransmitted packet: Karn's rule is the
        caller's). A negative one (a clock step) is ignored."""
        if rtt < 0:
            return
        if self.srtt is None:
            self.srtt = rtt
            self.rttvar = rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        # min(max_rto, max(min_rto, ...)) as min() and max() pick (a sample per ACK: no calls)
        rto = self.srtt + 4 * self.rttvar
        if not rto > self.min_rto:
            rto = self.min_rto
        self.rto = rto if rto < self.max_rto else self.max_rto

    def backed_off(self, timeouts: int) -> float:
        """The timeout for a packet that already timed out ``timeouts`` times: the RTO doubled
        per timeout, at most ``max_rto`` (a dead path is retried less and less often)."""
        return min(self.rto * (1 << timeouts), self.max_rto)
