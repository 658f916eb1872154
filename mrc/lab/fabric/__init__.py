"""Multi-plane two-tier SRv6 fabrics of Linux routers in network namespaces.

Quick use (errors: :class:`mrc.errors.FabricError`, and :class:`mrc.errors.UsageError` for
a bad spec or node name)::

    from mrc.lab.fabric import Fabric, FabricSpec, load_topology
    topo = Fabric.up(FabricSpec(name="demo", planes=2))
    ...
    Fabric.down("demo")

See docs/FABRIC.md for the topology, the addressing plan and the JSON format.
"""

from mrc.errors import FabricError
from mrc.topology import Host, HostNic, Link, Router, Topology, load_topology
from mrc.units import parse_rate

from .facade import Fabric
from .plan import plan
from .spec import FabricSpec

__all__ = [
    "Fabric",
    "FabricError",
    "FabricSpec",
    "Host",
    "HostNic",
    "Link",
    "Router",
    "Topology",
    "load_topology",
    "parse_rate",
    "plan",
]
