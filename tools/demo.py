#!/usr/bin/env python3
"""The main demo: one MRC queue pair sprayed over two planes between two network namespaces.

Builds two namespaces joined by two veth links (one per plane), runs mrc-recv in one and
mrc-send in the other, and shows what happened: goodput, the spread of packets over EVs and
planes (from our counters and from the kernel's interface counters), and the end-to-end
checksum's verdict. Falls back to loopback when namespaces cannot be made here.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from typing import Any

from mrc.cli.common import Parser, positive_int, run_main, size_arg
from mrc.errors import MRCError
from mrc.lab.harness.children import Children
from mrc.lab.harness.hosts import tool_path, wait_listening
from mrc.lab.testbed import TwoHosts, netns_available
from mrc.units import SIZE_HELP, human_bytes, human_rate
from mrc.wire import DEFAULT_PORT


def rx_bytes(prefix: list[str], ifname: str) -> int:
    """Bytes the kernel received on ``ifname`` (bytes, not packets: a GSO burst crosses a veth
    as one packet)."""
    out = subprocess.run(
        [*prefix, "ip", "-s", "-j", "link", "show", ifname],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(json.loads(out)[0]["stats64"]["rx"]["bytes"])


def run_pair(
    send_prefix: list[str],
    recv_prefix: list[str],
    recv_netns: str | None,
    recv_listen: list[str],
    send_args: list[str],
    to: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One transfer: mrc-recv (in ``recv_netns``, run with ``recv_prefix``), then mrc-send;
    both their JSON results."""
    recv_argv = [*recv_prefix, tool_path("mrc-recv")]
    recv_argv += [*sum((["--listen", x] for x in recv_listen), [])]
    recv_argv += ["--discard", "--json", "--timeout", "30"]
    send_argv = [*send_prefix, tool_path("mrc-send"), *send_args]
    send_argv += ["--to", to, "--json", "--no-progress"]
    with Children() as kids:
        recv = kids.start(recv_argv, "mrc-recv")
        wait_listening(recv, int(to.rpartition(":")[2]), recv_netns, 10)
        send = kids.start(send_argv, "mrc-send")
        send.wait(120)
        recv.wait(60)
    sent, got = send.result(), recv.result()
    if send.returncode != 0 or recv.returncode != 0 or sent is None or got is None:
        raise MRCError(f"transfer failed: {send.stderr.strip()} {recv.stderr.strip()}")
    return sent, got


def report(sent: dict[str, Any], got: dict[str, Any], kernel: dict[str, int] | None) -> None:
    evs = [e for e in sent["evs"] if e["state"] != "GOOD (backup)"]  # the backup pool idles
    backups = len(sent["evs"]) - len(evs)
    per_plane: Counter[int] = Counter()
    for e in evs:
        per_plane[e["plane"]] += e["packets"]
    used = sum(1 for e in evs if e["packets"])
    fair = sum(e["packets"] for e in evs) / len(evs)
    print()
    print(
        f"  transfer      {human_bytes(sent['bytes'])} in {sent['seconds']:.3f} s = "
        f"{human_rate(sent['goodput_bps'])}"
    )
    # the end-to-end checksum the two agreed on (BLAKE3 unless told), and both digests
    name = str(sent["checksum"])
    width = len("receiver ") + len(name)
    print(f"  integrity     {'sender ' + name:<{width}} {sent['digest']}")
    print(
        f"                {'receiver ' + name:<{width}} {got['digest']}  -> "
        f"{'MATCH' if sent['digest'] == got['digest'] else 'MISMATCH'}"
    )
    print(
        f"  packets       {sent['packets_sent']} sent, {sent['retransmits']} retransmitted, "
        f"{sent['sacks']} SACKs, receiver drops {got['dropped_by_reason'] or 'none'}"
    )
    print(
        f"  spraying      {used} of {len(evs)} EVs carried traffic; per EV "
        f"min {min(e['packets'] for e in evs)} / fair {fair:.0f} / "
        f"max {max(e['packets'] for e in evs)} ({backups} more EVs wait as backups)"
    )
    bursts = sent.get("bursts") or sent["data_packets"]
    print(
        f"  bursts        {sent['data_packets'] / bursts:.1f} packets per EV on average, each "
        "burst one GSO send (NSCC sizes them to the path's rate)"
    )
    for plane, n in sorted(per_plane.items()):
        line = f"  plane {plane}       {n} packets from our counters"
        if kernel is not None:
            line += (
                f", {kernel.get(f'p{plane}b', 0)} bytes received by the kernel's interface "
                f"p{plane}b"
            )
        print(line)
    print()


def main() -> int:
    ap = Parser(prog="demo.py", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--size", type=size_arg, default=64 << 20, help=f"bytes to send (default 64M; {SIZE_HELP})"
    )
    ap.add_argument(
        "--payload", type=positive_int, default=8192, help="payload bytes per packet (default 8192)"
    )
    ap.add_argument("--evs", type=positive_int, default=128, help="entropy values (default 128)")
    ap.add_argument("--loopback", action="store_true", help="skip namespaces; use ::1")
    args = ap.parse_args()
    return run_main("demo.py", lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    send_args = [
        *("--size", str(args.size)),
        *("--payload", str(args.payload)),
        *("--evs", str(args.evs)),
    ]
    why = "requested" if args.loopback else netns_available()
    if why is not None:
        print(f"demo: namespaces unavailable ({why}); running on loopback instead")
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
            port = s.getsockname()[1]
        sent, got = run_pair([], [], None, [f"[::1]:{port}"], send_args, f"[::1]:{port}")
        report(sent, got, None)
        return 0 if sent["ok"] and got["ok"] else 1
    prefix = f"mrcdemo{os.getpid()}"
    print(f"demo: two namespaces ({prefix}-a, {prefix}-b) joined by two veth links = two planes")
    with TwoHosts(prefix, links=2, mtu=9000) as tb:
        a = ["ip", "netns", "exec", tb.a]
        b = ["ip", "netns", "exec", tb.b]
        before = {f"p{p}b": rx_bytes(b, f"p{p}b") for p in range(2)}
        listen = [f"[{addr}]:{DEFAULT_PORT}" for addr in tb.b_addrs]
        sargs = send_args + sum((["--from", x] for x in tb.a_addrs), [])
        print(
            f"demo: mrc-recv in {tb.b} on {', '.join(listen)}; "
            f"mrc-send from {tb.a} ({', '.join(tb.a_addrs)})"
        )
        sent, got = run_pair(a, b, tb.b, listen, sargs, listen[0])
        kernel = {k: rx_bytes(b, k) - v for k, v in before.items()}
        report(sent, got, kernel)
    return 0 if sent["ok"] and got["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
