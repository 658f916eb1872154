"""A benchmark's fabric: built for one run and always removed, also on Ctrl-C or SIGTERM; and
what it did meanwhile (trims and drops, read before and after)."""

from __future__ import annotations

import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Any

from mrc.errors import MRCError
from mrc.lab.fabric import Fabric, FabricSpec, Topology
from mrc.topology import Link


def unwind_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt, as Ctrl-C does: the ``finally`` blocks that stop
    children and remove fabrics and namespaces then run for a ``kill`` or a timeout too, and
    :func:`mrc.cli.common.run_main` reports it as an interruption."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


@contextmanager
def fabric(spec: FabricSpec) -> Iterator[Topology]:
    """``with fabric(spec) as topo:`` the fabric ``spec`` describes, removed when the block
    ends however it ends (a half-built one too: removal is idempotent)."""
    try:
        yield Fabric.up(spec)
    finally:
        Fabric.down(spec.name)


def port_counters(topo: Topology) -> dict[str, dict[str, Any]]:
    """Per link end present (``p0l2:h2``), from the fabric's status (:func:`status_counters`).

    Read before and after a run, :func:`port_deltas` says what the fabric did to the run's
    packets: a benchmark judges a transport by whether the fabric trimmed rather than dropped,
    and every one that asks reads the same counters the same way."""
    return status_counters(Fabric.status(topo))


def status_counters(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The counters of every link end present in ``status`` (:meth:`Fabric.status`), by
    ``node:ifname``: its ``drops``, which are its ``tbf_drops`` (the qdisc's) and its
    ``interface_drops`` (the veth's backlog, both ways), told apart for the reader that asks
    where a packet was lost; and, on a trimming router, what it did as an egress: packets
    ``trimmed``, its ``tail_drops`` (over the hard limit, left to tbf: an estimate) and whether
    it is a ``lasthop`` port (into a host)."""
    out: dict[str, dict[str, Any]] = {}
    for lk in status["links"]:
        for node, end in ((lk["a"], lk["a_end"]), (lk["b"], lk["b_end"])):
            if not end.get("present"):
                continue
            trim = end.get("trim", {})
            tbf, iface = end["qdisc_drops"], end["rx_dropped"] + end["tx_dropped"]
            out[f"{node}:{end['ifname']}"] = {
                "drops": tbf + iface,
                "tbf_drops": tbf,
                "interface_drops": iface,
                "trimmed": trim.get("trimmed", 0),
                "tail_drops": trim.get("tail_drops", 0),
                "lasthop": bool(trim.get("lasthop", False)),
            }
    return out


def port_deltas(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """What the fabric did between two :func:`port_counters`: packets trimmed (all, and at last
    hops), packets dropped, and which ports dropped how many (``drops_at``)."""
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


def reshape(topo: Topology, link: Link, rate_bps: int, queue_s: float) -> dict[str, Any]:
    """Reshape a host's link in a running fabric to ``rate_bps``, behind the tools' back: the
    topology file (what mrc-send reads its line rate from) still says the old rate.

    The router's port into the host gets a tbf at the new rate holding ``queue_s`` of it (a
    tail-drop FIFO, nothing marks or trims; at least two full frames), the host's own NIC the
    fabric's host queue at that rate (:func:`mrc.lab.fabric.shaping.tbf_params`). Only for a
    fabric built without ``--trim``: a trimmer's virtual queue drains at the rate it was built
    with, and its htb is not a tbf. What the kernel holds afterwards, read back:
    ``{"port", "rate_bps", "limit_bytes"}`` of the router's port."""
    from mrc.lab.fabric.kernel import TC_H_ROOT, handles
    from mrc.lab.fabric.shaping import tbf_params

    if topo.trim:
        raise MRCError("reshape needs a fabric without --trim")
    if link.kind != "host-leaf":
        raise MRCError(f"reshape takes a host's link, not {link.a}-{link.b} ({link.kind})")
    host, router = (link.a, link.a_ifname), (link.b, link.b_ifname)
    rate_Bps, burst, _ = tbf_params(rate_bps, link.mtu)
    frame = link.mtu + 14
    limit = max(round(rate_Bps * queue_s), 2 * frame)
    with handles([topo.netns_of(host[0]), topo.netns_of(router[0])]) as hs:
        hr = hs[topo.netns_of(router[0])]
        index = hr.index(router[1])
        hr.ipr.tc(
            "replace", "tbf", index=index, handle="1:", rate=rate_Bps, burst=burst, limit=limit
        )
        hs[topo.netns_of(host[0])].shape(host[1], rate_bps, link.mtu, host=True)
        (q,) = [q for q in hr.ipr.get_qdiscs(index=index) if q.get("parent") == TC_H_ROOT]
        parms = dict(q.get_attr("TCA_OPTIONS")["attrs"])["TCA_TBF_PARMS"]
    return {
        "port": f"{router[0]}:{router[1]}",
        "rate_bps": int(parms["rate"]) * 8,
        "limit_bytes": int(parms["limit"]),
    }
