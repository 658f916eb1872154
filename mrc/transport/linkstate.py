"""The link state of this host's plane NICs, as the kernel reports it (rtnetlink).

MRC takes a plane out when its packets are lost: after a streak of losses, a timeout or SACK
evidence, a few round trips after the failure. When the failure is this host's own NIC (its
cable pulled, its switch port down, the interface set down) the kernel knows at once, and
says so on a netlink socket subscribed to link events (``RTMGRP_LINK``): a link is usable
while it is administratively up (``IFF_UP``) and has its carrier (``IFF_LOWER_UP``). The
transport (``Endpoint``) takes such a plane out of every QP that uses it at that moment
(``QueuePair.link_down``). A link that comes back is noticed the usual way, by the plane's
probes being answered again.

Only the kernel is believed: a message whose sender is not the kernel (netlink port 0) is
ignored. Where no netlink socket can be opened (a sandbox without it), nothing is watched and
failure is found by loss, as before; :meth:`LinkWatcher.open` returns None and says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable

_log = logging.getLogger("mrc.transport")

NETLINK_ROUTE = 0
RTMGRP_LINK = 1
RTM_NEWLINK = 16
RTM_DELLINK = 17
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
NLMSG_HDR = struct.Struct("=IHHII")  # length, type, flags, sequence, sender port
IFINFOMSG = struct.Struct("=BxHiII")  # family, (pad), device type, index, flags, change mask
_AF_NETLINK = getattr(socket, "AF_NETLINK", 16)


def parse_link_messages(data: bytes) -> list[tuple[int, bool]]:
    """(interface index, usable) for every link message in one netlink datagram, in order;
    a truncated or malformed message ends the parse (what came before it stands)."""
    out: list[tuple[int, bool]] = []
    off = 0
    n = len(data)
    while off + NLMSG_HDR.size <= n:
        length, kind, _flags, _seq, _port = NLMSG_HDR.unpack_from(data, off)
        if length < NLMSG_HDR.size or off + length > n:
            break
        if kind in (RTM_NEWLINK, RTM_DELLINK) and length >= NLMSG_HDR.size + IFINFOMSG.size:
            _family, _type, index, flags, _change = IFINFOMSG.unpack_from(
                data, off + NLMSG_HDR.size
            )
            usable = kind == RTM_NEWLINK and flags & IFF_UP != 0 and flags & IFF_LOWER_UP != 0
            out.append((index, usable))
        off += (length + 3) & ~3  # messages are 4-byte aligned
    return out


def interface_of(address: str) -> int | None:
    """The index of the interface that holds IPv6 ``address`` in this network namespace
    (``/proc/net/if_inet6``), or None (not IPv6, not local, or unreadable)."""
    try:
        wanted = socket.inet_pton(socket.AF_INET6, address.split("%")[0]).hex()
    except OSError:
        return None
    with contextlib.suppress(OSError), open("/proc/net/if_inet6") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == wanted:
                return int(parts[1], 16)
    return None


class LinkWatcher:
    """Calls ``on_change(index, usable)`` when the kernel reports that a link became
    unusable or usable again (once per change, not per message)."""

    def __init__(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        on_change: Callable[[int, bool], None],
    ) -> None:
        self._sock = sock
        self._loop = loop
        self._on_change = on_change
        self._usable: dict[int, bool] = {}
        self.ignored = 0  # messages not from the kernel
        loop.add_reader(sock.fileno(), self._readable)

    @classmethod
    def open(
        cls, loop: asyncio.AbstractEventLoop, on_change: Callable[[int, bool], None]
    ) -> LinkWatcher | None:
        """A watcher, or None where link events cannot be had here (logged once, -v)."""
        try:
            sock = socket.socket(_AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, NETLINK_ROUTE)
        except (OSError, AttributeError) as exc:
            _log.info(
                "link state is not watched (%s): a plane's NIC going down is found by loss", exc
            )
            return None
        try:
            sock.bind((0, RTMGRP_LINK))
        except OSError as exc:
            sock.close()
            _log.info(
                "link state is not watched (%s): a plane's NIC going down is found by loss", exc
            )
            return None
        return cls(sock, loop, on_change)

    def _readable(self) -> None:
        while True:
            try:
                data, sender = self._sock.recvfrom(1 << 16)
            except BlockingIOError:
                return
            except OSError:  # ENOBUFS: the kernel dropped events; the next ones still count
                continue
            if sender[0] != 0:
                self.ignored += 1
                continue
            for index, usable in parse_link_messages(data):
                if self._usable.get(index, True) != usable:
                    self._usable[index] = usable
                    self._on_change(index, usable)

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()


def plane_interfaces(planes: list[int], sockets: list[socket.socket]) -> dict[int, list[int]]:
    """Interface index -> the planes on it, for the EV sockets of one QP (EV i on
    ``planes[i]``, bound to its plane's local address): the interfaces whose link state
    decides a plane. One lookup per plane, not per EV: a plane's EVs share its address."""
    out: dict[int, list[int]] = {}
    looked: set[int] = set()
    for plane, sock in zip(planes, sockets, strict=False):
        if plane in looked or sock.family != socket.AF_INET6:
            continue
        looked.add(plane)
        try:
            address = sock.getsockname()[0]
        except OSError:
            continue
        index = interface_of(address)
        if index is not None:
            out.setdefault(index, []).append(plane)
    return out


class PlaneLinks:
    """Which QP uses which interface for which plane, and the watcher that reports their
    link state (opened with the first QP of more than one plane: a single plane has nowhere
    else to go, and its failure is found by loss as ever). ``on_down(qpn, plane, index)`` is
    called for every QP plane whose interface lost its link."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_down: Callable[[int, int, int], None]
    ) -> None:
        self._loop = loop
        self._on_down = on_down
        self._by_index: dict[int, dict[int, list[int]]] = {}  # interface -> {qpn: planes}
        self._watcher: LinkWatcher | None = None
        self._tried = False

    def add(self, qpn: int, interfaces: dict[int, list[int]]) -> None:
        """Watch ``interfaces`` (:func:`plane_interfaces`) for QP ``qpn``."""
        if not interfaces:
            return
        if not self._tried:
            self._tried = True
            self._watcher = LinkWatcher.open(self._loop, self._changed)
        if self._watcher is None:
            return
        for index, planes in interfaces.items():
            self._by_index.setdefault(index, {})[qpn] = planes

    def remove(self, qpn: int) -> None:
        for users in self._by_index.values():
            users.pop(qpn, None)

    def _changed(self, index: int, usable: bool) -> None:
        users = self._by_index.get(index)
        if not users:
            return
        if usable:
            _log.info(
                "%s has its link again: its planes return once their probes answer",
                _name_of(index),
            )
            return
        for qpn, planes in list(users.items()):
            for plane in planes:
                self._on_down(qpn, plane, index)

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        self._by_index.clear()


def _name_of(index: int) -> str:
    try:
        return f"interface {socket.if_indextoname(index)}"
    except OSError:
        return f"interface #{index}"
