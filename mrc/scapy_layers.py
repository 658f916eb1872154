"""Scapy layers for MRC datagrams, for people who script captures (never the data path).

The Wireshark dissector (mrc/wireshark/mrc.lua) is for looking at captures; these layers are for
programs that read or forge them. ``import mrc.scapy_layers`` binds them to UDP port 4791 in
both directions (data goes to it, ACKs come from it); :func:`bind_port` adds another port. The
layouts are docs/PROTOCOL.md sections 3.1-3.5 and 11, the same as :mod:`mrc.wire`:

* :class:`MRCBTH` - the Base Transport Header with MRC's marks (FECN/BECN, trimmed T, last hop
  L, ACK request A, security block present S), then by opcode:
* :class:`MRCRETH` (RDMA WRITE; with :class:`MRCImmDt` after it for WRITE with immediate),
  :class:`MRCAck` (AETH and the SACK extension: subject PSN, SACK base and bitmap, echoed EV,
  port state, reserved) or :class:`MRCProbe` (EV, flags, reserved, token). An EV is 32 bits:
  the UDP source port in the high 16 and the flow label bits in the low 16
  (:func:`mrc.wire.ev_value`); ``ev_port`` and ``ev_label`` split it;
* :class:`MRCSecurity` when S is set: key id, counter, header ICV. What follows it is the payload
  with its ICV, first (integrity mode) or last (encrypt mode); the packet alone cannot tell.

Needs scapy (``pip install scapy``; it is in mrc's dev extra). The stock
``scapy.contrib.roce`` binds the same port: load one or the other.
"""

from __future__ import annotations

try:
    from scapy.fields import (
        BitField,
        ByteEnumField,
        IntField,
        LongField,
        ShortField,
        ThreeBytesField,
        X3BytesField,
        XByteField,
        XIntField,
        XLongField,
        XShortField,
        XStrFixedLenField,
    )
    from scapy.layers.inet import UDP
    from scapy.packet import Packet, Raw, bind_bottom_up, bind_layers
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"mrc.scapy_layers needs scapy (pip install scapy): {exc}") from None

from mrc.wire import DEFAULT_PORT, NackCode, Opcode, ev_parts

_OPCODES = {op.value: op.name for op in Opcode}
_DATA = (Opcode.RDMA_WRITE_ONLY, Opcode.RDMA_WRITE_ONLY_IMM)
_PROBES = (Opcode.PROBE, Opcode.PROBE_REPLY)


def _bth_of(layer: Packet) -> MRCBTH | None:
    """The BTH this layer follows, if it was decoded from (or stacked on) one."""
    under = layer.underlayer
    while under is not None and not isinstance(under, MRCBTH):
        under = under.underlayer
    return under


def _after_headers(layer: Packet) -> type[Packet]:
    """What follows a packet's last header: the security block if S is set, else the payload."""
    bth = _bth_of(layer)
    return MRCSecurity if bth is not None and bth.secure else Raw


class MRCBTH(Packet):
    """Base Transport Header: 12 bytes, opcode first."""

    name = "MRC BTH"
    fields_desc = [
        ByteEnumField("opcode", Opcode.RDMA_WRITE_ONLY, _OPCODES),
        BitField("se", 0, 1),
        BitField("m", 0, 1),
        BitField("padcnt", 0, 2),
        BitField("tver", 0, 4),
        XShortField("pkey", 0xFFFF),
        BitField("fecn", 0, 1),
        BitField("becn", 0, 1),
        BitField("trimmed", 0, 1),
        BitField("lasthop", 0, 1),
        BitField("resv4", 0, 4),
        X3BytesField("dqpn", 0),
        BitField("ackreq", 0, 1),
        BitField("secure", 0, 1),
        BitField("tlp", 0, 1),  # wire.BTH_TLP: a tail loss probe's copy
        BitField("resv5", 0, 5),
        ThreeBytesField("psn", 0),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        if self.opcode in _DATA:
            return MRCRETH
        if self.opcode == Opcode.ACKNOWLEDGE:
            return MRCAck
        if self.opcode in _PROBES:
            return MRCProbe
        return Raw

    def mysummary(self) -> str:
        marks = "".join(
            flag
            for flag, on in (
                ("T", self.trimmed),
                ("L", self.lasthop),
                ("S", self.secure),
                ("P", self.tlp),
            )
            if on
        )
        name = _OPCODES.get(self.opcode, hex(self.opcode))
        return f"MRC {name} qp={self.dqpn:#x} psn={self.psn}" + (f" [{marks}]" if marks else "")


class MRCRETH(Packet):
    """RDMA Extended Transport Header: where the payload goes and how long it was sent."""

    name = "MRC RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dma_len", 0)]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        bth = _bth_of(self)
        if bth is not None and bth.opcode == Opcode.RDMA_WRITE_ONLY_IMM:
            return MRCImmDt
        return _after_headers(self)


