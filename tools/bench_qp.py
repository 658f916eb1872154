#!/usr/bin/env python3
"""Benchmark one MRC queue pair against the machine's own limits on the same veth path.

Two network namespaces (mrc.lab.testbed.TwoHosts) are joined by ``--links`` veth links (one plane
each, MTU 9000 by default). For every payload size and every run it measures, side by side and
interleaved (each kind leads in turn, so drift hits all alike):

* **mrc**: ``mrc-recv --discard --json`` in B, ``mrc-send --size S --payload P --json`` from A
  (one QP sprayed over all planes): goodput, packets/s, retransmits. ``--burst K`` passes
  mrc-send's GSO bursts on; ``--security none,integrity,encrypt`` adds runs with a pre-shared
  key (and ``--encrypt``) and reports what each costs against the run without one;
  ``--checksum blake3,xxh3-128,sha256`` runs MRC once per end-to-end checksum (mrc-send and
  mrc-recv ``--checksum NAME``) and reports each one's goodput, sender and receiver CPU per
  GiB, and what it costs against the first.
* the references of :mod:`mrc.lab.harness.peers` (``--compare``, default all), P+28-byte datagrams,
  the size of an MRC data datagram: **raw** a Python loop of one ``send`` / ``recv_into`` per
  datagram; **gso** the same datagrams sent 7 (or up to 64) per ``sendmsg`` with UDP_SEGMENT
  and received as GRO trains, the kernel's batched limit; **tcp** kernel TCP over the first
  link, 1 MiB per ``send``. Each runs ``--duration`` s at the receiver and reports the payload
  rate it moved, and MRC goodput is shown as a fraction of each; tcp also each side's CPU
  seconds per GiB, and MRC's (sender + receiver) as a multiple of them (``CPU/tcp``, JSON
  ``mrc_cpu_vs_tcp``: issue 38 aims at <= 3). **aioquic** (only when asked,
  ``--compare tcp,aioquic``; needs the aioquic package) moves ``--size`` bytes on one QUIC
  stream over the first link, the receiver hashing them, and reports its goodput and each
  side's CPU seconds per GiB (:mod:`mrc.lab.harness.quic_peer`).

Output: JSON on stdout, a human table on stderr (``--json``: JSON only; ``--table``: the table
on stdout instead of JSON). Needs root. Examples::

    sudo .venv/bin/python tools/bench_qp.py                     # 256M, P=8192, 1 link, 3 runs
    sudo .venv/bin/python tools/bench_qp.py --burst 8           # MRC with GSO bursts of 8
    sudo .venv/bin/python tools/bench_qp.py --links 1,2 --payloads 1400,8192 --mtu 1500
    sudo .venv/bin/python tools/bench_qp.py --quick             # < 20 s smoke run
    sudo .venv/bin/python tools/bench_qp.py --security none,integrity,encrypt --compare raw
    sudo .venv/bin/python tools/bench_qp.py --checksum blake3,xxh3-128,sha256 --compare tcp
    sudo .venv/bin/python tools/bench_qp.py --compare tcp,aioquic  # the Python QUIC stack too

The runs are :mod:`mrc.lab.bench.qp`; this script parses the arguments.
"""

from __future__ import annotations

import argparse
import sys

from mrc.cli.common import Parser, float_between, positive_int, run_main, size_arg
from mrc.cli.qpopts import add_qp_arg
from mrc.errors import UsageError
from mrc.lab.bench.qp import DEFAULT_PEERS, IPV6_UDP, PEER_KINDS, SECURITY_MODES
from mrc.lab.bench.qp import main as run_bench
from mrc.transport.messages import CHECKSUMS
from mrc.units import SIZE_HELP
from mrc.wire import DATA_HDR_LEN, DATA_IMM_HDR_LEN

PROG = "bench_qp.py"


# ---- arguments ---------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"need positive numbers, got {text!r}")
    return list(dict.fromkeys(values))


def _peer_kinds(text: str) -> list[str]:
    kinds = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [k for k in kinds if k not in PEER_KINDS]
    if bad:
        raise argparse.ArgumentTypeError(
            f"references are {', '.join(PEER_KINDS)}; not {', '.join(bad)}"
        )
    return kinds


def _names(text: str, allowed: tuple[str, ...] | list[str], what: str) -> list[str]:
    """A comma-separated list of ``allowed`` names (repeats once), for --security and
    --checksum alike."""
    names = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"{what} are {', '.join(allowed)}; not {', '.join(bad) or text!r}"
        )
    return names


def _modes(text: str) -> list[str]:
    return _names(text, SECURITY_MODES, "security modes")


