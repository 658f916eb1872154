"""An NSCC window on its own, without a QP: the unit tests of the law build it here."""

from __future__ import annotations

import dataclasses
from typing import Any

from mrc.core import QPConfig
from mrc.core.cc import LawContext, MrcNscc, MrcNsccParams


def nscc_window(
    mss: int, cap_packets: int, initial_packets: int, target_delay: float, **params: Any
) -> MrcNscc:
    """NSCC for ``mss``-byte packets, capped at ``cap_packets``, starting at
    ``initial_packets``, with the target ``target_delay`` alone (``target_rtt_fraction`` 0)
    and a floor of one packet (``min_window`` 1), unless ``params`` (MrcNsccParams fields) say
    otherwise: the units the law's tests reason in."""
    base = MrcNsccParams(
        target_delay=target_delay,
        initial_window=initial_packets,
        target_rtt_fraction=0.0,
        min_window=1.0,
    )
    return MrcNscc(
        dataclasses.replace(base, **params),
        LawContext.of(QPConfig(payload_size=mss, max_outstanding=cap_packets)),
    )
