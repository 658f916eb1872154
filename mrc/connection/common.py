"""The asyncio plumbing both ends of a set-up share: addresses, QP numbers, the side channel."""

from __future__ import annotations

import ipaddress
import logging
import secrets
import socket
from typing import TYPE_CHECKING

from mrc.core.endpoint import EndpointCore
from mrc.core.memory import MemoryRegion, ProtectionDomain
from mrc.errors import MRCError
from mrc.transport.control import ControlChannel
from mrc.transport.sidechannel import (
    SideChannel,
    tune_path,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


def resolve(host: str) -> str:
    """A literal address for ``host`` (IPv6 preferred)."""
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise MRCError(f"cannot resolve {host!r}: {exc.strerror}") from None
    infos.sort(key=lambda i: 0 if i[0] == socket.AF_INET6 else 1)
    return str(infos[0][4][0])


def new_qpn(core: EndpointCore) -> int:
    while True:
        qpn = secrets.randbits(24)
        if qpn and qpn not in core.qps:
            return qpn


def adopt(pd: ProtectionDomain, region: MemoryRegion) -> None:
    """Make ``region`` (registered elsewhere, e.g. on a ProtectionDomain of the caller's)
    writable through ``pd`` under the same rkey and address, so what the peer is told holds."""
    try:
        pd.adopt(region)
    except ValueError as exc:
        raise MRCError(str(exc)) from None


def _primary_plane(pairs: list[tuple[str, str]], control: ControlChannel) -> int | None:
    """Which plane pair the set-up's TCP connection runs over (None: none of them)."""
    writer = control.writer
    here, there = writer.get_extra_info("sockname"), writer.get_extra_info("peername")
    if not here or not there:
        return None
    for i, (local, remote) in enumerate(pairs):
        if _same_addr(local, here[0]) and _same_addr(remote, there[0]):
            return i
    return None


def _same_addr(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a.split("%")[0]) == ipaddress.ip_address(b.split("%")[0])
    except ValueError:
        return a == b


def side_channel(control: ControlChannel, pairs: list[tuple[str, str]]) -> SideChannel:
    """The side channel over ``control`` and, later, a path per further plane of ``pairs``
    (their addresses name each plane in what is said about it)."""

    def describe(plane: int) -> str:
        if 0 <= plane < len(pairs):
            local, remote = pairs[plane]
            return f"plane {plane} ([{local}] -> [{remote}])"
        return f"the set-up's connection ([{control.peer_host}])"

    if len(pairs) > 1:
        tune_path(control.writer)
    return SideChannel(control, _primary_plane(pairs, control), describe)
