"""What the peers of one listener can make it hold, bounded: the listener's ledger.

Anyone who reaches a listener's TCP port can make it work and allocate: a set-up in progress
holds a socket, a task and up to a megabyte of line buffer; a connection holds a QP and its EV
sockets (``evs`` plus backups: about 20 file descriptors each by default); a granted region
holds whatever ``region_factory`` made (memory, a file and its disk space). Each of these is
counted here against a limit, so a flood of hellos is refused with one line naming the limit
instead of exhausting memory, file descriptors or disk, and so every unit taken is given back
exactly once (an :class:`Admission` releases idempotently).

Set-up slots are where a peer that proves nothing meets one that can: a set-up that has not yet
said its hello (and, with a key, proved it) gives way to a newcomer when the slots are full
(silent ones before those that said a hello, then the busiest source's, then the oldest), so
peers that prove nothing cannot keep out a real sender, which needs its slot for one round
trip; a set-up past its proof is never displaced.

This module is bookkeeping only (no I/O, no clock): :class:`~mrc.connection.Listener` asks it
before it allocates and tells it when things end.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from mrc.errors import MRCError

#: set-ups (TCP connections that have not finished the hello exchange) in progress at once
DEFAULT_MAX_SETUPS = 64
#: live connections (set up and not yet closed); each holds about 20 file descriptors by default
DEFAULT_MAX_CONNECTIONS = 64
#: bytes of regions granted on request and not yet released, all connections together
DEFAULT_MAX_GRANTED = 64 << 30
#: IPv6 sources are told apart by their /64: one host has a whole /64 to connect from
SOURCE_PREFIX_V6 = 64


class LimitError(MRCError):
    """A peer asked for more than a listener's limits allow; the message is the refusal."""


def source_of(host: str) -> str:
    """The source a peer address counts against: an IPv4 address (mapped or not) as it is,
    an IPv6 address by its /64. Anything else (a name, empty) counts as itself."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, SOURCE_PREFIX_V6), strict=False).network_address)
    return str(addr)


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one listener (``listen()`` takes each as a keyword argument).

    ``max_granted_bytes`` bounds the sizes peers asked for, ``max_memory_bytes`` the part of
    them that is memory (what ``region_memory`` says a region holds); None: no bound beyond
    what ``region_factory`` itself refuses. ``hints``: (limit, how to raise it) pairs that a
    refusal by that limit ends with, e.g. ``("memory_bytes", "--max-memory raises it")``; the
    limits are ``setups``, ``connections``, ``granted_bytes`` and ``memory_bytes``.
    """

    max_setups: int = DEFAULT_MAX_SETUPS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_granted_bytes: int | None = DEFAULT_MAX_GRANTED
    max_memory_bytes: int | None = None
    hints: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_setups", "max_connections"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise MRCError(f"{name} must be a positive integer, not {value!r}")
        for name in ("max_granted_bytes", "max_memory_bytes"):
            cap = getattr(self, name)
            if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 0):
                raise MRCError(f"{name} must be None or at least 0, not {cap!r}")

    def hint(self, limit: str) -> str:
        """How to raise ``limit``, as a refusal ends: `` (--max-total raises it)``, or ``""``."""
        for name, text in self.hints:
            if name == limit:
                return f" ({text})"
        return ""


class Admission:
    """One connection's share of the ledger: a connection slot and the bytes it was granted
    (``memory`` of them in memory). :meth:`release` gives them back, once, however many paths
    call it."""

    __slots__ = ("_ledger", "bytes", "memory", "released")

    def __init__(self, ledger: Ledger, nbytes: int, memory: int) -> None:
        self._ledger = ledger
        self.bytes = nbytes
        self.memory = memory
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._ledger._give_back(self)


#: how far a set-up got: connected, said its hello (keyed: waits for the proof), proven
SILENT, SAID_HELLO, PROVEN = 0, 1, 2


@dataclass(slots=True)
class _Setup:
    source: str
    stage: int = SILENT


