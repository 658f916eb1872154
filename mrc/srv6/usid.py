"""SRv6 micro-SIDs (uSIDs) as the MRC paper lays them out on a two-tier multi-plane fabric.

A path is one IPv6 destination address, the *container*: a 32-bit locator block followed by
16-bit uSIDs, one per switch on the path, in travel order::

    fcbb:bb00 : <source leaf> : <spine> : <destination leaf> : <downlink> ::

Every switch owns one uSID (a uN). On a packet whose destination starts with the block and
its own uSID, it shifts the rest of the address left by 16 bits (the kernel's seg6local End
with the ``next-csid`` flavour) and forwards on the new address by its static routes: a leaf
routes the spine's uSID up that uplink, a spine routes the destination leaf's uSID down to it,
and the last leaf routes the downlink uSID to the host on that port. The host owns the
downlink uSID of each of its NICs and decapsulates (End.DT6): MRC packets are IPv6-in-IPv6,
the outer header carries the container, the inner one the host's own address, so nothing on
the wire carries a routing header and the UDP checksum covers addresses that never change.

A uSID is ``kind << 14 | plane << 8 | index``: its top two bits say the tier (1 leaf, 2 spine,
3 a host's downlink), the next six the plane (the paper copies the plane into every uSID of
a path), the low eight the switch or port. So a uSID reads as hex: ``4101`` is leaf 1 of
plane 1, ``8100`` its plane's spine 0, ``c103`` host 3's port in plane 1.

The sending host picks the spine (the path) per socket: the fabric gives each host one
routing table per spine index, chosen by the socket's firewall mark (:func:`mark`), whose
routes encapsulate toward each other host over that spine (``seg6 mode encap.red``: with one
segment the kernel adds no routing header at all).

A real fabric numbers its switches its own way: its file (mrc.topology.realfile) gives every
router's uSID and every host NIC's, which :class:`UsidLayout` holds. Its hosts pick the table
by the socket's UDP *source port* instead of a mark (:mod:`mrc.srv6.hostroutes`): a process
binds a port without any privilege, where SO_MARK needs CAP_NET_ADMIN.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: The 32-bit locator block every container starts with (RFC 9800's F3216 format: 32-bit
#: block, 16-bit uSIDs, so up to six of them in one address).
BLOCK = 0xFCBB_BB00
BLOCK_PREFIX = "fcbb:bb00::/32"
BLOCK_BITS = 32
USID_BITS = 16
MAX_USIDS = (128 - BLOCK_BITS) // USID_BITS

KIND_LEAF = 1
KIND_SPINE = 2
KIND_DOWNLINK = 3

MAX_PLANE = 63
MAX_INDEX = 255

#: A socket's SO_MARK selects its spine: table ``TABLE_BASE + spine``. "MR" in the top half,
#: so the marks say whose they are next to any others on the host.
MARK_BASE = 0x4D52_0000
TABLE_BASE = 4000
#: The rules sit ahead of the main table's (32766) and anything a host had before.
RULE_PRIORITY = 1000


def usid(kind: int, plane: int, index: int) -> int:
    if not 0 <= plane <= MAX_PLANE or not 0 <= index <= MAX_INDEX:
        raise ValueError(f"uSID out of range: plane {plane}, index {index}")
    return kind << 14 | plane << 8 | index


def leaf_usid(plane: int, leaf: int) -> int:
    return usid(KIND_LEAF, plane, leaf)


def spine_usid(plane: int, spine: int) -> int:
    return usid(KIND_SPINE, plane, spine)


def downlink_usid(plane: int, host: int) -> int:
    return usid(KIND_DOWNLINK, plane, host)


def container(usids: Sequence[int], block: int = BLOCK) -> str:
    """The address carrying ``usids`` in travel order after the 32-bit ``block`` (at most
    six)."""
    if not 0 < len(usids) <= MAX_USIDS:
        raise ValueError(f"a container holds 1 to {MAX_USIDS} uSIDs, not {len(usids)}")
    value = block
    for u in usids:
        value = value << USID_BITS | u
    value <<= USID_BITS * (MAX_USIDS - len(usids))
    return str(ipaddress.IPv6Address(value))


def locator(u: int, block: int = BLOCK) -> str:
    """The /48 a switch (or a host's NIC) owns: the block and its uSID."""
    return f"{container([u], block)}/48"


def leaf_prefix(plane: int) -> str:
    """The /40 of every leaf uSID of ``plane``: where a host sends the containers it builds
    (they all start with its own leaf), through that plane's NIC."""
    return f"{container([usid(KIND_LEAF, plane, 0)])}/40"


def path_container(plane: int, src_leaf: int, spine: int, dst_leaf: int, dst_host: int) -> str:
    """Source leaf, spine, destination leaf, the destination's downlink: the whole path."""
    return container(
        [
            leaf_usid(plane, src_leaf),
            spine_usid(plane, spine),
            leaf_usid(plane, dst_leaf),
            downlink_usid(plane, dst_host),
        ]
    )


def mark(spine: int) -> int:
    """The SO_MARK of a socket whose packets turn at spine index ``spine`` (in its plane)."""
    return MARK_BASE + spine


def table(spine: int) -> int:
    return TABLE_BASE + spine


def shift(address: str) -> str:
    """``address`` after one switch consumed its uSID: what the kernel's next-csid End does,
    for tests and for reading captures."""
    value = int(ipaddress.IPv6Address(address))
    args_bits = 128 - BLOCK_BITS - USID_BITS
    args = value & ((1 << args_bits) - 1)
    block = value >> (128 - BLOCK_BITS)
    return str(ipaddress.IPv6Address(block << (128 - BLOCK_BITS) | args << USID_BITS))


#: A real fabric's hosts: the source ports their rules send into the spine tables, unless the
#: file says otherwise; above Linux's default ephemeral range (32768-60999), so the kernel
#: never hands an unrelated socket one of them. A rule's port range may not end at 65535
#: (the kernel refuses it: EINVAL, "Invalid sport range"), hence 65534.
DEFAULT_PORTS = (61000, 65534)
MAX_RULE_PORT = 65534


@dataclass(frozen=True)
class UsidLayout:
    """What a real fabric's file says about its micro-SIDs (mrc.topology.realfile): the block,
    each router's and each host NIC's uSID, and how the hosts pick a spine: per spine index
    ``s``, table ``table_base + s``, chosen by a source port in ``spine_ports[s]``."""

    block: int
    mtu: int
    spine_ports: tuple[tuple[int, int], ...]
    #: router name -> its uSID (leaves and spines)
    routers: Mapping[str, int] = field(hash=False)
    #: (host name, plane) -> the uSID of that NIC (the host decapsulates what ends with it)
    nics: Mapping[tuple[str, int], int] = field(hash=False)
    table_base: int = TABLE_BASE
    rule_priority: int = RULE_PRIORITY
    #: the file it was read from, for the messages that tell a user what to run
    source: str = ""

    def locator(self, u: int) -> str:
        return locator(u, self.block)

    def table(self, spine: int) -> int:
        return self.table_base + spine

    def path_container(
        self, plane: int, src_leaf: str, spine: str, dst_leaf: str, dst_host: str
    ) -> str:
        """Source leaf, spine, destination leaf, the destination NIC: the whole path."""
        r = self.routers
        return container(
            [r[src_leaf], r[spine], r[dst_leaf], self.nics[dst_host, plane]], self.block
        )
