#!/usr/bin/env python3
"""Where the time of one MRC packet goes: a cost model, in microseconds per data packet.

Two parts, printed as JSON and a table (docs/PERFORMANCE.md quotes them):

* **the core**: a sender QP and a receiver QP driven against each other in memory (no sockets,
  no event loop) for ``--size`` bytes. The stages of interest are timed by wrapping their
  methods with a clock, the wrapper's own cost measured and taken off. Stages are inclusive:
  "sender: datagrams_to_send" contains "EV choice" and "packet build"; "receiver: on_data"
  contains "SACK bookkeeping"; protection is timed on its own. Every figure is per data packet
  (an ACK's cost is spread over the packets it acknowledges).
* **the kernel**: the same datagrams through loopback UDP sockets: one ``sendmsg`` per datagram,
  one ``recv_into`` per datagram, and GSO sends / GRO receives of 7 at a time.

Run with the venv's python: ``.venv/bin/python tools/profile_core.py [--size 128M]
[--security integrity] [--burst 8] [--json]``. No root needed.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from mrc.cli.common import emit_json
from mrc.core import QPConfig, QueuePair
from mrc.core.evset import EVSet
from mrc.core.memory import Access, ProtectionDomain
from mrc.core.requester import Requester
from mrc.core.responder import Responder
from mrc.units import parse_size

PAYLOAD = 8192
EVS = 16


class Stopwatch:
    """Accumulates nanoseconds per wrapped method, minus the wrapper's own cost."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.overhead = 0.0
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)
        clock = time.perf_counter_ns
        ns, calls = self.ns, self.calls
        ns[label] = calls[label] = 0

        def timed(*args: Any, **kw: Any) -> Any:
            t0 = clock()
            try:
                return inner(*args, **kw)
            finally:
                ns[label] += clock() - t0
                calls[label] += 1

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, inner))

    def calibrate(self) -> None:
        class Probe:
            def f(self) -> None:
                return None

        self.wrap(Probe, "f", "_probe")
        p = Probe()
        for _ in range(200_000):
            p.f()
        self.overhead = self.ns.pop("_probe") / self.calls.pop("_probe")
        self._undo.pop()()

    def restore(self) -> None:
        """Put every wrapped method back, the last wrapped first."""
        while self._undo:
            self._undo.pop()()

    def per_packet_us(self, packets: int) -> dict[str, float]:
        return {
            k: round((v - self.calls[k] * self.overhead) / packets / 1000, 3)
            for k, v in self.ns.items()
        }


def core_model(size: int, security: str, burst: int) -> dict[str, Any]:
    cfg = QPConfig(payload_size=PAYLOAD, max_outstanding=512, burst=burst)
    pd = ProtectionDomain()
    region = bytearray(size)
    mr = pd.register(region, Access.REMOTE_WRITE, "r")
    ports_a, ports_b = list(range(40000, 40000 + EVS)), list(range(50000, 50000 + EVS))
    a = QueuePair(1, ProtectionDomain(), ports_a, [0] * EVS, cfg, 100)
    b = QueuePair(2, pd, ports_b, [0] * EVS, cfg, 200)
    a.connect(2, 200)
    b.connect(1, 100)
    sw = Stopwatch()
    sw.calibrate()
    if security != "none":
        from mrc.security.packet import DirectionKeys, Mode, Protection

        k1 = DirectionKeys(1, os.urandom(16), os.urandom(16))
        k2 = DirectionKeys(2, os.urandom(16), os.urandom(16))
        mode = Mode(security)
        a.protect(Protection(k1, k2, mode))
        b.protect(Protection(k2, k1, mode))
        sw.wrap(Protection, "seal", "protection: seal (both sides)")
        sw.wrap(Protection, "unseal", "protection: unseal (both sides)")
    sw.wrap(Requester, "datagrams_to_send", "sender: datagrams_to_send")
    sw.wrap(EVSet, "next", "sender: EV choice (EVSet.next)")
    sw.wrap(Requester, "_build", "sender: packet build (_build)")
    sw.wrap(Requester, "on_ack", "sender: ACK processing (on_ack)")
    sw.wrap(Requester, "get_timer", "sender: timers (get_timer)")
    sw.wrap(Responder, "on_data", "receiver: on_data (parse, checks, placement, SACK)")
    sw.wrap(Responder, "_note_arrival", "receiver: SACK bookkeeping (_note_arrival)")
    sw.wrap(Responder, "datagrams_to_send", "receiver: ACK build (datagrams_to_send)")
    data = memoryview(os.urandom(size))
    a.post_write(data, mr.addr, mr.rkey, imm=1)
    now = 1.0
    packets = 0
    t0 = time.perf_counter()
    while not a.idle:
        now += 1e-5
        for ev, hdr, payload in a.datagrams_to_send(now):
            datagram = memoryview(bytearray(hdr + bytes(payload))) if payload else memoryview(hdr)
            b.receive_datagram(datagram, ports_a[ev], now)
            packets += 1
        a.get_timer()
        for ev, hdr, payload in b.datagrams_to_send(now + 0.001):
            a.receive_datagram(memoryview(hdr + bytes(payload)), ports_b[ev], now)
    wall = time.perf_counter() - t0
    sw.restore()
    if bytes(region[: 1 << 16]) != bytes(data[: 1 << 16]):
        raise SystemExit("profile_core: the data did not arrive intact")
    stages = sw.per_packet_us(packets)
    # placement alone: the copy of one payload into the region
    view, src = memoryview(region), data
    n = min(packets, 20_000)
    t = time.perf_counter()
    for i in range(n):
        off = (i * PAYLOAD) % (size - PAYLOAD)
        view[off : off + PAYLOAD] = src[off : off + PAYLOAD]
    stages["receiver: placement copy (8 KiB)"] = round((time.perf_counter() - t) / n * 1e6, 3)
    return {
        "packets": packets,
        "wall_us_per_packet": round(wall / packets * 1e6, 3),
        "note": "wall includes one copy of every datagram by this harness (header + payload)",
        "stages_us_per_packet": stages,
        "wrapper_overhead_ns": round(sw.overhead),
    }


