#!/usr/bin/env python3
"""Benchmark many MRC queue pairs into one receiver on loopback, against one QP moving the same
bytes.

One ``mrc-recv --discard --count N`` on [::1] takes N = ``--procs`` x ``--parallel`` streams of
``--size`` bytes each, from ``--procs`` mrc-send processes of ``--parallel`` QPs started at once.
In every run, interleaved with it (each leads in turn), one QP moves the same N x size bytes
into a receiver of its own (``--no-compare-one`` skips it), so the aggregate reads as a ratio of
what one QP gets on this machine at this moment: near 1, the receiver keeps up with many
streams; well below, it does not. Each run reports streams completed, wall time, aggregate
goodput, per-stream finish times, Jain's fairness index over the stream rates, sender CPU,
kernel UDP buffer drops, the senders' retransmission counters, the receiver's ACKs and
duplicates and the first errors; the summary, medians over ``--runs``.

Output: JSON on stdout, a table on stderr (``--json``: JSON only). Needs no root (loopback
only). A run that does not finish in 30 s + its bytes at 5 MB/s is stopped and reported as
failed; the exit status is then 1. Examples::

    .venv/bin/python tools/bench_manyqp.py                        # 16 QPs x 4M, 3 runs
    .venv/bin/python tools/bench_manyqp.py --procs 4 --parallel 64 --size 1M --runs 3
    .venv/bin/python tools/bench_manyqp.py --procs 2 --extra '--burst 8 --cc fixed'

The runs are :mod:`mrc.lab.bench.manyqp`; this script parses the arguments.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from mrc.cli.common import Parser, int_at_least, positive_int, run_main, size_arg
from mrc.lab.bench.manyqp import main as run_bench
from mrc.units import SIZE_HELP

PROG = "bench_manyqp.py"
MAX_PARALLEL = 256  # mrc-send --parallel's limit
#: mrc-send options the benchmark sets itself: from --extra they would change what is measured
OWN_OPTIONS = ("--to", "--parallel", "--size", "--time", "--json")


def extra_args(text: str) -> list[str]:
    """``--extra``: mrc-send arguments split as a shell would, minus the ones set here."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"cannot split {text!r}: {exc}") from None
    taken = [w for w in words if w.split("=", 1)[0] in OWN_OPTIONS]
    if taken:
        raise argparse.ArgumentTypeError(
            f"{', '.join(taken)}: set by the benchmark itself ({', '.join(OWN_OPTIONS)})"
        )
    return words


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    paragraphs = __doc__.replace("``", "").replace("Examples::", "Examples:").split("\n\n")
    p = Parser(
        prog=PROG,
        description="\n\n".join(paragraphs[:2]),  # what it measures
        epilog="\n\n".join(paragraphs[2:4]),  # its output, examples
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--procs", type=positive_int, default=1, help="mrc-send processes, started at once (1)"
    )
    p.add_argument(
        "--parallel",
        type=positive_int,
        default=16,
        help=f"QPs per mrc-send process, 1..{MAX_PARALLEL} (16)",
    )
    p.add_argument("--size", type=size_arg, default=4 << 20, help=f"bytes per QP (4M; {SIZE_HELP})")
    p.add_argument("--runs", type=positive_int, default=3, help="runs; medians are reported (3)")
    p.add_argument(
        "--evs",
        type=positive_int,
        default=16,
        help="mrc-send --evs per QP (16: every EV is a UDP socket of its own, and 256 QPs "
        "x 128 EVs would not fit the ephemeral ports)",
    )
    p.add_argument(
        "--compare-one",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="in every run also one QP moving the same total bytes, interleaved (default on)",
    )
    p.add_argument(
        "--extra",
        type=extra_args,
        default=[],
        metavar="ARGS",
        help="more mrc-send arguments for every sender, one QP's too, split as a shell "
        "would: --extra '--burst 8 --cc fixed'",
    )
    p.add_argument(
        "--port",
        type=int_at_least(1),
        default=None,
        help="mrc-recv's port on [::1] (default: a free one, picked for each receiver)",
    )
    p.add_argument("--json", action="store_true", help="JSON only (no table, no progress)")
    args = p.parse_args(argv)
    if args.parallel > MAX_PARALLEL:
        p.error(f"--parallel: at most {MAX_PARALLEL}, not {args.parallel}")
    if args.size < 1:
        p.error(f"--size must be at least 1 byte, not {args.size}")
    if args.port is not None and args.port > 65535:
        p.error(f"--port must be 1..65535, not {args.port}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main(PROG, lambda: run_bench(args))


if __name__ == "__main__":
    sys.exit(main())
