#!/usr/bin/env python3
"""Window laws side by side in the seeded simulator: incast, fairness, all-to-all steps with and
without a failed spine link, and one flow into a bottleneck that neither trims nor marks.

Why: a congestion-control law (mrc/core/cc, docs/CONGESTION.md) is best judged on the same few
patterns as the laws it competes with, in seconds to minutes and without root, and with the
same numbers every time (mrc.lab.sim is seeded: same arguments, same table). Every QP writes a
random pattern and the receiver's buffer is hashed against it ("data ok").

Scenarios (payloads of 8192 bytes, 128 active EVs per QP and the transport's backups beside
them, --backups 0 for none as before issue 39; a host's NIC is 100 Mbit/s per plane with a
queue of 64 x 9000 bytes; links not named are ideal):

  incast7, incast15  7 (15) senders of 4 MiB (2 MiB) each into one host over 4 planes; its last
      hop, 100 (50) Mbit/s per plane, trims over a queue of 20 x 9000 bytes and marks ECN above
      10 x 9000 (half the queue). p100_over_ideal: time until the last sender's bytes are all
      acknowledged / (total bytes / last-hop capacity), >= 1 since headers take room too;
      trims per data packet; timeouts; Jain's index of the flows' goodputs (size / own time).
  fair2, fair4  2 (4) senders with endless backlogs (1 MiB writes, refilled as they complete)
      into one host through that last hop at 100 Mbit/s, for 2 s of simulated time; goodput =
      bytes placed after the first 10%. Jain's index; utilization = sum / last-hop capacity.
  alltoall, link_down  tools/sim_alltoall.py's fabric (4 hosts on 2 leaves, 2 planes x 2
      spines, all links 100 Mbit/s, 120 kB tail-drop queues; 12 QPs), 6 steps of 1 MiB per QP;
      link_down takes leaf L0's link to spine 0 of plane 0 down (both ways) in the middle of
      step 1 (the second), as the law's own clean run timed it. p100 = the slowest step.
  untold50  one QP of 48 MiB with a window cap of 512 packets (not --window) into a last hop of
      50 Mbit/s per plane with 120 kB tail-drop queues, no trimming, no ECN: a bottleneck the
      law is not told about. goodput / capacity, timeouts, retransmissions, and EVs declared
      bad (ev_bad_events: transitions to ASSUMED_BAD on both hosts; no path failed, so each
      is a false alarm).

The fabric is an SRv6 one by default, as mrc-fabric builds (each EV pinned to a spine route,
every QP told its routes: mrc.lab.sim_links); --fabric ecmp makes it a plain network whose
switches hash EVs onto spines and whose QPs know no routes (only alltoall and link_down have
more than one spine, so only they differ).

Every datagram also gets 50 us + up to 50 us of delay before the fabric; ACK settings are
QPConfig's defaults, and each QP is told its line rate (line_rate_bps: 100 Mbit/s x its
planes, what a host knows of its NICs; --no-line-rate: not told, the law as before issue 39).
--window caps each QP's packets in flight (an adaptive law's ceiling; the window itself for
fixed), the PSN window is at least 4 windows, and --qp settings apply last, to every QP of
every law (so a cc.NAME parameter fits one law only). --quick: 512 / 256 KiB
per incast sender, 0.5 s of fairness, 2 steps of 256 KiB, 4 MiB: seconds per law; the full
run of nscc,fixed takes about 100 s.

Output: a table, a row per scenario and metric, a column per law (DNF: did not finish). --json:
{"window", "qp", "seed", "quick", "scenarios", "version", "laws": {LAW: {SCENARIO: {"metrics",
"raw" (per-flow or per-step numbers and the counters), "corrupt", "wall_s"}}}}. A law that fails
a scenario (a QP gives up, or a run does not finish) is a result: data_ok says NO, a warning
goes to stderr, exit status 0. A write that completed with wrong bytes in place is a transport
bug: exit status 1.

  .venv/bin/python tools/sim_cc.py                          # nscc,fixed, every scenario
  .venv/bin/python tools/sim_cc.py --quick --scenarios incast7,fair2 --json
  .venv/bin/python tools/sim_cc.py --cc nscc,mylaw.py:Mine --qp cc.target_packets=2
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim_alltoall import FAILED, HOSTS, LEAVES

from mrc.cli.common import Parser, cc_arg, emit_json, int_at_least, run_main
from mrc.cli.qpopts import add_qp_arg, apply_settings, with_window
from mrc.core import QPConfig
from mrc.core.cc import names
from mrc.core.events import EVState, EVStateChanged, QPFailed, WriteCompleted
from mrc.core.memory import MemoryRegion
from mrc.core.qp import QueuePair
from mrc.lab.harness.stats import jain
from mrc.lab.harness.table import render
from mrc.lab.sim import Faults, SimNetwork
from mrc.lab.sim_links import Fabric, LinkSpec

PROG = "sim_cc.py"
PAYLOAD = 8192
MBIT = 1e6 / 8  # bytes/s
JUMBO = 9000
NIC_RATE = 100 * MBIT  # bytes/s, a host's NIC per plane
NIC = LinkSpec(rate=NIC_RATE, queue=64 * JUMBO)
EVS = 128
UNTOLD_CAP = 512
CHUNK = 1 << 20  # one write of a fair* backlog
KIB = 1024
Result = dict[str, Any]


@dataclass
class Run:
    """One law's settings, and its results so far (link_down reads alltoall's clean run)."""

    law: str
    window: int
    qp: list[str]
    seed: int
    quick: bool
    line_rate: bool = True  # tell each QP its NICs' rate (QPConfig.line_rate_bps)
    ecmp: bool = False  # a plain network (Fabric.ecmp) instead of SRv6 routes
    backups: int | None = None  # backup EVs per QP (None: as the transport, backup_count)
    done: dict[str, Result] = field(default_factory=dict)

    def config(self, window: int | None = None, planes: int = 1) -> QPConfig:
        cfg = with_window(QPConfig(payload_size=PAYLOAD, cc=self.law), window or self.window)
        if self.line_rate:  # what a host knows of its NICs: 100 Mbit/s a plane
            cfg.line_rate_bps = NIC_RATE * 8 * planes
        apply_settings(cfg, self.qp)
        cfg.validate()
        return cfg

    def pick(self, full: int, quick: int) -> int:
        return quick if self.quick else full


@dataclass
class Flow:
    """One QP: its sender, its receiver's buffer, and what the buffer must end up holding."""

    host: str
    qa: QueuePair
    qb: QueuePair
    buf: bytearray
    mr: MemoryRegion
    data: bytes = b""
    done: float | None = None  # when it went idle (or failed)

    def post(self, data: bytes) -> None:
        self.data, self.done = data, None
        self.qa.post_write(data, self.mr.addr, self.mr.rkey)

    def check(self) -> tuple[bool, bool]:
        """(ok: finished and every byte in place, corrupt: finished with wrong bytes)"""
        same = hashlib.sha256(self.buf).digest() == hashlib.sha256(self.data).digest()
        finished = self.done is not None and not self.qa.failed
        return finished and same, finished and not same


