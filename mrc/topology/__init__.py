"""What a fabric looks like, as data: hosts with one NIC per plane, leaves, spines and links.

Both the transport (to spread EVs over a fabric's SRv6 paths) and the namespace lab (to build
one) read it; nothing here touches the kernel. A topology comes from ``mrc-fabric up`` (saved
as JSON under ``/run/mrc``) or from a real network's file written by hand (docs/FABRIC.md).
"""

from .model import Host, HostNic, Link, Router, Topology, load_topology
from .realfile import load_fabric

__all__ = ["Host", "HostNic", "Link", "Router", "Topology", "load_fabric", "load_topology"]
