"""bench_fabric on an unshaped fabric (``--rate unshaped``): no tbf, so no capacity to be a
fraction of. The table and the summary must say "-" where a shaped run says a percentage,
and a bad rate must still be refused as a usage error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema

from mrc.lab.bench.fabric import UNSHAPED, _share
from mrc.lab.bench.fabric_report import table

REPO = Path(__file__).resolve().parents[2]


def _out(rate: str, rate_bps: int | None) -> dict[str, Any]:
    cap = 2 * rate_bps if rate_bps else None
    mrc_bps, tcp_bps, mptcp_bps, planes_bps = 3e9, 2e9, 2.5e9, 3.75e9
    return {
        "fabric": {"planes": 2, "spines": 1, "rate": rate, "rate_bps": rate_bps, "mtu": 9000},
        "size": 16 << 20,
        "runs": 1,
        "capacity_bps": cap,
        "mrc_wire_ceiling": 0.99,
        "mrc": [
            {
                "cc": "nscc",
                "window": 512,
                "burst": None,
                "goodput_bps": mrc_bps,
                "fraction_of_capacity": _share(mrc_bps, cap),
                "retransmits": 0,
                "runs": [],
            }
        ],  # fmt: skip
        "tcp": {"goodput_bps": tcp_bps, "fraction_of_link": _share(tcp_bps, rate_bps)},
        "mptcp": {
            "goodput_bps": mptcp_bps,
            "fraction_of_capacity": _share(mptcp_bps, cap),
            "runs": [{"subflows": 1}],
        },
        "tcp_planes": {
            "goodput_bps": planes_bps,
            "fraction_of_capacity": _share(planes_bps, cap),
            "runs": [],
        },
        "mrc_over_tcp": 1.5,
        "mrc_over_mptcp": 1.2,
        "mrc_over_tcp_planes": 0.8,
        "machine": {"cpus": 2, "loadavg_start": [0.5], "loadavg_end": [0.7]},
        "seconds": 9.0,
    }


def test_an_unshaped_fabric_has_no_fractions_and_its_table_says_so() -> None:
    assert _share(3e9, None) is None and _share(None, 10**9) is None
    assert _share(2.5e9, 10**10) == 0.25
    shaped = table(_out("5gbit", 5_000_000_000))
    unshaped = table(_out(UNSHAPED, None))
    assert "30.0% of 10000 Mbit/s" in shaped and "40.0% of 5000 Mbit/s" in shaped
    assert "37.5% of 10000 Mbit/s" in shaped and "mrc / tcp per plane: 0.8x" in shaped
    assert "links unshaped" in unshaped and "mrc / mptcp: 1.2x" in unshaped
    rows = [line for line in unshaped.splitlines() if line.startswith(("mrc nscc", "kernel"))]
    assert len(rows) == 4 and all(line.split()[-2] == "-" and "%" not in line for line in rows)


def test_the_schema_takes_an_unshaped_fabric() -> None:
    import json

    schema = json.loads((REPO / "docs/schemas/bench_fabric.schema.json").read_text())
    props = schema["properties"]
    for sub in (props["capacity_bps"], props["fabric"]["properties"]["rate_bps"]):
        jsonschema.validate(None, sub)  # null: unshaped
        jsonschema.validate(10**9, sub)


def test_a_bad_rate_is_a_usage_error() -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "tools/bench_fabric.py"), "--rate", "fast"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "--rate" in res.stderr and "Traceback" not in res.stderr
    helptext = subprocess.run(
        [sys.executable, str(REPO / "tools/bench_fabric.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "unshaped" in helptext
