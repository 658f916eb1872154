"""Real fabrics described by hand: the file ``--fabric FILE`` reads when the routers are real.

mrc-fabric writes a topology for the namespaces it builds (:mod:`mrc.topology.model`); a user
whose planes are real SRv6 routers writes a much smaller file saying only what spraying needs
(docs/FABRIC.md, "Real networks"): per plane, the SID of every spine, and per host, its address
in every plane. A path is then ``[spine SID, destination address]``, exactly as on the namespace
fabric, so this module turns such a file into the same :class:`Topology` the rest of mrc reads
(no namespaces, no links, no leaves) and send and receive code stays one path.

A file may instead describe a uSID fabric (``"srv6": "usid"``): then it also gives the locator
block, every leaf's and spine's micro-SID, and per host NIC its own micro-SID, its leaf, its
interface and next hop, which is what a host needs to build each path's container
(:class:`mrc.srv6.usid.UsidLayout`) and what ``mrc-host-setup`` turns into the host's
encapsulation routes (:mod:`mrc.srv6.hostroutes`).

Everything in the file is checked before anything is used: every mistake is one
:class:`~mrc.errors.UsageError` naming the file, the field (``hosts[1].nics[0].address``) and
the problem, because the user can only fix what the message points at.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from mrc.errors import UsageError
from mrc.srv6 import usid as us

from .model import Host, HostNic, Router, Topology, load_topology

#: The only version of this format; a file may say so with ``"version": 1``.
REAL_FORMAT_VERSION = 1
#: A fabric file is a few kilobytes; anything this big is the wrong file.
MAX_FILE_BYTES = 4 << 20
#: Names appear in --to, --deny and EV reports: keep them to what a shell passes unquoted.
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

_TOP_KEYS = {"version": False, "name": True, "srv6": False, "planes": True, "hosts": True}
_PLANE_KEYS = {"plane": True, "spines": True}
_SPINE_KEYS = {"name": True, "sid": True}
_HOST_KEYS = {"name": True, "nics": True}
_NIC_KEYS = {"plane": True, "address": True}
# a uSID fabric's: its "usid" object, and what its planes, routers and NICs say
_USID_TOP_KEYS = {**_TOP_KEYS, "usid": True}
_USID_KEYS = {"block": True, "mtu": True, "ports": False, "table": False, "priority": False}
_USID_PLANE_KEYS = {"plane": True, "leaves": True, "spines": True}
_USID_ROUTER_KEYS = {"name": True, "usid": True}
_USID_NIC_KEYS = {
    "plane": True,
    "address": True,
    "leaf": True,
    "usid": True,
    "dev": True,
    "gateway": True,
}
#: A micro-SID as it reads in an address: 1-4 hex digits (0 ends a container, so never 0).
USID_RE = re.compile(r"^[0-9A-Fa-f]{1,4}$")
#: What Linux accepts as an interface name (dev_valid_name), less what a shell would mangle.
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,15}$")
#: Tables 253-255 are the kernel's (default, main, local), and those below are often taken.
MIN_TABLE = 256
MAX_TABLE = (1 << 31) - 1
#: The rule must come after the local table's (0) and before the main table's (32766).
MAX_PRIORITY = 32765


@dataclass(frozen=True)
class UsidTopology(Topology):
    """A real fabric file with ``"srv6": "usid"``: the topology (leaves included, so a path's
    container can name them) and its micro-SIDs."""

    layout: us.UsidLayout = field(kw_only=True)


def is_path(text: str) -> bool:
    """``--fabric`` names a file (rather than a running mrc-fabric) when it looks like one."""
    return "/" in text or text.endswith(".json")


def load_fabric(name_or_path: str) -> Topology:
    """What ``--fabric NAME|FILE`` names: a running mrc-fabric by name, or a file holding either
    an mrc-fabric topology or a real-fabric description (told apart by content)."""
    if not is_path(name_or_path):
        return load_topology(name_or_path)
    where = f"fabric file {name_or_path}"
    doc = _read_json(name_or_path, where)
    if isinstance(doc, dict) and isinstance(doc.get("planes"), list):
        return parse_real_fabric(doc, where)
    if isinstance(doc, dict) and "routers" in doc and "links" in doc:
        try:
            return Topology.from_dict(doc)
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{where}: malformed mrc-fabric topology: {exc}") from None
    raise UsageError(
        f"{where}: neither a real-fabric description (an object with a list of 'planes' and "
        f"'hosts', docs/FABRIC.md) nor an mrc-fabric topology"
    )


def _read_json(path: str, where: str) -> Any:
    """The parsed file; a missing file, a directory, a FIFO, a dangling or looping symlink, a
    huge file, bad UTF-8 or bad JSON are each one line (never a hang: opened non-blocking and
    read only if it is a regular file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"{where}: cannot open: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{where}: not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise UsageError(f"{where}: {st.st_size} bytes, more than a fabric file can be")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{where}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not UTF-8 text") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{where}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except _DuplicateKey as exc:
        raise UsageError(f"{where}: not JSON we accept: key {exc.key!r} given twice") from None


