"""What the core hands whoever drives it: events (the application-facing side of a QP) and,
for the I/O side, the shape of the datagrams it asks to send."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

from mrc import wire

_HDR_LEN = wire.DATA_HDR_LEN
_IMM_HDR_LEN = wire.DATA_IMM_HDR_LEN
_OP_WRITE_IMM = int(wire.Opcode.RDMA_WRITE_ONLY_IMM)

# A datagram to send: (EV index, header bytes, payload). The payload is a slice of the posted
# buffer for data packets (sent without copying), empty for ACKs and probes.
Datagram = tuple[int, bytes, memoryview | bytes]
# A burst to send: (EV index, buffers, datagrams, segment size): ``datagrams`` datagrams on
# that EV, each ``segment size`` bytes long except the last, which may be shorter: what one UDP
# GSO send carries (the transport cuts it to the kernel's limits, mrc/transport/gso.py). The
# buffers are either header, payload, header, payload... (two per datagram), or one buffer
# holding the datagrams back to back (a *gathered* burst: ``is_gathered``). Either may be views
# of a buffer the core never writes again once it has handed them out.
Burst = tuple[int, list[bytes | memoryview], int, int]


def is_gathered(bufs: list[bytes | memoryview], count: int) -> bool:
    """Whether a burst's buffers are its datagrams back to back in one buffer, not two
    buffers (header, payload) per datagram."""
    return len(bufs) != 2 * count


def gathered_datagrams(buf: bytes | memoryview, count: int, seg: int) -> list[memoryview]:
    """The ``count`` datagrams of a gathered burst's buffer, each ``seg`` bytes but the last."""
    view = memoryview(buf)
    return [view[i * seg : (i + 1) * seg if i < count - 1 else len(view)] for i in range(count)]


def datagrams_of(bursts: list[Burst]) -> list[Datagram]:
    """The datagrams of ``bursts``, one by one, in order (headers as bytes; a gathered
    burst's cut after each datagram's header, which its opcode sizes)."""
    out: list[Datagram] = []
    for ev, bufs, count, seg in bursts:
        if not is_gathered(bufs, count):
            out.extend((ev, bytes(bufs[i]), bufs[i + 1]) for i in range(0, 2 * count, 2))
            continue
        for d in gathered_datagrams(bufs[0], count, seg):
            hdr = _IMM_HDR_LEN if d[0] == _OP_WRITE_IMM else _HDR_LEN
            out.append((ev, bytes(d[:hdr]), d[hdr:]))
    return out


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


class WCStatus(Enum):
    """How a work request that did not complete ended, as a verbs work completion says it
    (``mrc.h``'s status; success is :class:`WriteCompleted`): the value is its phrase."""

    REMOTE_ACCESS_ERROR = "remote access error"  # the peer refused its rkey, bounds or access
    REMOTE_OPERATION_ERROR = "remote operation error"  # any other NAK (e.g. PSN out of window)
    RETRY_EXCEEDED = "retry exceeded"  # a packet of it ran out of timeouts or trims
    FLUSHED = "flushed"  # the QP failed for another work request before this one completed


@dataclass(frozen=True, slots=True)
class WriteFailed(Event):
    """A posted WRITE / WRITE_IMM will not complete: ``status`` says why (the one whose packet
    made the QP fail has the cause; every other one still pending is FLUSHED), ``reason`` is
    the QP's one-line failure. Emitted for each, in posting order, before :class:`QPFailed`."""

    wr_id: int
    status: WCStatus
    reason: str


@dataclass(frozen=True, slots=True)
class QPFailed(Event):
    """The QP is in error and will send nothing more; ``reason`` is one human-readable line."""

    reason: str


@dataclass(frozen=True, slots=True)
class ProbeReplied(Event):
    """A probe on entropy value ``ev`` came back after ``rtt`` seconds."""

    ev: int
    rtt: float


class EVState(IntEnum):
    """Health of one entropy value (docs/EV_HEALTH.md, "States").

    An IntEnum: ``EVSet`` keeps one per EV in a list that spraying consults, and comparing
    ints is as cheap as it gets. Whether a GOOD EV is in the rotation or waits in the backup
    pool is not a state of its own but ``EVSet.active``; ``label`` shows both.
    """

    GOOD = 0
    SKIP = 1
    ASSUMED_BAD = 2
    DENIED = 3

    def label(self, backup: bool = False) -> str:
        """The name users see: ``GOOD (backup)`` for a GOOD EV waiting in the pool."""
        return "GOOD (backup)" if backup and self is EVState.GOOD else self.name


class EVReason(Enum):
    """Why an EV changed state; the value is the phrase shown for it.

    ``{detail}`` is filled from ``EVStateChanged.detail`` and ``{plane}`` from its plane, so
    tools can count transitions by code while logs keep their wording.
    """

    TRIMMED = "trimmed"  # a TRIMMED NACK: congestion on the path
    SKIP_OVER = "skip over"  # the skipped round is over
    TIMEOUT = "timeout"  # a packet's retransmission timer expired
    SACK_LOSS = "lost: later packets arrived"  # RACK-style evidence from SACKs
    PROBE_LOSS = "lost: its tail loss probe arrived first"  # the probe's ACK: not a duplicate
    SEND_ERROR = "send error: {detail}"  # detail: the OS error text
    ACK_LOST = "ACK lost: data arrived twice"  # receiver side: a SACK on this EV was lost
    REVERSE_PROBE = "reverse probe unanswered"  # receiver side: its ACK path is probed
    PLANE_DOWN = "plane {plane} down: {detail} losses in a row"  # detail: the streak
    LINK_DOWN = "plane {plane} down: {detail}"  # detail: whose NIC lost its link
    ROUTE_DOWN = "route down: {detail} of its EVs lost packets"  # detail: how many
    REPLACES = "replaces EV {detail}"  # a backup joins the rotation; detail: the EV it replaces
    RESURRECTED = "resurrected: {detail} probes answered"  # detail: the answered probes
    DENIED = "denied by operator"
    ALLOWED = "allowed again by operator: probed before use"

    def describe(self, detail: str = "", plane: int = 0) -> str:
        """The phrase for this reason, as ``--ev-log`` and the demos print it."""
        return self.value.format(detail=detail, plane=plane)


@dataclass(frozen=True, slots=True)
class EVStateChanged(Event):
    """Entropy value ``ev`` (32-bit wire value ``value``, plane ``plane``) went ``old`` ->
    ``new``.

    ``old_backup``/``new_backup``: the EV was / is GOOD but waiting in the backup pool (a
    backup joining the rotation is GOOD -> GOOD with ``old_backup`` set). ``detail``: the
    variable part of the reason's phrase, empty for most reasons.
    """

    time: float
    ev: int
    value: int
    plane: int
    old: EVState
    new: EVState
    reason: EVReason
    old_backup: bool = False
    new_backup: bool = False
    detail: str = ""

    @property
    def old_label(self) -> str:
        return self.old.label(self.old_backup)

    @property
    def new_label(self) -> str:
        return self.new.label(self.new_backup)

    @property
    def reason_text(self) -> str:
        return self.reason.describe(self.detail, self.plane)
