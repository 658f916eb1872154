#!/usr/bin/env python3
"""Where the time of one MRC packet goes: a cost model, in microseconds per data packet.

Two parts, printed as JSON and a table (docs/PERFORMANCE.md quotes them):

* **the core**: a sender QP and a receiver QP driven against each other in memory (no sockets,
  no event loop) for ``--size`` bytes. The stages of interest are timed by wrapping their
  methods with a clock, the wrapper's own cost measured and taken off. Stages are inclusive:
  "sender: bursts_to_send" contains "EV choice" and "headers";
  "receiver: on_data" contains "SACK bookkeeping"; protection is timed on its own. Every
  figure is per data packet (an ACK's cost is spread over the packets it acknowledges).
  With ``--burst K`` the sender's bursts reach the receiver as GRO trains of K datagrams
  (``EndpointCore.receive_train``), as the transport delivers them.
* **the receive path**: the datagrams one sender run produced, recorded, then fed to fresh
  receivers three ways and timed as a whole: one ``receive_datagram`` per datagram (the path
  before trains), and trains through the Python and the native train kernel
  (``mrc.core.fastpath``). Lone datagrams take ``receive_datagram`` in every mode, as in the
  transport, so without ``--burst`` the three figures measure the same path.
* **the kernel**: the same datagrams through loopback UDP sockets: one ``sendmsg`` per datagram,
  one ``recv_into`` per datagram, and GSO sends / GRO receives of 7 at a time.

Run with the venv's python: ``.venv/bin/python tools/profile_core.py [--size 128M]
[--security integrity] [--burst 8] [--cc fixed] [--payload 1400] [--ack-lag] [--json]``. No
root needed.

With the default ``--cc nscc``, ``--burst`` is a maximum that NSCC sizes from the delivery rate
it measures; in memory every ACK arrives at once, no rate is ever measured, and every burst is
one packet. ``--cc fixed`` sends bursts of exactly ``--burst`` packets (the figure
``core.mean_burst`` says which case a run measured).
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

from mrc.cli.common import cc_arg, emit_json
from mrc.core import EndpointCore, QPConfig, QueuePair, fastpath
from mrc.core.events import Burst
from mrc.core.evset import EVSet
from mrc.core.memory import Access, ProtectionDomain
from mrc.core.requester import Requester
from mrc.core.responder import Responder
from mrc.transport.gso import sends, singles
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


def core_model(
    size: int, security: str, burst: int, cc: str, payload: int, ack_lag: bool = False
) -> dict[str, Any]:
    cfg = QPConfig(payload_size=payload, max_outstanding=512, burst=burst, cc=cc)
    pd = ProtectionDomain()
    region = bytearray(size)
    mr = pd.register(region, Access.REMOTE_WRITE, "r")
    ports_a, ports_b = list(range(40000, 40000 + EVS)), list(range(50000, 50000 + EVS))
    a = QueuePair(1, ProtectionDomain(), ports_a, [0] * EVS, cfg, 100)
    b = QueuePair(2, pd, ports_b, [0] * EVS, cfg, 200)
    a.connect(2, 200)
    b.connect(1, 100)
    rx = EndpointCore(pd)
    rx.add(b)
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
        # a burst sealed, a train's WRITEs opened, in one call each (where Protection has them)
        for name, label in (("seal_burst", "seal"), ("open_train", "unseal")):
            if hasattr(Protection, name):
                sw.wrap(Protection, name, f"protection: {label} (both sides)")
    sw.wrap(Requester, "bursts_to_send", "sender: bursts_to_send (all of it)")
    sw.wrap(EVSet, "next", "sender: EV choice (EVSet.next)")
    sw.wrap(fastpath, "pack_burst", "sender: headers (fastpath.pack_burst)")
    sw.wrap(Requester, "on_ack", "sender: ACK processing (on_ack)")
    sw.wrap(Requester, "get_timer", "sender: timers (get_timer)")
    sw.wrap(sys.modules[__name__], "sends", "sender: GSO sends of bursts (transport)")
    sw.wrap(EndpointCore, "receive_train", "receiver: receive_train (GRO trains, all of it)")
    sw.wrap(Responder, "on_data_train", "receiver: on_data_train (train kernel, SACK)")
    sw.wrap(Responder, "on_data", "receiver: on_data (parse, checks, placement, SACK)")
    sw.wrap(Responder, "_arrived", "receiver: SACK update of trains (_arrived)")
    sw.wrap(Responder, "_note_arrival", "receiver: SACK bookkeeping (_note_arrival)")
    sw.wrap(Responder, "datagrams_to_send", "receiver: ACK build (datagrams_to_send)")
    data = memoryview(os.urandom(size))
    a.post_write(data, mr.addr, mr.rkey, imm=1)
    now = 1.0
    packets = 0
    held: list[tuple[int, memoryview]] = []  # --ack-lag: the ACKs of the round before
    t0 = time.perf_counter()
    while not a.idle:
        now += 1e-5
        for train, seg, ev, count in _trains(a.bursts_to_send(now), burst):
            if seg:
                # writable, as a receive buffer is (a protected train is unsealed in place)
                rx.receive_train(memoryview(bytearray(train)), seg, ports_a[ev], now)
            else:
                rx.receive_datagram(memoryview(train), ports_a[ev], now)
            packets += count
        a.get_timer()
        replies = [
            (ev, memoryview(hdr + bytes(body)))
            for ev, hdr, body in b.datagrams_to_send(now + 0.001)
        ]
        if ack_lag:
            replies, held = held, replies
        for ev, ack in replies:
            a.receive_datagram(ack, ports_b[ev], now)
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
        off = (i * payload) % (size - payload)
        view[off : off + payload] = src[off : off + payload]
    size_name = f"{payload >> 10} KiB" if payload % 1024 == 0 else f"{payload} B"
    stages[f"receiver: placement copy ({size_name})"] = round(
        (time.perf_counter() - t) / n * 1e6, 3
    )
    acks = sw.calls["sender: ACK processing (on_ack)"]
    return {
        "packets": packets,
        "acks": acks,
        # the ACK path's cost per ACK (its per-packet figure spreads it over the packets)
        "on_ack_us_per_ack": round(
            stages["sender: ACK processing (on_ack)"] * packets / max(acks, 1), 3
        ),
        "wall_us_per_packet": round(wall / packets * 1e6, 3),
        "mean_burst": round(a.stats.data_packets_sent / max(a.stats.bursts, 1), 2),
        "note": "wall includes one copy of every datagram by this harness (header + payload)",
        "stages_us_per_packet": stages,
        "wrapper_overhead_ns": round(sw.overhead),
    }


def _trains(bursts: list[Burst], burst: int) -> list[tuple[bytes, int, int, int]]:
    """What the receiver gets: (bytes, GRO segment size or 0, EV, datagrams), one per GSO send
    when bursting, else one per datagram (bytes copied, as a socket would)."""
    out = []
    for ev, bufs, _cmsg, count in sends(bursts) if burst > 1 else singles(bursts):
        seg = len(bufs[0]) + len(bufs[1]) if count > 1 else 0
        out.append((b"".join(bytes(b) for b in bufs), seg, ev, count))
    return out


def receive_model(size: int, burst: int, cc: str, payload: int) -> dict[str, float | None]:
    """Microseconds per data packet of the whole receive path (routing, checks, placement,
    SACK bookkeeping, ACK build), for the same recorded datagrams taken three ways."""
    cfg = QPConfig(payload_size=payload, max_outstanding=512, burst=burst, cc=cc)
    pd = ProtectionDomain()
    mr = pd.register(bytearray(size), Access.REMOTE_WRITE, "r")
    ports_a, ports_b = list(range(40000, 40000 + EVS)), list(range(50000, 50000 + EVS))
    a = QueuePair(1, ProtectionDomain(), ports_a, [0] * EVS, cfg, 100)
    a.connect(2, 200)

    def receiver() -> tuple[EndpointCore, QueuePair]:
        b = QueuePair(2, pd, ports_b, [0] * EVS, cfg, 200)
        b.connect(1, 100)
        core = EndpointCore(pd)
        core.add(b)
        return core, b

    core, b = receiver()
    a.post_write(memoryview(os.urandom(size)), mr.addr, mr.rkey)
    recorded: list[tuple[float, list[tuple[bytes, int, int, int]]]] = []
    now = 1.0
    while not a.idle:
        now += 1e-5
        trains = _trains(a.bursts_to_send(now), burst)
        recorded.append((now, trains))
        for train, seg, ev, _n in trains:
            core.receive_train(memoryview(train), seg, ports_a[ev], now)  # one or a train
        for ev, hdr, body in b.datagrams_to_send(now + 0.001):
            a.receive_datagram(memoryview(hdr + bytes(body)), ports_b[ev], now)
    kernels = {
        "python": (fastpath.py_place_train, fastpath.py_note_arrivals),
        "native": (fastpath.native_place_train, fastpath.native_note_arrivals),
    }
    out: dict[str, float | None] = {}
    chosen = fastpath.place_train, fastpath.note_arrivals
    try:
        for _round in range(3):  # the best of three: the machine may be shared
            for mode in (
                "per datagram (receive_datagram)",
                "trains, python kernel",
                "trains, native",
            ):
                place, note = kernels["native" if mode.endswith("native") else "python"]
                if place is None or note is None:
                    out[mode] = None  # mrc._native not built, or MRC_NATIVE=0
                    continue
                fastpath.place_train, fastpath.note_arrivals = place, note
                us = _time_receive(receiver, recorded, ports_a, mode.startswith("per datagram"))
                if us is None:
                    raise SystemExit("profile_core: the receive model lost data")
                best = out.get(mode)
                out[mode] = us if best is None else min(best, us)
    finally:
        fastpath.place_train, fastpath.note_arrivals = chosen
    return out


def _time_receive(
    receiver: Callable[[], tuple[EndpointCore, QueuePair]],
    recorded: list[tuple[float, list[tuple[bytes, int, int, int]]]],
    ports: list[int],
    per_datagram: bool,
) -> float | None:
    """Microseconds per packet for a fresh receiver to take ``recorded`` (None: data lost)."""
    core, b = receiver()
    rx_one, rx_train = core.receive_datagram, core.receive_train
    clock = time.perf_counter_ns
    ns = packets = 0
    for now, trains in recorded:
        views = [(memoryview(t), seg, ports[ev]) for t, seg, ev, _n in trains]
        packets += sum(n for *_x, n in trains)
        t0 = clock()
        for view, seg, port in views:
            if not seg:  # a lone datagram: receive_datagram, as the transport does
                rx_one(view, port, now)
            elif per_datagram:
                for off in range(0, len(view), seg):
                    rx_one(view[off : off + seg], port, now)
            else:
                rx_train(view, seg, port, now)
        ns += clock() - t0
        b.datagrams_to_send(now + 0.001)
    if b.stats.bytes_placed != len(b.pd.regions()[0].view):
        return None
    return round(ns / packets / 1000, 3)


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
    p.add_argument(
        "--cc",
        type=cc_arg,
        default="nscc",
        help="QPConfig.cc (default nscc; fixed: bursts of exactly --burst packets)",
    )
    p.add_argument(
        "--payload",
        type=parse_size,
        default=PAYLOAD,
        help="QPConfig.payload_size, bytes (default 8192; 1400: MTU 1500's)",
    )
    p.add_argument(
        "--ack-lag",
        action="store_true",
        help="deliver each round's ACKs after the next round's sends: the sender has a flight "
        "when they come, as over a network (loss detection and the window law see it)",
    )
    p.add_argument("--json", action="store_true", help="JSON only")
    a = p.parse_args(argv)
    if not 1 <= a.burst <= 64:
        p.error("--burst must be 1..64")
    out = {
        "config": {
            "size": a.size,
            "payload": a.payload,
            "evs": EVS,
            "security": a.security,
            "burst": a.burst,
            "cc": a.cc,
            "ack_lag": a.ack_lag,
            "rx_kernel": fastpath.describe(),
        },
        "core": core_model(a.size, a.security, a.burst, a.cc, a.payload, a.ack_lag),
        "receive_us_per_packet": receive_model(a.size, a.burst, a.cc, a.payload),
        "kernel_loopback_us_per_datagram": kernel_model(a.payload + 28),
    }
    emit_json(out, indent=2)
    if not a.json:
        rows = list(out["core"]["stages_us_per_packet"].items())
        rows += [(f"receive path: {k}", v) for k, v in out["receive_us_per_packet"].items()]
        rows += [(f"kernel: {k}", v) for k, v in out["kernel_loopback_us_per_datagram"].items()]
        width = max(len(k) for k, _ in rows)
        print(f"\n{'stage':<{width}}  us/packet", file=sys.stderr)
        for k, v in rows:
            shown = "n/a" if v is None else f"{v:.3f}"
            print(f"{k:<{width}}  {shown:>9}", file=sys.stderr)
        print(
            f"{'core loop, both sides (wall)':<{width}}  {out['core']['wall_us_per_packet']:9.3f}",
            file=sys.stderr,
        )
        mean = out["core"]["mean_burst"]
        print(f"{'mean burst (packets)':<{width}}  {mean:9.2f}", file=sys.stderr)
        per_ack = out["core"]["on_ack_us_per_ack"]
        print(f"{'sender: on_ack, us per ACK':<{width}}  {per_ack:9.3f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
