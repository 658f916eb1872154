#!/usr/bin/env python3
"""Benchmark how fairly window laws share one host's last hop: N timed QPs from N hosts into one.

Why: a window law (``mrc-send --cc``) that fills the links is not enough; when several senders
meet at one receiver, each should get its share and the fabric should trim rather than drop.
tests/fabric/test_fairness.py asserts that for two NSCC senders; this tool measures it for any
laws and any number of senders, side by side, so a change to a law can be judged by numbers.

One trimming fabric (``mrc-fabric up --trim``: ``--planes`` planes x ``--spines`` spines, every
link shaped to ``--rate``, MTU 9000) is built for the whole benchmark, with max(--senders) + 1
hosts, each on a leaf of its own: every path is leaf - spine - leaf, all of the same length,
and the only link the senders share is the last host's last hop (its leaf's port into it, one
per plane). For every run, every sender count N in ``--senders`` and every law in ``--cc``:
``mrc-recv --count N --discard`` in the last host, and h0 .. h(N-1) each ``mrc-send --time``
into it at once. The laws alternate run by run (A, B, A, B, ...) so machine noise hits all.

Reported per law and sender count (medians over ``--runs``, and every run in the JSON):

* jain: Jain's index of the senders' goodputs, (sum x)^2 / (N sum x^2): 1 is an even split,
  1/N one sender taking everything;
* utilization: the senders' goodputs summed over the last hop's capacity (planes x rate);
  headers cap it near payload / frame (``payload_ceiling`` in the JSON). Each goodput is a
  sender's own bytes over its own seconds and the senders start up to a few hundred ms apart,
  so in short runs the sum can pass the ceiling; ``span`` (``utilization_span``) is every
  byte over the time from the first sender's first WRITE to the last one's last ACK (placed
  on one clock by when each process exited), which staggering does not inflate; ``overlap``
  is the fraction of that time every sender was sending;
* timeouts and retransmits summed over the senders (``retransmits_timeout``, ``retransmits``);
* fabric trims and drops: the routers' trim counters and every link end's drops (tbf and
  interface), read before and after the run;
* digests: every sender's digest under the end-to-end checksum it agreed on with the receiver
  (BLAKE3 unless told) equals the receiver's (``digest`` vs ``digest_receiver`` of mrc-send's
  JSON, and the receiver's own line; ``sha256_ok`` in the JSON). A mismatch is reported loudly
  and the exit status is 1.

Output: progress lines on stderr (not with ``--quiet``), then the table on stdout, or with
``--json`` the table on stderr and one JSON object on stdout (per-sender values included, and
the machine: its CPU count and load). The fabric's namespaces are named mrc-<name>-... with a
unique default name and are always removed, also on Ctrl-C / SIGTERM. Needs root.

    sudo .venv/bin/python tools/bench_share.py                        # 2 and 4 senders, nscc
    sudo .venv/bin/python tools/bench_share.py --senders 2,4 --cc nscc,nscc-mrc --runs 3
    sudo .venv/bin/python tools/bench_share.py --senders 2 --cc nscc,fixed --time 2 --json
"""

from __future__ import annotations

import argparse
import os
import sys

from mrc.cli.common import Parser, cc_arg, float_between, positive_int, rate_arg, run_main
from mrc.core.cc import names as cc_names
from mrc.lab.bench.share import PROG
from mrc.lab.bench.share import main as run_bench
from mrc.lab.fabric.spec import MAX_LEAVES, NAME_RE

# The runs are mrc.lab.bench.share; this script parses the arguments (its docstring is --help).


# ---- arguments ----------------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 2,4, not {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one sender count, like 2,4")
    # a leaf per host: the receiver's leaf and one per sender
    bad = [n for n in values if not 1 <= n <= MAX_LEAVES - 1]
    if bad:
        raise argparse.ArgumentTypeError(f"sender counts must be 1..{MAX_LEAVES - 1}, not {bad}")
    return sorted(set(values), key=values.index)


def _law_list(text: str) -> list[str]:
    laws = [cc_arg(x.strip()) for x in text.split(",") if x.strip()]  # one-line error if unknown
    if not laws:
        raise argparse.ArgumentTypeError(
            f"expected laws, comma-separated ({', '.join(cc_names())}, MODULE:CLASS)"
        )
    return sorted(set(laws), key=laws.index)


def _window(text: str) -> int | None:
    if text == "auto":
        return None
    return positive_int(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    doc = __doc__ or ""
    p = Parser(
        prog=PROG,
        description=doc.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--senders",
        type=_int_list,
        default=[2, 4],
        metavar="N[,N...]",
        help="sender counts, comma-separated (default 2,4): h0..h(N-1) send into the last host",
    )
    p.add_argument(
        "--cc",
        type=_law_list,
        default=["nscc"],
        metavar="LAW[,LAW...]",
        help=f"window laws to compare, comma-separated, as mrc-send --cc takes them "
        f"({', '.join(cc_names())}, MODULE:CLASS; default nscc)",
    )
    p.add_argument(
        "--time",
        type=float_between(0, 600, " s"),
        default=6.0,
        help="seconds every sender sends in a run (mrc-send --time; default 6)",
    )
    p.add_argument(
        "--runs", type=positive_int, default=1, help="runs; medians are reported (default 1)"
    )
    p.add_argument(
        "--rate", type=rate_arg, default="100mbit", help="tbf rate of every link (100mbit)"
    )
    p.add_argument("--planes", type=positive_int, default=4, help="planes (default 4)")
    p.add_argument(
        "--spines",
        type=positive_int,
        default=4,
        help="spines per plane (default 4: the spines' links stay out of the bottleneck)",
    )
    p.add_argument(
        "--window",
        type=_window,
        default=None,
        metavar="PACKETS|auto",
        help="mrc-send --window for every sender (default auto: mrc-send's own cap, 512, for "
        "laws that find their window; 4 per plane for --cc fixed, whose window it is)",
    )
    p.add_argument("--name", help="fabric name, the namespaces' prefix (default share<pid>)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args(argv)
    args.name = args.name or f"share{os.getpid()}"
    if not NAME_RE.match(args.name):
        p.error(f"bad --name {args.name!r}: use 1-24 letters, digits or '_' (no '-')")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main(PROG, lambda: run_bench(args), "interrupted (fabric removed)")


if __name__ == "__main__":
    sys.exit(main())
