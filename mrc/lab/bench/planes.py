"""A launched rank's plane addresses: from the NICs it is told to use, from addresses given
outright, or from a topology file that names this host.

Reading addresses needs no privileges (``/proc/net/if_inet6``), so an unprivileged rank can
find its planes. Plane p is the p-th NIC or address given, or the topology's plane p.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from mrc.errors import UsageError

IF_INET6 = "/proc/net/if_inet6"
_SCOPE_GLOBAL = 0x00
_IFA_F_TENTATIVE = 0x40
_IFA_F_DADFAILED = 0x08


@dataclass(frozen=True)
class Planes:
    """This rank's NIC (name, or "" when unknown) and address in each plane, in plane order;
    and the topology they came from, if any (MRC then takes its SRv6 paths)."""

    nics: tuple[str, ...]
    addrs: tuple[str, ...]
    topo: Any = None


def local_ipv6(path: str = IF_INET6) -> dict[str, list[str]]:
    """Usable global IPv6 addresses by interface, in the kernel's order."""
    out: dict[str, list[str]] = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) != 6:
            continue
        hexaddr, _idx, _plen, scope, flags, name = parts
        try:
            if int(scope, 16) != _SCOPE_GLOBAL or int(flags, 16) & (
                _IFA_F_TENTATIVE | _IFA_F_DADFAILED
            ):
                continue
            addr = str(ipaddress.IPv6Address(bytes.fromhex(hexaddr)))
        except ValueError:
            continue
        out.setdefault(name, []).append(addr)
    return out


def from_nics(names: list[str], path: str = IF_INET6) -> Planes:
    """Plane p is NIC ``names[p]``, at its first global IPv6 address."""
    have = local_ipv6(path)
    addrs = []
    for name in names:
        got = have.get(name)
        if not got:
            known = ", ".join(sorted(have)) or "none"
            raise UsageError(
                f"--nics: {name} has no global IPv6 address here (interfaces with one: {known})"
            )
        addrs.append(got[0])
    return Planes(tuple(names), tuple(addrs))


def from_addrs(addrs: list[str], path: str = IF_INET6) -> Planes:
    """Plane p is address ``addrs[p]``; each must be configured on this host."""
    by_addr = {a: nic for nic, al in local_ipv6(path).items() for a in al}
    nics, out = [], []
    for text in addrs:
        try:
            addr = str(ipaddress.ip_address(text.strip("[]")))
        except ValueError:
            raise UsageError(f"--addrs: {text!r} is not an IP address") from None
        if ":" in addr and addr not in by_addr:
            raise UsageError(f"--addrs: {addr} is not an address of this host")
        nics.append(by_addr.get(addr, ""))
        out.append(addr)
    return Planes(tuple(nics), tuple(out))


def from_topology(topo: Any) -> Planes:
    """The topology host this rank runs on (the one whose plane addresses are local, as
    ``mrc-send --fabric`` finds it), with the topology kept for SRv6 paths."""
    from mrc.cli.pathopts import local_plane_addrs

    addrs = local_plane_addrs(topo) or []
    host = next(h for h in topo.hosts if h.nics and h.nics[0].address == addrs[0])
    nics = sorted(host.nics, key=lambda n: n.plane)
    return Planes(tuple(n.nic for n in nics), tuple(addrs), topo)


def find(nics: list[str] | None, addrs: list[str] | None, fabric: str | None) -> Planes:
    """This rank's planes from exactly one of ``--nics``, ``--addrs``, ``--fabric``."""
    given = [n for n, v in (("--nics", nics), ("--addrs", addrs), ("--fabric", fabric)) if v]
    if len(given) != 1:
        raise UsageError(
            "a launched rank needs exactly one of --nics, --addrs, --fabric to find its planes"
            + (f" (got {' and '.join(given)})" if given else "")
        )
    if nics:
        return from_nics(nics)
    if addrs:
        return from_addrs(addrs)
    from mrc.cli.pathopts import load_fabric

    return from_topology(load_fabric(fabric))
