"""What the user asks for: :class:`FabricSpec`, its validation, and tc-style rate parsing."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import SpecError

#: Fabric names become part of namespace names (``mrc-<name>-h0``).  No dash, so that the
#: prefix ``mrc-<name>-`` of one fabric can never match the namespaces of another.
NAME_RE = re.compile(r"^[A-Za-z0-9_]{1,24}$")

#: Upper bounds keep the addressing plan (see docs/FABRIC.md) and interface names valid and
#: stop a typo from creating thousands of namespaces.
MAX_PLANES = 64
MAX_SPINES = 64
MAX_LEAVES = 64
MAX_HOSTS = 256
MAX_NAMESPACES = 2000

#: Multipliers to bits per second, as understood by tc(8).
_RATE_UNITS = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    "bps": 8,
    "kbps": 8 * 10**3,
    "mbps": 8 * 10**6,
    "gbps": 8 * 10**9,
    "tbps": 8 * 10**12,
}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")

#: tbf's classic TCA_TBF_PARMS carries the rate as a u32 in bytes/s (~34 Gbit/s).
MAX_RATE_BPS = (2**32 - 1) * 8


def parse_rate(text: str) -> int:
    """Parse a tc rate (``200mbit``, ``1gbit``, ``12.5mbps``) into bits per second.

    A bare number means bits per second, as in tc.  ``bps`` means *bytes* per second (tc's
    convention, easy to get wrong, so we follow tc rather than intuition).
    """
    m = _RATE_RE.match(text.lower())
    if not m:
        raise SpecError(f"bad rate {text!r}: expected e.g. 200mbit, 1gbit, 500kbit")
    number, unit = m.groups()
    unit = unit or "bit"
    if unit not in _RATE_UNITS:
        raise SpecError(f"bad rate unit {unit!r} in {text!r}: use bit, kbit, mbit, gbit or *bps")
    bps = int(float(number) * _RATE_UNITS[unit])
    if bps < 8000:
        raise SpecError(f"rate {text!r} is too low (minimum 8kbit)")
    if bps > MAX_RATE_BPS:
        raise SpecError(f"rate {text!r} is too high for tbf (maximum 34gbit)")
    return bps


@dataclass(frozen=True)
class FabricSpec:
    """The shape of a fabric.  Every plane is an identical two-tier Clos.

    ``rate`` is a tc rate string applied with tbf to every fabric link in both directions
    (``None``: unshaped); ``mtu`` is applied to every fabric link.  ``trim`` puts the packet
    trimming program on every router (needs ``rate``: it trims before tbf's queue overflows).
    """

    name: str = "mrc"
    planes: int = 4
    spines: int = 2
    leaves: int = 2
    hosts: int = 4
    rate: str | None = None
    mtu: int = 1500
    trim: bool = False

    def validate(self) -> None:
        """Raise :class:`SpecError` with a one-line reason if this spec cannot be built."""
        if not NAME_RE.match(self.name):
            raise SpecError(
                f"bad fabric name {self.name!r}: use 1-24 letters, digits or '_' (no '-')"
            )
        for field, value, low, high in (
            ("planes", self.planes, 1, MAX_PLANES),
            ("spines", self.spines, 1, MAX_SPINES),
            ("leaves", self.leaves, 1, MAX_LEAVES),
            ("hosts", self.hosts, 2, MAX_HOSTS),
        ):
            if not low <= value <= high:
                raise SpecError(f"--{field} must be between {low} and {high}, got {value}")
        if self.hosts < self.leaves:
            raise SpecError(
                f"--hosts ({self.hosts}) must be at least --leaves ({self.leaves}):"
                " every leaf needs a host"
            )
        if not 1280 <= self.mtu <= 65535:
            raise SpecError(f"--mtu must be between 1280 (IPv6 minimum) and 65535, got {self.mtu}")
        if self.rate is not None:
            parse_rate(self.rate)
        if self.trim and self.rate is None:
            raise SpecError(
                "--trim needs --rate: trimming acts when a shaped link's queue would overflow"
            )
        if self.namespace_count > MAX_NAMESPACES:
            raise SpecError(
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