def _checksums(text: str) -> list[str]:
    return _names(text, CHECKSUMS, "checksums")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Benchmark one MRC QP (mrc-send -> mrc-recv) against a raw Python UDP "
        "blast of the same datagram size between two namespaces joined by veth links. JSON on "
        "stdout, a table on stderr. Needs root.",
    )
    p.add_argument(
        "--size",
        type=size_arg,
        default=None,
        help=f"bytes per MRC transfer (default 256M; --quick 32M; {SIZE_HELP})",
    )
    p.add_argument(
        "--payloads",
        type=_int_list,
        default=None,
        metavar="P[,P...]",
        help="MRC payload bytes per packet (default 8192); the raw blast sends "
        f"P+{DATA_HDR_LEN}-byte datagrams",
    )
    p.add_argument("--payload", dest="payloads", type=_int_list, help=argparse.SUPPRESS)
    p.add_argument(
        "--links",
        type=_int_list,
        default=None,
        metavar="N[,N...]",
        help="veth links (planes) between the hosts; a list runs each (default 1)",
    )
    p.add_argument(
        "--runs",
        type=positive_int,
        default=None,
        help="repetitions of each measurement, interleaved (default 3; --quick 1)",
    )
    p.add_argument(
        "--duration",
        type=float_between(0, 600, " s"),
        default=None,
        metavar="SECONDS",
        help="length of each raw UDP blast at the receiver (default 2; --quick 1)",
    )
    p.add_argument("--mtu", type=int, default=9000, help="veth MTU (default 9000)")
    p.add_argument(
        "--compare",
        type=_peer_kinds,
        default=list(DEFAULT_PEERS),
        metavar="KIND[,KIND...]",
        help="references run beside MRC, interleaved: raw (a Python loop of one datagram "
        "per send/recv), gso (GSO sends, GRO receives), tcp (kernel TCP), aioquic (one QUIC "
        "stream of --size bytes, hashed; needs the aioquic package); default raw,gso,tcp",
    )
    p.add_argument(
        "--security",
        type=_modes,
        default=["none"],
        metavar="MODE[,MODE...]",
        help="MRC runs without a key (none), with one (integrity: mrc-send/mrc-recv "
        "--key-file) and encrypting (encrypt: also --encrypt), interleaved; the table adds "
        "each mode's goodput cost against none (default none)",
    )
    p.add_argument(
        "--checksum",
        type=_checksums,
        default=None,
        metavar="NAME[,NAME...]",
        help=f"MRC runs with each end-to-end checksum ({', '.join(CHECKSUMS)}; mrc-send and "
        "mrc-recv --checksum NAME), interleaved; the table adds each one's goodput, sender and "
        "receiver CPU s/GiB and their cost against the first listed (default: no --checksum "
        "for either, so they agree on mrc's default, blake3). With --security: several "
        "checksums and one mode, or one checksum and several modes, not both",
    )
    p.add_argument(
        "--evs",
        type=positive_int,
        default=None,
        help="mrc-send --evs (default: mrc-send's own, 128)",
    )
    p.add_argument(
        "--window",
        type=positive_int,
        default=None,
        help="mrc-send --window (default: mrc-send's own, 512)",
    )
    p.add_argument(
        "--burst",
        type=positive_int,
        default=None,
        help="mrc-send --burst: packets per EV burst, sent with UDP GSO (default: mrc-send's, 1)",
    )
    add_qp_arg(p, " to mrc-send")
    p.add_argument(
        "--no-mem-warmup",
        action="store_true",
        help="skip touching 4 x --size of fresh memory before measuring (on a VM "
        "the first touch of never-used guest memory is slow; both tools put every "
        "transfer in fresh memory)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes and one run (under 20 s)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="JSON only (no table, no progress)")
    out.add_argument(
        "--table", action="store_true", help="print the human table on stdout instead of JSON"
    )
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="py-spy record mrc-send and mrc-recv during the first MRC run of each "
        "topology into DIR (needs py-spy)",
    )
    return p


def _finish_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.size is None:
        a.size = (32 << 20) if a.quick else (256 << 20)
    if a.size < 1:
        p.error(f"--size must be at least 1 byte, not {a.size}")
    if a.payloads is None:
        a.payloads = [8192]
    if a.links is None:
        a.links = [1]
    if a.runs is None:
        a.runs = 1 if a.quick else 3
    if a.duration is None:
        a.duration = 1.0 if a.quick else 2.0
    if not 1280 <= a.mtu <= 65535:
        p.error(f"--mtu must be 1280..65535, not {a.mtu}")
    biggest = a.mtu - IPV6_UDP - DATA_IMM_HDR_LEN  # the last (zero-length) WRITE_IMM packet
    for pl in a.payloads:
        if pl > min(biggest, 65000):
            p.error(
                f"payload {pl} does not fit one datagram on MTU {a.mtu} "
                f"(at most {min(biggest, 65000)} bytes)"
            )
    if any(n > 16 for n in a.links):
        p.error("--links: at most 16")
    if a.checksum is not None and len(a.checksum) > 1 and len(a.security) > 1:
        p.error("--security and --checksum: only one of them may list more than one")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    _finish_args(parser, a)
    return run_main(PROG, lambda: _run(a))


def _run(a: argparse.Namespace) -> int:
    """The benchmark, once what it needs is known to be here: a missing aioquic is one line
    before any namespace is made, not a failed run per reference."""
    if "aioquic" in a.compare:
        from mrc.lab.harness.quic_peer import missing

        why = missing()
        if why is not None:
            raise UsageError(why)
    return run_bench(a)


if __name__ == "__main__":
    sys.exit(main())
