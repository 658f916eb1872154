"""Real fabrics described by hand: the file ``--fabric FILE`` reads when the routers are real.

mrc-fabric writes a topology for the namespaces it builds (:mod:`mrc.topology.model`); a user
whose planes are real SRv6 routers writes a much smaller file saying only what spraying needs
(docs/FABRIC.md, "Real networks"): per plane, the SID of every spine, and per host, its address
in every plane. A path is then ``[spine SID, destination address]``, exactly as on the namespace
fabric, so this module turns such a file into the same :class:`Topology` the rest of mrc reads
(no namespaces, no links, no leaves) and send and receive code stays one path.

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
from typing import Any, NoReturn

from mrc.errors import UsageError

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

    def address(self, value: Any, field: str) -> str:
        """A global or unique-local unicast IPv6 address, returned in canonical form."""
        if not isinstance(value, str):
            self.fail(field, f"must be a string (an IPv6 address), not {_kind(value)}")
        try:
            addr = ipaddress.IPv6Address(value)
        except ValueError:
            self.fail(field, f"{value!r} is not an IPv6 address")
        if addr.scope_id is not None:
            self.fail(field, f"{value!r} has a scope; give an address routed in the fabric")
        for bad, what in (
            (addr.is_unspecified, "the unspecified address"),
            (addr.is_loopback, "the loopback address"),
            (addr.is_multicast, "a multicast address"),
            (addr.is_link_local, "a link-local address"),
            (addr.ipv4_mapped is not None, "an IPv4-mapped address"),
        ):
            if bad:
                self.fail(field, f"{value} is {what}; give a unicast address routed in the fabric")
        return addr.compressed


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true/false"}
    if value is None:
        return "null"
    return names.get(type(value), "a number" if isinstance(value, int | float) else "a value")


def parse_real_fabric(doc: Any, where: str = "fabric file") -> Topology:
    """Check a real-fabric description (already parsed JSON) and return it as a Topology:
    spines only (tier "spine", no namespace), hosts with one NIC per plane (no namespace, no
    interface names, no leaf), no links, no rate (the window stays the sender's default)."""
    c = _Checker(where)
    top = c.obj(doc, "top level", _TOP_KEYS)
    if "version" in top and top["version"] != REAL_FORMAT_VERSION:
        c.fail("version", f"{top['version']!r}: this mrc reads version {REAL_FORMAT_VERSION}")
    fabric_name = c.name(top["name"], "name")
    # which routes its routers take: SRHs of End SIDs, the only kind a file describes so far
    # (a uSID fabric needs each router's micro-SID and encapsulation tables on every host)
    if top.get("srv6", "srh") != "srh":
        c.fail(
            "srv6",
            f"{top['srv6']!r}: a real fabric's routes are SRHs ('srh'); uSID routes are only"
            " built by mrc-fabric so far",
        )

    owner: dict[tuple[str, str], str] = {}  # (kind, value) -> the field that first used it

    def claim(kind: str, value: str, field: str) -> None:
        """Names are unique among hosts and spines, addresses among NICs and SIDs."""
        if (kind, value) in owner:
            c.fail(field, f"{kind} {value} is already {owner[kind, value]}")
        owner[kind, value] = field

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

    hosts = []
    for i, item in enumerate(c.items(top["hosts"], "hosts")):
        field = f"hosts[{i}]"
        host_doc = c.obj(item, field, _HOST_KEYS)
        name = c.name(host_doc["name"], f"{field}.name")
        claim("name", name, f"{field}.name")
        nics: dict[int, HostNic] = {}
        for j, nic_item in enumerate(c.items(host_doc["nics"], f"{field}.nics")):
            nfield = f"{field}.nics[{j}]"
            nic_doc = c.obj(nic_item, nfield, _NIC_KEYS)
            plane = c.plane(nic_doc["plane"], f"{nfield}.plane")
            if plane not in spines_of:
                c.fail(f"{nfield}.plane", f"no plane {plane} (planes are 0..{nplanes - 1})")
            if plane in nics:
                c.fail(f"{nfield}.plane", f"host {name} has two NICs in plane {plane}")
            address = c.address(nic_doc["address"], f"{nfield}.address")
            claim("address", address, f"{nfield}.address")
            nics[plane] = HostNic(plane, "", address, "", "", "", "")
        for plane in range(nplanes):
            if plane not in nics:
                c.fail(f"{field}.nics", f"host {name} has no NIC in plane {plane}")
        hosts.append(Host(name, "", i, tuple(nics[p] for p in range(nplanes))))

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
