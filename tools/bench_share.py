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
* sha256: every sender's SHA-256 equals the receiver's (``sha256`` vs ``sha256_receiver`` of
  mrc-send's JSON). A mismatch is reported loudly and the exit status is 1.

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
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mrc.cli.common import (
    Parser,
    cc_arg,
    emit_json,
    float_between,
    positive_int,
    rate_arg,
    run_main,
)
from mrc.core.cc import names as cc_names
from mrc.errors import MRCError, UsageError
from mrc.lab.bench.fabric import MRC_OVERHEAD
from mrc.lab.bench.manyqp import jain
from mrc.lab.fabric import Fabric, FabricSpec, Topology
from mrc.lab.fabric.spec import MAX_LEAVES, NAME_RE
from mrc.lab.harness.children import Child, Children
from mrc.lab.harness.envelope import envelope
from mrc.lab.harness.fabric import fabric, unwind_on_sigterm
from mrc.lab.harness.hosts import in_host, tool_path, wait_listening
from mrc.lab.harness.machine import loadavg, machine_info
from mrc.lab.harness.stats import median
from mrc.lab.harness.table import render
from mrc.units import parse_rate
from mrc.wire import DEFAULT_PORT

PROG = "bench_share.py"
TOOL = "bench_share"
PORT = DEFAULT_PORT
MTU = 9000
#: seconds a run may take beyond --time (process start-up, the last round's verification)
SLACK = 60.0
#: seconds between looks at the senders while they run (when each exited, to within this)
POLL = 0.01
#: mrc-send's fields kept for every sender of every run
SEND_KEYS = (
    "ok",
    "bytes",
    "seconds",
    "goodput_bps",
    "payload",
    "packets_sent",
    "data_packets",
    "retransmits",
    "retransmits_nack",
    "retransmits_sack",
    "retransmits_timeout",
    "silent_timeouts",
    "trims_seen",
    "ecn_echoes",
    "cc_decreases",
    "evs_assumed_bad",
    "planes_lost",
    "srtt_ms",
    "cpu_seconds",
    "sha256",
    "sha256_receiver",
    "error",
)


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


# ---- one run ------------------------------------------------------------------------------------


def window_of(law: str, args: argparse.Namespace) -> int | None:
    """The --window every sender gets under ``law``: None leaves mrc-send's own."""
    if args.window is not None:
        return int(args.window)
    return max(8, 4 * args.planes) if law == "fixed" else None


def fabric_counters(topo: Topology) -> dict[str, dict[str, Any]]:
    """Per link end (``p0l2:h2``): its drops (tbf, interface) and, on a router, its trims as an
    egress, from the fabric's status."""
    out: dict[str, dict[str, Any]] = {}
    for lk in Fabric.status(topo)["links"]:
        for node, end in ((lk["a"], lk["a_end"]), (lk["b"], lk["b_end"])):
            if not end.get("present"):
                continue
            trim = end.get("trim", {})
            out[f"{node}:{end['ifname']}"] = {
                "drops": end["qdisc_drops"] + end["rx_dropped"] + end["tx_dropped"],
                "trimmed": trim.get("trimmed", 0),
                "lasthop": bool(trim.get("lasthop", False)),
            }
    return out


def counter_deltas(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    trims = lasthop = drops = 0
    dropped_at: dict[str, int] = {}
    for port, a in after.items():
        b = before.get(port, {"drops": 0, "trimmed": 0})
        t, d = a["trimmed"] - b["trimmed"], a["drops"] - b["drops"]
        trims += t
        lasthop += t if a["lasthop"] else 0
        drops += d
        if d:
            dropped_at[port] = d
    return {
        "fabric_trims": trims,
        "fabric_trims_lasthop": lasthop,
        "fabric_drops": drops,
        "drops_at": dropped_at,
    }


def wait_all(procs: Mapping[str, Child], limit: float, what: str) -> dict[str, float]:
    """Wait for every child of ``procs`` to exit, up to ``limit`` seconds in all; when each
    exited (time.monotonic(), to within POLL seconds). MRCError naming one still running."""
    deadline = time.monotonic() + limit
    exits: dict[str, float] = {}
    while len(exits) < len(procs):
        now = time.monotonic()
        for h, c in procs.items():
            if h not in exits and not c.running:
                exits[h] = now
        if len(exits) < len(procs):
            if now > deadline:
                h, c = next((h, c) for h, c in procs.items() if h not in exits)
                raise MRCError(
                    f"{what}: mrc-send in {h} did not finish in {limit:g} s; "
                    f"stderr: {c.err_tail(5)}"
                )
            time.sleep(POLL)
    for c in procs.values():
        c.finished(5)  # everything it printed read
    return exits


def _json_lines(child: Child) -> list[dict[str, Any]]:
    """Every JSON object ``child`` printed (mrc-recv --count N prints one per transfer)."""
    out = []
    for line in child.out:
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class Share:
    """Runs on one fabric: ``senders`` hosts h0.. into ``receiver``."""

    def __init__(self, args: argparse.Namespace, topo: Topology, receiver: str) -> None:
        self.args = args
        self.topo = topo
        self.receiver = receiver
        self.capacity = args.planes * parse_rate(args.rate)

    def _argv(self, tool: str, *rest: str) -> list[str]:
        return [tool_path(tool), "--fabric", self.topo.name, "--json", "--no-progress", *rest]

    def run(self, law: str, n: int, what: Sequence[str]) -> dict[str, Any]:
        """One run: ``n`` senders under ``law`` sending ``what`` (mrc-send's --time T or
        --size S); the run's figures, per-sender values and SHA-256 verdict. MRCError if a
        sender or the receiver fails other than by a SHA-256 mismatch."""
        topo, receiver = self.topo, self.receiver
        senders = [f"h{i}" for i in range(n)]
        window = window_of(law, self.args)
        send_opts = ["--to", f"{receiver}:{PORT}", *what, "--cc", law]
        send_opts += ["--window", str(window)] if window is not None else []
        limit = (float(what[1]) if what[0] == "--time" else 0.0) + SLACK
        recv_opts = ["--listen", f"[::]:{PORT}", "--count", str(n), "--discard"]
        recv_opts += ["--timeout", "30"]
        with Children() as kids:
            recv = kids.start(
                in_host(topo, receiver, self._argv("mrc-recv", *recv_opts)), f"mrc-recv@{receiver}"
            )
            wait_listening(recv, PORT, topo.netns_of(receiver), 10)
            if not recv.running:
                recv.finished(1)
                raise MRCError(
                    f"mrc-recv in {receiver} exited ({recv.returncode}) before "
                    f"listening: {recv.err_tail(5)}"
                )
            before = fabric_counters(topo)
            procs = {
                h: kids.start(in_host(topo, h, self._argv("mrc-send", *send_opts)), f"mrc-send@{h}")
                for h in senders
            }
            exits = wait_all(procs, limit, f"{law} x{n}")
            recv.finished(30)
            after = fabric_counters(topo)
        return self._result(law, n, window, procs, exits, recv, counter_deltas(before, after))

    def _result(
        self,
        law: str,
        n: int,
        window: int | None,
        procs: Mapping[str, Child],
        exits: Mapping[str, float],
        recv: Child,
        fab: dict[str, Any],
    ) -> dict[str, Any]:
        addr_of = {a: h.name for h in self.topo.hosts for a in (nic.address for nic in h.nics)}
        recvs = {addr_of.get(r.get("from", ""), "?"): r for r in _json_lines(recv)}
        per: dict[str, dict[str, Any]] = {}
        mismatches: list[str] = []
        for h, c in procs.items():
            sj = c.result()
            if sj is None:
                raise MRCError(
                    f"{law} x{n}: mrc-send in {h} printed no result ({c.returncode}): "
                    f"{c.err_tail(5)}"
                )
            s = {k: sj.get(k) for k in SEND_KEYS}
            rj = recvs.get(h)
            s["receiver_bytes"] = rj.get("bytes") if rj else None
            s["receiver_sha256"] = rj.get("sha256") if rj else None
            # as tests/fabric/test_fairness.py: the sender's hash equals the one the receiver
            # sent back; and the receiver's own line for this sender agrees, hash and bytes
            hashes = {s["sha256"], s["sha256_receiver"], s["receiver_sha256"]}
            s["sha256_ok"] = len(hashes) == 1 and None not in hashes
            if s["sha256"] is not None and len(hashes - {None}) > 1:
                s["sha256_ok"] = False
                mismatches.append(
                    f"{h}: sender {s['sha256']}, receiver (to the sender) "
                    f"{s['sha256_receiver']}, receiver (its own line) {s['receiver_sha256']}"
                )
            elif not s["sha256_ok"] or c.returncode != 0 or not sj.get("ok"):
                raise MRCError(
                    f"{law} x{n}: mrc-send in {h} failed ({c.returncode}): "
                    f"{sj.get('error') or c.err_tail(5)}"
                    + ("" if rj else f"; mrc-recv reported no transfer from {h}")
                )
            elif s["receiver_bytes"] != s["bytes"]:
                raise MRCError(
                    f"{law} x{n}: {h} sent {s['bytes']} bytes, the receiver got "
                    f"{s['receiver_bytes']}"
                )
            per[h] = s
        if not mismatches and recv.returncode != 0:
            raise MRCError(
                f"{law} x{n}: mrc-recv in {self.receiver} failed ({recv.returncode}): "
                f"{recv.err_tail(5)}"
            )
        goodputs = [float(per[h]["goodput_bps"] or 0) for h in procs]
        payload = next((s["payload"] for s in per.values() if s["payload"]), None)
        total = sum(goodputs)
        # when each sender sent, on one clock: it exited (seen within POLL) its ``seconds``
        # after its first WRITE, give or take its own exit, which is alike for all
        seconds = {h: float(per[h]["seconds"] or 0) for h in procs}
        first = min(exits[h] - seconds[h] for h in procs)
        span = max(exits.values()) - first
        overlap = min(exits.values()) - max(exits[h] - seconds[h] for h in procs)
        sent = sum(int(per[h]["bytes"] or 0) for h in procs)
        return {
            "cc": law,
            "senders": n,
            "window": window,
            "jain": _round(jain(goodputs), 4),
            "utilization": round(total / self.capacity, 4),
            "span_seconds": round(span, 3),
            "overlap": round(max(0.0, overlap) / span, 4) if span > 0 else None,
            "utilization_span": round(sent * 8 / span / self.capacity, 4) if span > 0 else None,
            "payload_ceiling": (
                round(payload / (payload + MRC_OVERHEAD), 4) if payload is not None else None
            ),
            "goodput_bps": round(total),
            "goodputs_bps": [round(g) for g in goodputs],
            "timeouts": sum(int(s["retransmits_timeout"] or 0) for s in per.values()),
            "retransmits": sum(int(s["retransmits"] or 0) for s in per.values()),
            **fab,
            "sha256_ok": not mismatches,
            "mismatches": mismatches,
            "per_sender": per,
        }


def _round(x: float | None, nd: int) -> float | None:
    return None if x is None else round(x, nd)


# ---- the benchmark ------------------------------------------------------------------------------

#: what the table and the summary give per law and sender count: the median over the runs
MEDIAN_KEYS = (
    "jain",
    "utilization",
    "utilization_span",
    "overlap",
    "goodput_bps",
    "timeouts",
    "retransmits",
    "fabric_trims",
    "fabric_trims_lasthop",
    "fabric_drops",
)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    first = runs[0]
    out: dict[str, Any] = {"cc": first["cc"], "senders": first["senders"]}
    out["window"] = first["window"]
    for k in MEDIAN_KEYS:
        med = median([r[k] for r in runs if r[k] is not None])
        out[k] = None if med is None else round(med, 4)
    out["payload_ceiling"] = first["payload_ceiling"]
    out["sha256_ok"] = all(r["sha256_ok"] for r in runs)
    out["runs"] = runs
    return out


#: the table's columns: law, senders, jain, ..., drops, and sha256 as it is
COLUMN_WIDTHS = (10, 8, 8, 13, 7, 14, 10, 9, 9, 8, 0)


def table(out: Mapping[str, Any]) -> str:
    c = out["config"]
    head = ["law", "senders", "jain", "utilization", "span", "goodput", "timeouts", "retrans"]
    head += ["trims", "drops", "sha256"]
    rows = [
        (
            str(r["cc"]),
            str(r["senders"]),
            "-" if r["jain"] is None else f"{r['jain']:.3f}",
            f"{r['utilization']:.1%}",
            "-" if r["utilization_span"] is None else f"{r['utilization_span']:.0%}",
            f"{r['goodput_bps'] / 1e6:.1f} Mbit/s",
            f"{r['timeouts']:g}",
            f"{r['retransmits']:g}",
            f"{r['fabric_trims']:g}",
            f"{r['fabric_drops']:g}",
            "ok" if r["sha256_ok"] else "MISMATCH",
        )
        for r in out["results"]
    ]
    lines = [
        f"{c['planes']} planes x {c['spines']} spines, links {c['rate']}, --trim, MTU {c['mtu']}: "
        f"N senders -> {c['receiver']}, {c['time']:g} s each, median of {c['runs']} run(s)",
        render(rows, "<>>>>>>>>><", sep=[""] * 9 + ["  "], widths=COLUMN_WIDTHS, head=head),
    ]
    m = out["machine"]
    lines.append(
        f"utilization = sum of goodputs / {c['capacity_bps'] / 1e6:.0f} Mbit/s (planes x rate); "
        f"headers cap it near {out['results'][0]['payload_ceiling'] or 0:.1%}, staggered starts "
        "let it pass that;\nspan = every byte over first WRITE .. last ACK of any sender"
    )
    lines.append(
        f"machine: {m['cpus']} cpus, load {m['loadavg_start'][0]} -> {m['loadavg_end'][0]}; "
        f"{out['seconds']} s in all"
    )
    return "\n".join(lines)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Every run on one fabric (always removed); the JSON object."""
    n_max = max(args.senders)
    hosts = n_max + 1
    receiver = f"h{n_max}"
    spec = FabricSpec(
        name=args.name,
        planes=args.planes,
        spines=args.spines,
        leaves=hosts,  # a leaf per host: equal paths, one shared link (the receiver's)
        hosts=hosts,
        rate=args.rate,
        mtu=MTU,
        trim=True,
    )
    try:
        spec.validate()
    except UsageError as exc:
        raise UsageError(f"cannot build this fabric: {exc}") from None

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    load0 = loadavg()
    t0 = time.monotonic()
    log(
        f"fabric {args.name}: {args.planes} planes x {args.spines} spines x {hosts} leaves, "
        f"{hosts} hosts, links {args.rate}, --trim; senders {args.senders} -> {receiver}, "
        f"laws {', '.join(args.cc)}, {args.time:g} s x {args.runs} run(s); load {load0[0]:.2f}"
    )
    results: dict[tuple[str, int], list[dict[str, Any]]] = {
        (law, n): [] for n in args.senders for law in args.cc
    }
    with fabric(spec) as topo:
        share = Share(args, topo, receiver)
        warm = share.run(args.cc[0], n_max, ["--size", "1M"])  # warm-up, not reported
        if not warm["sha256_ok"]:
            raise MRCError(f"SHA-256 MISMATCH in the warm-up: {'; '.join(warm['mismatches'])}")
        for i in range(args.runs):
            for n in args.senders:
                for law in args.cc:  # interleaved: A, B, A, B ... so noise hits every law
                    r = share.run(law, n, ["--time", f"{args.time:g}"])
                    r["run"] = i + 1
                    results[law, n].append(r)
                    log(
                        f"  run {i + 1}: {law:>8} x{n}: jain {r['jain']}, "
                        f"utilization {r['utilization']:.1%} "
                        f"(span {r['utilization_span'] or 0:.1%}) "
                        f"({', '.join(f'{g / 1e6:.1f}' for g in r['goodputs_bps'])} Mbit/s), "
                        f"{r['timeouts']} timeouts, {r['retransmits']} retransmits, "
                        f"{r['fabric_trims']} trims, {r['fabric_drops']} drops, sha256 "
                        + ("ok" if r["sha256_ok"] else "MISMATCH")
                    )
    body: dict[str, Any] = {
        "config": {
            "name": args.name,
            "planes": args.planes,
            "spines": args.spines,
            "leaves": hosts,
            "hosts": hosts,
            "rate": args.rate,
            "rate_bps": parse_rate(args.rate),
            "capacity_bps": args.planes * parse_rate(args.rate),
            "mtu": MTU,
            "trim": True,
            "receiver": receiver,
            "senders": args.senders,
            "cc": args.cc,
            "time": args.time,
            "runs": args.runs,
        },
        "results": [summarize(rs) for rs in results.values()],
        "sha256_ok": all(r["sha256_ok"] for rs in results.values() for r in rs),
        "seconds": round(time.monotonic() - t0, 1),
    }
    return envelope(TOOL, machine_info(load0), body)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> int:
        if os.geteuid() != 0:
            raise MRCError("needs root (network namespaces, tc, BPF)")
        from mrc.lab.fabric.trim import unavailable_reason

        why = unavailable_reason()
        if why is not None:
            raise MRCError(f"packet trimming (mrc-fabric up --trim) unavailable here: {why}")
        if args.name in Fabric.list():
            # the fabric context manager removes its fabric however it ends: never one of yours
            raise UsageError(f"a fabric named {args.name!r} exists already; pick another --name")
        unwind_on_sigterm()  # children stopped and the fabric removed on SIGTERM too
        out = bench(args)
        print(table(out), file=sys.stderr if args.json else sys.stdout, flush=True)
        if args.json:
            emit_json(out, indent=2)
        if not out["sha256_ok"]:
            for r in out["results"]:
                for run in r["runs"]:
                    for m in run["mismatches"]:
                        print(
                            f"{PROG}: error: SHA-256 MISMATCH ({r['cc']} x{r['senders']}, "
                            f"run {run['run']}): {m}",
                            file=sys.stderr,
                        )
            return 1
        return 0

    return run_main(PROG, body, "interrupted (fabric removed)")


if __name__ == "__main__":
    sys.exit(main())
