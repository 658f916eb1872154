#!/usr/bin/env python3
"""Failover demo: down a fabric link in the middle of a transfer, heal it, and compare MRC with
kernel TCP (pinned to the failed path) and Linux MPTCP (one subflow per plane).

The run is :mod:`mrc.lab.failover.demo` (what it does, step by step), its figures
:mod:`mrc.lab.failover.analysis`; this script parses the arguments.  By default it downs the
spine link p1l1-p1s0, which plain routing in plane 1 uses, at ``--fail-at`` seconds after the
sender started and heals it at ``--heal-at``.  With ``--host-image IMAGE`` the fabric's hosts
are containers of an image with mrc in it (``mrc-fabric up --host-image``, docker/build.sh).

Output: a table on stdout (or one JSON object with ``--json``), a PNG plot of goodput over time
(``--plot``), progress on stderr.  The fabric has a unique name and is always torn down, also on
Ctrl-C.  Needs root.

    .venv/bin/python tools/failover_demo.py                 # ~1 min, 200 Mbit/s x 4 planes
    .venv/bin/python tools/failover_demo.py --quick --json  # < 1 min
    .venv/bin/python tools/failover_demo.py --fail nic      # host NIC h0-p1l0 instead
    .venv/bin/python tools/failover_demo.py --link p1l0 p1s0 --fail-at 2 --heal-at 4
    .venv/bin/python tools/failover_demo.py --quick --host-image "$(bash docker/build.sh)"
"""

from __future__ import annotations

import sys

from mrc.cli.common import (
    Parser,
    float_between,
    non_negative_int,
    positive_int,
    rate_arg,
    run_main,
)
from mrc.lab.failover.demo import PRESETS, TRANSPORTS
from mrc.lab.failover.demo import main as run_demo

PROG = "failover_demo.py"


def main(argv: list[str] | None = None) -> int:
    p = Parser(
        prog=PROG,
        description="Down a fabric link mid-transfer and compare MRC, TCP and MPTCP.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="short schedule (fail at 1.5 s, heal at 3 s): all three in < 1 min",
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
        "p1l0-p1s0 (sender leaf's uplink), nic = h0-p1l0 (sender NIC)",
    )
    p.add_argument(
        "--plane", type=non_negative_int, default=1, help="plane of the --fail link and of TCP"
    )
    p.add_argument("--link", nargs=2, metavar=("A", "B"), help="any fabric link instead")
    seconds = float_between(0, 3600, " s")
    p.add_argument("--fail-at", type=seconds, help="seconds after the sender starts (3.0)")
    p.add_argument("--heal-at", type=seconds, help="seconds after the sender starts (7.0)")
    p.add_argument("--after", type=seconds, help="seconds of transfer after the heal (3.0)")
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
        help="transfer size = capacity x (heal-at + after) x this",
    )
    p.add_argument("--plot", default="failover.png", help="PNG to write ('' for none)")
    p.add_argument("--raw", help="also write every sample and event to this JSON file")
    p.add_argument("--keep-files", action="store_true")
    a = p.parse_args(argv)
    a.fail_at = a.fail_at if a.fail_at is not None else (1.5 if a.quick else 3.0)
    a.heal_at = a.heal_at if a.heal_at is not None else (3.0 if a.quick else 7.0)
    a.after = a.after if a.after is not None else (1.5 if a.quick else 3.0)
    if not 0 < a.fail_at < a.heal_at:
        p.error("need 0 < --fail-at < --heal-at")
    if a.link is None:
        a.link = [x.format(p=a.plane) for x in PRESETS[a.fail]]
    a.transports = [t.strip() for t in a.transports.split(",") if t.strip()]
    for t in a.transports:
        if t not in TRANSPORTS:
            p.error(f"unknown transport {t!r}")
    return run_main(PROG, lambda: run_demo(a), "interrupted (fabric removed)")


if __name__ == "__main__":
    sys.exit(main())
