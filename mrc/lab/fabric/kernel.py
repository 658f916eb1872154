"""Thin pyroute2 helpers: one netlink handle per namespace, and the few operations we need.

Why a helper: every namespace gets exactly one ``IPRoute`` opened from inside it (see
:mod:`mrc.lab.fabric.netns`), reused for every operation, so bringing up a fabric costs no process
per namespace or per operation.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterable, Iterator
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import plugins as _tc_plugins
from pyroute2.netlink.rtnl.tcmsg import sched_pfifo

from mrc.errors import FabricError

from . import netns
from .routes import Neighbour, Route
from .shaping import tbf_params

IFA_F_NODAD = 0x02
NUD_PERMANENT = 0x80
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000


TC_H_ROOT = 0xFFFFFFFF
#: htb of a router port with a priority band (:meth:`NsHandle.prio_band`): handle 1:, one
#: class 1:1 at the link rate, leaves 1:10 (prio 0: trimmed headers, MRC ACK/NACK/probes) and
#: 1:20 (prio 1, the default: everything else).  mrc_trim.bpf.c puts these ids in
#: skb->priority (PRIO_CLASS / DATA_CLASS); keep them in step.
HTB_ROOT = 0x10000
HTB_LINK_CLASS = 0x10001
HTB_PRIO_CLASS = 0x10010
HTB_DATA_CLASS = 0x10020

# pyroute2 encodes bfifo's options exactly as pfifo's (struct tc_fifo_qopt: a limit, in bytes
# for bfifo) but has no entry for it
_tc_plugins.setdefault("bfifo", sched_pfifo)


class NsHandle:
    """A netlink socket bound to one namespace plus its ifname -> ifindex cache."""

    def __init__(self, ns: str) -> None:
        self.ns = ns
        with netns.entered(ns):
            self.ipr = IPRoute()
        self._index: dict[str, int] = {}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ipr.close()

    def index(self, ifname: str) -> int:
        if ifname not in self._index:
            self.refresh()
        return self._index[ifname]

    def refresh(self) -> None:
        self._index = {link.get("ifname"): link["index"] for link in self.ipr.link("dump")}

    def set_state(self, ifname: str, up: bool) -> None:
        self.ipr.link("set", index=self.index(ifname), state="up" if up else "down")

    def add_address(self, ifname: str, address: str, prefixlen: int) -> None:
        """Add with IFA_F_NODAD: usable at once, no duplicate address detection wait."""
        try:
            self.ipr.addr(
                "add",
                index=self.index(ifname),
                family=socket.AF_INET6,
                address=address,
                prefixlen=prefixlen,
                flags=IFA_F_NODAD,
            )
        except NetlinkError as e:
            if e.code != 17:  # EEXIST: already there, fine
                raise

    def apply_routes(self, routes: Iterable[Route]) -> None:
        """``replace`` so re-applying after a link heal is idempotent."""
        for r in routes:
            self.ipr.route(
                "replace",
                family=socket.AF_INET6,
                dst=r.dst,
                gateway=r.gateway,
                oif=self.index(r.ifname),
            )

    def ip_batch(self, lines: list[str]) -> None:
        """Run iproute2 commands in this namespace (``ip -n NS -batch -``), for what pyroute2
        cannot express (seg6 ``encap.red``, seg6local flavours: :mod:`.usid_routes`)."""
        if not lines:
            return
        try:
            done = subprocess.run(
                ["ip", "-n", self.ns, "-6", "-batch", "-"],
                input="\n".join(lines) + "\n",
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise FabricError(f"ip in {self.ns}: {e}") from e
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["failed"])[-1]
            raise FabricError(f"ip in {self.ns}: {why}")

    def apply_neighbours(self, neighbours: Iterable[Neighbour]) -> None:
        for n in neighbours:
            self.ipr.neigh(
                "replace",
                family=socket.AF_INET6,
                dst=n.address,
                lladdr=n.mac,
                ifindex=self.index(n.ifname),
                state=NUD_PERMANENT,
            )

    def shape(self, ifname: str, rate_bps: int, mtu: int, host: bool = False) -> None:
        """Root tbf on ``ifname`` with :func:`tbf_params` (``host``: a host's NIC)."""
        rate_Bps, burst, limit = tbf_params(rate_bps, mtu, host)
        self.ipr.tc(
            "replace",
            "tbf",
            index=self.index(ifname),
            handle="1:",
            rate=rate_Bps,
            burst=burst,
            limit=limit,
        )

    def prio_band(self, ifname: str, rate_bps: int, mtu: int) -> None:
        """Root htb on a router port: the link rate shared by a strict-priority band for what
        must not wait behind data (trimmed headers, ACK/NACKs) and a data band, each with a
        byte FIFO as deep as :func:`tbf_params`'s queue.

        Why htb: this kernel has no prio qdisc.  The priority class is guaranteed (almost)
        the whole link rate and the data class 1% of it, both may borrow up to the link rate,
        and htb serves the lower prio first among classes in the same state: so a header
        waits at most for the frame being sent (plus htb's burst), never for the data queue.
        The shared class 1:1 drains at the link rate with tbf's burst, which is what the
        trimmer's virtual queue models (mrc/lab/fabric/trim/maps.py).
        """
        rate_Bps, burst, limit = tbf_params(rate_bps, mtu)
        frame = mtu + 14
        index = self.index(ifname)
        common = {"ceil": rate_Bps, "burst": burst, "cburst": burst, "quantum": frame, "mtu": frame}
        data_rate = max(rate_Bps // 100, 1)
        self.ipr.tc("replace", "htb", index, HTB_ROOT, default=HTB_DATA_CLASS & 0xFFFF)
        self.ipr.tc(
            "add-class", "htb", index, HTB_LINK_CLASS, parent=HTB_ROOT, rate=rate_Bps, **common
        )
        for classid, prio, rate in (
            (HTB_PRIO_CLASS, 0, rate_Bps - data_rate),
            (HTB_DATA_CLASS, 1, data_rate),
        ):
            self.ipr.tc(
                "add-class",
                "htb",
                index,
                classid,
                parent=HTB_LINK_CLASS,
                rate=rate,
                prio=prio,
                **common,
            )
            # leaf qdisc handle: the class minor as major (1:10 -> 10:)
            self.ipr.tc(
                "add", "bfifo", index, (classid & 0xFFFF) << 16, parent=classid, limit=limit
            )

    def links(self) -> list[dict[str, Any]]:
        """Interface facts for status: admin/oper state and 64-bit counters."""
        out = []
        for link in self.ipr.link("dump"):
            stats = link.get("IFLA_STATS64") or {}
            out.append(
                {
                    "ifname": link.get("ifname"),
                    "index": link["index"],
                    "admin_up": bool(link["flags"] & IFF_UP),
                    # carrier is immediate; operstate lags behind it (linkwatch, up to ~1 s)
                    "carrier": bool(link["flags"] & IFF_LOWER_UP),
                    "oper": (link.get("IFLA_OPERSTATE") or "UNKNOWN").lower(),
                    "mtu": link.get("IFLA_MTU"),
                    "rx_packets": stats.get("rx_packets", 0),
                    "tx_packets": stats.get("tx_packets", 0),
                    "rx_bytes": stats.get("rx_bytes", 0),
                    "tx_bytes": stats.get("tx_bytes", 0),
                    "rx_dropped": stats.get("rx_dropped", 0),
                    "tx_dropped": stats.get("tx_dropped", 0),
                }
            )
        return out

    def qdisc_drops(self) -> dict[int, int]:
        """Drops counted by root qdiscs (tbf overflow; an htb counts its leaves'), by ifindex."""
        drops: dict[int, int] = {}
        for q in self.ipr.get_qdiscs():
            if q.get("parent") != TC_H_ROOT:
                continue
            stats = q.get("TCA_STATS2")
            queue = stats.get("TCA_STATS_QUEUE") if stats else None
            if queue is not None and q.get("TCA_KIND") != "noqueue":
                drops[q["index"]] = drops.get(q["index"], 0) + queue.get("drops", 0)
        return drops


@contextlib.contextmanager
def handles(namespaces: Iterable[str]) -> Iterator[dict[str, NsHandle]]:
    """Open one handle per namespace; close them all on exit."""
    opened: dict[str, NsHandle] = {}
    try:
        for ns in namespaces:
            opened[ns] = NsHandle(ns)
        yield opened
    finally:
        for h in opened.values():
            h.close()
