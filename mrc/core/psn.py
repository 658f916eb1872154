"""24-bit PSN arithmetic.

Internally the core counts packets with unbounded integers ("sequence numbers", 0 for the first
packet of a QP); only the wire carries the 24-bit PSN = (initial PSN + seq) mod 2^24. A receiver
turns a wire PSN back into a sequence number relative to the one it expects, which is correct as
long as senders stay within half the PSN space of the receiver's cumulative point (the window
limits guarantee far less than that).
"""

from mrc.wire import PSN_MASK

_HALF = 1 << 23


def to_psn(initial_psn: int, seq: int) -> int:
    """Wire PSN of sequence number ``seq``."""
    return (initial_psn + seq) & PSN_MASK


def to_seq(initial_psn: int, psn: int, near_seq: int) -> int:
    """Sequence number of wire ``psn``, taking the one closest to ``near_seq``."""
    near_psn = (initial_psn + near_seq) & PSN_MASK
    delta = ((psn - near_psn + _HALF) & PSN_MASK) - _HALF
    return near_seq + delta
