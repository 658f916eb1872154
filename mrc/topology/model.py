"""The topology: a plain description of a fabric (hosts, their plane NICs, routers, links).

The namespace fabric computes one from a spec before it touches the kernel
(:func:`mrc.lab.fabric.plan.plan`) and saves it as JSON; a real network's is written by hand
(:mod:`mrc.topology.realfile`). The transport reads either to spread EVs over SRv6 paths
(:mod:`mrc.srv6.evroutes`), so this module is pure data: no kernel, no pyroute2. The JSON
format is documented field by field in docs/FABRIC.md; bump ``FORMAT_VERSION`` on
incompatible changes.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mrc.errors import FabricError, UsageError

FORMAT_VERSION = 1

#: Where topology files live; override with MRC_FABRIC_DIR (e.g. for unprivileged tooling).
DEFAULT_RUN_DIR = "/run/mrc"


def run_dir() -> Path:
    return Path(os.environ.get("MRC_FABRIC_DIR", DEFAULT_RUN_DIR))


def topology_path(name: str) -> Path:
    return run_dir() / f"fabric-{name}.json"


@dataclass(frozen=True)
class HostNic:
    """A host's port in one plane."""

    plane: int
    nic: str
    address: str
    prefix: str
    gateway: str
    leaf: str
    mac: str


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    index: int
    nics: tuple[HostNic, ...]
    #: the container this host runs as (``mrc-fabric up --host-image``); "" for a bare namespace
    container: str = ""

    def nic(self, plane: int) -> HostNic:
        for n in self.nics:
            if n.plane == plane:
                return n
        raise UsageError(f"host {self.name} has no NIC in plane {plane}")


@dataclass(frozen=True)
class Router:
    name: str
    netns: str
    plane: int
    tier: str  # "leaf" or "spine"
    index: int
    sid: str


@dataclass(frozen=True)
class Link:
    """A veth pair.  ``a`` is the lower tier (host for host-leaf, leaf for leaf-spine)."""

    a: str
    b: str
    a_ifname: str
    b_ifname: str
    a_address: str
    b_address: str
    a_mac: str
    b_mac: str
    prefix: str
    plane: int
    kind: str  # "host-leaf" or "leaf-spine"
    rate: str | None
    rate_bps: int | None
    mtu: int

    @property
    def id(self) -> str:
        return f"{self.a}-{self.b}"

    def end(self, node: str) -> tuple[str, str]:
        """(ifname, address) of this link's end on ``node``."""
        if node == self.a:
            return self.a_ifname, self.a_address
        if node == self.b:
            return self.b_ifname, self.b_address
        raise KeyError(node)

    def peer(self, node: str) -> tuple[str, str, str]:
        """(peer node, peer address, peer mac) as seen from ``node``."""
        if node == self.a:
            return self.b, self.b_address, self.b_mac
        if node == self.b:
            return self.a, self.a_address, self.a_mac
        raise KeyError(node)