class Ledger:
    """Counts what is held against :class:`Limits`; refuses with a one-line reason."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        # set-ups in progress by ticket, oldest first (a dict keeps insertion order)
        self._setups: dict[Hashable, _Setup] = {}
        self.connections = 0
        self.granted_bytes = 0
        self.memory_bytes = 0
        #: refusals so far by limit ("setups", "connections", "granted_bytes", "memory_bytes");
        #: "setups" counts set-ups displaced for a newcomer too
        self.refused: Counter[str] = Counter()

    @property
    def setups(self) -> int:
        """Set-ups in progress now."""
        return len(self._setups)

    def begin_setup(self, ticket: Hashable, source: str) -> Hashable | None:
        """A TCP connection arrived from ``source`` (:func:`source_of`): count it as set-up
        ``ticket``. When the slots are full the oldest unproven set-up of the source holding
        the most unproven ones gives way: its ticket is returned (the caller drops it; its
        :meth:`end_setup` is then a no-op). If every set-up in progress is proven, raises
        :class:`LimitError` (the caller refuses the newcomer at once, before reading)."""
        victim = None
        if len(self._setups) >= self.limits.max_setups:
            victim = self._displaceable()
            self.refused["setups"] += 1
            if victim is None:
                raise LimitError(
                    f"too many set-ups in progress (limit {self.limits.max_setups})"
                    + self.limits.hint("setups")
                )
            del self._setups[victim]
        self._setups[ticket] = _Setup(source)
        return victim

    def _displaceable(self) -> Hashable | None:
        """The set-up that gives way: of those least far (silent before said-hello; never a
        proven one), from the source holding the most of them, the oldest."""
        unproven = [s.stage for s in self._setups.values() if s.stage < PROVEN]
        if not unproven:
            return None
        least = min(unproven)
        held = Counter(s.source for s in self._setups.values() if s.stage == least)
        busiest = max(held.values())
        for ticket, setup in self._setups.items():  # oldest first
            if setup.stage == least and held[setup.source] == busiest:
                return ticket
        return None  # (not reached: some set-up has the least stage and the busiest count)

    def displaced_reason(self) -> str:
        """What a displaced set-up is told."""
        return (
            f"set-up dropped for a newer connection: all {self.limits.max_setups} set-up slots "
            "were taken and this one had not yet said its hello or proved the key"
            + self.limits.hint("setups")
        )

    def said_hello(self, ticket: Hashable) -> None:
        """Set-up ``ticket`` said its hello (with a key, it is yet to prove it): silent set-ups
        give way before it."""
        setup = self._setups.get(ticket)
        if setup is not None:
            setup.stage = max(setup.stage, SAID_HELLO)

    def proven(self, ticket: Hashable) -> None:
        """Set-up ``ticket`` proved what it had to (its hello; with a key, the key): it is no
        longer displaced for newcomers."""
        setup = self._setups.get(ticket)
        if setup is not None:
            setup.stage = PROVEN

    def end_setup(self, ticket: Hashable) -> None:
        """That set-up finished, well or not (or was displaced: then nothing happens)."""
        self._setups.pop(ticket, None)

    def admit(self, request_bytes: int, memory_bytes: int | None = None) -> Admission:
        """A connection slot and ``request_bytes`` of granted region (``memory_bytes`` of them
        in memory; default: all), or :class:`LimitError`; asked before anything is allocated
        for the peer."""
        memory = request_bytes if memory_bytes is None else memory_bytes
        limits = self.limits
        if self.connections >= limits.max_connections:
            self.refused["connections"] += 1
            raise LimitError(
                f"too many connections (limit {limits.max_connections})"
                + limits.hint("connections")
            )
        cap = limits.max_granted_bytes
        if cap is not None and self.granted_bytes + request_bytes > cap:
            self.refused["granted_bytes"] += 1
            raise LimitError(
                f"cannot grant {request_bytes} bytes: {self.granted_bytes} of the "
                f"{cap} bytes this receiver grants at once are in use"
                + limits.hint("granted_bytes")
            )
        cap = limits.max_memory_bytes
        if cap is not None and memory and self.memory_bytes + memory > cap:
            self.refused["memory_bytes"] += 1
            raise LimitError(
                f"cannot grant {memory} bytes of memory: {self.memory_bytes} of the "
                f"{cap} bytes of memory this receiver grants at once are in use"
                + limits.hint("memory_bytes")
            )
        self.connections += 1
        self.granted_bytes += request_bytes
        self.memory_bytes += memory
        return Admission(self, request_bytes, memory)

    def _give_back(self, admission: Admission) -> None:
        self.connections -= 1
        self.granted_bytes -= admission.bytes
        self.memory_bytes -= admission.memory

    def usage(self) -> dict[str, int]:
        """What is held now and how many peers each limit refused (for reports and tests)."""
        return {
            "setups": self.setups,
            "connections": self.connections,
            "granted_bytes": self.granted_bytes,
            "memory_bytes": self.memory_bytes,
            **{f"refused_{k}": v for k, v in sorted(self.refused.items())},
        }
