"""``mrc-fabric``: build, inspect, break and remove multi-plane SRv6 test fabrics.

Every failure the user can cause ends as ONE line on stderr, ``mrc-fabric: error: ...``, with
exit code 2 for bad arguments and 1 for everything else; never a traceback (set
MRC_DEBUG=1 to get one for an unexpected internal error). See :func:`mrc.cli.common.run_main`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias

from mrc.cli.common import (
    Parser,
    add_logging_args,
    configure_logging,
    emit_json,
    float_between,
    non_negative_int,
    positive_int,
    rate_arg,
    run_main,
)
from mrc.errors import FabricError, UsageError
from mrc.lab.fabric import Fabric, FabricSpec, load_topology
from mrc.lab.fabric import netns as nsutil
from mrc.lab.fabric.builder import require_root
from mrc.lab.fabric.containers import exec_argv
from mrc.lab.fabric.spec import NAME_RE
from mrc.topology.model import SRV6_MODES, Topology, topology_path

PROG = "mrc-fabric"
log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description=(
            "Multi-plane two-tier (leaf/spine) SRv6 fabrics of Linux routers in network"
            " namespaces, with static routes only. Needs root. See docs/FABRIC.md."
        ),
        epilog=(
            "examples:\n"
            "  mrc-fabric up                         # 4 planes x (2 spines, 2 leaves), 4 hosts\n"
            "  mrc-fabric up --planes 2 --rate 200mbit --name demo\n"
            "  mrc-fabric up --planes 1 --rate 50mbit --trim   # trim instead of tail drop\n"
            "  mrc-fabric paths h0 h3                # SRv6 paths: plane x spine\n"
            "  mrc-fabric ping h0 h3 --via p0s1      # ICMPv6 echo over spine p0s1\n"
            "  mrc-fabric link down p0l0 p0s1        # fail a link; 'link up' heals it\n"
            "  mrc-fabric status\n"
            "  mrc-fabric exec h0 -- ip -6 addr\n"
            "  mrc-fabric down\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_logging_args(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (
        _add_up,
        _add_down,
        _add_status,
        _add_link,
        _add_exec,
        _add_list,
        _add_paths,
        _add_ping,
    ):
        add(sub)

    for sp in sub.choices.values():  # -v/-q after the sub-command too
        add_logging_args(sp)
    return p


Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _name_opt(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--name", default="mrc", help="fabric name (default: mrc)")


def _host_pair(sp: argparse.ArgumentParser) -> None:
    """``--name`` and the two hosts a path or a ping goes between."""
    _name_opt(sp)
    sp.add_argument("src", metavar="SRC")
    sp.add_argument("dst", metavar="DST")


def _add_up(sub: Subparsers) -> None:
    """``up``: build a fabric."""
    up = sub.add_parser(
        "up",
        help="build a fabric and write /run/mrc/fabric-NAME.json",
        description=(
            "Build a fabric: per plane, every leaf links to every spine and hosts are split"
            " evenly over the leaves; every host has one NIC per plane (named p0, p1, ...)."
        ),
    )
    _name_opt(up)
    up.add_argument("--planes", type=positive_int, default=4, help="planes (default 4)")
    up.add_argument("--spines", type=positive_int, default=2, help="spines per plane (default 2)")
    up.add_argument("--leaves", type=positive_int, default=2, help="leaves per plane (default 2)")
    up.add_argument("--hosts", type=positive_int, default=4, help="hosts, at least 2 (default 4)")
    up.add_argument(
        "--rate",
        type=rate_arg,
        help="shape every link, both directions, with tbf (e.g. 200mbit; tc units: bit, kbit,"
        " mbit, gbit, or bps, kbps... for bytes/s)",
    )
    up.add_argument("--mtu", type=positive_int, default=1500, help="MTU of every fabric link")
    up.add_argument(
        "--trim",
        action="store_true",
        help="trim MRC data packets to their headers instead of dropping them when a link's"
        " queue would overflow (tc eBPF on the routers; needs --rate, clang, libbpf-dev); also"
        " marks CE on ECT packets above --ecn-threshold on ports between routers, and gives"
        " trimmed headers and ACK/NACKs a strict-priority band on every router port",
    )
    up.add_argument(
        "--ecn-threshold",
        type=float_between(0, 1, low_inclusive=True),
        metavar="FRACTION",
        help="with --trim: mark CE when a port's queue is above FRACTION of its trimming limit"
        " (default 0.5; 0: no marking)",
    )
    up.add_argument(
        "--no-prio-band",
        dest="prio_band",
        action="store_false",
        help="with --trim: keep a plain tbf on router ports, no priority band (to compare)",
    )
    up.add_argument(
        "--srv6",
        choices=SRV6_MODES,
        default="usid",
        help="how a host names a path to the routers: usid (default), IPv6-in-IPv6 to a"
        " micro-SID container (leaf:spine:leaf:port) that each router shifts, as the MRC"
        " paper's fabrics do, with no routing header on the wire; srh, a Segment Routing"
        " Header of End SIDs per packet, for routers without uSID",
    )
    up.add_argument(
        "--host-image",
        metavar="IMAGE",
        help="run every host as a container of IMAGE (podman, or docker; MRC_ENGINE picks),"
        " its plane NICs inside the container's network namespace; `exec` then runs commands"
        " in the container (docker/build.sh builds an image with mrc in it)",
    )
    up.add_argument("--json", action="store_true", help="print the topology JSON on stdout")


def _add_down(sub: Subparsers) -> None:
    """``down``: remove a fabric."""
    down = sub.add_parser(
        "down",
        help="remove a fabric (idempotent; works without the topology file)",
        description=(
            "Remove every container labelled mrc.fabric=NAME and the directory they shared"
            " (RUN_DIR/share-NAME), every namespace named mrc-NAME-<node> (and with them every"
            " veth), kill processes left inside them, delete the topology file. Touches"
            " nothing else."
        ),
    )
    _name_opt(down)


def _add_status(sub: Subparsers) -> None:
    """``status``: per-link state and counters."""
    st = sub.add_parser(
        "status",
        help="per-link state and counters at both ends",
        description="For every link: admin/oper state at both ends, tx/rx packets and bytes,"
        " drops (interface rx/tx dropped + tbf/htb drops); on a --trim fabric also TRIMS: MRC"
        " data packets a router trimmed on their way out of that end, and CE: packets it marked"
        " CE there.",
    )
    _name_opt(st)
    st.add_argument("--json", action="store_true", help="print JSON")


def _add_link(sub: Subparsers) -> None:
    """``link``: fail or heal a link."""
    lk = sub.add_parser(
        "link",
        help="fail or heal the link between two nodes",
        description="Set both ends of the link between nodes A and B down or up, e.g."
        " 'link down h0 p0l0' or 'link up p0l0 p0s1'. 'up' also re-installs the static"
        " routes and neighbours the kernel dropped when the link went down.",
    )
    lk.add_argument("state", choices=["down", "up"])
    lk.add_argument("a", metavar="A", help="node, e.g. h0, p0l0, p0s1")
    lk.add_argument("b", metavar="B", help="node at the other end")
    _name_opt(lk)


def _add_exec(sub: Subparsers) -> None:
    """``exec``: run a command in a node."""
    ex = sub.add_parser(
        "exec",
        help="run a command inside a node's namespace",
        description="Run CMD inside the namespace of NODE (host h0 or router p0l0...);"
        " its exit code is passed through.",
    )
    _name_opt(ex)
    ex.add_argument("node", metavar="NODE")
    ex.add_argument("cmd", metavar="-- CMD", nargs=argparse.REMAINDER)


def _add_list(sub: Subparsers) -> None:
    """``list``: list fabrics."""
    sub.add_parser(
        "list",
        help="list fabrics on this machine",
        description="List fabrics found by namespace name and by topology file.",
    ).add_argument("--json", action="store_true", help="print JSON")


def _add_paths(sub: Subparsers) -> None:
    """``paths``: list SRv6 paths."""
    pa = sub.add_parser(
        "paths",
        help="list SRv6 paths between two hosts",
        description="Every path from SRC to DST: one per plane and spine (segment list"
        " [spine SID, DST address]), plus the direct path when both share a leaf.",
    )
    _host_pair(pa)
    pa.add_argument("--json", action="store_true", help="print JSON")


def _add_ping(sub: Subparsers) -> None:
    """``ping``: ICMPv6 echo."""
    pg = sub.add_parser(
        "ping",
        help="ICMPv6 echo between two hosts, optionally over a chosen spine",
        description="Ping DST from SRC in one plane; with --via SPINE the request carries an"
        " SRH that steers it through that spine (replies take the default path).",
    )
    _host_pair(pg)
    pg.add_argument(
        "--plane",
        type=non_negative_int,
        default=None,
        help="plane (default 0, or the plane of --via)",
    )
    pg.add_argument("--via", metavar="SPINE", help="spine to go through, e.g. p0s1")
    pg.add_argument("-c", "--count", type=positive_int, default=3)
    pg.add_argument(
        "-W", "--timeout", type=float_between(0, 60), default=1.0, help="seconds per reply"
    )


# --- commands --------------------------------------------------------------------------------


def _cmd_up(args: argparse.Namespace) -> int:
    spec = FabricSpec(
        name=args.name,
        planes=args.planes,
        spines=args.spines,
        leaves=args.leaves,
        hosts=args.hosts,
        rate=args.rate,
        mtu=args.mtu,
        trim=args.trim,
        host_image=args.host_image,
        ecn_threshold=args.ecn_threshold,
        prio_band=args.prio_band,
        srv6=args.srv6,
    )
    spec.validate()
    require_root()
    log.info(
        "building fabric %s: %d planes x (%d spines + %d leaves), %d hosts",
        spec.name,
        spec.planes,
        spec.spines,
        spec.leaves,
        spec.hosts,
    )
    t0 = time.monotonic()
    topo = Fabric.up(spec)
    took = time.monotonic() - t0
    if args.json:
        print(json.dumps(topo.to_dict(), indent=2))
        return 0
    print(
        f"fabric {topo.name} up in {took:.2f}s: {topo.planes} planes x ({topo.spines_per_plane}"
        f" spines + {topo.leaves_per_plane} leaves), {len(topo.hosts)} hosts,"
        f" {len(topo.links)} links, mtu {topo.mtu}, rate {topo.rate or 'unshaped'}"
        + (", trimming on" if topo.trim else "")
        + (f", ECN at {topo.ecn_threshold:g} of the trim limit" if topo.ecn_threshold else "")
        + (", priority band for headers" if topo.prio_band else "")
        + (", uSID routes" if topo.srv6 == "usid" else "")
        + (f", hosts are {topo.engine} containers of {topo.host_image}" if topo.engine else "")
    )
    print(f"topology: {topology_path(topo.name)}")
    _print_hosts(topo)
    return 0


def _print_hosts(topo: Topology) -> None:
    for h in topo.hosts:
        nics = "  ".join(f"{n.nic}={n.address}({n.leaf})" for n in h.nics)
        print(f"  {h.name:<4} {h.netns:<18} {nics}")
    for plane in range(topo.planes):
        sids = "  ".join(f"{r.name}={r.sid}" for r in topo.routers if r.plane == plane)
        print(f"  plane {plane} SIDs: {sids}")


def _cmd_down(args: argparse.Namespace) -> int:
    if not NAME_RE.match(args.name):
        raise UsageError(f"bad fabric name {args.name!r}")
    removed = Fabric.down(args.name)
    if removed:
        print(f"fabric {args.name}: removed {len(removed)} namespaces")
    else:
        print(f"fabric {args.name}: nothing to remove")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    require_root()
    st = Fabric.status(load_topology(args.name))
    if args.json:
        emit_json(st, indent=2)
        return 0
    if st["missing_nodes"]:
        print(f"MISSING namespaces for: {' '.join(st['missing_nodes'])}")
    hdr: tuple[str, ...] = (
        "LINK",
        "PLANE",
        "STATE",
        "END",
        "ADMIN",
        "CARRIER",
        "TX_PKTS",
        "RX_PKTS",
        "TX_BYTES",
        "RX_BYTES",
        "DROPS",
    )
    fmt = "{:<14} {:>5} {:<5} {:<10} {:<5} {:<7} {:>9} {:>9} {:>11} {:>11} {:>6}"
    trim = bool(st.get("trim"))
    if trim:
        hdr = (*hdr, "TRIMS", "CE")
        fmt += " {:>7} {:>7}"
    print(fmt.format(*hdr))
    for lk in st["links"]:
        for i, (node, end) in enumerate(((lk["a"], lk["a_end"]), (lk["b"], lk["b_end"]))):
            first = i == 0
            label = f"{lk['a']}--{lk['b']}" if first else ""
            if not end.get("present"):
                print(
                    fmt.format(
                        label,
                        lk["plane"] if first else "",
                        "down" if first else "",
                        f"{node}:{end['ifname']}",
                        "-",
                        "missing",
                        *["-"] * (7 if trim else 5),
                    )
                )
                continue
            drops = end["rx_dropped"] + end["tx_dropped"] + end["qdisc_drops"]
            cols = [
                label,
                lk["plane"] if first else "",
                ("up" if lk["up"] else "DOWN") if first else "",
                f"{node}:{end['ifname']}",
                "up" if end["admin_up"] else "down",
                "yes" if end["carrier"] else "no",
                end["tx_packets"],
                end["rx_packets"],
                end["tx_bytes"],
                end["rx_bytes"],
                drops,
            ]
            if trim:
                cols.append(end["trim"]["trimmed"] if "trim" in end else "-")
                cols.append(end["trim"]["ce_marked"] if "trim" in end else "-")
            print(fmt.format(*cols))
    if trim:
        for router, rs in sorted(st.get("trim_routers", {}).items()):
            if "error" in rs:
                print(f"trim {router}: cannot read counters: {rs['error']}")
    return 0


def _cmd_link(args: argparse.Namespace) -> int:
    require_root()
    topo = load_topology(args.name)
    link = Fabric.link(topo, args.a, args.b, args.state == "up")
    print(
        f"link {link.a}:{link.a_ifname} -- {link.b}:{link.b_ifname} (plane {link.plane})"
        f" is {args.state}"
    )
    return 0


def _resolve_netns(name: str, node: str) -> str:
    """Namespace of ``node``: from the topology file, else by naming pattern (after a crash)."""
    try:
        return load_topology(name).netns_of(node)
    except FabricError:  # no (readable) topology file; an unknown node is a UsageError
        for ns in (node, f"mrc-{name}-{node}"):
            if ns.startswith(f"mrc-{name}-") and nsutil.exists(ns):
                return ns
        raise FabricError(f"no fabric {name!r} with a node {node!r}") from None


def _container_of(name: str, node: str) -> tuple[str, str] | None:
    """(engine, container) if ``node`` is a host run as a container, else None."""
    try:
        topo = load_topology(name)
    except FabricError:
        return None
    item = next((h for h in topo.hosts if node in (h.name, h.netns)), None)
    if item is None or not item.container:
        return None
    return topo.engine, item.container


def _in_image(program: str) -> str:
    """A program of this tool's own virtualenv (its Python, mrc-recv...) names the image's
    program of the same name, on the image's PATH: the host's files are not in the container."""
    path = Path(program)
    if path.is_absolute() and path.parent == Path(sys.executable).parent:
        return path.name
    return program


def _cmd_exec(args: argparse.Namespace) -> int:
    require_root()
    cmd = list(args.cmd)
    if cmd and cmd[0].startswith("-") and "--" in cmd:
        # argparse drops the first "--" but its REMAINDER swallows options given after NODE
        # (exec h0 --name x -- cmd): parse those ourselves
        cut = cmd.index("--")
        pre, cmd = cmd[:cut], cmd[cut + 1 :]
        while pre:
            opt = pre.pop(0)
            if opt == "--name" and pre:
                args.name = pre.pop(0)
            elif opt.startswith("--name="):
                args.name = opt.split("=", 1)[1]
            else:
                raise UsageError(f"exec: unexpected argument {opt!r} before '--'")
    if not cmd:
        raise UsageError("exec needs a command: mrc-fabric exec NODE -- CMD [ARGS...]")
    container = _container_of(args.name, args.node)
    if container is not None:
        engine, name = container
        argv = exec_argv(engine, name, [_in_image(cmd[0]), *cmd[1:]], sys.stdin.isatty())
        sys.stdout.flush()
        os.execvp(argv[0], argv)
    ns = _resolve_netns(args.name, args.node)
    sys.stdout.flush()
    nsutil.enter_for_exec(ns)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        sys.stderr.write(f"{PROG}: error: cannot run {cmd[0]!r} in {ns}: {e.strerror}\n")
        return 127
    return 0  # not reached


def _cmd_list(args: argparse.Namespace) -> int:
    fabrics = Fabric.list()
    if args.json:
        emit_json({"fabrics": fabrics}, indent=2)
        return 0
    if not fabrics:
        print("no fabrics")
    for name, info in fabrics.items():
        where = info["topology"] or "(no topology file)"
        print(f"{name:<16} {info['namespaces']:>4} namespaces  {where}")
    return 0


def _cmd_paths(args: argparse.Namespace) -> int:
    from mrc.srv6.paths import list_paths

    topo = load_topology(args.name)
    topo.host(args.src), topo.host(args.dst)
    if topo.canonical(args.src) == topo.canonical(args.dst):
        raise UsageError("SRC and DST are the same host")
    paths = list_paths(topo, args.src, args.dst)
    if args.json:
        rows = [
            {
                "plane": p.plane,
                "spine": p.spine,
                "segments": list(p.segments),
                "src_address": p.src_address,
                "dst_address": p.dst_address,
            }
            for p in paths
        ]
        emit_json(
            {"src": topo.canonical(args.src), "dst": topo.canonical(args.dst), "paths": rows},
            indent=2,
        )
        return 0
    for p in paths:
        via = p.spine or "direct"
        print(f"plane {p.plane}  via {via:<7} {p.src_address} -> [{', '.join(p.segments)}]")
    return 0


def _cmd_ping(args: argparse.Namespace) -> int:
    from mrc.lab.fabric.ping import ping
    from mrc.srv6.paths import default_path, path_via

    require_root()
    topo = load_topology(args.name)
    src, dst = topo.host(args.src), topo.host(args.dst)
    if src.name == dst.name:
        raise UsageError("SRC and DST are the same host")
    if args.via:
        spine = topo.router(args.via)
        if spine.tier != "spine":
            raise UsageError(f"--via {args.via}: not a spine")
        if args.plane is not None and args.plane != spine.plane:
            raise UsageError(f"--via {args.via} is in plane {spine.plane}, not {args.plane}")
        path = path_via(topo, src.name, dst.name, spine.name)
    else:
        plane = args.plane or 0
        if not 0 <= plane < topo.planes:
            raise UsageError(f"--plane {plane}: fabric has planes 0..{topo.planes - 1}")
        path = default_path(topo, src.name, dst.name, plane)
    res = ping(path, count=args.count, timeout=args.timeout)
    via = f"via {path.spine} " if path.spine else ""
    rtts = " ".join(f"{r:.3f}" for r in res.rtts_ms)
    print(
        f"{path.src_address} -> {path.dst_address} {via}(plane {path.plane}):"
        f" {res.received}/{res.sent} replies  rtt ms: {rtts or '-'}"
    )
    return 0 if res.received == res.sent else 1


COMMANDS = {
    "up": _cmd_up,
    "down": _cmd_down,
    "status": _cmd_status,
    "link": _cmd_link,
    "exec": _cmd_exec,
    "list": _cmd_list,
    "paths": _cmd_paths,
    "ping": _cmd_ping,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args)
    return run_main(PROG, lambda: COMMANDS[args.command](args))


if __name__ == "__main__":
    sys.exit(main())