@dataclass(frozen=True)
class Topology:
    name: str
    planes: int
    spines_per_plane: int
    leaves_per_plane: int
    rate: str | None
    mtu: int
    hosts: tuple[Host, ...]
    routers: tuple[Router, ...]
    links: tuple[Link, ...]
    version: int = FORMAT_VERSION
    created: float = field(default=0.0, compare=False)
    trim: bool = False  # packet trimming on the routers (mrc.lab.fabric.trim)
    # with trim: CE marking threshold, a fraction of the trimming limit (0: no marking)
    ecn_threshold: float = 0.0
    prio_band: bool = False  # with trim: router ports have an htb priority band
    #: how the routers are told a path: "srh" (a Segment Routing Header of End SIDs) or
    #: "usid" (IPv6-in-IPv6 to a uSID container, mrc.srv6.usid)
    srv6: str = "srh"
    host_image: str | None = None  # hosts are containers of this image
    engine: str = ""  # the container engine that runs them (podman or docker)
    #: with host containers: the directory they and the host share read-write, at this same
    #: path (mrc.lab.fabric.containers.share_dir); "" for bare namespaces
    share_dir: str = ""

    # --- lookups -----------------------------------------------------------------------------

    def nodes(self) -> list[str]:
        return [h.name for h in self.hosts] + [r.name for r in self.routers]

    def netns_of(self, node: str) -> str:
        """Namespace of ``node``; accepts the short name (``h0``) or the namespace name."""
        return self._node(node).netns

    def _node(self, node: str) -> Host | Router:
        items: list[Host | Router] = [*self.hosts, *self.routers]
        for item in items:
            if node in (item.name, item.netns):
                return item
        raise UsageError(
            f"unknown node {node!r} in fabric {self.name!r} (hosts h0..h{len(self.hosts) - 1},"
            f" routers like p0l0 / p0s0)"
        )

    def canonical(self, node: str) -> str:
        return self._node(node).name

    def host(self, name: str) -> Host:
        item = self._node(name)
        if not isinstance(item, Host):
            raise UsageError(f"{name!r} is a router, not a host")
        return item

    def router(self, name: str) -> Router:
        item = self._node(name)
        if not isinstance(item, Router):
            raise UsageError(f"{name!r} is a host, not a router")
        return item

    def spines(self, plane: int) -> list[Router]:
        return [r for r in self.routers if r.plane == plane and r.tier == "spine"]

    def leaves(self, plane: int) -> list[Router]:
        return [r for r in self.routers if r.plane == plane and r.tier == "leaf"]

    def links_of(self, node: str) -> list[Link]:
        node = self.canonical(node)
        return [lk for lk in self.links if node in (lk.a, lk.b)]

    def link_between(self, x: str, y: str) -> Link:
        cx, cy = self.canonical(x), self.canonical(y)
        for lk in self.links:
            if {lk.a, lk.b} == {cx, cy}:
                return lk
        raise UsageError(f"no link between {x} and {y} in fabric {self.name!r}")

    # --- (de)serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Topology:
        if d.get("version") != FORMAT_VERSION:
            raise FabricError(f"unsupported topology format version {d.get('version')!r}")
        hosts = tuple(
            Host(
                name=h["name"],
                netns=h["netns"],
                index=h["index"],
                nics=tuple(HostNic(**n) for n in h["nics"]),
                container=h.get("container", ""),
            )
            for h in d["hosts"]
        )
        return cls(
            name=d["name"],
            planes=d["planes"],
            spines_per_plane=d["spines_per_plane"],
            leaves_per_plane=d["leaves_per_plane"],
            rate=d["rate"],
            mtu=d["mtu"],
            hosts=hosts,
            routers=tuple(Router(**r) for r in d["routers"]),
            links=tuple(Link(**lk) for lk in d["links"]),
            version=d["version"],
            created=d.get("created", 0.0),
            trim=bool(d.get("trim", False)),
            ecn_threshold=float(d.get("ecn_threshold", 0.0)),
            prio_band=bool(d.get("prio_band", False)),
            srv6=_srv6_mode(d.get("srv6", "srh")),
            host_image=d.get("host_image"),
            engine=d.get("engine", ""),
            share_dir=d.get("share_dir", ""),
        )

    def save(self, path: Path | None = None) -> Path:
        """Write atomically (tmp + rename) so readers never see half a file."""
        path = path or topology_path(self.name)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)
        return path


SRV6_MODES = ("usid", "srh")


def _srv6_mode(value: Any) -> str:
    if value not in SRV6_MODES:
        raise FabricError(f"unknown srv6 mode {value!r} (one of: {', '.join(SRV6_MODES)})")
    return str(value)


def load_topology(name_or_path: str | os.PathLike[str]) -> Topology:
    """Load a topology by fabric name (``mrc``) or by path to its JSON file."""
    text = os.fspath(name_or_path)
    path = Path(text) if ("/" in text or text.endswith(".json")) else topology_path(text)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FabricError(f"no fabric {text!r} (no topology file {path})") from None
    except (OSError, ValueError) as e:
        raise FabricError(f"cannot read topology {path}: {e}") from None
    try:
        return Topology.from_dict(data)
    except (KeyError, TypeError) as e:
        raise FabricError(f"malformed topology {path}: {e}") from None
