"""Malformed and forged datagrams fired at a receiver in the middle of a real 64 MiB transfer.

The transfer must complete with a matching hash, and the receiver must count every datagram it
dropped under the right reason. Library in-process: the forging socket knows the receiver's QP
number, rkey and the sender's PSN space, so near-valid packets are wrong in exactly one way.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import time

import mrc
from mrc import wire

MiB = 1 << 20


def forgeries(qpn: int, other_qpn: int, psn: int, addr: int, rkey: int, length: int):
    """(reason, datagram) pairs; each datagram is wrong in exactly one way."""
    payload = b"\xee" * 64

    def data(qpn=qpn, psn=psn, va=addr, rkey=rkey, n=64, body=payload, flags1=None, op=None):
        hdr = bytearray(wire.pack_data(qpn, psn, va, rkey, n, False, None))
        if flags1 is not None:
            hdr[1] = flags1
        if op is not None:
            hdr[0] = op
        return bytes(hdr) + body

    secure = bytearray(data())
    secure[8] |= wire.BTH_SECURE
    imm_secure = bytearray(wire.pack_data(qpn, psn, addr, rkey, 64, False, 7) + payload)
    imm_secure[8] |= wire.BTH_SECURE
    far = (psn + (1 << 23) - 5) & wire.PSN_MASK
    return [
        ("short", b""),
        ("short", b"\x0a\x00\xff\xff\x00"),  # 5 bytes
        ("short", data()[: wire.BTH_LEN - 1]),
        ("bad_version", data(flags1=0x01)),  # TVer 1
        ("bad_version", data(flags1=0x0F)),
        ("unknown_qp", data(qpn=other_qpn)),
        ("bad_opcode", data(op=0x04)),  # RC SEND ONLY: not part of MRC
        ("bad_opcode", data(op=0x0C)),  # RC READ REQUEST
        ("short", data()[: wire.DATA_HDR_LEN - 1]),  # BTH ok, RETH cut
        ("bad_rkey", data(rkey=rkey ^ 0x5A5A5A5A)),
        ("out_of_bounds", data(va=addr + length - 32)),  # 64 bytes, 32 past the end
        ("out_of_bounds", data(va=addr - 64)),
        ("psn_out_of_window", data(psn=far)),
        ("bad_length", data(body=payload + b"\xee" * 16)),  # 80 bytes, header says 64
        ("security_unsupported", bytes(secure)),
        ("security_unsupported", bytes(imm_secure)),
    ]


async def test_malformed_datagrams_are_counted_and_the_transfer_survives() -> None:
    size = 64 * MiB
    data = os.urandom(size)
    inbox = bytearray(size)
    listener = await mrc.listen("::1", 0)
    conn = None
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        region_local = listener.register(inbox, name="inbox")
        cfg = mrc.QPConfig(payload_size=8192)
        conn = await mrc.connect("::1", listener.port, evs=128, config=cfg)
        peer = await listener.accept(timeout=5)
        region = conn.remote["inbox"]
        assert region.rkey == region_local.rkey
        qpn = peer.qpn
        other = (qpn + 1) & wire.QPN_MASK or 1
        assert other not in listener.endpoint.core.qps
        cases = forgeries(qpn, other, conn.qp.initial_psn, region.addr, region.rkey, size)
        expected: dict[str, int] = {}
        for reason, _ in cases:
            expected[reason] = expected.get(reason, 0) + 1

        fut = conn.post_write(memoryview(data), region, 0, imm=42)
        # wait for the transfer to be under way (placement has begun), then fire
        deadline = time.monotonic() + 10
        while peer.stats()["bytes_placed"] == 0:
            assert time.monotonic() < deadline, "transfer never started"
            await asyncio.sleep(0)
        forger.connect(("::1", listener.port))
        for _reason, dgram in cases:
            forger.send(dgram)
        assert not fut.done(), "transfer finished before the forgeries were sent"
        placed_when_fired = peer.stats()["bytes_placed"]
        assert placed_when_fired < size

        assert await asyncio.wait_for(fut, 30) == size
        assert await peer.next_immediate(timeout=5) == 42
        assert hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()

        # the forgeries sit in the socket queue behind data already there: await their count
        deadline = time.monotonic() + 5
        while sum(peer.stats()["dropped_by_reason"].values()) < len(cases):
            assert time.monotonic() < deadline, peer.stats()["dropped_by_reason"]
            await asyncio.sleep(0.01)
        assert peer.stats()["dropped_by_reason"] == expected
        assert peer.stats()["bytes_placed"] == size
        assert not peer.error and not conn.error
        # the receiver NACKed the forgeries it could attribute to the QP; the sender ignored
        # them because they name PSNs/EVs it never used that way
        st = conn.stats()
        assert st["nacks_ignored"] == st["nacks"]
        # no forged NACK caused a retransmission (timing-driven ones may happen on a loaded
        # machine; they are the core's business, not the forgeries')
        assert st["retransmits_nack"] == 0
    finally:
        forger.close()
        if conn is not None:
            await conn.close()
        await listener.close()


async def test_forgeries_before_any_data_do_not_disturb_a_later_transfer() -> None:
    """Forged packets for the right QP at the start of the PSN space must not be placed or
    count as received: the genuine packets with those PSNs must still be accepted."""
    size = 4 * MiB
    data = os.urandom(size)
    inbox = bytearray(size)
    listener = await mrc.listen("::1", 0)
    conn = None
    forger = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        listener.register(inbox, name="inbox")
        conn = await mrc.connect(
            "::1", listener.port, evs=16, config=mrc.QPConfig(payload_size=8192)
        )
        peer = await listener.accept(timeout=5)
        region = conn.remote["inbox"]
        qpn = peer.qpn
        cases = [
            c
            for c in forgeries(qpn, qpn ^ 1, conn.qp.initial_psn, region.addr, region.rkey, size)
            if c[0] not in ("short", "bad_version", "unknown_qp")
        ]
        forger.connect(("::1", listener.port))
        for _reason, dgram in cases:
            forger.send(dgram)
        deadline = time.monotonic() + 5
        while sum(peer.stats()["dropped_by_reason"].values()) < len(cases):
            assert time.monotonic() < deadline, peer.stats()["dropped_by_reason"]
            await asyncio.sleep(0.01)
        assert peer.stats()["packets_received"] == 0
        assert await conn.write(data, region, imm=9) == size
        assert await peer.next_immediate(timeout=5) == 9
        assert inbox == data
        # no real packet was taken for a duplicate of a forgery (only resends can duplicate)
        assert peer.stats()["duplicates"] <= conn.stats()["retransmits"]
    finally:
        forger.close()
        if conn is not None:
            await conn.close()
        await listener.close()
