"""A QP's line rate from what the host can know (issue 39): the speed of the NIC that owns each
plane's local address (``/sys/class/net/DEV/speed``) or, given an mrc-fabric topology, the rate
of that address's host-leaf link. Only hardware has a line rate: a virtual device with no NIC
below it is unknown (a veth reports a fixed 10000 Mbit/s however fast it moves, loopback
nothing), while a VLAN or a bond says what its lower NICs do. The sum over the planes becomes
``QPConfig.line_rate_bps``, with which UET's NSCC bounds its window at 1.5 x the
bandwidth-delay product (mrc/core/cc/uet.py); None where any plane's rate is unknown (a
virtual device, or a link that is down, reports -1 or nothing), and the law is then as before.

Stdlib only, and only files: ``/proc/net/if_inet6`` names the device of an IPv6 address,
``/proc/net/route`` (the device's connected routes) that of an IPv4 one. The roots are
parameters, for tests.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mrc.core.config import QPConfig
    from mrc.topology.model import Topology

SYS = Path("/sys")
PROC = Path("/proc")


def nic_speed_bps(dev: str, sys_root: Path = SYS) -> float | None:
    """``dev``'s link speed, bits/s, from ``sys_root/class/net/dev/speed`` (Mbit/s); None if
    missing, unreadable, not positive (-1: unknown, as links that are down say), or not a
    line rate (:func:`has_hardware`)."""
    node = sys_root / "class" / "net" / dev
    try:
        mbit = int((node / "speed").read_text().strip())
        hardware = has_hardware(node)
    except (OSError, ValueError):
        return None
    return mbit * 1e6 if mbit > 0 and hardware else None


def has_hardware(node: Path) -> bool:
    """Whether a NIC stands behind the interface at ``node`` (``/sys/class/net/DEV``): its own
    ``device`` link, or a ``lower_*`` link to one it rides (VLAN, bond, macvlan). A veth has
    neither, and its driver reports a constant 10 Gbit/s whatever it carries (kernel TCP
    moves about 27 Gbit/s over one here): a window bounded by it held one QP to half of what
    the same QP moved unbounded (docs/PERFORMANCE.md)."""
    if (node / "device").exists():
        return True
    return any(entry.name.startswith("lower_") for entry in node.iterdir())


def device_of(address: str, proc_root: Path = PROC) -> str | None:
    """The name of the interface that owns local ``address``, or None."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None
    try:
        if ip.version == 6:
            return _device_v6(ip.packed.hex(), proc_root / "net" / "if_inet6")
        return _device_v4(int(ip), proc_root / "net" / "route")
    except OSError:
        return None


def _device_v6(hexaddr: str, path: Path) -> str | None:
    # "fe800000000000000000000000000001 02 40 20 80 eth0": address, ifindex, prefix, scope,
    # flags, name
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[0].lower() == hexaddr:
            return fields[5]
    return None


def _device_v4(ip: int, path: Path) -> str | None:
    # "Iface Destination Gateway Flags RefCnt Use Metric Mask ...", the addresses in hex of
    # host byte order: the device of the most specific connected route (no gateway) holding ip
    best: tuple[int, str] | None = None
    for line in path.read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dest, gateway, mask = (_hex_v4(fields[i]) for i in (1, 2, 7))
        except ValueError:
            continue
        if gateway == 0 and mask and ip & mask == dest & mask:
            bits = bin(mask).count("1")
            if best is None or bits > best[0]:
                best = (bits, fields[0])
    return best[1] if best else None


def _hex_v4(text: str) -> int:
    return int.from_bytes(struct.pack("=I", int(text, 16)), "big")


def topology_rate_bps(address: str, topology: Topology) -> float | None:
    """The rate of the host-leaf link whose host end is ``address`` in ``topology``."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None
    for link in topology.links:
        if link.kind != "host-leaf" or not link.rate_bps:
            continue
        try:
            if ipaddress.ip_address(link.a_address.split("/")[0]) == ip:
                return float(link.rate_bps)
        except ValueError:
            continue
    return None


def line_rate_bps(
    local_addrs: Sequence[str],
    topology: Topology | None = None,
    sys_root: Path = SYS,
    proc_root: Path = PROC,
) -> float | None:
    """The sum over the planes' local addresses of each one's rate: the topology's link rate
    where given (a shaped veth's NIC speed says nothing), else its NIC's speed. None if any
    is unknown, or there are none."""
    total = 0.0
    for addr in local_addrs:
        rate = topology_rate_bps(addr, topology) if topology is not None else None
        if rate is None:
            dev = device_of(addr, proc_root)
            rate = nic_speed_bps(dev, sys_root) if dev and dev != "lo" else None
        if rate is None:
            return None
        total += rate
    return total or None


def with_line_rate(
    cfg: QPConfig, local_addrs: Sequence[str], topology: Topology | None = None
) -> QPConfig:
    """``cfg`` with ``line_rate_bps`` filled in from ``local_addrs`` (a QP's planes), a copy;
    ``cfg`` itself where the user set it or a plane's rate is unknown."""
    if cfg.line_rate_bps is not None:
        return cfg
    rate = line_rate_bps(local_addrs, topology)
    return cfg if rate is None else dataclasses.replace(cfg, line_rate_bps=rate)
