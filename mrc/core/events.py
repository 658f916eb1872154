"""Events the core reports to whoever drives it (the application-facing side of a QP)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    """Base class: every event names the local QP it concerns."""

    qpn: int


@dataclass(frozen=True, slots=True)
class WriteCompleted(Event):
    """A posted WRITE / WRITE_IMM is acknowledged in full: its bytes are placed remotely."""

    wr_id: int
    length: int


@dataclass(frozen=True, slots=True)
class ImmediateReceived(Event):
    """Receive completion of a WRITE_IMM, reported in PSN order.

    Ordering guarantees that every byte written by this QP up to and including that WRITE_IMM
    is placed.
    """

    imm: int


@dataclass(frozen=True, slots=True)
class QPFailed(Event):
    """The QP is in error and will send nothing more; ``reason`` is one human-readable line."""

    reason: str


@dataclass(frozen=True, slots=True)
class ProbeReplied(Event):
    """A probe on entropy value ``ev`` came back after ``rtt`` seconds."""

    ev: int
    rtt: float


@dataclass(frozen=True, slots=True)
class EVStateChanged(Event):
    """Entropy value ``ev`` (source port ``sport``, plane ``plane``) went ``old`` -> ``new``."""

    time: float
    ev: int
    sport: int
    plane: int
    old: str
    new: str
    reason: str
