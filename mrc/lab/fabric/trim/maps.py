"""Layouts of the trimming program's maps, the per-port constants, and the bpffs pin layout.

Pure Python (no libbpf): teardown and planning import this without needing the BPF toolchain.
Keep ``EGRESS`` / ``RSTATS`` in step with ``struct egress`` / ``struct rstats`` in
``mrc_trim.bpf.c`` (the installer checks the map's value size against ``EGRESS.size``).
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from typing import Any

from ..shaping import VQ_FRACTION, tbf_params

#: bpffs mount point; every fabric's pins live in ``<BPFFS>/mrc-<fabric>/<router>/``.
BPFFS = "/sys/fs/bpf"

#: Names of the pinned objects inside a router's directory.
PIN_PROG = "prog"
PIN_EGRESS = "egress"
PIN_RSTATS = "rstats"

#: BPF program (function) name in the object, also the tc filter name.
PROG_NAME = "mrc_trim"

#: struct egress: bpf_spin_lock (u32), flags (u32), then 18 u64 (host byte order).
EGRESS = struct.Struct("=II18Q")
EGRESS_FIELDS = (
    "rate",
    "limit",
    "hard_limit",
    "ecn_limit",
    "backlog",
    "last_ns",
    "pkts",
    "bytes",
    "data_pkts",
    "trimmed",
    "trimmed_bytes",
    "over",
    "tail_drops",
    "errors",
    "max_backlog",
    "ce_marked",
    "ect_pkts",
    "prio_pkts",
)
EGRESS_LASTHOP = 0x1
EGRESS_TRIM = 0x2
EGRESS_PRIO = 0x4
#: ecn_limit of a port that never marks
NO_ECN = (1 << 64) - 1

#: struct rstats: per router, per CPU.
RSTATS = struct.Struct("=4Q")
RSTATS_FIELDS = ("seen", "not_fwd", "no_port", "gso")

KEY = struct.Struct("=I")


@dataclass(frozen=True)
class PortConfig:
    """Virtual queue constants of one egress port."""

    rate: int  # bytes/s (L2 frames)
    limit: int  # virtual queue limit, bytes
    hard_limit: int  # estimated real capacity (tbf queue + burst): beyond it tbf drops
    lasthop: bool  # the port faces the destination host
    ecn_limit: int = NO_ECN  # over it, ECT packets are marked CE (never on a last hop)
    trim: bool = True  # trim MRC data packets over ``limit``
    prio: bool = False  # the port's htb has a priority band (skb->priority classes)

    def pack(self) -> bytes:
        values = dict.fromkeys(EGRESS_FIELDS, 0)
        values.update(
            rate=self.rate, limit=self.limit, hard_limit=self.hard_limit, ecn_limit=self.ecn_limit
        )
        flags = (
            (EGRESS_LASTHOP if self.lasthop else 0)
            | (EGRESS_TRIM if self.trim else 0)
            | (EGRESS_PRIO if self.prio else 0)
        )
        return EGRESS.pack(0, flags, *(values[f] for f in EGRESS_FIELDS))


def port_config(
    rate_bps: int, mtu: int, lasthop: bool, ecn_fraction: float = 0.0, prio: bool = False
) -> PortConfig:
    """Constants for a port shaped at ``rate_bps`` with the fabric's tbf (see tbf_params), or
    the htb with a priority band of the same rate, burst and queue (``prio``).

    ``ecn_fraction``: CE marking threshold as a fraction of the trimming limit (0: none).
    Never below two full frames: the virtual queue holds a packet's own bytes and a burst of
    a couple of frames even when the real queue is empty."""
    rate_Bps, burst, tbf_limit = tbf_params(rate_bps, mtu)
    frame = mtu + 14
    limit = max(int(tbf_limit * VQ_FRACTION), burst + 2 * frame)
    ecn_limit = NO_ECN  # last hops never mark: congestion there says nothing about the path
    if ecn_fraction > 0 and not lasthop:
        ecn_limit = max(int(limit * ecn_fraction), 2 * frame)
    return PortConfig(
        rate=rate_Bps,
        limit=limit,
        hard_limit=tbf_limit + burst,
        lasthop=lasthop,
        ecn_limit=ecn_limit,
        prio=prio,
    )


def unpack_egress(raw: bytes) -> dict[str, Any]:
    _lock, flags, *values = EGRESS.unpack_from(raw)
    out = dict(zip(EGRESS_FIELDS, values, strict=True))
    out["lasthop"] = bool(flags & EGRESS_LASTHOP)
    out["prio_band"] = bool(flags & EGRESS_PRIO)
    if out["ecn_limit"] == NO_ECN:
        out["ecn_limit"] = None  # never marks
    del out["last_ns"]
    return out


def fabric_pin_dir(fabric: str) -> str:
    return os.path.join(BPFFS, f"mrc-{fabric}")


def router_pin_dir(fabric: str, router: str) -> str:
    return os.path.join(fabric_pin_dir(fabric), router)


def remove_pins(fabric: str) -> bool:
    """Delete ``<BPFFS>/mrc-<fabric>`` and everything in it; False if it was not there.

    Unpinning drops the program and maps once no tc filter uses them any more (namespaces
    gone).  Idempotent, needs no BPF toolchain: bpffs supports plain unlink/rmdir.
    """
    top = fabric_pin_dir(fabric)
    if not os.path.isdir(top):
        return False
    for root, dirs, files in os.walk(top, topdown=False):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(root, f))
        for d in dirs:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(os.path.join(root, d))
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(top)
    return True


def pinned_fabrics() -> list[str]:
    """Fabric names with a pin directory (``mrc-<name>``) in bpffs."""
    try:
        entries = os.listdir(BPFFS)
    except OSError:
        return []
    return sorted(e[len("mrc-") :] for e in entries if e.startswith("mrc-"))
