#!/usr/bin/env python3
"""Benchmark one MRC queue pair across a shaped mrc-fabric against single-path kernel TCP.

Builds a fabric (``--planes`` planes x ``--spines`` spines x 2 leaves, 4 hosts, every link shaped
to ``--rate`` with tbf, MTU ``--mtu``), then for every run measures, between h0 and h3 (on
different leaves, so every packet crosses a spine):

* **mrc**: ``mrc-recv --fabric --discard`` in h3 and ``mrc-send --fabric --size S`` from h0:
  one QP sprayed over every plane and every spine (SRv6).  Its goodput is compared with the sum
  of its plane capacities (planes x rate), the most it could possibly get.
* **tcp**: kernel TCP (a small Python sender/receiver, one connection) between h0's and h3's
  *plane 0* addresses: one path (destination routing goes via spine 0), so at most one link's
  rate.  This is the single-path baseline MRC should beat by about the number of planes.

The two alternate within each run, so both see the same noise; medians over ``--runs``.
Output: a table on stderr; ``--json`` prints one JSON object on stdout (otherwise stdout gets
a one-line summary).  The fabric is always torn down (also on Ctrl-C / SIGTERM).  Needs root.

    sudo .venv/bin/python tools/bench_fabric.py                   # 200mbit x 4 planes, 64M x 3
    sudo .venv/bin/python tools/bench_fabric.py --rate 500mbit --json
    sudo .venv/bin/python tools/bench_fabric.py --window 16,512   # compare MRC windows
    sudo .venv/bin/python tools/bench_fabric.py --cc nscc,fixed --window auto   # NSCC vs fixed
    sudo .venv/bin/python tools/bench_fabric.py --quick           # ~10 s smoke run
    sudo .venv/bin/python tools/bench_fabric.py --burst 1,8 --no-tcp   # GSO bursts vs spraying

MRC runs with mrc-send's defaults: NSCC congestion control (``--cc``), the window it finds capped
by ``--window`` (512). ``--cc fixed`` with ``--window auto`` (4 packets per plane: 16 for 4
planes) is the fixed window that suited this fabric before NSCC: on a shaped fabric a fixed
window much larger than the bandwidth-delay product plus a plane's queue only builds queues, and
the queueing skew between planes makes the loss detector declare late packets lost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mrc.cli.common import (
    Parser,
    emit_json,
    float_between,
    positive_int,
    rate_arg,
    run_main,
    size_arg,
)
from mrc.core.cc import names as cc_names
from mrc.core.cc import spec as cc_spec
from mrc.errors import MRCError
from mrc.lab.fabric import Fabric, FabricSpec, Topology, netns
from mrc.units import SIZE_HELP, parse_rate
from mrc.wire import DATA_HDR_LEN, DEFAULT_PORT

PROG = "bench_fabric.py"
BIN = Path(sys.executable).parent
MRC_PORT = DEFAULT_PORT
TCP_PORT = 5201
# bytes of one MRC data frame besides the payload, as tbf counts it (L2 frame):
# Ethernet 14 + IPv6 40 + SRH with 2 segments 40 + UDP 8 + BTH/RETH
MRC_OVERHEAD = 14 + 40 + 40 + 8 + DATA_HDR_LEN


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        raise MRCError(f"{name} not found next to {sys.executable} nor on PATH")
    return found


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                return json.loads(line)
    return None


def _kill(proc: subprocess.Popen[str] | None) -> None:
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.communicate(timeout=5)


def _child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class Bench:
    def __init__(self, args: argparse.Namespace, topo: Topology) -> None:
        self.args = args
        self.topo = topo
        self.fabric_cli = _tool("mrc-fabric")
        self.procs: list[subprocess.Popen[str]] = []

    def _exec(self, node: str, *argv: str) -> list[str]:
        return [self.fabric_cli, "exec", "--name", self.topo.name, node, "--", *argv]

    def _popen(self, argv: list[str]) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            _kill(p)

    def _wait_listening(self, proc: subprocess.Popen[str], port: int, timeout: float = 10) -> None:
        want = f":{port:04X} "
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return  # died: the caller reports its stderr
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{proc.pid}/net/tcp6").read_text().splitlines()[1:]:
                    cols = line.split()
                    if (cols[1] + " ").endswith(want) and cols[3] == "0A":
                        return
            time.sleep(0.01)
        raise MRCError(f"mrc-recv not listening on {port} after {timeout} s")

    # ---- MRC -------------------------------------------------------------------------------

    def mrc_run(
        self, size: int, window: int, burst: int | None = None, cc: str = "nscc"
    ) -> dict[str, Any]:
        a = self.args
        name = self.topo.name
        cpu0 = _child_cpu()
        recv = self._popen(
            self._exec(
                "h3",
                _tool("mrc-recv"),
                "--fabric",
                name,
                "--listen",
                f"[::]:{MRC_PORT}",
                "--discard",
                "--json",
                "--no-progress",
                "--timeout",
                "30",
            )
        )
        self._wait_listening(recv, MRC_PORT)
        send = self._popen(
            self._exec(
                "h0",
                _tool("mrc-send"),
                "--fabric",
                name,
                "--to",
                f"h3:{MRC_PORT}",
                "--size",
                str(size),
                "--payload",
                str(a.payload),
                "--window",
                str(window),
                "--evs",
                str(a.evs),
                *(("--burst", str(burst)) if burst is not None else ()),
                "--cc",
                cc,
                "--json",
                "--no-progress",
            )
        )
        try:
            s_out, s_err = send.communicate(timeout=a.timeout)
            r_out, r_err = recv.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            _kill(send)
            _kill(recv)
            raise MRCError(
                f"mrc transfer of {size} bytes did not finish in {a.timeout} s"
            ) from None
        sj, rj = _last_json(s_out), _last_json(r_out)
        if send.returncode != 0 or sj is None or not sj.get("ok"):
            raise MRCError(f"mrc-send failed ({send.returncode}): {s_err.strip()[-500:]}")
        if recv.returncode != 0 or rj is None or not rj.get("ok"):
            raise MRCError(f"mrc-recv failed ({recv.returncode}): {r_err.strip()[-500:]}")
        if sj["sha256"] != rj["sha256"]:
            raise MRCError("SHA-256 mismatch between sender and receiver")
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
        }

    # ---- kernel TCP on plane 0 ---------------------------------------------------------------

    def tcp_run(self, size: int) -> dict[str, Any]:
        src = self.topo.host("h0").nic(0).address
        dst = self.topo.host("h3").nic(0).address
        with netns.entered(self.topo.netns_of("h3")):
            lsock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        with netns.entered(self.topo.netns_of("h0")):
            csock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        result: dict[str, Any] = {}
        try:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind((dst, TCP_PORT))
            lsock.listen(1)
            lsock.settimeout(10)

            def receive() -> None:
                try:
                    conn, _ = lsock.accept()
                except OSError as exc:
                    result["error"] = f"accept: {exc}"
                    return
                with conn:
                    conn.settimeout(self.args.timeout)
                    buf = bytearray(1 << 20)
                    got, first = 0, None
                    while got < size:
                        n = conn.recv_into(buf)
                        if n == 0:
                            break
                        if first is None:
                            first = time.perf_counter()
                        got += n
                    result.update(bytes=got, first=first, last=time.perf_counter())

            rx = threading.Thread(target=receive, daemon=True)
            rx.start()
            csock.bind((src, 0))
            csock.settimeout(self.args.timeout)
            csock.connect((dst, TCP_PORT))
            chunk = memoryview(os.urandom(1 << 22))
            start = time.perf_counter()
            left = size
            while left > 0:
                n = min(left, len(chunk))
                csock.sendall(chunk[:n])
                left -= n
            csock.shutdown(socket.SHUT_WR)
            rx.join(self.args.timeout)
            if rx.is_alive() or "error" in result or result.get("bytes") != size:
                raise MRCError(f"tcp transfer incomplete: {result}")
            seconds = result["last"] - start
            return {
                "goodput_bps": round(size * 8 / seconds),
                "seconds": round(seconds, 6),
                "path": f"[{src}] -> [{dst}] (plane 0, default route via p0s0)",
            }
        finally:
            csock.close()
            lsock.close()

    def warm_up(self) -> None:
        self.mrc_run(1 << 20, self.args.window[0], self.args.burst[0])
        self.tcp_run(1 << 20)


def fmt_rate(bps: float | None) -> str:
    return "-" if bps is None else f"{bps / 1e6:8.1f} Mbit/s"


def run(args: argparse.Namespace) -> dict[str, Any]:
    rate_bps = parse_rate(args.rate)
    capacity = args.planes * rate_bps
    name = args.name or f"bench{os.getpid()}"
    spec = FabricSpec(
        name=name,
        planes=args.planes,
        spines=args.spines,
        leaves=2,
        hosts=4,
        rate=args.rate,
        mtu=args.mtu,
    )
    log = (
        (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.quiet else (lambda *a: None)
    )
    load0 = os.getloadavg()
    log(
        f"fabric {name}: {args.planes} planes x {args.spines} spines, links {args.rate} "
        f"(MRC ceiling {capacity / 1e6:.0f} Mbit/s), MTU {args.mtu}; "
        f"{args.size >> 20} MiB x {args.runs} runs; load {load0[0]:.2f}"
    )
    t0 = time.monotonic()
    topo = Fabric.up(spec)
    bench = Bench(args, topo)
    # (cc, window, burst) -> runs; every combination once per round, so all see the same noise
    combos = [(c, w, b) for c in args.cc for w in args.window for b in args.burst]
    mrc: dict[tuple[str, int, int], list[dict[str, Any]]] = {c: [] for c in combos}
    tcp: list[dict[str, Any]] = []
    try:
        bench.warm_up()
        for i in range(args.runs):
            for c, w, b in combos:
                r = bench.mrc_run(args.size, w, b, c)
                mrc[c, w, b].append(r)
                log(
                    f"  run {i + 1}: mrc {c:5} window {w:4d} burst {b or 'auto':>4}: "
                    f"{fmt_rate(r['goodput_bps'])} "
                    f"({r['goodput_bps'] / capacity:6.1%}), {r['retransmits']} retransmits, "
                    f"{r['evs_assumed_bad']} EVs assumed bad, "
                    f"mean burst {r['data_packets'] / max(1, r['bursts'] or 0):.1f}, "
                    f"cpu {r['cpu_seconds']:.2f} s"
                )
            if not args.no_tcp:
                r = bench.tcp_run(args.size)
                tcp.append(r)
                log(
                    f"  run {i + 1}: tcp plane 0    : {fmt_rate(r['goodput_bps'])} "
                    f"({r['goodput_bps'] / rate_bps:6.1%} of one link)"
                )
    finally:
        bench.close()
        Fabric.down(name)
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
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "load_before": [round(x, 2) for x in load0],
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "seconds": round(time.monotonic() - t0, 1),
    }
    for (c, w, b), rs in mrc.items():
        med = _median([r["goodput_bps"] for r in rs])
        out["mrc"].append(
            {
                "cc": c,
                "window": w,
                "burst": b,
                "goodput_bps": round(med) if med else None,
                "fraction_of_capacity": round(med / capacity, 4) if med else None,
                "retransmits": _median([r["retransmits"] for r in rs]),
                "runs": rs,
            }
        )
    if tcp:
        med = _median([r["goodput_bps"] for r in tcp])
        out["tcp"] = {
            "goodput_bps": round(med),
            "fraction_of_link": round(med / rate_bps, 4),
            "wire_ceiling": round((args.mtu - 72) / (args.mtu + 14), 4),
            "runs": tcp,
        }
    best = max(out["mrc"], key=lambda m: m["goodput_bps"] or 0)
    out["best_cc"] = best["cc"]
    out["best_window"] = best["window"]
    out["best_burst"] = best["burst"]
    out["mrc_goodput_bps"] = best["goodput_bps"]
    out["mrc_fraction_of_capacity"] = best["fraction_of_capacity"]
    out["mrc_over_tcp"] = (
        round(best["goodput_bps"] / out["tcp"]["goodput_bps"], 2)
        if tcp and best["goodput_bps"]
        else None
    )
    return out


def table(out: dict[str, Any]) -> str:
    f = out["fabric"]
    row = "{:<34}{:>16}  {:>24}  {:>11}"
    lines = [
        f"MRC over mrc-fabric: {f['planes']} planes x {f['spines']} spines, links {f['rate']}, "
        f"MTU {f['mtu']}, h0 -> h3, {out['size'] >> 20} MiB, median of {out['runs']}",
        row.format("", "goodput", "of capacity", "retransmits"),
    ]
    cap = out["capacity_bps"]
    bursts = len({m["burst"] for m in out["mrc"]}) > 1
    for m in out["mrc"]:
        lines.append(
            row.format(
                f"mrc {m['cc']}, window {m['window']}"
                + (f", burst {m['burst'] or 'auto'}" if m["burst"] is not None or bursts else ""),
                fmt_rate(m["goodput_bps"]),
                f"{m['fraction_of_capacity']:.1%} of {cap / 1e6:.0f} Mbit/s",
                f"{m['retransmits']:g}",
            )
        )
    if out["tcp"]:
        t = out["tcp"]
        lines.append(
            row.format(
                "kernel tcp, plane 0",
                fmt_rate(t["goodput_bps"]),
                f"{t['fraction_of_link']:.1%} of {f['rate_bps'] / 1e6:.0f} Mbit/s",
                "-",
            )
        )
        lines.append(
            f"mrc / tcp: {out['mrc_over_tcp']}x (planes: {f['planes']}); "
            f"MRC wire ceiling {out['mrc_wire_ceiling']:.1%} of line rate"
        )
    m = out["machine"]
    lines.append(
        f"machine: {m['cpus']} cpus, load {m['load_before'][0]} -> "
        f"{m['load_after'][0]}; {out['seconds']} s in all"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--rate", type=rate_arg, default="200mbit", help="tbf rate of every link (default 200mbit)"
    )
    p.add_argument("--planes", type=positive_int, default=4, help="planes (default 4)")
    p.add_argument("--spines", type=positive_int, default=2, help="spines per plane (default 2)")
    p.add_argument("--mtu", type=positive_int, default=9000, help="fabric MTU (default 9000)")
    p.add_argument(
        "--size", type=size_arg, default=64 << 20, help=f"bytes per run (64M; {SIZE_HELP})"
    )
    p.add_argument("--runs", type=positive_int, default=3, help="runs; medians are reported (3)")
    p.add_argument(
        "--payload", type=positive_int, default=8192, help="MRC payload per packet (8192)"
    )
    p.add_argument(
        "--window",
        default="512",
        help="MRC window(s) in packets, comma-separated (default 512, mrc-send's own: a cap "
        "on NSCC's window); 'auto' = 4 per plane (16 for 4 planes), the fixed window that "
        "suited --cc fixed",
    )
    p.add_argument("--evs", type=positive_int, default=128, help="MRC entropy values (128)")
    p.add_argument(
        "--burst",
        default="auto",
        help="mrc-send --burst: packets per EV sent as one GSO burst, comma-separated to "
        "compare (auto,1,8); default auto: mrc-send's own (NSCC sizes bursts, up to 16)",
    )
    p.add_argument("--no-tcp", action="store_true", help="skip the kernel TCP baseline")
    p.add_argument(
        "--timeout", type=float_between(0, 3600), default=120.0, help="per transfer, seconds"
    )
    p.add_argument(
        "--cc",
        default="nscc",
        help="mrc-send --cc: congestion control(s), comma-separated to compare (nscc,fixed); "
        "default nscc",
    )
    p.add_argument("--name", help="fabric name (default bench<pid>)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--quick", action="store_true", help="16M, 1 run: a smoke test")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args(argv)
    try:
        args.window = [
            max(8, 4 * args.planes) if w == "auto" else int(w)
            for w in str(args.window).split(",")
            if w
        ]
    except ValueError:
        p.error(f"bad --window {args.window!r}: expected auto, 16 or 16,512")
    try:
        args.cc = [cc_spec(c) for c in str(args.cc).split(",") if c]
    except ValueError as exc:
        p.error(f"bad --cc: {exc}")
    if not args.cc:
        p.error(f"bad --cc: expected laws, comma-separated ({', '.join(cc_names())}, MODULE:CLASS)")
    if not args.window or min(args.window) < 1:
        p.error("--window must be positive")
    try:
        args.burst = [None if b == "auto" else int(b) for b in str(args.burst).split(",") if b]
    except ValueError:
        p.error(f"bad --burst {args.burst!r}: expected auto, 8 or auto,1,8")
    if not args.burst or not all(b is None or 1 <= b <= 64 for b in args.burst):
        p.error("--burst must be 1..64")
    if args.quick:
        args.size, args.runs = 16 << 20, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main(PROG, lambda: _main(args), "interrupted (fabric removed)")


def _main(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise MRCError("needs root (network namespaces, tc)")

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds through run()'s finally: children killed, fabric down

    signal.signal(signal.SIGTERM, on_term)
    out = run(args)
    print(table(out), file=sys.stderr)
    if args.json:
        emit_json(out, indent=2)
    else:
        print(
            f"mrc {out['mrc_goodput_bps'] / 1e6:.1f} Mbit/s "
            f"({out['mrc_fraction_of_capacity']:.1%} of {out['capacity_bps'] / 1e6:.0f}); "
            + (
                f"tcp {out['tcp']['goodput_bps'] / 1e6:.1f} Mbit/s; ratio {out['mrc_over_tcp']}x"
                if out["tcp"]
                else "no tcp"
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
