"""bench_fabric: one MRC queue pair across a shaped mrc-fabric against single-path kernel TCP.

Builds a fabric (planes x spines x 2 leaves, 4 hosts, every link shaped to one rate with tbf),
then for every run measures, between h0 and h3 (on different leaves, so every packet crosses a
spine):

* **mrc**: ``mrc-recv --fabric --discard`` in h3 and ``mrc-send --fabric --size S`` from h0:
  one QP sprayed over every plane and every spine (SRv6).  Its goodput is compared with the sum
  of its plane capacities (planes x rate), the most it could possibly get.
* **tcp**: kernel TCP (a small Python sender/receiver, one connection) between h0's and h3's
  *plane 0* addresses: one path (destination routing goes via spine 0), so at most one link's
  rate.  This is the single-path baseline MRC should beat by about the number of planes.
* **mptcp**: kernel MPTCP, one connection from h0's plane-0 address to h3's, with a subflow
  to each address h3 announces on its other planes: the kernel's own multipath transport over
  the same planes, the figure MRC must reach.
* **tcp_planes**: a kernel TCP connection per plane at once, h0's plane-i address to h3's, the
  bytes shared among them: what this machine forwards over every plane with the kernel's own
  transport, so a fraction of capacity MRC misses can be told apart from one the machine
  cannot give (its routers' forwarding and shaping share the same cores).

They alternate within each run, so all see the same noise; medians over the runs.
tools/bench_fabric.py parses the arguments and calls :func:`main`;
:mod:`mrc.lab.bench.fabric_report` prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import socket
import sys
import threading
import time
from typing import Any

from mrc.cli.common import emit_json
from mrc.errors import MRCError
from mrc.lab.bench.common import IPPROTO_MPTCP, mptcp_subflows, setup_mptcp_outside
from mrc.lab.bench.fabric_report import fmt_rate, table
from mrc.lab.fabric import FabricSpec, Topology, netns
from mrc.lab.harness.children import Children
from mrc.lab.harness.envelope import envelope
from mrc.lab.harness.fabric import fabric, unwind_on_sigterm
from mrc.lab.harness.hosts import in_host, tool_path, wait_listening
from mrc.lab.harness.machine import loadavg, machine_info
from mrc.lab.harness.stats import median
from mrc.units import parse_rate
from mrc.wire import DATA_HDR_LEN, DEFAULT_PORT

TOOL = "bench_fabric"
#: --rate of a fabric whose links have no tbf (as fast as the machine forwards)
UNSHAPED = "unshaped"
MRC_PORT = DEFAULT_PORT
TCP_PORT = 5201
MPTCP_PORT = 5202
#: the per-plane TCP connections' port (each plane's addresses are its own)
PLANES_PORT = 5203
# bytes of one MRC data frame besides the payload, as tbf counts it (L2 frame):
# Ethernet 14 + IPv6 40 + the route's 40 (SRH with 2 segments, or uSID's outer IPv6 header)
# + UDP 8 + BTH/RETH
MRC_OVERHEAD = 14 + 40 + 40 + 8 + DATA_HDR_LEN


def _child_cpu() -> float:
    """CPU seconds of every child this process has waited for: the sender's and the
    receiver's, read before and after a run."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _per_packet(seconds: float | None, packets: int | None) -> float | None:
    """Microseconds of CPU per packet, or None without both figures."""
    if seconds is None or not packets:
        return None
    return round(seconds * 1e6 / packets, 2)


def _chunk() -> memoryview:
    """What a kernel TCP sender sends, again and again: 4 MiB of random bytes."""
    return memoryview(os.urandom(1 << 22))


