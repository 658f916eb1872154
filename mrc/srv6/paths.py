"""Enumerate the source-routed paths between two fabric hosts.

In a two-tier plane every path between two hosts is chosen by one decision: which spine to
turn at.  So a path is (plane, spine), and its segment list is ``[spine SID, destination
address]``; on a ``--srv6 usid`` fabric it is ``[uSID container, destination address]``, the
outer and inner destinations of IPv6-in-IPv6 (:mod:`mrc.srv6.usid`), whose micro-SIDs a real
fabric's file gives (:class:`mrc.topology.realfile.UsidTopology`).  Hosts under the same
leaf also get every leaf -> spine -> leaf detour (so traffic can be sprayed over all spines,
like everything else) plus the direct path through the leaf, which carries no SRH at all.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mrc.topology import Topology
from mrc.topology.realfile import UsidTopology

from . import usid
from .srh import encode_srh


@dataclass(frozen=True)
class Path:
    """One way from ``src`` to ``dst``.  ``segments`` is in travel order, destination last."""

    src: str
    dst: str
    plane: int
    spine: str | None  # None: no SRH, the packet follows the static routes (see default_path)
    segments: tuple[str, ...]
    src_address: str
    dst_address: str
    src_netns: str
    #: on a ``--srv6 usid`` fabric: the uSID container this path's packets are sent to inside
    #: IPv6-in-IPv6, and the socket mark that picks it (mrc.srv6.usid); else None and 0
    usid: str | None = None
    mark: int = 0
    #: on a real uSID fabric (a file, mrc.topology.realfile): the source ports whose sockets
    #: the host's rules send into this path's table (mrc.srv6.hostroutes), instead of a mark
    ports: tuple[int, int] | None = None

    @property
    def direct(self) -> bool:
        return self.spine is None

    @property
    def srh(self) -> bytes | None:
        """The sticky IPV6_RTHDR value for this path, or None when no SRH is needed."""
        if self.usid is not None:
            return None
        return encode_srh(self.segments) if len(self.segments) > 1 else None


def list_paths(topo: Topology, src: str, dst: str, planes: list[int] | None = None) -> list[Path]:
    """Every path from host ``src`` to host ``dst``: for each plane, one per spine, in order;
    when both hosts share a leaf, the plane's direct path follows its spine paths."""
    s, d = topo.host(src), topo.host(dst)
    if s.name == d.name:
        raise ValueError("source and destination are the same host")
    paths = []
    for plane in planes if planes is not None else range(topo.planes):
        sn, dn = s.nic(plane), d.nic(plane)
        common = functools.partial(
            Path,
            src=s.name,
            dst=d.name,
            plane=plane,
            src_address=sn.address,
            dst_address=dn.address,
            src_netns=s.netns,
        )
        for spine in topo.spines(plane):
            if isinstance(topo, UsidTopology):
                box = topo.layout.path_container(plane, sn.leaf, spine.name, dn.leaf, d.name)
                paths.append(
                    common(
                        spine=spine.name,
                        segments=(box, dn.address),
                        usid=box,
                        ports=topo.layout.spine_ports[spine.index],
                    )
                )
            elif topo.srv6 == "usid":
                box = usid.path_container(
                    plane,
                    topo.router(sn.leaf).index,
                    spine.index,
                    topo.router(dn.leaf).index,
                    d.index,
                )
                paths.append(
                    common(
                        spine=spine.name,
                        segments=(box, dn.address),
                        usid=box,
                        mark=usid.mark(spine.index),
                    )
                )
            else:
                paths.append(common(spine=spine.name, segments=(spine.sid, dn.address)))
        if sn.leaf == dn.leaf:
            paths.append(common(spine=None, segments=(dn.address,)))
    return paths


def default_path(topo: Topology, src: str, dst: str, plane: int) -> Path:
    """The plain, destination-routed path in ``plane`` (no SRH): straight through a shared
    leaf, else leaf -> spine 0 -> leaf as the static routes say."""
    s, d = topo.host(src), topo.host(dst)
    sn, dn = s.nic(plane), d.nic(plane)
    return Path(
        src=s.name,
        dst=d.name,
        plane=plane,
        spine=None,
        segments=(dn.address,),
        src_address=sn.address,
        dst_address=dn.address,
        src_netns=s.netns,
    )


def path_via(topo: Topology, src: str, dst: str, spine: str) -> Path:
    """The path from ``src`` to ``dst`` turning at ``spine`` (e.g. ``p1s0``)."""
    plane = topo.router(spine).plane
    for p in list_paths(topo, src, dst, planes=[plane]):
        if p.spine == topo.canonical(spine):
            return p
    raise ValueError(f"{spine} is not a spine")
