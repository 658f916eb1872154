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

Without trimming or marks, with a last hop slower than the tools are told, and with a link
that dies mid-run (issue 39):

* ``--no-trim`` builds the fabric without ``--trim``: every router port a plain tbf, a
  tail-drop queue of ~10 ms, and no ECN marks; congestion shows only as delay and drops;
* ``--reshape RATE`` (needs ``--no-trim``), once the fabric is up and before any sender runs,
  reshapes the receiver's plane links (its leaf's port into it, one per plane: its NIC links)
  to RATE with tc, behind the tools' back: the leaf's port a tbf holding ``--reshape-queue`` ms
  of RATE (default 9), tail drop; the receiver's own NIC the fabric's host queue at RATE. The
  topology file still says ``--rate``, so every sender takes its line rate from that and is
  wrong. Utilization is then of planes x RATE, the real capacity;
* ``--fail-at SECONDS`` sets plane 0's first spine's link into the receiver's leaf down (both
  ends, admin down, as ``mrc-fabric link``) that long after the senders' data begins to flow
  (the receiver's NICs have taken in 256 KiB), in every measured run, and up again after it:
  a link carrying that spine's share of plane 0 for every sender. Reported: its route's EVs
  retired (the senders' data EVs, from ``--ev-log``; the receiver's ACK EVs), how soon after
  the failure the first and the last were, other EVs retired, the longest stall after it
  (every sender reports every 50 ms: ``--interval``), and the last hop's rate on its own
  counters in the second just before and just after the failure (before the first sender
  finishes; shorter if SECONDS < 2);
* ``--size SIZE`` sends SIZE from every sender instead of ``--time`` (the issue's rows: 64M);
* ``--library DIR`` runs mrc-send and mrc-recv with DIR first on their PYTHONPATH: another
  checkout of mrc (a git worktree of an older commit, with its native module), so one version
  of this tool measures two of mrc; ``config.children_mrc_commit`` says which ran.

Every run also reports EVs retired (``evs_assumed_bad``: the senders' data EVs; ``_ack``: the
receiver's ACK EVs), how many of those proved false (``evs_assumed_bad_false``), losses
excused by queueing delay (``ev_losses_delayed``; null where the code that ran does not count
it), the last hop's own receive counters (``lasthop_utilization``, ``lasthop_peak_bps``) and,
with ``--reshape`` or ``--fail-at``, the longest time any sender had nothing acknowledged
(``max_stall_s``, in 50 ms steps) and the EVs retired by reason (every process writes
``--ev-log``: ``retired_reasons``, ``retired_reasons_ack``; summed over the runs in the
summary).

Output: progress lines on stderr (not with ``--quiet``), then the table on stdout, or with
``--json`` the table on stderr and one JSON object on stdout (per-sender values included, and
the machine: its CPU count and load). The fabric's namespaces are named mrc-<name>-... with a
unique default name and are always removed, also on Ctrl-C / SIGTERM. Needs root.

    sudo .venv/bin/python tools/bench_share.py                        # 2 and 4 senders, nscc
    sudo .venv/bin/python tools/bench_share.py --senders 2,4 --cc nscc,nscc-mrc --runs 3
    sudo .venv/bin/python tools/bench_share.py --senders 2 --cc nscc,fixed --time 2 --json
    sudo .venv/bin/python tools/bench_share.py --senders 2,4,8 --size 64M --rate 200mbit \\
        --no-trim --reshape 50mbit --runs 3                       # issue 39's first row
    sudo .venv/bin/python tools/bench_share.py --senders 2 --size 64M --rate 200mbit \\
        --no-trim --reshape 50mbit --fail-at 2                    # ... and a link dies
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mrc.cli.common import (
    Parser,
    cc_arg,
    float_between,
    positive_int,
    rate_arg,
    run_main,
    size_arg,
)
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
        default=None,
        help="seconds every sender sends in a run (mrc-send --time; default 6)",
    )
    p.add_argument(
        "--size",
        type=size_arg,
        default=None,
        help="bytes every sender sends in a run instead (mrc-send --size: 64M ...)",
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
    p.add_argument(
        "--no-trim",
        action="store_true",
        help="build the fabric without --trim: plain tail-drop queues, no trims, no ECN marks",
    )
    p.add_argument(
        "--reshape",
        type=rate_arg,
        metavar="RATE",
        help="with --no-trim: reshape the receiver's plane links to RATE once the fabric is up, "
        "behind the tools' back (they are told --rate)",
    )
    p.add_argument(
        "--reshape-queue",
        type=float_between(0, 1000, " ms"),
        default=None,
        metavar="MS",
        help="with --reshape: the leaf port's tail-drop queue, in ms of RATE (default 9)",
    )
    p.add_argument(
        "--fail-at",
        type=float_between(0, 600, " s"),
        metavar="SECONDS",
        help="set plane 0's first spine's link into the receiver's leaf down SECONDS after the "
        "data begins to flow, in every run (up again after it)",
    )
    p.add_argument(
        "--library",
        metavar="DIR",
        help="run mrc-send and mrc-recv with the mrc package of DIR, another checkout "
        "(PYTHONPATH=DIR): before/after comparisons",
    )
    p.add_argument("--name", help="fabric name, the namespaces' prefix (default share<pid>)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args(argv)
    args.name = args.name or f"share{os.getpid()}"
    if not NAME_RE.match(args.name):
        p.error(f"bad --name {args.name!r}: use 1-24 letters, digits or '_' (no '-')")
    if args.size is not None and args.time is not None:
        p.error("--size and --time exclude each other: every sender sends one or the other")
    if args.size is not None and args.size <= 0:
        p.error("--size must be at least 1 byte")
    if args.size is None and args.time is None:
        args.time = 6.0
    if args.reshape is not None and not args.no_trim:
        p.error(
            "--reshape needs --no-trim: a trimming router's virtual queue drains at the rate "
            "the fabric was built with"
        )
    if args.reshape_queue is not None and args.reshape is None:
        p.error("--reshape-queue needs --reshape")
    if args.reshape is not None and args.reshape_queue is None:
        args.reshape_queue = 9.0
    if args.fail_at is not None and args.time is not None and args.fail_at >= args.time:
        p.error(f"--fail-at {args.fail_at:g} must be less than --time {args.time:g}")
    if args.library is not None:
        lib = Path(args.library)
        if not (lib / "mrc" / "__init__.py").is_file():
            p.error(f"--library {args.library}: no mrc package there (DIR/mrc/__init__.py)")
        args.library = str(lib.resolve())
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main(PROG, lambda: run_bench(args), "interrupted (fabric removed)")


if __name__ == "__main__":
    sys.exit(main())