class _Flow:
    """One kernel TCP (``mptcp``: MPTCP) connection from h0's plane-``plane`` address to h3's,
    connected on entry, with a thread that receives ``size`` bytes and notes when the last
    came (:attr:`last`); :meth:`send` sends them, :meth:`done` waits for the receiver and
    checks that every byte came. MPTCP listens on every address, so that the joins to the
    addresses h3 announces on its other planes find it."""

    def __init__(
        self, topo: Topology, plane: int, port: int, size: int, timeout: float, mptcp: bool = False
    ) -> None:
        self.addresses = (topo.host("h0").nic(plane).address, topo.host("h3").nic(plane).address)
        self.size = size
        self.timeout = timeout
        self.what = "mptcp" if mptcp else f"tcp on plane {plane}"
        self.last = 0.0
        self._port = port
        self._result: dict[str, Any] = {}
        proto = IPPROTO_MPTCP if mptcp else 0
        with netns.entered(topo.netns_of("h3")):
            self.lsock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, proto)
        try:
            with netns.entered(topo.netns_of("h0")):
                self.csock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, proto)
        except BaseException:
            self.lsock.close()
            raise
        self._any = mptcp
        self._rx = threading.Thread(target=self._receive, daemon=True)

    def __enter__(self) -> _Flow:
        src, dst = self.addresses
        try:
            self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.lsock.bind(("::" if self._any else dst, self._port))
            self.lsock.listen(1)
            self.lsock.settimeout(10)
            self._rx.start()
            self.csock.bind((src, 0))
            self.csock.settimeout(self.timeout)
            self.csock.connect((dst, self._port))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.csock.close()
        self.lsock.close()

    def _receive(self) -> None:
        try:
            conn, _ = self.lsock.accept()
        except OSError as exc:
            self._result["error"] = f"accept: {exc}"
            return
        with conn:
            conn.settimeout(self.timeout)
            buf = bytearray(1 << 20)
            got = 0
            try:
                while got < self.size:
                    n = conn.recv_into(buf)
                    if n == 0:
                        break
                    got += n
            except OSError as exc:
                self._result["error"] = f"receive: {exc}"
            self.last = time.perf_counter()
            self._result["bytes"] = got

    def send(self, chunk: memoryview) -> None:
        """Send the flow's bytes and shut its sending side (errors are :meth:`done`'s)."""
        left = self.size
        try:
            while left > 0:
                n = min(left, len(chunk))
                self.csock.sendall(chunk[:n])
                left -= n
            self.csock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self._result.setdefault("error", f"send: {exc}")

    def done(self) -> float:
        """When the last byte came (time.perf_counter()), once the receiver has it all."""
        self._rx.join(self.timeout)
        if self._rx.is_alive() or "error" in self._result or self._result.get("bytes") != self.size:
            raise MRCError(f"{self.what} transfer incomplete: {self._result}")
        return self.last