class MRCImmDt(Packet):
    """Immediate data of a WRITE with immediate."""

    name = "MRC ImmDt"
    fields_desc = [XIntField("imm", 0)]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return _after_headers(self)


class _EVHalves:
    """The two halves of a layer's 32-bit ``ev`` field (mrc.wire.ev_parts)."""

    ev: int

    @property
    def ev_port(self) -> int:
        """The UDP source port part of the EV (its high 16 bits)."""
        return ev_parts(int(self.ev))[0]

    @property
    def ev_label(self) -> int:
        """The flow label part of the EV (its low 16 bits)."""
        return ev_parts(int(self.ev))[1]


class MRCAck(_EVHalves, Packet):
    """AETH and MRC's SACK extension. The cumulative ACK PSN is the BTH's PSN."""

    name = "MRC ACK"
    fields_desc = [
        XByteField("syndrome", 0x1F),
        X3BytesField("msn", 0),
        BitField("subject_dup", 0, 1),  # wire.ACK_SUBJECT_DUP: the subject arrived before
        BitField("subject_zero", 0, 7),
        BitField("subject_psn", 0, 24),
        IntField("sack_base", 0),
        XLongField("bitmap", 0),
        XIntField("ev", 0),  # 32-bit EV: UDP source port << 16 | flow label bits
        XShortField("port_state", 0xFFFF),
        ShortField("ack_delay", 0),  # units of wire.ACK_DELAY_UNIT (8 us); 0: unknown
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return _after_headers(self)

    @property
    def is_nak(self) -> bool:
        return (int(self.syndrome) & 0x60) == 0x60

    @property
    def nak_code(self) -> NackCode | int | None:
        """The NAK code (a :class:`~mrc.wire.NackCode` when known), None for an ACK."""
        if not self.is_nak:
            return None
        code = int(self.syndrome) & 0x1F
        try:
            return NackCode(code)
        except ValueError:
            return code

    def sacked_psns(self) -> list[int]:
        """PSNs the bitmap says arrived (bit i: ``sack_base + i``, modulo 2**24)."""
        base, bits = int(self.sack_base), int(self.bitmap)
        return [(base + i) & 0xFFFFFF for i in range(64) if bits >> i & 1]

    def mysummary(self) -> str:
        code = self.nak_code
        what = "ACK" if code is None else f"NAK {code.name if isinstance(code, NackCode) else code}"
        return f"{what} subject={self.subject_psn} ev={self.ev_port}/{self.ev_label:#x}"


class MRCProbe(_EVHalves, Packet):
    """An EV probe or its reply. The probe sequence number is the BTH's PSN."""

    name = "MRC probe"
    fields_desc = [
        XIntField("ev", 0),  # 32-bit EV: UDP source port << 16 | flow label bits
        XShortField("flags", 0),
        XShortField("reserved", 0),
        XLongField("token", 0),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return _after_headers(self)

    @property
    def tag(self) -> int:
        """The keyed 24-bit tag of the token (docs/PROTOCOL.md section 3.5)."""
        return int(self.token) >> 40

    @property
    def time_us(self) -> int:
        """The 40-bit send time of the token, in microseconds."""
        return int(self.token) & ((1 << 40) - 1)


class MRCSecurity(Packet):
    """The security block of a keyed QP's datagram (docs/PROTOCOL.md section 11)."""

    name = "MRC security"
    fields_desc = [
        XIntField("key_id", 0),
        LongField("counter", 0),
        XStrFixedLenField("header_icv", b"\0" * 16, 16),
    ]


def bind_port(port: int) -> None:
    """Decode UDP datagrams to or from ``port`` as MRC too (a listener not on 4791); a
    ``UDP()/MRCBTH()`` built by hand gets ``dport=port``."""
    bind_layers(UDP, MRCBTH, dport=port)
    bind_bottom_up(UDP, MRCBTH, sport=port)


bind_port(DEFAULT_PORT)
# stacking by hand (MRCBTH()/MRCAck()) fills in the opcode; dissection goes by the opcode
bind_layers(MRCBTH, MRCRETH, opcode=Opcode.RDMA_WRITE_ONLY)
bind_layers(MRCBTH, MRCAck, opcode=Opcode.ACKNOWLEDGE)
bind_layers(MRCBTH, MRCProbe, opcode=Opcode.PROBE)

__all__ = [
    "MRCAck",
    "MRCBTH",
    "MRCImmDt",
    "MRCProbe",
    "MRCRETH",
    "MRCSecurity",
    "bind_port",
]
