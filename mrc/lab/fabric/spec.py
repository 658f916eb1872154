"""What the user asks for: :class:`FabricSpec` and its validation."""

from __future__ import annotations

import re
from dataclasses import dataclass

from mrc import wire
from mrc.errors import UsageError
from mrc.topology.model import SRV6_MODES
from mrc.units import parse_rate

#: Fabric names become part of namespace names (``mrc-<name>-h0``).  No dash, so that the
#: prefix ``mrc-<name>-`` of one fabric can never match the namespaces of another.
NAME_RE = re.compile(r"^[A-Za-z0-9_]{1,24}$")

#: Upper bounds keep the addressing plan (see docs/FABRIC.md) and interface names valid and
#: stop a typo from creating thousands of namespaces.
MAX_PLANES = wire.MAX_PLANES  # a connection's planes: the bits of an ACK's Port State
MAX_SPINES = 64
MAX_LEAVES = 64
MAX_HOSTS = 256
MAX_NAMESPACES = 2000

#: An image reference as engines accept it (registry/name:tag@digest, an ID): never an option.
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")


@dataclass(frozen=True)
class FabricSpec:
    """The shape of a fabric.  Every plane is an identical two-tier Clos.

    ``rate`` is a tc rate string applied with tbf to every fabric link in both directions
    (``None``: unshaped); ``mtu`` is applied to every fabric link.  ``trim`` puts the packet
    trimming program on every router (needs ``rate``: it trims before tbf's queue overflows).
    ``host_image``: run every host as a container of this image (:mod:`mrc.lab.fabric.containers`)
    instead of a bare namespace.
    """

    name: str = "mrc"
    planes: int = 4
    spines: int = 2
    leaves: int = 2
    hosts: int = 4
    rate: str | None = None
    mtu: int = 1500
    trim: bool = False
    host_image: str | None = None
    #: with ``trim``: CE-mark ECT packets joining a router port's queue above this fraction
    #: of the trimming limit (mrc.lab.fabric.shaping.ECN_FRACTION); 0 turns marking off
    ecn_threshold: float | None = None
    #: with ``trim``: router ports get an htb with a strict-priority band for trimmed headers
    #: and ACK/NACKs (kernel.NsHandle.prio_band); False keeps a plain tbf (for comparison)
    prio_band: bool = True
    #: how hosts name a path to the routers: "usid" (IPv6-in-IPv6 to a micro-SID container,
    #: no routing header on the wire: mrc.srv6.usid) or "srh" (a Segment Routing Header of
    #: End SIDs, for routers without uSID)
    srv6: str = "usid"

    def validate(self) -> None:
        """Raise :class:`UsageError` with a one-line reason if this spec cannot be built."""
        if not NAME_RE.match(self.name):
            raise UsageError(
                f"bad fabric name {self.name!r}: use 1-24 letters, digits or '_' (no '-')"
            )
        for field, value, low, high in (
            ("planes", self.planes, 1, MAX_PLANES),
            ("spines", self.spines, 1, MAX_SPINES),
            ("leaves", self.leaves, 1, MAX_LEAVES),
            ("hosts", self.hosts, 2, MAX_HOSTS),
        ):
            if not low <= value <= high:
                raise UsageError(f"--{field} must be between {low} and {high}, got {value}")
        if self.hosts < self.leaves:
            raise UsageError(
                f"--hosts ({self.hosts}) must be at least --leaves ({self.leaves}):"
                " every leaf needs a host"
            )
        if not 1280 <= self.mtu <= 65535:
            raise UsageError(f"--mtu must be between 1280 (IPv6 minimum) and 65535, got {self.mtu}")
        if self.rate is not None:
            parse_rate(self.rate)
        if self.trim and self.rate is None:
            raise UsageError(
                "--trim needs --rate: trimming acts when a shaped link's queue would overflow"
            )
        if self.ecn_threshold is not None:
            if not self.trim:
                raise UsageError("--ecn-threshold needs --trim: the trimming program marks CE")
            if not 0.0 <= self.ecn_threshold <= 1.0:
                raise UsageError(
                    f"--ecn-threshold must be between 0 and 1 (a fraction of the trimming"
                    f" limit), got {self.ecn_threshold}"
                )
        if not self.prio_band and not self.trim:
            raise UsageError("--no-prio-band needs --trim: only --trim fabrics have the band")
        if self.srv6 not in SRV6_MODES:
            raise UsageError(f"--srv6 must be one of {', '.join(SRV6_MODES)}, got {self.srv6!r}")
        if self.host_image is not None and not IMAGE_RE.match(self.host_image):
            raise UsageError(f"bad --host-image {self.host_image!r}: not an image name")
        if self.namespace_count > MAX_NAMESPACES:
            raise UsageError(
                f"fabric would need {self.namespace_count} namespaces (max {MAX_NAMESPACES})"
            )

    @property
    def namespace_count(self) -> int:
        return self.hosts + self.planes * (self.spines + self.leaves)

    @property
    def rate_bps(self) -> int | None:
        return None if self.rate is None else parse_rate(self.rate)

    def leaf_of(self, host: int) -> int:
        """Leaf index of ``host``: contiguous, even blocks (hosts 0,1 -> leaf 0; 2,3 -> leaf 1)."""
        return host * self.leaves // self.hosts
