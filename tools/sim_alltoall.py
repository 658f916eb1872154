#!/usr/bin/env python3
"""All-to-all steps in the simulator, with a spine link of plane 0 going down: a quick,
deterministic way to compare congestion controls (and their parameters) on the pattern of
mrc-bench's ``link_down`` condition (docs/CONGESTION.md).

Four hosts on two leaves (a, b | c, d), 2 planes x 2 spines, every link shaped to ``--rate``
with a tail-drop queue of ``--queue`` bytes; every host writes ``--size`` bytes to each of the
other three per step (12 QPs, kept for the whole run). At ``--fail-at`` seconds the link between
leaf L0 and spine 0 of plane 0 goes down in both directions (``--heal-at`` brings it back).
The fabric is SRv6, as mrc-fabric builds it: each EV pinned to one spine's route (hosts on one
leaf too: the spine hairpins), every QP told its routes; ``--fabric ecmp``: a plain network,
spines picked by a hash of the EV, QPs told no routes, hosts on one leaf talking through it.

    .venv/bin/python tools/sim_alltoall.py --cc fixed --window 4
    .venv/bin/python tools/sim_alltoall.py --cc nscc --window 64 --qp cc.target_rtt_fraction=0.5
    .venv/bin/python tools/sim_alltoall.py --cc nscc --fail-at 99        # no failure

Every QP has 128 active EVs and, by default, the backups the transport opens beside them
(``--backups 0``: none, as the simulator had before issue 39, for comparison).

Prints one line: every step's time (ms), the senders' timeouts, tail loss probes and
retransmissions, EVs retired (and of those, proved false later), ACKs refused as not answering
a copy sent, duplicates received and ACK EVs retired for "ACK lost". Same arguments, same
output: the simulator is seeded.
"""

from __future__ import annotations

import argparse
import itertools
import sys

from mrc.cli.common import cc_arg, int_at_least
from mrc.cli.qpopts import add_qp_arg, apply_settings
from mrc.core import QPConfig
from mrc.core.cc import names
from mrc.core.events import EVReason, EVStateChanged
from mrc.lab.sim import Faults, SimNetwork
from mrc.lab.sim_links import Fabric, LinkSpec

HOSTS = ("a", "b", "c", "d")
LEAVES = {"a": "L0", "b": "L0", "c": "L1", "d": "L1"}
FAILED = ("up:L0/p0/s0", "down:L0/p0/s0")


