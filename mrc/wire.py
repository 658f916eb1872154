"""The MRC wire format: RoCEv2-shaped headers carried in UDP datagrams.

Every layout here is documented byte for byte in docs/PROTOCOL.md; keep the two in step.

Design choices (the reasons are in PROTOCOL.md, "Deviations"):

* Every data packet is a self-contained RDMA WRITE ONLY (or WRITE ONLY with immediate) with a
  RETH whose DMA length is the length of *this packet's* payload. A receiver can place it on
  arrival in any order, and a packet whose payload was trimmed in the network is recognised by
  the UDP payload being shorter than the header says. Standard RoCEv2 dissectors decode it.
* ACK, SACK and NACK share one layout: BTH + AETH + a 24-byte MRC ACK extension holding the
  SACK bitmap and the echoed entropy value (EV).
* PROBE and PROBE_REPLY use opcodes from the manufacturer-specific range.

Functions here do no allocation beyond the ``struct`` call they wrap: they sit on the per-packet
path.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

#: Default UDP destination port, as RoCEv2.
DEFAULT_PORT = 4791

#: Transport header version carried in the BTH TVer field. Anything else is dropped.
MRC_TVER = 0

#: P_Key we send; receivers do not check it (MRC has one partition per fabric).
DEFAULT_PKEY = 0xFFFF

#: An entropy value (EV) is 32 bits, MRC's "structured" format (mrc_ctl's STEV): the UDP
#: source port in the high 16 and the low 16 bits of the IPv6 flow label in the low 16. Where
#: the flow label is not carried (IPv4) those bits are 0 and the port alone tells EVs apart.
EV_LABEL_BITS = 16
EV_LABEL_MASK = (1 << EV_LABEL_BITS) - 1


def ev_value(port: int, label: int) -> int:
    """The 32-bit EV of a datagram from UDP source ``port`` with IPv6 flow label ``label``."""
    return (port << EV_LABEL_BITS) | (label & EV_LABEL_MASK)


def ev_parts(ev: int) -> tuple[int, int]:
    """(UDP source port, flow label bits) of a 32-bit EV: the inverse of :func:`ev_value`."""
    return ev >> EV_LABEL_BITS, ev & EV_LABEL_MASK


PSN_BITS = 24
PSN_MASK = (1 << PSN_BITS) - 1
QPN_MASK = (1 << 24) - 1


class Opcode(IntEnum):
    """BTH opcodes MRC uses (RC transport type 000 plus two manufacturer-specific ones)."""

    RDMA_WRITE_ONLY = 0x0A
    RDMA_WRITE_ONLY_IMM = 0x0B
    ACKNOWLEDGE = 0x11
    PROBE = 0xC0
    PROBE_REPLY = 0xC1


class NackCode(IntEnum):
    """The low five bits of an AETH NAK syndrome (0b011xxxxx).

    0-3 are InfiniBand's own codes; 16 and 17 are MRC's trim codes taken from the reserved range.
    """

    PSN_SEQUENCE_ERROR = 0  # used for "PSN out of window"
    INVALID_REQUEST = 1
    REMOTE_ACCESS_ERROR = 2  # bad rkey, access rights, or address/length outside the region
    REMOTE_OPERATIONAL_ERROR = 3
    TRIMMED = 16
    TRIMMED_LASTHOP = 17


# BTH byte 1: SE(1) M(1) PadCnt(2) TVer(4); byte 4: FECN(1) BECN(1) T(1) L(1) resv(4);
# byte 8: A(1) S(1) P(1) resv(5).
BTH_FECN = 0x80
BTH_BECN = 0x40
BTH_TRIMMED = 0x20  # set by a trimming switch on the packet it cut
BTH_LASTHOP = 0x10  # set with BTH_TRIMMED when the cut happened on the port into the receiver
BTH_ACKREQ = 0x80
BTH_SECURE = 0x40  # a security block follows the headers (mrc/security/packet.py)
#: a tail loss probe's copy of a data packet: the sender has heard nothing for a while, so the
#: receiver sends the ACK of it twice, the copy on another plane (docs/PROTOCOL.md 3.1)
BTH_TLP = 0x20

#: ACK Subject PSN field, top bit: the subject had arrived before (this copy is a duplicate).
#: Tells a requester whose tail loss probe was acknowledged whether the probed transmission had
#: been lost (flag clear: the probe was the first copy to arrive) or only its ACK (flag set)
ACK_SUBJECT_DUP = 0x80000000
AETH_ACK = 0x1F  # ACK syndrome with the "invalid credit" value: MRC has no credits
AETH_NAK_BASE = 0x60

# struct layouts (network byte order)
BTH = struct.Struct("!BBHII")  # opcode, flags, pkey, (byte4<<24 | dest QP), (byte8<<24 | PSN)
DATA_HDR = struct.Struct("!BBHIIQII")  # BTH + RETH(va, rkey, dma length)
DATA_IMM_HDR = struct.Struct("!BBHIIQIII")  # BTH + RETH + ImmDt
#: BTH + AETH + ext(subject psn, sack base, bitmap, ev, port state, ACK delay)
ACK_PKT = struct.Struct("!BBHIIIIIQIHH")
#: the unit of an ACK's ACK Delay (bytes 38-39), seconds: 8 us, so 16 bits reach 0.52 s
ACK_DELAY_UNIT = 8e-6
#: the largest ACK Delay: a longer one is sent as this (saturated)
ACK_DELAY_MAX = 0xFFFF
#: planes a connection may have: an ACK's Port State has a bit per plane, 16 of them
MAX_PLANES = 16
PROBE_PKT = struct.Struct("!BBHIIIHHQ")  # BTH + probe ext(ev, flags, reserved, token)

BTH_LEN = BTH.size  # 12
DATA_HDR_LEN = DATA_HDR.size  # 28
DATA_IMM_HDR_LEN = DATA_IMM_HDR.size  # 32
ACK_LEN = ACK_PKT.size  # 40
PROBE_LEN = PROBE_PKT.size  # 28

_FLAGS1 = MRC_TVER & 0x0F


def pack_data(
    qpn: int, psn: int, va: int, rkey: int, length: int, ackreq: bool, imm: int | None
) -> bytes:
    """Headers of one data packet; the payload (``length`` bytes) follows them."""
    b8 = (BTH_ACKREQ << 24) if ackreq else 0
    if imm is None:
        return DATA_HDR.pack(
            Opcode.RDMA_WRITE_ONLY, _FLAGS1, DEFAULT_PKEY, qpn, b8 | psn, va, rkey, length
        )
    return DATA_IMM_HDR.pack(
        Opcode.RDMA_WRITE_ONLY_IMM, _FLAGS1, DEFAULT_PKEY, qpn, b8 | psn, va, rkey, length, imm
    )


def ack_delay_code(seconds: float) -> int:
    """The ACK Delay field for a known delay of ``seconds``: in units of
    :data:`ACK_DELAY_UNIT`, rounded, at least 1 (0 says "unknown") and at most
    :data:`ACK_DELAY_MAX` (saturated)."""
    code = int(seconds / ACK_DELAY_UNIT + 0.5)
    return 1 if code < 1 else ACK_DELAY_MAX if code > ACK_DELAY_MAX else code


def pack_ack(
    qpn: int,
    ack_psn: int,
    syndrome: int,
    subject_psn: int,
    sack_base: int,
    bitmap: int,
    ev: int,
    port_state: int = 0xFFFF,
    ack_delay: int = 0,
) -> bytes:
    """An ACK (``syndrome`` = AETH_ACK) or NACK (``AETH_NAK_BASE | code``).

    ``ack_psn``: every PSN up to and including it has arrived (cumulative).
    ``subject_psn``: the packet that triggered this ACK, or the PSN a NACK is about.
    ``sack_base``/``bitmap``: bit i set means PSN ``sack_base + i`` has arrived.
    ``ev``: the entropy value the subject packet arrived on, all 32 bits (:func:`ev_value`).
    ``ack_delay``: how long the subject was in the receiving host before this ACK left, in
    :data:`ACK_DELAY_UNIT` (:func:`ack_delay_code`); 0: unknown.
    """
    return ACK_PKT.pack(
        Opcode.ACKNOWLEDGE,
        _FLAGS1,
        DEFAULT_PKEY,
        qpn,
        ack_psn,
        syndrome << 24,
        subject_psn,
        sack_base,
        bitmap,
        ev,
        port_state,
        ack_delay,
    )


def pack_probe(qpn: int, seq: int, ev: int, token: int, reply: bool) -> bytes:
    """A connectionless EV probe (or its reply, which echoes ``ev`` and ``token``)."""
    op = Opcode.PROBE_REPLY if reply else Opcode.PROBE
    return PROBE_PKT.pack(op, _FLAGS1, DEFAULT_PKEY, qpn, seq & PSN_MASK, ev, 0, 0, token)


@dataclass(frozen=True, slots=True)
class Ack:
    """A decoded ACK/NACK (not on the hot path: the core unpacks ACK_PKT directly)."""

    qpn: int
    ack_psn: int
    syndrome: int
    subject_psn: int
    sack_base: int
    bitmap: int
    ev: int
    port_state: int
    subject_dup: bool = False  # ACK_SUBJECT_DUP: the subject had arrived before
    #: the ACK Delay field: the subject's time in the receiving host, in ACK_DELAY_UNIT (0:
    #: unknown)
    ack_delay: int = 0

    @property
    def ack_delay_seconds(self) -> float | None:
        """The ACK Delay in seconds, None where the receiver did not know it (0)."""
        return self.ack_delay * ACK_DELAY_UNIT if self.ack_delay else None

    @property
    def is_nack(self) -> bool:
        return (self.syndrome & 0x60) == AETH_NAK_BASE

    @property
    def nack_code(self) -> int:
        return self.syndrome & 0x1F


def parse_ack(data: bytes | memoryview) -> Ack:
    """Decode an ACK-family packet; raises struct.error if it is too short."""
    (_op, _f, _pk, qpw, psnw, aeth, subj, base, bm, ev, ports, delay) = ACK_PKT.unpack_from(data)
    return Ack(
        qpw & QPN_MASK,
        psnw & PSN_MASK,
        aeth >> 24,
        subj & PSN_MASK,
        base,
        bm,
        ev,
        ports,
        bool(subj & ACK_SUBJECT_DUP),
        delay,
    )
