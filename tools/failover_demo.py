#!/usr/bin/env python3
"""Failover demo: fail a fabric link in the middle of a transfer, heal it or not, and compare
MRC with kernel TCP (pinned to the failed path) and Linux MPTCP (one subflow per plane).

The run is :mod:`mrc.lab.failover.demo` (what it does, step by step), its figures
:mod:`mrc.lab.failover.analysis`; this script parses the arguments.  By default it downs the
spine link p1l1-p1s0, which plain routing in plane 1 uses, at ``--fail-at`` seconds after the
sender started and heals it at ``--heal-at``.  MRC's side channel and MPTCP's first subflow are
set up over the failed link's plane (``--setup-plane``).  A link may also be blackholed
(``--how blackhole``: ip6tables drops its traffic, no link event) and never heal
(``--heal-at never``); ``--case`` and ``--matrix`` run several such cases on one fabric.  With
``--host-image IMAGE`` the fabric's hosts are containers of an image with mrc in it
(``mrc-fabric up --host-image``, docker/build.sh).

Output: a table per case on stdout (or one JSON object with ``--json``), a PNG plot of goodput
over time per case (``--plot``), progress on stderr.  The fabric has a unique name and is always
torn down, also on Ctrl-C.  Needs root.

    .venv/bin/python tools/failover_demo.py                 # ~1 min, 200 Mbit/s x 4 planes
    .venv/bin/python tools/failover_demo.py --quick --json  # < 1 min
    .venv/bin/python tools/failover_demo.py --fail nic      # host NIC h0-p1l0 instead
    .venv/bin/python tools/failover_demo.py --quick --fail recv-nic --how blackhole --no-heal
    .venv/bin/python tools/failover_demo.py --quick --matrix --json  # 8 cases (issue 37)
    .venv/bin/python tools/failover_demo.py --link p1l0 p1s0 --fail-at 2 --heal-at 4
    .venv/bin/python tools/failover_demo.py --quick --host-image "$(bash docker/build.sh)"
"""

from __future__ import annotations

import sys
from argparse import ArgumentTypeError

from mrc.cli.common import (
    Parser,
    float_between,
    non_negative_int,
    positive_int,
    rate_arg,
    run_main,
)
from mrc.lab.failover.demo import HOWS, MATRIX, PRESETS, TRANSPORTS, Case, parse_case
from mrc.lab.failover.demo import main as run_demo

PROG = "failover_demo.py"


