"""bench_share: how fairly window laws share one host's last hop, N timed QPs from N hosts into one.

One trimming fabric (planes x spines, a leaf per host, every link shaped to one rate, MTU 9000)
is built for the whole benchmark, with max(senders) + 1 hosts: every path is leaf - spine -
leaf, all of the same length, and the only link the senders share is the last host's last hop.
For every run, every sender count N and every law: ``mrc-recv --count N --discard`` in the last
host, and h0 .. h(N-1) each ``mrc-send --time`` into it at once; the laws alternate run by run,
so machine noise hits all. Reported per law and sender count, medians over the runs: Jain's
index of the senders' goodputs, utilization of the last hop, timeouts and retransmits, the
fabric's trims and drops, and whether every byte arrived (the end-to-end checksum's digests;
the key saying so is still ``sha256_ok``).

tools/bench_share.py parses the arguments (its --help says what each figure means) and calls
:func:`main`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mrc.cli.common import emit_json
from mrc.errors import MRCError, UsageError
from mrc.lab.bench.fabric import MRC_OVERHEAD
from mrc.lab.fabric import Fabric, FabricSpec, Topology
from mrc.lab.harness.children import Child, Children, exit_times
from mrc.lab.harness.envelope import envelope
from mrc.lab.harness.fabric import fabric, port_counters, port_deltas, unwind_on_sigterm
from mrc.lab.harness.hosts import in_host, tool_path, wait_listening
from mrc.lab.harness.machine import loadavg, machine_info, machine_line
from mrc.lab.harness.stats import jain, medians, rounded
from mrc.lab.harness.table import render
from mrc.units import parse_rate
from mrc.wire import DEFAULT_PORT

PROG = "bench_share.py"
TOOL = "bench_share"
PORT = DEFAULT_PORT
MTU = 9000
#: seconds a run may take beyond --time (process start-up, the last round's verification)
SLACK = 60.0
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
    "checksum",
    "digest",
    "digest_receiver",
    "error",
)


# ---- one run ------------------------------------------------------------------------------------


def window_of(law: str, args: argparse.Namespace) -> int | None:
    """The --window every sender gets under ``law``: None leaves mrc-send's own."""
    if args.window is not None:
        return int(args.window)
    return max(8, 4 * args.planes) if law == "fixed" else None


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
        --size S); the run's figures, per-sender values and the verdict of the end-to-end
        checksums. MRCError if a sender or the receiver fails other than by a mismatch."""
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
            before = port_counters(topo)
            procs = {
                h: kids.start(in_host(topo, h, self._argv("mrc-send", *send_opts)), f"mrc-send@{h}")
                for h in senders
            }
            exits = exit_times(procs, limit)
            late = next((h for h in procs if h not in exits), None)
            if late is not None:
                raise MRCError(
                    f"{law} x{n}: mrc-send in {late} did not finish in {limit:g} s; "
                    f"stderr: {procs[late].err_tail(5)}"
                )
            recv.finished(30)
            after = port_counters(topo)
        return self._result(law, n, window, procs, exits, recv, port_deltas(before, after))

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
        recvs = {addr_of.get(r.get("from", ""), "?"): r for r in recv.results()}
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
            s["receiver_digest"] = rj.get("digest") if rj else None
            # as tests/fabric/test_fairness.py: the sender's digest (under the checksum the
            # two agreed on) equals the one the receiver sent back; and the receiver's own line
            # for this sender agrees, digest and bytes
            hashes = {s["digest"], s["digest_receiver"], s["receiver_digest"]}
            s["sha256_ok"] = len(hashes) == 1 and None not in hashes
            if s["digest"] is not None and len(hashes - {None}) > 1:
                s["sha256_ok"] = False
                mismatches.append(
                    f"{h}: sender {s['checksum']} {s['digest']}, receiver (to the sender) "
                    f"{s['digest_receiver']}, receiver (its own line) {s['receiver_digest']}"
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
        # when each sender sent, on one clock: it exited (seen within exit_times' poll) its
        # ``seconds`` after its first WRITE, give or take its own exit, which is alike for all
        seconds = {h: float(per[h]["seconds"] or 0) for h in procs}
        first = min(exits[h] - seconds[h] for h in procs)
        span = max(exits.values()) - first
        overlap = min(exits.values()) - max(exits[h] - seconds[h] for h in procs)
        sent = sum(int(per[h]["bytes"] or 0) for h in procs)
        return {
            "cc": law,
            "senders": n,
            "window": window,
            "jain": rounded(jain(goodputs), 4),
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
    """The runs of one law and sender count: the medians of MEDIAN_KEYS, every run kept."""
    first = runs[0]
    return {
        "cc": first["cc"],
        "senders": first["senders"],
        "window": first["window"],
        **medians(runs, MEDIAN_KEYS, 4),
        "payload_ceiling": first["payload_ceiling"],
        "sha256_ok": all(r["sha256_ok"] for r in runs),
        "runs": runs,
    }


#: the table's columns: law, senders, jain, ..., drops, and the digests' verdict as it is
COLUMN_WIDTHS = (10, 8, 8, 13, 7, 14, 10, 9, 9, 8, 0)


def table(out: Mapping[str, Any]) -> str:
    """The human table: a row per law and sender count, what the columns mean, the machine."""
    c = out["config"]
    head = ["law", "senders", "jain", "utilization", "span", "goodput", "timeouts", "retrans"]
    head += ["trims", "drops", "digests"]
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
    lines.append(
        f"utilization = sum of goodputs / {c['capacity_bps'] / 1e6:.0f} Mbit/s (planes x rate); "
        f"headers cap it near {out['results'][0]['payload_ceiling'] or 0:.1%}, staggered starts "
        "let it pass that;\nspan = every byte over first WRITE .. last ACK of any sender"
    )
    lines.append(machine_line(out["machine"], out["seconds"]))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
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
            raise MRCError(f"digest MISMATCH in the warm-up: {'; '.join(warm['mismatches'])}")
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
                        f"{r['fabric_trims']} trims, {r['fabric_drops']} drops, digests "
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


def main(args: argparse.Namespace) -> int:
    """Run the benchmark as ``args`` (tools/bench_share.py's arguments) says: the table on
    stdout, or with ``--json`` on stderr and the JSON on stdout; 1 on a digest mismatch."""
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
    out = run(args)
    print(table(out), file=sys.stderr if args.json else sys.stdout, flush=True)
    if args.json:
        emit_json(out, indent=2)
    if not out["sha256_ok"]:
        for r in out["results"]:
            for one in r["runs"]:
                for m in one["mismatches"]:
                    print(
                        f"{PROG}: error: digest MISMATCH ({r['cc']} x{r['senders']}, "
                        f"run {one['run']}): {m}",
                        file=sys.stderr,
                    )
        return 1
    return 0
