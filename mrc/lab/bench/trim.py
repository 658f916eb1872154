"""Measure trimming: ``python -m mrc.lab.bench.trim [--rate 50mbit] [--no-trim] ...``.

Builds a 1-plane fabric (2 spines, 2 leaves, 4 hosts), lets h0, h1 and h3 send MRC WRITE ONLY
datagrams to h2 (h0+h1 share leaf 0's uplink; all meet at leaf 1's port into h2), and prints
one JSON object: what was sent and arrived (whole / trimmed, by mark), tbf drops in routers and
hosts, one-way delay (sender timestamp in the RETH VA field, kernel receive timestamp), trims/s,
the program's run time (``kernel.bpf_stats_enabled`` is switched on for the run and restored)
and CPU use.
``--pps`` paces each sender (default: just under its NIC's rate); ``--gso`` makes them send
``UDP_SEGMENT`` super-packets as fast as they can instead (for the maximum trim rate).
Needs root; removes its fabric at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import struct
import threading
import time
from typing import Any

from mrc import wire
from mrc.cli.common import emit_json
from mrc.lab.fabric import FabricSpec, Topology, netns
from mrc.lab.fabric.trim import read_router
from mrc.lab.harness.envelope import envelope
from mrc.lab.harness.fabric import fabric, port_counters, unwind_on_sigterm
from mrc.lab.harness.machine import loadavg, machine_info
from mrc.transport.gso import SOL_UDP, UDP_SEGMENT
from mrc.transport.sockets import SO_RCVBUFFORCE, SO_TIMESTAMPNS, udp6_counters
from mrc.units import parse_rate

PORT = 7400
PAY = 1400
SENDERS = ("h0", "h1", "h3")
DST = "h2"
TOOL = "trim_bench"
STATS_SYSCTL = "/proc/sys/kernel/bpf_stats_enabled"


def _prog_stats(topo: Topology) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over this fabric's programs."""
    ns = cnt = 0
    for r in topo.routers:
        got = read_router(topo.name, r.name) if topo.trim else None
        if got:
            ns += got["router"].get("run_time_ns", 0)
            cnt += got["router"].get("runs", 0)
    return ns, cnt


def _cpu() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def _drops(topo: Topology) -> dict[str, int]:
    """tbf drops by "<node>:<port>", and interface (veth backlog) drops under "iface"."""
    ports = port_counters(topo)
    out = {"iface": sum(c["interface_drops"] for c in ports.values())}
    out.update((port, c["tbf_drops"]) for port, c in ports.items())
    return out


def _rcvbuf_errors(topo: Topology) -> int:
    """Udp6RcvbufErrors in the receiver's namespace: datagrams its socket had no room for."""
    with netns.entered(topo.netns_of(DST)):
        return udp6_counters().get("Udp6RcvbufErrors", 0)


def _trims(topo: Topology) -> int:
    total = 0
    for r in topo.routers:
        got = read_router(topo.name, r.name) if topo.trim else None
        if got:
            total += sum(p["trimmed"] for p in got["ports"].values())
    return total


