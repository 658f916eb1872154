"""The addressing and naming plan: one place that turns indices into names and addresses.

Plane ``p`` owns ``fd00:p::/32`` (``p`` written in hex).  Inside a plane the third hextet says
what a prefix is for, and the fourth which one::

    fd00:p:1:h::/64        link host h <-> its leaf        leaf ::1, host ::2
    fd00:p:2:LLSS::/64     link leaf LL <-> spine SS (hex) leaf ::1, spine ::2
    fd00:p:3:l::1/128      SID of leaf l   (on lo)
    fd00:p:4:s::1/128      SID of spine s  (on lo)

Distinct /32s per plane make it impossible for a packet to leak between planes (no plane has a
route to another's prefix), and reading any address tells you plane, tier and index at once.
MAC addresses are deterministic too (``02:kk:pp:xx:yy:ee``) so neighbour entries can be
installed statically instead of waiting for neighbour discovery.
"""

from __future__ import annotations

import ipaddress

PREFIX_HOST_LINKS = 1
PREFIX_LEAF_SPINE_LINKS = 2
PREFIX_LEAF_SIDS = 3
PREFIX_SPINE_SIDS = 4

KIND_HOST_LEAF = "host-leaf"
KIND_LEAF_SPINE = "leaf-spine"


def _addr(plane: int, purpose: int, index: int, iid: int) -> str:
    value = (0xFD00 << 112) | (plane << 96) | (purpose << 80) | (index << 64) | iid
    return str(ipaddress.IPv6Address(value))


# --- names -----------------------------------------------------------------------------------


def host_name(h: int) -> str:
    return f"h{h}"


def leaf_name(plane: int, leaf: int) -> str:
    return f"p{plane}l{leaf}"


def spine_name(plane: int, spine: int) -> str:
    return f"p{plane}s{spine}"


def netns_prefix(fabric: str) -> str:
    """Every namespace of fabric ``fabric`` starts with this (and nothing else of ours does)."""
    return f"mrc-{fabric}-"


def netns_name(fabric: str, node: str) -> str:
    return netns_prefix(fabric) + node


def host_nic(plane: int) -> str:
    """Interface name of a host's NIC in ``plane``."""
    return f"p{plane}"


def leaf_port_to_host(h: int) -> str:
    return f"h{h}"


def leaf_port_to_spine(s: int) -> str:
    return f"s{s}"


def spine_port_to_leaf(leaf: int) -> str:
    return f"l{leaf}"


# --- prefixes and addresses ------------------------------------------------------------------


def plane_prefix(plane: int) -> str:
    return f"{_addr(plane, 0, 0, 0)}/32"


def host_link_prefix(plane: int, h: int) -> str:
    return f"{_addr(plane, PREFIX_HOST_LINKS, h, 0)}/64"


def host_address(plane: int, h: int) -> str:
    """The host's NIC address in ``plane``; also the final segment of every SRv6 path to it."""
    return _addr(plane, PREFIX_HOST_LINKS, h, 2)


def host_gateway(plane: int, h: int) -> str:
    """The leaf's address on the link to host ``h``."""
    return _addr(plane, PREFIX_HOST_LINKS, h, 1)


def _ls_index(leaf: int, spine: int) -> int:
    return (leaf << 8) | spine


def leaf_spine_prefix(plane: int, leaf: int, spine: int) -> str:
    return f"{_addr(plane, PREFIX_LEAF_SPINE_LINKS, _ls_index(leaf, spine), 0)}/64"


def leaf_spine_leaf_addr(plane: int, leaf: int, spine: int) -> str:
    return _addr(plane, PREFIX_LEAF_SPINE_LINKS, _ls_index(leaf, spine), 1)


def leaf_spine_spine_addr(plane: int, leaf: int, spine: int) -> str:
    return _addr(plane, PREFIX_LEAF_SPINE_LINKS, _ls_index(leaf, spine), 2)


def leaf_sid(plane: int, leaf: int) -> str:
    return _addr(plane, PREFIX_LEAF_SIDS, leaf, 1)


def spine_sid(plane: int, spine: int) -> str:
    return _addr(plane, PREFIX_SPINE_SIDS, spine, 1)


def mac(kind: str, plane: int, x: int, y: int, end: int) -> str:
    """Deterministic locally administered MAC of one veth end (end 0 = side ``a``, 1 = ``b``)."""
    k = 1 if kind == KIND_HOST_LEAF else 2
    return f"02:{k:02x}:{plane:02x}:{x:02x}:{y:02x}:{end:02x}"
