"""Check the shipped Wireshark Lua dissector (mrc/wireshark/mrc.lua) against mrc.wire.

The stock RoCEv2 dissector leaves MRC's own parts undecoded (BTH byte 4 marks, the ACK
extension, probes, the security block; see tests/wire/test_tshark.py). The Lua post-dissector
decodes them under ``mrc.*``; this test writes real datagrams made by ``mrc.wire`` and
``mrc.security.packet.Sealer`` into a pcap (no capture, so no root needed), has tshark decode
it with the script, and checks every ``mrc.*`` field against what was packed. A missing or
broken script fails: tshark refuses ``-e`` fields nobody registered.

Skipped when tshark is missing or built without Lua.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import pytest
from wire.tshark_fields import read_fields

import mrc
from mrc import wire
from mrc.security.packet import ICV_LEN, SEC_BLOCK_LEN, DirectionKeys, Mode, Sealer

TSHARK = shutil.which("tshark")
LUA = os.path.join(os.path.dirname(mrc.__file__), "wireshark", "mrc.lua")


def _lua_reason() -> str | None:
    if TSHARK is None:
        return "tshark not on PATH (Debian/Ubuntu: apt-get install tshark)"
    out = subprocess.run([TSHARK, "-v"], capture_output=True, timeout=30, check=False).stdout
    if b"with Lua" not in out:
        return "tshark is built without Lua"
    return None


_REASON = _lua_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

ALT_PORT = 18515
QPN = 0x1A2B3C
ACK_QPN = 0x0C0FFE
BITMAP = 0xF0F0_0000_FFFF_0001
SACK_BASE = 0xFFFFF0  # near the 24-bit wrap: the listed PSNs must wrap too
TAG = 0xA1B2C3
SEND_US = 0x12_3456_789A  # 40 bits
TOKEN = (TAG << 40) | SEND_US
KEYS = DirectionKeys(key_id=0xC001D00D, header_key=bytes(range(16)), payload_key=bytes(16))
COUNTER = 0x0102_0304_0506_0707  # the next seal uses COUNTER + 1


def _ev(port: int, label: int = 0xBEEF) -> int:
    """A 32-bit EV whose two halves differ, so a swapped or cut field shows."""
    return wire.ev_value(port, label)


FIELDS = [
    "frame.number",
    "udp.dstport",
    "mrc.opcode",
    "mrc.kind",
    "mrc.fecn",
    "mrc.becn",
    "mrc.trimmed",
    "mrc.lasthop",
    "mrc.ackreq",
    "mrc.secure",
    "mrc.tlp",
    "mrc.qpn",
    "mrc.psn",
    "mrc.dma_len",
    "mrc.payload_len",
    "mrc.is_trimmed",
    "mrc.ack.psn",
    "mrc.ack.syndrome",
    "mrc.ack.is_nak",
    "mrc.ack.nak_code",
    "mrc.ack.nak_name",
    "mrc.ack.subject_psn",
    "mrc.ack.subject_dup",
    "mrc.ack.sack_base",
    "mrc.ack.bitmap",
    "mrc.ack.sack_count",
    "mrc.ack.sacked_psn",
    "mrc.ack.ev",
    "mrc.ack.ev_port",
    "mrc.ack.ev_label",
    "mrc.ack.port_state",
    "mrc.ack.ack_delay",
    "mrc.ack.ack_delay_us",
    "mrc.probe.seq",
    "mrc.probe.ev",
    "mrc.probe.ev_port",
    "mrc.probe.ev_label",
    "mrc.probe.flags",
    "mrc.probe.reserved",
    "mrc.probe.token",
    "mrc.probe.tag",
    "mrc.probe.time_us",
    "mrc.sec.key_id",
    "mrc.sec.counter",
    "mrc.sec.header_icv",
    "mrc.sec.payload_icv_integrity",
    "mrc.sec.payload_icv_encrypt",
]


@dataclass
class Sent:
    """One datagram of the pcap and the fields the dissector must report for it."""

    name: str
    data: bytes
    want: dict[str, object]
    dport: int = wire.DEFAULT_PORT


def _payload(n: int, seed: int) -> bytes:
    return bytes((seed + 7 * i) & 0xFF for i in range(n))


def _sealer(mode: Mode) -> Sealer:
    s = Sealer(KEYS, mode)
    s.counter = COUNTER
    return s


def _bth(kind: str, opcode: int, qpn: int, **marks: bool) -> dict[str, object]:
    want: dict[str, object] = {"mrc.kind": kind, "mrc.opcode": opcode, "mrc.qpn": qpn}
    for m in ("fecn", "becn", "trimmed", "lasthop", "ackreq", "secure", "tlp"):
        want[f"mrc.{m}"] = marks.get(m, False)
    return want


def _sec(block: bytes, payload_part: bytes | None) -> dict[str, object]:
    """What the dissector shows for a security block; the payload ICV in both candidate places."""
    want: dict[str, object] = {
        "mrc.sec.key_id": int.from_bytes(block[0:4], "big"),
        "mrc.sec.counter": int.from_bytes(block[4:12], "big"),
        "mrc.sec.header_icv": block[12:28].hex(),
    }
    if payload_part is not None:
        want["mrc.sec.payload_icv_integrity"] = payload_part[:ICV_LEN].hex()
        want["mrc.sec.payload_icv_encrypt"] = payload_part[-ICV_LEN:].hex()
    else:
        want["mrc.sec.payload_icv_integrity"] = None
        want["mrc.sec.payload_icv_encrypt"] = None
    return want


def _data(psn: int, dma: int, present: int, trimmed: bool) -> dict[str, object]:
    return {
        "mrc.psn": psn,
        "mrc.dma_len": dma,
        "mrc.payload_len": present,
        "mrc.is_trimmed": trimmed,
    }


def _ack(
    ack_psn: int,
    syndrome: int,
    subject: int,
    ev: int,
    ports: int,
    nak: tuple[int, str] | None,
    dup: bool = False,
) -> dict[str, object]:
    sacked = [(SACK_BASE + i) % (1 << 24) for i in range(64) if BITMAP >> i & 1]
    return {
        "mrc.ack.psn": ack_psn,
        "mrc.ack.syndrome": syndrome,
        "mrc.ack.is_nak": nak is not None,
        "mrc.ack.nak_code": None if nak is None else nak[0],
        "mrc.ack.nak_name": None if nak is None else nak[1],
        "mrc.ack.subject_psn": subject,
        "mrc.ack.subject_dup": dup,
        "mrc.ack.sack_base": SACK_BASE,
        "mrc.ack.bitmap": BITMAP,
        "mrc.ack.sack_count": len(sacked),
        "mrc.ack.sacked_psn": sacked,
        "mrc.ack.ev": ev,
        "mrc.ack.ev_port": ev >> 16,
        "mrc.ack.ev_label": ev & 0xFFFF,
        "mrc.ack.port_state": ports,
        "mrc.ack.ack_delay": 0,
        "mrc.ack.ack_delay_us": 0,
    }


def _probe(seq: int, ev: int) -> dict[str, object]:
    return {
        "mrc.probe.seq": seq,
        "mrc.probe.ev": ev,
        "mrc.probe.ev_port": ev >> 16,
        "mrc.probe.ev_label": ev & 0xFFFF,
        "mrc.probe.flags": 0,
        "mrc.probe.reserved": 0,
        "mrc.probe.token": TOKEN,
        "mrc.probe.tag": TAG,
        "mrc.probe.time_us": SEND_US,
    }


def _packets() -> list[Sent]:
    out: list[Sent] = []
    w = wire.Opcode.RDMA_WRITE_ONLY
    wi = wire.Opcode.RDMA_WRITE_ONLY_IMM
    hdr = wire.pack_data(QPN, 0xABCDEF, 0x1_0000_2000, 0xDEAD_BEEF, 64, False, None)
    out.append(
        Sent(
            "write",
            hdr + _payload(64, 1),
            _bth("RDMA_WRITE_ONLY", w, QPN) | _data(0xABCDEF, 64, 64, False),
        )
    )
    hdr = wire.pack_data(QPN, 0xFFFFFF, 0x1_0001_0040, 0x0BAD_F00D, 32, True, 0xCAFE_BABE)
    out.append(
        Sent(
            "write_imm",
            hdr + _payload(32, 2),
            _bth("RDMA_WRITE_ONLY_IMM", wi, QPN, ackreq=True) | _data(0xFFFFFF, 32, 32, False),
        )
    )
    # cut by a trimming switch on the last hop: headers only, T and L set, RETH still 1400
    cut = bytearray(wire.pack_data(QPN, 0x42, 0x1_0000_0000, 0x1234_5678, 1400, False, None))
    cut[4] |= wire.BTH_TRIMMED | wire.BTH_LASTHOP
    out.append(
        Sent(
            "trimmed",
            bytes(cut),
            _bth("RDMA_WRITE_ONLY", w, QPN, trimmed=True, lasthop=True)
            | _data(0x42, 1400, 0, True),
        )
    )
    # shorter than its DMA length without any mark (a cut the switch did not flag)
    hdr = wire.pack_data(QPN, 0x43, 0x1_0000_0578, 0x1234_5678, 1400, False, None)
    out.append(
        Sent(
            "short_unmarked",
            hdr + _payload(100, 3),
            _bth("RDMA_WRITE_ONLY", w, QPN) | _data(0x43, 1400, 100, True),
        )
    )
    ce = bytearray(wire.pack_data(QPN, 0x44, 0x1_0000_0600, 0x1234_5678, 16, True, None))
    ce[4] |= wire.BTH_FECN
    out.append(
        Sent(
            "fecn",
            bytes(ce) + _payload(16, 4),
            _bth("RDMA_WRITE_ONLY", w, QPN, fecn=True, ackreq=True) | _data(0x44, 16, 16, False),
        )
    )
    tlp = bytearray(wire.pack_data(QPN, 0x45, 0x1_0000_0700, 0x1234_5678, 16, True, None))
    tlp[8] |= wire.BTH_TLP  # a tail loss probe's copy
    out.append(
        Sent(
            "tlp",
            bytes(tlp) + _payload(16, 5),
            _bth("RDMA_WRITE_ONLY", w, QPN, ackreq=True, tlp=True) | _data(0x45, 16, 16, False),
        )
    )
    a = wire.Opcode.ACKNOWLEDGE
    ack = bytearray(
        wire.pack_ack(ACK_QPN, 0x123, wire.AETH_ACK, 0x125, SACK_BASE, BITMAP, _ev(50001), 0xFFFD)
    )
    ack[4] |= wire.BTH_BECN  # the ECN echo
    out.append(
        Sent(
            "ack_ecn_echo",
            bytes(ack),
            _bth("ACKNOWLEDGE", a, ACK_QPN, becn=True)
            | _ack(0x123, wire.AETH_ACK, 0x125, _ev(50001), 0xFFFD, None),
        )
    )
    dup = wire.ACK_SUBJECT_DUP | 0x126  # the subject had arrived before
    out.append(
        Sent(
            "ack_subject_dup",
            wire.pack_ack(
                ACK_QPN, 0x124, wire.AETH_ACK, dup, SACK_BASE, BITMAP, _ev(50002, 0), 0xFFFF
            ),
            _bth("ACKNOWLEDGE", a, ACK_QPN)
            | _ack(0x124, wire.AETH_ACK, 0x126, _ev(50002, 0), 0xFFFF, None, dup=True),
        )
    )
    for i, code in enumerate(wire.NackCode):
        syn = wire.AETH_NAK_BASE | code
        out.append(
            Sent(
                f"nak_{code.name.lower()}",
                wire.pack_ack(
                    ACK_QPN, 0x200 + i, syn, 0x300 + i, SACK_BASE, BITMAP, _ev(50010 + i, i)
                ),
                _bth("ACKNOWLEDGE", a, ACK_QPN)
                | _ack(0x200 + i, syn, 0x300 + i, _ev(50010 + i, i), 0xFFFF, (code, code.name)),
            )
        )
    out.append(
        Sent(
            "probe",
            wire.pack_probe(ACK_QPN, 7, _ev(50004), TOKEN, reply=False),
            _bth("PROBE", wire.Opcode.PROBE, ACK_QPN) | _probe(7, _ev(50004)),
        )
    )
    out.append(
        Sent(
            "probe_reply",
            wire.pack_probe(QPN, 9, _ev(65535, 0xFFFF), TOKEN, reply=True),
            _bth("PROBE_REPLY", wire.Opcode.PROBE_REPLY, QPN) | _probe(9, _ev(65535, 0xFFFF)),
        )
    )
    # protected datagrams, sealed as a queue pair with keys seals them
    for mode in Mode:
        hdr = wire.pack_data(QPN, 0x50, 0x1_0000_8000, 0xFEED, 48, True, None)
        head, rest = _sealer(mode).seal_pair(hdr, _payload(48, 5))
        whole = head + bytes(rest)
        out.append(
            Sent(
                f"sealed_{mode.value}",
                whole,
                _bth("RDMA_WRITE_ONLY", w, QPN, ackreq=True, secure=True)
                | _data(0x50, 48, 48, False)
                | _sec(whole[28:56], whole[56:]),
            )
        )
    # a protected packet missing only its last 20 bytes: longer than headers + DMA Length,
    # still trimmed once the 44 bytes of protection are counted
    head, rest = _sealer(Mode.ENCRYPT).seal_pair(
        wire.pack_data(QPN, 0x52, 0x1_0000_A000, 0xFEED, 48, False, None), _payload(48, 8)
    )
    tail_cut = (head + bytes(rest))[:-20]
    out.append(
        Sent(
            "sealed_tail_cut",
            tail_cut,
            _bth("RDMA_WRITE_ONLY", w, QPN, secure=True)
            | _data(0x52, 48, 48 - 20, True)
            | _sec(tail_cut[28:56], None),
        )
    )
    head, _ = _sealer(Mode.INTEGRITY).seal_pair(
        wire.pack_data(QPN, 0x51, 0x1_0000_9000, 0xFEED, 1400, False, None), _payload(1400, 6)
    )
    cut = bytearray(head[: wire.DATA_HDR_LEN + SEC_BLOCK_LEN])  # a switch keeps hdr + block
    cut[4] |= wire.BTH_TRIMMED
    out.append(
        Sent(
            "sealed_trimmed",
            bytes(cut),
            _bth("RDMA_WRITE_ONLY", w, QPN, trimmed=True, secure=True)
            | _data(0x51, 1400, 0, True)
            | _sec(bytes(cut[28:56]), None),
        )
    )
    head, _ = _sealer(Mode.ENCRYPT).seal_pair(
        wire.pack_ack(ACK_QPN, 0x77, wire.AETH_ACK, 0x78, SACK_BASE, BITMAP, _ev(50020), 0xFFFE),
        None,
    )
    out.append(
        Sent(
            "sealed_ack",
            head,
            _bth("ACKNOWLEDGE", a, ACK_QPN, secure=True)
            | _ack(0x77, wire.AETH_ACK, 0x78, _ev(50020), 0xFFFE, None)
            | _sec(head[wire.ACK_LEN : wire.ACK_LEN + SEC_BLOCK_LEN], None),
        )
    )
    head, _ = _sealer(Mode.INTEGRITY).seal_pair(
        wire.pack_probe(ACK_QPN, 3, _ev(50030), TOKEN, reply=False), None
    )
    out.append(
        Sent(
            "sealed_probe",
            head,
            _bth("PROBE", wire.Opcode.PROBE, ACK_QPN, secure=True)
            | _probe(3, _ev(50030))
            | _sec(head[wire.PROBE_LEN : wire.PROBE_LEN + SEC_BLOCK_LEN], None),
        )
    )
    hdr = wire.pack_data(QPN, 0x60, 0x1_0000_4000, 0x0ACE, 24, True, None)
    out.append(
        Sent(
            "alt_port",
            hdr + _payload(24, 7),
            _bth("RDMA_WRITE_ONLY", w, QPN, ackreq=True) | _data(0x60, 24, 24, False),
            dport=ALT_PORT,
        )
    )
    return out


def _frame(sport: int, dport: int, payload: bytes) -> bytes:
    """Ethernet + IPv6 (::1 -> ::1) + UDP with a correct checksum around ``payload``."""
    addr = bytes(15) + b"\x01"
    ulen = 8 + len(payload)
    pseudo = addr + addr + struct.pack("!IxxxB", ulen, 17)
    udp = struct.pack("!HHHH", sport, dport, ulen, 0) + payload
    data = pseudo + udp + (b"\x00" if len(udp) % 2 else b"")
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    csum = (~s & 0xFFFF) or 0xFFFF
    udp = udp[:6] + csum.to_bytes(2, "big") + udp[8:]
    ip6 = struct.pack("!IHBB", 6 << 28, ulen, 17, 64) + addr + addr
    return bytes(12) + b"\x86\xdd" + ip6 + udp


def _write_pcap(path: Path, frames: list[bytes]) -> None:
    with path.open("wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))  # LINKTYPE_ETHERNET
        for i, fr in enumerate(frames):
            fh.write(struct.pack("<IIII", 1_700_000_000 + i, 0, len(fr), len(fr)) + fr)


def _decode(pcap: Path, *extra: str) -> list[dict[str, list[str]]]:
    """tshark's reading of ``pcap`` with the script: per frame, each field's values."""
    assert TSHARK is not None
    return read_fields(TSHARK, str(pcap), FIELDS, "-X", f"lua_script:{LUA}", *extra)


def _value(raw: str, want: object) -> object:
    """tshark's text for one field value, read as the type of ``want``."""
    if isinstance(want, bool):
        assert raw in ("0", "1", "False", "True", "false", "true"), raw
        return raw in ("1", "True", "true")
    if isinstance(want, int):
        return int(raw, 0)
    return raw