def run(topo: Topology, seconds: float, pps: float, gso: bool) -> dict[str, Any]:
    dst = topo.host(DST).nic(0)
    with netns.entered(topo.netns_of(DST)):
        rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
    rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    rx.bind((dst.address, PORT))
    rx.settimeout(0.3)
    got: list[tuple[bytes, int]] = []
    stop = threading.Event()
    sent: dict[str, int] = {}

    def receive() -> None:
        # kernel receive timestamps: the delay does not include this thread's own lag
        while True:
            try:
                data, anc, _f, _a = rx.recvmsg(4096, 64)
            except TimeoutError:
                if stop.is_set():
                    return
                continue
            ts = time.time_ns()
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack("=qq", value[:16])
                    ts = sec * 1_000_000_000 + nsec
            got.append((data[:20], ts))

    def send(i: int, host: str) -> None:
        src = topo.host(host).nic(0)
        with netns.entered(topo.netns_of(host)):
            s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.bind((src.address, 0))
        body = bytes([i]) * PAY
        n, t0 = 0, time.monotonic()
        if gso:
            s.setsockopt(SOL_UDP, UDP_SEGMENT, wire.DATA_HDR_LEN + PAY)
        while (now := time.monotonic() - t0) < seconds:
            batch = 44 if gso else max(0, int(now * pps) - n)
            if batch and gso:
                ts = time.time_ns()  # CLOCK_REALTIME, as the receiver's kernel timestamps
                pkts = [
                    wire.pack_data(i + 1, (n + k) & wire.PSN_MASK, ts, 7, PAY, False, None) + body
                    for k in range(batch)
                ]
                with contextlib.suppress(OSError):
                    s.sendto(b"".join(pkts), (dst.address, PORT))
            else:
                for k in range(batch):  # timestamp each packet as it leaves
                    hdr = wire.pack_data(
                        i + 1, (n + k) & wire.PSN_MASK, time.time_ns(), 7, PAY, False, None
                    )
                    with contextlib.suppress(OSError):
                        s.sendto(hdr + body, (dst.address, PORT))
            n += batch
            if not gso:
                time.sleep(0.0005)
        sent[host] = n
        s.close()

    drops0, rcvbuf0 = _drops(topo), _rcvbuf_errors(topo)
    trims0, prog0, cpu0, w0 = _trims(topo), _prog_stats(topo), _cpu(), time.monotonic()
    threads = [threading.Thread(target=receive)]
    threads += [threading.Thread(target=send, args=(i, h)) for i, h in enumerate(SENDERS)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    wall = time.monotonic() - w0
    trims1, prog1, cpu1 = _trims(topo), _prog_stats(topo), _cpu()
    time.sleep(0.3)
    stop.set()
    threads[0].join()
    rx.close()
    drops = {k: v - drops0[k] for k, v in _drops(topo).items() if v - drops0[k]}

    def delay(sel: list[tuple[bytes, int]]) -> dict[str, Any] | None:
        v = [(t - int.from_bytes(d[12:20], "big")) / 1e6 for d, t in sel]
        if not v:
            return None
        return {"median_ms": round(statistics.median(v), 2), "max_ms": round(max(v), 2)}

    trimmed = [x for x in got if x[0][4] & wire.BTH_TRIMMED]
    whole = [x for x in got if not x[0][4] & wire.BTH_TRIMMED]
    busy = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    runs = prog1[1] - prog0[1]
    return {
        "rate": topo.rate,
        "trim": topo.trim,
        "seconds": round(wall, 2),
        "sent": sum(sent.values()),
        "arrived": len(got),
        "whole": len(whole),
        "trimmed": len(trimmed),
        "trimmed_lasthop": sum(1 for d, _ in trimmed if d[4] & wire.BTH_LASTHOP),
        "router_tbf_drops": sum(v for k, v in drops.items() if k[0] == "p"),
        "host_tbf_drops": sum(v for k, v in drops.items() if k[0] == "h"),
        "interface_drops": drops.pop("iface", 0),
        "receiver_socket_drops": _rcvbuf_errors(topo) - rcvbuf0,
        "tbf_drops_by_port": drops,
        "delay_whole": delay(whole),
        "delay_trimmed": delay(trimmed),
        "trims_per_s": round((trims1 - trims0) / wall),
        "arrived_per_s": round(len(got) / wall),
        "prog_runs_per_s": round(runs / wall),
        "prog_ns_per_run": round((prog1[0] - prog0[0]) / runs) if runs else None,
        "prog_cpu_pct_of_one_core": round(100 * (prog1[0] - prog0[0]) / 1e9 / wall, 1),
        "cpu_busy_pct": round(100 * (1 - (busy[3] + busy[4]) / max(1, sum(busy))), 1),
        "cpu_softirq_pct": round(100 * busy[6] / max(1, sum(busy)), 1),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m mrc.lab.bench.trim", description=__doc__)
    ap.add_argument("--rate", default="50mbit")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--pps", type=float, help="per sender (default: 90%% of its NIC's rate)")
    ap.add_argument("--gso", action="store_true", help="UDP_SEGMENT senders, as fast as possible")
    ap.add_argument("--no-trim", action="store_true", help="the same fabric without --trim")
    args = ap.parse_args(argv)
    pps = args.pps or 0.9 * parse_rate(args.rate) / 8 / (PAY + wire.DATA_HDR_LEN + 62)
    spec = FabricSpec(
        name=f"tb{os.getpid()}", planes=1, hosts=4, rate=args.rate, trim=not args.no_trim
    )
    unwind_on_sigterm()  # the fabric and the sysctl are restored on SIGTERM too
    load_start = loadavg()
    old = None
    try:
        with open(STATS_SYSCTL) as f:
            old = f.read().strip()
        with open(STATS_SYSCTL, "w") as f:
            f.write("1")
    except OSError:
        pass
    try:
        with fabric(spec) as topo:
            run(topo, 0.3, pps, args.gso)  # warm up
            result = run(topo, args.seconds, pps, args.gso)
    finally:
        if old is not None:
            with open(STATS_SYSCTL, "w") as f:
                f.write(old)
    emit_json(envelope(TOOL, machine_info(load_start), result), indent=2)


if __name__ == "__main__":
    main()