class Bench:
    def __init__(self, args: argparse.Namespace, topo: Topology) -> None:
        self.args = args
        self.topo = topo

    # ---- MRC -------------------------------------------------------------------------------

    def mrc_run(
        self, size: int, window: int, burst: int | None = None, cc: str = "nscc"
    ) -> dict[str, Any]:
        a = self.args
        name = self.topo.name
        recv_argv = [tool_path("mrc-recv"), "--fabric", name, "--listen", f"[::]:{MRC_PORT}"]
        recv_argv += ["--discard", "--json", "--no-progress", "--timeout", "30"]
        send_argv = [tool_path("mrc-send"), "--fabric", name, "--to", f"h3:{MRC_PORT}"]
        send_argv += ["--size", str(size), "--payload", str(a.payload), "--window", str(window)]
        send_argv += ["--evs", str(a.evs)]
        send_argv += ["--burst", str(burst)] if burst is not None else []
        send_argv += ["--cc", cc, "--json", "--no-progress"]
        cpu0 = _child_cpu()
        with Children() as kids:
            recv = kids.start(in_host(self.topo, "h3", recv_argv), "mrc-recv")
            wait_listening(recv, MRC_PORT, self.topo.netns_of("h3"), 10)
            send = kids.start(in_host(self.topo, "h0", send_argv), "mrc-send")
            if not send.finished(a.timeout) or not recv.finished(30):
                raise MRCError(f"mrc transfer of {size} bytes did not finish in {a.timeout} s")
        sj, rj = send.result(), recv.result()
        if send.returncode != 0 or sj is None or not sj.get("ok"):
            raise MRCError(f"mrc-send failed ({send.returncode}): {send.stderr.strip()[-500:]}")
        if recv.returncode != 0 or rj is None or not rj.get("ok"):
            raise MRCError(f"mrc-recv failed ({recv.returncode}): {recv.stderr.strip()[-500:]}")
        if sj["digest"] != rj["digest"]:
            raise MRCError(f"{sj['checksum']} mismatch between sender and receiver")
        routes: dict[str, int] = {}
        for e in sj["evs"]:
            routes[e["route"]] = routes.get(e["route"], 0) + e["packets"]
        keys = (
            "retransmits",
            "retransmits_nack",
            "retransmits_sack",
            "retransmits_timeout",
            "evs_assumed_bad",
            "planes_lost",
            "srtt_ms",
            "packets_sent",
            "data_packets",
            "bursts",
        )
        return {
            "cc": cc,
            "window": window,
            "burst": burst,
            "goodput_bps": sj["goodput_bps"],
            "seconds": sj["seconds"],
            **{k: sj.get(k) for k in keys},
            "duplicates": rj.get("duplicates"),
            "packets_per_route": routes,
            "cpu_seconds": round(_child_cpu() - cpu0, 3),  # sender + receiver processes
            "send_cpu_seconds": sj.get("cpu_seconds"),
            "recv_cpu_seconds": rj.get("cpu_seconds"),
            # the receiving process's CPU per data packet it took: what GRO (plain UDP to the
            # host, uSID) saves against one receive per datagram (an SRH, docs/FABRIC.md)
            "recv_cpu_us_per_packet": _per_packet(rj.get("cpu_seconds"), sj.get("data_packets")),
        }

    # ---- kernel TCP on plane 0, MPTCP over every plane, and a TCP connection per plane ----

    def tcp_run(self, size: int, mptcp: bool = False) -> dict[str, Any]:
        """One kernel TCP (or, ``mptcp``, MPTCP) transfer of ``size`` bytes from h0's plane-0
        address to h3's. MPTCP's in-kernel path manager opens a subflow to each address h3
        announces, one per other plane (:meth:`mptcp_setup`); the clock starts once they are
        up (at most 3 s), so the figure is that of every plane, not of the joins."""
        port = MPTCP_PORT if mptcp else TCP_PORT
        with _Flow(self.topo, 0, port, size, self.args.timeout, mptcp) as flow:
            subflows = None
            if mptcp:
                want = self.args.planes - 1
                until = time.monotonic() + 3.0
                while (subflows := mptcp_subflows(flow.csock) or 0) < want and (
                    time.monotonic() < until
                ):
                    time.sleep(0.01)
            start = time.perf_counter()
            flow.send(_chunk())
            seconds = flow.done() - start
        out: dict[str, Any] = {"goodput_bps": round(size * 8 / seconds)}
        out["seconds"] = round(seconds, 6)
        if mptcp:
            out["subflows"] = subflows
        else:
            src, dst = flow.addresses
            out["path"] = f"[{src}] -> [{dst}] (plane 0, default route via p0s0)"
        return out

    def planes_run(self, size: int) -> dict[str, Any]:
        """``size`` bytes as one kernel TCP connection per plane at once, h0's plane-i address
        to h3's (each on its plane's spine 0): what this machine forwards over every plane
        with the kernel's own transport, MRC's capacity as the machine can give it."""
        planes = self.args.planes
        shares = [size // planes + (i < size % planes) for i in range(planes)]
        chunk = _chunk()
        with contextlib.ExitStack() as stack:
            flows = [
                stack.enter_context(_Flow(self.topo, i, PLANES_PORT, n, self.args.timeout))
                for i, n in enumerate(shares)
            ]
            senders = [threading.Thread(target=f.send, args=(chunk,), daemon=True) for f in flows]
            start = time.perf_counter()
            for t in senders:
                t.start()
            for t in senders:
                t.join(self.args.timeout)
            seconds = max(f.done() for f in flows) - start
        return {
            "goodput_bps": round(size * 8 / seconds),
            "seconds": round(seconds, 6),
            "flows": [round(n * 8 / (f.last - start)) for n, f in zip(shares, flows, strict=True)],
        }

    def mptcp_setup(self) -> None:
        """MPTCP's path manager in h0 and h3: h3 announces its other planes' addresses."""
        for host in ("h0", "h3"):
            setup_mptcp_outside(self.topo, host)

    def warm_up(self) -> None:
        self.mrc_run(1 << 20, self.args.window[0], self.args.burst[0])
        if not self.args.no_tcp:
            self.tcp_run(1 << 20)
        if not self.args.no_mptcp:
            self.mptcp_setup()
            self.tcp_run(1 << 20, mptcp=True)
        if self.args.planes > 1 and not self.args.no_tcp_planes:
            self.planes_run(1 << 20)


def _over(bps: int | None, reference: dict[str, Any] | None) -> float | None:
    """MRC's best goodput over a kernel baseline's median (None: no baseline or no goodput)."""
    return round(bps / reference["goodput_bps"], 2) if reference and bps else None


def _share(bps: float | None, of: int | None) -> float | None:
    """``bps`` as a fraction of ``of`` (None: no figure, or an unshaped fabric's capacity)."""
    return round(bps / of, 4) if bps and of else None


def _over_planes(runs: list[dict[str, Any]], capacity: int | None) -> dict[str, Any] | None:
    """A multipath reference's object: its median goodput, that as a fraction of every
    plane's capacity, every run (None: not run)."""
    if not runs:
        return None
    med = median([r["goodput_bps"] for r in runs])
    assert med is not None
    return {
        "goodput_bps": round(med),
        "fraction_of_capacity": _share(med, capacity),
        "runs": runs,
    }


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:6.1%}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every run on a fabric built for them (always removed); the result object without its
    envelope. ``args.rate`` UNSHAPED: links without tbf, so no capacity to be a fraction of."""
    shaped = args.rate != UNSHAPED
    rate_bps = parse_rate(args.rate) if shaped else None
    capacity = args.planes * rate_bps if rate_bps else None
    name = args.name or f"bench{os.getpid()}"
    spec = FabricSpec(
        name=name,
        planes=args.planes,
        spines=args.spines,
        leaves=2,
        hosts=4,
        rate=args.rate if shaped else None,
        mtu=args.mtu,
        srv6=args.srv6,
    )

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    load0 = loadavg()
    log(
        f"fabric {name}: {args.planes} planes x {args.spines} spines, links {args.rate} "
        + (f"(MRC ceiling {capacity / 1e6:.0f} Mbit/s), " if capacity else "(no ceiling), ")
        + f"MTU {args.mtu}; "
        f"{args.size >> 20} MiB x {args.runs} runs; load {load0[0]:.2f}"
    )
    t0 = time.monotonic()
    # (cc, window, burst) -> runs; every combination once per round, so all see the same noise
    combos = [(c, w, b) for c in args.cc for w in args.window for b in args.burst]
    mrc: dict[tuple[str, int, int], list[dict[str, Any]]] = {c: [] for c in combos}
    tcp: list[dict[str, Any]] = []
    mptcp: list[dict[str, Any]] = []
    planes: list[dict[str, Any]] = []
    with fabric(spec) as topo:
        bench = Bench(args, topo)
        bench.warm_up()
        for i in range(args.runs):
            for c, w, b in combos:
                r = bench.mrc_run(args.size, w, b, c)
                mrc[c, w, b].append(r)
                log(
                    f"  run {i + 1}: mrc {c:5} window {w:4d} burst {b or 'auto':>4}: "
                    f"{fmt_rate(r['goodput_bps'])} "
                    f"({_pct(_share(r['goodput_bps'], capacity))}), "
                    f"{r['retransmits']} retransmits, "
                    f"{r['evs_assumed_bad']} EVs assumed bad, "
                    f"mean burst {r['data_packets'] / max(1, r['bursts'] or 0):.1f}, "
                    f"cpu {r['cpu_seconds']:.2f} s, "
                    f"receiver {r['recv_cpu_us_per_packet']} us a packet"
                )
            if not args.no_tcp:
                r = bench.tcp_run(args.size)
                tcp.append(r)
                log(
                    f"  run {i + 1}: tcp plane 0    : {fmt_rate(r['goodput_bps'])} "
                    f"({_pct(_share(r['goodput_bps'], rate_bps))} of one link)"
                )
            if not args.no_mptcp:
                r = bench.tcp_run(args.size, mptcp=True)
                mptcp.append(r)
                log(
                    f"  run {i + 1}: mptcp          : {fmt_rate(r['goodput_bps'])} "
                    f"({_pct(_share(r['goodput_bps'], capacity))}), "
                    f"{r['subflows']} extra subflows"
                )
            if args.planes > 1 and not args.no_tcp_planes:
                r = bench.planes_run(args.size)
                planes.append(r)
                log(
                    f"  run {i + 1}: tcp per plane  : {fmt_rate(r['goodput_bps'])} "
                    f"({_pct(_share(r['goodput_bps'], capacity))})"
                )
    frame = args.payload + MRC_OVERHEAD
    out: dict[str, Any] = {
        "fabric": {
            "name": name,
            "planes": args.planes,
            "spines": args.spines,
            "leaves": 2,
            "hosts": 4,
            "rate": args.rate,
            "rate_bps": rate_bps,
            "mtu": args.mtu,
            "srv6": args.srv6,
        },
        "pair": ["h0", "h3"],
        "size": args.size,
        "runs": args.runs,
        "payload": args.payload,
        "evs": args.evs,
        "capacity_bps": capacity,
        "mrc_wire_ceiling": round(args.payload / frame, 4),  # goodput / line rate at best
        "mrc": [],
        "tcp": None,
        "mptcp": None,
        "tcp_planes": None,
        "seconds": round(time.monotonic() - t0, 1),
    }
    for (c, w, b), rs in mrc.items():
        med = median([r["goodput_bps"] for r in rs])
        out["mrc"].append(
            {
                "cc": c,
                "window": w,
                "burst": b,
                "goodput_bps": round(med) if med else None,
                "fraction_of_capacity": _share(med, capacity),
                "retransmits": median([r["retransmits"] for r in rs]),
                "runs": rs,
            }
        )
    if tcp:
        med = median([r["goodput_bps"] for r in tcp])
        assert med is not None
        out["tcp"] = {
            "goodput_bps": round(med),
            "fraction_of_link": _share(med, rate_bps),
            "wire_ceiling": round((args.mtu - 72) / (args.mtu + 14), 4),
            "runs": tcp,
        }
    out["mptcp"] = _over_planes(mptcp, capacity)
    out["tcp_planes"] = _over_planes(planes, capacity)
    best = max(out["mrc"], key=lambda m: m["goodput_bps"] or 0)
    out["best_cc"] = best["cc"]
    out["best_window"] = best["window"]
    out["best_burst"] = best["burst"]
    out["mrc_goodput_bps"] = best["goodput_bps"]
    out["mrc_fraction_of_capacity"] = best["fraction_of_capacity"]
    out["mrc_over_tcp"] = _over(best["goodput_bps"], out["tcp"])
    out["mrc_over_mptcp"] = _over(best["goodput_bps"], out["mptcp"])
    out["mrc_over_tcp_planes"] = _over(best["goodput_bps"], out["tcp_planes"])
    return envelope(TOOL, machine_info(load0), out)


def main(args: argparse.Namespace) -> int:
    """Run the benchmark as ``args`` (tools/bench_fabric.py's arguments) says: the table on
    stderr, the JSON (``--json``) or a one-line summary on stdout."""
    if os.geteuid() != 0:
        raise MRCError("needs root (network namespaces, tc)")
    unwind_on_sigterm()  # children stopped and the fabric removed on SIGTERM too
    out = run(args)
    print(table(out), file=sys.stderr)
    if args.json:
        emit_json(out, indent=2)
    else:
        frac, cap = out["mrc_fraction_of_capacity"], out["capacity_bps"]
        print(
            f"mrc {out['mrc_goodput_bps'] / 1e6:.1f} Mbit/s "
            + (f"({frac:.1%} of {cap / 1e6:.0f}); " if frac is not None and cap else "(unshaped); ")
            + (
                f"tcp {out['tcp']['goodput_bps'] / 1e6:.1f} Mbit/s; ratio {out['mrc_over_tcp']}x"
                if out["tcp"]
                else "no tcp"
            )
            + (
                f"; mptcp {out['mptcp']['goodput_bps'] / 1e6:.1f} Mbit/s; "
                f"ratio {out['mrc_over_mptcp']}x"
                if out["mptcp"]
                else "; no mptcp"
            )
        )
    return 0