def main(argv: list[str] | None = None) -> int:
    p = Parser(
        prog=PROG,
        description="Fail a fabric link mid-transfer (down or blackholed, healed or not) and"
        " compare MRC, TCP and MPTCP.",
        epilog="Exit status 0 when every case went as it should: each transport delivered its"
        " data intact, except that in a case that never heals only MRC has to (TCP pinned to the"
        " failed plane cannot; MPTCP may or may not survive), and the others must not crash nor"
        " deliver other data than was sent. Cases that never heal are reported as they ended:"
        " 'finished' false with the bytes moved.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="short schedule (fail at 1.5 s, heal at 3 s, 1.5 s after): all three in < 1 min",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--name", help="fabric name (default: fo<pid>)")
    p.add_argument("--planes", type=positive_int, default=4)
    p.add_argument(
        "--rate", type=rate_arg, default="200mbit", help="tbf rate on every link (200mbit)"
    )
    p.add_argument("--mtu", type=positive_int, default=9000)
    p.add_argument(
        "--host-image",
        metavar="IMAGE",
        help="run the fabric's hosts as containers of IMAGE (docker/build.sh builds one;"
        " podman, or docker: MRC_ENGINE picks); data and results go through the fabric's"
        " shared directory",
    )
    p.add_argument(
        "--fail",
        choices=sorted(PRESETS),
        default="spine",
        help="which link: spine = p1l1-p1s0 (receiver leaf - spine 0), uplink = "
        "p1l0-p1s0 (sender leaf's uplink), nic = h0-p1l0 (sender NIC), recv-nic = h3-p1l1 "
        "(receiver NIC)",
    )
    p.add_argument(
        "--how",
        choices=HOWS,
        default="down",
        help="down: the link admin down at both ends (the hosts see a link event); blackhole:"
        " ip6tables in the namespace of the link's first node (the host for nic and recv-nic,"
        " the leaf otherwise) drops everything in and out of its interface, the link stays up"
        " and nobody is told",
    )
    p.add_argument(
        "--plane", type=non_negative_int, default=1, help="plane of the --fail link and of TCP"
    )
    p.add_argument(
        "--setup-plane",
        type=non_negative_int,
        metavar="P",
        help="the plane MRC's side channel (the receiver's address on it) and MPTCP's first"
        " subflow are set up over (default: the failed link's plane, so the failure hits the"
        " plane the control traffic started on; 0 was the demo's choice before)",
    )
    p.add_argument("--link", nargs=2, metavar=("A", "B"), help="any fabric link instead")
    p.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="FAIL[:HOW[:HEAL]]",
        help="run this case (repeatable; instead of --fail, --how and --no-heal), e.g."
        " recv-nic:blackhole:never: FAIL as --fail, HOW down (default) or blackhole, HEAL heal"
        " (at --heal-at, default) or never; every case on the same fabric, one after another",
    )
    p.add_argument(
        "--matrix",
        action="store_true",
        help=f"run the {len(MATRIX)} cases {', '.join(MATRIX)}: the set-up's plane lost at"
        " the sender's or the receiver's NIC, by link down or blackhole, briefly or for good",
    )
    seconds = float_between(0, 3600, " s")
    p.add_argument("--fail-at", type=seconds, help="seconds after the sender starts (3.0)")
    p.add_argument(
        "--heal-at",
        metavar="SECONDS|never",
        help="seconds after the sender starts (7.0), or never: the link stays failed until the"
        " transport's run is over",
    )
    p.add_argument("--no-heal", action="store_true", help="the same as --heal-at never")
    p.add_argument(
        "--after",
        type=seconds,
        help="seconds of transfer after the heal, or after the failure when it never heals"
        " (3.0); the data is what the transport's paths carry in (heal-at or fail-at) + after",
    )
    p.add_argument(
        "--give-up",
        type=seconds,
        default=20.0,
        metavar="SECONDS",
        help="when the link never heals: seconds after the failure a transport still running"
        " is stopped and reported as not finished, with the bytes it moved (20)",
    )
    p.add_argument(
        "--transports", default=",".join(TRANSPORTS), help="comma-separated subset of mrc,tcp,mptcp"
    )
    p.add_argument("--payload", type=positive_int, default=8192, help="MRC payload bytes (8192)")
    p.add_argument("--window", type=positive_int, default=64, help="MRC packets in flight (64)")
    p.add_argument("--evs", type=positive_int, default=128, help="MRC entropy values (128)")
    p.add_argument(
        "--qp",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a QPConfig field for MRC, e.g. --qp probe_interval=0.01",
    )
    p.add_argument(
        "--size-factor",
        type=float_between(0, 100),
        default=1.0,
        help="transfer size = capacity x ((heal-at, or fail-at if never) + after) x this",
    )
    p.add_argument(
        "--plot",
        default="failover.png",
        help="PNG to write ('' for none); with several cases one per case, the case's label"
        " before the suffix (failover-recv-nic-blackhole-never.png)",
    )
    p.add_argument("--raw", help="also write every sample and event to this JSON file")
    p.add_argument("--keep-files", action="store_true")
    a = p.parse_args(argv)
    a.fail_at = a.fail_at if a.fail_at is not None else (1.5 if a.quick else 3.0)
    a.after = a.after if a.after is not None else (1.5 if a.quick else 3.0)
    never = a.no_heal or a.heal_at == "never"
    heal_at = 3.0 if a.quick else 7.0  # (a case that heals, when --heal-at says never)
    if a.heal_at not in (None, "never"):
        try:
            heal_at = seconds(a.heal_at)
        except ArgumentTypeError as exc:
            p.error(f"argument --heal-at: {exc}")
    if a.link is not None and (a.case or a.matrix):
        p.error("--link names one link: not with --case or --matrix")
    try:
        a.cases = [
            parse_case(c, a.plane, heal_at) for c in a.case + list(MATRIX if a.matrix else [])
        ]
    except ValueError as exc:
        p.error(str(exc))
    if not a.cases:
        link = a.link or [x.format(p=a.plane) for x in PRESETS[a.fail]]
        a.cases = [
            Case((link[0], link[1]), a.how, None if never else heal_at, None if a.link else a.fail)
        ]
    if not a.fail_at > 0 or any(c.heal_at is not None and c.heal_at <= a.fail_at for c in a.cases):
        p.error("need 0 < --fail-at < --heal-at")
    for opt, plane in (("--plane", a.plane), ("--setup-plane", a.setup_plane)):
        if plane is not None and plane >= a.planes:
            p.error(f"{opt} {plane}: the fabric has planes 0 to {a.planes - 1}")
    a.transports = [t.strip() for t in a.transports.split(",") if t.strip()]
    for t in a.transports:
        if t not in TRANSPORTS:
            p.error(f"unknown transport {t!r}")
    return run_main(PROG, lambda: run_demo(a), "interrupted (fabric removed)")


if __name__ == "__main__":
    sys.exit(main())