def kernel_model(datagram: int, seconds: float = 1.0) -> dict[str, float]:
    """Microseconds per datagram through loopback: per-datagram calls, then GSO/GRO."""
    out: dict[str, float] = {}
    for gso in (1, 7):
        rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        rx.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)
        if gso > 1:
            rx.setsockopt(17, 104, 1)  # UDP_GRO
        rx.bind(("::1", 0))
        rx.setblocking(False)
        tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        tx.setsockopt(socket.SOL_SOCKET, 32, 4 << 20)
        tx.connect(rx.getsockname()[:2])
        cmsg = [(17, 103, struct.pack("=H", datagram))] if gso > 1 else []
        bufs = [bytes(datagram * gso)]
        buf = bytearray(65536)
        sent = got = 0
        send_ns = recv_ns = 0
        end = time.perf_counter() + seconds
        clock = time.perf_counter_ns
        while time.perf_counter() < end:
            t = clock()
            for _ in range(8):
                tx.sendmsg(bufs, cmsg)
            send_ns += clock() - t
            sent += 8 * gso
            t = clock()
            while True:
                try:
                    n, anc, _f, _a = rx.recvmsg_into([buf], 64)
                except BlockingIOError:
                    break
                seg = struct.unpack("=i", anc[0][2][:4])[0] if anc else n
                got += -(-n // seg)
            recv_ns += clock() - t
        tx.close()
        rx.close()
        kind = "per datagram" if gso == 1 else f"GSO/GRO x{gso}"
        out[f"send ({kind})"] = round(send_ns / sent / 1000, 3)
        out[f"receive ({kind})"] = round(recv_ns / max(got, 1) / 1000, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="profile_core.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=128 << 20, help="bytes (default 128M)")
    p.add_argument("--security", choices=["none", "integrity", "encrypt"], default="none")
    p.add_argument("--burst", type=int, default=1, help="QPConfig.burst (default 1)")
    p.add_argument("--json", action="store_true", help="JSON only")
    a = p.parse_args(argv)
    out = {
        "config": {"size": a.size, "payload": PAYLOAD, "evs": EVS, "security": a.security},
        "core": core_model(a.size, a.security, a.burst),
        "kernel_loopback_us_per_datagram": kernel_model(PAYLOAD + 28),
    }
    emit_json(out, indent=2)
    if not a.json:
        rows = list(out["core"]["stages_us_per_packet"].items())
        rows += [(f"kernel: {k}", v) for k, v in out["kernel_loopback_us_per_datagram"].items()]
        width = max(len(k) for k, _ in rows)
        print(f"\n{'stage':<{width}}  us/packet", file=sys.stderr)
        for k, v in rows:
            print(f"{k:<{width}}  {v:9.3f}", file=sys.stderr)
        print(
            f"{'core loop, both sides (wall)':<{width}}  {out['core']['wall_us_per_packet']:9.3f}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
