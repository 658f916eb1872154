"""Options mrc-send and mrc-recv share about paths: fabric topologies, denied EVs, EV log."""

from __future__ import annotations

import argparse
import json
import time
from typing import IO, TYPE_CHECKING

from mrc.connection import Connection
from mrc.core.events import EVStateChanged
from mrc.errors import MRCError

if TYPE_CHECKING:
    from mrc.fabric.topology import Topology


def add_path_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fabric",
        metavar="NAME|FILE",
        help="an mrc-fabric topology (fabric name or JSON file): EVs are spread over "
        "its SRv6 paths, every spine of every plane; this host's plane addresses "
        "come from it, and the peer may be named by its fabric host name (h3)",
    )
    p.add_argument(
        "--deny",
        action="append",
        default=[],
        metavar="ROUTE|EV",
        help="never use these EVs (state DENIED): a route name such as a spine "
        "(p1s0), or an EV number; repeatable",
    )
    p.add_argument(
        "--ev-log", metavar="FILE", help="write every EV state change as one JSON object per line"
    )


def load_fabric(name: str | None) -> Topology | None:
    if name is None:
        return None
    from mrc.fabric import load_topology

    return load_topology(name)


def host_address(topo: Topology | None, name: str) -> str:
    """A fabric host name (h3) -> its plane-0 address; anything else is returned as is."""
    if topo is None:
        return name
    for host in topo.hosts:
        if host.name == name or host.netns == name:
            return host.nics[0].address
    return name


def local_plane_addrs(topo: Topology | None) -> list[str] | None:
    """The plane addresses of the fabric host this process runs on."""
    if topo is None:
        return None
    from mrc.srv6.evroutes import local_fabric_host

    host = local_fabric_host(topo)
    if host is None:
        raise MRCError(
            f"this process is not on a host of fabric {topo.name!r} "
            f"(run it with: mrc-fabric exec HOST -- ...)"
        )
    return [nic.address for nic in sorted(host.nics, key=lambda n: n.plane)]


def apply_denies(conn: Connection, denies: list[str]) -> int:
    """Deny every EV whose number or route label matches; returns how many were denied."""
    if not denies:
        return 0
    wanted = set(denies)
    n = 0
    for ev, row in enumerate(conn.ev_report()):  # rows in EV order
        if str(ev) in wanted or str(row["route"]) in wanted:
            conn.deny_ev(ev)
            n += 1
    if n == 0:
        raise MRCError(f"--deny {', '.join(denies)} matches no EV of this connection")
    return n


class EVLog:
    """JSON lines, one per EV transition: time since start, EV, port, plane, route, states."""

    def __init__(self, path: str | None) -> None:
        self.start = time.monotonic()
        self._fh: IO[str] | None = None
        if path is not None:
            try:
                self._fh = open(path, "w", buffering=1)  # noqa: SIM115 - closed in close()
            except OSError as exc:
                raise MRCError(f"cannot write the EV log {path}: {exc.strerror}") from None

    def attach(self, conn: Connection, role: str) -> None:
        if self._fh is None:
            return
        fh = self._fh
        routes = conn.routes
        loop_start = time.monotonic()  # the transport's clock
        wall = time.time()

        def write(ev: EVStateChanged) -> None:
            fh.write(
                json.dumps(
                    {
                        "t": round(wall + (ev.time - loop_start), 6),
                        "role": role,
                        "qpn": ev.qpn,
                        "ev": ev.ev,
                        "sport": ev.sport,
                        "plane": ev.plane,
                        "route": routes[ev.ev] if routes else "direct",
                        "from": ev.old_label,
                        "to": ev.new_label,
                        "reason": ev.reason_text,
                    }
                )
                + "\n"
            )

        conn.on_ev_change(write)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
