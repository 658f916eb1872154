"""Round-trip time estimation and the retransmission timeout (RFC 6298 style)."""

from __future__ import annotations


class RttEstimator:
    def __init__(self, initial_rto: float, min_rto: float, max_rto: float) -> None:
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.min_rto = min_rto
        self.max_rto = max_rto
        self.rto = initial_rto

    def sample(self, rtt: float) -> None:
        if rtt < 0:
            return
        if self.srtt is None:
            self.srtt = rtt
            self.rttvar = rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(self.max_rto, max(self.min_rto, self.srtt + 4 * self.rttvar))