def run(args: argparse.Namespace) -> dict[str, object]:
    """One run: ``steps_ms`` (every step's time) and the senders' summed counters."""
    spec = LinkSpec(rate=args.rate / 8, queue=args.queue)
    # a host's own NIC queue is deeper, as on the netns fabric (HOST_QUEUE_FRAMES of 9000 bytes)
    nic = LinkSpec(rate=args.rate / 8, queue=max(args.queue, 64 * 9000))
    leaves = dict(LEAVES)
    ecmp = args.fabric == "ecmp"
    fab = Fabric(nic=nic, up=spec, down=spec, lasthop=spec, spines=2, leaves=leaves, ecmp=ecmp)
    net = SimNetwork(seed=args.seed, faults=Faults(delay=0.00005, jitter=0.00005), fabric=fab)
    for h in HOSTS:
        net.add_host(h)
    qps = []
    receivers = []
    for n, (src, dst) in enumerate(itertools.permutations(HOSTS, 2), start=1):
        cfg = QPConfig(payload_size=8192, max_outstanding=args.window, psn_window=16384, cc=args.cc)
        if args.line_rate:  # what a host knows of its NICs: --rate a plane
            cfg.line_rate_bps = args.rate * 2
        apply_settings(cfg, args.qp)
        qa, qb = net.connect(
            src, dst, 128, cfg, qpn_a=n, qpn_b=100 + n, planes=2, backups=args.backups
        )
        region = net.hosts[dst].core.pd.register(bytearray(args.size))
        qps.append((qa, region))
        receivers.append(qb)

    def set_failed(down: bool) -> None:
        for name in FAILED:
            fab.link(name).down = down

    net._at(args.fail_at, lambda: set_failed(True))
    if args.heal_at is not None:
        net._at(args.heal_at, lambda: set_failed(False))
    steps: list[float] = []
    payload = bytes(args.size)
    for _ in range(args.steps):
        t0 = net.now
        for qa, region in qps:
            qa.post_write(payload, region.addr, region.rkey)
        if not net.run(lambda: all(qa.idle for qa, _r in qps), max_time=net.now + 60):
            raise RuntimeError("a step did not finish within 60 s of simulated time")
        steps.append((net.now - t0) * 1000)
    stats = [qa.stats for qa, _r in qps]
    return {
        "steps_ms": steps,
        "timeouts": sum(s.retransmits_timeout for s in stats),
        "tlp": sum(s.retransmits_tlp for s in stats),
        "retransmits": sum(s.retransmits for s in stats),
        "evs_assumed_bad": sum(qa.evs.assumed_bad for qa, _r in qps),
        # of those, how many were later proved false (their route or probe delivered)
        "evs_assumed_bad_false": sum(qa.evs.assumed_bad_false for qa, _r in qps),
        "acks_refused": sum(s.dropped_by_reason["ack_wrong_ev"] for s in stats),
        "duplicates": sum(qb.stats.duplicates for qb in receivers),
        "acks_lost": sum(1 for host in net.hosts.values() for e in host.events if _ack_lost(e)),
        "reverse_probes_lost": sum(
            1 for host in net.hosts.values() for e in host.events if _reverse_probe_lost(e)
        ),
        "route_down_transitions": sum(
            1 for host in net.hosts.values() for e in host.events if _route_down(e)
        ),
    }


def _route_down(event: object) -> bool:
    return isinstance(event, EVStateChanged) and event.reason is EVReason.ROUTE_DOWN


def _ack_lost(event: object) -> bool:
    return isinstance(event, EVStateChanged) and event.reason is EVReason.ACK_LOST


def _reverse_probe_lost(event: object) -> bool:
    return isinstance(event, EVStateChanged) and event.reason is EVReason.REVERSE_PROBE


def line(args: argparse.Namespace, out: dict[str, object]) -> str:
    steps = " ".join(f"{t:.0f}" for t in out["steps_ms"])  # type: ignore[attr-defined]
    counts = " ".join(f"{k} {v}" for k, v in out.items() if k != "steps_ms")
    return f"{args.cc} window {args.window} {' '.join(args.qp)} steps(ms) {steps} {counts}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cc", type=cc_arg, default="nscc", help=f"window law: {', '.join(names())}")
    p.add_argument("--window", type=int, default=64, help="packets in flight per QP at most")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--size", type=int, default=1 << 20, help="bytes per QP per step")
    p.add_argument("--rate", type=float, default=100e6, help="bits/s of every link")
    p.add_argument("--queue", type=int, default=120_000, help="bytes of every link's queue")
    p.add_argument("--fail-at", type=float, default=0.25)
    p.add_argument("--heal-at", type=float)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--backups",
        type=int_at_least(0),
        help="backup EVs per QP beside the active ones (default: as many as the transport opens, "
        "mrc.evlayout.backup_count; 0: none, the simulator before issue 39)",
    )
    p.add_argument(
        "--fabric",
        choices=("srv6", "ecmp"),
        default="srv6",
        help="srv6: EVs pinned to spine routes, as on mrc-fabric (default); ecmp: hashed",
    )
    p.add_argument(
        "--line-rate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="tell each QP its NICs' rate, QPConfig.line_rate_bps (default: yes)",
    )
    add_qp_arg(p, ", after --cc and --window")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        print(line(args, run(args)))
    except (ValueError, TypeError, RuntimeError) as exc:  # a QPConfig that does not validate
        print(f"sim_alltoall.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
