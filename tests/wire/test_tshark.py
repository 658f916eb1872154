"""Check our wire format against an independent decoder: Wireshark's RoCEv2 dissector (tshark).

Real datagrams built with ``mrc.wire`` are sent over IPv6 loopback, captured on ``lo`` by tshark,
and decoded again by tshark; every header field tshark reports must be exactly what we packed.
The behaviours of tshark that docs/PROTOCOL.md describes (the last 4 bytes of a data packet are
shown as an ICRC, the MRC ACK extension is not decoded, probes are "vendor specific", a
non-default port needs Decode As) are pinned here too, so the document stays true.

One capture (about 2 s) serves the whole module. Skipped when tshark is missing or cannot capture
on ``lo`` (it needs root or the wireshark group).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import TypedDict

import pytest
from wire.tshark_fields import read_fields, wait_capturing

from mrc import wire

TSHARK = shutil.which("tshark")

pytestmark = pytest.mark.skipif(
    TSHARK is None,
    reason="tshark not on PATH (Debian/Ubuntu: apt-get install tshark)",
)

ALT_PORT = 18515  # a non-default MRC port; nothing in Wireshark claims it
CAPTURE_START_TIMEOUT = 10.0
CAPTURE_END_TIMEOUT = 8.0

QPN = 0x1A2B3C
ACK_QPN = 0x0C0FFE
BITMAP = 0xF0F0_0000_FFFF_0001

FIELDS = [
    "frame.number",
    "udp.srcport",
    "udp.dstport",
    "udp.length",
    "udp.payload",
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.tver",
    "infiniband.bth.p_key",
    "infiniband.reserved",  # BTH byte 4: FECN/BECN and MRC's TRIMMED/LASTHOP marks
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.reserved7",  # BTH byte 8 below the A bit: MRC's S flag is 0x40
    "infiniband.bth.psn",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.immdt",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.syndrome.opcode",
    "infiniband.aeth.syndrome.credit_count",
    "infiniband.aeth.syndrome.error_code",
    "infiniband.aeth.msn",
    "infiniband.invariant.crc",
    "infiniband.vendor",
    "data.data",
]


@dataclass
class Sent:
    name: str
    dport: int
    data: bytes


def _payload(n: int, seed: int) -> bytes:
    return bytes((seed + 7 * i) & 0xFF for i in range(n))


def _packets(sport: int) -> list[Sent]:
    write_payload = _payload(64, 1)
    imm_payload = _payload(32, 2)
    trimmed = bytearray(
        wire.pack_data(QPN, 0x000042, 0x1_0000_0000, 0x1234_5678, 1400, False, None)
    )
    trimmed[4] |= wire.BTH_TRIMMED | wire.BTH_LASTHOP
    secure = bytearray(wire.pack_data(QPN, 0x000043, 0x1_0000_0578, 0x1234_5678, 16, False, None))
    secure[8] |= wire.BTH_SECURE
    nak = wire.AETH_NAK_BASE
    return [
        Sent(
            "write",
            wire.DEFAULT_PORT,
            wire.pack_data(QPN, 0xABCDEF, 0x1_0000_2000, 0xDEAD_BEEF, 64, False, None)
            + write_payload,
        ),
        Sent(
            "write_imm",
            wire.DEFAULT_PORT,
            wire.pack_data(QPN, 0xFFFFFF, 0x1_0001_0040, 0x0BAD_F00D, 32, True, 0xCAFE_BABE)
            + imm_payload,
        ),
        Sent(
            "ack",
            wire.DEFAULT_PORT,
            wire.pack_ack(
                ACK_QPN,
                0x000123,
                wire.AETH_ACK,
                0x000125,
                0x000100,
                BITMAP,
                wire.ev_value(sport, 0),
            ),
        ),
        Sent(
            "nack_trimmed",
            wire.DEFAULT_PORT,
            wire.pack_ack(
                ACK_QPN,
                0x000123,
                nak | wire.NackCode.TRIMMED,
                0x000130,
                0x000100,
                BITMAP,
                wire.ev_value(50001, 0xBEEF),
            ),
        ),
        Sent(
            "nack_trimmed_lasthop",
            wire.DEFAULT_PORT,
            wire.pack_ack(
                ACK_QPN,
                0x000123,
                nak | wire.NackCode.TRIMMED_LASTHOP,
                0x000131,
                0x000100,
                BITMAP,
                wire.ev_value(50002, 0x0001),
            ),
        ),
        Sent(
            "nack_access",
            wire.DEFAULT_PORT,
            wire.pack_ack(
                ACK_QPN,
                0x000123,
                nak | wire.NackCode.REMOTE_ACCESS_ERROR,
                0x000124,
                0x000100,
                BITMAP,
                wire.ev_value(50003, 0xFFFF),
            ),
        ),
        Sent("trimmed", wire.DEFAULT_PORT, bytes(trimmed)),
        Sent("secure", wire.DEFAULT_PORT, bytes(secure) + _payload(16, 3)),
        Sent(
            "probe",
            wire.DEFAULT_PORT,
            wire.pack_probe(
                ACK_QPN, 7, wire.ev_value(50004, 0xBEEF), 0x1122_3344_5566_7788, reply=False
            ),
        ),
        Sent(
            "probe_reply",
            wire.DEFAULT_PORT,
            wire.pack_probe(
                QPN, 7, wire.ev_value(50004, 0xBEEF), 0x1122_3344_5566_7788, reply=True
            ),
        ),
        Sent(
            "alt_write",
            ALT_PORT,
            wire.pack_data(QPN, 0x000001, 0x1_0000_4000, 0x0000_0ACE, 24, True, None)
            + _payload(24, 4),
        ),
    ]


class Capture(TypedDict):
    """The module's one capture: its file, the sender's port, what was sent and tshark's
    reading of each datagram, both by name."""

    pcap: str
    sport: int
    sent: dict[str, Sent]
    frames: dict[str, dict[str, list[str]]]


def _decode(pcap: str, *extra: str) -> list[dict[str, list[str]]]:
    """tshark's reading of ``pcap``: per frame, each field's values (all occurrences)."""
    assert TSHARK is not None
    return read_fields(TSHARK, pcap, FIELDS, *extra, timeout=30)


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Capture:
    assert TSHARK is not None
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        sock.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    sport = sock.getsockname()[1]
    packets = _packets(sport)
    pcap = str(tmp_path_factory.mktemp("tshark") / "mrc.pcap")
    # Filter on our own source port so other traffic on port 4791 (parallel tests) stays out.
    bpf = f"udp and src port {sport} and (dst port {wire.DEFAULT_PORT} or dst port {ALT_PORT})"
    proc = subprocess.Popen(
        [TSHARK, "-i", "lo", "-f", bpf, "-c", str(len(packets)), "-a", "duration:20", "-w", pcap],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        said = wait_capturing(proc, CAPTURE_START_TIMEOUT)
        if "Capturing on" not in said:
            pytest.skip(f"tshark cannot capture on lo (needs root or the wireshark group): {said}")
        time.sleep(0.2)  # "Capturing on" is printed as the capture opens; let it settle
        for p in packets:
            sock.sendto(p.data, ("::1", p.dport))
        try:
            proc.wait(timeout=CAPTURE_END_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tshark did not see all {len(packets)} datagrams on lo")
    finally:
        sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    default = _decode(pcap)
    assert len(default) == len(packets)
    by_payload = {p.data.hex(): p.name for p in packets}
    frames = {}
    for fr in default:
        frames[by_payload[fr["udp.payload"][0]]] = fr
    assert sorted(frames) == sorted(p.name for p in packets)
    return {
        "pcap": pcap,
        "sport": sport,
        "sent": {p.name: p for p in packets},
        "frames": frames,
    }


def _int(fr: dict[str, list[str]], field: str) -> int:
    values = fr[field]
    assert values, f"tshark reported no {field}"
    return int(values[0], 0)


def _check_bth(fr: dict[str, list[str]], opcode: int, qpn: int, psn: int, ackreq: bool) -> None:
    assert _int(fr, "infiniband.bth.opcode") == opcode
    assert _int(fr, "infiniband.bth.destqp") == qpn
    assert _int(fr, "infiniband.bth.psn") == psn
    assert _int(fr, "infiniband.bth.a") == int(ackreq)
    assert _int(fr, "infiniband.bth.tver") == wire.MRC_TVER
    assert _int(fr, "infiniband.bth.p_key") == wire.DEFAULT_PKEY
    assert _int(fr, "infiniband.bth.se") == 0
    assert _int(fr, "infiniband.bth.m") == 0
    assert _int(fr, "infiniband.bth.padcnt") == 0


def test_rdma_write_only(capture: Capture) -> None:
    fr = capture["frames"]["write"]
    payload = capture["sent"]["write"].data[wire.DATA_HDR_LEN :]
    assert _int(fr, "udp.srcport") == capture["sport"]
    assert _int(fr, "udp.dstport") == wire.DEFAULT_PORT
    assert _int(fr, "udp.length") == 8 + wire.DATA_HDR_LEN + 64
    _check_bth(fr, wire.Opcode.RDMA_WRITE_ONLY, QPN, 0xABCDEF, ackreq=False)
    assert _int(fr, "infiniband.reth.va") == 0x1_0000_2000
    assert _int(fr, "infiniband.reth.r_key") == 0xDEAD_BEEF
    assert _int(fr, "infiniband.reth.dmalen") == 64
    assert fr["infiniband.immdt"] == []
    assert fr["infiniband.aeth.syndrome"] == []
    # We send no ICRC; tshark takes the last 4 bytes of the payload for one (docs/PROTOCOL.md).
    assert _int(fr, "infiniband.invariant.crc") == int.from_bytes(payload[-4:], "big")
    assert fr["data.data"] == [payload[:-4].hex()]


def test_rdma_write_only_with_immediate(capture: Capture) -> None:
    fr = capture["frames"]["write_imm"]
    payload = capture["sent"]["write_imm"].data[wire.DATA_IMM_HDR_LEN :]
    assert _int(fr, "udp.length") == 8 + wire.DATA_IMM_HDR_LEN + 32
    _check_bth(fr, wire.Opcode.RDMA_WRITE_ONLY_IMM, QPN, 0xFFFFFF, ackreq=True)
    assert _int(fr, "infiniband.reth.va") == 0x1_0001_0040
    assert _int(fr, "infiniband.reth.r_key") == 0x0BAD_F00D
    assert _int(fr, "infiniband.reth.dmalen") == 32
    assert set(fr["infiniband.immdt"]) == {"cafebabe"}
    assert _int(fr, "infiniband.invariant.crc") == int.from_bytes(payload[-4:], "big")


def test_ack(capture: Capture) -> None:
    fr = capture["frames"]["ack"]
    assert _int(fr, "udp.length") == 8 + wire.ACK_LEN
    _check_bth(fr, wire.Opcode.ACKNOWLEDGE, ACK_QPN, 0x000123, ackreq=False)
    assert _int(fr, "infiniband.aeth.syndrome") == wire.AETH_ACK
    assert _int(fr, "infiniband.aeth.syndrome.opcode") == 0  # ACK
    assert _int(fr, "infiniband.aeth.syndrome.credit_count") == 0x1F  # "invalid": no credits
    assert _int(fr, "infiniband.aeth.msn") == 0
    assert fr["infiniband.reth.va"] == []
    # tshark stops after the AETH: the 24-byte MRC extension is carried but not decoded.
    # Its EV is 32 bits (source port << 16 | flow label bits), then Port State and 2 reserved.
    ext = bytes.fromhex(fr["udp.payload"][0])[wire.BTH_LEN + 4 :]
    assert ext == (0x000125).to_bytes(4, "big") + (0x000100).to_bytes(4, "big") + (
        BITMAP.to_bytes(8, "big")
        + capture["sport"].to_bytes(2, "big")
        + b"\x00\x00"  # flow label bits (none given here)
        + b"\xff\xff"  # port state
        + b"\x00\x00"  # reserved
    )
    assert fr["data.data"] == []
    assert fr["infiniband.invariant.crc"] == []


@pytest.mark.parametrize(
    ("name", "code", "subject", "ev"),
    [
        ("nack_trimmed", wire.NackCode.TRIMMED, 0x000130, (50001, 0xBEEF)),
        ("nack_trimmed_lasthop", wire.NackCode.TRIMMED_LASTHOP, 0x000131, (50002, 0x0001)),
        ("nack_access", wire.NackCode.REMOTE_ACCESS_ERROR, 0x000124, (50003, 0xFFFF)),
    ],
)
def test_nack(capture: Capture, name: str, code: int, subject: int, ev: tuple[int, int]) -> None:
    fr = capture["frames"][name]
    assert _int(fr, "udp.length") == 8 + wire.ACK_LEN
    _check_bth(fr, wire.Opcode.ACKNOWLEDGE, ACK_QPN, 0x000123, ackreq=False)
    assert _int(fr, "infiniband.aeth.syndrome") == wire.AETH_NAK_BASE | code
    assert _int(fr, "infiniband.aeth.syndrome.opcode") == 3  # NAK
    assert _int(fr, "infiniband.aeth.syndrome.error_code") == code
    got = wire.parse_ack(bytes.fromhex(fr["udp.payload"][0]))
    assert (got.subject_psn, wire.ev_parts(got.ev), got.port_state) == (subject, ev, 0xFFFF)


def test_trimmed_packet_marks_and_length(capture: Capture) -> None:
    """A header-only packet: RETH still says 1400 bytes; byte 4 carries TRIMMED|LASTHOP."""
    fr = capture["frames"]["trimmed"]
    assert _int(fr, "udp.length") == 8 + wire.DATA_HDR_LEN
    _check_bth(fr, wire.Opcode.RDMA_WRITE_ONLY, QPN, 0x000042, ackreq=False)
    assert _int(fr, "infiniband.reth.dmalen") == 1400
    assert fr["infiniband.reserved"] == [f"{wire.BTH_TRIMMED | wire.BTH_LASTHOP:02x}"]
    assert _int(fr, "infiniband.bth.reserved7") == 0
    # With no payload tshark's "ICRC" overlaps the last 4 RETH bytes (the DMA length).
    assert _int(fr, "infiniband.invariant.crc") == 1400
    assert capture["frames"]["write"]["infiniband.reserved"] == ["00"]


def test_security_flag_is_a_reserved_bit_to_tshark(capture: Capture) -> None:
    fr = capture["frames"]["secure"]
    _check_bth(fr, wire.Opcode.RDMA_WRITE_ONLY, QPN, 0x000043, ackreq=False)
    assert _int(fr, "infiniband.bth.reserved7") == wire.BTH_SECURE
    assert _int(fr, "infiniband.reth.dmalen") == 16


@pytest.mark.parametrize(
    ("name", "opcode", "qpn"),
    [
        ("probe", wire.Opcode.PROBE, ACK_QPN),
        ("probe_reply", wire.Opcode.PROBE_REPLY, QPN),
    ],
)
def test_probe_opcodes_are_vendor_specific(
    capture: Capture, name: str, opcode: int, qpn: int
) -> None:
    fr = capture["frames"][name]
    assert _int(fr, "udp.length") == 8 + wire.PROBE_LEN
    _check_bth(fr, opcode, qpn, 7, ackreq=False)
    ext = capture["sent"][name].data[wire.BTH_LEN :]
    assert len(ext) == 16  # EV (4), flags (2), reserved (2), token (8)
    assert ext[:4] == wire.ev_value(50004, 0xBEEF).to_bytes(4, "big")
    assert ext[4:8] == bytes(4) and ext[8:] == (0x1122_3344_5566_7788).to_bytes(8, "big")
    assert ext.hex() in fr["infiniband.vendor"]  # "Unknown/Vendor Specific Data", undecoded


def test_non_default_port_needs_decode_as(capture: Capture) -> None:
    pcap = capture["pcap"]
    fr = next(f for f in _decode(pcap) if _int(f, "udp.dstport") == ALT_PORT)
    assert fr["infiniband.bth.opcode"] == []  # not recognised as RoCEv2 by port alone
    for extra in (
        ["-d", f"udp.port=={ALT_PORT},infiniband"],
        ["-o", f"infiniband.rroce.port:{ALT_PORT}"],
    ):
        fr = next(f for f in _decode(pcap, *extra) if _int(f, "udp.dstport") == ALT_PORT)
        _check_bth(fr, wire.Opcode.RDMA_WRITE_ONLY, QPN, 1, ackreq=True)
        assert _int(fr, "infiniband.reth.va") == 0x1_0000_4000
        assert _int(fr, "infiniband.reth.r_key") == 0x0ACE
        assert _int(fr, "infiniband.reth.dmalen") == 24
