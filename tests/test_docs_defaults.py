"""docs/PROTOCOL.md states the retransmission timer's defaults; they are QPConfig's.

They had drifted (10 ms and 50 ms documented, 50 ms and 100 ms in the code): a reader tuning
timeouts from the protocol document got numbers the implementation never used.
"""

from __future__ import annotations

import re
from pathlib import Path

from mrc.core import QPConfig

PROTOCOL = Path(__file__).resolve().parent.parent / "docs" / "PROTOCOL.md"


def _seconds(number: str, unit: str) -> float:
    return float(number) / (1000 if unit == "ms" else 1)


def test_rto_defaults_in_protocol_md_are_the_code_s() -> None:
    text = " ".join(PROTOCOL.read_text().split())
    m = re.search(
        r"\[`min_rto`, `max_rto`\] = \[([\d.]+) (ms|s), ([\d.]+) (ms|s)\]; "
        r"([\d.]+) (ms|s) \(`initial_rto`\)",
        text,
    )
    assert m, "PROTOCOL.md no longer states the RTO bounds in the expected form"
    documented = (
        _seconds(m[1], m[2]),
        _seconds(m[3], m[4]),
        _seconds(m[5], m[6]),
    )
    cfg = QPConfig()
    assert documented == (cfg.min_rto, cfg.max_rto, cfg.initial_rto)