class Decoded(TypedDict):
    """The module's pcap, what it holds and tshark's reading of it, frame by frame."""

    packets: list[Sent]
    pcap: Path
    frames: list[dict[str, list[str]]]


@pytest.fixture(scope="module")
def decoded(tmp_path_factory: pytest.TempPathFactory) -> Decoded:
    packets = _packets()
    pcap = tmp_path_factory.mktemp("lua") / "mrc.pcap"
    _write_pcap(pcap, [_frame(40000 + i, p.dport, p.data) for i, p in enumerate(packets)])
    return {"packets": packets, "pcap": pcap, "frames": _decode(pcap)}


def test_script_is_shipped_as_package_data() -> None:
    """tshark is pointed at the installed package's copy, so the wheel must carry it."""
    assert os.path.isfile(LUA)
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    cfg = tomllib.loads(pyproject.read_text())
    assert "wireshark/*.lua" in cfg["tool"]["setuptools"]["package-data"]["mrc"]


def test_every_field_matches_what_was_packed(decoded: Decoded) -> None:
    packets: list[Sent] = decoded["packets"]
    frames: list[dict[str, list[str]]] = decoded["frames"]
    assert len(frames) == len(packets)
    checked = set()
    for p, fr in zip(packets, frames, strict=True):
        if p.dport != wire.DEFAULT_PORT:
            assert fr["mrc.kind"] == [], f"{p.name}: port {p.dport} decoded by default"
            continue
        for field in FIELDS[2:]:
            want = p.want.get(field)
            got = fr[field]
            if want is None:
                assert got == [], f"{p.name}: {field} = {got}, expected absent"
                continue
            wants = want if isinstance(want, list) else [want]
            assert [_value(g, w) for g, w in zip(got, wants, strict=False)] == wants, (
                f"{p.name}: {field} = {got}, expected {want}"
            )
            assert len(got) == len(wants), f"{p.name}: {field} = {got}, expected {want}"
            checked.add(field)
    assert checked == set(FIELDS[2:]), f"fields never checked: {set(FIELDS[2:]) - checked}"