def pattern(salt: int, n: int) -> bytes:
    return random.Random(salt).randbytes(n)


def setup(run: Run, fab: Fabric, hosts: Sequence[str]) -> SimNetwork:
    net = SimNetwork(seed=run.seed, faults=Faults(delay=0.00005, jitter=0.00005), fabric=fab)
    for h in hosts:
        net.add_host(h)
    return net


def flows_of(
    net: SimNetwork,
    pairs: Sequence[tuple[str, str]],
    cfg: QPConfig,
    planes: int,
    size: int,
    backups: int | None,
) -> list[Flow]:
    out = []
    for n, (src, dst) in enumerate(pairs, start=1):
        qa, qb = net.connect(src, dst, EVS, cfg, n, n, planes=planes, backups=backups)
        buf = bytearray(size)
        out.append(Flow(src, qa, qb, buf, net.hosts[dst].core.pd.register(buf)))
    return out


def into_one(
    run: Run, n: int, mbit: float, size: int, window: int | None = None, **last: Any
) -> tuple[SimNetwork, Fabric, list[Flow]]:
    """``n`` senders, each on a leaf of its own, into host r over 4 planes; r's last hop is
    ``mbit`` per plane and ``last`` (the rest of its LinkSpec)."""
    fab = Fabric(nic=NIC, lasthop=LinkSpec(rate=mbit * MBIT, **last), ecmp=run.ecmp)
    names = [f"s{i}" for i in range(n)]
    net = setup(run, fab, ["r", *names])
    pairs = [(s, "r") for s in names]
    return net, fab, flows_of(net, pairs, run.config(window, 4), 4, size, run.backups)


def settle(net: SimNetwork, flows: list[Flow], limit: float) -> bool:
    """Run until every flow is idle or failed (noting when), or until ``limit``."""

    def check() -> bool:
        for f in flows:
            if f.done is None and (f.qa.idle or f.qa.failed):
                f.done = net.now
        return all(f.done is not None for f in flows)

    return net.run(check, max_time=limit)


