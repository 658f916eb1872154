"""mrc-host-setup: the one step of a real uSID fabric that needs root, done once per host.

A real fabric whose routers take uSID containers (``"srv6": "usid"`` in its file,
docs/FABRIC.md) needs each host's kernel to put every datagram inside an outer IPv6 header
addressed to its path's container. The routes that do it, one table per spine chosen by the
socket's source port, are installed here (mrc.srv6.hostroutes); mrc-send and mrc-recv then
only bind ports, so they run as any user.
"""

from __future__ import annotations

import argparse
import errno
import os

from mrc.cli.common import JsonAnswer, Parser, run_main
from mrc.errors import MRCError, UsageError
from mrc.srv6 import hostroutes
from mrc.srv6.evroutes import is_local_address, local_fabric_hosts
from mrc.srv6.rtnl import Rule
from mrc.topology.model import Host
from mrc.topology.realfile import UsidTopology, load_fabric

PROG = "mrc-host-setup"

#: CAP_NET_ADMIN's bit in /proc/self/status CapEff (linux/capability.h)
CAP_NET_ADMIN = 12


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Set up this host of a real uSID fabric once, as root, so that mrc-send "
        "and mrc-recv can use the fabric as any user. For each of the host's NICs it routes the "
        "plane's containers (they start with the NIC's leaf) out of that NIC and decapsulates "
        "what ends with the NIC's own micro-SID; per spine index s it fills table TABLE+s with "
        "one encapsulating route per other host (seg6 encap.red to the path's container: no "
        "routing header) and adds a rule sending UDP sockets bound to that spine's source ports "
        "into it. mrc binds its sockets to those ports, so the port picks the spine. Running it "
        "again changes nothing; --remove takes it all away. Everything comes from the fabric "
        "file (usid.block, .mtu, .ports, .table, .priority; docs/FABRIC.md, 'Real uSID "
        "fabrics').",
        epilog="Check what it did with: ip -6 rule; ip -6 route show table TABLE. "
        "Exit status: 0 done, 1 not possible here (not root, no such interface, the kernel "
        "refused), 2 a bad file or argument.",
    )
    p.add_argument(
        "--fabric",
        required=True,
        metavar="FILE",
        help='the real-fabric file, with "srv6": "usid" (the same file mrc-send and mrc-recv read)',
    )
    p.add_argument(
        "--host",
        metavar="NAME",
        help="which host of the file this is (default: the one whose plane addresses are "
        "configured here)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the ip commands that are equivalent to what it would do, and change "
        "nothing (no root needed)",
    )
    p.add_argument(
        "--remove",
        action="store_true",
        help="remove the rules and routes instead (what is already gone is skipped)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: ok, fabric, file, host, action, dry_run and the ip "
        "commands (docs/schemas/mrc-host-setup.schema.json); on failure ok false and the error",
    )
    return p


def _fabric(path: str) -> UsidTopology:
    topo = load_fabric(path if "/" in path or path.endswith(".json") else f"./{path}")
    if not isinstance(topo, UsidTopology):
        raise UsageError(
            f'fabric file {path}: not a uSID fabric (\'"srv6": "usid"\'): an SRH fabric\'s '
            "hosts need no set-up, and mrc-fabric sets up its own"
        )
    return topo


def _host(topo: UsidTopology, name: str | None) -> Host:
    known = ", ".join(h.name for h in topo.hosts)
    if name is not None:
        for host in topo.hosts:
            if host.name == name:
                return host
        raise UsageError(f"--host {name}: no such host in fabric {topo.name!r} ({known})")
    hosts = local_fabric_hosts(topo)
    if len(hosts) != 1:
        which = "several hosts" if hosts else "no host"
        raise UsageError(
            f"{which} of fabric {topo.name!r} ha{'ve' if hosts else 's'} addresses here: say "
            f"which this is with --host NAME ({known})"
        )
    return hosts[0]


def _may_change_routes() -> bool:
    """Whether this process holds CAP_NET_ADMIN (root has it; so may a capable user)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def _check_host(topo: UsidTopology, host: Host, remove: bool) -> None:
    """What must hold before anything changes: the NICs exist (with room for the fabric's
    MTU), and when setting up, the host's addresses are this machine's (a wrong --host would
    route another host's containers)."""
    for nic in host.nics:
        mtu = hostroutes.interface_mtu(nic.nic)
        if mtu is None:
            if remove:
                continue  # its routes went with it
            raise MRCError(
                f"host {host.name}'s plane-{nic.plane} NIC {nic.nic} (its 'dev' in "
                f"{topo.layout.source}) is not an interface here"
            )
        if not remove and mtu < topo.layout.mtu:
            raise MRCError(
                f"interface {nic.nic} has MTU {mtu}, less than the fabric's {topo.layout.mtu} "
                "(usid.mtu): datagrams that fit the fabric would not fit the NIC"
            )
        if not remove and not is_local_address(nic.address):
            raise MRCError(
                f"host {host.name}'s plane-{nic.plane} address {nic.address} is not configured "
                "here: is this that host? (--host)"
            )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    answer = JsonAnswer("host-setup", args.json)

    def body() -> int:
        topo = _fabric(args.fabric)
        host = _host(topo, args.host)
        steps = hostroutes.plan(topo, host.name)
        if not args.dry_run:
            if not _may_change_routes():
                raise MRCError(
                    "changing routes needs root (CAP_NET_ADMIN); --dry-run shows what it would do"
                )
            _check_host(topo, host, args.remove)
            if args.remove:  # a NIC that is gone took its routes with it
                here = {n.nic for n in host.nics if hostroutes.interface_mtu(n.nic) is not None}
                steps = [s for s in steps if isinstance(s, Rule) or s.dev in here]
            try:
                hostroutes.apply(steps, remove=args.remove)
            except OSError as exc:
                if exc.errno == errno.EPERM:
                    raise MRCError("changing routes needs root (CAP_NET_ADMIN)") from None
                raise MRCError(f"{exc.filename}: {exc.strerror}") from None
        lines = hostroutes.ip_lines(steps, remove=args.remove)
        action = "remove" if args.remove else "setup"
        if args.json:
            answer.emit(
                {
                    "ok": True,
                    "fabric": topo.name,
                    "file": args.fabric,
                    "host": host.name,
                    "action": action,
                    "dry_run": bool(args.dry_run),
                    "commands": lines,
                }
            )
        elif args.dry_run:
            for line in lines:
                print(line)
        else:
            rules = sum(ln.startswith("ip -6 rule") for ln in lines)
            done = "removed the set-up of" if args.remove else "set up"
            last = topo.spines_per_plane - 1
            tables = str(topo.layout.table(0)) + (f"-{topo.layout.table(last)}" if last else "")
            print(
                f"{done} host {host.name} of fabric {topo.name!r}: {len(lines) - rules} routes, "
                f"{rules} rules (ip -6 rule; ip -6 route show table {tables})"
            )
        return 0

    return run_main(PROG, body, answer=answer)


if __name__ == "__main__":
    raise SystemExit(main())
