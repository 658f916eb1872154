"""UDP port ranges: every socket of a connection bound to a port a firewall was told about.

Without a range, the kernel picks each EV socket's source port and the sender's receive
port from its ephemeral range (``net.ipv4.ip_local_port_range``, 32768-60999 by default),
so a host firewall would have to open all of UDP. With ``--ports LO-HI`` on both ends, every
UDP socket mrc opens for a connection is bound inside the range: the sender's receive socket
(ACKs arrive there), and each EV socket on both sides (data and ACKs leave from them). The
receiver's own receive port is its ``--listen`` port. docs/CLUSTER.md says what to open.
"""

from __future__ import annotations

import errno
import random
import socket
from collections.abc import Container
from dataclasses import dataclass

from mrc.errors import MRCError


@dataclass(frozen=True, slots=True)
class PortRange:
    """Ports ``lo`` through ``hi``, both included."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str) -> PortRange:
        """``LO-HI`` (or one port); ValueError with a one-line reason otherwise."""
        lo_text, sep, hi_text = text.strip().partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise ValueError(f"{text!r} is not a port range such as 40000-40999") from None
        if not 1 <= lo <= hi <= 65535:
            raise ValueError(f"{text!r}: a port range is LO-HI with 1 <= LO <= HI <= 65535")
        return cls(lo, hi)

    def __len__(self) -> int:
        return self.hi - self.lo + 1

    def __str__(self) -> str:
        return f"{self.lo}-{self.hi}"

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.lo <= port <= self.hi


class RangeExhausted(MRCError):
    """No port of the range could be bound (all taken, or all avoided)."""


def bind_in_range(
    sock: socket.socket, host: str, ports: PortRange, avoid: Container[int] = ()
) -> int:
    """Bind ``sock`` to ``(host, p)`` for a free port ``p`` of ``ports`` not in ``avoid``;
    returns ``p``. The search starts at a random port of the range and wraps, so processes
    opening sockets at once rarely race for the same ports. Raises :class:`RangeExhausted`
    when every port is taken, OSError for any other failure to bind."""
    size = len(ports)
    start = random.randrange(size)
    for i in range(size):
        port = ports.lo + (start + i) % size
        if port in avoid:
            continue
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                continue  # taken (EACCES: a port below 1024 for a user without the right)
            raise
        return port
    raise RangeExhausted(f"no free UDP port in the range {ports}")