def counters(net: SimNetwork, fab: Fabric, flows: list[Flow]) -> Result:
    stats = [f.qa.stats for f in flows]
    events = [e for h in net.hosts.values() for e in h.events]
    failures = [e.reason for e in events if isinstance(e, QPFailed)]
    bad = [e for e in events if isinstance(e, EVStateChanged) and e.new is EVState.ASSUMED_BAD]
    return {
        "timeouts": sum(s.retransmits_timeout for s in stats),
        "retransmits": sum(s.retransmits for s in stats),
        "ev_bad_events": len(bad),
        "evs_assumed_bad": sum(f.qa.evs.assumed_bad for f in flows),
        **{k: fab.total(k) for k in ("trimmed", "ecn_marked", "dropped")},
        "qps_failed": len(failures),
        "failure": failures[0] if failures else "",
    }


TRIM_ECN: dict[str, Any] = {"queue": 20 * JUMBO, "ecn": 10 * JUMBO, "trim": True}


def incast(run: Run, senders: int, mbit: float, size: int) -> Result:
    net, fab, flows = into_one(run, senders, mbit, size, **TRIM_ECN)
    for i, f in enumerate(flows):
        f.post(pattern(run.seed * 1000 + i, size))
    ideal = senders * size / (4 * mbit * MBIT)
    settle(net, flows, 30 + 50 * ideal)
    checks = [f.check() for f in flows]
    times = [f.done if ok else None for f, (ok, _bad) in zip(flows, checks, strict=True)]
    finished = [t for t in times if t is not None]
    p100 = max(finished) if len(finished) == senders else None
    goodputs = [size / t if t else 0.0 for t in times]
    c = counters(net, fab, flows)
    metrics = {
        "p100_over_ideal": p100 / ideal if p100 else None,
        "trims_per_packet": c["trimmed"] / (senders * -(-size // PAYLOAD)),
        "timeouts": c["timeouts"],
        "jain": jain(goodputs) or 0.0,
        "data_ok": p100 is not None,
    }
    raw = {"ideal_s": ideal, "p100_s": p100, "flow_done_s": times, "flow_goodput_Bps": goodputs}
    return {"metrics": metrics, "raw": {**raw, **c}, "corrupt": sum(b for _ok, b in checks)}


@dataclass
class Backlog:
    """An endless backlog on one flow: ``depth`` writes of CHUNK bytes in flight, each into a
    slot of the receiver's buffer; a completed one is checked and the next goes to its slot."""

    net: SimNetwork
    flow: Flow
    patterns: list[bytes]  # one more than there are slots: a slot's next write differs
    digests: list[bytes]
    wrs: dict[int, tuple[int, int]] = field(default_factory=dict)  # wr_id -> slot, pattern
    posted: int = 0
    seen: int = 0  # host events read so far
    good: int = 0
    bad: int = 0

    def post(self, slot: int) -> None:
        k, f = self.posted % len(self.patterns), self.flow
        self.wrs[f.qa.post_write(self.patterns[k], f.mr.addr + slot * CHUNK, f.mr.rkey)] = (slot, k)
        self.posted += 1

    def poll(self) -> None:
        f, host = self.flow, self.net.hosts[self.flow.host]
        for e in host.events[self.seen :]:
            if isinstance(e, WriteCompleted) and e.qpn == f.qa.qpn:
                slot, k = self.wrs.pop(e.wr_id)
                got = hashlib.sha256(f.buf[slot * CHUNK : (slot + 1) * CHUNK]).digest()
                self.good += got == self.digests[k]
                self.bad += got != self.digests[k]
                self.post(slot)
                self.net.pump(host, f.qa)
        self.seen = len(host.events)


def fair(run: Run, n: int) -> Result:
    seconds = 0.5 if run.quick else 2.0
    depth = max(3, -(-2 * run.config().max_outstanding * PAYLOAD // CHUNK))  # > 2 windows
    net, fab, flows = into_one(run, n, 100, depth * CHUNK, **TRIM_ECN)
    patterns = [pattern(run.seed * 1000 + k, CHUNK) for k in range(depth + 1)]
    digests = [hashlib.sha256(p).digest() for p in patterns]
    backlogs = [Backlog(net, f, patterns, digests) for f in flows]
    for b in backlogs:
        for slot in range(depth):
            b.post(slot)
    placed: list[list[int]] = []  # bytes placed per flow at 10% and at the end
    for t in (0.1 * seconds, seconds):
        net._at(t, lambda: placed.append([f.qb.stats.bytes_placed for f in flows]))

    def tick() -> bool:
        for b in backlogs:
            b.poll()
        return len(placed) == 2

    net.run(tick, max_time=seconds + 1)
    goodputs = [(b - a) / (0.9 * seconds) for a, b in zip(*placed, strict=True)]
    bad = sum(b.bad for b in backlogs)
    c = counters(net, fab, flows)
    metrics = {
        "jain": jain(goodputs) or 0.0,
        "utilization": sum(goodputs) / (4 * 100 * MBIT),
        "timeouts": c["timeouts"],
        "data_ok": bad == 0 and not c["qps_failed"],
    }
    raw = {"seconds": seconds, "flow_goodput_Bps": goodputs}
    raw["writes_checked"] = [b.good + b.bad for b in backlogs]
    return {"metrics": metrics, "raw": {**raw, **c}, "corrupt": bad}


def alltoall(run: Run, fail_at: float | None = None) -> Result:
    steps, size = run.pick(6, 2), run.pick(1 << 20, 256 * KIB)
    spec = LinkSpec(rate=100 * MBIT, queue=120_000)
    leaves = dict(LEAVES)
    fab = Fabric(nic=NIC, up=spec, down=spec, lasthop=spec, spines=2, leaves=leaves, ecmp=run.ecmp)
    net = setup(run, fab, HOSTS)
    pairs = list(itertools.permutations(HOSTS, 2))
    flows = flows_of(net, pairs, run.config(None, 2), 2, size, run.backups)

    def fail() -> None:
        for name in FAILED:
            fab.link(name).down = True

    if fail_at is not None:
        net._at(fail_at, fail)
    starts: list[float] = []
    times: list[float] = []
    corrupt = 0
    for step in range(steps):
        for i, f in enumerate(flows):
            f.post(pattern((run.seed * 100 + step) * 100 + i, size))
        starts.append(net.now)
        finished = settle(net, flows, net.now + 60)
        checks = [f.check() for f in flows]
        corrupt += sum(bad for _ok, bad in checks)
        if not finished or not all(ok for ok, _bad in checks):
            break
        times.append(net.now - starts[-1])
    p100 = max(times) if len(times) == steps else None
    metrics: Result = {
        "p100_ms": p100 * 1000 if p100 else None,
        "median_ms": statistics.median(times) * 1000 if times else None,
    }
    if fail_at is not None:
        clean = run.done["alltoall"]["raw"]["p100_s"]
        metrics["p100_vs_alltoall"] = p100 / clean if p100 and clean else None
    c = counters(net, fab, flows)
    metrics.update(timeouts=c["timeouts"], data_ok=p100 is not None)
    raw = {"p100_s": p100, "step_start_s": starts, "steps_s": times, "fail_at_s": fail_at}
    return {"metrics": metrics, "raw": {**raw, **c}, "corrupt": corrupt}


def link_down(run: Run) -> Result:
    if "alltoall" not in run.done:
        run.done["alltoall"] = alltoall(run)
    raw = run.done["alltoall"]["raw"]
    if len(raw["steps_s"]) < 2:  # the clean run failed: fail at a fixed time instead
        return alltoall(run, 0.1)
    return alltoall(run, raw["step_start_s"][1] + raw["steps_s"][1] / 2)


def untold(run: Run) -> Result:
    size, mbit = run.pick(48 << 20, 4 << 20), 50
    net, fab, flows = into_one(run, 1, mbit, size, UNTOLD_CAP, queue=120_000)
    (f,) = flows
    f.post(pattern(run.seed, size))
    capacity = 4 * mbit * MBIT
    settle(net, flows, 30 + 50 * size / capacity)
    ok, bad = f.check()
    c = counters(net, fab, flows)
    metrics = {"goodput_over_capacity": size / f.done / capacity if ok and f.done else None}
    metrics.update({k: c[k] for k in ("timeouts", "retransmits", "ev_bad_events")})
    metrics.update(evs_assumed_bad=c["evs_assumed_bad"], data_ok=ok)
    return {"metrics": metrics, "raw": {"done_s": f.done, **c}, "corrupt": int(bad)}


SCENARIOS: dict[str, Callable[[Run], Result]] = {
    "incast7": lambda r: incast(r, 7, 100, r.pick(4 << 20, 512 * KIB)),
    "incast15": lambda r: incast(r, 15, 50, r.pick(2 << 20, 256 * KIB)),
    "fair2": lambda r: fair(r, 2),
    "fair4": lambda r: fair(r, 4),
    "alltoall": alltoall,
    "link_down": link_down,
    "untold50": untold,
}


def cell(v: object) -> str:
    if v is None or isinstance(v, bool):
        return {None: "DNF", True: "yes", False: "NO"}[v]
    return (f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}") if isinstance(v, float) else str(v)


def table(results: dict[str, dict[str, Result]], scenarios: list[str]) -> str:
    laws = list(results)
    rows = [["scenario", "metric", *laws]]
    for s in scenarios:
        for m in results[laws[0]][s]["metrics"]:
            rows.append([s, m, *(cell(results[law][s]["metrics"][m]) for law in laws)])
    return render(rows, "<<>")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add(
        "--cc",
        default="nscc,fixed",
        help=f"laws to compare, comma-separated (nscc,fixed): "
        f"{', '.join(names())} or MODULE:CLASS, a law in a module or .py file (docs/CONGESTION.md)",
    )
    add("--window", type=int_at_least(1), default=64, help="packets in flight per QP (64)")
    add("--scenarios", default=",".join(SCENARIOS), help="comma-separated (default: all)")
    add("--quick", action="store_true", help="much smaller sizes: a smoke test")
    add("--seed", type=int, default=1, help="simulator seed (1)")
    add(
        "--line-rate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="tell each QP its NICs' rate, QPConfig.line_rate_bps (default: yes)",
    )
    add(
        "--fabric",
        choices=("srv6", "ecmp"),
        default="srv6",
        help="srv6: EVs pinned to spine routes, as on mrc-fabric (default); ecmp: hashed",
    )
    add(
        "--backups",
        type=int_at_least(0),
        help="backup EVs per QP beside the active ones (default: as many as the transport opens, "
        "mrc.evlayout.backup_count; 0: none, the simulator before issue 39)",
    )
    add("--json", action="store_true", help="one JSON object on stdout instead of the table")
    add_qp_arg(p, ", to every QP of every law, after --window")
    args = p.parse_args(argv)
    laws = [c.strip() for c in args.cc.split(",") if c.strip()]
    if not laws or len(set(laws)) < len(laws):
        p.error(f"bad --cc {args.cc!r}: want distinct laws, comma-separated")
    try:  # a column per law as given; a law file's path made absolute for QPConfig
        args.laws = {c: cc_arg(c) for c in laws}
    except argparse.ArgumentTypeError as exc:
        p.error(f"bad --cc: {exc}")
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if not chosen or not set(chosen) <= set(SCENARIOS):
        p.error(f"bad --scenarios {args.scenarios!r}: choose from {', '.join(SCENARIOS)}")
    args.scenarios = list(dict.fromkeys(chosen))
    for law in args.laws.values():
        try:
            for window in (None, UNTOLD_CAP):
                Run(law, args.window, args.qp, args.seed, args.quick).config(window)
        except (ValueError, TypeError) as exc:
            p.error(f"--qp with --cc {law}: {exc}")
    return args


def body(args: argparse.Namespace) -> int:
    results: dict[str, dict[str, Result]] = {}
    corrupt = 0
    for law, spec in args.laws.items():
        ecmp = args.fabric == "ecmp"
        run = Run(
            spec, args.window, args.qp, args.seed, args.quick, args.line_rate, ecmp, args.backups
        )
        for name in args.scenarios:
            t0 = time.monotonic()
            out = run.done[name] = SCENARIOS[name](run)
            out["wall_s"] = round(time.monotonic() - t0, 2)
            corrupt += out["corrupt"]
            if not out["metrics"]["data_ok"]:
                why = out["raw"]["failure"] or ("wrong bytes" if out["corrupt"] else "unfinished")
                print(f"{PROG}: warning: {law} {name}: data NOT ok ({why})", file=sys.stderr)
            elif sys.stderr.isatty():
                print(f"{PROG}: {law} {name}: {out['wall_s']} s", file=sys.stderr)
        results[law] = {name: run.done[name] for name in args.scenarios}
    if args.json:
        keys = ("window", "qp", "seed", "quick", "line_rate", "fabric", "backups", "scenarios")
        settings = {k: getattr(args, k) for k in keys}
        emit_json({**settings, "laws": results})
    else:
        print(table(results, args.scenarios))
    if corrupt:
        print(f"{PROG}: error: {corrupt} completed writes left wrong bytes", file=sys.stderr)
    return 1 if corrupt else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main(PROG, lambda: body(args))


if __name__ == "__main__":
    sys.exit(main())
