#!/usr/bin/env python3
"""Benchmark one MRC queue pair across a shaped mrc-fabric against single-path kernel TCP.

Builds a fabric (``--planes`` planes x ``--spines`` spines x 2 leaves, 4 hosts, every link shaped
to ``--rate`` with tbf, MTU ``--mtu``), then for every run sends ``--size`` bytes h0 -> h3 with
one MRC QP (over every plane and spine), with kernel TCP on plane 0 (one path), with kernel
MPTCP and with a kernel TCP connection per plane at once (what the machine forwards over every
plane), alternating, and reports medians over ``--runs``: MRC against its planes' capacity and
the references, TCP against one link.
The runs are :mod:`mrc.lab.bench.fabric`; this script parses the arguments.

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
planes) is a fixed window sized for this fabric: on a shaped fabric a fixed window much larger
than the bandwidth-delay product plus a plane's queue only builds queues, and the queueing skew
between planes makes the loss detector declare late packets lost.
"""

from __future__ import annotations

import argparse
import sys

from mrc.cli.common import Parser, float_between, positive_int, rate_arg, run_main, size_arg
from mrc.core.cc import load as load_law
from mrc.core.cc import names as cc_names
from mrc.lab.bench.fabric import UNSHAPED
from mrc.lab.bench.fabric import main as run_bench
from mrc.topology.model import SRV6_MODES
from mrc.units import SIZE_HELP

PROG = "bench_fabric.py"


def fabric_rate(text: str) -> str:
    """--rate: a tc rate, or "unshaped"."""
    return UNSHAPED if text.strip().lower() == UNSHAPED else rate_arg(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--rate",
        type=fabric_rate,
        default="200mbit",
        help="tbf rate of every link (default 200mbit), or 'unshaped': no tbf, the links as fast "
        "as this machine forwards (no capacity then: the fractions are null; compare with TCP "
        "and MPTCP)",
    )
    p.add_argument("--planes", type=positive_int, default=4, help="planes (default 4)")
    p.add_argument("--spines", type=positive_int, default=2, help="spines per plane (default 2)")
    p.add_argument("--mtu", type=positive_int, default=9000, help="fabric MTU (default 9000)")
    p.add_argument(
        "--srv6",
        choices=SRV6_MODES,
        default="usid",
        help="how paths reach the routers (mrc-fabric up --srv6; default usid)",
    )
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
        "suits --cc fixed",
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
        "--no-mptcp",
        action="store_true",
        help="skip the kernel MPTCP baseline (one connection, a subflow per plane)",
    )
    p.add_argument(
        "--no-tcp-planes",
        action="store_true",
        help="skip the per-plane kernel TCP reference (a TCP connection on each plane at "
        "once: what the machine forwards over every plane, the capacity it can give MRC)",
    )
    p.add_argument(
        "--timeout", type=float_between(0, 3600), default=120.0, help="per transfer, seconds"
    )
    p.add_argument(
        "--cc",
        default="nscc",
        help="mrc-send --cc: window law(s), comma-separated to compare (nscc,fixed; also "
        "MODULE:CLASS); default nscc",
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
        args.cc = [load_law(c) for c in str(args.cc).split(",") if c]
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
    return run_main(PROG, lambda: run_bench(args), "interrupted (fabric removed)")


if __name__ == "__main__":
    sys.exit(main())