class _DuplicateKey(UsageError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON allows a key twice (the last wins); in a file written by hand it is a mistake."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _Checker:
    """One-line errors that name the file and the field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, problem: str) -> NoReturn:
        raise UsageError(f"{self.where}: {field}: {problem}")

    def obj(self, value: Any, field: str, keys: dict[str, bool]) -> dict[str, Any]:
        """``value`` must be an object with only ``keys`` (True: required)."""
        if not isinstance(value, dict):
            self.fail(field, f"must be an object, not {_kind(value)}")
        for key in value:
            if key not in keys:
                known = ", ".join(repr(k) for k in keys)
                self.fail(field, f"unknown key {key!r} (known: {known})")
        for key, required in keys.items():
            if required and key not in value:
                self.fail(field, f"missing key {key!r}")
        return value

    def items(self, value: Any, field: str) -> list[Any]:
        if not isinstance(value, list):
            self.fail(field, f"must be a list, not {_kind(value)}")
        if not value:
            self.fail(field, "must not be empty")
        return value

    def name(self, value: Any, field: str) -> str:
        if not isinstance(value, str):
            self.fail(field, f"must be a string, not {_kind(value)}")
        if not NAME_RE.match(value):
            self.fail(field, f"{value!r}: use 1-64 letters, digits, '_', '.' or '-'")
        return value

    def plane(self, value: Any, field: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(field, f"must be an integer, not {_kind(value)}")
        if value < 0:
            self.fail(field, f"must be 0 or more, not {value}")
        return value

    def address(self, value: Any, field: str, link_local: bool = False) -> str:
        """A global or unique-local unicast IPv6 address, returned in canonical form
        (``link_local``: a next hop on a named interface, which may be link-local too)."""
        if not isinstance(value, str):
            self.fail(field, f"must be a string (an IPv6 address), not {_kind(value)}")
        try:
            addr = ipaddress.IPv6Address(value)
        except ValueError:
            self.fail(field, f"{value!r} is not an IPv6 address")
        if addr.scope_id is not None:
            if link_local:
                self.fail(field, f"{value!r} has a scope; 'dev' says the interface")
            self.fail(field, f"{value!r} has a scope; give an address routed in the fabric")
        for bad, what in (
            (addr.is_unspecified, "the unspecified address"),
            (addr.is_loopback, "the loopback address"),
            (addr.is_multicast, "a multicast address"),
            (addr.is_link_local and not link_local, "a link-local address"),
            (addr.ipv4_mapped is not None, "an IPv4-mapped address"),
        ):
            if bad:
                give = "the next hop's" if link_local else "a"
                routed = "" if link_local else " routed in the fabric"
                self.fail(field, f"{value} is {what}; give {give} unicast address{routed}")
        return addr.compressed

    def integer(self, value: Any, field: str, low: int, high: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(field, f"must be an integer, not {_kind(value)}")
        if not low <= value <= high:
            self.fail(field, f"must be {low} to {high}, not {value}")
        return value

    def usid(self, value: Any, field: str) -> int:
        """A micro-SID, written as it reads in an address: ``"8101"``."""
        if not isinstance(value, str):
            self.fail(field, f'must be a string of 1-4 hex digits ("8101"), not {_kind(value)}')
        if not USID_RE.match(value) or int(value, 16) == 0:
            self.fail(field, f'{value!r} is not a micro-SID: 1-4 hex digits, not 0 ("8101")')
        return int(value, 16)

    def ifname(self, value: Any, field: str) -> str:
        if not isinstance(value, str):
            self.fail(field, f"must be a string (an interface name), not {_kind(value)}")
        if not IFNAME_RE.match(value) or value in (".", ".."):
            self.fail(field, f"{value!r} is not an interface name (1-15 letters, digits, '_.+-')")
        return value


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true/false"}
    if value is None:
        return "null"
    return names.get(type(value), "a number" if isinstance(value, int | float) else "a value")


def parse_real_fabric(doc: Any, where: str = "fabric file") -> Topology:
    """Check a real-fabric description (already parsed JSON) and return it as a Topology:
    spines only (tier "spine", no namespace), hosts with one NIC per plane (no namespace, no
    interface names, no leaf), no links, no rate (the window stays the sender's default). A
    uSID fabric's file (``"srv6": "usid"``) becomes a :class:`UsidTopology`: leaves too, and
    per NIC its interface, next hop and leaf."""
    c = _Checker(where)
    # which routes its routers take, SRHs of End SIDs (the default) or uSID containers, says
    # which keys the file may have: read first, checked once the keys are
    mode = doc.get("srv6", "srh") if isinstance(doc, dict) else "srh"
    if mode not in ("srh", "usid"):
        c.fail("srv6", f"{mode!r}: one of 'srh' (the default) or 'usid'")
    top = c.obj(doc, "top level", _USID_TOP_KEYS if mode == "usid" else _TOP_KEYS)
    if "version" in top and top["version"] != REAL_FORMAT_VERSION:
        c.fail("version", f"{top['version']!r}: this mrc reads version {REAL_FORMAT_VERSION}")
    fabric_name = c.name(top["name"], "name")
    if mode == "usid":
        return _parse_usid(c, top, fabric_name, where)

    claim = _Claims(c)  # names unique among hosts and spines, addresses among NICs and SIDs

    spines_of: dict[int, list[Router]] = {}
    for i, item in enumerate(c.items(top["planes"], "planes")):
        field = f"planes[{i}]"
        plane_doc = c.obj(item, field, _PLANE_KEYS)
        plane = c.plane(plane_doc["plane"], f"{field}.plane")
        if plane in spines_of:
            c.fail(f"{field}.plane", f"plane {plane} is described twice")
        routers = []
        for j, spine_item in enumerate(c.items(plane_doc["spines"], f"{field}.spines")):
            sfield = f"{field}.spines[{j}]"
            spine = c.obj(spine_item, sfield, _SPINE_KEYS)
            name = c.name(spine["name"], f"{sfield}.name")
            claim("name", name, f"{sfield}.name")
            sid = c.address(spine["sid"], f"{sfield}.sid")
            claim("address", sid, f"{sfield}.sid")
            routers.append(Router(name, "", plane, "spine", j, sid))
        spines_of[plane] = routers
    nplanes = len(spines_of)
    missing = sorted(set(range(nplanes)) - set(spines_of))
    if missing:
        c.fail("planes", f"plane numbers must be 0..{nplanes - 1}; plane {missing[0]} is missing")

    def nic_of(doc: dict[str, Any], field: str, host: str, plane: int) -> HostNic:
        address = c.address(doc["address"], f"{field}.address")
        claim("address", address, f"{field}.address")
        return HostNic(plane, "", address, "", "", "", "")

    hosts = _hosts(c, top, _NIC_KEYS, nplanes, claim, nic_of)

    return Topology(
        name=fabric_name,
        planes=nplanes,
        spines_per_plane=max(len(r) for r in spines_of.values()),
        leaves_per_plane=0,
        rate=None,
        mtu=0,
        hosts=tuple(hosts),
        routers=tuple(r for p in range(nplanes) for r in spines_of[p]),
        links=(),
    )


def _parse_usid(c: _Checker, top: dict[str, Any], fabric_name: str, where: str) -> UsidTopology:
    """A uSID fabric: per plane its leaves and spines with their micro-SIDs, per host NIC
    its micro-SID, leaf, interface and next hop; checked like the rest, one line per
    mistake. Every micro-SID is unique in the fabric: a host routes each leaf's locator out of
    one NIC and decapsulates its own NICs', so two planes cannot share one either."""
    u = c.obj(top["usid"], "usid", _USID_KEYS)
    block, block_net = _block(c, u["block"], "usid.block")
    mtu = c.integer(u["mtu"], "usid.mtu", 1280, 65535)
    table = c.integer(u.get("table", us.TABLE_BASE), "usid.table", MIN_TABLE, MAX_TABLE)
    priority = c.integer(u.get("priority", us.RULE_PRIORITY), "usid.priority", 1, MAX_PRIORITY)

    claim = _Claims(c)

    usids: dict[str, int] = {}
    leaves_of: dict[int, list[Router]] = {}
    spines_of: dict[int, list[Router]] = {}
    for i, item in enumerate(c.items(top["planes"], "planes")):
        field = f"planes[{i}]"
        plane_doc = c.obj(item, field, _USID_PLANE_KEYS)
        plane = c.plane(plane_doc["plane"], f"{field}.plane")
        if plane in spines_of:
            c.fail(f"{field}.plane", f"plane {plane} is described twice")
        for tier, key, store in (("leaf", "leaves", leaves_of), ("spine", "spines", spines_of)):
            tfield = f"{field}.{key}"
            routers = []
            for j, router_item in enumerate(c.items(plane_doc[key], tfield)):
                rfield = f"{tfield}[{j}]"
                router = c.obj(router_item, rfield, _USID_ROUTER_KEYS)
                name = c.name(router["name"], f"{rfield}.name")
                claim("name", name, f"{rfield}.name")
                sid = c.usid(router["usid"], f"{rfield}.usid")
                claim("micro-SID", sid, f"{rfield}.usid", f"{sid:x}")
                usids[name] = sid
                routers.append(Router(name, "", plane, tier, j, us.container([sid], block)))
            store[plane] = routers
    nplanes = len(spines_of)
    missing = sorted(set(range(nplanes)) - set(spines_of))
    if missing:
        c.fail("planes", f"plane numbers must be 0..{nplanes - 1}; plane {missing[0]} is missing")
    nspines = max(len(r) for r in spines_of.values())
    ports = _spine_ports(c, u.get("ports"), nspines, nplanes)

    nic_usids: dict[tuple[str, int], int] = {}

    def nic_of(doc: dict[str, Any], nfield: str, name: str, plane: int) -> HostNic:
        address = c.address(doc["address"], f"{nfield}.address")
        if ipaddress.IPv6Address(address) in block_net:
            c.fail(
                f"{nfield}.address",
                f"{address} is inside the uSID block {block_net}: give the NIC's own address",
            )
        claim("address", address, f"{nfield}.address")
        leaf = doc["leaf"]
        leaves = [r.name for r in leaves_of[plane]]
        if not isinstance(leaf, str):
            c.fail(f"{nfield}.leaf", f"must be a string (a leaf's name), not {_kind(leaf)}")
        if leaf not in leaves:
            c.fail(
                f"{nfield}.leaf",
                f"{leaf!r} is not a leaf of plane {plane} ({', '.join(leaves)})",
            )
        sid = c.usid(doc["usid"], f"{nfield}.usid")
        claim("micro-SID", sid, f"{nfield}.usid", f"{sid:x}")
        nic_usids[name, plane] = sid
        dev = c.ifname(doc["dev"], f"{nfield}.dev")
        gateway = c.address(doc["gateway"], f"{nfield}.gateway", link_local=True)
        return HostNic(plane, dev, address, "", gateway, leaf, "")

    hosts = _hosts(c, top, _USID_NIC_KEYS, nplanes, claim, nic_of)

    layout = us.UsidLayout(
        block=block,
        mtu=mtu,
        spine_ports=ports,
        routers=usids,
        nics=nic_usids,
        table_base=table,
        rule_priority=priority,
        source=where.removeprefix("fabric file "),
    )
    return UsidTopology(
        name=fabric_name,
        planes=nplanes,
        spines_per_plane=nspines,
        leaves_per_plane=max(len(r) for r in leaves_of.values()),
        rate=None,
        mtu=mtu,
        hosts=tuple(hosts),
        routers=tuple(r for p in range(nplanes) for r in (*leaves_of[p], *spines_of[p])),
        links=(),
        srv6="usid",
        layout=layout,
    )


class _Claims:
    """What must be unique in a file (names among hosts and routers, addresses, micro-SIDs),
    and the field that first used each: a second use is one line naming both."""

    def __init__(self, c: _Checker) -> None:
        self._c = c
        self._owner: dict[tuple[str, object], str] = {}

    def __call__(self, kind: str, value: object, field: str, shown: str | None = None) -> None:
        if (kind, value) in self._owner:
            what = shown if shown is not None else value
            self._c.fail(field, f"{kind} {what} is already {self._owner[kind, value]}")
        self._owner[kind, value] = field


def _hosts(
    c: _Checker,
    top: dict[str, Any],
    nic_keys: dict[str, bool],
    nplanes: int,
    claim: _Claims,
    nic_of: Callable[[dict[str, Any], str, str, int], HostNic],
) -> list[Host]:
    """Every host of the file, with exactly one NIC per plane; ``nic_of(doc, field, host,
    plane)`` checks the rest of a NIC (its keys are ``nic_keys``) and makes it."""
    hosts = []
    for i, item in enumerate(c.items(top["hosts"], "hosts")):
        field = f"hosts[{i}]"
        host_doc = c.obj(item, field, _HOST_KEYS)
        name = c.name(host_doc["name"], f"{field}.name")
        claim("name", name, f"{field}.name")
        nics: dict[int, HostNic] = {}
        for j, nic_item in enumerate(c.items(host_doc["nics"], f"{field}.nics")):
            nfield = f"{field}.nics[{j}]"
            nic_doc = c.obj(nic_item, nfield, nic_keys)
            plane = c.plane(nic_doc["plane"], f"{nfield}.plane")
            if not 0 <= plane < nplanes:
                c.fail(f"{nfield}.plane", f"no plane {plane} (planes are 0..{nplanes - 1})")
            if plane in nics:
                c.fail(f"{nfield}.plane", f"host {name} has two NICs in plane {plane}")
            nics[plane] = nic_of(nic_doc, nfield, name, plane)
        for plane in range(nplanes):
            if plane not in nics:
                c.fail(f"{field}.nics", f"host {name} has no NIC in plane {plane}")
        hosts.append(Host(name, "", i, tuple(nics[p] for p in range(nplanes))))
    return hosts


def _block(c: _Checker, value: Any, field: str) -> tuple[int, ipaddress.IPv6Network]:
    """The locator block: a /32 (RFC 9800's F3216 format, the one mrc builds containers in:
    a 32-bit block and 16-bit micro-SIDs)."""
    if not isinstance(value, str):
        c.fail(
            field, f"must be a string (an IPv6 prefix such as fcbb:bb00::/32), not {_kind(value)}"
        )
    try:
        net = ipaddress.IPv6Network(value)
    except ValueError as exc:
        if "has host bits set" in str(exc):
            c.fail(field, f"{value!r} has bits set after its prefix length")
        c.fail(field, f"{value!r} is not an IPv6 prefix such as fcbb:bb00::/32")
    if net.prefixlen != us.BLOCK_BITS:
        c.fail(
            field,
            f"{value!r}: the block must be a /{us.BLOCK_BITS} (F3216: a 32-bit block, 16-bit"
            " micro-SIDs)",
        )
    if net.is_multicast or net.is_link_local or net.is_loopback:
        c.fail(field, f"{value!r} is not a unicast prefix")
    return int(net.network_address) >> (128 - us.BLOCK_BITS), net


def _spine_ports(c: _Checker, value: Any, spines: int, planes: int) -> tuple[tuple[int, int], ...]:
    """``usid.ports`` (default :data:`mrc.srv6.usid.DEFAULT_PORTS`) cut into one block per
    spine index: a socket bound to a port of block ``s`` is routed by table ``table + s``.
    A connection binds one port per plane in each block, so a block needs at least that."""
    field = "usid.ports"
    if value is None:
        lo, hi = us.DEFAULT_PORTS
    else:
        if not isinstance(value, str):
            c.fail(field, f'must be a string such as "61000-65534", not {_kind(value)}')
        m = re.fullmatch(r"(\d{1,5})-(\d{1,5})", value)
        if m is None:
            c.fail(field, f"{value!r} is not a port range such as 61000-65534")
        lo, hi = int(m.group(1)), int(m.group(2))
        if not 1024 <= lo <= hi <= us.MAX_RULE_PORT:
            c.fail(
                field,
                f"{value!r}: LO-HI with 1024 <= LO <= HI <= {us.MAX_RULE_PORT} (a port below"
                " 1024 needs privileges to bind; the kernel's rules stop at 65534)",
            )
    share = (hi - lo + 1) // spines
    if share < planes:
        c.fail(
            field,
            f"{lo}-{hi} gives each of {spines} spine indexes {share} ports, fewer than one"
            f" connection binds ({planes}: one per plane)",
        )
    return tuple((lo + s * share, lo + (s + 1) * share - 1) for s in range(spines))
