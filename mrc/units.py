"""How every command and tool reads a size or a rate: one parser each, so ``64M`` means the same
number everywhere.

Sizes (bytes): a number with an optional unit, case-insensitive. ``K``, ``M``, ``G`` are binary
(1024-based, as dd reads them: ``64M`` = 67,108,864); ``KB``, ``MB``, ``GB`` are decimal
(``64MB`` = 64,000,000); ``KiB``, ``MiB``, ``GiB`` are binary. ``B`` or no unit: bytes.

Rates (bits per second) follow tc(8), since they end up in tc: ``bit``, ``kbit``, ``mbit``,
``gbit``, ``tbit`` are decimal bits per second and ``bps``, ``kbps``... are *bytes* per second.

Both raise :class:`~mrc.errors.UsageError` (exit status 2) with a one-line message;
:mod:`mrc.cli.common` wraps them for argparse. :func:`human_bytes` and :func:`human_rate` print
sizes and rates back in the same units.
"""

from __future__ import annotations

import re

from mrc.errors import UsageError

#: One line for --help texts.
SIZE_HELP = "K/M/G and KiB/MiB/GiB are binary (64M = 64 x 2^20), KB/MB/GB decimal"

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "k": 1 << 10,
    "ki": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mi": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gi": 1 << 30,
    "gib": 1 << 30,
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """``'64M'`` -> 67108864, ``'64MB'`` -> 64000000, ``'1500'`` -> 1500 (see the module)."""
    m = _SIZE_RE.fullmatch(text)
    if not m:
        raise UsageError(f"not a size: {text!r} (try 64M, 1G, 1500)")
    unit = m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise UsageError(f"unknown size unit in {text!r} (use K, M, G, KB, MB, GB, KiB...)")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


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
        raise UsageError(f"bad rate {text!r}: expected e.g. 200mbit, 1gbit, 500kbit")
    number, unit = m.groups()
    unit = unit or "bit"
    if unit not in _RATE_UNITS:
        raise UsageError(f"bad rate unit {unit!r} in {text!r}: use bit, kbit, mbit, gbit or *bps")
    bps = int(float(number) * _RATE_UNITS[unit])
    if bps < 8000:
        raise UsageError(f"rate {text!r} is too low (minimum 8kbit)")
    if bps > MAX_RATE_BPS:
        raise UsageError(f"rate {text!r} is too high for tbf (maximum 34gbit)")
    return bps


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``: binary units, as sizes are read (see the module)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_rate(bps: float) -> str:
    """``2.5e9`` (bits per second) -> ``2.50 Gbit/s``: decimal, as rates are read."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.2f} {unit}"
    return f"{bps:.0f} bit/s"