def test_other_port_by_preference(decoded: Decoded) -> None:
    """-o mrc.udp_port moves the dissector to another listen port (and off 4791)."""
    frames = _decode(decoded["pcap"], "-o", f"mrc.udp_port:{ALT_PORT}")
    for p, fr in zip(decoded["packets"], frames, strict=True):
        if p.dport == ALT_PORT:
            assert fr["mrc.kind"] == ["RDMA_WRITE_ONLY"]
            assert int(fr["mrc.dma_len"][0]) == 24
            assert [_value(v, True) for v in fr["mrc.ackreq"]] == [True]
        else:
            assert fr["mrc.kind"] == []


def test_sealed_payload_icvs_are_where_the_modes_put_them(decoded: Decoded) -> None:
    """Integrity: the ICV right after the block; encrypt: the last 16 bytes (PROTOCOL.md 11)."""
    by_name = {p.name: p for p in decoded["packets"]}
    for mode in Mode:
        want = by_name[f"sealed_{mode.value}"].want
        whole = by_name[f"sealed_{mode.value}"].data
        start = wire.DATA_HDR_LEN + SEC_BLOCK_LEN
        assert len(whole) == start + 48 + ICV_LEN
        if mode is Mode.INTEGRITY:
            assert whole[start + ICV_LEN :] == _payload(48, 5)  # payload in clear after the ICV
            assert want["mrc.sec.payload_icv_integrity"] == whole[start : start + ICV_LEN].hex()
        else:
            assert want["mrc.sec.payload_icv_encrypt"] == whole[-ICV_LEN:].hex()
        assert want["mrc.sec.counter"] == COUNTER + 1
        assert want["mrc.sec.key_id"] == KEYS.key_id
