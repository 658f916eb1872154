"""Packet trimming on the fabric's routers: ``mrc-fabric up --trim`` (docs/FABRIC.md, "Trimming").

A tc eBPF program (``mrc_trim.bpf.c``) on every router *ingress* port keeps a virtual queue per
egress port, drained at the port's tbf rate with a byte limit below tbf's; a packet that would
overflow it, if it is an MRC data packet, is cut to its headers (BTH + RETH [+ ImmDt]),
re-checksummed and marked TRIMMED (+ LASTHOP on a port into the destination host).  tbf still
does the real shaping, and tail-drops what is not trimmed.

* :func:`prepare` checks the tools and compiles the object (cached), before a fabric is built;
* :func:`install` loads it once per router, pins it in bpffs, configures and attaches it;
* :func:`read_router` reads one router's counters; :func:`remove_pins` unpins a fabric.
"""

from ..shaping import VQ_FRACTION
from .install import install, prepare, read_router, unavailable_reason
from .maps import (
    PortConfig,
    fabric_pin_dir,
    pinned_fabrics,
    port_config,
    remove_pins,
    router_pin_dir,
)

__all__ = [
    "VQ_FRACTION",
    "PortConfig",
    "fabric_pin_dir",
    "install",
    "pinned_fabrics",
    "port_config",
    "prepare",
    "read_router",
    "remove_pins",
    "router_pin_dir",
    "unavailable_reason",
]
