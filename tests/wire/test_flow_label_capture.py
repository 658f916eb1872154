"""32-bit EVs on the wire: a real transfer captured on ``lo`` and decoded by tshark.

A connection of 8 active EVs (and its backups) opens one socket per route, here one, and tells
its EVs apart by IPv6 flow label. The capture must show it: every data datagram leaves from
that one source port with a flow label that, with the port, makes one of the sender's EV values
(``port << 16 | label``), every active EV carries data, every ACK comes from one of the
receiver's EVs the same way, and its Echoed EV (decoded by our Lua dissector) is the 32-bit
EV of a data datagram the capture holds. The data arrives intact. Skipped when tshark is
missing or cannot capture on ``lo``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from wire.tshark_fields import read_fields, wait_capturing

import mrc
from mrc import wire

TSHARK = shutil.which("tshark")
LUA = os.path.join(os.path.dirname(mrc.__file__), "wireshark", "mrc.lua")
EVS = 8
SIZE = 1 << 20
ECT0 = 2

pytestmark = pytest.mark.skipif(TSHARK is None, reason="tshark not on PATH")

FIELDS = [
    "udp.srcport",
    "udp.dstport",
    "ipv6.flow",
    "ipv6.tclass.ecn",
    "mrc.opcode",
    "mrc.ack.ev",
]


def _start_capture(pcap: Path, ports: tuple[int, int]) -> subprocess.Popen[bytes]:
    assert TSHARK is not None
    bpf = f"udp and (dst port {ports[0]} or dst port {ports[1]})"
    proc = subprocess.Popen(
        [TSHARK, "-i", "lo", "-f", bpf, "-a", "duration:60", "-w", str(pcap)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    said = wait_capturing(proc, 10.0)
    if "Capturing on" not in said:
        proc.kill()
        proc.wait()
        pytest.skip(f"tshark cannot capture on lo: {said}")
    time.sleep(0.5)  # "Capturing on" is printed as the capture opens; let it settle
    return proc


def _decode(pcap: Path, port: int) -> list[dict[str, list[str]]]:
    """The datagrams of ``pcap`` to ``port``, decoded with our Lua dissector."""
    assert TSHARK is not None
    script = ("-X", f"lua_script:{LUA}", "-o", f"mrc.udp_port:{port}")
    return read_fields(TSHARK, str(pcap), FIELDS, *script, "-Y", f"udp.dstport == {port}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # tshark writes out what it has and exits
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


async def test_evs_are_source_port_and_flow_label_on_the_wire(tmp_path: Path) -> None:
    data = os.urandom(SIZE)
    inbox = bytearray(SIZE)
    pcap = tmp_path / "evs.pcap"
    listener = await mrc.listen("::1", 0)
    conn = None
    proc = None
    try:
        listener.register(inbox, name="inbox")
        conn = await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=EVS))
        peer = await listener.accept(timeout=5)
        ports = (listener.port, conn.endpoint.port)
        proc = await asyncio.to_thread(_start_capture, pcap, ports)
        assert await conn.write(memoryview(data), conn.remote["inbox"], 0) == SIZE
        assert hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()
        await asyncio.sleep(0.3)  # let the last ACKs reach the capture (it has no end event)
        send_values = list(conn.qp.evs.values)
        recv_values = set(peer.qp.evs.values)
    finally:
        if proc is not None:
            await asyncio.to_thread(_stop, proc)
        if conn is not None:
            await conn.close()
        await listener.close()
    data_evs: list[int] = []
    acks: list[tuple[int, int]] = []  # (the ACK's own EV, the EV it echoes)
    # our dissector reads the datagrams to one port at a time: the listener's (data), then
    # the sender's receive port (ACKs)
    for port in ports:
        for fr in _decode(pcap, port):
            op = int(fr["mrc.opcode"][0], 0)
            ev = wire.ev_value(int(fr["udp.srcport"][0]), int(fr["ipv6.flow"][0], 0))
            assert int(fr["ipv6.tclass.ecn"][0], 0) == ECT0  # the label kept the ECN field
            if op in (wire.Opcode.RDMA_WRITE_ONLY, wire.Opcode.RDMA_WRITE_ONLY_IMM):
                data_evs.append(ev)
            elif op == wire.Opcode.ACKNOWLEDGE:
                acks.append((ev, int(fr["mrc.ack.ev"][0], 0)))
    # (on lo a GSO burst is captured as one frame: the first datagram's header is decoded)
    assert len(data_evs) >= EVS
    # one source port, EVs told apart by label: each datagram's is one of the sender's EVs
    assert len({ev >> wire.EV_LABEL_BITS for ev in data_evs}) == 1
    assert set(data_evs) <= set(send_values)
    assert set(send_values[:EVS]) <= set(data_evs)  # every active EV carried data
    assert all(ev & wire.EV_LABEL_MASK for ev in data_evs)  # no label left to the kernel
    assert acks
    assert {own for own, _echo in acks} <= recv_values
    assert {echo for _own, echo in acks} <= set(data_evs)
