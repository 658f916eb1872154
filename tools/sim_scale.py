#!/usr/bin/env python3
"""How far the seeded simulator scales: one step of a workload on H hosts, timed.

Hosts sit 16 to a leaf on a fabric of ``--planes`` planes with ``--spines`` spines each
(``mrc.lab.sim_links.Fabric``: per-link rate and queue; SRv6, each EV pinned to a spine's route
as on mrc-fabric, or with ``--fabric ecmp`` hashed onto one); every QP is a real ``QueuePair``
pair of the core, as in the tests. Workloads:

* ``ring``: host i writes ``--size`` bytes to host i+1 (H QPs): what grows with the hosts
  alone;
* ``alltoall``: every host writes to every other (H x (H-1) QPs): what mrc-bench's all-to-all
  asks of the simulator, which grows with the square of the hosts.

For each size it prints the simulated time of the step, the wall time, the events the
simulator processed (one per link hop, delivery and timer) and their rate, and the wall
seconds per simulated second; JSON on stdout with ``--json``, a table otherwise. A size whose
QPs would exceed ``--max-qps`` is reported as skipped, with the QPs it would need.

    .venv/bin/python tools/sim_scale.py --hosts 64,512,4096 --workload ring
    .venv/bin/python tools/sim_scale.py --hosts 16,64 --workload alltoall
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from mrc.cli.common import emit_json
from mrc.core import QPConfig, QueuePair
from mrc.core.events import Event, WriteCompleted
from mrc.evlayout import backup_count, ev_slot
from mrc.lab.sim import Faults, SimNetwork
from mrc.lab.sim_links import Fabric, LinkSpec

HOSTS_PER_LEAF = 16
#: source ports the simulator hands out, each to one route of one QP in the whole simulation
#: (from 1024), so that an EV names its host
PORTS = 65536 - 1024


def ports_per_qp(args: argparse.Namespace) -> int:
    """Source ports one QP takes: one per route and plane its EVs use, as the transport's
    sockets (a route per spine on SRv6, one per plane with ECMP); EVs differ in flow label."""
    routes = [1 if args.fabric == "ecmp" else args.spines] * args.planes
    return len({ev_slot(i, routes) for i in range(args.evs + backups_of(args))})


def backups_of(args: argparse.Namespace) -> int:
    """Backup EVs per QP: ``--backups``, else as many as the transport opens."""
    return backup_count(args.evs, args.planes) if args.backups is None else int(args.backups)


def _pairs(workload: str, hosts: int) -> list[tuple[int, int]]:
    if workload == "ring":
        return [(i, (i + 1) % hosts) for i in range(hosts)]
    return [(i, j) for i in range(hosts) for j in range(hosts) if i != j]


def qps_needed(workload: str, hosts: int) -> int:
    return hosts if workload == "ring" else hosts * (hosts - 1)


def _count_completions(qp: QueuePair, remaining: list[int]) -> None:
    """Count ``qp``'s WriteCompleted events down in ``remaining`` as the simulator takes
    them: a check per event that costs nothing however many QPs there are."""
    take = qp.next_event

    def next_event() -> Event | None:
        event = take()
        if isinstance(event, WriteCompleted):
            remaining[0] -= 1
        return event

    qp.next_event = next_event  # type: ignore[method-assign]


def run_one(args: argparse.Namespace, hosts: int) -> dict[str, object]:
    """One step of the workload on ``hosts`` hosts: its figures."""
    spec = LinkSpec(rate=args.rate / 8, queue=args.queue)
    names = [f"h{i}" for i in range(hosts)]
    leaves = {name: f"L{i // HOSTS_PER_LEAF}" for i, name in enumerate(names)}
    ecmp = args.fabric == "ecmp"
    fab = Fabric(
        nic=spec, up=spec, down=spec, lasthop=spec, spines=args.spines, leaves=leaves, ecmp=ecmp
    )
    net = SimNetwork(seed=args.seed, faults=Faults(delay=0.00005, jitter=0.00001), fabric=fab)
    t0 = time.perf_counter()
    for name in names:
        net.add_host(name)
    cfg = QPConfig(payload_size=8192, max_outstanding=args.window, psn_window=16384)
    writes = []
    for n, (i, j) in enumerate(_pairs(args.workload, hosts), start=1):
        qa, qb = net.connect(
            names[i],
            names[j],
            evs=args.evs,
            config=cfg,
            planes=args.planes,
            qpn_a=n,
            qpn_b=n,
            backups=backups_of(args),
        )
        writes.append((qa, net.hosts[names[j]].core.pd.register(bytearray(args.size))))
    built = time.perf_counter() - t0
    payload = bytes(args.size)
    remaining = [len(writes)]
    for qa, region in writes:
        qa.post_write(payload, region.addr, region.rkey)
        _count_completions(qa, remaining)
    events_before = net._n
    t1 = time.perf_counter()
    net.run(lambda: remaining[0] == 0, max_time=args.max_sim)
    wall = time.perf_counter() - t1
    events = net._n - events_before
    done = sum(1 for qa, _r in writes if qa.idle)
    sim = net.now
    return {
        "hosts": hosts,
        "qps": len(writes),
        "complete": done == len(writes),
        "simulated_s": round(sim, 6),
        "wall_s": round(wall, 3),
        "setup_s": round(built, 3),
        "events": events,
        "events_per_s": round(events / wall) if wall > 0 else None,
        "wall_per_simulated_s": round(wall / sim, 1) if sim > 0 else None,
        "packets": sum(qa.stats.packets_sent for qa, _r in writes),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="64,512,4096", help="comma-separated host counts")
    p.add_argument("--workload", choices=("ring", "alltoall"), default="ring")
    p.add_argument("--size", type=int, default=256 << 10, help="bytes per QP (256 KiB)")
    p.add_argument("--planes", type=int, default=4)
    p.add_argument("--spines", type=int, default=4, help="spines per plane")
    p.add_argument("--evs", type=int, default=16, help="active EVs per QP")
    p.add_argument(
        "--backups",
        type=int,
        help="backup EVs per QP beside the active ones (default: as many as the transport opens, "
        "mrc.evlayout.backup_count; 0: none, the simulator before issue 39)",
    )
    p.add_argument("--window", type=int, default=64, help="packets in flight per QP at most")
    p.add_argument("--rate", type=float, default=100e9, help="bits/s of every link (100 Gbit/s)")
    p.add_argument("--queue", type=int, default=1 << 20, help="bytes of every link's queue")
    p.add_argument("--max-qps", type=int, default=20_000, help="skip sizes needing more QPs")
    p.add_argument("--max-sim", type=float, default=10.0, help="simulated seconds at most")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--fabric",
        choices=("srv6", "ecmp"),
        default="srv6",
        help="srv6: EVs pinned to spine routes, as on mrc-fabric (default); ecmp: hashed",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        sizes = [int(x) for x in args.hosts.split(",") if x.strip()]
    except ValueError:
        p.error(f"--hosts {args.hosts!r}: give host counts such as 64,512,4096")
    if not sizes or min(sizes) < 2:
        p.error("--hosts: at least 2 hosts each")
    results: list[dict[str, object]] = []
    for hosts in sizes:
        need = qps_needed(args.workload, hosts)
        if need > args.max_qps:
            skipped = f"more than {args.max_qps} QPs"
            results.append({"hosts": hosts, "qps": need, "skipped": skipped})
        elif 2 * need * ports_per_qp(args) > PORTS:
            # a source port per route of each QP, unique in the whole simulation
            ports = 2 * need * ports_per_qp(args)
            why = f"{ports} source ports: the simulator has {PORTS} in all"
            results.append({"hosts": hosts, "qps": need, "skipped": f"{why} (fewer --evs)"})
        else:
            results.append(run_one(args, hosts))
        if not args.json:
            r = results[-1]
            if "skipped" in r:
                print(f"{hosts:>6} hosts  {need:>9} QPs  skipped: {r['skipped']}", file=sys.stderr)
            else:
                print(
                    f"{hosts:>6} hosts  {r['qps']:>9} QPs  simulated {r['simulated_s']:.4f} s  "
                    f"wall {r['wall_s']:.1f} s (+{r['setup_s']:.1f} s set-up)  "
                    f"{r['events']} events, {r['events_per_s']}/s  "
                    f"{r['wall_per_simulated_s']} wall s per simulated s  "
                    f"{r['peak_rss_mb']} MB  complete {r['complete']}",
                    file=sys.stderr,
                )
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "json"}
        emit_json({"tool": "sim_scale", "config": config, "results": results}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
