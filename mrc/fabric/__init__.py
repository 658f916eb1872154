"""Multi-plane two-tier SRv6 fabrics of Linux routers in network namespaces.

Quick use::

    from mrc.fabric import Fabric, FabricSpec, load_topology
    topo = Fabric.up(FabricSpec(name="demo", planes=2))
    ...
    Fabric.down("demo")

See docs/FABRIC.md for the topology, the addressing plan and the JSON format.
"""

from .errors import FabricError, SpecError
from .facade import Fabric
from .spec import FabricSpec, parse_rate
from .topology import Host, HostNic, Link, Router, Topology, load_topology, plan

__all__ = [
    "Fabric",
    "FabricError",
    "FabricSpec",
    "Host",
    "HostNic",
    "Link",
    "Router",
    "SpecError",
    "Topology",
    "load_topology",
    "parse_rate",
    "plan",
]
