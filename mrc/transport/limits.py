"""What the peers of one listener can make it hold, bounded: the listener's ledger.

Anyone who reaches a listener's TCP port can make it work and allocate: a set-up in progress
holds a socket, a task and up to a megabyte of line buffer; a connection holds a QP and its EV
sockets (``evs`` plus backups: about 20 file descriptors each by default); a granted region
holds whatever ``region_factory`` made (memory, a file and its disk space). Each of these is
counted here against a limit, so a flood of hellos is refused with one line naming the limit
instead of exhausting memory, file descriptors or disk, and so every unit taken is given back
exactly once (an :class:`Admission` releases idempotently).

This module is bookkeeping only (no I/O, no clock): :class:`~mrc.connection.Listener` asks it
before it allocates and tells it when things end.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from mrc.errors import MRCError

#: set-ups (TCP connections that have not finished the hello exchange) in progress at once
DEFAULT_MAX_SETUPS = 64
#: live connections (set up and not yet closed); each holds about 20 file descriptors by default
DEFAULT_MAX_CONNECTIONS = 64
#: bytes of regions granted on request and not yet released, all connections together
DEFAULT_MAX_GRANTED = 64 << 30


class LimitError(MRCError):
    """A peer asked for more than a listener's limits allow; the message is the refusal."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one listener (``listen()`` takes each as a keyword argument).

    ``max_granted_bytes`` None: no bound beyond what ``region_factory`` itself refuses.
    """

    max_setups: int = DEFAULT_MAX_SETUPS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_granted_bytes: int | None = DEFAULT_MAX_GRANTED

    def __post_init__(self) -> None:
        for name in ("max_setups", "max_connections"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise MRCError(f"{name} must be a positive integer, not {value!r}")
        cap = self.max_granted_bytes
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 0):
            raise MRCError(f"max_granted_bytes must be None or at least 0, not {cap!r}")


class Admission:
    """One connection's share of the ledger: a connection slot and the bytes it was granted.
    :meth:`release` gives both back, once, however many paths call it."""

    __slots__ = ("_ledger", "bytes", "released")

    def __init__(self, ledger: Ledger, nbytes: int) -> None:
        self._ledger = ledger
        self.bytes = nbytes
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._ledger._give_back(self)


class Ledger:
    """Counts what is held against :class:`Limits`; refuses with a one-line reason."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.setups = 0
        self.connections = 0
        self.granted_bytes = 0
        #: refusals so far by limit ("setups", "connections", "granted_bytes")
        self.refused: Counter[str] = Counter()

    def begin_setup(self) -> None:
        """A TCP connection arrived; raises :class:`LimitError` if too many are being set up
        (the caller refuses it at once, before reading anything)."""
        if self.setups >= self.limits.max_setups:
            self.refused["setups"] += 1
            raise LimitError(f"too many set-ups in progress (limit {self.limits.max_setups})")
        self.setups += 1

    def end_setup(self) -> None:
        """That set-up finished, well or not."""
        self.setups -= 1

    def admit(self, request_bytes: int) -> Admission:
        """A connection slot and ``request_bytes`` of granted memory, or :class:`LimitError`;
        asked before anything is allocated for the peer."""
        limits = self.limits
        if self.connections >= limits.max_connections:
            self.refused["connections"] += 1
            raise LimitError(f"too many connections (limit {limits.max_connections})")
        cap = limits.max_granted_bytes
        if cap is not None and self.granted_bytes + request_bytes > cap:
            self.refused["granted_bytes"] += 1
            raise LimitError(
                f"cannot grant {request_bytes} bytes: {self.granted_bytes} of the "
                f"{cap} bytes this receiver grants at once are in use"
            )
        self.connections += 1
        self.granted_bytes += request_bytes
        return Admission(self, request_bytes)

    def _give_back(self, admission: Admission) -> None:
        self.connections -= 1
        self.granted_bytes -= admission.bytes

    def usage(self) -> dict[str, int]:
        """What is held now and how many peers each limit refused (for reports and tests)."""
        return {
            "setups": self.setups,
            "connections": self.connections,
            "granted_bytes": self.granted_bytes,
            **{f"refused_{k}": v for k, v in sorted(self.refused.items())},
        }
